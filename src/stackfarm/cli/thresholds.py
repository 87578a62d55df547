"""`stackfarm thresholds --from RECORD [--from RECORD ...]`: a `[thresholds.<kind>]` table derived from measured
runs (stackfarm.throughput.derive), or with --compare the runs side by side (medians, CVs, agreement)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from ..errors import ExitCode, UsageError
from ..throughput import derive
from ..throughput.record import RecordError, load


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "thresholds",
        help="derive a [thresholds.<kind>] table from throughput.json records (only stable figures get bounds)",
    )
    p.add_argument(
        "--from",
        dest="records",
        type=Path,
        action="append",
        required=True,
        metavar="RECORD",
        help="a run's throughput.json (or its reports/<cell> folder); give two or more to require agreement",
    )
    p.add_argument("--matrix", type=Path, default=Path("matrix.toml"), help="whose table's keys come first")
    p.add_argument("--max-cv", type=float, default=derive.MAX_CV, help="a figure above this CV gets no bound")
    p.add_argument(
        "--margin", type=float, default=derive.MARGIN, help="bounds this far outside the intervals"
    )
    p.add_argument("--compare", action="store_true", help="print the records side by side instead (markdown)")
    p.set_defaults(func=cmd_thresholds)


def _current_keys(matrix: Path, kind: str) -> list[str]:
    if not matrix.is_file():
        return []
    from ..matrix import load as load_matrix

    return list(load_matrix(matrix).thresholds.get(kind, {}))


def cmd_thresholds(args: argparse.Namespace) -> int:
    for value, name in ((args.max_cv, "--max-cv"), (args.margin, "--margin")):
        if not 0 < value < 1:
            raise UsageError(name, f"{value:g} is not a fraction in (0, 1)", fix=f"e.g. {name} 0.02")
    records = []
    for path in args.records:
        file = path / "throughput.json" if path.is_dir() else path
        try:
            records.append(load(file))
        except (OSError, RecordError, ValueError) as exc:
            raise UsageError(
                f"--from {path}", f"not a readable throughput.json ({exc})", fix="pass a 40-throughput record"
            ) from exc
    try:
        if args.compare:
            text = derive.compare(records, max_cv=args.max_cv)
        else:
            keys = _current_keys(args.matrix, str(records[0].get("runner_kind")))
            text = derive.table(records, keys=keys, max_cv=args.max_cv, margin=args.margin)
    except ValueError as exc:
        raise UsageError(
            "--from", str(exc), fix="pass records of one runner kind that measured figures"
        ) from exc
    Console(highlight=False, soft_wrap=True).print(text, end="", markup=False)
    return int(ExitCode.OK)


__all__ = [
    "cmd_thresholds",
    "register",
]
