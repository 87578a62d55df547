"""What the grids of summary.md, summary.html and index.html share: one table of colours, the words in each
grid cell, and failures grouped by root cause across cells (failures, then errors, then unanswered questions;
a suite a gate kept from running listed under that gate).

Nothing here judges: outcomes and statuses are stackfarm.verdict's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

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


#: A root cause's kind, in the order the reports rank them: what failed, then what errored (a suite, a cell
#: that never ran, a conflict), then the questions left unanswered (skipped or incomplete suites).
Severity = Literal["failed", "error", "unanswered"]
SEVERITIES: tuple[Severity, ...] = ("failed", "error", "unanswered")
_SEVERITY_OF: dict[str, Severity] = {
    "failed": "failed",
    "error": "error",
    "conflict": "failed",  # a conflict fails the run (exit 1): the cell contradicts SGLang's own pins
    "skipped": "unanswered",
    "incomplete": "unanswered",
}
#: How the reports name each kind, and the colour class (grid.COLOURS) its mark takes.
SEVERITY_TEXT: dict[str, str] = {"failed": "failed", "error": "error", "unanswered": "unanswered"}
SEVERITY_CLASS: dict[str, str] = {"failed": "failed", "error": "error", "unanswered": "incomplete"}
#: The skip the runner writes for a suite behind a gate that did not pass (stackfarm.runner._run_suites).
_GATED = re.compile(r"\bgated: (?P<gate>\S+) did not pass\b")


def gate_of(s: SuiteResult) -> str | None:
    """The gate suite that kept `s` from running (the runner's "gated: <gate> did not pass" skip), or None."""
    if s.outcome != "skipped":
        return None
    found = _GATED.search(s.first_failure or "")
    return found["gate"] if found else None


@dataclass(frozen=True, kw_only=True)
class RootCause:
    """One normalised reason, the cells that share it, how bad it is, and the suites gated off behind it."""

    reason: str
    cells: tuple[str, ...]
    severity: Severity = "failed"
    #: Suites that did not run because this one (a gate) did not pass, in any of `cells`.
    gated: tuple[str, ...] = ()

    def line(self) -> str:
        n = len(self.cells)
        return f"{n} cell{'' if n == 1 else 's'}: {self.reason}"


@dataclass(frozen=True)
class _Problem:
    severity: Severity
    text: str
    #: The suite it is about ("" for a cell's own problem).
    suite: str = ""


def _problems(cell: CellReport) -> Iterable[_Problem]:
    if cell.status in (Status.CONFLICT, Status.ERROR):
        yield _Problem(_SEVERITY_OF[str(cell.status)], f"{cell.status}: {cell.reason or cell.status}")
        return
    if not cell.ran:
        return  # excluded on purpose: not a failure
    bad = [s for s in cell.suites if s.outcome not in GREEN]
    for s in bad:
        yield _Problem(
            _SEVERITY_OF.get(s.outcome, "error"), f"{s.suite}: {s.first_failure or s.outcome}", s.suite
        )
    if cell.status is not Status.PASSED and not bad:
        yield _Problem(
            _SEVERITY_OF.get(str(cell.status), "unanswered"), cell.first_problem() or str(cell.status)
        )


def root_causes(cells: Sequence[CellReport]) -> list[RootCause]:
    """Every non-green suite (and every conflict or error) across cells, grouped by its normalised first
    failure: failures first, then errors, then unanswered questions; the most widespread first within each.
    A suite skipped because its gate did not pass is no root cause of its own: it is listed under the gate's."""
    groups: dict[tuple[Severity, str], list[str]] = {}
    gated: dict[tuple[Severity, str], list[str]] = {}
    for cell in cells:
        problems = list(_problems(cell))
        keys = {p.suite: (p.severity, normalise(p.text, cell.cell)) for p in problems if p.suite}
        behind = {s.suite: gate for s in cell.suites if (gate := gate_of(s)) is not None and gate in keys}
        for problem in problems:
            if problem.suite in behind:
                under = gated.setdefault(keys[behind[problem.suite]], [])
                if problem.suite not in under:
                    under.append(problem.suite)
                continue
            members = groups.setdefault((problem.severity, normalise(problem.text, cell.cell)), [])
            if cell.cell not in members:
                members.append(cell.cell)
    ranked = sorted(groups.items(), key=lambda kv: (SEVERITIES.index(kv[0][0]), -len(kv[1])))  # stable
    return [
        RootCause(
            reason=reason,
            cells=tuple(members),
            severity=severity,
            gated=tuple(gated.get((severity, reason), ())),
        )
        for (severity, reason), members in ranked
    ]


__all__ = [
    "COLOURS",
    "GREEN",
    "SEVERITIES",
    "SEVERITY_CLASS",
    "SEVERITY_TEXT",
    "RootCause",
    "Severity",
    "css",
    "gate_of",
    "normalise",
    "root_causes",
    "short",
    "suite_reason",
    "suite_text",
]
