"""40-throughput: one chart per figure family, the rest as tables.

What the suite writes (suites/40-throughput/test_throughput.py; the names are stackfarm.throughput's):

- ``test_figures``: per figure ``<figure>.median``, ``.ci_low``, ``.ci_high``, ``.n``, ``.cv``, ``.unit``,
  ``.samples``; figures ``decode_tok_s``, ``batch<N>_tok_s``, ``ttft_ms``, ``itl_ms``, ``batch<N>_ttft_ms``,
  each again as ``eagle3_<figure>`` for the EAGLE-3 server, ``eagle3_accept_length`` and
  ``eagle3_over_baseline``; plus ``config.*``, ``warmup.*``, ``rounds``, ``runner_kind``;
- ``test_threshold[<check>]``: ``figure``, ``kind`` (absolute, relative, regression), ``bound``, ``threshold``,
  ``source``, ``note``, ``verdict``, ``median``, ``ci_low``, ``ci_high``, ``n``, ``remeasures``;
- ``test_thresholds_resolved``: ``checks``, ``problem``; ``test_bench_tool``: ``bench.<figure>``.

The charts: decode tok/s, batch tok/s, TTFT/ITL (ms) and accept length; in each the median is the bar, the
interval the whisker, every threshold on that figure a dashed line, baseline and EAGLE-3 side by side on one
scale. Every figure, every check and the run's configuration are tables below; over time, the medians only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..history import Case, as_number
from . import Context, register
from .html import Bar, badge, bar_chart, e, fmt, table, trend_charts

EAGLE3 = "eagle3_"
STATS = ("median", "ci_low", "ci_high", "n", "cv", "unit", "samples")
_FIGURE_KEY = re.compile(r"^(?P<figure>[a-z0-9_]+)\.(?P<stat>median|ci_low|ci_high|n|cv|unit|samples)$")
_BATCH = re.compile(r"^batch(?P<n>\d+)_(?P<what>tok_s|ttft_ms|itl_ms)$")
#: (title, unit) of each chart, in page order.
FAMILIES = (("decode", "tok/s"), ("batch", "tok/s"), ("TTFT / ITL", "ms"), ("accept length", "tokens"))


@dataclass(frozen=True, kw_only=True)
class Figure:
    name: str
    median: float
    low: float | None
    high: float | None
    n: str
    cv: float | None
    unit: str


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str
    figure: str
    kind: str
    bound: str
    threshold: float | None
    verdict: str
    source: str
    case: Case


def figures(cases: Sequence[Case]) -> dict[str, Figure]:
    """Every ``<figure>.median`` (with its interval, n, cv, unit) of the suite's testcases."""
    stats: dict[str, dict[str, str]] = {}
    for case in cases:
        if "figure" in case.properties:  # a check's own median: that is the check's, not a figure
            continue
        for key, value in case.properties.items():
            if (m := _FIGURE_KEY.match(key)) is not None:
                stats.setdefault(m["figure"], {})[m["stat"]] = value
    out = {}
    for name, s in stats.items():
        median = as_number(s.get("median", ""))
        if median is None:
            continue
        out[name] = Figure(
            name=name, median=median, low=as_number(s.get("ci_low", "")), high=as_number(s.get("ci_high", "")),
            n=s.get("n", ""), cv=as_number(s.get("cv", "")), unit=s.get("unit", ""),
        )  # fmt: skip
    return out


def checks(cases: Sequence[Case]) -> list[Check]:
    return [
        Check(
            name=c.properties.get("name", c.name),
            figure=c.properties["figure"],
            kind=c.properties.get("kind", ""),
            bound=c.properties.get("bound", ""),
            threshold=as_number(c.properties.get("threshold", "")),
            verdict=c.properties.get("verdict", ""),
            source=c.properties.get("source", ""),
            case=c,
        )
        for c in cases
        if "figure" in c.properties
    ]


def family(figure: str) -> tuple[str, str, int] | None:
    """(chart, row label, order within the chart) of a baseline figure name, None for a table-only one."""
    if figure == "decode_tok_s":
        return "decode", "decode", 0
    if figure in ("ttft_ms", "itl_ms"):
        return "TTFT / ITL", figure.split("_", maxsplit=1)[0].upper(), 0 if figure == "ttft_ms" else 1
    if figure == "accept_length":
        return "accept length", "accept length", 0
    if (m := _BATCH.match(figure)) is not None:
        n = int(m["n"])
        if m["what"] == "tok_s":
            return "batch", f"batch {n}", n
        return "TTFT / ITL", f"batch {n} {m['what'].split('_')[0].upper()}", 10 + n
    return None


