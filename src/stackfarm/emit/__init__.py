"""Emitters: the document `stackfarm plan --json` prints (stackfarm.planjson) as a pipeline of another engine.

    stackfarm emit gha | buildkite | k8s --plan plan.json [--chunk N]

Every emitter takes the same cells (`pending`): those without a stored verdict for their input hash, longest
first by estimated duration (cells never timed first: they may be the longest), each on its runner kind. The
engines' own limits decide the chunks: 256 jobs per GitHub Actions matrix, 500 steps per Buildkite upload, and
a ConfigMap's 1 MiB for a Kubernetes Job's plan.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..driver import route
from ..errors import StackfarmError
from ..matrix import Runner
from ..planjson import PlanContract, runner_fields

#: One cell of the plan document, as JSON gives it back.
CellDoc = Mapping[str, Any]


class EmitError(StackfarmError):
    """The plan cannot be emitted as asked (a cell without a runner kind, a chunk past the engine's limit)."""


def runner_of(cell: CellDoc) -> str:
    kind = cell.get("runner")
    if not isinstance(kind, str) or not kind:
        raise EmitError(
            f"cell {cell.get('id')} has no runner kind in the plan: plan it with `stackfarm plan --json` "
            "(which places each cell on the first [runners.<kind>] whose cells globs match it)"
        )
    return kind


def place(doc: Mapping[str, Any], runners: Sequence[Runner]) -> dict[str, Any]:
    """The plan document with each cell that lacks a routing given one (for documents of an older `plan
    --json`): stackfarm.driver.route by its CUDA floor, as `plan` and `gha matrix` route."""
    cells = []
    for cell in doc.get("cells", []):
        if cell.get("runner") or "status" in cell:
            cells.append(cell)
            continue
        found = route(str(cell["id"]), str((cell.get("values") or {}).get("cuda", "")), runners)
        if found.status == "unrouted":
            raise EmitError(f"cell {cell['id']} matches no [runners.*] cells glob: it would never run")
        cells.append({**cell, **runner_fields(found.runner), "status": found.status,
                      "unrunnable": found.reason or None})  # fmt: skip
    return {**doc, "cells": cells}


def pending(doc: Mapping[str, Any]) -> list[CellDoc]:
    """The cells to run: no stored verdict, longest first (an unknown duration sorts first), then by id. A cell
    the plan dispatches nowhere (status unrunnable: no kind's driver runs it) is left out; the merge, which
    reads the plan, counts it as a planned cell without a verdict."""
    cells = [c for c in doc.get("cells", []) if not c.get("stored") and c.get("status", "run") == "run"]
    for cell in cells:
        runner_of(cell)

    def order(cell: CellDoc) -> tuple[int, float, str]:
        seconds = cell.get("estimated_seconds")
        if seconds is None:
            return (0, 0.0, str(cell["id"]))
        return (1, -float(seconds), str(cell["id"]))

    return sorted(cells, key=order)


def store_of(doc: Mapping[str, Any]) -> str | None:
    """The verdict store the plan was made against (`plan --json --store`): every worker pushes its verdict
    there, so that the next plan marks the cell stored."""
    store = doc.get("store")
    return store if isinstance(store, str) and store else None


def worker_args(doc: Mapping[str, Any], plan: str | None = None) -> list[str]:
    """What every worker's `stackfarm run` carries of the plan: the plan itself when the worker can read it
    (it then adopts the plan's hash basis and checks its input hashes), the plan's matrix (a plan made from
    `--matrix X` runs X, never ./matrix.toml) and its store."""
    return [*(["--plan", plan] if plan else []), *PlanContract.of(doc).worker_args()]


def merge_command(doc: Mapping[str, Any], plan: str | None = None) -> str:
    """The merge step's command: it always reads the plan (`report --plan`: a planned cell without a verdict
    keeps the gate incomplete). With a store, the verdicts come from it (`report --from`): also those of the
    cells the plan left out as stored, failed ones included, which no job of this pipeline downloads."""
    base = ["python", "-m", "stackfarm", "report", "--reports", "reports", "--gate"]
    store = store_of(doc)
    contract = PlanContract.of(doc)
    base += [*(["--from", store] if store else []), "--plan", plan or "plan.json"]
    base += ["--matrix", contract.matrix.path] if contract.matrix else []
    if store is None:
        return shlex.join(base)
    basis = doc.get("hash_basis") or {}
    base += [
        "--backend",
        str(basis.get("backend") or "docker"),
        *([] if basis.get("gpu", True) else ["--no-gpu"]),
    ]
    return shlex.join(base)


def conflict_lines(doc: Mapping[str, Any]) -> list[str]:
    """One line per conflict cell of the plan: no job runs it, so the pipeline itself must say it is not green."""
    return [
        f"conflict: {c.get('id')}: {'; '.join(str(p) for p in c.get('problems', []))}"
        for c in doc.get("conflicts", [])
    ]


def chunks(items: Sequence[CellDoc], size: int) -> Iterator[Sequence[CellDoc]]:
    if size < 1:
        raise EmitError(f"--chunk {size}: a chunk holds at least one cell")
    for start in range(0, len(items), size):
        yield items[start : start + size]


def check_chunk(size: int | None, limit: int, engine: str) -> int:
    """The chunk size asked for (default: the engine's limit), refused past that limit."""
    if size is None:
        return limit
    if not 1 <= size <= limit:
        raise EmitError(f"--chunk {size}: {engine} takes 1 to {limit} per chunk")
    return size


__all__ = [
    "CellDoc",
    "EmitError",
    "check_chunk",
    "chunks",
    "merge_command",
    "pending",
    "place",
    "runner_fields",
    "runner_of",
    "worker_args",
]
