"""trendplot: the throughput figures of a real report history drawn as PNGs, linked from history.md.

The history is five real 40-throughput runs on the lent H200 (tests/test_throughput_fixtures/h200-history:
the JUnit and verdict.json each run wrote; runs 1-3 serve the tiny model, 4-5 the Llama-3-8B shape).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from stackfarm import history, trendplot

HISTORY = Path(__file__).parent / "test_throughput_fixtures" / "h200-history"
CELL = "cu130-torch2.11.0-sk0.4.4-fi0.6.12-sgl0.5.15"
PREFIX = trendplot.SUITE_PREFIX


def test_trends_take_medians_and_intervals_and_nothing_else() -> None:
    figures = {
        f"{PREFIX}decode_tok_s.median": [("run-1", 680.0), ("run-2", 690.0)],
        f"{PREFIX}decode_tok_s.ci_low": [("run-1", 476.0)],
        f"{PREFIX}decode_tok_s.ci_high": [("run-1", 698.0), ("run-2", 799.0)],
        f"{PREFIX}decode_tok_s.cv": [("run-1", 0.15)],
        "40-throughput::test_threshold[decode_tok_s]::median": [("run-1", 680.0)],
        "10-capability::seconds": [("run-1", 3.0)],
    }
    trends = trendplot.throughput_trends(figures)
    assert list(trends) == ["decode_tok_s"]
    assert trends["decode_tok_s"] == [
        trendplot.Point(run="run-1", median=680.0, low=476.0, high=698.0),
        trendplot.Point(run="run-2", median=690.0, low=None, high=799.0),  # a run without ci_low: no band
    ]


def test_a_cell_without_throughput_figures_gets_no_plot(tmp_path: Path) -> None:
    assert trendplot.write({CELL: {"10-capability::seconds": [("run-1", 3.0)]}}, tmp_path) == []
    assert not any(tmp_path.iterdir())


def test_the_real_h200_history_is_plotted_and_linked(tmp_path: Path) -> None:
    hist = history.write(HISTORY, tmp_path)
    decode = trendplot.throughput_trends(hist.series[CELL])["decode_tok_s"]
    assert [p.run for p in decode] == ["run-1", "run-2", "run-3", "run-4", "run-5"]
    assert decode[2].median == pytest.approx(693.6, abs=0.1)  # tiny model
    assert decode[3].median == pytest.approx(214.4, abs=0.1)  # Llama-3-8B shape
    assert all(p.low is not None and p.low <= p.median <= (p.high or 0) for p in decode)

    png = tmp_path / CELL / trendplot.FILENAME
    pixels = imread(io.BytesIO(png.read_bytes()), format="png")
    height, width = pixels.shape[:2]
    assert (width, height) == (1386, 1298)  # 3 x 4 panels: the 12 figures of a run with EAGLE-3
    line = (0x1F / 255, 0x5F / 255, 0xA8 / 255)
    drawn = ((abs(pixels[..., 0] - line[0]) < 0.02) & (abs(pixels[..., 1] - line[1]) < 0.02)).sum()
    assert drawn > 2000  # the median lines and markers are there, not an empty grid

    markdown = (tmp_path / "history.md").read_text(encoding="utf-8")
    assert f"![{CELL}]({CELL}/{trendplot.FILENAME})" in markdown


def test_without_matplotlib_history_md_says_how_to_get_the_plots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trendplot, "matplotlib_missing", lambda: "matplotlib is not installed: pip install x")
    history.write(HISTORY, tmp_path)
    assert not (tmp_path / CELL / trendplot.FILENAME).exists()
    markdown = (tmp_path / "history.md").read_text(encoding="utf-8")
    assert "- no plots: matplotlib is not installed: pip install x" in markdown


def test_every_run_is_on_every_panel_and_a_missing_figure_is_a_labelled_gap(tmp_path: Path) -> None:
    """Run 4 measured no EAGLE-3: its EAGLE-3 panels still show run-4 (a labelled gap), and run-5's point
    sits at run-5, not in run-4's place."""
    hist = history.write(HISTORY, tmp_path)
    trends = trendplot.throughput_trends(hist.series[CELL])
    runs = [r.name for r in hist.runs]
    assert [p.run for p in trends["eagle3_decode_tok_s"]] == ["run-1", "run-2", "run-3", "run-5"]
    fig = trendplot.figure(CELL, trends, runs)
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    assert set(panels) == set(trends)
    for name, ax in panels.items():
        assert [t.get_text() for t in ax.get_xticklabels()] == runs, name
        (line,) = ax.get_lines()
        xs = [float(v) for v in np.asarray(line.get_xdata(), dtype=float)]
        ys = [float(v) for v in np.asarray(line.get_ydata(), dtype=float)]
        assert xs == [0, 1, 2, 3, 4]
        gaps = [t.get_text() for t in ax.texts]
        if name.startswith("eagle3_"):
            assert gaps == [trendplot.GAP], name
            assert ys[3] != ys[3], "run-4 is a gap (NaN), not run-5's value"  # NaN
            assert ys[4] == pytest.approx(trends[name][-1].median)
        else:
            assert gaps == [], name
    assert trendplot.run_order(trends) == runs  # without the history's order: the panels' own, merged
