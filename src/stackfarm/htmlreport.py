"""The HTML report people read: a coloured grid of cells x suites, and one page per cell behind it.

``reports/index.html`` is the grid: each suite's counts with, under every non-green one, why (the first
failure, not only on hover), the verdict of each cell, then the failures grouped by root cause across cells.
Its colours are stackfarm.sections.grid.COLOURS, the table summary.html uses too (amber: incomplete).

``reports/<cell>/index.html`` is the cell: its suites and stack, then one section per suite family that the
suite's own renderer draws (stackfarm.sections: the runner's patches, capability findings, the EAGLE-3
contract, numerics, throughput), then every testcase; figures over time when ``reports/history.json`` is
there (``stackfarm report --history``).

Everything is one file per page: inline CSS, plots as inline SVG (no matplotlib, no scripts, no external
resources), so a report copied off a CI runner opens anywhere.

    python -m stackfarm.htmlreport [--reports reports]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import families, indexauth, sections
from .files import write_atomic
from .history import CellRun, History, Run, Series, SuiteRun, from_json, read_run
from .sections import grid
from .sections.grid import (
    COLOURS,
    SEVERITY_CLASS,
    SEVERITY_TEXT,
    root_causes,
    short,
    suite_reason,
    suite_text,
)
from .sections.html import Bar, badge, bar_chart, e, line_chart, table, trend_charts
from .verdict import CellReport

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1f2328;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de}
h3{font-size:15px;margin:18px 0 6px}h1 code{font-size:19px}a{color:#0969da}code,pre{font:12px ui-monospace,SFMono-Regular,monospace}
pre{background:#f6f8fa;padding:8px;overflow:auto;max-height:420px;border-radius:6px}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;
vertical-align:top}thead th{background:#f6f8fa}
th,td,.causes li{overflow-wrap:anywhere;word-break:break-word}
table.grid td.o{font-weight:600;text-align:center;min-width:92px;max-width:260px}
table.grid td.o .why{display:block;font-weight:400;font-size:11px;text-align:left;margin-top:2px}
table.grid th.cell a{font:600 13px ui-monospace,monospace}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;font-size:12px}
.muted{color:#57606a}.legend span{margin-right:6px}.why{max-width:560px;font-size:12px}
details{margin:4px 0}summary{cursor:pointer}svg{display:block;margin:6px 0}
.charts{display:flex;flex-wrap:wrap;gap:8px}.causes li{margin:2px 0}.gated{font-size:12px;color:#57606a}
""" + grid.css()


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


# --------------------------------------------------------------------------- the grid


def _suite_names(run: Run) -> list[str]:
    return sorted({s.result.suite for c in run.cells.values() for s in c.suites})


def _grid_cell(suite: SuiteRun | None) -> str:
    if suite is None:
        return '<td class="o o-missing" data-outcome="missing" title="not run">—</td>'
    res = suite.result
    why = suite_reason(res)
    under = f'<span class="why">{e(short(why, 140))}</span>' if why else ""
    return (
        f'<td class="o o-{res.outcome}" data-outcome="{res.outcome}" title="{e(why or res.outcome)}">'
        f"{e(suite_text(res))}{under}</td>"
    )


def causes_html(cells: Sequence[CellReport]) -> str:
    """The failures grouped by root cause across cells, failures first, then errors, then unanswered
    questions: one line "failed 3 cells: <reason>", the cells under it, then the suites its gate kept from
    running."""
    found = root_causes(cells)
    if not found:
        return ""
    items = "".join(
        f'<li data-cells="{len(c.cells)}" data-severity="{c.severity}">'
        f"{badge(SEVERITY_CLASS[c.severity], SEVERITY_TEXT[c.severity])} <strong>{e(c.line())}</strong><br>"
        + ", ".join(f'<a href="{e(cell)}/index.html"><code>{e(cell)}</code></a>' for cell in c.cells)
        + (
            f'<br><span class="gated">gated off behind it (not run): {e(", ".join(c.gated))}</span>'
            if c.gated
            else ""
        )
        + "</li>"
        for c in found
    )
    return (
        '<h2>Failures by root cause</h2><p class="muted">Failed first, then errors, then unanswered questions '
        f'(skipped or incomplete suites).</p><ul class="causes">{items}</ul>'
    )


