"""`stackfarm plan | run | report | bundle`: plan the matrix, run its cells, rebuild the reports from the store."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import json
import os
import shutil
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from packaging.requirements import Requirement
from rich.console import Console
from rich.markup import escape

from .. import executors, history, htmlreport, proc, storekeys, verdict
from ..artifacts import Cache
from ..backends import BACKENDS, NAMES, get_backend
from ..backends.local import LocalBackend
from ..driver import driver_problems
from ..errors import ConfigError, EnvironmentProblem, ExitCode, UsageError, did_you_mean
from ..files import write_atomic
from ..matrix import Matrix, load
from ..plan import Plan, plan, select
from ..planjson import DEFAULT_BACKEND, plan_document
from ..profile import load_matrix
from ..reports import write_summaries
from ..resolve import Resolver, plan_matrix
from ..runner import Runner, RunOptions, gpu_unavailable_reason
from ..store import BrokenEntry, Store, open_store
from ..ui import CellProgress
from ..verdict import CellReport, Status
from ..worker import Adopted, adopt, read_plan, select_from_plan
from . import hostbundle, plantext
from .args import whole

_Sub = argparse._SubParsersAction  # argparse's type for add_subparsers()
DEFAULT_MATRIX = Path("matrix.toml")


def register(sub: _Sub[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--matrix",
        type=Path,
        default=None,
        help="the matrix file (default matrix.toml; with run --plan: the plan's)",
    )
    common.add_argument(
        "--cells", default=None, help="only cells whose id matches this glob (comma-separated)"
    )
    common.add_argument(
        "--refresh", action="store_true", help="ask the indexes again (remembered answers expire after 24 h)"
    )
    common.add_argument(
        "--profile", type=Path, default=None, help="a host profile over the matrix (runners/<kind>.toml)"
    )
    p_plan = sub.add_parser("plan", parents=[common], help="print the cells, conflicts and exclusions")
    p_plan.add_argument("--json", action="store_true", help="machine-readable output")
    p_plan.add_argument(
        "--all", action="store_true", help=f"every row (past {plantext.SHOWN} of a kind the rest is one line)"
    )
    p_plan.add_argument(
        "--history",
        type=Path,
        default=None,
        help="past reports/ copies: each cell's estimated_seconds (--json)",
    )
    p_plan.add_argument(
        "--store",
        default=None,
        help="the shared verdict store (a folder or an http(s) URL): is each cell's verdict stored (--json)",
    )
    p_plan.add_argument(
        "--symbols",
        action="store_true",
        help="read the driver-API symbols of wheels not unpacked in the cache (lazy trees), to route by them",
    )
    hash_basis(p_plan)
    p_plan.set_defaults(func=cmd_plan)
    p_run = sub.add_parser("run", parents=[common], help="realise the cells and run their suites")
    p_run.add_argument("--reports", type=Path, default=Path("reports"), help="where reports go (reports/)")
    p_run.add_argument(
        "--jobs", type=whole(1, 4), default=os.cpu_count() or 1, help="cells in parallel (default: cores)"
    )
    p_run.add_argument("--force", action="store_true", help="re-run cells whose inputs are unchanged")
    p_run.add_argument("--backend", choices=("auto", *NAMES), default="auto", help="how cells are realised")
    p_run.add_argument("--python", default=None, help="the host backend's Python (default: this one)")
    p_run.add_argument(
        "--suites", default=None, help="only suites whose name matches this glob (comma-separated)"
    )
    p_run.add_argument(
        "--plan",
        default=None,
        help="a stored `stackfarm plan --json`: run its cell --cell-index I (or --cells ID)",
    )
    p_run.add_argument(
        "--cell-index",
        default=None,
        help="with --plan: the plan's I-th cell, 0-based (e.g. $JOB_COMPLETION_INDEX)",
    )
    p_run.add_argument(
        "--store",
        default=None,
        help="the shared verdict store (a folder or an http(s) URL): reuse its verdicts, push new ones",
    )
    p_run.add_argument(
        "--realise-only",
        action="store_true",
        help="realise each cell (docker: build or pull its image, push it to the registry), run no suite, "
        "keep no verdict: a CI build step before the test steps",
    )
    p_run.add_argument(
        "--executor",
        type=executors.option,
        default=executors.LOCAL,
        help="where the cells run: local (default) or ray[:ADDRESS], a Ray cluster (needs --store)",
    )
    p_run.set_defaults(func=cmd_run)
    p_report = sub.add_parser(
        "report", help="rebuild junit.xml, the summaries and index.html from stored verdicts"
    )
    p_report.add_argument("--reports", type=Path, default=Path("reports"))
    p_report.add_argument(
        "--history", type=Path, default=None, help="a folder of past reports/ copies: trends"
    )
    p_report.add_argument(
        "--gate", action="store_true", help="exit with the merged verdicts' code, as `run` does"
    )
    p_report.add_argument(
        "--from",
        dest="source",
        default=None,
        metavar="STORE",
        help="first merge the shared store's verdict of every planned cell (folder or http(s) URL)",
    )
    p_report.add_argument(
        "--plan",
        default=None,
        help="the `plan --json` document: every planned cell must have a verdict (with --from: its input hash)",
    )
    p_report.add_argument(
        "--matrix", type=Path, default=Path("matrix.toml"), help="with --from and no --plan: plan this matrix"
    )
    hash_basis(p_report)
    p_report.set_defaults(func=cmd_report)
    p_bundle = sub.add_parser("bundle", help="write a cell's Docker image as a tarball for an offline runner")
    p_bundle.add_argument("cell", help="a cell id (or an image tag) built by --backend docker")
    p_bundle.add_argument("--out", type=Path, default=None, help="the tarball (default: reports/<cell>.tar)")
    p_bundle.add_argument(
        "--matrix", type=Path, default=Path("matrix.toml"), help="with --wheelhouse: the matrix"
    )
    p_bundle.add_argument("--profile", type=Path, default=None, help="with --wheelhouse: the host's profile")
    p_bundle.add_argument("--refresh", action="store_true", help="with --wheelhouse: ask the indexes again")
    hostbundle.add_arguments(p_bundle)
    p_bundle.set_defaults(func=cmd_bundle)


def hash_basis(parser: argparse.ArgumentParser) -> None:
    """--backend / --no-gpu: the runner the input hashes are computed for (a plan is made off the GPU box)."""
    parser.add_argument(
        "--backend",
        choices=NAMES,
        default=DEFAULT_BACKEND,
        help=f"input hashes as this backend's runs compute them (default {DEFAULT_BACKEND})",
    )
    parser.add_argument(
        "--no-gpu", action="store_true", help="input hashes as a runner without a GPU computes them"
    )


def opened_store(
    location: str | None, *, create: bool = False, signs: bool = False, trusted: Sequence[Path] = ()
) -> Store | None:
    """The --store / --from store, checked before any work (an unreachable one is exit 4, naming it), with
    the runner keys of the environment (stackfarm.storekeys): a reader that trusts no runner key, or a run
    that pushes without a key to sign with, is a configuration error (exit 2) saying how to set keys up."""
    if location is None:
        return None
    store = open_store(location, storekeys.load(trusted))
    if signs and store.keys.signer is None:
        raise ConfigError(
            storekeys.RUNNER_KEY_ENV,
            f"`run --store {store.where}` pushes verdicts, and a pushed verdict must be signed: no runner key",
            fix=storekeys.SETUP_HINT,
        )
    if not store.keys.trusted:
        raise ConfigError(
            storekeys.TRUSTED_RUNNER_KEYS_ENV,
            f"no trusted runner key: every entry of {store.where} would count as missing (readers believe "
            "only entries a trusted runner signed)",
            fix=storekeys.SETUP_HINT,
        )
    store.probe(create=create)
    return store


def cmd_plan(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True)
    matrix = load_matrix(args.matrix or DEFAULT_MATRIX, args.profile)
    store = opened_store(args.store, trusted=matrix.trusted_runner_keys)
    resolver = Resolver(matrix, Cache(), refresh=args.refresh)
    full, unreachable = plan_matrix(matrix, resolver, None)
    p = selected(full, args.cells, matrix)
    # An index that did not answer leaves cells unplanned: never exit 0 on that.
    code = ExitCode.ENVIRONMENT if unreachable else ExitCode.OK
    if args.json:
        data = plan_document(
            matrix,
            p,
            unreachable,
            resolver,
            history=args.history,
            store=store,
            backend=args.backend,
            gpu=not args.no_gpu,
            fetch_symbols=args.symbols,
        )
        # Cells no runner kind can run (stackfarm.driver.route): said before any GPU time, never dispatched.
        drivers = {str(c["id"]): str(c["unrunnable"]) for c in data["cells"] if c["status"] != "run"}
        data["driver_problems"] = drivers
        print(json.dumps(data, indent=2, default=str))
        return unrunnable_code(code, drivers)
    drivers = driver_problems(matrix, p.cells)  # the CUDA floors (`plan --json` reads the symbols too)
    plantext.render(console, p, unreachable, drivers, every=args.all)
    for (dist, version), reason in sorted(unreachable.items()):  # each once, with its fix
        error_line(f"{dist} {version}: {reason}", kind="error")
    return unrunnable_code(code, drivers)


def unrunnable_code(code: ExitCode, unrunnable: Mapping[str, str]) -> ExitCode:
    """A plan with cells no runner kind can run is incomplete (exit 3), unless the environment stood in the way."""
    return ExitCode.INCOMPLETE if unrunnable and code == ExitCode.OK else code


def choose_backend(name: str, console: Console) -> str:
    """`auto`: Docker when an engine answers, else the local backend, said in one line."""
    if name != "auto":
        return name
    from ..backends.docker import engine_unavailable_reason  # the docker CLI is probed only for `auto`

    reason = engine_unavailable_reason()
    if reason is None:
        return "docker"
    console.print(f"backend: local ({escape(reason.splitlines()[0])})")
    return "local"


def host_python(backend: str, python: str | None) -> str | None:
    """--python checked before any work: the host backend's alone, and a Python that runs."""
    if python is None:
        return None
    if backend != "host":
        raise UsageError(
            f"--python {python}",
            f"is the host backend's Python, and this run's backend is {backend} (it runs each cell under the "
            "cell's python axis)",
            fix="add --backend host to test the stack installed in that Python, or leave --python out",
        )
    found = shutil.which(python)
    ran = proc.call([found, "-c", "import sys"], timeout=60) if found else None
    if ran is None or ran.returncode != 0:
        why = "no such executable" if ran is None else f"it does not run ({ran.output.strip()[-200:]})"
        raise UsageError(
            f"--python {python}",
            why,
            fix="give the Python the stack is installed in, e.g. --python /opt/venv/bin/python",
        )
    return python


