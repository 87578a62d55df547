"""`stackfarm bisect --good CELL --bad CELL`: the axis and the first bad release that broke a cell
(stackfarm.bisect); `stackfarm bisect --twins`: which failed cells a passing one-axis twin shows to be
regressions."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .. import proc, verdict
from ..artifacts import Cache
from ..backends import BACKENDS, NAMES, get_backend
from ..backends.local import LocalBackend
from ..bisect import Bisector, describe, twin_check
from ..errors import ExitCode, UsageError, did_you_mean
from ..matrix import Matrix, load
from ..plan import Cell, Plan
from ..resolve import Resolver, plan_matrix
from ..runner import Runner, RunOptions, gpu_unavailable_reason
from ..ui import CellProgress
from ..verdict import CellReport
from .runs import choose_backend, sigterm_interrupts, writable, write_reports

_Sub = argparse._SubParsersAction  # argparse's type for add_subparsers()


def register(sub: _Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bisect", help="find the axis and the first release that turned a good cell bad")
    p.add_argument("--good", default=None, help="a cell id that passes (of the plan, or stored in --reports)")
    p.add_argument("--bad", default=None, help="a cell id that fails")
    p.add_argument(
        "--twins",
        action="store_true",
        help="instead: each failed cell of --reports with the passing one-axis twins it has",
    )
    p.add_argument("--matrix", type=Path, default=Path("matrix.toml"))
    p.add_argument(
        "--reports",
        type=Path,
        default=Path("reports"),
        help="where the cells' reports go; verdicts stored there are reused",
    )
    p.add_argument(
        "--backend",
        choices=("auto", *NAMES),
        default="auto",
        help="how cells are realised (not host: a bisection builds cells)",
    )
    p.add_argument("--refresh", action="store_true", help="ask the indexes again")
    p.set_defaults(func=cmd_bisect)


def _values(flag: str, cell: str, matrix: Matrix, resolver: Resolver, reports: Path) -> Mapping[str, str]:
    """A cell's values: from the plan of the matrix, else from its verdict stored in the reports folder."""
    planned, _ = plan_matrix(matrix, resolver, None)
    for c in (*planned.cells, *(x.cell for x in planned.conflicts), *(x.cell for x in planned.excluded)):
        if c.id == cell:
            return c.as_dict()
    path = verdict.path_of(reports, cell)
    if path.is_file():
        return dict(verdict.read(path).report.values)
    ids = [c.id for c in (*planned.cells, *(x.cell for x in planned.conflicts))][:5000]
    hint = did_you_mean(cell, ids)
    raise UsageError(
        f"--{flag} {cell}",
        f"is neither in the plan of {matrix.path} nor stored in {reports}/" + (f" ({hint})" if hint else ""),
        fix="give a cell id `stackfarm plan` lists (or one whose verdict --reports holds)",
    )


def cmd_bisect(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True)
    if args.twins:
        stored, _ = verdict.read_all(args.reports)
        checked = twin_check([s.report for s in stored])
        for cell, found in checked.items():
            shown = ", ".join(f"{axis}: {twin}" for axis, twin in found) or "no passing twin: not shown"
            console.print(f"{escape(cell)}: {escape(shown)}")
        return int(ExitCode.CELLS_FAILED if any(checked.values()) else ExitCode.OK)
    if not (args.good and args.bad):
        raise UsageError(
            "bisect", "--good and --bad are both needed", fix="give --good CELL and --bad CELL (or --twins)"
        )
    if (kind := BACKENDS.get(args.backend)) is not None and not kind.resolves:
        raise UsageError(
            "--backend host",
            "the host backend tests the stack installed here: it cannot build the cells a bisection needs",
            fix="leave --backend out (or give local or docker)",
        )
    matrix = load(args.matrix)
    cache = Cache()
    resolver = Resolver(matrix, cache, refresh=args.refresh)
    backend = get_backend(
        choose_backend(args.backend, console),
        cache,
        docker=matrix.docker,
        index_url=matrix.indexes[matrix.default_index].url,
    )
    if isinstance(backend, LocalBackend):
        backend.check_suites([s.name for s in matrix.suites])
    good = _values("good", args.good, matrix, resolver, args.reports)
    bad = _values("bad", args.bad, matrix, resolver, args.reports)
    writable(args.reports)
    proc.STOP.clear()
    options = RunOptions(reports=args.reports, jobs=1)
    with CellProgress() as ui, sigterm_interrupts(), cache.lock(args.reports.resolve(), notify=ui.note):
        runner = Runner(matrix, resolver, backend, options, ui, no_gpu_reason=gpu_unavailable_reason())

        def run_cell(cell: Cell) -> CellReport:
            reports = runner.run(Plan(cells=(cell,), conflicts=(), excluded=(), warnings=()))
            return next(r for r in reports if r.cell == cell.id)  # the runner keeps every cell it finished

        finding = Bisector(matrix, resolver, run_cell).run(good, bad)
    write_reports(args.reports)
    for line in describe(finding):
        console.print(escape(line))
    return int(ExitCode.OK if finding.first_bad is not None else ExitCode.INCOMPLETE)


__all__ = ["cmd_bisect", "register"]
