"""The HTML report people read: a coloured grid of cells x suites, and one page per cell behind it.

``reports/index.html`` is the grid; ``reports/<cell>/index.html`` is the cell: its stack, its suites, and what
the suites found, read from the testcase properties of each suite's JUnit file:

- capability findings: testcases carrying ``arch`` and ``verdict`` (10-capability), plus the suite's
  ``capability.<arch>.<component>`` grid;
- patch statuses: ``patch.<set>/<patch>.status`` anywhere (cell, suite or testcase properties), and the
  hashes of the patch sets (``patches.<set>.sha256``);
- the derived EAGLE-3 contract: ``contract`` / ``contract_diff`` / ``verdict_diff``, and the per-class
  findings (``model_class``, ``method``, ``verdict``) of 20-eagle3;
- equivalence figures: testcases carrying ``max_abs_err``, ``tolerance``, ``match_rate``,
  ``first_divergence`` or ``near_ties``;
- throughput: the numbers of suites named ``*throughput*`` / ``*perf*`` / ``*bench*``, plotted as bars
  (``threshold``, ``ci_low`` and ``ci_high`` of the same testcase are drawn on its bar), and over time when
  ``reports/history.json`` is there (``python -m stackfarm.history``).

Everything is one file per page: inline CSS, plots as inline SVG drawn here (no matplotlib, no scripts, no
external resources), so a report copied off a CI runner opens anywhere.

    python -m stackfarm.htmlreport [--reports reports]
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .files import write_atomic
from .history import Case, CellRun, History, Run, Series, SuiteRun, as_number, from_json, read_run, varying
from .verdict import CellReport

#: Fill colour of each outcome and verdict (GitHub's palette: readable with white text, tellable apart).
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
_THROUGHPUT_SUITE = re.compile(r"throughput|perf|bench", re.IGNORECASE)
_EQUIVALENCE_KEYS = ("max_abs_err", "tolerance", "match_rate", "first_divergence", "near_ties")
#: Testcase properties drawn on a throughput bar rather than as bars of their own.
_BAR_MARKS = ("threshold", "ci_low", "ci_high")
_PATCH_STATUS = re.compile(r"^patch\.(?P<name>.+)\.status$")
_PATCH_SET_HASH = re.compile(r"^patches\.(?P<set>.+)\.sha256$")
_CAPABILITY_GRID = re.compile(r"^capability\.(?P<arch>sm_[0-9a-z]+)\.(?P<component>.+)$")
_MAX_TREND_CHARTS = 24

e = html.escape

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1f2328;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de}
h3{font-size:15px;margin:18px 0 6px}h1 code{font-size:19px}a{color:#0969da}code,pre{font:12px ui-monospace,SFMono-Regular,monospace}
pre{background:#f6f8fa;padding:8px;overflow:auto;max-height:420px;border-radius:6px}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;
vertical-align:top}thead th{background:#f6f8fa}
table.grid td.o{color:#fff;font-weight:600;text-align:center;min-width:92px}
table.grid th.cell a{font:600 13px ui-monospace,monospace}
.o-missing{color:#57606a!important}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;font-size:12px}
.muted{color:#57606a}.legend span{margin-right:6px}.why{max-width:560px;font-size:12px}
details{margin:4px 0}summary{cursor:pointer}svg{display:block;margin:6px 0}
.charts{display:flex;flex-wrap:wrap;gap:8px}
""" + "".join(f".o-{kind},.v-{kind}{{background:{colour};color:#fff}}" for kind, colour in COLOURS.items())


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def _badge(kind: str, text: str | None = None) -> str:
    css = (
        f"o-{kind}"
        if kind in ("passed", "failed", "error", "skipped", "incomplete", "missing")
        else f"v-{kind}"
    )
    return f'<span class="badge {css}">{e(text or kind)}</span>'


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], css: str = "") -> str:
    """A table of already-escaped cells."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    cls = f' class="{css}"' if css else ""
    return (
        f"<table{cls}><thead><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


# --------------------------------------------------------------------------- plots (inline SVG)


@dataclass(frozen=True, kw_only=True)
class Bar:
    label: str
    value: float
    threshold: float | None = None
    low: float | None = None
    high: float | None = None


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def bar_chart(title: str, bars: Sequence[Bar], *, top: float | None = None) -> str:
    """Horizontal bars, one per label; a threshold is a black tick, a confidence interval a grey whisker.
    `top` fixes the scale's end (1.0 for rates), else it is 10 % past the largest value."""
    label_w, plot_w, row_h, top = 300, 320, 22, 24
    height = top + row_h * len(bars) + 8
    peak = max([b.value for b in bars] + [m for b in bars for m in (b.threshold, b.high) if m is not None])
    end = top if top is not None and top >= peak else peak * 1.1
    scale = plot_w / end if end > 0 else 0.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + plot_w + 70}" height="{height}" '
        f'role="img" aria-label="{e(title)}" class="bars">',
        f'<text x="0" y="15" font-size="13" font-weight="600">{e(title)}</text>',
    ]
    for i, bar in enumerate(bars):
        y = top + i * row_h
        width = max(bar.value, 0.0) * scale
        label = bar.label if len(bar.label) <= 46 else bar.label[:45] + "…"
        parts.append(
            f'<text x="0" y="{y + 15}" font-size="12">{e(label)}<title>{e(bar.label)}</title></text>'
        )
        parts.append(
            f'<rect x="{label_w}" y="{y + 3}" width="{width:.1f}" height="{row_h - 6}" fill="#0969da">'
            f"<title>{e(bar.label)}: {_fmt(bar.value)}</title></rect>"
        )
        parts.append(
            f'<text x="{label_w + width + 4:.1f}" y="{y + 15}" font-size="11">{_fmt(bar.value)}</text>'
        )
        if bar.low is not None and bar.high is not None:
            x1, x2, mid = label_w + bar.low * scale, label_w + bar.high * scale, y + row_h / 2
            parts.append(
                f'<path d="M{x1:.1f} {mid - 4}V{mid + 4}M{x1:.1f} {mid}H{x2:.1f}M{x2:.1f} {mid - 4}V{mid + 4}" '
                'stroke="#57606a" stroke-width="1.5" fill="none"/>'
            )
        if bar.threshold is not None:
            x = label_w + bar.threshold * scale
            parts.append(
                f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + row_h}" stroke="#1f2328" stroke-width="2">'
                f"<title>threshold {_fmt(bar.threshold)}</title></line>"
            )
    parts.append("</svg>")
    return "".join(parts)


