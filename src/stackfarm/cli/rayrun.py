"""`stackfarm run --executor ray[:ADDRESS] --store URL`: the driver of a run on a Ray cluster.

It plans the matrix here (or reads --plan), routes each cell to its runner kind (stackfarm.driver.route),
dispatches one Ray task per cell (stackfarm.executors.ray: the kind's GPUs and custom resource, retried on
another node when its node is lost), and merges what the nodes pushed: the store's signed verdict of each cell,
by the input hash the node computed, exactly as `stackfarm report --from URL --plan` merges (merge_from), into
--reports. A cell whose verdict is not in the store (its node's push failed, no attempt finished, an error
before it ran) is recorded as an error with the reason, never as a result; the exit code is `run`'s.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from .. import verdict
from ..artifacts import Cache
from ..driver import driver_problems, route
from ..errors import ExitCode, UsageError
from ..executors import ray as rayexec
from ..gha import DEFAULT_RUNNER
from ..matrix import Matrix, Runner
from ..planjson import conflict_entry
from ..profile import load_matrix
from ..resolve import Resolver, plan_matrix
from ..store import Store
from ..verdict import Cause, CellReport, Status
from ..worker import exact_glob, read_plan
from .runs import (
    error_line,
    merge_from,
    only_suites,
    opened_store,
    print_summary,
    selected,
    sigterm_interrupts,
    writable,
    write_reports,
)

_RAN = frozenset({str(Status.PASSED), str(Status.FAILED), str(Status.INCOMPLETE)})


def _worker_args(args: argparse.Namespace, cell: str) -> tuple[str, ...]:
    """The `stackfarm run` arguments of the cell's worker (paths as given: it runs in this folder's twin)."""
    argv = ["--matrix", str(args.matrix), "--store", str(args.store), "--backend", args.backend]
    argv += ["--cells", cell if args.plan is not None else exact_glob(cell)]  # with --plan: the exact id
    for flag in ("force", "refresh"):
        if getattr(args, flag):
            argv.append(f"--{flag}")
    for option in ("suites", "profile", "python"):
        value = getattr(args, option)
        if value is not None:
            argv += [f"--{option}", str(value)]
    return tuple(argv)


def _cells(
    args: argparse.Namespace, matrix: Matrix, cudas: dict[str, str]
) -> tuple[list[str], list[dict[str, Any]], list[CellReport]]:
    """(cell ids to dispatch, conflicts (as plan documents carry them), verdicts decided here: exclusions and cells no kind
    can run); `cudas` gets each dispatched cell's CUDA (its driver floor, for `route`)."""
    decided: list[CellReport] = []
    if args.plan is not None:
        doc = read_plan(args.plan)
        globs = [g.strip() for g in (args.cells or "*").split(",") if g.strip()]
        ids = []
        for c in doc["cells"]:
            if not any(fnmatch.fnmatchcase(str(c["id"]), g) for g in globs):
                continue
            if (
                c.get("status", "run") != "run"
            ):  # the plan routed it nowhere: never dispatched (driver floors)
                why = str(c.get("unrunnable") or f"the plan routes it nowhere ({c.get('status')})")
                decided.append(
                    CellReport(cell=str(c["id"]), status=Status.ERROR, reason=why, cause=Cause.ENVIRONMENT)
                )
                continue
            ids.append(str(c["id"]))
            cudas[str(c["id"])] = str(c.get("cuda", ""))
        conflicts = [dict(c) for c in doc.get("conflicts", [])]
        return ids, conflicts, decided
    resolver = Resolver(matrix, Cache(), refresh=args.refresh)
    full, unreachable = plan_matrix(matrix, resolver, None)
    p = selected(full, args.cells, matrix, to_run=True)
    for (dist, version), reason in sorted(unreachable.items()):
        error_line(f"{dist} {version}: {reason}")
    for excluded in p.excluded:
        decided.append(CellReport(cell=excluded.cell.id, status=Status.EXCLUDED, reason=excluded.reason))
    # A cell the driver of its kind cannot run is not dispatched there (stackfarm.driver's floors).
    too_old = driver_problems(matrix, p.cells)
    for cell, why in too_old.items():
        decided.append(CellReport(cell=cell, status=Status.ERROR, reason=why, cause=Cause.ENVIRONMENT))
    conflicts = [conflict_entry(c) for c in p.conflicts]
    cudas.update((c.id, c.as_dict().get("cuda", "")) for c in p.cells)
    return [c.id for c in p.cells if c.id not in too_old], conflicts, decided


def _tasks(
    args: argparse.Namespace, matrix: Matrix, ids: Sequence[str], cudas: Mapping[str, str]
) -> tuple[list[rayexec.CellTask], list[CellReport]]:
    """A task per cell routed to its runner kind; an error verdict for a cell no kind runs."""
    runners: tuple[Runner, ...] = tuple(matrix.runners.values()) or (DEFAULT_RUNNER,)
    plan_text = Path(args.plan).read_text(encoding="utf-8") if args.plan is not None else None
    tasks, unrouted = [], []
    for cell in ids:
        found = route(cell, cudas.get(cell, ""), runners)  # the one dispatch rule: globs, then driver floors
        kind = found.runner
        if kind is None:
            why = "; ".join(found.passed_over) or (
                "matches no [runners.*] cells glob: no node kind of the cluster would run it"
            )
            unrouted.append(CellReport(cell=cell, status=Status.ERROR, reason=why, cause=Cause.ENVIRONMENT))
            continue
        tasks.append(
            rayexec.CellTask(
                cell=cell,
                kind=kind.name,
                gpus=kind.gpus,
                argv=_worker_args(args, cell),
                cwd=str(Path.cwd()),
                plan=plan_text,
            )
        )
    return tasks, unrouted


