"""What the Docker backend's test files share: a synthetic cell's artifacts and record, and the real engine and
base image (skipped, with the reason, where none answers). No tests of its own."""

from __future__ import annotations

import hashlib
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from stackfarm.artifacts import Artifact
from stackfarm.backends import docker as dk
from stackfarm.backends.docker.common import site_packages
from stackfarm.backends.docker.context import context_digest, context_wheels, write_context
from stackfarm.backends.docker.engine import DockerEngine
from stackfarm.cellspec import CellSpec, InstalledComponent
from stackfarm.plan import Component

CELL = "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"
#: The synthetic cell's axis values, as the plan gives them (a record carries them too).
VALUES = {
    "cuda": "12.8",
    "torch": "2.9.1",
    "sgl_kernel": "0.3.21",
    "flashinfer": "0.6.3",
    "sglang": "0.5.9",
    "python": "3.11",
}
LOCAL_BASE = os.environ.get("STACKFARM_TEST_BASE", "stackfarm-base:bookworm")
SHA = {
    name: hashlib.sha256(name.encode()).hexdigest()
    for name in ("torch", "sk", "fi", "fic", "fijc", "nccl", "sgl", "tool")
}
#: A label on the containers these tests create: other runs on the same engine have containers of their own.
TEST_LABEL = ("org.stackfarm.test", uuid.uuid4().hex)


def art(dist: str, version: str, sha: str, url: str | None = None) -> Artifact:
    filename = f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    return Artifact(
        distribution=dist,
        version=version,
        filename=filename,
        url=url or f"https://files.example.org/packages/{filename}",
        sha256=sha,
        size=1000,
        source="pypi",
    )


def stack_artifacts(**changes: str) -> dict[Component, Artifact]:
    """A cell's five components, shaped like the real cu128/sgl0.5.9 cell (synthetic URLs and hashes)."""
    rows = [
        ("torch", "torch", "2.9.1", "torch"),
        ("sgl_kernel", "sgl-kernel", "0.3.21", "sk"),
        ("flashinfer", "flashinfer-python", "0.6.3", "fi"),
        ("flashinfer", "flashinfer-cubin", "0.6.3", "fic"),
        ("sglang", "sglang", "0.5.9", "sgl"),
    ]
    return {
        Component(axis=axis, distribution=dist, version=v, index="pypi"): art(
            dist, v, changes.get(key, SHA[key])
        )
        for axis, dist, v, key in rows
    }


def record(artifacts: dict[Component, Artifact], values: dict[str, str] | None = None) -> CellSpec:
    return CellSpec(
        id=CELL,
        values=dict(VALUES if values is None else values),
        backend="docker",
        components=tuple(
            InstalledComponent(
                axis=c.axis,
                distribution=c.distribution,
                version=c.version,
                filename=a.filename,
                sha256=a.sha256,
                source=a.source,
                root=site_packages("3.11"),
            )
            for c, a in artifacts.items()
        ),
    )


def context(
    path: Path,
    artifacts: dict[Component, Artifact],
    overlay: Path | None = None,
    values: dict[str, str] | None = None,
) -> Path:
    rec = record(artifacts, values)
    write_context(
        path,
        wheels=context_wheels([art("pytest", "9.0.3", SHA["tool"])], rec.values, artifacts),
        record=rec,
        overlay=overlay,
    )
    return path


def digest(ctx: Path, dockerfile: bytes = b"FROM x\n", base_id: str = "sha256:aa") -> str:
    return context_digest(dockerfile, ctx, {"BASE": "stackfarm-base:bookworm", "PYTHON": "3.11"}, base_id)


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


# -- the real engine (each test file declares its own fixtures from these) -----------------------------------


def real_engine() -> DockerEngine:
    reason = dk.engine_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no usable Docker engine: {reason}")
    return DockerEngine()


def local_base(engine: DockerEngine) -> str:
    if engine.image_id(LOCAL_BASE) is None:
        pytest.skip(f"base image {LOCAL_BASE} is missing: run docker/make-base.sh (or .ci/docker.sh)")
    return LOCAL_BASE


def leftovers(engine: DockerEngine, label: tuple[str, str] = TEST_LABEL) -> list[str]:
    """Containers still there that carry `label` (those of these tests by default)."""
    out = subprocess.run(
        [engine.executable, "ps", "-aq", "--filter", f"label={label[0]}={label[1]}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()