def line_chart(title: str, points: Sequence[tuple[str, float]]) -> str:
    """A value over runs: one dot per run (its name and value on hover), the range on the left."""
    width, height, left, right, top, bottom = 420, 150, 56, 12, 24, 28
    values = [v for _, v in points]
    low, high = min(values), max(values)
    span = (high - low) or (abs(high) or 1.0)
    plot_w, plot_h = width - left - right, height - top - bottom

    def xy(i: int, v: float) -> tuple[float, float]:
        x = left + (plot_w * i / (len(points) - 1) if len(points) > 1 else plot_w / 2)
        return x, top + plot_h - (v - low) / span * plot_h

    coords = [xy(i, v) for i, (_, v) in enumerate(points)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
    shown = title if len(title) <= 62 else "…" + title[-61:]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{e(title)}" class="trend">',
        f'<text x="0" y="14" font-size="12" font-weight="600">{e(shown)}<title>{e(title)}</title></text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#f6f8fa" stroke="#d0d7de"/>',
        f'<text x="{left - 4}" y="{top + 10}" font-size="10" text-anchor="end">{_fmt(high)}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" font-size="10" text-anchor="end">{_fmt(low)}</text>',
        f'<polyline points="{path}" fill="none" stroke="#0969da" stroke-width="2"/>',
    ]
    for (run, value), (x, y) in zip(points, coords, strict=True):
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="#0969da"><title>{e(run)}: {_fmt(value)}</title></circle>'
        )
    parts.append(f'<text x="{left}" y="{height - 8}" font-size="10">{e(points[0][0])}</text>')
    if len(points) > 1:
        parts.append(
            f'<text x="{width - right}" y="{height - 8}" font-size="10" text-anchor="end">{e(points[-1][0])}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


# --------------------------------------------------------------------------- the grid


def _suite_names(run: Run) -> list[str]:
    return sorted({s.result.suite for c in run.cells.values() for s in c.suites})


def _grid_cell(suite: SuiteRun | None) -> str:
    if suite is None:
        return '<td class="o o-missing" data-outcome="missing" title="not run">—</td>'
    res = suite.result
    if res.outcome == "passed":
        text = f"{res.passed}/{res.tests}" + (f" ({res.skipped} skip)" if res.skipped else "")
    elif res.outcome == "skipped":
        text = "skipped"
    elif res.outcome == "incomplete":
        text = f"{res.passed}/{res.tests}, {res.skipped} skipped"
    elif res.outcome == "not_applicable":
        text = "n/a"
    else:
        text = f"{res.outcome} {res.failures + res.errors}/{res.tests}" if res.tests else res.outcome
    why = res.first_failure or next((c.message for c in suite.cases if c.outcome != "passed"), "")
    return (
        f'<td class="o o-{res.outcome}" data-outcome="{res.outcome}" title="{e(why or res.outcome)}">'
        f"{e(text)}</td>"
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
                f'<span class="why">{e(cell.report.reason[:300])}</span></td>'
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
        _badge(k)
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
        "incomplete, never passed. "
        "Click a cell for its stack, patches, findings and figures.</p>"
        + (f"<h2>Unreadable files</h2><ul>{problems}</ul>" if problems else "")
    )
    return _page("stackfarm report", body)


# --------------------------------------------------------------------------- a cell


def _all_properties(cell: CellRun) -> Iterable[tuple[str, str]]:
    yield from cell.report.properties.items()
    for suite in cell.suites:
        yield from suite.properties.items()
        for case in suite.cases:
            yield from case.properties.items()


def _stack(cell: CellRun) -> str:
    props = cell.report.properties
    axes = [(k.removeprefix("axis."), v) for k, v in props.items() if k.startswith("axis.")]
    dists = sorted(
        {k.rsplit(".", 1)[0] for k in props if k.endswith(".version") and not k.startswith("axis.")}
    )
    rows = [
        (
            f"<code>{e(d)}</code>",
            e(props.get(f"{d}.version", "")),
            f"<code>{e(props.get(f'{d}.sha256', ''))}</code>",
            e(props.get(f"{d}.source", "")),
        )
        for d in dists
    ]
    out = "<h2>Stack</h2>"
    out += "<p>" + " · ".join(f"{e(k)} <strong>{e(v)}</strong>" for k, v in axes) + "</p>" if axes else ""
    out += _table(("distribution", "version", "wheel sha256", "index"), rows) if rows else ""
    if props.get("overridden"):
        out += f"<p>Overrides: {e(props['overridden'])}</p>"
    if props.get("stackfarm.input_hash"):
        out += f'<p class="muted">input hash <code>{e(props["stackfarm.input_hash"])}</code></p>'
    return out


def _suites(cell: CellRun) -> str:
    rows = []
    for suite in cell.suites:
        r = suite.result
        xml = f'<a href="{e(r.suite)}.xml">{e(r.suite)}</a>'
        rows.append(
            (xml, _badge(r.outcome), str(r.tests), str(r.passed), str(r.failures + r.errors), str(r.skipped),
             f"{r.time:.1f}s", e(r.first_failure or ""))
        )  # fmt: skip
    if not rows:
        return f"<h2>Suites</h2><p>No suite ran: {e(cell.report.status)} — {e(cell.report.reason)}</p>"
    return "<h2>Suites</h2>" + _table(
        ("suite", "outcome", "tests", "passed", "failed", "skipped", "time", "first failure"), rows
    )


def _patches(cell: CellRun) -> str:
    sets = {
        m["set"]: v for k, v in cell.report.properties.items() if (m := _PATCH_SET_HASH.match(k)) is not None
    }
    statuses = {m["name"]: v for k, v in _all_properties(cell) if (m := _PATCH_STATUS.match(k)) is not None}
    out = "<h2>Patches</h2>"
    if not sets and not statuses:
        return out + "<p>No patch set applies to this cell.</p>"
    if sets:
        out += _table(
            ("patch set", "sha256"), ((e(s), f"<code>{e(h)}</code>") for s, h in sorted(sets.items()))
        )
    if statuses:
        good = ("applied", "already-applied", "upstreamed")
        out += _table(
            ("patch", "status"),
            (
                (f"<code>{e(n)}</code>", _badge("passed" if s in good else "failed", s))
                for n, s in sorted(statuses.items())
            ),
        )
    else:
        out += '<p class="muted">No patch statuses recorded for this run.</p>'
    return out


def _case_rows(cases: Iterable[tuple[str, Case]], keys: Sequence[str]) -> list[tuple[str, ...]]:
    return [
        (
            e(suite),
            _badge(c.outcome),
            f"<code>{e(c.name)}</code>",
            *(e(c.properties.get(k, "")) for k in keys),
        )
        for suite, c in cases
    ]


def _findings(title: str, cases: list[tuple[str, Case]], keys: Sequence[str]) -> str:
    """Not-passed findings shown, passed ones folded (there are hundreds)."""
    bad = [(s, c) for s, c in cases if c.outcome != "passed"]
    good = [(s, c) for s, c in cases if c.outcome == "passed"]
    head = ("suite", "outcome", "testcase", *keys)
    out = f"<h3>{e(title)}: {len(good)} passed, {len(bad)} not passed</h3>"
    if bad:
        out += _table(head, _case_rows(bad, keys))
    if good:
        out += (
            f"<details><summary>{len(good)} passed</summary>{_table(head, _case_rows(good, keys))}</details>"
        )
    return out


def _capability(cell: CellRun) -> str:
    cases = [
        (s.result.suite, c)
        for s in cell.suites
        for c in s.cases
        if {"arch", "verdict"} <= c.properties.keys()
    ]
    grid: dict[tuple[str, str], str] = {}
    for suite in cell.suites:
        for key, value in suite.properties.items():
            if (m := _CAPABILITY_GRID.match(key)) is not None:
                grid[(m["arch"], m["component"])] = value
    if not cases and not grid:
        return ""
    out = "<h2>Capability findings</h2>"
    if grid:
        archs = sorted({a for a, _ in grid})
        comps = sorted({c for _, c in grid})
        rows = [(f"<strong>{e(a)}</strong>", *(e(grid.get((a, c), "")) for c in comps)) for a in archs]
        out += _table(("arch", *comps), rows)
    if cases:
        out += _findings("Findings", cases, ("arch", "component", "verdict", "file", "line", "detail"))
    return out


def _eagle3(cell: CellRun) -> str:
    texts: list[str] = []
    for suite in cell.suites:
        for case in suite.cases:
            for key, title in (
                ("contract", "Derived contract"),
                ("contract_diff", "Contract diff"),
                ("verdict_diff", "Verdict changes"),
            ):
                if key in case.properties:
                    version = case.properties.get("sglang") or case.properties.get("compared_with") or ""
                    label = f"{title} (sglang {version})" if version and key == "contract" else title
                    texts.append(f"<h3>{e(label)}</h3><pre>{e(case.properties[key])}</pre>")
    cases = [
        (s.result.suite, c)
        for s in cell.suites
        for c in s.cases
        if {"model_class", "method"} <= c.properties.keys()
    ]
    if not texts and not cases:
        return ""
    out = "<h2>EAGLE-3 contract</h2>" + "".join(texts)
    if cases:
        out += _findings(
            "Classes against the contract", cases, ("role", "model_class", "method", "verdict", "detail")
        )
    return out


def _equivalence(cell: CellRun) -> str:
    cases = [
        (s.result.suite, c)
        for s in cell.suites
        for c in s.cases
        if any(k in c.properties for k in _EQUIVALENCE_KEYS)
    ]
    if not cases:
        return ""
    rows = _case_rows(cases, _EQUIVALENCE_KEYS)
    out = "<h2>Equivalence</h2>" + _table(("suite", "outcome", "testcase", *_EQUIVALENCE_KEYS), rows)
    bars = [
        Bar(label=c.name, value=v)
        for _, c in cases
        if (v := as_number(c.properties.get("match_rate", ""))) is not None
    ]
    return out + (bar_chart("match rate", bars, top=1.0) if bars else "")


def _throughput(cell: CellRun, trends: Mapping[str, list[tuple[str, float]]]) -> str:
    suites = [s for s in cell.suites if _THROUGHPUT_SUITE.search(s.result.suite)]
    by_figure: dict[str, list[Bar]] = {}
    rows = []
    for suite in suites:
        for case in suite.cases:
            numbers = {k: n for k, v in case.properties.items() if (n := as_number(v)) is not None}
            if not numbers:
                continue
            rows.append(
                (e(suite.result.suite), _badge(case.outcome), f"<code>{e(case.name)}</code>",
                 e(", ".join(f"{k}={_fmt(v)}" for k, v in sorted(numbers.items()))))
            )  # fmt: skip
            for key, value in numbers.items():
                if key in _BAR_MARKS:
                    continue
                by_figure.setdefault(key, []).append(
                    Bar(label=case.name, value=value, threshold=numbers.get("threshold"),
                        low=numbers.get("ci_low"), high=numbers.get("ci_high"))
                )  # fmt: skip
    over_time = {k: pts for k, pts in trends.items() if _THROUGHPUT_SUITE.search(k.split("::", 1)[0])}
    if not rows and not over_time:
        return ""
    out = "<h2>Throughput</h2>"
    if rows:
        out += _table(("suite", "outcome", "testcase", "figures"), rows)
        out += (
            '<div class="charts">' + "".join(bar_chart(k, b) for k, b in sorted(by_figure.items())) + "</div>"
        )
    if over_time:
        out += "<h3>Over time</h3>" + _trend_charts(over_time)
    return out


def _trend_charts(trends: Mapping[str, list[tuple[str, float]]]) -> str:
    moving = [(k, pts) for k, pts in sorted(trends.items()) if varying(pts)]
    shown = moving[:_MAX_TREND_CHARTS]
    out = '<div class="charts">' + "".join(line_chart(k, pts) for k, pts in shown) + "</div>"
    if len(moving) > len(shown):
        out += f'<p class="muted">{len(moving) - len(shown)} more moving figures: see ../history.html</p>'
    steady = len(trends) - len(moving)
    if steady:
        out += f'<p class="muted">{steady} figures are the same in every run.</p>'
    return out


def _other_cases(cell: CellRun) -> str:
    out = "<h2>All testcases</h2>"
    for suite in cell.suites:
        rows = [
            (_badge(c.outcome), f"<code>{e(c.name)}</code>", f"{c.time:.2f}s", e(c.message[:300]),
             e("; ".join(f"{k}={v if len(v) <= 80 else v[:77] + '…'}" for k, v in c.properties.items())))
            for c in suite.cases
        ]  # fmt: skip
        out += (
            f"<details><summary>{e(suite.result.suite)}: {len(rows)} testcases</summary>"
            + _table(("outcome", "testcase", "time", "message", "properties"), rows)
            + "</details>"
        )
    return out


def cell_page(cell: CellRun, trends: Mapping[str, list[tuple[str, float]]] | None = None) -> str:
    trends = trends or {}
    verdict = cell.verdict
    reason = f"<p>{e(cell.report.reason)}</p>" if cell.report.reason else ""
    body = (
        '<p><a href="../index.html">← all cells</a></p>'
        f"<h1><code>{e(cell.cell)}</code> {_badge(verdict)}</h1>{reason}"
        + _suites(cell)
        + _stack(cell)
        + _patches(cell)
        + _capability(cell)
        + _eagle3(cell)
        + _equivalence(cell)
        + _throughput(cell, trends)
    )
    others = {k: v for k, v in trends.items() if not _THROUGHPUT_SUITE.search(k.split("::", 1)[0])}
    if others:
        body += "<h2>Figures over time</h2>" + _trend_charts(others)
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
        f"<details><summary><code>{e(cell)}</code></summary>{_trend_charts(figs)}</details>"
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
    write_atomic(path, history_page(history))
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


def write(reports_dir: Path, cells: Sequence[CellReport] | None = None) -> list[Path]:
    """Write ``index.html`` and ``<cell>/index.html`` under `reports_dir`. `cells` is the runner's list
    (conflicts and errors included); without it the cells are read back from ``*/verdict.json``."""
    run = read_run(reports_dir, cells)
    trends = _trends(reports_dir)
    written = []
    for cell_id, cell in run.cells.items():
        path = reports_dir / cell_id / "index.html"
        write_atomic(path, cell_page(cell, trends.get(cell_id)))
        written.append(path)
    index = reports_dir / "index.html"
    write_atomic(index, index_page(run, links=_links(reports_dir)))
    return [index, *written]


__all__ = [
    "COLOURS",
    "Bar",
    "bar_chart",
    "cell_page",
    "history_page",
    "index_page",
    "line_chart",
    "write",
]