def only_suites(matrix: Matrix, pattern: str | None) -> Matrix:
    """The matrix with just the suites matching `pattern` (e.g. "40-*" to re-measure throughput alone)."""
    if not pattern:
        return matrix
    globs = [g.strip() for g in pattern.split(",") if g.strip()]
    chosen = tuple(s for s in matrix.suites if any(fnmatch.fnmatchcase(s.name, g) for g in globs))
    if not chosen:
        raise _no_suite(matrix, pattern, globs)
    return dataclasses.replace(matrix, suites=chosen)


def _no_suite(matrix: Matrix, pattern: str, globs: Sequence[str]) -> UsageError:
    """--suites matched nothing: the suites there are, and the nearest name."""
    known = [s.name for s in matrix.suites]
    hint = did_you_mean(globs[0], known) if globs else ""
    return UsageError(
        f"--suites {pattern!r}",
        f"no suite of {matrix.path} matches{f' ({hint})' if hint else ''}; its suites are: {', '.join(known)}",
        fix="give suite names or globs, comma-separated (e.g. --suites '00-*,10-capability')",
    )


def selected(full: Plan, pattern: str | None, matrix: Matrix, *, to_run: bool = False) -> Plan:
    """The cells of --cells, refused when the glob matches none (a usage error: nothing would run); with
    `to_run`, also when it matches only excluded cells."""
    p = select(full, pattern)
    if not pattern or p.cells or p.conflicts or (p.excluded and not to_run):
        return p
    raise UsageError(
        f"--cells {pattern!r}",
        _why_none_selected(full, p, pattern, matrix),
        fix="`stackfarm plan` lists the cell ids; --cells takes exact ids or globs, comma-separated "
        "(e.g. --cells 'cu128-*')",
    )


