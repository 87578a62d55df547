"""`stackfarm cache info`: where the cache is and what each of its folders holds."""

from __future__ import annotations

import argparse

from ..artifacts import Cache


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cache", help="the artifact cache: info")
    verbs = p.add_subparsers(dest="cache_command", required=True, metavar="VERB")
    p_info = verbs.add_parser("info", help="the cache's folder and the size of each area")
    p_info.set_defaults(func=cmd_info)


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


__all__ = ["register"]
