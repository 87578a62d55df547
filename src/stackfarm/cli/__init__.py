"""`python -m stackfarm plan|run|report`: the face for scripts and CI (noxfile.py calls the same functions)."""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import history, htmlreport
from ..artifacts import Cache
from ..backends import NAMES, get_backend
from ..backends.host import HostBackend
from ..errors import ExitCode, StackfarmError
from ..matrix import Matrix, load
from ..plan import Plan, plan, select
from ..reports import CellReport, report_from_json, write_summaries
from ..resolve import Resolver
from ..runner import Runner, RunOptions, cell_passed, gpu_unavailable_reason
from ..ui import CellProgress


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stackfarm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--matrix", type=Path, default=Path("matrix.toml"), help="the matrix file (matrix.toml)"
    )
    common.add_argument(
        "--cells", default=None, help="only cells whose id matches this glob (comma-separated)"
    )
    p_plan = sub.add_parser("plan", parents=[common], help="print the cells, conflicts and exclusions")
    p_plan.add_argument("--json", action="store_true", help="machine-readable output")
    p_run = sub.add_parser("run", parents=[common], help="realise the cells and run their suites")
    p_run.add_argument("--reports", type=Path, default=Path("reports"), help="where reports go (reports/)")
    p_run.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="cells in parallel (default: cores)"
    )
    p_run.add_argument("--force", action="store_true", help="re-run cells whose inputs are unchanged")
    p_run.add_argument("--backend", choices=("auto", *NAMES), default="auto", help="how cells are realised")
    p_run.add_argument("--python", default=None, help="the host backend's Python (default: this one)")
    p_run.add_argument(
        "--suites", default=None, help="only suites whose name matches this glob (comma-separated)"
    )
    p_bundle = sub.add_parser("bundle", help="write a cell's Docker image as a tarball for an offline runner")
    p_bundle.add_argument("cell", help="a cell id (or an image tag) built by --backend docker")
    p_bundle.add_argument("--out", type=Path, default=None, help="the tarball (default: reports/<cell>.tar)")
    p_report = sub.add_parser("report", help="rebuild junit.xml and the summaries from stored verdicts")
    p_report.add_argument("--reports", type=Path, default=Path("reports"))
    p_report.add_argument(
        "--history", type=Path, default=None, help="a folder of past reports/ copies: trends"
    )
    return parser


def make_plan(
    matrix: Matrix, resolver: Resolver, cells: str | None
) -> tuple[Plan, dict[tuple[str, str], str]]:
    """Look every axis value up (errors before any work), read sglang's own pins, plan, select."""
    unreachable = resolver.check_axes()
    versions = {*matrix.axes["sglang"], *(dict(r.match)["sglang"] for r in matrix.include)}
    return select(plan(matrix, resolver.pins(sorted(versions))), cells), unreachable


def _plan_json(p: Plan) -> dict[str, object]:
    return {
        "cells": [{**asdict(c), "values": c.as_dict()} for c in p.cells],
        "conflicts": [{"id": c.cell.id, "problems": list(c.problems)} for c in p.conflicts],
        "excluded": [{"id": e.cell.id, "reason": e.reason} for e in p.excluded],
        "warnings": list(p.warnings),
    }


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    matrix = load(args.matrix)
    p, unreachable = make_plan(matrix, Resolver(matrix, Cache()), args.cells)
    if args.json:
        print(json.dumps(_plan_json(p), indent=2, default=str))
        return 0
    table = Table("cell", "status", "detail", box=None)
    for cell in p.cells:
        missing = [c.distribution for c in cell.components if (c.distribution, c.version) in unreachable]
        table.add_row(
            cell.id, "run", f"index unreachable for {', '.join(missing)}" if missing else cell.origin
        )
    for conflict in p.conflicts:
        table.add_row(conflict.cell.id, "[yellow]conflict[/]", "; ".join(conflict.problems))
    for excluded in p.excluded:
        table.add_row(excluded.cell.id, "[dim]excluded[/]", excluded.reason)
    console.print(table)
    for warning in p.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    return 0


def choose_backend(name: str, console: Console) -> str:
    """`auto`: Docker when an engine answers, else the local backend, said in one line."""
    if name != "auto":
        return name
    from .backends.docker import engine_unavailable_reason  # the docker CLI is probed only for `auto`

    reason = engine_unavailable_reason()
    if reason is None:
        return "docker"
    console.print(f"backend: local ({escape(reason.splitlines()[0])})")
    return "local"