def _why_none_selected(full: Plan, p: Plan, pattern: str, matrix: Matrix) -> str:
    """Why --cells selects nothing to run: only excluded cells, or no cell at all (with the nearest id)."""
    if p.excluded:
        return (
            f"matches only excluded cells ({', '.join(e.cell.id for e in p.excluded[:3])}): nothing would run"
        )
    ids = [c.id for c in (*full.cells, *(c.cell for c in full.conflicts))][:5000]
    hint = did_you_mean(pattern.split(",", maxsplit=1)[0].strip(), ids)
    return f"no cell of {matrix.path} matches" + (f" ({hint})" if hint else "")


def from_plan(args: argparse.Namespace, console: Console) -> Adopted:
    """A fan-out worker: one cell of a stored plan, on the plan's terms (stackfarm.worker.adopt); `args` gets
    the cell's exact glob, the plan's matrix, backend and store."""
    from ..backends.docker import engine_unavailable_reason  # probed only for a docker plan

    doc = read_plan(args.plan)
    by_id = args.cells if args.cell_index is None else None
    args.cells = select_from_plan(doc, index=args.cell_index, cell_id=by_id)
    terms = adopt(
        doc,
        str(args.plan),
        matrix=args.matrix,
        backend=args.backend,
        store=args.store,
        engine=engine_unavailable_reason,
        gpu_reason=gpu_unavailable_reason(),
    )
    for warning in terms.warnings:
        error_line(warning)
    args.matrix, args.backend, args.store = terms.matrix, terms.backend, terms.store
    if args.backend != "auto":
        console.print(f"backend: {args.backend} (the plan's hash basis)")
    return terms


