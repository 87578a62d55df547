"""PNG plots of the throughput figures over the report history: ``reports/<cell>/throughput-trends.png``.

The HTML pages draw their charts as inline SVG (one self-contained file each); these PNGs are for the places
that show images but not HTML: history.md on a code host, a CI artifact listing, a sign-off document. One
panel per figure of 40-throughput: its median per run, with the bootstrap interval as a band. Every panel of a
cell has the same runs on its x axis: a run that lacks a figure (EAGLE-3 not measured that night) is a gap
labelled "no figure", never a run silently left out.

matplotlib is an optional extra (``pip install 'stackfarm[plots]'``, what ``nox -s report`` installs): the
matrix job never needs it, so it does not pay for it. Without it `write` plots nothing and history.md
says why (`why_not`).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .files import write_bytes_atomic

if TYPE_CHECKING:  # matplotlib is an optional extra, imported where a plot is drawn
    from matplotlib.figure import Figure

#: cell -> figure key -> [(run, value), ...]: history.Series.
Series = Mapping[str, Mapping[str, Sequence[tuple[str, float]]]]

SUITE_PREFIX = "40-throughput::test_figures::"
FILENAME = "throughput-trends.png"
#: Panels per row.
COLUMNS = 3


@dataclass(frozen=True, kw_only=True)
class Point:
    run: str
    median: float
    low: float | None = None
    high: float | None = None


def throughput_trends(figures: Mapping[str, Sequence[tuple[str, float]]]) -> dict[str, list[Point]]:
    """figure -> its points in run order, from one cell's series (``<suite>::test_figures::<figure>.median``,
    ``.ci_low``, ``.ci_high``). Runs without a median for a figure are left out of that figure."""
    out: dict[str, list[Point]] = {}
    for key, points in sorted(figures.items()):
        if not (key.startswith(SUITE_PREFIX) and key.endswith(".median")):
            continue
        figure = key[len(SUITE_PREFIX) : -len(".median")]
        lows = dict(figures.get(f"{SUITE_PREFIX}{figure}.ci_low", ()))
        highs = dict(figures.get(f"{SUITE_PREFIX}{figure}.ci_high", ()))
        out[figure] = [Point(run=r, median=v, low=lows.get(r), high=highs.get(r)) for r, v in points]
    return out


def run_order(trends: Mapping[str, Sequence[Point]], runs: Sequence[str] = ()) -> list[str]:
    """Every run that has a point in any panel, in `runs`' order (the history's), then any other in the order
    the panels name them: the x axis every panel shares."""
    seen = {p.run for points in trends.values() for p in points}
    order = [r for r in runs if r in seen]
    for points in trends.values():
        order += [p.run for p in points if p.run not in order]
    return order


def aligned(points: Sequence[Point], runs: Sequence[str]) -> list[Point | None]:
    """A panel's points on the shared axis: None where a run has no figure for it (a gap, labelled)."""
    by_run = {p.run: p for p in points}
    return [by_run.get(r) for r in runs]


#: What a panel says at a run that has no figure for it.
GAP = "no figure\nin this run"


def figure(cell_id: str, trends: Mapping[str, Sequence[Point]], runs: Sequence[str] = ()) -> Figure:
    """The matplotlib Figure of one cell's trends: one panel per figure, every panel on the same runs (`run_order`);
    a run without the panel's figure is a labelled gap, never left out."""
    from matplotlib.figure import Figure

    names = sorted(trends)
    order = run_order(trends, runs)
    rows = -(-len(names) // COLUMNS)
    fig = Figure(figsize=(4.2 * COLUMNS, 2.8 * rows + 0.6), layout="constrained")
    fig.suptitle(f"{cell_id}: 40-throughput over time (median, 95% interval)", fontsize=10)
    axes = fig.subplots(rows, COLUMNS, squeeze=False).ravel()
    x = list(range(len(order)))
    for ax, name in zip(axes, names, strict=False):
        points = aligned(trends[name], order)
        medians = [p.median if p is not None else math.nan for p in points]
        ax.plot(x, medians, marker="o", color="#1f5fa8", linewidth=1.5)
        # The band breaks where a run has no interval (NaN): it never bridges a gap.
        lows = [
            p.low if p is not None and p.low is not None and p.high is not None else math.nan for p in points
        ]
        highs = [
            p.high if p is not None and p.low is not None and p.high is not None else math.nan for p in points
        ]
        if any(not math.isnan(v) for v in lows):
            ax.fill_between(x, lows, highs, color="#1f5fa8", alpha=0.18, linewidth=0)
        for i, p in zip(x, points, strict=True):
            if p is None:
                ax.axvspan(i - 0.4, i + 0.4, color="#d0d7de", alpha=0.5, linewidth=0)
                ax.text(
                    i,
                    0.5,
                    GAP,
                    transform=ax.get_xaxis_transform(),
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="#57606a",
                )
        ax.set_title(name, fontsize=9)
        ax.set_xlim(-0.5, len(order) - 0.5)
        ax.set_xticks(x, order, rotation=30, ha="right", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    return fig


def render(cell_id: str, trends: Mapping[str, Sequence[Point]], runs: Sequence[str] = ()) -> bytes:
    """The PNG of one cell's trends (matplotlib's Agg backend: no display needed)."""
    buffer = io.BytesIO()
    figure(cell_id, trends, runs).savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def matplotlib_missing() -> str | None:
    """Why PNGs cannot be drawn here, or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed: pip install 'stackfarm[plots]' (nox -s report installs it)"
    return None


def _cells(series: Series) -> dict[str, dict[str, list[Point]]]:
    return {cell: trends for cell, figs in sorted(series.items()) if (trends := throughput_trends(figs))}


def why_not(series: Series) -> str | None:
    """Why `write` draws nothing for `series` although it has throughput figures, or None."""
    return matplotlib_missing() if _cells(series) else None


def write(series: Series, reports_dir: Path, runs: Sequence[str] = ()) -> list[Path]:
    """One PNG per cell that has throughput figures, on the history's `runs` (in order); each written
    atomically. Nothing without matplotlib."""
    cells = _cells(series)
    if not cells or matplotlib_missing() is not None:
        return []
    written = []
    for cell_id, trends in cells.items():
        path = reports_dir / cell_id / FILENAME
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, render(cell_id, trends, runs))
        written.append(path)
    return written


__all__ = [
    "FILENAME",
    "GAP",
    "Point",
    "aligned",
    "figure",
    "matplotlib_missing",
    "render",
    "run_order",
    "throughput_trends",
    "why_not",
    "write",
]
