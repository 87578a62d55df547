"""The share of functions (functions, methods and closures) whose radon cyclomatic complexity is over 10, as
issue 26's note measures it: ``python tests/measure/cc_share.py src [--top N]`` (needs ``pip install radon``)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any


def blocks(tree: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every function, method and closure of radon's JSON for one file."""
    out: list[dict[str, Any]] = []
    for block in tree:
        if block["type"] in ("function", "method"):
            out.append(block)
        out += blocks(block.get("closures", []))
        if block["type"] == "class":
            out += blocks(block.get("methods", []))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--top", type=int, default=0, help="list the N most complex functions")
    args = parser.parse_args(argv)
    raw = subprocess.run(
        [sys.executable, "-m", "radon", "cc", "-j", *args.paths], capture_output=True, text=True, check=True
    ).stdout
    found = [
        (b["complexity"], f"{path}:{b['lineno']}", b["name"])
        for path, tree in json.loads(raw).items()
        for b in blocks(tree)
    ]
    over = sorted((f for f in found if f[0] > 10), reverse=True)
    print(
        f"{len(over)}/{len(found)} = {100 * len(over) / max(len(found), 1):.2f} % over CC 10; "
        f"{sum(1 for f in found if f[0] > 15)} over CC 15"
    )
    for complexity, where, name in over[: args.top]:
        print(complexity, where, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
