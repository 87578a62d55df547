"""`stackfarm bundle CELL --wheelhouse OUT --profile runners/<kind>.toml [--split SIZE]`: a host runner's offline
bundle (stackfarm.wheelhouse); `stackfarm bundle CELL --out TAR` (a Docker image) stays in stackfarm.cli.runs."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ..artifacts import Cache
from ..errors import StackfarmError, UsageError
from ..profile import load_matrix
from ..resolve import Resolver, plan_matrix
from ..wheelhouse import INSTALLER, build, parse_size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bundle subcommand's wheelhouse arguments (`--profile` is shared with plan and run)."""
    parser.add_argument(
        "--wheelhouse",
        default=None,
        metavar="OUT",
        help="write an offline wheelhouse bundle for a host runner into OUT (needs --profile)",
    )
    parser.add_argument(
        "--split", default=None, metavar="SIZE", help="with --wheelhouse: parts of at most SIZE (e.g. 58M)"
    )


def cmd_wheelhouse(args: argparse.Namespace) -> int:
    console = Console(highlight=False, soft_wrap=True)
    if args.profile is None:
        raise UsageError(
            f"--wheelhouse {args.wheelhouse}",
            "a wheelhouse bundle is made for one host: which one?",
            fix="add --profile runners/<kind>.toml (the host's profile)",
        )
    split = parse_size(args.split) if args.split else None
    matrix = load_matrix(args.matrix, args.profile, hosted=False)
    cache = Cache()
    p, unreachable = plan_matrix(matrix, Resolver(matrix, cache, refresh=args.refresh), args.cell)
    cell = next((c for c in p.cells if c.id == args.cell), None)
    if cell is None:
        conflict = next((c for c in p.conflicts if c.cell.id == args.cell), None)
        if conflict is not None:
            raise StackfarmError(f"{args.cell} conflicts: {'; '.join(conflict.problems)}: nothing to bundle")
        known = ", ".join(c.id for c in p.cells) or "none"
        raise UsageError(
            f"bundle {args.cell}", f"no cell of {args.matrix} has that id", fix=f"use one of: {known}"
        )
    if any((c.distribution, c.version) in unreachable for c in cell.components):
        raise StackfarmError(
            f"{cell.id}: an index did not answer: " + "; ".join(sorted(set(unreachable.values())))
        )
    out = Path(args.wheelhouse).expanduser().absolute()
    with cache:
        bundle = build(matrix, cell, out, split=split, cache=cache, log=lambda t: console.print(escape(t)))
    installed = [w for w in bundle.wheels if w.install]
    console.print(
        f"wrote {out}: {len(installed)} wheels to install + {len(bundle.wheels) - len(installed)} for the "
        f"wheelhouse, {bundle.size / 2**20:.1f} MiB, {len(bundle.parts)} part(s) "
        f"(largest {max(s for _, _, s in bundle.parts) / 2**20:.1f} MiB) in {bundle.seconds:.0f} s; "
        f"{len(bundle.selection.provided)} distributions the host provides, {len(bundle.selection.left_out)} left out"
    )
    console.print(
        "on the host: "
        + escape(
            f"python3 {shlex.quote(str(out / INSTALLER))} --prefix /tmp/pfx && . /tmp/pfx/stackfarm-env.sh"
        )
    )
    return 0


__all__ = ["add_arguments", "cmd_wheelhouse"]
