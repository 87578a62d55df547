"""The merged ``reports/junit.xml`` and the human summaries (``summary.md``, ``summary.html``) of a run.

Every cell's verdict comes from stackfarm.verdict; nothing here judges. Every file is written atomically, so
an interrupted run never leaves a half-written report.

The merged file lists every planned cell (passed, failed, incomplete, conflict, excluded, error) and is valid
xunit2 (stackfarm.junit.write_xml): a testsuite ``<cell>::<suite>`` per suite (``<cell>::plan`` for a cell
that never ran) carrying the cell's properties, the suite's own, and its testcases' properties as
``<testcase name>::<property>`` (xunit2 has no testcase properties); testcase classnames are
``<cell>.<suite>.<module>``, so tools that group by class keep cells apart; a failure's message starts with
its location, ``path:line: ...`` (pytest's crash line, or matrix.toml[:line] for a conflict or plan error).
No report holds a credential: every URL's ``user:password@`` is removed before a file is written
(stackfarm.indexauth.scrub), whatever a suite printed or an older verdict kept.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from pathlib import Path

from junitparser import JUnitXml, TestCase, TestSuite

from . import indexauth, junit
from .files import write_atomic, write_bytes_atomic
from .junit import Step, write_skipped_suite, write_steps
from .sections.grid import (
    COLOURS,
    SEVERITY_CLASS,
    SEVERITY_TEXT,
    css,
    root_causes,
    short,
    suite_reason,
    suite_text,
)
from .verdict import CellReport, Outcome, Status, SuiteResult, read_suite, totals

__all__ = [
    "COLOURS",
    "CellReport",
    "Step",
    "SuiteResult",
    "matrix_location",
    "merge",
    "read_suite",
    "summary_html",
    "summary_markdown",
    "write_atomic",
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


def matrix_location(cell: CellReport, shown: str = "matrix.toml") -> str:
    """Where in matrix.toml a cell that never ran comes from, as the plan typed it (`CellReport.declared_at`):
    "matrix.toml:<line>" of the [[include]] that made a conflict, else of the [axes] entry of the axis it
    contradicts; a config error's own "file:line"; "matrix.toml" alone when the line is not known."""
    where = cell.declared_at
    if where is None or where.line is None:
        return shown
    if cell.status is Status.CONFLICT:
        return f"{shown}:{where.line}"
    return f"{where.path}:{where.line}"


def _classname(cell: str, suite: str, original: str) -> str:
    module = original.removeprefix("suites.").removeprefix(f"{suite}.") if original else ""
    if module in ("", suite, f"{cell}.{suite}"):
        return f"{cell}.{suite}"
    return f"{cell}.{suite}.{module}"


def _merged_suite(cell: CellReport, res: SuiteResult, where: str | None = None) -> TestSuite:
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
    for case in cases:
        junit.with_location(case, where)
        case.classname = _classname(cell.cell, res.suite, str(case.classname or ""))
    ts.add_testcases(cases)
    return ts


def merge(cells: Sequence[CellReport], out: Path, *, matrix: Path | None = None) -> None:
    """Write one xunit2 JUnit file with a testsuite ``<cell>::<suite>`` per suite (``<cell>::plan`` for cells
    that never ran, located in `matrix`: by default the matrix.toml beside the reports folder), each carrying
    the cell's properties; root totals are recomputed."""
    matrix = matrix if matrix is not None else out.parent.parent / "matrix.toml"
    try:
        shown = matrix.resolve().relative_to(out.parent.parent.resolve()).as_posix()
    except ValueError:
        shown = str(matrix)
    root = JUnitXml("stackfarm")
    for cell in cells:
        if cell.status in _PLAN_RESULT:
            res = SuiteResult(
                cell=cell.cell,
                suite="plan",
                outcome=_PLAN_RESULT[cell.status],
                tests=1,
                failures=0,
                errors=0,
                skipped=0,
                time=0.0,
                first_failure=cell.reason or cell.status,
                xml=None,
            )
            where = None if cell.status is Status.EXCLUDED else matrix_location(cell, shown)
            junit.append(root, _merged_suite(cell, res, where))
            continue
        for res in cell.suites:
            junit.append(root, _merged_suite(cell, res))
    junit.write_xml(out, root)
    text = out.read_bytes().decode("utf-8", "surrogateescape")
    if (clean := indexauth.scrub(text)) != text:  # a suite's output may have named a URL with its password
        write_bytes_atomic(out, clean.encode("utf-8", "surrogateescape"))


