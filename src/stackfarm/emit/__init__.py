"""Emitters: the document `stackfarm plan --json` prints (stackfarm.planjson) as a pipeline of another engine.

    stackfarm emit gha | buildkite | k8s --plan plan.json [--chunk N] [--image REF]

Every emitter takes the same cells (`pending`): those without a stored verdict for their input hash, longest
first by estimated duration (cells never timed first: they may be the longest), each on its runner kind. The
engines' own limits decide the chunks: 256 jobs per GitHub Actions matrix, 500 steps per Buildkite upload, and
a ConfigMap's 1 MiB for a Kubernetes Job's plan.

The plan is the contract: every worker's command line is `worker_argv` (the plan's cell with the plan's matrix,
hash basis and store) and every merge's is `merge_argv` (`report --gate --plan`, from the store when there is
one), so a worker's verdict lands under the planned input hash and a planned cell without one keeps the gate
shut. Conflict cells, which no worker runs, are named in each document and counted by the merge.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..driver import route
from ..errors import StackfarmError
from ..matrix import Runner
from ..planjson import runner_fields

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
        cells.append(
            {
                **cell,
                **runner_fields(found.runner),
                "status": found.status,
                "unrunnable": found.reason or None,
            }
        )
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


def matrix_of(doc: Mapping[str, Any]) -> str | None:
    """The matrix file the plan was made from (a path, or a table with one: `{"path": ..., "sha256": ...}`),
    as the workers must load it: a worker without it would plan ./matrix.toml instead."""
    matrix = doc.get("matrix")
    if isinstance(matrix, Mapping):
        matrix = matrix.get("path")
    return matrix if isinstance(matrix, str) and matrix else None


def basis_args(doc: Mapping[str, Any]) -> list[str]:
    """`--backend B` of the plan's hash basis (docker unless it says otherwise): the worker realises its cell
    the way the plan hashed it, so its verdict lands under the planned input hash."""
    basis = doc.get("hash_basis") or {}
    return ["--backend", str(basis.get("backend") or "docker")]


def worker_argv(
    doc: Mapping[str, Any],
    plan: str,
    *,
    cell: str | None = None,
    index: str | None = None,
    reports: str | None = None,
) -> list[str]:
    """One worker's command line: `stackfarm run` of one cell of the plan (by id or by index), with the plan's
    matrix, hash basis and store, so that its verdict is the one the merge looks for."""
    if (cell is None) == (index is None):
        raise EmitError("a worker runs one cell of the plan: give its id or its index")
    argv = ["python", "-m", "stackfarm", "run", "--plan", plan]
    argv += ["--cells", cell] if cell is not None else ["--cell-index", str(index)]
    matrix = matrix_of(doc)
    argv += [*(["--matrix", matrix] if matrix else []), *basis_args(doc), "--jobs", "1"]
    argv += ["--reports", reports] if reports else []
    store = store_of(doc)
    return argv + (["--store", store] if store else [])


def merge_argv(doc: Mapping[str, Any], plan: str, *, reports: str = "reports") -> list[str]:
    """The merge's command line: `report --gate` over the plan, so a planned cell without a verdict keeps the
    gate shut (exit 3). With a store the verdicts come from it (`--from`): also those of the cells the plan
    left out as stored, failed ones included, which no job of the pipeline downloads; the matrix names the
    runner keys the merge trusts (`[store] trusted_keys`)."""
    argv = ["python", "-m", "stackfarm", "report", "--reports", reports, "--gate", "--plan", plan]
    store = store_of(doc)
    if store is None:
        return argv
    matrix = matrix_of(doc)
    basis = doc.get("hash_basis") or {}
    argv += ["--from", store, *(["--matrix", matrix] if matrix else []), *basis_args(doc)]
    return argv + ([] if basis.get("gpu", True) else ["--no-gpu"])


def merge_command(doc: Mapping[str, Any], plan: str = "plan.json") -> str:
    """merge_argv as one shell line."""
    return shlex.join(merge_argv(doc, plan))


def conflict_lines(doc: Mapping[str, Any]) -> list[str]:
    """One line per conflict cell of the plan: no job runs it, so the pipeline itself must say it is not green."""
    return [
        f"conflict: {c.get('id')}: {'; '.join(str(p) for p in c.get('problems', []))}"
        for c in doc.get("conflicts", [])
    ]


def shell_line(argv: Sequence[str], *, variables: Sequence[str] = ()) -> str:
    """argv as one shell line, each word quoted, except the `variables` (e.g. "CELL"), which the engine sets:
    a word `$NAME` is written `"${NAME}"`, so the shell expands it, as one word."""
    return " ".join(
        f'"${{{a[1:]}}}"' if a.startswith("$") and a[1:] in variables else shlex.quote(a) for a in argv
    )


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
    "basis_args",
    "check_chunk",
    "chunks",
    "matrix_of",
    "merge_argv",
    "merge_command",
    "pending",
    "place",
    "runner_fields",
    "runner_of",
    "shell_line",
    "worker_argv",
]
