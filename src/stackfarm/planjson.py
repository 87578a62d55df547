"""The plan as the fan-out engines need it: `stackfarm plan --json`'s document.

Each cell of the plan carries, beside its values and components:

- ``runner``, ``labels``, ``gpus``, ``arch``: where it is dispatched (stackfarm.driver.route, the one rule every
  engine uses): the first ``[runners.<kind>]`` of matrix.toml whose ``cells`` globs match its id and whose
  ``driver`` can run it (one generic GPU kind when the matrix has no [runners]); all null when none can;
- ``status``: ``run`` (dispatched), ``unrunnable`` (no kind its globs match has a driver that runs it; the reason
  in ``unrunnable``, each kind passed over in ``passed_over``) or ``unrouted`` (no kind's globs match it); a cell
  that is not ``run`` is dispatched by no engine and keeps every merge's gate incomplete;
- ``driver_floor`` (``{driver, reason}`` or null): the higher of its CUDA's floor and the floor of the driver-API
  symbols its libraries loaded at import link (stackfarm.analysis.abicheck.import_driver_symbols; every
  library when the matrix runs 05-import, which dlopens each one); ``driver_symbols``: those symbols, or null
  when they were not read (``driver_symbols_note`` says why: no kind states a driver, or a wheel's tree is not
  in the cache and `plan --symbols` was not asked);
- ``estimated_seconds``: the median over the past runs of a history folder (``--history DIR``: one copy of
  reports/ per run, as the nightly keeps) of the cell's suite times added up; null without a history or when
  the cell never ran there;
- ``input_hash``: exactly what the runner computes for the cell (stackfarm.cellinputs.cell_inputs over the wheels
  the index answers, hashed by stackfarm.plan.input_hash) for the backend and GPU presence named in the
  document's ``hash_basis``; null, with ``input_hash_error`` saying why, when a wheel cannot be looked up (an
  index that did not answer, a wheel the index lacks);
- ``stored``: whether the shared verdict store (``--store DIR|URL``, stackfarm.store) holds a verdict that may
  stand for this input hash.

The document's ``matrix`` (``{path, sha256}``: the file planned and its content's sha256), ``hash_basis``
(``{backend, gpu}``) and ``store`` are the plan's contract (`PlanContract`): a worker (`run --plan`) runs the
plan's matrix, refusing one whose content differs, hashes and pushes under the plan's basis, refusing when it
cannot honour it, and the merge (`report --plan`) counts every planned cell.

The store is keyed by input hash (``<store>/<input hash>/<cell>/``, as `stackfarm run --store` pushes). A verdict
there counts as stored exactly when the runner would reuse it (its files' sha256 as the entry's manifest says,
then stackfarm.verdict.read + stackfarm.verdict.reusable: same input hash, a cell that ran, its JUnit files
intact), so a cell marked stored costs no GPU time on any runner. A broken entry is not stored, with a warning;
a store that does not answer raises (exit 4), never "not stored".
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import verdict
from .artifacts import Artifact
from .backends import realised
from .cellinputs import cell_inputs
from .driver import Route, matrix_runners, route, routed_runner
from .errors import ArtifactError, ConfigError, StackfarmError
from .files import sha256_file
from .matrix import Matrix, Runner
from .plan import Cell, Component, Conflict, Plan, input_hash
from .resolve import Resolver
from .store import BrokenEntry, Store

#: What a document's input hashes are computed for unless told otherwise: a GPU runner realising the cells in
#: Docker, as the nightly's cell jobs do.
DEFAULT_BACKEND = "docker"
#: Suites that dlopen every native library of the cell (not only those an import loads): with one of them in
#: the matrix, every library's driver-API symbols raise the floor.
EVERY_LIBRARY_SUITES = ("05-import",)


# --------------------------------------------------------------------------- the contract


@dataclass(frozen=True)
class MatrixRef:
    """The matrix file a plan was made from: its path as given to `plan --matrix`, and its content's sha256."""

    path: str
    sha256: str

    @classmethod
    def of(cls, path: Path) -> MatrixRef:
        return cls(path=str(path), sha256=sha256_file(path))


@dataclass(frozen=True)
class HashBasis:
    """What the plan's input hashes are computed for: the backend that realises the cells, and a GPU or not."""

    backend: str
    gpu: bool

    def describe(self) -> str:
        return f"backend {self.backend}, {'with' if self.gpu else 'without'} a GPU"