def cmd_run(args: argparse.Namespace) -> int:
    """`run` on this machine (`--executor ray` is stackfarm.cli.rayrun's, chosen by the command line's face)."""
    console = Console(highlight=False, soft_wrap=True)
    terms = from_plan(args, console) if args.plan is not None else None  # a fan-out engine's worker
    args.matrix = args.matrix or DEFAULT_MATRIX
    matrix = only_suites(load_matrix(args.matrix, args.profile), args.suites)
    python = host_python(args.backend, args.python)
    store = _run_store(args, matrix)
    cache = Cache()
    resolver = Resolver(matrix, cache, refresh=args.refresh)
    backend = get_backend(
        choose_backend(args.backend, console),
        cache,
        python=python,
        docker=matrix.docker,
        index_url=matrix.indexes[matrix.default_index].url,  # the image's own tools: from the matrix's index
        reports=args.reports,
    )
    if isinstance(backend, LocalBackend):
        backend.check_suites([s.name for s in matrix.suites])
    full, unreachable = _full_plan(matrix, resolver, backend.installed_pins())
    p = selected(full, args.cells, matrix, to_run=True)
    writable(args.reports)
    proc.STOP.clear()  # a stop belongs to one run (a process may run several, e.g. the tests)
    options = _run_options(args, store, terms)
    no_gpu = (terms.no_gpu if terms else None) or gpu_unavailable_reason()
    # `with cache`: the run's lease on what it uses (cache prune keeps it) ends with the run.
    with (
        cache,
        CellProgress() as ui,
        sigterm_interrupts(),
        cache.lock(args.reports.resolve(), notify=ui.note),
    ):
        for warning in p.warnings:
            ui.note(f"warning: {warning}")
        runner = Runner(matrix, resolver, backend, options, ui, unreachable=unreachable, no_gpu_reason=no_gpu)
        try:
            reports = runner.run(p)
        except KeyboardInterrupt:
            return _interrupted(args, runner, console)
    return _ran(args, reports, runner, console)


