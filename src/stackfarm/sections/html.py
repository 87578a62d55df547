"""The HTML pieces every section renderer (and htmlreport) draws with: escaped tables, outcome badges,
file:line locations, folded findings, horizontal bar charts and trend lines as inline SVG (no scripts, no
external resources). A trend line's scale is marked (its ends labelled, the change first → last in words) and
spans at least `MIN_RELATIVE_SPAN` of its values, so a 0.5 % change never looks like a cliff."""

from __future__ import annotations

import dataclasses
import html
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from ..history import Case, SuiteRun

e = html.escape

#: Badge kinds drawn with an outcome colour (``o-``); the rest are verdicts (``v-``). Both come from
#: grid.COLOURS.
_OUTCOMES = ("passed", "failed", "error", "skipped", "incomplete", "missing", "not_applicable")


def badge(kind: str, text: str | None = None) -> str:
    css = f"o-{kind}" if kind in _OUTCOMES else f"v-{kind}"
    return f'<span class="badge {css}">{e(text or kind)}</span>'


def table(head: Sequence[str], rows: Iterable[Sequence[str]], css: str = "") -> str:
    """A table of already-escaped cells."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    cls = f' class="{css}"' if css else ""
    return (
        f"<table{cls}><thead><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def loc(path: str, line: str | int | None = None) -> str:
    """A finding's ``file:line``: a link when the file is an absolute path (``file://...#L<line>``), else the
    location as code (the file lives in the cell's installed stack, which the report does not know)."""
    if not path:
        return ""
    where = f"{path}:{line}" if line not in (None, "", "0", 0) else path
    if path.startswith("/"):
        fragment = f"#L{line}" if line not in (None, "", "0", 0) else ""
        href = PurePosixPath(path).as_uri() + fragment
        return f'<a class="loc" href="{e(href)}"><code>{e(where)}</code></a>'
    return f'<code class="loc">{e(where)}</code>'


def split_loc(text: str) -> tuple[str, str]:
    """("path", "line") of "path:line" (line "" when there is none)."""
    head, sep, tail = text.rpartition(":")
    return (head, tail) if sep and tail.isdigit() else (text, "")


def record_cases(
    suite: SuiteRun, items: Iterable[Any], facts: Callable[[Any], Mapping[str, str]]
) -> list[tuple[str, Case]]:
    """Each item of a family's record (it names its `testcase`, pytest's name) joined with that testcase: JUnit
    says the outcome, message and time, the record says what was found (`facts`). An item whose testcase the
    JUnit file does not have is not shown as a result."""
    junit = {c.name: c for c in suite.cases}
    out: list[tuple[str, Case]] = []
    for item in items:
        ran = junit.get(item.testcase)
        if ran is not None:
            out.append((suite.result.suite, dataclasses.replace(ran, properties=dict(facts(item)))))
    return out


def case_rows(
    cases: Iterable[tuple[str, Case]], keys: Sequence[str], *, locations: Sequence[str] = ()
) -> list[tuple[str, ...]]:
    """One row per testcase: suite, outcome, name, its `keys`; `locations` are properties holding
    "path:line" (or "file" + "line"), rendered with `loc`."""
    rows = []
    for suite, c in cases:
        cols = [e(suite), badge(c.outcome), f"<code>{e(c.name)}</code>"]
        for key in keys:
            value = c.properties.get(key, "")
            if key == "file":
                cols.append(loc(value, c.properties.get("line")))
            elif key in locations:
                cols.append(loc(*split_loc(value)))
            else:
                cols.append(e(value))
        rows.append(tuple(cols))
    return rows


def findings(
    title: str, cases: list[tuple[str, Case]], keys: Sequence[str], *, locations: Sequence[str] = ()
) -> str:
    """Not-passed findings shown, passed ones folded (there are hundreds)."""
    bad = [(s, c) for s, c in cases if c.outcome != "passed"]
    good = [(s, c) for s, c in cases if c.outcome == "passed"]
    head = ("suite", "outcome", "testcase", *(k for k in keys if k != "line"))
    shown = [k for k in keys if k != "line"]
    out = f"<h3>{e(title)}: {len(good)} passed, {len(bad)} not passed</h3>"
    if bad:
        out += table(head, case_rows(bad, shown, locations=locations))
    if good:
        rows = case_rows(good, shown, locations=locations)
        out += f"<details><summary>{len(good)} passed</summary>{table(head, rows)}</details>"
    return out


# --------------------------------------------------------------------------- bar charts (inline SVG)

#: Fill of a bar by its series; other series take the default.
SERIES_COLOURS = {"baseline": "#0969da", "EAGLE-3": "#8250df"}
DEFAULT_BAR = "#0969da"


@dataclass(frozen=True, kw_only=True)
class Bar:
    """One bar: its value (a median), optionally an interval (whiskers) and a threshold (a line)."""

    label: str
    value: float
    threshold: float | None = None
    low: float | None = None
    high: float | None = None
    #: Which configuration it measures ("baseline", "EAGLE-3"): the fill and the legend.
    series: str = ""
    #: Bars of one group are drawn next to each other, a gap between groups.
    group: str = ""
    #: More thresholds on the same bar: (what, value), e.g. ("regression", 543.8).
    marks: tuple[tuple[str, float], ...] = ()


def fmt(value: float) -> str:
    return f"{value:.4g}"


def bar_chart(title: str, bars: Sequence[Bar], *, top: float | None = None, unit: str = "") -> str:
    """Horizontal bars on one scale from 0: `top` fixes the scale's end (1.0 for rates) when nothing
    exceeds it, else the end is 10 % past the largest value, interval end or threshold. A threshold is a black
    line across its bar, an interval a grey whisker. Bars are drawn with crisp edges, so their pixel lengths
    are in the ratio of their values."""
    label_w, plot_w, row_h, head, gap = 230, 480, 22, 26, 8
    groups = [b.group for i, b in enumerate(bars) if i == 0 or b.group != bars[i - 1].group]
    legend = sorted({b.series for b in bars if b.series}, key=lambda s: (s != "baseline", s))
    height = head + row_h * len(bars) + gap * (len(groups) - 1) + (18 if legend else 0) + 8
    peak = max(
        [b.value for b in bars]
        + [m for b in bars for m in (b.threshold, b.high) if m is not None]
        + [v for b in bars for _, v in b.marks]
    )
    end = top if top is not None and top >= peak else peak * 1.1
    scale = plot_w / end if end > 0 else 0.0
    shown = f"{title} ({unit})" if unit else title
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + plot_w + 70}" height="{height}" '
        f'role="img" aria-label="{e(title)}" class="bars">',
        f'<text x="0" y="15" font-size="13" font-weight="600">{e(shown)}</text>',
        f'<line x1="{label_w}" y1="{head - 4}" x2="{label_w}" y2="{height - (26 if legend else 8)}" '
        'stroke="#8c959f"/>',
    ]
    y = head
    for i, bar in enumerate(bars):
        if i and bar.group != bars[i - 1].group:
            y += gap
        width = round(max(bar.value, 0.0) * scale)
        text = bar.label if len(bar.label) <= 34 else bar.label[:33] + "…"
        fill = SERIES_COLOURS.get(bar.series, DEFAULT_BAR)
        parts.append(
            f'<text x="0" y="{y + 15}" font-size="12">{e(text)}<title>{e(bar.label)}</title></text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{width}" height="{row_h - 6}" fill="{fill}" '
            f'shape-rendering="crispEdges" data-series="{e(bar.series)}" data-value="{bar.value:.6g}">'
            f"<title>{e(bar.label)}: {fmt(bar.value)}</title></rect>"
            f'<text x="{label_w + max(width, (bar.high or 0.0) * scale) + 4:.0f}" y="{y + 15}" '
            f'font-size="11">{fmt(bar.value)}</text>'
        )
        if bar.low is not None and bar.high is not None:
            x1, x2, mid = label_w + bar.low * scale, label_w + bar.high * scale, y + row_h / 2
            parts.append(
                f'<path class="ci" d="M{x1:.1f} {mid - 4}V{mid + 4}M{x1:.1f} {mid}H{x2:.1f}M{x2:.1f} {mid - 4}'
                f'V{mid + 4}" stroke="#1f2328" stroke-opacity=".55" stroke-width="1.5" fill="none">'
                f"<title>interval {fmt(bar.low)} … {fmt(bar.high)}</title></path>"
            )
        lines = [("threshold", bar.threshold)] if bar.threshold is not None else []
        for what, value in [*lines, *bar.marks]:
            x = label_w + value * scale
            parts.append(
                f'<line class="threshold" x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + row_h}" stroke="#1f2328" '
                f'stroke-width="2" stroke-dasharray="3 2"><title>{e(what)} {fmt(value)}</title></line>'
            )
        y += row_h
    if legend:
        x = label_w
        for series in legend:
            fill = SERIES_COLOURS.get(series, DEFAULT_BAR)
            parts.append(
                f'<rect x="{x}" y="{y + 6}" width="10" height="10" fill="{fill}"/>'
                f'<text x="{x + 14}" y="{y + 15}" font-size="11">{e(series)}</text>'
            )
            x += 24 + 7 * len(series)
        parts.append(
            f'<text x="{x + 6}" y="{y + 15}" font-size="11" fill="#57606a">bar: median · whisker: interval · '
            "dashed: threshold</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


#: A trend chart's scale spans at least this fraction of its values' magnitude, so a change of 0.5 % draws as a
#: wobble of 5 % of the plot, not as a cliff from the bottom to the top.
MIN_RELATIVE_SPAN = 0.10
#: What follows a figure's name and says which statistic of it a key is: such keys are one figure, on one scale.
_STATISTIC = re.compile(r"\.(?:median|mean|ci_low|ci_high|low|high|min|max|p\d+)$")


def chart_scale(values: Iterable[float]) -> tuple[float, float]:
    """(low, high) of a trend chart's y axis: the values' range, widened to `MIN_RELATIVE_SPAN` of their
    magnitude around its middle (never below 0 for values that are not), and to 1 when every value is 0."""
    found = list(values)
    low, high = min(found), max(found)
    need = MIN_RELATIVE_SPAN * max(abs(low), abs(high))
    if high - low < need:
        middle = (low + high) / 2
        low, high = middle - need / 2, middle + need / 2
        if min(found) >= 0 > low:
            low, high = 0.0, need
    if high == low:
        low, high = low - 0.5, high + 0.5
    return low, high


def _percent(value: float) -> str:
    return f"{value:+.2f} %" if abs(value) < 1 else f"{value:+.1f} %"


def change_note(points: Sequence[tuple[str, float]]) -> str:
    """What a trend chart's line says in words: the change from the first run to the last (relative when the
    first is not 0) and the values' range."""
    values = [v for _, v in points]
    first, last, low, high = values[0], values[-1], min(values), max(values)
    change = _percent((last - first) / abs(first) * 100) if first else f"{last - first:+.4g}"
    mean = sum(values) / len(values)
    ratio = (high - low) / abs(mean) * 100 if mean else 0.0
    spread = (
        f" ({ratio:.0f} % of the mean)" if ratio >= 10 else f" ({ratio:.2g} % of the mean)" if mean else ""
    )
    return f"first → last {change} · min {fmt(low)}, max {fmt(high)}{spread}"


def line_chart(
    title: str, points: Sequence[tuple[str, float]], *, scale: tuple[float, float] | None = None
) -> str:
    """A value over runs: one dot per run (its name and value on hover). The y axis is `scale` (shared by the
    charts of one figure) or `chart_scale` of the values, its ends labelled on the left; under the title, the
    change first → last and the range in words (`change_note`)."""
    width, height, left, right, top, bottom = 420, 164, 56, 12, 38, 28
    values = [v for _, v in points]
    low, high = scale or chart_scale(values)
    span = (high - low) or 1.0
    plot_w, plot_h = width - left - right, height - top - bottom

    def xy(i: int, v: float) -> tuple[float, float]:
        x = left + (plot_w * i / (len(points) - 1) if len(points) > 1 else plot_w / 2)
        return x, top + plot_h - (v - low) / span * plot_h

    coords = [xy(i, v) for i, (_, v) in enumerate(points)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
    shown = title if len(title) <= 62 else "…" + title[-61:]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{e(title)}" class="trend" data-low="{low:.6g}" data-high="{high:.6g}">',
        f'<text x="0" y="14" font-size="12" font-weight="600">{e(shown)}<title>{e(title)}</title></text>',
        f'<text x="0" y="29" font-size="10" fill="#57606a" class="change">{e(change_note(points))}</text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#f6f8fa" stroke="#d0d7de"/>',
        f'<text x="{left - 4}" y="{top + 10}" font-size="10" text-anchor="end">{fmt(high)}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" font-size="10" text-anchor="end">{fmt(low)}</text>',
        f'<polyline points="{path}" fill="none" stroke="#0969da" stroke-width="2"/>',
    ]
    for (run, value), (x, y) in zip(points, coords, strict=True):
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="#0969da"><title>{e(run)}: {fmt(value)}</title></circle>'
        )
    parts.append(f'<text x="{left}" y="{height - 8}" font-size="10">{e(points[0][0])}</text>')
    if len(points) > 1:
        parts.append(
            f'<text x="{width - right}" y="{height - 8}" font-size="10" text-anchor="end">{e(points[-1][0])}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


#: At most this many trend charts on a page; the rest are counted, history.html has them all.
MAX_TREND_CHARTS = 24


def trend_charts(trends: Mapping[str, Sequence[tuple[str, float]]]) -> str:
    """A line chart per figure that moved between runs; the steady ones counted. The statistics of one figure
    (its median and interval ends, ``<figure>.median``, ``.ci_low``, ...) share one scale."""
    moving = [(k, pts) for k, pts in sorted(trends.items()) if len({v for _, v in pts}) > 1]
    shown = moving[:MAX_TREND_CHARTS]
    families: dict[str, list[float]] = {}
    for key, pts in moving:
        families.setdefault(_STATISTIC.sub("", key), []).extend(v for _, v in pts)
    scales = {family: chart_scale(values) for family, values in families.items()}
    out = (
        '<div class="charts">'
        + "".join(line_chart(k, pts, scale=scales[_STATISTIC.sub("", k)]) for k, pts in shown)
        + "</div>"
    )
    if shown:
        out += (
            f'<p class="muted">Each scale spans at least {MIN_RELATIVE_SPAN:.0%} of its values (a small change '
            "stays small); a figure's median and interval share one scale.</p>"
        )
    if len(moving) > len(shown):
        out += f'<p class="muted">{len(moving) - len(shown)} more moving figures: see ../history.html</p>'
    steady = len(trends) - len(moving)
    if steady:
        out += f'<p class="muted">{steady} figures are the same in every run.</p>'
    return out


__all__ = [
    "DEFAULT_BAR",
    "MAX_TREND_CHARTS",
    "MIN_RELATIVE_SPAN",
    "SERIES_COLOURS",
    "Bar",
    "badge",
    "bar_chart",
    "case_rows",
    "change_note",
    "chart_scale",
    "e",
    "findings",
    "fmt",
    "line_chart",
    "loc",
    "split_loc",
    "table",
    "trend_charts",
]
