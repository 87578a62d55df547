"""PNG plots of the throughput figures over the report history: ``reports/<cell>/throughput-trends.png``.

The HTML pages draw their charts as inline SVG (one self-contained file each); these PNGs are for the places
that show images but not HTML: history.md on a code host, a CI artifact listing, a sign-off document. One
panel per figure of 40-throughput: its median per run, with the bootstrap interval as a band.

matplotlib is an optional extra (``pip install 'stackfarm[plots]'``, what ``nox -s report`` installs): the
matrix job never needs it, so it does not pay for it. Without it `write` plots nothing and history.md
says why (`why_not`).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .reports import write_bytes_atomic

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


def render(cell_id: str, trends: Mapping[str, Sequence[Point]]) -> bytes:
    """The PNG of one cell's trends (matplotlib's Agg backend: no display needed)."""
    from matplotlib.figure import Figure

    names = sorted(trends)
    rows = -(-len(names) // COLUMNS)
    fig = Figure(figsize=(4.2 * COLUMNS, 2.8 * rows + 0.6), layout="constrained")
    fig.suptitle(f"{cell_id}: 40-throughput over time (median, 95% interval)", fontsize=10)
    axes = fig.subplots(rows, COLUMNS, squeeze=False).ravel()
    for ax, name in zip(axes, names, strict=False):
        points = trends[name]
        x = list(range(len(points)))
        ax.plot(x, [p.median for p in points], marker="o", color="#1f5fa8", linewidth=1.5)
        banded = [
            (i, p.low, p.high)
            for i, p in zip(x, points, strict=True)
            if p.low is not None and p.high is not None
        ]
        if banded:
            index, lows, highs = zip(*banded, strict=True)
            ax.fill_between(index, lows, highs, color="#1f5fa8", alpha=0.18, linewidth=0)
        ax.set_title(name, fontsize=9)
        ax.set_xticks(x, [p.run for p in points], rotation=30, ha="right", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
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


def write(series: Series, reports_dir: Path) -> list[Path]:
    """One PNG per cell that has throughput figures; each written atomically. Nothing without matplotlib."""
    cells = _cells(series)
    if not cells or matplotlib_missing() is not None:
        return []
    written = []
    for cell_id, trends in cells.items():
        path = reports_dir / cell_id / FILENAME
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, render(cell_id, trends))
        written.append(path)
    return written


__all__ = ["FILENAME", "Point", "matplotlib_missing", "render", "throughput_trends", "why_not", "write"]
