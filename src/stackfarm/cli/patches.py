"""`stackfarm patches check|port|resolve`: preview upgrades of the patch sets, and carry sets forward.

* ``check`` -- the status of every patch on the releases in and past each set's range (a table, or --json);
* ``port SET --from V --to W`` -- carry a set to another sglang version by a three-way merge;
* ``resolve DIR --to W`` -- turn the edited ``conflicts/`` of a ported set into its patches.

The sglang wheels come through the resolver and the shared artifact cache (``stackfarm.sglangtrees``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from ..errors import ConfigError, did_you_mean
from ..matrix import load
from ..patches import (
    check_versions,
    download_order,
    format_port,
    format_table,
    pick_versions,
    port_set,
    resolve_conflicts,
    verify_ported,
)
from ..patchset import PatchSet
from ..sglangtrees import available_versions, sglang_trees


def _cmd_check(args: argparse.Namespace) -> int:
    matrix = load(args.matrix)
    sets = [ps for ps in matrix.patch_sets if not args.set or ps.name in args.set]
    if not sets:
        print(f"no patch sets in {args.matrix}", file=sys.stderr)
        return 0
    specs = [ps.applies_to for ps in sets]
    versions = args.version or pick_versions(
        available_versions(matrix), specs, args.newer, not args.no_newest
    )
    trees = sglang_trees(
        matrix,
        download_order(versions, specs),
        max_mb=args.max_mb,
        echo=lambda text: print(text, file=sys.stderr),
    )
    rows = check_versions(sets, trees)
    print(json.dumps([asdict(r) for r in rows], indent=2) if args.json else format_table(rows))
    return 1 if any(r.in_range and not (r.status == "applied" or r.optional) for r in rows) else 0


def _set_named(matrix_path: Path, name: str) -> PatchSet:
    by_name = {ps.name: ps for ps in load(matrix_path).patch_sets}
    if name not in by_name:
        hint = did_you_mean(name, by_name)
        raise ConfigError(
            matrix_path,
            f"no patch set `{name}`" + (f"; {hint}" if hint else ""),
            fix=f"use one of {', '.join(by_name)}",
        )
    return by_name[name]


def _cmd_port(args: argparse.Namespace) -> int:
    ps = _set_named(args.matrix, args.set)
    trees = sglang_trees(load(args.matrix), [args.from_version, args.to_version])
    out = args.out or ps.path.parent / f"{ps.name}-{args.to_version}"
    result = port_set(
        ps,
        old_tree=trees[args.from_version],
        new_tree=trees[args.to_version],
        from_version=args.from_version,
        to_version=args.to_version,
        out=out,
        force=args.force,
    )
    print(format_port(result))
    return 1 if result.conflicts or any(not r.ok for r in result.verify) else 0


def _cmd_resolve(args: argparse.Namespace) -> int:
    tree = sglang_trees(load(args.matrix), [args.to_version])[args.to_version]
    for name in resolve_conflicts(args.folder, tree):
        print(f"resolved {name}")
    verify = verify_ported(args.folder, tree, args.to_version)
    for r in verify:
        print(f"  verify on sglang {args.to_version}: {r.patch} {r.status}")
        if not r.ok:
            print("    " + r.detail.replace("\n", "\n    "))
    return 0 if all(r.ok for r in verify) else 1


_COMMANDS = {"check": _cmd_check, "port": _cmd_port, "resolve": _cmd_resolve}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``patches`` and its check/port/resolve to a parser's subcommands; it runs through ``run``.

    ``--matrix`` may come before the sub-subcommand (``patches --matrix M check``) or after it.
    """
    doc = (__doc__ or "").splitlines()[0]
    parser = sub.add_parser("patches", help="check, port and resolve the patch sets", description=doc)
    matrix_help = "the matrix file (matrix.toml)"
    parser.add_argument("--matrix", type=Path, default=Path("matrix.toml"), help=matrix_help)
    parser.set_defaults(func=run)
    # The same option after the sub-subcommand; SUPPRESS keeps an absent one from hiding the first.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--matrix", type=Path, default=argparse.SUPPRESS, help=matrix_help)
    cmds = parser.add_subparsers(dest="patches_command", required=True)
    p_check = cmds.add_parser(
        "check", parents=[common], help="status of every patch on the releases in and past each set's range"
    )
    p_check.add_argument("--json", action="store_true", help="one record per (set, patch, version)")
    p_check.add_argument("--set", action="append", help="only this set (repeatable)")
    p_check.add_argument("--version", action="append", help="only these sglang versions (repeatable)")
    p_check.add_argument("--newer", type=int, default=3, help="releases past each range to preview (3)")
    p_check.add_argument("--no-newest", action="store_true", help="do not add the newest release")
    p_check.add_argument("--max-mb", type=float, default=250.0, help="cap on new downloads, in MB (250)")
    p_port = cmds.add_parser(
        "port", parents=[common], help="carry a set to another sglang version by a three-way merge"
    )
    p_port.add_argument("set")
    p_port.add_argument(
        "--from", dest="from_version", required=True, help="the version the set is written for"
    )
    p_port.add_argument("--to", dest="to_version", required=True, help="the version to port it to")
    p_port.add_argument("--out", type=Path, default=None, help="where the new set goes (patches/<set>-<to>/)")
    p_port.add_argument("--force", action="store_true", help="replace --out when it exists")
    p_resolve = cmds.add_parser(
        "resolve", parents=[common], help="turn the edited conflicts/ of a ported set into its patches"
    )
    p_resolve.add_argument("folder", type=Path, help="the ported set (what port wrote)")
    p_resolve.add_argument("--to", dest="to_version", required=True, help="the version it was ported to")


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``patches`` command; its exit code. StackfarmError is left to the caller to print."""
    return _COMMANDS[args.patches_command](args)


__all__ = [
    "register",
    "run",
]