def index_page(run: Run, *, links: Sequence[tuple[str, str]] = ()) -> str:
    suites = _suite_names(run)
    rows = []
    counts: dict[str, int] = {}
    for cell_id, cell in run.cells.items():
        verdict = cell.verdict
        counts[verdict] = counts.get(verdict, 0) + 1
        link = f'<a href="{e(cell_id)}/index.html">{e(cell_id)}</a>'
        if not cell.report.ran:
            tds = (
                f'<td class="o v-{verdict}" data-outcome="{verdict}" colspan="{max(len(suites), 1)}">'
                f'<span class="why">{e(short(cell.report.reason, 300))}</span></td>'
            )
        else:
            tds = "".join(_grid_cell(cell.suite(s)) for s in suites)
        reused = " (reused)" if cell.report.reused else ""
        rows.append(
            f'<tr data-cell="{e(cell_id)}" data-verdict="{verdict}"><th class="cell">{link}</th>{tds}'
            f'<td class="o v-{verdict}" data-outcome="{verdict}">{e(verdict)}{e(reused)}</td></tr>'
        )
    head = "".join(f"<th>{e(s)}</th>" for s in suites) or "<th>suites</th>"
    total = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no cells"
    legend = " ".join(
        badge(k)
        for k in ("passed", "failed", "error", "incomplete", "skipped", "missing", "conflict", "excluded")
    )
    extra = " · ".join(f'<a href="{e(href)}">{e(text)}</a>' for text, href in links)
    problems = "".join(f"<li>{e(p)}</li>" for p in run.problems)
    body = (
        "<h1>stackfarm report</h1>"
        f'<p class="muted">{len(run.cells)} cells: {e(total)}'
        + (f" · latest suite run {e(run.time)}" if run.time else "")
        + (f" · {extra}" if extra else "")
        + "</p>"
        f'<table class="grid"><thead><tr><th>cell</th>{head}<th>verdict</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        f'<p class="legend">{legend}</p>'
        '<p class="muted">A cell passes only when every suite ran and passed; a skipped testcase makes it '
        "incomplete (amber), never passed. "
        "Click a cell for its stack, patches, findings and figures.</p>"
        + causes_html([c.report for c in run.cells.values()])
        + (f"<h2>Unreadable files</h2><ul>{problems}</ul>" if problems else "")
    )
    return _page("stackfarm report", body)


# --------------------------------------------------------------------------- a cell


def _stack(cell: CellRun) -> str:
    """The cell's axes and wheels, from the verdict's typed fields (its JUnit properties are only written)."""
    report = cell.report
    wheels = {w.distribution: w for w in report.wheels}
    rows = [
        (f"<code>{e(d)}</code>", e(w.version), f"<code>{e(w.sha256)}</code>", e(w.source))
        for d, w in sorted(wheels.items())
    ]
    axes = list(report.values.items())
    out = "<h2>Stack</h2>"
    out += "<p>" + " · ".join(f"{e(k)} <strong>{e(v)}</strong>" for k, v in axes) + "</p>" if axes else ""
    out += table(("distribution", "version", "wheel sha256", "index"), rows) if rows else ""
    if report.overridden:
        out += f"<p>Overrides: {e('; '.join(report.overridden))}</p>"
    if report.input_hash:
        out += f'<p class="muted">input hash <code>{e(report.input_hash)}</code></p>'
    return out


def _suites(cell: CellRun) -> str:
    rows = []
    for suite in cell.suites:
        r = suite.result
        xml = f'<a href="{e(r.suite)}.xml">{e(r.suite)}</a>'
        rows.append(
            (
                xml,
                badge(r.outcome),
                str(r.tests),
                str(r.passed),
                str(r.failures + r.errors),
                str(r.skipped),
                str(r.not_applicable),
                f"{r.time:.1f}s",
                e(r.first_failure or ""),
            )
        )
    if not rows:
        return f"<h2>Suites</h2><p>No suite ran: {e(cell.report.status)} — {e(cell.report.reason)}</p>"
    return "<h2>Suites</h2>" + table(
        ("suite", "outcome", "tests", "passed", "failed", "skipped", "n/a", "time", "first failure"), rows
    )


def _other_cases(cell: CellRun) -> str:
    out = "<h2>All testcases</h2>"
    for suite in cell.suites:
        rows = [
            (
                badge(c.outcome),
                f"<code>{e(c.name)}</code>",
                f"{c.time:.2f}s",
                e(c.message[:300]),
                e("; ".join(f"{k}={v if len(v) <= 80 else v[:77] + '…'}" for k, v in c.properties.items())),
            )
            for c in suite.cases
        ]
        out += (
            f"<details><summary>{e(suite.result.suite)}: {len(rows)} testcases</summary>"
            + table(("outcome", "testcase", "time", "message", "properties"), rows)
            + "</details>"
        )
    return out


