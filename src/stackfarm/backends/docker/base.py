"""The base image a cell image is built FROM: a name in a registry, a tarball (`docker load`) or a root
filesystem folder (`docker import`), for runners with and without a registry.

`base_for` turns matrix.toml's [docker] base (a template with `{cuda}` and `{python}`: the cell's CUDA and python
axis values) into the cell's base; `check_base_python` refuses, before any build, a rootfs base that lacks the
cell's python and could not install it; `BaseImages` makes the base exist in the engine, once per process, and says
its content id (part of the cell image's input hash). The image's Python is always the cell's (docker/Dockerfile's
PYTHON build argument): a base without it gets it from apt (on Ubuntu, the deadsnakes PPA), or the build fails
saying so.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Mapping
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ...dockergrammar import PYTHON_AXIS, base_fields, fill_base, is_base_path
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
    """The base for a cell: the template with `{cuda}` (the nvidia/cuda tag version of the cell's CUDA) and
    `{python}` (the cell's python axis value, e.g. `python:{python}-slim-bookworm`) filled in; a tarball or
    rootfs path stays as is."""
    if is_base_path(template):
        return template
    wrong = DockerError(
        f"[docker] base = {template!r}: the only placeholders allowed are {{cuda}} and {{python}}"
    )
    fields = base_fields(template)
    if fields is None:
        raise wrong
    values = {}
    if "cuda" in fields:
        values["cuda"] = cuda_image_version(cell_values.get("cuda", ""))
    if "python" in fields:
        python = cell_values.get("python", "")
        if not PYTHON_AXIS.fullmatch(python):
            raise DockerError(f"[docker] base = {template!r}: python axis value {python!r} is not like 3.11")
        values["python"] = python
    ref = fill_base(template, values)
    if ref is None:
        raise wrong
    return validate_image_ref(ref)


def rootfs_pythons(rootfs: Path) -> list[str]:
    """The `pythonX.Y` versions a root filesystem folder has in its bin folders."""
    found = set()
    for folder in ("usr/bin", "usr/local/bin", "bin"):
        for exe in (rootfs / folder).glob("python3.*") if (rootfs / folder).is_dir() else ():
            if m := re.fullmatch(r"python(\d+\.\d+)", exe.name):
                found.add(m[1])
    return sorted(found, key=lambda v: tuple(int(x) for x in v.split(".")))


def _os_id(rootfs: Path) -> str:
    for name in ("etc/os-release", "usr/lib/os-release"):
        try:
            text = (rootfs / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if m := re.search(r"^ID=\"?([^\"\n]*)", text, re.MULTILINE):
            return m[1].strip().lower()
    return ""


def check_base_python(base: str, python: str) -> None:
    """Refuse, before any build, a rootfs-folder base without python`python` that the Dockerfile could not
    install it into: only Ubuntu gets another Python from apt (the deadsnakes PPA); a Debian rootfs (what
    docker/make-base.sh makes) has the one python3 of its suite. Bases given by name or as a tarball are not
    looked into here (that needs the engine): docker/Dockerfile fails their build naming the missing Python."""
    if not is_base_path(base):
        return
    root = Path(base).expanduser()
    if not root.is_dir():
        return
    have = rootfs_pythons(root)
    if python in have or _os_id(root) == "ubuntu":
        return
    raise DockerError(
        f"the base image {base} has no python{python} (it has {', '.join(f'python{v}' for v in have) or 'no python3'}"
        f"), and the cell's python axis is {python}: the image's Python would not be the cell's\n  fix: a base "
        f'with python{python} ([docker] base, e.g. "python:{{python}}-slim-bookworm", or docker/make-base.sh '
        f"with a Debian suite whose python3 is {python}), or leave {python} out of [axes] python"
    )


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
    "check_base_python",
    "cuda_image_version",
    "hash_listing",
    "is_base_path",
    "rootfs_pythons",
]