def _ran(args: argparse.Namespace, reports: Sequence[CellReport], runner: Runner, console: Console) -> int:
    """After the run: the reports and summary (a realise-only run: what each cell was realised as), and the
    exit code; a verdict the store did not take makes an otherwise clean run an environment error."""
    if args.realise_only:
        return realised_summary(reports, console)
    write_reports(args.reports, reports, matrix=args.matrix)
    print_summary(reports, args.reports, console)
    code = verdict.exit_code(reports)
    if runner.store_problems and code in (ExitCode.OK, ExitCode.INCOMPLETE):
        console.print(
            f"{len(runner.store_problems)} verdict(s) not pushed to the store: exit {ExitCode.ENVIRONMENT}"
        )
        return ExitCode.ENVIRONMENT
    return code


def _run_store(args: argparse.Namespace, matrix: Matrix) -> Store | None:
    """The store a run reuses verdicts from and pushes them to, opened (and checked) before any work."""
    if (
        args.realise_only
    ):  # it neither reuses nor pushes a verdict: it needs no store (nor a key to sign with)
        return None
    return opened_store(args.store, create=True, signs=True, trusted=matrix.trusted_runner_keys)


def _full_plan(
    matrix: Matrix, resolver: Resolver, installed: Mapping[str, list[Requirement]] | None
) -> tuple[Plan, dict[tuple[str, str], str]]:
    """Every cell of the matrix, and the pins that could not be reached."""
    if installed is not None:
        # The stack is already installed (and the host may have no network): its own sglang gives the pins.
        return plan(matrix, installed), {}
    return plan_matrix(matrix, resolver, None)


def _run_options(args: argparse.Namespace, store: Store | None, terms: Adopted | None) -> RunOptions:
    """The runner's options from the command line (and a fan-out worker's plan terms)."""
    return RunOptions(
        reports=args.reports,
        jobs=args.jobs,
        force=args.force,
        store=store,
        selection=args.suites or "",
        kinds=terms.kinds if terms else {},
        planned=terms.planned if terms else {},
        realise_only=args.realise_only,
    )


def _interrupted(args: argparse.Namespace, runner: Runner, console: Console) -> int:
    """Ctrl-C (or SIGTERM): the finished cells keep their reports, so a re-run resumes."""
    if args.realise_only:
        return ExitCode.INTERRUPTED
    done = [runner.finished[k] for k in sorted(runner.finished)]
    write_reports(args.reports, done, matrix=args.matrix)
    console.print(f"interrupted: kept {len(done)} finished cells in {args.reports}/; a re-run resumes")
    return ExitCode.INTERRUPTED


def realised_summary(reports: Sequence[CellReport], console: Console) -> int:
    """`run --realise-only`: one line per cell, what it was realised as (the image's tag, content id and
    registry digest for docker); exit 0 when every cell was realised, else 4 (the environment), naming each
    cell that was not. Nothing is judged: no cell's status is a verdict here."""
    broken = [r for r in reports if r.status is Status.ERROR]
    for report in reports:
        if report.status is not Status.ERROR:
            console.print(f"realised {escape(report.cell)}: {escape(_realised_as(report))}")
    for report in broken:
        console.print(f"not realised {escape(report.cell)}: {escape(report.reason.splitlines()[0])}")
    console.print(
        f"{len(reports) - len(broken)} of {len(reports)} cell(s) realised, no suite run, no verdict kept"
    )
    return ExitCode.ENVIRONMENT if broken or not reports else ExitCode.OK


def _realised_as(report: CellReport) -> str:
    """What a cell was realised as: its image (content id, and where it lives), else the backend's facts."""
    facts = report.backend_facts
    pushed = facts.docker_repo_digest
    where = f"; in the registry as {pushed}" if pushed else ""
    if report.backend == "docker" and not pushed:
        where = "; in this engine only (no registry: [docker] registry or STACKFARM_REGISTRY)"
    if image := facts.docker_image:
        digest = "?" if facts.docker_image_digest is None else facts.docker_image_digest
        return f"image {image} ({digest}){where}"
    shown = ", ".join(f"{k} {v}" for k, v in facts.as_properties().items())
    return f"backend {report.backend} ({shown})"