def cell_page(
    cell: CellRun,
    trends: Mapping[str, list[tuple[str, float]]] | None = None,
    registry: sections.Families | None = None,
) -> str:
    """The cell's page; what its suites found is each suite family's own section (stackfarm.sections), from
    the `registry` of families (stackfarm.families: ./suites when none is given)."""
    trends = trends or {}
    registry = families.load(families.default_root()) if registry is None else registry
    verdict = cell.verdict
    head, _, rest = cell.report.reason.partition("\n")
    # The first line says what failed (a build error: the step and its error line); the rest keeps its lines.
    reason = (f"<p>{e(head)}</p>" if head else "") + (
        f'<pre class="reason">{e(rest)}</pre>' if rest.strip() else ""
    )
    body = (
        '<p><a href="../index.html">← all cells</a></p>'
        f"<h1><code>{e(cell.cell)}</code> {badge(verdict)}</h1>{reason}"
        + _suites(cell)
        + _stack(cell)
        + sections.render(cell, trends, registry)
    )
    others = {k: v for k, v in trends.items() if not sections.claimed(k.split("::", 1)[0], registry)}
    if others:
        body += "<h2>Figures over time</h2>" + trend_charts(others)
    if cell.suites:
        body += _other_cases(cell)
    return _page(f"stackfarm: {cell.cell}", body)


# --------------------------------------------------------------------------- history


def history_page(history: History) -> str:
    runs = [r.name for r in history.runs]
    verdicts = history.verdicts()
    rows = []
    for cell_id, by_run in verdicts.items():
        tds = "".join(
            f'<td class="o v-{by_run[r]}" data-outcome="{by_run[r]}">{e(by_run[r])}</td>'
            if r in by_run
            else '<td class="o o-missing" data-outcome="missing">—</td>'
            for r in runs
        )
        rows.append(f'<tr><th class="cell"><code>{e(cell_id)}</code></th>{tds}</tr>')
    changes = "".join(
        f"<li>{e(c.sentence())}"
        + ("<ul>" + "".join(f"<li>{e(m)}</li>" for m in c.suites) + "</ul>" if c.suites else "")
        + "</li>"
        for c in history.changes
    )
    per_cell = "".join(
        f"<details><summary><code>{e(cell)}</code></summary>{trend_charts(figs)}</details>"
        for cell, figs in sorted(history.series.items())
    )
    body = (
        f'<h1>stackfarm history</h1><p class="muted">{len(runs)} runs: {e(runs[0])} … {e(runs[-1])}</p>'
        "<h2>Verdicts</h2>"
        f'<table class="grid"><thead><tr><th>cell</th>{"".join(f"<th>{e(r)}</th>" for r in runs)}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        f"<h2>Verdict changes</h2><ul>{changes or '<li>none</li>'}</ul>"
        f"<h2>Figures over time</h2>{per_cell}"
    )
    return _page("stackfarm history", body)


def write_history(history: History, reports_dir: Path) -> Path:
    """reports/history.html: verdicts per run, the changes and every figure over time."""
    path = reports_dir / "history.html"
    write_atomic(path, indexauth.scrub(history_page(history)))
    return path


# --------------------------------------------------------------------------- writing


def _trends(reports_dir: Path) -> Series:
    path = reports_dir / "history.json"
    try:
        return from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _links(reports_dir: Path) -> list[tuple[str, str]]:
    known = [("summary", "summary.html"), ("merged JUnit", "junit.xml"), ("history", "history.html")]
    links = [(text, href) for text, href in known if (reports_dir / href).is_file()]
    records = sorted((reports_dir / "qualifications").glob("*.md"))
    links += [(f"qualified: {p.stem}", f"qualifications/{p.name}") for p in records]
    return links


def write(
    reports_dir: Path, cells: Sequence[CellReport] | None = None, *, suites: Path | None = None
) -> list[Path]:
    """Write ``index.html`` and ``<cell>/index.html`` under `reports_dir`. `cells` is the runner's list
    (conflicts and errors included); without it the cells are read back from ``*/verdict.json``. `suites`: the
    suites folder whose families render their sections (stackfarm.families; ./suites when None)."""
    registry = families.load(suites if suites is not None else families.default_root())
    run = read_run(reports_dir, cells)
    trends = _trends(reports_dir)
    written = []
    for cell_id, cell in run.cells.items():
        path = reports_dir / cell_id / "index.html"
        write_atomic(path, indexauth.scrub(cell_page(cell, trends.get(cell_id), registry)))
        written.append(path)
    index = reports_dir / "index.html"
    write_atomic(index, indexauth.scrub(index_page(run, links=_links(reports_dir))))
    return [index, *written]


__all__ = [
    "COLOURS",
    "Bar",
    "bar_chart",
    "causes_html",
    "cell_page",
    "history_page",
    "index_page",
    "line_chart",
    "trend_charts",
    "write",
]
