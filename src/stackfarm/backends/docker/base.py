"""The base image a cell image is built FROM: a name in a registry, a tarball (`docker load`) or a root
filesystem folder (`docker import`), for runners with and without a registry.

`base_for` turns matrix.toml's [docker] base (a template with `{cuda}`) into the cell's base; `BaseImages`
makes it exist in the engine, once per process, and says its content id (part of the cell image's input hash).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .common import DockerError, validate_image_ref
from .engine import DockerEngine

#: The default base: `{cuda}` becomes the cell's CUDA with its patch level (nvidia/cuda tags carry one).
DEFAULT_BASE = "nvidia/cuda:{cuda}-devel-ubuntu24.04"
#: nvidia/cuda image tag for each CUDA minor a cell may name.
CUDA_IMAGE_VERSIONS = {
    "12.4": "12.4.1",
    "12.6": "12.6.3",
    "12.8": "12.8.1",
    "12.9": "12.9.1",
    "13.0": "13.0.1",
}


def cuda_image_version(cuda: str) -> str:
    """The nvidia/cuda tag version for a cell's CUDA axis value: "12.8" -> "12.8.1"; "12.8.0" stays."""
    try:
        release = Version(cuda).release
    except InvalidVersion as exc:
        raise DockerError(f"cuda axis value {cuda!r} is not a version") from exc
    if len(release) >= 3:
        return ".".join(map(str, release[:3]))
    key = ".".join(map(str, (*release, 0)[:2]))
    if key not in CUDA_IMAGE_VERSIONS:
        raise DockerError(
            f"no nvidia/cuda image version known for CUDA {cuda}; name it in full (e.g. {key}.0) in the "
            f"[docker] base of matrix.toml, or add it to CUDA_IMAGE_VERSIONS"
        )
    return CUDA_IMAGE_VERSIONS[key]


def base_for(template: str, cell_values: Mapping[str, str]) -> str:
    """The base for a cell: the template with `{cuda}` filled in (a tarball or rootfs path stays as is)."""
    if is_base_path(template):
        return template
    try:
        ref = template.format(cuda=cuda_image_version(cell_values["cuda"]))
    except (KeyError, IndexError, ValueError) as exc:
        raise DockerError(f"[docker] base = {template!r}: the only placeholder allowed is {{cuda}}") from exc
    return validate_image_ref(ref)


def is_base_path(base: str) -> bool:
    """A base given as a path (a tarball for `docker load`, a rootfs for `docker import`), not a name."""
    return base.startswith(("/", "./", "../", "~")) or base.endswith((".tar", ".tar.gz", ".tgz"))


def hash_listing(root: Path) -> str:
    """A cheap identity for a rootfs folder: names, sizes and mtimes of its entries (not their bytes)."""
    digest = hashlib.sha256(str(root).encode())
    for path in sorted(root.rglob("*")):
        try:
            st = path.lstat()
        except OSError:
            continue
        digest.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()


class BaseImages:
    """The bases one backend has made exist: each is pulled, loaded or imported at most once per process."""

    def __init__(self, engine: DockerEngine, scratch: Path) -> None:
        self.engine = engine
        #: Where a rootfs folder's tarball is written on its way to `docker import`.
        self.scratch = scratch
        self._known: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def get(self, base: str) -> tuple[str, str]:
        """(name, image id) of the base, making it exist in the engine first."""
        with self._lock:
            if base not in self._known:
                ref = self._provide(base)
                image_id = self.engine.image_id(ref)
                if image_id is None:
                    raise DockerError(f"base image {ref} is missing from the engine after loading it")
                self._known[base] = (ref, image_id)
            return self._known[base]

    def _provide(self, base: str) -> str:
        if not is_base_path(base):
            if self.engine.image_id(base) is None:
                self.engine.pull(base)
            return base
        path = Path(base).expanduser().resolve()
        if path.is_dir():
            ref = f"stackfarm-rootfs:{hash_listing(path)[:16]}"
            if self.engine.image_id(ref) is None:
                self.engine.import_rootfs(path, ref, self.scratch)
            return ref
        if path.is_file():
            return self.engine.load(path)
        raise DockerError(f"[docker] base {base}: no such file or folder")


__all__ = [
    "CUDA_IMAGE_VERSIONS",
    "DEFAULT_BASE",
    "BaseImages",
    "base_for",
    "cuda_image_version",
    "hash_listing",
    "is_base_path",
]