def writable(folder: Path) -> None:
    """Refuse before any work when the reports folder cannot be written (read-only, full, a file)."""
    probe = folder / ".stackfarm-write-probe"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvironmentProblem(
            f"{folder}: cannot make the reports folder ({exc.strerror or exc})",
            fix="choose another --reports DIR",
        ) from None
    write_atomic(probe, "")
    probe.unlink(missing_ok=True)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a CI runner cancelling the job, `kill`) takes the Ctrl-C path: every suite's process group is
    stopped, finished cells keep their reports, no half-done verdict is kept."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread (e.g. a test calling main() in a thread)
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def write_reports(
    where: Path, current: Sequence[CellReport] = (), *, matrix: Path | None = None
) -> list[CellReport]:
    """junit.xml, summary.md/.html and the browsable report, from every verdict in the store with this run's
    own reports over them: a run of one cell updates its own row, the other cells keep theirs."""
    # A disputed verdict is shown re-judged, never left out: a gate over the rest would be greener than the truth.
    stored, problems = verdict.read_all(where, shown=True)
    for problem in problems:
        error_line(problem)
    mine = {r.cell: r for r in current}
    reports = sorted(
        [*mine.values(), *(s.report for s in stored if s.report.cell not in mine)], key=lambda r: r.cell
    )
    write_summaries(reports, where, matrix=matrix)
    htmlreport.write(where, reports, suites=matrix.parent / "suites" if matrix is not None else None)
    return reports


def error_line(text: str, kind: str = "warning") -> None:
    colour = "red" if kind == "error" else "yellow"
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[{colour}]{kind}:[/] {escape(text)}")


def print_summary(reports: Sequence[CellReport], where: Path, console: Console) -> None:
    console.print(
        escape(verdict.totals(reports)) + f" — {where}/index.html, {where}/summary.md, {where}/junit.xml"
    )


@dataclasses.dataclass(frozen=True)
class Planned:
    """One planned cell as the merge checks it."""

    cell: str
    input_hash: str | None
    #: Why it has no input hash (None when it has one).
    why: str | None
    #: Why no runner kind runs it ("" when one does): no job made its verdict.
    unrunnable: str = ""
    #: The plan found its verdict in the plan's store (no job ran it): only `--from` merges it.
    stored: bool = False
    #: The plan hashes for a backend whose hash is never the plan's (BackendKind.planned is false: the host
    #: backend hashes the installed stack where it runs, not the plan's wheels): no verdict's hash can be
    #: compared with the plan's.
    host: bool = False


def _plan_hashed(backend: object) -> bool:
    """A plan hashed for this backend (its hash basis's) has hashes that a verdict's can be compared with."""
    kind = BACKENDS.get(str(backend))
    return kind is None or kind.planned


def planned_hashes(
    args: argparse.Namespace, matrix: Matrix | None = None
) -> tuple[list[Planned], list[CellReport]]:
    """Every cell of --plan, or of the --matrix planned here (`matrix`, when the caller has loaded it); and the
    plan's conflicts as `run` records them: cells no runner ran, which no store holds, and which are not green."""
    if args.plan is not None:
        doc = read_plan(args.plan)
    else:
        matrix = matrix if matrix is not None else load(args.matrix)
        resolver = Resolver(matrix, Cache())
        p, unreachable = plan_matrix(matrix, resolver, None)
        doc = plan_document(matrix, p, unreachable, resolver, backend=args.backend, gpu=not args.no_gpu)
    cells = [
        Planned(
            str(c["id"]),
            c.get("input_hash"),
            c.get("input_hash_error"),
            str(c.get("unrunnable") or ""),
            bool(c.get("stored")),
            not _plan_hashed((doc.get("hash_basis") or {}).get("backend")),
        )
        for c in doc["cells"]
    ]
    return cells, [_conflict_report(c) for c in doc.get("conflicts", [])]