@dataclass(frozen=True)
class PlanContract:
    """What every worker and merge of a plan adopts (the document's ``matrix``, ``hash_basis``, ``store``)."""

    matrix: MatrixRef | None
    basis: HashBasis | None
    store: str | None

    @classmethod
    def of(cls, doc: Mapping[str, Any], where: str = "the plan") -> PlanContract:
        """The contract of a plan document; a document of an older `plan --json` (matrix as a bare path, no
        sha256) gives matrix None."""
        matrix, basis, store = doc.get("matrix"), doc.get("hash_basis"), doc.get("store")
        ref = None
        if isinstance(matrix, Mapping):
            if not isinstance(matrix.get("path"), str) or not isinstance(matrix.get("sha256"), str):
                raise StackfarmError(
                    f"{where}: its matrix must be {{path, sha256}} (`stackfarm plan --json`)"
                )
            ref = MatrixRef(path=matrix["path"], sha256=matrix["sha256"])
        hb = None
        if isinstance(basis, Mapping):
            hb = HashBasis(
                backend=str(basis.get("backend") or DEFAULT_BACKEND), gpu=bool(basis.get("gpu", True))
            )
        return cls(matrix=ref, basis=hb, store=store if isinstance(store, str) and store else None)

    def check_matrix(self, path: Path, where: str = "the plan") -> None:
        """Refuse (exit 2) a matrix file whose content is not the one the plan was made from."""
        if self.matrix is None:
            return
        try:
            actual = sha256_file(path)
        except OSError as exc:
            raise ConfigError(
                path,
                f"cannot read the matrix {where} was made from ({exc.strerror or exc})",
                fix="run where the plan's matrix is (the same checkout), or pass it with --matrix",
            ) from None
        if actual != self.matrix.sha256:
            raise ConfigError(
                path,
                f"this matrix (sha256 {actual}) is not the one {where} was made from ({self.matrix.path}, "
                f"sha256 {self.matrix.sha256}): its cells and input hashes would not be the plan's",
                fix="run the plan's commit of the matrix, or make the plan again from this one",
            )

    def worker_args(self) -> list[str]:
        """What a worker's command line carries of the contract (the matrix; the store when there is one)."""
        return [
            *(["--matrix", self.matrix.path] if self.matrix else []),
            *(["--store", self.store] if self.store else []),
        ]


# --------------------------------------------------------------------------- the document


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


def cell_artifacts(
    cell: Cell, resolver: Resolver, unreachable: Mapping[tuple[str, str], str]
) -> tuple[dict[Component, Artifact] | None, str | None]:
    """(the cell's wheels, None), or (None, why not) when one cannot be looked up."""
    artifacts: dict[Component, Artifact] = {}
    for comp in cell.components:
        key = (comp.distribution, comp.version)
        if key in unreachable:
            return None, unreachable[key]
        try:
            artifacts[comp] = resolver.artifact(comp, cell["python"])
        except ArtifactError as exc:
            return None, str(exc)
    return artifacts, None


def driver_symbols(
    matrix: Matrix, artifacts: Mapping[Component, Artifact] | None, resolver: Resolver, *, fetch: bool
) -> tuple[tuple[str, ...] | None, str]:
    """(the driver-API symbols the cell's libraries link, ""), or (None, why they were not read). Trees come
    from the cache (a run made them); with `fetch`, the missing ones are made (lazy trees where the index
    answers ranges: the libraries and sources only)."""
    if not any(r.driver for r in matrix.runners.values()):
        return None, "no runner kind states a driver: the symbols decide nothing"
    if artifacts is None:
        return None, "its wheels could not be looked up"
    from . import lazytree  # the ELF readers: only where a driver is stated
    from .analysis.abicheck import import_driver_symbols

    components = []
    for comp, art in artifacts.items():
        try:
            tree = (
                resolver.cache.lazy_tree(art, lazytree.lazy_tree) if fetch else resolver.cache.unpacked(art)
            )
        except ArtifactError as exc:
            return None, f"the tree of {art.filename} is unusable: {exc}"
        if tree is None:
            return None, f"{art.filename} is not unpacked in the cache (`plan --symbols` reads it)"
        components.append(realised(comp, art, tree))
    every = any(s.name in EVERY_LIBRARY_SUITES for s in matrix.suites)
    found = import_driver_symbols(components, every=every)
    return tuple(sorted({name for names in found.values() for name in names})), ""


