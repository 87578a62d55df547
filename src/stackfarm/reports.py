"""The merged ``reports/junit.xml`` and the human summaries (``summary.md``, ``summary.html``) of a run.

Every cell's verdict comes from stackfarm.verdict; nothing here judges. Every file is written atomically, so
an interrupted run never leaves a half-written report.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from pathlib import Path

from junitparser import JUnitXml, TestCase, TestSuite

from . import junit
from .files import write_atomic, write_bytes_atomic
from .junit import Step, write_skipped_suite, write_steps
from .verdict import CellReport, Outcome, Status, SuiteResult, read_suite, totals

__all__ = [
    "CellReport",
    "Step",
    "SuiteResult",
    "merge",
    "read_suite",
    "summary_html",
    "summary_markdown",
    "write_atomic",
    "write_bytes_atomic",
    "write_skipped_suite",
    "write_steps",
    "write_summaries",
]


# --------------------------------------------------------------------------- merged JUnit

_PLAN_RESULT: dict[Status, Outcome] = {
    Status.EXCLUDED: "skipped",
    Status.CONFLICT: "error",
    Status.ERROR: "error",
}


def _merged_suite(cell: CellReport, res: SuiteResult) -> TestSuite:
    ts = TestSuite(f"{cell.cell}::{res.suite}")
    for key, value in sorted(cell.properties.items()):
        ts.add_property(key, value)
    ts.add_property("stackfarm.cell", cell.cell)
    ts.add_property("stackfarm.suite", res.suite)
    cases: list[TestCase] = []
    try:
        source = junit.load(res.xml) if res.xml is not None else None
    except junit.UNREADABLE:
        source = None
    for orig in source or ():
        if ts.timestamp is None and orig.timestamp is not None:
            ts.timestamp, ts.hostname = orig.timestamp, orig.hostname
        for prop in orig.properties():  # type: ignore[no-untyped-call]  # junitparser: unannotated
            ts.add_property(str(prop.name), str(prop.value))
        cases.extend(orig)
    if res.outcome in ("failed", "error") and not any(c.is_failure or c.is_error for c in cases):
        # The runner's verdict is red but no case says so (0 tests, crashed pytest, missing file):
        # record it, so junit.xml is never greener than the summary.
        cases.append(junit.one_case(res.suite, res.outcome, res.first_failure or f"suite {res.outcome}"))
    elif source is None:
        cases.append(junit.one_case(res.suite, res.outcome, res.first_failure or f"suite {res.outcome}"))
    ts.add_testcases(cases)
    return ts


def merge(cells: Sequence[CellReport], out: Path) -> None:
    """Write one JUnit file with a testsuite ``<cell>::<suite>`` per suite (``<cell>::plan`` for cells
    that never ran), each carrying the cell's properties; root totals are recomputed."""
    root = JUnitXml("stackfarm")
    for cell in cells:
        if cell.status in _PLAN_RESULT:
            res = SuiteResult(
                cell=cell.cell, suite="plan", outcome=_PLAN_RESULT[cell.status], tests=1, failures=0,
                errors=0, skipped=0, time=0.0, first_failure=cell.reason or cell.status, xml=None,
            )  # fmt: skip
            junit.append(root, _merged_suite(cell, res))
            continue
        for res in cell.suites:
            junit.append(root, _merged_suite(cell, res))
    junit.write_xml(out, root)


# --------------------------------------------------------------------------- summaries

_ICON = {
    "passed": "✅",
    "failed": "❌",
    "skipped": "⏭",
    "incomplete": "⏭",
    "not_applicable": "·",
    "error": "💥",
}
_STATUS_ICON = {**_ICON, "conflict": "⚠️", "excluded": "⏭"}


def _grid_text(s: SuiteResult) -> str:
    if s.outcome == "passed":
        return f"✅ {s.passed}/{s.tests}"
    if s.outcome == "incomplete":
        return f"⏭ {s.passed}/{s.tests}, {s.skipped} skipped"
    if s.outcome == "failed":
        return f"❌ {s.failures} failed" if s.failures else "❌ failed"
    return f"{_ICON[s.outcome]} {s.outcome}"


def _suite_names(cells: Iterable[CellReport]) -> list[str]:
    return sorted({s.suite for c in cells for s in c.suites})


