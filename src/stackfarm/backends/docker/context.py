"""A cell image's build context, its input hash and its tag: files only, no engine.

    cell + artifacts ──write_context──▶ tools/, torch/, kernels/, sglang/ (requirements.txt each),
                                        patch/ (the overlay), ca/extra.pem, cell.json
        ──context_digest──▶ sha256 of the Dockerfile, the base image's id, the build args and every file
        ──image_name──▶ stackfarm/<cell id>:<first 16 hex of it>
        ──place_wheels──▶ each stage's wheels beside its requirements.txt (only when the image is built)

Every wheel comes from stackfarm's cache (the sha256-verified blobs, hard-linked into the context): a build
downloads nothing, and pip installs with --no-index from `file:///tmp/stackfarm/<stage>/<wheel>` with the
wheel's hash. The requirement lines name each wheel by file name and sha256, so the input hash is known before
any wheel is fetched: a runner that finds the image (in its engine or a registry) needs none of them.

Which axis goes into which stage of docker/Dockerfile, and which wheels an axis value stands for, is the stack
table's (`stackfarm.stack.docker_stages`, `stackfarm.stack.distributions`); this module only lays them out.
Each stage gets its own folder, bind-mounted into its RUN step alone, so a stage's layer-cache key is its own
wheels: a new sglang keeps torch and the kernels cached.
"""

from __future__ import annotations

import dataclasses
import filecmp
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlparse

from packaging.utils import canonicalize_name

from ... import stack
from ...artifacts import Artifact
from ...cellspec import CellSpec
from ...plan import Component
from .common import IMAGE_REPOSITORY, DockerError, validate_image_ref

#: The repository root, where docker/Dockerfile lives next to src/.
_REPO = Path(__file__).resolve().parents[4]
DOCKERFILE = _REPO / "docker" / "Dockerfile"

#: The install stages of docker/Dockerfile, in build order, and the cell axes each one installs.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = tuple(stack.docker_stages().items())
#: The stage that installs the suites' own tools (pytest and friends), before the stack's.
TOOLS_STAGE = "tools"

