"""The Ray executor: each cell a Ray task on a node of its runner kind, its verdict signed and pushed to the
shared store by the node, merged by the driver (stackfarm.cli.rayrun).

A cell of runner kind K (stackfarm.driver.route: the first ``[runners.<kind>]`` whose cells globs match
its id and whose driver runs it) asks Ray for ``num_gpus = [runners.K] gpus`` and one unit of the custom resource
``stackfarm-kind-K``, so it lands only on a node that declared that kind:

    ray start --address HEAD:6379 --num-gpus 8 --resources '{"stackfarm-kind-8x-h200": 1}'

(the resource's count is how many cells of that kind the node runs at once). On the node the task runs
``python -m stackfarm run --cells <the cell> --store URL ...`` in the project folder (the same path on every
node, as a shared checkout or one image gives), into a reports folder of its own: the worker looks the
verdict up in the store first (a verdict pushed by an attempt that died after pushing is reused, never run or
pushed twice), and pushes what it computes, signed with the node's runner key ($STACKFARM_RUNNER_KEY on the
node: a node signs as itself). The task returns a CellOutcome: the input hash and status of the verdict the
node computed, its exit code and the end of its output.

Node loss: the task's worker process dies with its node, and so does everything under it (the `stackfarm run`
it started and every command that one starts get SIGTERM through PR_SET_PDEATHSIG, stackfarm.proc's
$STACKFARM_DIE_WITH_PARENT: nothing half-done is pushed), and Ray runs the task again on another
node of the kind (``max_retries``; Ray retries system failures only: ``retry_exceptions`` stays off, and a
verdict, failed or not, is a normal return, never an exception). A task that no attempt finished (its node
lost more often than the retries allow, or run_cell itself raised) comes back as an outcome with `lost` set:
the driver records an error for its cell, never a verdict.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import proc, verdict
from ..errors import EnvironmentProblem

#: A node declares runner kind K with this custom resource (one unit per cell it runs at once).
KIND_PREFIX = "stackfarm-kind-"
#: How often Ray runs a task again whose worker or node died (system failures only).
RETRIES = 3
#: The characters of a worker's output an outcome keeps (its end: where the summary and errors are).
TAIL = 4000
#: Set in a worker's environment: the Ray node it runs on (suites and logs may name it).
NODE_ENV = "STACKFARM_RAY_NODE"


def kind_resource(kind: str) -> str:
    """The custom Ray resource a node of runner kind `kind` declares."""
    return f"{KIND_PREFIX}{kind}"


@dataclass(frozen=True, kw_only=True)
class CellTask:
    """One cell as a Ray task: what it asks the cluster for and the `stackfarm run` arguments of its worker."""

    cell: str
    kind: str
    gpus: int
    #: `stackfarm run` arguments selecting this one cell (--matrix, --cells, --store, ...), less --reports:
    #: the worker writes into a folder of its own on the node.
    argv: tuple[str, ...]
    #: The project folder the worker runs in (relative paths of the matrix resolve there), on every node.
    cwd: str
    #: A plan document (JSON text) the worker reads through --plan, when the run was given one.
    plan: str | None = None


@dataclass(frozen=True, kw_only=True)
class CellOutcome:
    """What the attempt that finished a CellTask answered (or, with `lost`, that none did)."""

    cell: str
    kind: str
    #: The Ray node id and host name of that attempt ("" when none finished).
    node: str = ""
    host: str = ""
    exit_code: int | None = None
    #: The worker's verdict: its status, reason, cause and input hash ("" when it wrote none).
    status: str = ""
    reason: str = ""
    cause: str = ""
    input_hash: str = ""
    output: str = ""
    seconds: float = 0.0
    #: Why no attempt finished (the node lost past the retries, run_cell raised); "" when one did.
    lost: str = ""


def _worker_argv(task: CellTask, reports: Path) -> list[str]:
    argv = [sys.executable, "-m", "stackfarm", "run", *task.argv, "--reports", str(reports), "--jobs", "1"]
    if task.plan is not None:
        plan = reports.parent / "plan.json"
        plan.write_text(task.plan, encoding="utf-8")
        argv += ["--plan", str(plan)]
    return argv


def run_cell(task: CellTask) -> CellOutcome:
    """The task's body, on the node: run the cell's worker, read the verdict it wrote. Never raises for what
    the cell did; a worker that could not run says so in the outcome (exit code, output)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    host = socket.gethostname()
    start = time.monotonic()
    if not Path(task.cwd).is_dir():
        return CellOutcome(
            cell=task.cell,
            kind=task.kind,
            node=node,
            host=host,
            exit_code=2,
            status=str(verdict.Status.ERROR),
            cause=str(verdict.Cause.ENVIRONMENT),
            reason=f"the project folder {task.cwd} is not on node {node[:12]} ({host}): every node of the "
            "cluster needs the project at the same path (a shared checkout, or one image)",
        )
    with tempfile.TemporaryDirectory(prefix="stackfarm-ray-") as tmp:
        reports = Path(tmp) / "reports"
        ran = proc.call(
            _worker_argv(task, reports),
            cwd=Path(task.cwd),
            env={NODE_ENV: node, proc.DIE_WITH_PARENT_ENV: "1"},
        )
        fields: dict[str, str] = {}
        path = verdict.path_of(reports, task.cell)
        if path.is_file():
            try:
                report = verdict.read(path).report
                fields = {
                    "status": str(report.status),
                    "reason": report.reason,
                    "cause": str(report.cause),
                    "input_hash": report.input_hash,
                }
            except ValueError as exc:
                fields = {"status": str(verdict.Status.ERROR), "reason": f"unreadable verdict: {exc}"}
    return CellOutcome(
        cell=task.cell,
        kind=task.kind,
        node=node,
        host=host,
        exit_code=ran.returncode,
        output=ran.output[-TAIL:],
        seconds=time.monotonic() - start,
        **fields,
    )


