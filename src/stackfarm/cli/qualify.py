"""`stackfarm qualify`: release sign-off (`--cell --release --approver`) and its check (`--verify RECORD`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import ConfigError, ExitCode
from ..qualify import SEAL, qualify, verify


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("qualify", help="sign a cell off as a release, or --verify a record")
    p.add_argument("--cell", help="the cell id to qualify")
    p.add_argument("--release", help="the release name (the record's file name)")
    p.add_argument("--approver", help="who signs off")
    p.add_argument("--reports", type=Path, default=Path("reports"), help="the reports folder (reports/)")
    p.add_argument("--matrix", type=Path, default=None, help="the matrix file (matrix.toml)")
    p.add_argument("--backend", choices=("local", "docker", "host"), default="local",
                   help="the backend the run used (it is one of the inputs)")  # fmt: skip
    p.add_argument("--allow-skip", action="append", default=[], metavar="GLOB",
                   help="accept skipped testcases matching SUITE::TESTCASE glob (recorded as not verified)")  # fmt: skip
    p.add_argument("--replace", action="store_true", help="overwrite an existing record of this release")
    p.add_argument("--verify", type=Path, metavar="RECORD", help="check a record against a fresh plan")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return _verify(args) if args.verify else _qualify(args)


def _qualify(args: argparse.Namespace) -> int:
    missing = [f"--{k}" for k in ("cell", "release", "approver") if not getattr(args, k)]
    if missing:
        raise ConfigError(
            "command line", f"{', '.join(missing)} missing", fix="give --cell, --release and --approver"
        )
    target = qualify(
        cell_id=args.cell,
        release=args.release,
        approver=args.approver,
        reports=args.reports,
        matrix_path=args.matrix or Path("matrix.toml"),
        backend=args.backend,
        allow_skips=args.allow_skip,
        replace=args.replace,
    )
    record = json.loads(target.read_text(encoding="utf-8"))
    print(f"qualified {record['cell']} as {record['release']} (approved by {record['approver']})")
    for skip in record["accepted_skips"]:
        print(f"  not verified (accepted): {skip['case']}: {skip['reason']}")
    if record["matrix"].get("modified_since_commit"):
        print(f"  note: {record['matrix']['path']} has uncommitted changes; the record keeps its sha256")
    print(f"{target} and {target.with_suffix('.md')}; record sha256 {record[SEAL]}")
    return int(ExitCode.OK)


def _verify(args: argparse.Namespace) -> int:
    result = verify(args.verify, args.matrix)
    print("\n".join(result.lines))
    return int(ExitCode.OK if result.holds else ExitCode.CELLS_FAILED)


__all__ = ["register", "run"]
