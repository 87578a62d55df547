"""Two reports folders cell by cell: each cell's status, each suite's counts, every testcase's outcome.
``python tests/measure/compare_reports.py BEFORE AFTER``; exit 1 when any cell differs. Issue 26's note ran
``stackfarm run --backend local --reports DIR`` in a checkout of each commit, then this."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

Cell = tuple[str, dict[str, tuple[Any, ...]], dict[tuple[str, str], str]]


def outcome(case: ET.Element) -> str:
    found = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
    return found[0] if found else "passed"


def load(root: Path) -> dict[str, Cell]:
    out: dict[str, Cell] = {}
    for path in sorted(root.glob("*/verdict.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        report = doc.get("report", doc)
        suites = {
            s["suite"]: tuple(s.get(k) for k in ("tests", "failures", "errors", "skipped", "not_applicable"))
            for s in report.get("suites", [])
        }
        cases = {
            (xml.name, str(case.get("name"))): outcome(case)
            for xml in sorted(path.parent.glob("*.xml"))
            for case in ET.parse(xml).getroot().iter("testcase")
        }
        out[str(report.get("cell"))] = (str(report.get("status")), suites, cases)
    return out


def main(argv: list[str] | None = None) -> int:
    before_dir, after_dir = (Path(a) for a in (argv or sys.argv[1:]))
    before, after = load(before_dir), load(after_dir)
    same = 0
    for cell in sorted(before.keys() | after.keys()):
        a, b = before.get(cell), after.get(cell)
        if a == b and a is not None:
            same += 1
            print(f"same {cell}: {a[0]} ({len(a[2])} testcases)")
            continue
        print(f"DIFF {cell}: {a[0] if a else 'absent'} -> {b[0] if b else 'absent'}")
        for key in sorted((a[2] if a else {}).keys() | (b[2] if b else {}).keys()):
            x, y = (a[2].get(key) if a else None), (b[2].get(key) if b else None)
            if x != y:
                print(f"    {key[0]} {key[1]}: {x} -> {y}")
    print(f"{same}/{len(before.keys() | after.keys())} cells identical")
    return 0 if same == len(before.keys() | after.keys()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