def is_stored(store: Store, cell_id: str, digest: str, warnings: list[str] | None = None) -> bool:
    """Whether the store holds a verdict of the cell that may stand for a run with this input hash (a broken
    entry does not; `warnings` gets why)."""
    try:
        return store.holds(cell_id, digest)
    except BrokenEntry as exc:
        if warnings is not None:
            warnings.append(f"{exc}: not stored, the cell runs again")
        return False


def runner_fields(kind: Runner | None) -> dict[str, Any]:
    """What a plan cell says of its runner kind (an entry of stackfarm.gha.dispatch's matrix, less the cell id)."""
    if kind is None:
        return {"runner": None, "labels": [], "gpus": None, "arch": None}
    return {"runner": kind.name, "labels": list(kind.labels), "gpus": kind.gpus, "arch": kind.arch}


def _route_fields(found: Route, symbols: tuple[str, ...] | None, note: str) -> dict[str, Any]:
    return {
        **runner_fields(found.runner),
        "status": found.status,
        "unrunnable": found.reason or None,
        "passed_over": list(found.passed_over),
        "driver_floor": asdict(found.floor) if found.floor is not None else None,
        "driver_symbols": list(symbols) if symbols is not None else None,
        "driver_symbols_note": note,
    }


def conflict_entry(conflict: Conflict) -> dict[str, Any]:
    """A conflict as plan documents carry it: its problems, typed contradictions and matrix line (the merge
    of a CI or Ray run records it as `run` does, stackfarm.cli.runs)."""
    where = conflict.declared_at
    return {
        "id": conflict.cell.id,
        "problems": list(conflict.problems),
        "contradictions": [asdict(c) for c in conflict.contradictions],
        "declared_at": asdict(where) if where is not None else None,
    }


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
    fetch_symbols: bool = False,
) -> dict[str, Any]:
    """`stackfarm plan --json`'s document (see the module's docstring). `resolver` None: no input hashes."""
    runners = matrix_runners(matrix)
    estimates = durations(history) if history is not None else {}
    warnings = list(plan.warnings)
    cells = []
    for cell in plan.cells:
        artifacts: dict[Component, Artifact] | None = None
        why: str | None = "planned without looking the wheels up"
        symbols: tuple[str, ...] | None = None
        note = "planned without looking the wheels up"
        if resolver is not None:
            artifacts, why = cell_artifacts(cell, resolver, unreachable)
            symbols, note = driver_symbols(matrix, artifacts, resolver, fetch=fetch_symbols)
        found = route(cell.id, cell.as_dict().get("cuda", ""), runners, symbols or ())
        if found.status != "run":
            warnings.append(f"cell {cell.id}: {found.reason}")
        # The hash names the kind it runs on (a runner that realises it adopts it from the plan); a cell that
        # runs nowhere is hashed for the kind its globs name, so a verdict of it from elsewhere still matches.
        kind = routed_runner(matrix, cell.id, cell.as_dict().get("cuda", ""), symbols or ())
        digest = (
            input_hash(cell_inputs(matrix, cell, artifacts, backend=backend, gpu=gpu, kind=kind))
            if artifacts is not None
            else None
        )
        cells.append(
            {
                **asdict(cell),
                "values": cell.as_dict(),
                **_route_fields(found, symbols, note),
                "estimated_seconds": estimates.get(cell.id),
                "input_hash": digest,
                "input_hash_error": None if digest else why,
                "stored": bool(store is not None and digest and is_stored(store, cell.id, digest, warnings)),
            }
        )
    return {
        "matrix": asdict(MatrixRef.of(matrix.path)),
        "hash_basis": asdict(HashBasis(backend=backend, gpu=gpu)),
        "history": str(history) if history is not None else None,
        "store": store.where if store is not None else None,
        "cells": cells,
        "conflicts": [conflict_entry(c) for c in plan.conflicts],
        "excluded": [{"id": e.cell.id, "reason": e.reason} for e in plan.excluded],
        "warnings": warnings,
        "unreachable": [{"distribution": d, "version": v, "reason": r} for (d, v), r in unreachable.items()],
    }


__all__ = [
    "DEFAULT_BACKEND",
    "EVERY_LIBRARY_SUITES",
    "HashBasis",
    "MatrixRef",
    "PlanContract",
    "cell_artifacts",
    "conflict_entry",
    "driver_symbols",
    "durations",
    "is_stored",
    "plan_document",
    "runner_fields",
]