def _conflict_report(entry: Mapping[str, Any]) -> CellReport:
    """A plan document's conflict as a verdict (its typed contradictions and matrix line where it has them)."""
    problems = entry.get("problems")
    found = entry.get("contradictions")
    where = entry.get("declared_at")
    return CellReport(
        cell=str(entry["id"]),
        status=Status.CONFLICT,
        reason="; ".join(str(p) for p in problems) if isinstance(problems, list) else "",
        contradictions=tuple(verdict.Contradiction(**c) for c in found) if isinstance(found, list) else (),
        declared_at=verdict.SourceLine(**where) if isinstance(where, dict) else None,
    )


def _save_conflicts(reports: Path, conflicts: Sequence[CellReport]) -> None:
    """As `run` records them: every planned cell is in the merged report, a conflict as a conflict."""
    for conflict in conflicts:
        verdict.save(reports, conflict)


def _why_absent(one: Planned) -> str:
    if one.stored:
        return "the plan found it in its store, which only `report --from STORE` merges"
    return f"unrunnable: {one.unrunnable}" if one.unrunnable else "its job left none"


def check_planned(reports: Path, console: Console, args: argparse.Namespace) -> list[str]:
    """`report --plan` without a store: one line per planned cell whose verdict is not under reports/ (or is a
    verdict of other inputs than the plan's); the plan's conflicts are recorded there."""
    writable(reports)
    cells, conflicts = planned_hashes(args)
    _save_conflicts(reports, conflicts)
    found = {s.report.cell: s for s in verdict.read_all(reports, shown=True)[0]}
    missing = []
    for one in cells:
        have = found.get(one.cell)
        if have is None:
            missing.append(f"{one.cell}: no verdict under {reports}/ ({_why_absent(one)})")
        # A verdict of other inputs (an older run left in reports/, another machine's backend) is not the plan's,
        # unless the plan is a host plan, whose hashes no verdict can match.
        elif one.input_hash and have.input_hash not in ("", one.input_hash) and not one.host:
            missing.append(
                f"{one.cell}: its verdict is of other inputs ({have.input_hash[:12]}…) than the plan's "
                f"({one.input_hash[:12]}…)"
            )
    console.print(
        f"{len(cells) - len(missing)} of {len(cells)} planned cell(s) have their verdict under {reports}/"
        + (f"; {len(missing)} have none:" if missing else "")
    )
    for line in missing:
        console.print(f"  {escape(line)}")
    return missing


def merge_from(
    store: Store, reports: Path, console: Console, args: argparse.Namespace, matrix: Matrix | None = None
) -> list[str]:
    """Fetch the store's verdict of every planned cell into reports/; one line per cell it holds none of."""
    writable(reports)
    merged, missing = 0, []
    cells, conflicts = planned_hashes(args, matrix)
    _save_conflicts(reports, conflicts)
    for one in cells:
        cell, digest, why = one.cell, one.input_hash, one.why
        if not digest:
            missing.append(f"{cell}: no input hash ({why or 'not computed'})")
            continue
        try:
            found = store.fetch(cell, digest, reports)
        except BrokenEntry as exc:  # untrusted, forged or broken: it counts as missing, with the reason
            error_line(str(exc))
            missing.append(f"{cell}: the store's entry for its inputs ({digest[:12]}…) is not used: {exc}")
            continue
        if found is None and one.unrunnable:
            missing.append(f"{cell}: unrunnable: {one.unrunnable}")
        elif found is None:
            missing.append(f"{cell}: the store holds no verdict for its inputs ({digest[:12]}…)")
        else:
            merged += 1
    console.print(
        f"merged {merged} verdict(s) from {escape(store.where)} into {reports}/"
        + (f"; {len(missing)} planned cell(s) have none:" if missing else "")
    )
    for line in missing:
        console.print(f"  {escape(line)}")
    return missing