def _said(console: Console) -> Callable[[rayexec.CellOutcome], None]:
    def say(o: rayexec.CellOutcome) -> None:
        where = (
            f"node {o.node[:12]} ({o.host}), kind {o.kind}, {o.seconds:.1f} s" if o.node else f"kind {o.kind}"
        )
        what = o.lost or (f"{o.status}" if o.status else f"no verdict (worker exit {o.exit_code})")
        console.print(f"{escape(o.cell)}: {escape(what)} — {escape(where)}")

    return say


def _basis_warnings(plan: str | None, outcomes: Sequence[rayexec.CellOutcome]) -> None:
    """With --plan: a line for each cell its node hashed otherwise than the plan (another hash basis: a node
    without the plan's backend or GPU); it is merged by the node's hash, the verdict the node signed."""
    if plan is None:
        return
    planned = {str(c["id"]): c.get("input_hash") for c in read_plan(plan)["cells"]}
    for o in outcomes:
        want = planned.get(o.cell)
        if o.input_hash and want and want != o.input_hash:
            error_line(
                f"{o.cell}: its node ({o.host}) hashed its inputs {o.input_hash[:12]}…, the plan "
                f"{str(want)[:12]}… (another hash basis); merged by the node's hash"
            )


def _unmerged(outcome: rayexec.CellOutcome, missing: Sequence[str]) -> CellReport:
    """The error verdict of a cell the store holds no verdict of: what its node said, never a result."""
    if outcome.lost:
        reason = outcome.lost
    elif outcome.status in _RAN:
        line = next((m for m in missing if m.startswith(f"{outcome.cell}: ")), "not in the store")
        reason = (
            f"its node ({outcome.host}) judged it {outcome.status}, but the store holds no verdict: {line}"
        )
    else:
        tail = (outcome.output.strip().splitlines() or ["no output"])[-1]
        reason = outcome.reason or f"its worker on {outcome.host} exited {outcome.exit_code}: {tail}"
    cause = Cause.INTERNAL if outcome.cause == str(Cause.INTERNAL) else Cause.ENVIRONMENT
    return CellReport(cell=outcome.cell, status=Status.ERROR, reason=reason, cause=cause)


def _merge(
    args: argparse.Namespace,
    store: Store,
    console: Console,
    outcomes: Sequence[rayexec.CellOutcome],
    conflicts: Sequence[Mapping[str, Any]],
) -> list[CellReport]:
    """Fetch each node's verdict from the store (merge_from, over a plan of the hashes the nodes computed);
    the error verdicts of the cells it holds none of."""
    pushed = [o for o in outcomes if o.status in _RAN and o.input_hash]
    doc = {
        "cells": [{"id": o.cell, "input_hash": o.input_hash, "input_hash_error": None} for o in pushed],
        "conflicts": [dict(c) for c in conflicts],
    }
    with tempfile.TemporaryDirectory(prefix="stackfarm-ray-merge-") as tmp:
        plan = Path(tmp) / "merge-plan.json"
        plan.write_text(json.dumps(doc), encoding="utf-8")
        missing = merge_from(store, args.reports, console, argparse.Namespace(plan=str(plan)))
    failed = {line.split(": ", 1)[0] for line in missing}
    return [_unmerged(o, missing) for o in outcomes if o not in pushed or o.cell in failed]


def cmd_run_ray(args: argparse.Namespace) -> int:
    """`stackfarm run --executor ray[:ADDRESS]` (see the module's docstring)."""
    console = Console(highlight=False, soft_wrap=True)
    if getattr(args, "realise_only", False):
        raise UsageError(
            "--realise-only", "realises cells here, not on a Ray cluster", fix="leave --executor out"
        )
    if args.cell_index is not None:
        raise UsageError(
            "--cell-index",
            f"picks one cell of a plan for a worker, and --executor {args.executor} dispatches them all",
            fix="drop --cell-index (--cells narrows the cells the cluster runs)",
        )
    matrix = only_suites(load_matrix(args.matrix, args.profile), args.suites)
    store = opened_store(args.store, create=True, trusted=matrix.trusted_runner_keys)
    if store is None:
        raise UsageError(
            f"--executor {args.executor}",
            "needs --store: each node pushes its signed verdicts there and this driver merges them",
            fix="add --store URL (an http(s) WebDAV folder, or a folder every node mounts at the same path)",
        )
    cudas: dict[str, str] = {}
    ids, conflicts, decided = _cells(args, matrix, cudas)
    tasks, unrouted = _tasks(args, matrix, ids, cudas)
    writable(args.reports)
    with Cache() as cache, sigterm_interrupts(), cache.lock(args.reports.resolve(), notify=console.print):
        console.print(f"dispatching {len(tasks)} cell(s) to the Ray cluster ({args.executor})")
        try:
            outcomes = rayexec.dispatch(tasks, args.executor.address, note=_said(console))
        except KeyboardInterrupt:
            console.print(
                "interrupted: the cluster's tasks are cancelled; verdicts already pushed stay in the store "
                f"(`stackfarm report --from {escape(store.where)}` merges them)"
            )
            return ExitCode.INTERRUPTED
        _basis_warnings(args.plan, outcomes)
        errors = _merge(args, store, console, outcomes, conflicts)
        for report in [*decided, *unrouted, *errors]:
            verdict.save(args.reports, report)
        ours = (
            {t.cell for t in tasks}
            | {r.cell for r in (*decided, *unrouted)}
            | {str(c["id"]) for c in conflicts}
        )
        reports = [r for r in write_reports(args.reports, matrix=args.matrix) if r.cell in ours]
    print_summary(reports, args.reports, console)
    return verdict.exit_code(reports)


__all__ = ["cmd_run_ray"]
