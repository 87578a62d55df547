"""What the grids of summary.md, summary.html and index.html share: one table of colours, the words in each
grid cell, and failures grouped by root cause across cells.

Nothing here judges: outcomes and statuses are stackfarm.verdict's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..verdict import CellReport, Status, SuiteResult

#: Fill colour of each suite outcome and cell verdict (GitHub's palette: readable with white text, tellable
#: apart). Amber is "incomplete": what ran passed, something owed an answer. summary.html and index.html
#: both colour from this table.
COLOURS: dict[str, str] = {
    "passed": "#1a7f37",
    "failed": "#cf222e",
    "error": "#82071e",
    "skipped": "#9a6700",
    "incomplete": "#9a6700",
    "not_applicable": "#57606a",
    "missing": "#d0d7de",
    "conflict": "#bc4c00",
    "excluded": "#6e7781",
}
#: Outcomes and verdicts that are green (or deliberately nothing): no reason is printed under them.
GREEN = ("passed", "not_applicable", "excluded", "missing")


def css() -> str:
    """The colour rules: ``.o-<outcome>`` for a suite's cell, ``.v-<verdict>`` for a cell's verdict."""
    rules = "".join(f".o-{k},.v-{k}{{background:{c};color:#fff}}" for k, c in COLOURS.items())
    return rules + ".o-missing,.v-missing{color:#57606a}"


def suite_text(s: SuiteResult) -> str:
    """The counts in a suite's grid cell: "2/25 passed, 23 skipped", "1 of 3 failed", "n/a", ..."""
    na = f", {s.not_applicable} n/a" if s.not_applicable else ""
    if s.outcome == "passed":
        return f"{s.passed}/{s.tests} passed{na}"
    if s.outcome == "incomplete":
        return f"{s.passed}/{s.tests} passed, {s.skipped} skipped{na}"
    if s.outcome == "skipped":
        return f"skipped ({s.skipped})" if s.skipped > 1 else "skipped"
    if s.outcome == "not_applicable":
        return "n/a"
    if s.outcome == "failed":
        return f"{s.failures} of {s.tests} failed" if s.tests else "failed"
    return f"error ({s.errors} of {s.tests})" if s.tests else "error"


def suite_reason(s: SuiteResult) -> str:
    """The line shown under a non-green suite ("" under a green one)."""
    if s.outcome in GREEN:
        return ""
    return s.first_failure or s.outcome


def short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --------------------------------------------------------------------------- root causes

_PARAMS = re.compile(r"\[[^\[\]]*\]")
_FILE_LINE = re.compile(r"([\w./\\-]+\.\w+):\d+(?::\d+)?")
_VERSION = re.compile(r"(?<![\w.])v?\d+(?:\.\d+)+(?:\.?[a-z]+\d*|\+[\w.]+)*(?![\w])", re.IGNORECASE)
_HEX = re.compile(r"0x[0-9a-f]+", re.IGNORECASE)
_TMP = re.compile(r"/tmp/[\w./-]*|pytest-\d+/\S*")


def normalise(text: str, cell: str = "") -> str:
    """A first-failure line without what differs from cell to cell: the cell id, parametrize ids, versions,
    file:line numbers, addresses and temporary paths."""
    out = text.replace(cell, "<cell>") if cell else text
    out = _TMP.sub("<tmp>", out)
    out = _FILE_LINE.sub(r"\1", out)
    while _PARAMS.search(out):
        out = _PARAMS.sub("", out)
    out = _HEX.sub("0x…", out)
    out = _VERSION.sub("X.Y", out)
    return " ".join(out.split())


@dataclass(frozen=True, kw_only=True)
class RootCause:
    """One normalised reason and the cells that share it."""

    reason: str
    cells: tuple[str, ...]

    def line(self) -> str:
        n = len(self.cells)
        return f"{n} cell{'' if n == 1 else 's'}: {self.reason}"


def _problems(cell: CellReport) -> Iterable[str]:
    if cell.status in (Status.CONFLICT, Status.ERROR):
        yield f"{cell.status}: {cell.reason or cell.status}"
        return
    if not cell.ran:
        return  # excluded on purpose: not a failure
    bad = [s for s in cell.suites if s.outcome not in GREEN]
    for s in bad:
        yield f"{s.suite}: {s.first_failure or s.outcome}"
    if cell.status is not Status.PASSED and not bad:
        yield cell.first_problem() or str(cell.status)


def root_causes(cells: Sequence[CellReport]) -> list[RootCause]:
    """Every non-green suite (and every conflict or error) across cells, grouped by its normalised first
    failure: the most widespread first."""
    groups: dict[str, list[str]] = {}
    for cell in cells:
        for problem in _problems(cell):
            members = groups.setdefault(normalise(problem, cell.cell), [])
            if cell.cell not in members:
                members.append(cell.cell)
    ordered = sorted(groups.items(), key=lambda kv: -len(kv[1]))  # stable: first seen first among equals
    return [RootCause(reason=reason, cells=tuple(members)) for reason, members in ordered]


__all__ = [
    "COLOURS",
    "GREEN",
    "RootCause",
    "css",
    "normalise",
    "root_causes",
    "short",
    "suite_reason",
    "suite_text",
]