def cmd_report(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True)
    # The merge step trusts the runner keys the repository's matrix names ([store] trusted_keys), when it has one.
    matrix = load(args.matrix) if args.source and args.matrix.is_file() else None
    store = opened_store(args.source, trusted=matrix.trusted_runner_keys if matrix else ())
    missing = _unmerged(args, store, console, matrix)
    stored, problems = verdict.read_all(args.reports, shown=True)
    if not stored:
        return _nothing_stored(args, problems, missing, console)
    if args.history is not None:
        htmlreport.write_history(history.write(args.history, args.reports), args.reports)
    reports = write_reports(args.reports)
    print_summary(reports, args.reports, console)
    if not args.gate:
        return 0
    code = verdict.exit_code(reports, whole=True)  # a verdict of selected suites only is not a cell's
    why = verdict.exit_reasons(reports, whole=True)
    if missing:
        why.append(f"{len(missing)} planned cell(s) have no verdict (listed above)")
    # A planned cell without a verdict was never judged: the merged store is not green.
    code = ExitCode.INCOMPLETE if missing and code == ExitCode.OK else code
    gate_lines(console, code, why)
    return code


def _unmerged(
    args: argparse.Namespace, store: Store | None, console: Console, matrix: Matrix | None
) -> list[str]:
    """Merge the store's verdicts of the plan into reports/ (or check the plan against reports/ without a
    store); one line per planned cell without a verdict."""
    if store is not None:
        return merge_from(store, args.reports, console, args, matrix)
    if args.plan is not None:  # the plan is read with or without a store: a planned cell without a verdict
        return check_planned(args.reports, console, args)
    return []


def _nothing_stored(
    args: argparse.Namespace, problems: Sequence[str], missing: Sequence[str], console: Console
) -> int:
    """`report` over a folder without a usable verdict: an environment problem when every verdict there is
    unreadable, incomplete when planned cells have none, else a usage error."""
    if problems:  # every verdict there unreadable: say which and why, never "run first"
        raise EnvironmentProblem(
            f"no usable verdict under {args.reports}/:\n  " + "\n  ".join(problems),
            fix="make these files readable, or run their cells again (`stackfarm run --cells ID`)",
        )
    if missing:  # the store held nothing this reader may use: nothing is green
        if args.gate:
            gate_lines(
                console,
                ExitCode.INCOMPLETE,
                [f"{len(missing)} planned cell(s) have no verdict (listed above)"],
            )
        return ExitCode.INCOMPLETE if args.gate else 0
    raise UsageError(
        f"--reports {args.reports}",
        "holds no verdict (no <cell>/verdict.json)",
        fix="run `stackfarm run` first, or give --reports the folder a run wrote",
    )


#: What each exit code means, as the gate says it (the README's table).
_MEANING = {
    ExitCode.CELLS_FAILED: "some cell failed",
    ExitCode.INCOMPLETE: "nothing failed, but some cell is incomplete",
    ExitCode.ENVIRONMENT: "the environment stood in the way of some cell; nothing failed",
}


def gate_lines(out: Console, code: ExitCode, why: Sequence[str], shown: int = 20) -> None:
    """`report --gate`: why it exits non-zero, one line per cell that keeps the gate shut."""
    if code is ExitCode.OK:
        return
    out.print(f"gate: exit {int(code)} ({_MEANING.get(code, code.name.lower())}):")
    for line in why[:shown]:
        out.print(f"  {escape(line)}")
    if len(why) > shown:
        out.print(f"  … and {len(why) - shown} more (summary.md lists every cell)")


def cmd_bundle(args: argparse.Namespace) -> int:
    if args.wheelhouse is not None:  # a host runner's offline wheels (stackfarm.wheelhouse)
        return hostbundle.cmd_wheelhouse(args)
    from ..backends.docker import bundle

    out = args.out or Path("reports") / f"{args.cell.replace('/', '_').replace(':', '_')}.tar"
    Console(highlight=False, soft_wrap=True).print(
        f"wrote {bundle(args.cell, out)} (load it with `docker load -i`)"
    )
    return 0


__all__ = ["choose_backend", "cmd_plan", "cmd_report", "cmd_run", "only_suites", "register", "write_reports"]
