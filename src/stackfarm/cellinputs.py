"""What a cell's verdict depends on: the inputs whose hash decides whether a stored verdict stands for a run.

The runner hashes them before it runs a cell, `plan --json` for every cell of a plan (a worker checks the plan's
hash before it runs), `qualify` for its sign-off: one definition below all three. It lived in stackfarm.runner,
so the plan's writer stood on the whole runner (backends, store, suites' wiring) to compute a hash.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from . import __version__
from .artifacts import Artifact
from .driver import routed_runner
from .matrix import Matrix
from .matrix import Runner as MatrixRunner
from .plan import Cell, Component


def hash_tree(path: Path) -> str:
    """sha256 over the relative names and contents of every file under `path` (caches and bytecode excluded)."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if "__pycache__" in file.parts or file.suffix == ".pyc":
            continue
        digest.update(str(file.relative_to(path.parent)).encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


@functools.cache
def own_sources() -> str:
    """sha256 of stackfarm's own installed sources: editing the harness (or a suite library) is a new input."""
    return hash_tree(Path(__file__).resolve().parent)


def cell_inputs(
    matrix: Matrix,
    cell: Cell,
    artifacts: Mapping[Component, Artifact],
    *,
    backend: str,
    gpu: bool,
    kind: MatrixRunner | None = None,
) -> dict[str, object]:
    """Everything a cell's verdict depends on; its hash decides whether a verdict can be reused. `kind`: the
    runner kind it is dispatched to (a plan's worker adopts the plan's); by default the one its CUDA floor
    routes it to (stackfarm.driver.routed_runner)."""
    runner = kind or routed_runner(matrix, cell.id, cell.as_dict().get("cuda", ""))
    conftest = matrix.root / "suites" / "conftest.py"
    return {
        "stackfarm": __version__,
        "stackfarm_sources": own_sources(),
        "backend": backend,
        "values": cell.as_dict(),
        "artifacts": {c.distribution: a.sha256 for c, a in artifacts.items()},
        "patch_sets": {ps.name: hash_tree(ps.path) for ps in matrix.patch_sets if ps.name in cell.patch_sets},
        "suites": {
            **{s.name: hash_tree(s.path) for s in matrix.suites},
            "conftest": hash_tree(conftest) if conftest.exists() else "",
        },
        "suite_settings": [asdict(s) | {"path": s.path.name} for s in matrix.suites],
        "archs": [matrix.archs, matrix.reference_arch],
        "models": [asdict(m) for m in matrix.models],
        "features": matrix.features,
        "thresholds": matrix.thresholds,
        "overridden": cell.overridden,
        "deviations": [d.as_dict() for d in matrix.deviations],
        # A verdict made under a host profile (stackfarm.profile) is never reused without it, nor the reverse.
        "profile": {"name": p.name, "sha256": p.sha256} if (p := matrix.profile) is not None else None,
        "gpu": gpu,
        # Where the cell is routed decides what it is asked (a one-GPU kind: no tensor-parallel check; its
        # [thresholds.<kind>]), so a move to another runner kind is a new verdict.
        "runner": asdict(runner) if runner is not None else None,
        # The image is made from these before any verdict could be reused: an edited Dockerfile or another base
        # is a new verdict, never the old image's.
        "docker": _docker_inputs(matrix) if backend == "docker" else None,
    }


def _docker_inputs(matrix: Matrix) -> dict[str, object]:
    folder = matrix.root / "docker"
    return {
        "files": hash_tree(folder) if folder.is_dir() else "",
        "table": dict(matrix.docker),
        "base_override": os.environ.get("STACKFARM_DOCKER_BASE", ""),
    }


__all__ = ["cell_inputs", "hash_tree", "own_sources"]