_WHEEL_FILENAME = re.compile(r"^[A-Za-z0-9_.+-]+\.whl$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MARKER = ".stackfarm-complete"  # artifacts.Cache's "this tree is whole" file, not part of the wheel


def image_name(cell_id: str, digest: str) -> str:
    """`stackfarm/<cell id>:<first 16 hex of the input hash>`: readable, and unique per set of inputs."""
    repo = re.sub(r"[^a-z0-9._-]+", "-", cell_id.lower()).strip("._-")
    return validate_image_ref(f"{IMAGE_REPOSITORY}/{repo}:{digest[:16]}")


def stage_wheels(
    values: Mapping[str, str], artifacts: Mapping[Component, Artifact]
) -> dict[str, list[Artifact]]:
    """The wheels each install stage gets: for every axis the stage installs that the cell has, the wheels the
    stack table says its value stands for. An optional axis the matrix leaves out installs nothing; a wheel no
    stage claims, or one the table names but nobody resolved, is an error rather than a silent omission."""
    resolved = {(c.axis, canonicalize_name(c.distribution)): a for c, a in artifacts.items()}
    stages: dict[str, list[Artifact]] = {}
    for stage, axes in STAGES:
        wheels = stages[stage] = []
        for axis in (a for a in axes if a in values):
            for distribution in stack.distributions(axis, values[axis], values):
                artifact = resolved.pop((axis, canonicalize_name(distribution)), None)
                if artifact is None:
                    raise DockerError(
                        f"{axis} {values[axis]} installs {distribution}, but no wheel of it came"
                    )
                wheels.append(artifact)
    if resolved:
        names = ", ".join(f"{dist} ({axis})" for axis, dist in sorted(resolved))
        raise DockerError(f"no Dockerfile stage installs {names}; stages: {dict(STAGES)}")
    return stages


def requirement_line(distribution: str, url: str, sha256: str) -> str:
    """One hash-pinned direct-URL requirement; pip refuses anything whose hash differs."""
    parsed = urlparse(url)
    if parsed.scheme not in ("https", "http", "file"):
        raise DockerError(f"{distribution}: cannot install from {url!r} (not an http(s) or file URL)")
    if parsed.username or parsed.password:
        raise DockerError(
            f"{distribution}: its URL carries credentials; they would be written into the build context. "
            "Put them in ~/.netrc and pass netrc= to the Docker backend (a BuildKit secret)"
        )
    if any(c.isspace() or c in "\"'\\" for c in url):
        raise DockerError(f"{distribution}: URL {url!r} holds whitespace or quotes")
    if not _SHA256.fullmatch(sha256):
        raise DockerError(f"{distribution}: {sha256!r} is not a sha256 hex digest")
    return f"{canonicalize_name(distribution)} @ {url} --hash=sha256:{sha256}"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def context_wheels(
    tools: Sequence[Artifact], values: Mapping[str, str], artifacts: Mapping[Component, Artifact]
) -> dict[str, list[Artifact]]:
    """The wheels of each context folder: the suites' tools, then each install stage's (stage_wheels)."""
    wheels = {TOOLS_STAGE: list(tools), **stage_wheels(values, artifacts)}
    for arts in wheels.values():
        for art in arts:
            if not _WHEEL_FILENAME.fullmatch(art.filename):
                raise DockerError(f"unsafe wheel file name {art.filename!r} ({art.distribution})")
    return wheels


def _requirement(stage: str, art: Artifact) -> str:
    """The requirement line of one wheel: the copy of stackfarm's cached blob that place_wheels puts in the
    stage's folder, which the stage's RUN step mounts at /tmp/stackfarm/<stage>."""
    return requirement_line(art.distribution, f"file:///tmp/stackfarm/{stage}/{art.filename}", art.sha256)


def _place_local_wheel(blob: Path, dest: Path) -> None:
    # A hard link costs nothing when the cache and the context share a disk; a copy otherwise.
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.unlink(missing_ok=True)
    try:
        os.link(blob, dest)
    except OSError:
        shutil.copyfile(blob, dest)


def write_context(
    context: Path,
    *,
    wheels: Mapping[str, Sequence[Artifact]],
    record: CellSpec,
    overlay: Path | None,
    ca_bundle: Path | None = None,
) -> None:
    """Lay out the build context docker/Dockerfile expects, without the wheels themselves (place_wheels).
    Each stage gets its own folder, bind-mounted into its RUN step alone, so a stage's cache key is its own
    wheels and nothing else."""
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    for stage, arts in wheels.items():
        lines = sorted(_requirement(stage, art) for art in arts)
        _write(context / stage / "requirements.txt", "".join(f"{line}\n" for line in lines))
    files = context / "patch" / "files"
    files.mkdir(parents=True)
    deleted = ""
    if overlay is not None:
        shutil.copytree(overlay / "files", files, dirs_exist_ok=True)
        deleted = (overlay / "deleted").read_text(encoding="utf-8")
    _write(context / "patch" / "deleted", deleted)
    _write(context / "ca" / "extra.pem", ca_bundle.read_text(encoding="utf-8") if ca_bundle else "")
    _write(context / "cell.json", json.dumps(dataclasses.asdict(record), indent=2, sort_keys=True) + "\n")


def place_wheels(
    context: Path, wheels: Mapping[str, Sequence[Artifact]], local_blob: Callable[[Artifact], Path]
) -> list[Path]:
    """Put every wheel beside its stage's requirements.txt: `local_blob` (stackfarm's cache: fetched once,
    sha256-verified) gives its file. Returns the wheels placed."""
    placed = []
    for stage, arts in wheels.items():
        for art in arts:
            dest = context / stage / art.filename
            _place_local_wheel(local_blob(art), dest)
            placed.append(dest)
    return placed


def context_digest(dockerfile: bytes, context: Path, build_args: Mapping[str, str], base_id: str) -> str:
    """sha256 over everything the image depends on: the Dockerfile, the base image's id, the build args and
    every context file. Local wheels are skipped: their sha256 is in the requirements file that names them."""
    digest = hashlib.sha256()
    digest.update(b"dockerfile\0" + hashlib.sha256(dockerfile).hexdigest().encode() + b"\0")
    digest.update(f"base\0{base_id}\0".encode())
    for name in sorted(build_args):
        digest.update(f"arg\0{name}={build_args[name]}\0".encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file() and p.suffix != ".whl"):
        digest.update(b"file\0" + str(path.relative_to(context)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\0")
    return digest.hexdigest()


def make_overlay(pristine: Path, patched: Path, dest: Path) -> tuple[list[str], list[str]]:
    """Copy the files of `patched` that differ from `pristine` under dest/files; list the removed ones in
    dest/deleted (paths relative to the tree: for a wheel, to site-packages). Returns both lists."""

    def files(root: Path) -> set[str]:
        return {
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.name != _MARKER
        }

    before, after = files(pristine), files(patched)
    changed = sorted(
        f for f in after if f not in before or not filecmp.cmp(pristine / f, patched / f, shallow=False)
    )
    deleted = sorted(before - after)
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "files").mkdir(parents=True)
    for rel in changed:
        target = dest / "files" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(patched / rel, target)
    (dest / "deleted").write_text("".join(f"{f}\n" for f in deleted), encoding="utf-8")
    return changed, deleted


__all__ = [
    "DOCKERFILE",
    "STAGES",
    "TOOLS_STAGE",
    "context_digest",
    "context_wheels",
    "image_name",
    "make_overlay",
    "place_wheels",
    "requirement_line",
    "stage_wheels",
    "write_context",
]
