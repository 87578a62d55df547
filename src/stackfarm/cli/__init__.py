"""`stackfarm` (and `python -m stackfarm`): the one command line. Each subcommand lives in its own module of this
package (`register` adds its parser, `run` carries it out); this module owns the parser, `--version` and the one
error printer. The nox sessions call these subcommands; nothing below the face imports it.

    stackfarm plan | run | report | patches | qualify | gha | bench | cache | bundle
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .. import __version__
from ..errors import ExitCode, StackfarmError
from . import bench, bisect, cache, emit, gha, patches, qualify, rayrun, runs, thresholds, upgrade


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="stackfarm",
        description="Version-matrix build system and compatibility test farm for "
        "CUDA x torch x sgl-kernel x flashinfer x SGLang.",
        epilog="exit codes: 0 every cell passed, 1 a cell failed, 2 configuration error, 3 incomplete "
        "(nothing failed; skips), 4 environment error (index unreachable, engine down), 130 interrupted",
    )
    top.add_argument("--version", action="version", version=f"stackfarm {__version__}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (runs, patches, qualify, gha, emit, bisect, bench, cache, thresholds, upgrade):
        module.register(sub)
    return top


def error(text: str) -> None:
    """The one error printer: `error: <text>` on stderr, matrix values never read as markup."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/] {escape(text)}")


def from_caller(args: argparse.Namespace) -> argparse.Namespace:
    """Every path argument resolved against the caller's working directory, once, before any work: suites run
    in folders of their own, where a relative --matrix or --reports would name nothing."""
    for name, value in vars(args).items():
        if isinstance(value, Path):
            setattr(args, name, value.expanduser().absolute())
        elif isinstance(value, list) and value and all(isinstance(v, Path) for v in value):
            setattr(args, name, [v.expanduser().absolute() for v in value])
    return args


def command(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """The function that carries out the parsed command: `run --executor ray` is rayrun's (each cell a task of a
    Ray cluster, built on runs' helpers, so runs itself never reaches for it)."""
    if args.func is runs.cmd_run and args.executor.name == "ray":
        return rayrun.cmd_run_ray
    func: Callable[[argparse.Namespace], int] = args.func
    return func


def main(argv: Sequence[str] | None = None) -> int:
    args = from_caller(parser().parse_args(argv))
    try:
        return int(command(args)(args))
    except StackfarmError as exc:
        error(str(exc))
        return int(exc.exit_code)
    except KeyboardInterrupt:
        error("interrupted")
        return int(ExitCode.INTERRUPTED)


__all__ = ["command", "error", "from_caller", "main", "parser"]

if __name__ == "__main__":
    sys.exit(main())
