"""`stackfarm cache info|verify|prune`: where the cache is, whether it is intact, and what to keep of it (prune
also removes the Docker cell images that only pruned runs used)."""

from __future__ import annotations

import argparse
import gc
from pathlib import Path
from typing import TYPE_CHECKING

from .. import cachekeep
from ..artifacts import Cache
from ..errors import ExitCode

if TYPE_CHECKING:
    from ..backends.docker.images import ImageRecord

#: How many recent runs `cache prune` keeps the files of, unless --keep-runs says otherwise.
KEEP_RUNS = 3


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cache", help="the artifact cache: info, verify, prune")
    verbs = p.add_subparsers(dest="cache_command", required=True, metavar="VERB")
    p_info = verbs.add_parser("info", help="the cache's folder and the size of each area")
    p_info.set_defaults(func=cmd_info)
    p_verify = verbs.add_parser(
        "verify", help="check every wheel against its sha256 and every unpacked tree against its manifest"
    )
    p_verify.add_argument(
        "--repair", action="store_true", help="remove what is damaged: the next run fetches it again"
    )
    p_verify.set_defaults(func=cmd_verify)
    p_prune = verbs.add_parser(
        "prune", help="remove what none of the last runs used (wheels, trees, work dirs, Docker cell images)"
    )
    p_prune.add_argument(
        "--keep-runs",
        type=int,
        default=KEEP_RUNS,
        metavar="N",
        help=f"keep what the last N runs used (default {KEEP_RUNS})",
    )
    p_prune.add_argument("--dry-run", action="store_true", help="list what would go, remove nothing")
    p_prune.set_defaults(func=cmd_prune)


def _size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("KB", "MB", "GB"):
        value /= 1000
        if value < 1000 or unit == "GB":
            break
    return f"{value:.1f} {unit}"


def cmd_info(args: argparse.Namespace) -> int:
    del args
    cache = Cache()
    rows = cache.usage()
    print(f"cache: {cache.root} (STACKFARM_CACHE moves it)")
    width = max(len(area) for area, *_ in rows)
    for area, what, files, size in rows:
        print(f"  {area:<{width}}  {_size(size):>9}  {files:>7} files  {what}")
    total = sum(size for *_, size in rows)
    print(f"  {'total':<{width}}  {_size(total):>9}  (a hard-linked file counts once)")
    return 0


def _entries(n: int) -> str:
    return f"{n} damaged entr{'y' if n == 1 else 'ies'}"


def _collect_finished_runs() -> None:
    """A Cache of a run that finished in this process gives its lease back when it is collected: collect what
    only reference cycles keep alive, so that such a run does not count as live (cachekeep's leases)."""
    gc.collect()


def cmd_verify(args: argparse.Namespace) -> int:
    """0 when nothing is damaged (or all of it was removed with --repair), 4 (environment) otherwise: also
    when --repair left damage in place that a live run uses (it says which, and why)."""
    cache = Cache()
    if args.repair:
        _collect_finished_runs()
    found = cachekeep.verify(cache.root, repair=args.repair)
    if not found:
        print(f"cache: {cache.root}: every wheel and tree is intact")
        return ExitCode.OK
    for damage in found:
        shown = damage.problems[:5]
        more = f" (and {len(damage.problems) - 5} more)" if len(damage.problems) > 5 else ""
        print(f"damaged: {damage.path.relative_to(cache.root)}: {'; '.join(shown)}{more}")
    if args.repair:
        kept = [d for d in found if d.kept]
        removed = len(found) - len(kept)
        if removed:
            print(f"removed {_entries(removed)}: the next run fetches them again")
        for why, count in _kept_counts(kept):
            print(f"kept {count} damaged path{'' if count == 1 else 's'} {why}")
        if kept:
            print(
                f"{_entries(len(kept))} left in place: run `stackfarm cache verify --repair` again once that run "
                "has finished"
            )
            return ExitCode.ENVIRONMENT
        return ExitCode.OK
    print(
        f"{len(found)} damaged: run `stackfarm cache verify --repair` to remove them (the next run refetches)"
    )
    return ExitCode.ENVIRONMENT


def cmd_prune(args: argparse.Namespace) -> int:
    """The cache's entries none of the last N runs used, then the Docker cell images only those entries named
    (each realise records its image in the cell's work dir; see stackfarm.backends.docker.images)."""
    if args.keep_runs < 0:
        print("--keep-runs must be 0 or more")
        return ExitCode.CONFIG
    from ..backends.docker import images  # imported here: the other verbs need nothing of Docker

    cache = Cache()
    _collect_finished_runs()
    records = images.read_records(cache.root)  # before prune removes the work dirs that hold them
    pruned = cachekeep.prune(cache.root, keep_runs=args.keep_runs, dry_run=args.dry_run)
    if pruned.note:
        print(f"cache: {cache.root}: {pruned.note}")
        return ExitCode.OK
    verb = "would remove" if args.dry_run else "removed"
    for path in pruned.removed:
        print(f"{verb}: {path.relative_to(cache.root)}")
    for run_id, count in pruned.live:
        print(f"kept {count} path{'' if count == 1 else 's'} of live run {run_id} (it is still running)")
    for path in pruned.busy:
        print(f"kept: {path.relative_to(cache.root)}: a running stackfarm holds its lock")
    kept = ", ".join(pruned.kept_runs) or "none"
    print(f"{verb} {len(pruned.removed)} entries ({_size(pruned.freed)}); kept what these runs used: {kept}")
    if records:
        _prune_images(records, pruned.removed, verb=verb, dry_run=args.dry_run)
    return ExitCode.OK


def _kept_counts(kept: list[cachekeep.Damage]) -> list[tuple[str, int]]:
    """(why, how many) of the damage --repair left in place, in the order first seen."""
    counts: dict[str, int] = {}
    for damage in kept:
        counts[damage.kept] = counts.get(damage.kept, 0) + 1
    return list(counts.items())


def _prune_images(
    records: dict[Path, ImageRecord], removed: tuple[Path, ...], *, verb: str, dry_run: bool
) -> None:
    from ..backends.docker import images

    done = images.prune_images(records, removed, dry_run=dry_run)
    if done.note:
        print(f"docker: {done.note}")
        return
    for tag, cell in done.removed:
        print(f"{verb}: docker image {tag} (cell {cell})")
    for tag, why in done.kept:
        print(f"kept: docker image {tag}: {why}")
    line = f"docker: {verb} {len(done.removed)} cell image tags (up to {_size(done.freed)})"
    if done.unknown:
        line += f"; left alone {done.unknown} cell images no run of this cache recorded"
    print(line)


__all__ = ["register"]