# --------------------------------------------------------------------------- summaries

_ICON = {
    "passed": "✅",
    "failed": "❌",
    "skipped": "⏭",
    "incomplete": "🟡",
    "not_applicable": "·",
    "error": "💥",
}
_STATUS_ICON = {**_ICON, "conflict": "⚠️", "excluded": "⏭"}


def _suite_names(cells: Iterable[CellReport]) -> list[str]:
    return sorted({s.suite for c in cells for s in c.suites})


def _md(text: str, limit: int = 160) -> str:
    text = short(text, limit)
    # GitHub renders raw HTML in markdown: backslash-escape what would open a tag or an entity, so
    # "<Foo at 0x..>" stays visible and inert, and the text reads the same in a terminal (no &lt;).
    for char in "\\|<>&":
        text = text.replace(char, "\\" + char)
    return text.replace("`", "'")


def _md_row(cols: Iterable[str]) -> str:
    return "| " + " | ".join(cols) + " |"


def _md_suite(s: SuiteResult) -> str:
    """A suite's grid cell: its counts, and why when it is not green ("❌ 1 of 3 failed: test_bad: ...")."""
    why = suite_reason(s)
    return f"{_ICON[s.outcome]} {_md(suite_text(s))}" + (f": {_md(why, 90)}" if why else "")


#: How each kind of root cause is marked in summary.md (its words are grid.SEVERITY_TEXT).
_SEVERITY_ICON = {"failed": _ICON["failed"], "error": _ICON["error"], "unanswered": _ICON["incomplete"]}


def causes_markdown(cells: Sequence[CellReport]) -> list[str]:
    """The failures grouped by root cause across cells, failures first, then errors, then unanswered
    questions: "- ❌ failed: 3 cells: <reason> — `a`, `b`, `c`", the suites a gate kept from running under it."""
    found = root_causes(cells)
    if not found:
        return []
    lines = ["", "**Failures by root cause** (failed, then errors, then unanswered questions)", ""]
    for c in found:
        head = f"{_SEVERITY_ICON[c.severity]} {SEVERITY_TEXT[c.severity]}: {_md(c.line(), 300)}"
        lines.append(f"- {head} — " + ", ".join(f"`{_md(cell)}`" for cell in c.cells))
        if c.gated:
            lines.append(f"  - gated off behind it (not run): {', '.join(_md(g) for g in c.gated)}")
    return lines


def summary_markdown(cells: Sequence[CellReport], *, title: str = "stackfarm matrix") -> str:
    names = _suite_names(cells)
    lines = [f"## {_md(title)}", ""]
    lines.append(_md_row(["cell", *(_md(n) for n in names), "status", "first failure"]))
    lines.append(_md_row(["---"] * (len(names) + 3)))
    for c in cells:
        by_name = {s.suite: s for s in c.suites}
        grid = [_md_suite(by_name[n]) if n in by_name else "—" for n in names]
        verdict = str(c.status)
        status = f"{_STATUS_ICON[verdict]} {c.status_text()}" + (" (reused)" if c.reused else "")
        lines.append(_md_row([f"`{_md(c.cell)}`", *grid, status, _md(c.first_problem())]))
    problems = [c for c in cells if c.status in (Status.CONFLICT, Status.ERROR)]
    if problems:
        lines += ["", "**Conflicts and errors**", ""]
        lines += [f"- `{_md(c.cell)}` — {c.status}: {_md(c.reason, 400)}" for c in problems]
    lines += causes_markdown(cells)
    lines += ["", f"**{totals(cells)}**", ""]
    return "\n".join(lines)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }
table { border-collapse: collapse; margin-bottom: 1rem; }
th, td { border: 1px solid #ccc; padding: .3rem .6rem; text-align: left; vertical-align: top; }
/* A long test id or message wraps inside its cell instead of running into the next one. */
th, td, li { overflow-wrap: anywhere; word-break: break-word; }
td.o { font-weight: 600; max-width: 260px; }
.sev { padding: 0 .45em; border-radius: .6em; font-size: .8em; font-weight: 600; }
.gated { font-size: .85em; color: #57606a; }
.why { display: block; font-weight: 400; font-size: .8em; margin-top: 2px; }
.fail { font-family: monospace; font-size: .85em; }
details { margin: .3rem 0; } code { font-size: .9em; }
""" + css()


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
                tds.append('<td class="o o-missing" data-outcome="missing">—</td>')
                continue
            why = suite_reason(s)
            under = f'<span class="why">{e(short(why, 140))}</span>' if why else ""
            tds.append(
                f'<td class="o o-{e(s.outcome)}" data-outcome="{e(s.outcome)}">{e(suite_text(s))}{under}</td>'
            )
        verdict = str(c.status)
        reused = " (reused)" if c.reused else ""
        rows.append(
            f'<tr data-cell="{e(c.cell)}"><th><code>{e(c.cell)}</code></th>{"".join(tds)}'
            f'<td class="o v-{e(verdict)}" data-outcome="{e(verdict)}">{e(c.status_text())}'
            f'{e(reused)}</td><td class="fail">{e(c.first_problem())}</td></tr>'
        )
    causes = "".join(
        f'<li data-cells="{len(rc.cells)}" data-severity="{rc.severity}"><span class="sev v-{SEVERITY_CLASS[rc.severity]}">'
        f"{e(SEVERITY_TEXT[rc.severity])}</span> <strong>{e(rc.line())}</strong> — "
        f"{', '.join(f'<code>{e(x)}</code>' for x in rc.cells)}"
        + (
            f'<br><span class="gated">gated off behind it (not run): {e(", ".join(rc.gated))}</span>'
            if rc.gated
            else ""
        )
        + "</li>"
        for rc in root_causes(cells)
    )
    details: list[str] = []
    for c in cells:
        props = "".join(
            f"<tr><th>{e(k)}</th><td><code>{e(v)}</code></td></tr>" for k, v in sorted(c.properties.items())
        )
        reason = f"<p>{e(c.reason)}</p>" if c.reason else ""
        details.append(
            f"<details><summary><code>{e(c.cell)}</code> — {e(c.status_text())}</summary>{reason}"
            f"<table>{props or '<tr><td>no properties</td></tr>'}</table></details>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>\n"
        f"<h1>{e(title)}</h1>\n"
        f"<table><thead><tr><th>cell</th>{head}<th>status</th><th>first failure</th></tr></thead>\n"
        f"<tbody>\n{chr(10).join(rows)}\n</tbody></table>\n"
        f"<p><strong>{e(totals(cells))}</strong></p>\n"
        + (
            "<h2>Failures by root cause</h2><p>Failed first, then errors, then unanswered questions (skipped or "
            f'incomplete suites).</p><ul class="causes">{causes}</ul>\n'
            if causes
            else ""
        )
        + f"<h2>Cells</h2>\n{chr(10).join(details)}\n</body></html>\n"
    )


def write_summaries(cells: Sequence[CellReport], reports_dir: Path, *, matrix: Path | None = None) -> None:
    """junit.xml, summary.md and summary.html of these cells (every planned cell: the caller lists them)."""
    merge(cells, reports_dir / "junit.xml", matrix=matrix)
    write_atomic(reports_dir / "summary.md", indexauth.scrub(summary_markdown(cells)))
    write_atomic(reports_dir / "summary.html", indexauth.scrub(summary_html(cells)))