def connect(address: str | None) -> bool:
    """ray.init on the cluster at `address` (None: $RAY_ADDRESS, else the cluster `ray start` runs on this
    machine); True when this call connected (the caller shuts it down). EnvironmentProblem when none answers."""
    import ray

    if ray.is_initialized():
        return False
    where = address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=where, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise EnvironmentProblem(
            f"no Ray cluster answers at {where}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            fix="start one (`ray start --head --resources '{\"stackfarm-kind-<kind>\": 1}'` on the head, "
            "`ray start --address HEAD:6379 ...` on each node) and give --executor ray:HEAD:6379",
        ) from None
    return True


def cluster_problems(needs: Mapping[str, int], nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """For each runner kind (-> GPUs a cell of it asks for) that no live node can take: why, with the fix."""
    alive = [n.get("Resources") or {} for n in nodes if n.get("Alive")]
    problems = []
    for kind, gpus in sorted(needs.items()):
        resource = kind_resource(kind)
        declared = [r for r in alive if r.get(resource, 0) >= 1]
        if not declared:
            problems.append(
                f"runner kind {kind}: no live node of the cluster declares the resource {resource} "
                f"(start its nodes with `ray start ... --num-gpus {gpus} --resources "
                f"'{{\"{resource}\": 1}}'`)"
            )
        elif not any(r.get("GPU", 0) >= gpus for r in declared):
            most = max(int(r.get("GPU", 0)) for r in declared)
            problems.append(
                f"runner kind {kind}: a cell asks for {gpus} GPU(s) ([runners.{kind}] gpus), and its nodes "
                f"have at most {most} (start them with `ray start ... --num-gpus {gpus}`, or fix gpus)"
            )
    return problems


def _lost(task: CellTask, exc: BaseException) -> CellOutcome:
    import ray.exceptions

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, ray.exceptions.RayTaskError):  # run_cell raised: stackfarm's bug, not the node's
        why = f"the task raised on its node: {first}"
        cause = verdict.Cause.INTERNAL
    else:
        why = (
            f"no attempt finished (Ray's retries on another node of its kind): {type(exc).__name__}: {first}"
        )
        cause = verdict.Cause.ENVIRONMENT
    return CellOutcome(
        cell=task.cell, kind=task.kind, status=str(verdict.Status.ERROR), cause=str(cause), lost=why
    )


def dispatch(
    tasks: Sequence[CellTask],
    address: str | None,
    *,
    note: Callable[[CellOutcome], None] = lambda _outcome: None,
    retries: int = RETRIES,
) -> list[CellOutcome]:
    """Run every task on the cluster, each on a node of its kind; one outcome per task, in the order they
    finish (`note` hears each as it comes). EnvironmentProblem, before any task runs, when no Ray cluster
    answers or a kind has no node that can take its cells. Ctrl-C cancels what is still running."""
    import ray
    import ray.exceptions

    started = connect(address)
    try:
        needs: dict[str, int] = {}
        for task in tasks:
            needs[task.kind] = max(needs.get(task.kind, 0), task.gpus)
        live: Callable[[], list[dict[str, Any]]] = ray.nodes  # Ray leaves it untyped
        problems = cluster_problems(needs, live())
        if problems:
            raise EnvironmentProblem(
                "the Ray cluster cannot run every kind of this run's cells:\n  " + "\n  ".join(problems),
                fix="add nodes of those kinds (the resource's count: cells of that kind a node runs at once)",
            )
        remote = ray.remote(run_cell)
        refs = {
            remote.options(
                num_gpus=task.gpus,
                resources={kind_resource(task.kind): 1},
                max_retries=retries,
                retry_exceptions=False,
                name=f"stackfarm:{task.cell}",
            ).remote(task): task
            for task in tasks
        }
        outcomes: list[CellOutcome] = []
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        outcome = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        outcome = _lost(refs[ref], exc)
                    outcomes.append(outcome)
                    note(outcome)
        except KeyboardInterrupt:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        return outcomes
    finally:
        if started:
            ray.shutdown()


__all__ = [
    "KIND_PREFIX",
    "NODE_ENV",
    "RETRIES",
    "CellOutcome",
    "CellTask",
    "cluster_problems",
    "connect",
    "dispatch",
    "kind_resource",
    "run_cell",
]
