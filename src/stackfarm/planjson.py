"""The plan as the fan-out engines need it: `stackfarm plan --json`'s document.

Each cell of the plan carries, beside its values and components:

- ``runner``, ``labels``, ``gpus``, ``arch``: the first ``[runners.<kind>]`` of matrix.toml whose ``cells`` globs
  match its id (stackfarm.gha's rule; one generic GPU kind when the matrix has no [runners]);
- ``estimated_seconds``: the median over the past runs of a history folder (``--history DIR``: one copy of
  reports/ per run, as the nightly keeps) of the cell's suite times added up; null without a history or when
  the cell never ran there;
- ``input_hash``: exactly what the runner computes for the cell (stackfarm.runner.cell_inputs over the wheels
  the index answers, hashed by stackfarm.plan.input_hash) for the backend and GPU presence named in the
  document's ``hash_basis``; null, with ``input_hash_error`` saying why, when a wheel cannot be looked up (an
  index that did not answer, a wheel the index lacks);
- ``stored``: whether the shared verdict store (``--store DIR|URL``, stackfarm.store) holds a verdict that may
  stand for this input hash.

The store is keyed by input hash (``<store>/<input hash>/<cell>/``, as `stackfarm run --store` pushes). A verdict
there counts as stored exactly when the runner would reuse it (its files' sha256 as the entry's manifest says,
then stackfarm.verdict.read + stackfarm.verdict.reusable: same input hash, a cell that ran, its JUnit files
intact), so a cell marked stored costs no GPU time on any runner. A broken entry is not stored, with a warning;
a store that does not answer raises (exit 4), never "not stored".
"""

from __future__ import annotations

import fnmatch
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import verdict
from .artifacts import Artifact
from .emit import runner_fields
from .errors import ArtifactError
from .gha import DEFAULT_RUNNER
from .matrix import Matrix, Runner
from .plan import Cell, Component, Plan, input_hash
from .resolve import Resolver
from .runner import cell_inputs
from .store import BrokenEntry, Store

#: What a document's input hashes are computed for unless told otherwise: a GPU runner realising the cells in
#: Docker, as the nightly's cell jobs do.
DEFAULT_BACKEND = "docker"


def runner_kind(cell_id: str, runners: Sequence[Runner]) -> Runner | None:
    """The first runner kind whose cells globs match the id (None: no kind would run it)."""
    return next((k for k in runners if any(fnmatch.fnmatchcase(cell_id, g) for g in k.cells)), None)


def durations(history: Path) -> dict[str, float]:
    """Each cell's median duration in seconds over the runs of a history folder: a run's duration of a cell is
    its suites' times added up; a verdict reused from an earlier run counts once (by its run id)."""
    seen: dict[str, dict[str, float]] = {}
    runs = sorted(p for p in history.iterdir() if p.is_dir()) if history.is_dir() else []
    for run in runs:
        stored, _problems = verdict.read_all(run, judge=False)  # times for estimates, no verdict
        for s in stored:
            report = s.report
            if not report.ran or not report.suites:
                continue
            key = report.run_id or f"{run.name}/{report.cell}"
            seen.setdefault(report.cell, {})[key] = sum(x.time for x in report.suites)
    return {cell: statistics.median(times.values()) for cell, times in seen.items()}


def cell_hash(
    matrix: Matrix,
    cell: Cell,
    resolver: Resolver,
    unreachable: Mapping[tuple[str, str], str],
    *,
    backend: str,
    gpu: bool,
) -> tuple[str | None, str | None]:
    """(input hash, None), or (None, why not) when a wheel of the cell cannot be looked up."""
    artifacts: dict[Component, Artifact] = {}
    for comp in cell.components:
        key = (comp.distribution, comp.version)
        if key in unreachable:
            return None, unreachable[key]
        try:
            artifacts[comp] = resolver.artifact(comp, cell["python"])
        except ArtifactError as exc:
            return None, str(exc)
    return input_hash(cell_inputs(matrix, cell, artifacts, backend=backend, gpu=gpu)), None


def is_stored(store: Store, cell_id: str, digest: str, warnings: list[str] | None = None) -> bool:
    """Whether the store holds a verdict of the cell that may stand for a run with this input hash (a broken
    entry does not; `warnings` gets why)."""
    try:
        return store.holds(cell_id, digest)
    except BrokenEntry as exc:
        if warnings is not None:
            warnings.append(f"{exc}: not stored, the cell runs again")
        return False


def plan_document(
    matrix: Matrix,
    plan: Plan,
    unreachable: Mapping[tuple[str, str], str],
    resolver: Resolver | None,
    *,
    history: Path | None = None,
    store: Store | None = None,
    backend: str = DEFAULT_BACKEND,
    gpu: bool = True,
) -> dict[str, Any]:
    """`stackfarm plan --json`'s document (see the module's docstring). `resolver` None: no input hashes."""
    runners = tuple(matrix.runners.values()) or (DEFAULT_RUNNER,)
    estimates = durations(history) if history is not None else {}
    warnings = list(plan.warnings)
    cells = []
    for cell in plan.cells:
        kind = runner_kind(cell.id, runners)
        if kind is None:
            warnings.append(f"cell {cell.id} matches no [runners.*] cells glob: no engine would run it")
        digest: str | None
        why: str | None
        if resolver is None:
            digest, why = None, "planned without looking the wheels up"
        else:
            digest, why = cell_hash(matrix, cell, resolver, unreachable, backend=backend, gpu=gpu)
        cells.append(
            {
                **asdict(cell),
                "values": cell.as_dict(),
                **runner_fields(kind),
                "estimated_seconds": estimates.get(cell.id),
                "input_hash": digest,
                "input_hash_error": why,
                "stored": bool(store is not None and digest and is_stored(store, cell.id, digest, warnings)),
            }
        )
    return {
        "matrix": str(matrix.path),
        "hash_basis": {"backend": backend, "gpu": gpu},
        "history": str(history) if history is not None else None,
        "store": store.where if store is not None else None,
        "cells": cells,
        "conflicts": [{"id": c.cell.id, "problems": list(c.problems)} for c in plan.conflicts],
        "excluded": [{"id": e.cell.id, "reason": e.reason} for e in plan.excluded],
        "warnings": warnings,
        "unreachable": [{"distribution": d, "version": v, "reason": r} for (d, v), r in unreachable.items()],
    }


__all__ = ["DEFAULT_BACKEND", "cell_hash", "durations", "is_stored", "plan_document", "runner_kind"]
