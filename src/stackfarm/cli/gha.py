"""`stackfarm gha matrix | annotate`: the nightly workflow's job matrix from a plan, and GitHub annotations."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import ExitCode, StackfarmError
from ..gha import annotation, dispatch, gha_annotations, read_runners
from ..history import read_run
from ..planjson import PlanContract


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
    p_matrix.add_argument("--github-output", type=Path, default=None,
                          help="also append matrix=<json> and count=<n> to this file ($GITHUB_OUTPUT)")  # fmt: skip
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


def cmd_matrix(args: argparse.Namespace) -> int:
    plan = _read_json(args.plan)
    if not isinstance(plan, dict):
        raise StackfarmError(f"{args.plan}: not a plan (`stackfarm plan --json` output)")
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
