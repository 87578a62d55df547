"""40-throughput as a suite family (stackfarm.family): its settings, its record, its report section.

Settings ([suites.40-throughput.settings]): declared beside the code that owns their meaning,
stackfarm.throughput.settings; parsed once by matrix.load, handed over as JSON and read back by
`Settings.from_mapping`. The family also owns matrix.toml's [thresholds.<runner kind>] (`TABLES`): each kind a
kind of [runners] or a <count>x-<gpu>, each key a figure these settings measure (stackfarm.throughput.thresholds),
checked by matrix.load through this declaration.

Record (``40-throughput.json``): what the section shows.

- `figures`: each measured figure (test_figures) with its median, bootstrap interval, n, CV, unit and samples;
  ``decode_tok_s``, ``batch<N>_tok_s``, ``ttft_ms``, ``itl_ms``, ``batch<N>_ttft_ms``, each again as
  ``eagle3_<figure>`` for the EAGLE-3 server, ``eagle3_accept_length`` and ``eagle3_over_baseline``;
- `checks`: each threshold check (test_threshold[<check>], test_accept_length[<rate>]): figure, kind
  (absolute, relative, regression, planted), bound, threshold, source, note, verdict, median, interval,
  remeasures; the section takes its outcome from the testcase's in the JUnit file;
- `config`: what the run measured with, per testcase (server configurations, warm-up, rounds, runner kind,
  GPUs, the resolved checks, SGLang's own bench tool's figures ``bench.<figure>``).

The section: one chart per figure family (decode tok/s, batch tok/s, TTFT/ITL in ms, accept length); in each
the median is the bar, the interval the whisker, every threshold on that figure a dashed line, baseline and
EAGLE-3 side by side on one scale. Every figure, every check and the configuration are tables below; over time,
the medians only (history.json's trends).

Format 0 (`legacy`): a run held from before this family wrote records carries all of it as its testcases'
JUnit properties (``<figure>.<stat>``; a check's ``figure``, ``kind``, ``bound``...); `legacy` reads them into
the same record. The property names are parsed there and nowhere else.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stackfarm.family import OwnedTable, SectionContext, SuiteFamily
from stackfarm.schema import Field
from stackfarm.throughput import thresholds
from stackfarm.throughput.settings import SCHEMA, SUITE, Settings

if TYPE_CHECKING:  # the report's types: matrix.load imports this file too, and needs none of them
    from stackfarm.history import Case

NAME = SUITE

EAGLE3 = "eagle3_"
#: A figure's statistics, in the order test_figures states them (samples last).
STATS = ("unit", "n", "median", "ci_low", "ci_high", "cv")
#: (title, unit) of each chart, in page order.
CHARTS = (("decode", "tok/s"), ("batch", "tok/s"), ("TTFT / ITL", "ms"), ("accept length", "tokens"))
_BATCH = re.compile(r"^batch(?P<n>\d+)_(?P<what>tok_s|ttft_ms|itl_ms)$")
#: The letters of a figure the section charts and tables by name (the ones at a planted rate,
#: ``accept_length@0.5``, are shown among the configuration: the names format 0 reads as figures).
_PLAIN = frozenset(string.ascii_lowercase + string.digits + "_")


def _number(value: object) -> float | None:
    """A finite number of a value as its testcase states it (stackfarm.history.as_number), else None."""
    try:
        found = float(str(value))
    except ValueError:
        return None
    return found if found - found == 0 else None  # neither inf nor nan


@dataclass(frozen=True, kw_only=True)
class Figure:
    name: str
    median: float
    ci_low: float | None = None
    ci_high: float | None = None
    #: As stated: "5", or "" when the run does not say.
    n: str = ""
    cv: float | None = None
    unit: str = ""
    samples: tuple[float, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Check:
    """One threshold check as its testcase (`testcase`, pytest's name) states it; the figures as text."""

    testcase: str
    name: str
    figure: str
    kind: str = ""
    bound: str = ""
    threshold: float | None = None
    verdict: str = ""
    source: str = ""
    median: str = ""
    #: None: the check states no interval (it failed before judging).
    ci_low: str | None = None
    ci_high: str = ""
    remeasures: str = ""
    note: str = ""

    @classmethod
    def of(cls, testcase: str, stated: Mapping[str, object]) -> Check:
        """The check a testcase states (its facts by name: test_throughput's `check_property`)."""

        def text(key: str) -> str:
            return str(stated.get(key, ""))

        return cls(
            testcase=testcase,
            name=str(stated.get("name", testcase)),
            figure=text("figure"),
            kind=text("kind"),
            bound=text("bound"),
            threshold=_number(stated.get("threshold", "")),
            verdict=text("verdict"),
            source=text("source"),
            median=text("median"),
            ci_low=str(stated["ci_low"]) if "ci_low" in stated else None,
            ci_high=text("ci_high"),
            remeasures=text("remeasures"),
            note=text("note"),
        )


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One fact the run measured with, as its testcase states it."""

    testcase: str
    key: str
    value: str


@dataclass(frozen=True, kw_only=True)
class ThroughputRecord:
    figures: tuple[Figure, ...] = ()
    checks: tuple[Check, ...] = ()
    config: tuple[Setting, ...] = ()


def figure_facts(testcase: str, name: str, stats: Mapping[str, Any]) -> tuple[Figure | None, list[Setting]]:
    """A measured figure (test_figures: `STATS` and samples) as the record holds it: a `Figure` when its name
    is charted, else the configuration rows the section lists it in (samples never shown)."""
    if not name or not set(name) <= _PLAIN:
        return None, [
            Setting(testcase=testcase, key=f"{name}.{k}", value=str(stats[k])) for k in STATS if k in stats
        ]
    median = _number(stats.get("median", ""))
    if median is None:
        return None, []
    samples = tuple(round(float(x), 4) for x in stats.get("samples", ()))
    return Figure(
        name=name,
        median=median,
        ci_low=_number(stats.get("ci_low", "")),
        ci_high=_number(stats.get("ci_high", "")),
        n=str(stats.get("n", "")),
        cv=_number(stats.get("cv", "")),
        unit=str(stats.get("unit", "")),
        samples=samples,
    ), []


# --------------------------------------------------------------------------- format 0

_FIGURE_KEY = re.compile(r"^(?P<figure>[a-z0-9_]+)\.(?P<stat>median|ci_low|ci_high|n|cv|unit|samples)$")


def _samples(text: str) -> tuple[float, ...]:
    try:
        found = json.loads(text)
        return tuple(float(x) for x in found) if isinstance(found, list) else ()
    except (ValueError, TypeError):
        return ()


def legacy(suite: Any) -> ThroughputRecord:
    """Format 0: the record of a held run (stackfarm.history.SuiteRun) from its testcases' properties: a
    testcase stating ``figure`` is a check; every other's ``<figure>.<stat>`` a figure's statistic, the rest
    its configuration (``.samples`` never shown)."""
    stats: dict[str, dict[str, str]] = {}
    checks: list[Check] = []
    config: list[Setting] = []
    for case in suite.cases:
        if "figure" in case.properties:  # a check's own median: that is the check's, not a figure
            checks.append(Check.of(case.name, case.properties))
            continue
        for key, value in case.properties.items():
            if (m := _FIGURE_KEY.match(key)) is not None:
                stats.setdefault(m["figure"], {})[m["stat"]] = value
            elif not key.endswith(".samples"):
                config.append(Setting(testcase=case.name, key=key, value=value))
    figures = [
        Figure(
            name=name,
            median=median,
            ci_low=_number(s.get("ci_low", "")),
            ci_high=_number(s.get("ci_high", "")),
            n=s.get("n", ""),
            cv=_number(s.get("cv", "")),
            unit=s.get("unit", ""),
            samples=_samples(s.get("samples", "")),
        )
        for name, s in stats.items()
        if (median := _number(s.get("median", ""))) is not None
    ]
    return ThroughputRecord(figures=tuple(figures), checks=tuple(checks), config=tuple(config))


# --------------------------------------------------------------------------- the section


def chart_of(figure: str) -> tuple[str, str, int] | None:
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
    from stackfarm.sections.html import Bar, bar_chart

    rows: dict[str, dict[tuple[int, str], str]] = {}
    for name in found:
        base = name.removeprefix(EAGLE3)
        where = chart_of(base)
        if where is not None:
            chart, label, order = where
            rows.setdefault(chart, {})[(order, label)] = base
    out = []
    for chart, unit in CHARTS:
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
                    Bar(
                        label=f"{label} · {series}",
                        value=fig.median,
                        low=fig.ci_low,
                        high=fig.ci_high,
                        series=series,
                        group=label,
                        marks=tuple(limits),
                    )
                )
        if bars:
            out.append(bar_chart(chart, bars, unit=unit))
    return out


def _figure_rows(
    found: Mapping[str, Figure], by_figure: Mapping[str, Sequence[Check]]
) -> list[tuple[str, ...]]:
    from stackfarm.sections.html import e, fmt

    rows: list[tuple[str, ...]] = []
    for name, f in sorted(found.items()):
        interval = (
            f"{fmt(f.ci_low)} … {fmt(f.ci_high)}" if f.ci_low is not None and f.ci_high is not None else ""
        )
        limits = ", ".join(f"{c.bound} ({c.kind}) {c.verdict}" for c in by_figure.get(name, ()))
        rows.append(
            (
                f"<code>{e(name)}</code>",
                e(f.unit),
                fmt(f.median),
                e(interval),
                e(f.n),
                fmt(f.cv) if f.cv is not None else "",
                e(limits),
            )
        )
    return rows


def _check_rows(found: Sequence[tuple[Check, Case]]) -> list[tuple[str, ...]]:
    from stackfarm.sections.html import badge, e

    rows: list[tuple[str, ...]] = []
    for c, case in found:
        interval = f"{c.ci_low} … {c.ci_high}" if c.ci_low is not None else ""
        rows.append(
            (
                f"<code>{e(c.name)}</code>",
                badge(case.outcome, c.verdict or case.outcome),
                e(c.kind),
                e(c.bound),
                e(c.source),
                e(c.median),
                e(interval),
                e(c.remeasures),
                e(c.note),
            )
        )
    return rows


def _settings_rows(config: Sequence[Setting]) -> list[tuple[str, ...]]:
    from stackfarm.sections.html import e

    rows: list[tuple[str, ...]] = []
    for s in config:
        shown = s.value if len(s.value) <= 240 else s.value[:239] + "…"
        rows.append((f"<code>{e(s.testcase)}</code>", f"<code>{e(s.key)}</code>", e(shown)))
    return rows


def _joined(
    ctx: SectionContext[ThroughputRecord],
) -> tuple[dict[str, Figure], list[tuple[Check, Case]], list[Setting]]:
    """The records' figures, their checks with the testcase each ran as (JUnit's outcome), the configuration."""
    found: dict[str, Figure] = {}
    checks: list[tuple[Check, Case]] = []
    config: list[Setting] = []
    for suite, record in zip(ctx.suites, ctx.records, strict=True):
        junit = {c.name: c for c in suite.cases}
        found |= {f.name: f for f in record.figures}
        checks += [(c, junit[c.testcase]) for c in record.checks if c.testcase in junit]
        config += record.config
    return found, checks, config


def render(ctx: SectionContext[ThroughputRecord]) -> str:
    """The charts, the figures, the checks, the configuration (folded), the medians over time."""
    from stackfarm.sections.html import table, trend_charts

    found, found_checks, config = _joined(ctx)
    by_figure: dict[str, list[Check]] = {}
    for c, _ in found_checks:
        by_figure.setdefault(c.figure, []).append(c)
    medians = {k: v for k, v in ctx.trends.items() if k.endswith((".median", "::median"))}
    settings = _settings_rows(config)
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


def _threshold_table(settings: Settings | None) -> Field:
    """One [thresholds.<kind>] table: the figures `settings` measure (the defaults' for a disabled suite)."""
    return thresholds.table_schema((settings or Settings()).figures())


#: The top-level tables of matrix.toml this family owns.
TABLES = {"thresholds": OwnedTable(entry=_threshold_table, key_problem=thresholds.kind_problem)}


FAMILY: SuiteFamily[Settings, ThroughputRecord] = SuiteFamily(
    name=NAME,
    title="Throughput",
    order=40,
    settings_schema=SCHEMA,
    settings=Settings,
    record=ThroughputRecord,
    section=render,
    legacy=legacy,
    tables=TABLES,
)
