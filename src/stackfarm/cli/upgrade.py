"""`stackfarm plan-upgrade --from CELL`: every newer SGLang release as a whole stack, judged statically on the
server's arch and driver with the patch sets, where each blocker appears and goes away, the newest release worth
proving, and the matrix of the cells that prove it (stackfarm.upgrade, stackfarm.upgrade_report).

Exit codes: 0 a release is recommended and nothing about it is open; 3 recommended, with questions only the GPU
cells answer; 1 no release is recommended; 2 a bad argument or matrix; 4 an index did not answer.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from rich.console import Console
from rich.markup import escape

from .. import verdict
from ..archspec import ArchError, parse_target
from ..artifacts import Cache
from ..driver import driver_key, runner_for
from ..errors import ExitCode, StackfarmError, UsageError, did_you_mean
from ..matrix import Matrix, Model, load
from ..patchset import PatchSet
from ..resolve import Resolver, plan_matrix
from ..ui import CellProgress, plain_console
from ..upgrade import Planner, default_arch
from ..upgrade_plan import Options, UpgradePlan
from ..upgrade_report import json_text, proof_matrix, summary_lines, terminal, write

_Sub = argparse._SubParsersAction  # argparse's type for add_subparsers()
PROOF = "matrix-upgrade.toml"


def register(sub: _Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan-upgrade",
        help="walk the newer SGLang releases from a cell: blockers, patches, "
        "the release to move to and the cells that prove it",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--from", dest="start", required=True, help="the cell that runs today (of the plan, or stored)"
    )
    p.add_argument("--matrix", type=Path, default=Path("matrix.toml"))
    p.add_argument(
        "--reports",
        type=Path,
        default=Path("reports"),
        help="stored verdicts are looked up here; the plan goes to REPORTS/upgrade/",
    )
    p.add_argument("--arch", default=None, help="the server's GPU arch (default: its runner's, e.g. sm_120)")
    p.add_argument("--driver", default=None, help="the server's NVIDIA driver, e.g. 570.86.15")
    p.add_argument(
        "--forward-compat", action="store_true", help="the server has NVIDIA's cuda-compat package"
    )
    p.add_argument("--gpus", type=int, default=None, help="GPUs of the server (default: its runner's)")
    p.add_argument(
        "--model", action="append", default=None, help="a [[models]] name (repeatable; default all)"
    )
    p.add_argument(
        "--patches", type=Path, default=None, help="the patch sets' folder (default: the matrix's)"
    )
    p.add_argument("--to", default=None, help="the newest sglang release to look at")
    p.add_argument("--strict", action="store_true", help="a failure the start cell has too blocks as well")
    p.add_argument(
        "--no-flashinfer-sources",
        action="store_true",
        help="judge SGLang's sources only (flashinfer-python's JIT gates are not read)",
    )
    p.add_argument("--jobs", type=int, default=0, help="parallel analyses (default: one per core)")
    p.add_argument(
        "--write-matrix", type=Path, default=None, help=f"the proof matrix (default: {PROOF} beside --matrix)"
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON instead of the table")
    p.add_argument("--refresh", action="store_true", help="ask the indexes again")
    p.set_defaults(func=cmd_plan_upgrade)


def start_values(matrix: Matrix, resolver: Resolver, reports: Path, cell: str) -> Mapping[str, str]:
    """The start cell's values: from the plan of the matrix, else from its verdict stored in `reports`."""
    planned, _ = plan_matrix(matrix, resolver, None)
    every = (*planned.cells, *(x.cell for x in planned.conflicts), *(x.cell for x in planned.excluded))
    for c in every:
        if c.id == cell:
            return c.as_dict()
    path = verdict.path_of(reports, cell)
    if path.is_file():
        return dict(verdict.read(path).report.values)
    hint = did_you_mean(cell, [c.id for c in every])
    raise UsageError(
        "--from",
        f"{cell!r} is neither in the plan of {matrix.path} nor stored in {reports}/"
        + (f"; {hint}" if hint else ""),
        fix="give a cell id that `stackfarm plan` lists",
    )


def _models(matrix: Matrix, names: list[str] | None) -> tuple[Model, ...]:
    if not names:
        return matrix.models
    known = {m.name: m for m in matrix.models}
    out = []
    for name in names:
        if name not in known:
            hint = did_you_mean(name, known)
            raise UsageError(
                "--model",
                f"no [[models]] entry {name!r} in {matrix.path}" + (f"; {hint}" if hint else ""),
                fix=f"use one of {', '.join(known) or '(none: add a [[models]] table)'}",
            )
        out.append(known[name])
    return tuple(out)