def charts(found: Mapping[str, Figure], by_figure: Mapping[str, Sequence[Check]]) -> list[str]:
    """One bar chart per family: a group per figure, baseline and EAGLE-3 side by side."""
    rows: dict[str, dict[tuple[int, str], str]] = {}
    for name in found:
        base = name.removeprefix(EAGLE3)
        where = family(base)
        if where is not None:
            chart, label, order = where
            rows.setdefault(chart, {})[(order, label)] = base
    out = []
    for chart, unit in FAMILIES:
        bars: list[Bar] = []
        for (_, label), base in sorted(rows.get(chart, {}).items()):
            for series, name in (("baseline", base), ("EAGLE-3", EAGLE3 + base)):
                fig = found.get(name)
                if fig is None:
                    continue
                limits = [
                    (f"{c.kind} threshold".lstrip(), v)
                    for c in by_figure.get(name, ())
                    if (v := c.threshold) is not None
                ]
                bars.append(
                    Bar(label=f"{label} · {series}", value=fig.median, low=fig.low, high=fig.high,
                        series=series, group=label, marks=tuple(limits))
                )  # fmt: skip
        if bars:
            out.append(bar_chart(chart, bars, unit=unit))
    return out


def _figure_rows(
    found: Mapping[str, Figure], by_figure: Mapping[str, Sequence[Check]]
) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for name, f in sorted(found.items()):
        interval = f"{fmt(f.low)} … {fmt(f.high)}" if f.low is not None and f.high is not None else ""
        limits = ", ".join(f"{c.bound} ({c.kind}) {c.verdict}" for c in by_figure.get(name, ()))
        rows.append(
            (f"<code>{e(name)}</code>", e(f.unit), fmt(f.median), e(interval), e(f.n),
             fmt(f.cv) if f.cv is not None else "", e(limits))
        )  # fmt: skip
    return rows


def _check_rows(found: Sequence[Check]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for c in found:
        p = c.case.properties
        interval = f"{p.get('ci_low', '')} … {p.get('ci_high', '')}" if "ci_low" in p else ""
        rows.append(
            (f"<code>{e(c.name)}</code>", badge(c.case.outcome, c.verdict or c.case.outcome), e(c.kind),
             e(c.bound), e(c.source), e(p.get("median", "")), e(interval), e(p.get("remeasures", "")),
             e(p.get("note", "")))
        )  # fmt: skip
    return rows


def _settings_rows(cases: Sequence[Case]) -> list[tuple[str, ...]]:
    """What the run measured with: the non-figure properties (configs, warm-up, runner kind, GPU, problems)."""
    rows: list[tuple[str, ...]] = []
    for case in cases:
        if "figure" in case.properties:
            continue
        for key, value in case.properties.items():
            if _FIGURE_KEY.match(key) or key.endswith(".samples"):
                continue
            shown = value if len(value) <= 240 else value[:239] + "…"
            rows.append((f"<code>{e(case.name)}</code>", f"<code>{e(key)}</code>", e(shown)))
    return rows


@register("throughput", "perf", "bench", name="throughput", order=40)
def render(ctx: Context) -> str:
    cases = [c for s in ctx.suites for c in s.cases]
    found = figures(cases)
    found_checks = checks(cases)
    by_figure: dict[str, list[Check]] = {}
    for c in found_checks:
        by_figure.setdefault(c.figure, []).append(c)
    medians = {k: v for k, v in ctx.trends.items() if k.endswith((".median", "::median"))}
    settings = _settings_rows(cases)
    if not found and not found_checks and not medians and not settings:
        return ""
    out = "<h2>Throughput</h2>"
    drawn = charts(found, by_figure)
    if drawn:
        out += '<div class="charts">' + "".join(drawn) + "</div>"
    if found:
        out += "<h3>Figures</h3>" + table(
            ("figure", "unit", "median", "interval", "n", "cv", "thresholds"), _figure_rows(found, by_figure)
        )
    if found_checks:
        out += "<h3>Threshold checks</h3>" + table(
            ("check", "verdict", "kind", "bound", "source", "median", "interval", "remeasures", "note"),
            _check_rows(found_checks),
        )
    if settings:
        out += (
            f"<details><summary>Configuration: {len(settings)} properties</summary>"
            + table(("testcase", "property", "value"), settings)
            + "</details>"
        )
    if medians:
        out += "<h3>Over time (medians)</h3>" + trend_charts(medians)
    return out
