"""`stackfarm gha matrix | annotate`: the nightly workflow's job matrix from a plan, and GitHub annotations."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..emit import check_chunk, pending
from ..emit import gha as gha_emit
from ..errors import ExitCode, StackfarmError, UsageError
from ..gha import annotation, dispatch, gha_annotations, read_runners
from ..history import read_run
from ..planjson import PlanContract
from .args import whole


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gha", help="GitHub Actions glue: the job matrix, annotations")
    verbs = p.add_subparsers(dest="gha_command", required=True, metavar="VERB")
    p_matrix = verbs.add_parser("matrix", help="`stackfarm plan --json` -> the nightly's job matrix")
    p_matrix.add_argument(
        "--plan", default="-", help="`stackfarm plan --json` output (a file, or - for stdin)"
    )
    p_matrix.add_argument(
        "--matrix", type=Path, default=None, help="the plan's matrix (default: the one the plan names)"
    )
    p_matrix.add_argument(
        "--github-output",
        type=Path,
        default=None,
        help="also append matrix=<json> and count=<n> to this file ($GITHUB_OUTPUT)",
    )
    p_matrix.add_argument(
        "--chunks",
        type=whole(1, 1),
        default=None,
        help="the cells without a stored verdict, longest first, as this many matrices matrix_1..K "
        "(count_1..K), each of at most --chunk cells (a workflow of `stackfarm emit gha`)",
    )
    p_matrix.add_argument("--chunk", type=whole(1, 256), default=256, help="with --chunks: cells per matrix")
    p_matrix.set_defaults(func=cmd_matrix)
    p_annotate = verbs.add_parser("annotate", help="the reports as GitHub annotations (exit 1 on an error)")
    p_annotate.add_argument("--reports", type=Path, default=Path("reports"))
    p_annotate.add_argument(
        "--expect", default=None, help="the job-matrix JSON (a file, or -): cells that must have a report"
    )
    p_annotate.set_defaults(func=cmd_annotate)


def _read_json(source: str) -> Any:
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise StackfarmError(f"{source}: not JSON ({exc})") from None


def chunked(plan: dict[str, Any], chunks: int, size: int) -> list[dict[str, Any]]:
    """The plan's pending cells (stackfarm.emit's order, each on the runner kind the plan gives it) as
    `chunks` matrices of at most `size` entries; refused when they do not fit, since the workflow has only
    that many chunk jobs."""
    size = check_chunk(size, gha_emit.MATRIX_LIMIT, "a GitHub Actions matrix")
    cells = [gha_emit.entry(c) for c in pending(plan)]
    if len(cells) > chunks * size:
        raise UsageError(
            f"--chunks {chunks}",
            f"the plan has {len(cells)} cells to run, past the {chunks} x {size} this workflow's chunk jobs take",
            fix="emit the workflow again from this plan (`stackfarm emit gha --plan plan.json`)",
        )
    return [{"include": cells[n * size : (n + 1) * size]} for n in range(chunks)]


def _chunks(args: argparse.Namespace, plan: dict[str, Any]) -> int:
    """`--chunks K`: the plan's own routing (a cell it dispatches nowhere gets no job, an error annotation,
    and the merge, which reads the plan, counts it as a planned cell without a verdict)."""
    parts = chunked(plan, args.chunks, args.chunk)
    lines = [f"count={sum(len(p['include']) for p in parts)}"]
    for n, part in enumerate(parts, 1):
        lines += [
            f"count_{n}={len(part['include'])}",
            f"matrix_{n}={json.dumps(part, separators=(',', ':'))}",
        ]
    for cell in plan.get("cells", []):
        if cell.get("status", "run") != "run":
            why = str(cell.get("unrunnable") or cell.get("status"))
            print(annotation("error", f"{cell['id']} unrunnable", why), file=sys.stderr)
    if args.github_output is not None:
        with args.github_output.open("a", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return int(ExitCode.OK)


def cmd_matrix(args: argparse.Namespace) -> int:
    plan = _read_json(args.plan)
    if not isinstance(plan, dict):
        raise StackfarmError(f"{args.plan}: not a plan (`stackfarm plan --json` output)")
    if args.chunks is not None:
        return _chunks(args, plan)
    contract = PlanContract.of(plan, args.plan)
    # The plan's matrix routes its cells (its runner kinds), never whatever ./matrix.toml is now.
    path = args.matrix or (Path(contract.matrix.path) if contract.matrix else Path("matrix.toml"))
    contract.check_matrix(path, args.plan)
    runners, warnings = read_runners(path)
    matrix, unrunnable = dispatch(plan, runners, path)
    for warning in warnings:
        print(annotation("warning", "runners", warning), file=sys.stderr)
    for conflict in plan.get("conflicts", []):
        print(
            annotation("warning", f"{conflict['id']} conflict", "; ".join(conflict["problems"])),
            file=sys.stderr,
        )
    for line in unrunnable:  # no job: the cell never reaches a runner whose driver cannot run it
        print(annotation("error", f"{line.split(':', 1)[0]} unrunnable", line), file=sys.stderr)
    text = json.dumps(matrix, separators=(",", ":"))
    if args.github_output is not None:
        with args.github_output.open("a", encoding="utf-8") as out:
            out.write(f"matrix={text}\ncount={len(matrix['include'])}\n")
    print(text)
    return int(ExitCode.INCOMPLETE if unrunnable else ExitCode.OK)


def cmd_annotate(args: argparse.Namespace) -> int:
    expected = [str(e["cell"]) for e in _read_json(args.expect).get("include", [])] if args.expect else []
    lines = gha_annotations(read_run(args.reports), expected)
    print("\n".join(lines))
    return int(ExitCode.CELLS_FAILED if any(line.startswith("::error") for line in lines) else ExitCode.OK)


__all__ = ["register"]