def patch_sets(matrix: Matrix, folder: Path | None, start: str) -> tuple[PatchSet, ...]:
    """The matrix's [patches.*] sets, read from `folder` when given; a set folder there that matrix.toml does
    not name is carried from the start release on (applies_to ">=start")."""
    if folder is None:
        return matrix.patch_sets
    if not folder.is_dir():
        raise UsageError("--patches", f"{folder} is not a folder", fix="pass the folder holding <set>/series")
    sets = [
        ps.__class__(name=ps.name, applies_to=ps.applies_to, path=folder / ps.name, optional=ps.optional)
        for ps in matrix.patch_sets
        if (folder / ps.name / "series").is_file()
    ]
    named = {ps.name for ps in sets}
    for path in sorted(folder.iterdir()):
        if (path / "series").is_file() and path.name not in named:
            sets.append(PatchSet(name=path.name, applies_to=SpecifierSet(f">={start}"), path=path))
    return tuple(sets)


def options(args: argparse.Namespace, matrix: Matrix, start: Mapping[str, str], cell: str) -> Options:
    arch = args.arch or default_arch(matrix, cell)
    try:
        parse_target(arch)
    except ArchError as exc:
        raise UsageError("--arch", str(exc), fix="e.g. --arch sm_120") from None
    if args.driver is not None:
        try:
            driver_key(args.driver)
        except ValueError as exc:
            raise UsageError(
                "--driver", str(exc), fix="the version nvidia-smi shows, e.g. 570.86.15"
            ) from None
    if args.to is not None:
        try:
            Version(args.to)
        except InvalidVersion:
            raise UsageError("--to", f"{args.to!r} is not a version", fix="e.g. --to 0.5.16") from None
    runner = runner_for(matrix, cell)
    gpus = args.gpus if args.gpus is not None else (runner.gpus if runner is not None else 1)
    if gpus < 1:
        raise UsageError("--gpus", f"{gpus} GPUs", fix="a whole number >= 1")
    return Options(
        arch=arch,
        reference=matrix.reference_arch,
        gpus=gpus,
        strict=args.strict,
        jobs=args.jobs,
        driver=args.driver or (runner.driver if runner is not None else None),
        forward_compat=args.forward_compat or bool(runner is not None and runner.forward_compat),
        models=_models(matrix, args.model),
        sets=patch_sets(matrix, args.patches, start["sglang"]),
        to=args.to,
        flashinfer_sources=not args.no_flashinfer_sources,
        reports=args.reports,
    )


def exit_code(plan: UpgradePlan) -> ExitCode:
    rec = plan.recommendation
    if rec.release is None:
        return ExitCode.CELLS_FAILED
    return ExitCode.INCOMPLETE if rec.open else ExitCode.OK


def cmd_plan_upgrade(args: argparse.Namespace) -> int:
    matrix = load(args.matrix)
    resolver = Resolver(matrix, Cache(), refresh=args.refresh)
    start = start_values(matrix, resolver, args.reports, args.start)
    opts = options(args, matrix, start, args.start)
    target = args.write_matrix or matrix.root / PROOF
    with CellProgress() as ui:
        plan = Planner(matrix, resolver, opts, progress=ui).plan(start)
    out = plain_console()
    written = None
    if plan.recommendation.release is not None:
        try:
            written = proof_matrix(plan, matrix, target)
        except StackfarmError as exc:
            Console(stderr=True, highlight=False).print(escape(f"the proof matrix was not written: {exc}"))
    plan = replace(plan, matrix=str(written) if written else "")
    paths = write(plan, args.reports / "upgrade")
    if args.json:
        out.print(json_text(plan), markup=False)
    else:
        console = Console(highlight=False)
        console = console if console.is_terminal else Console(highlight=False, width=200)
        console.print(terminal(plan))
        for line in summary_lines(plan):
            out.print(escape(line))
        out.print(escape(f"reports: {', '.join(str(p) for p in paths)}"))
    return int(exit_code(plan))


__all__ = ["PROOF", "cmd_plan_upgrade", "exit_code", "options", "patch_sets", "register", "start_values"]