def _md(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    # GitHub renders raw HTML in markdown: backslash-escape what would open a tag or an entity, so
    # "<Foo at 0x..>" stays visible and inert, and the text reads the same in a terminal (no &lt;).
    for char in "\\|<>&":
        text = text.replace(char, "\\" + char)
    return text.replace("`", "'")


def _md_row(cols: Iterable[str]) -> str:
    return "| " + " | ".join(cols) + " |"


def summary_markdown(cells: Sequence[CellReport], *, title: str = "stackfarm matrix") -> str:
    names = _suite_names(cells)
    lines = [f"## {_md(title)}", ""]
    lines.append(_md_row(["cell", *(_md(n) for n in names), "status", "first failure"]))
    lines.append(_md_row(["---"] * (len(names) + 3)))
    for c in cells:
        by_name = {s.suite: s for s in c.suites}
        grid = [_grid_text(by_name[n]) if n in by_name else "—" for n in names]
        verdict = str(c.status)
        status = f"{_STATUS_ICON[verdict]} {verdict}" + (" (reused)" if c.reused else "")
        lines.append(_md_row([f"`{_md(c.cell)}`", *grid, status, _md(c.first_problem())]))
    problems = [c for c in cells if c.status in (Status.CONFLICT, Status.ERROR)]
    if problems:
        lines += ["", "**Conflicts and errors**", ""]
        lines += [f"- `{_md(c.cell)}` — {c.status}: {_md(c.reason, 400)}" for c in problems]
    lines += ["", f"**{totals(cells)}**", ""]
    return "\n".join(lines)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }
table { border-collapse: collapse; margin-bottom: 1rem; }
th, td { border: 1px solid #ccc; padding: .3rem .6rem; text-align: left; vertical-align: top; }
td.passed { background: #d4f4d4; } td.failed { background: #f8d0d0; }
td.skipped, td.incomplete, td.excluded, td.none { background: #e6e6e6; color: #555; }
td.error, td.conflict { background: #fde0b8; }
.counts { font-size: .8em; color: #444; display: block; } .fail { font-family: monospace; font-size: .85em; }
details { margin: .3rem 0; } code { font-size: .9em; }
"""


def summary_html(cells: Sequence[CellReport], *, title: str = "stackfarm matrix") -> str:
    e = html.escape
    names = _suite_names(cells)
    head = "".join(f"<th>{e(n)}</th>" for n in names)
    rows: list[str] = []
    for c in cells:
        by_name = {s.suite: s for s in c.suites}
        tds: list[str] = []
        for n in names:
            s = by_name.get(n)
            if s is None:
                tds.append('<td class="none">—</td>')
                continue
            counts = f"{s.passed}/{s.failures}/{s.skipped}/{s.errors}"
            tds.append(
                f'<td class="{e(s.outcome)}">{_ICON[s.outcome]} {e(s.outcome)}'
                f'<span class="counts" title="passed/failed/skipped/error">{e(counts)}</span></td>'
            )
        verdict = str(c.status)
        reused = " (reused)" if c.reused else ""
        rows.append(
            f"<tr><th><code>{e(c.cell)}</code></th>{''.join(tds)}"
            f'<td class="{e(verdict)}">{_STATUS_ICON[verdict]} {e(verdict)}{e(reused)}</td>'
            f'<td class="fail">{e(c.first_problem())}</td></tr>'
        )
    details: list[str] = []
    for c in cells:
        props = "".join(
            f"<tr><th>{e(k)}</th><td><code>{e(v)}</code></td></tr>" for k, v in sorted(c.properties.items())
        )
        reason = f"<p>{e(c.reason)}</p>" if c.reason else ""
        details.append(
            f"<details><summary><code>{e(c.cell)}</code> — {e(str(c.status))}</summary>{reason}"
            f"<table>{props or '<tr><td>no properties</td></tr>'}</table></details>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>\n"
        f"<h1>{e(title)}</h1>\n"
        f"<table><thead><tr><th>cell</th>{head}<th>status</th><th>first failure</th></tr></thead>\n"
        f"<tbody>\n{chr(10).join(rows)}\n</tbody></table>\n"
        f"<p><strong>{e(totals(cells))}</strong></p>\n<h2>Cells</h2>\n{chr(10).join(details)}\n"
        "</body></html>\n"
    )


def write_summaries(cells: Sequence[CellReport], reports_dir: Path) -> None:
    merge(cells, reports_dir / "junit.xml")
    write_atomic(reports_dir / "summary.md", summary_markdown(cells))
    write_atomic(reports_dir / "summary.html", summary_html(cells))