def only_suites(matrix: Matrix, pattern: str | None) -> Matrix:
    """The matrix with just the suites matching `pattern` (e.g. "40-*" to re-measure throughput alone)."""
    if not pattern:
        return matrix
    globs = [g.strip() for g in pattern.split(",") if g.strip()]
    chosen = tuple(s for s in matrix.suites if any(fnmatch.fnmatchcase(s.name, g) for g in globs))
    if not chosen:
        known = ", ".join(s.name for s in matrix.suites)
        raise StackfarmError(f"no suite matches --suites {pattern!r}; the suites are: {known}")
    return dataclasses.replace(matrix, suites=chosen)


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    matrix = only_suites(load(args.matrix), args.suites)
    cache = Cache()
    resolver = Resolver(matrix, cache)
    name = choose_backend(args.backend, console)
    backend = get_backend(name, cache, python=args.python, docker=matrix.docker)
    if isinstance(backend, HostBackend):
        # The stack is already installed (and the host may have no network): its own sglang gives the pins.
        p, unreachable = select(plan(matrix, backend.pins()), args.cells), dict[tuple[str, str], str]()
    else:
        p, unreachable = make_plan(matrix, resolver, args.cells)
    if not (p.cells or p.conflicts):
        raise StackfarmError(f"no cell of {args.matrix} matches --cells {args.cells!r}")
    options = RunOptions(reports=args.reports, jobs=args.jobs, force=args.force)
    with CellProgress() as ui:
        for warning in p.warnings:
            ui.note(f"warning: {warning}")
        runner = Runner(
            matrix,
            resolver,
            backend,
            options,
            ui,
            unreachable=unreachable,
            no_gpu_reason=gpu_unavailable_reason(),
        )
        try:
            reports = runner.run(p)
        except KeyboardInterrupt:
            done = [runner.finished[k] for k in sorted(runner.finished)]
            _write_reports(done, args.reports)
            console.print(
                f"interrupted: kept {len(done)} finished cells in {args.reports}/; a re-run resumes"
            )
            return ExitCode.INTERRUPTED
    _write_reports(reports, args.reports)
    _print_summary(reports, args.reports, console)
    return (
        ExitCode.OK
        if all(cell_passed(r) or r.status == "excluded" for r in reports)
        else ExitCode.CELLS_FAILED
    )


def _write_reports(reports: Sequence[CellReport], where: Path) -> None:
    """junit.xml, summary.md/.html, then the browsable report (index.html and a page per cell)."""
    write_summaries(reports, where)
    htmlreport.write(where, reports)


def _print_summary(reports: Sequence[CellReport], where: Path, console: Console) -> None:
    counts: dict[str, int] = {}
    for r in reports:
        key = "passed" if cell_passed(r) else ("failed" if r.status in ("ran", "reused") else r.status)
        counts[key] = counts.get(key, 0) + 1
    console.print(
        f"{len(reports)} cells: "
        + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        + f" — {where}/index.html, {where}/summary.md, {where}/junit.xml"
    )


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    reports = []
    for verdict in sorted(args.reports.glob("*/verdict.json")):
        reports.append(report_from_json(json.loads(verdict.read_text(encoding="utf-8"))["report"]))
    if not reports:
        raise StackfarmError(f"no verdicts under {args.reports}/: run `nox -s matrix` first")
    if args.history is not None:
        htmlreport.write_history(history.write(args.history, args.reports), args.reports)
    _write_reports(reports, args.reports)
    _print_summary(reports, args.reports, console)
    return 0


def cmd_bundle(args: argparse.Namespace, console: Console) -> int:
    from .backends.docker import bundle

    out = args.out or Path("reports") / f"{args.cell.replace('/', '_').replace(':', '_')}.tar"
    console.print(f"wrote {bundle(args.cell, out)} (load it with `docker load -i`)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console(highlight=False)
    commands = {"plan": cmd_plan, "run": cmd_run, "report": cmd_report, "bundle": cmd_bundle}
    try:
        return int(commands[args.command](args, console))
    except StackfarmError as exc:
        Console(stderr=True, highlight=False).print(f"[red]error:[/] {escape(str(exc))}")
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
