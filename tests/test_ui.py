"""ui: progress in a CI log (no terminal) is a line per stage change, never every percent, never cut."""

from __future__ import annotations

import io

from rich.console import Console

from stackfarm.ui import CellProgress, stage_of


def test_stage_rounds_percentages_to_quarters() -> None:
    assert stage_of("fetch torch 37%") == "fetch torch 25%"
    assert stage_of("fetch torch 99.5%") == "fetch torch 75%"
    assert stage_of("suite 10-capability") == "suite 10-capability"


def _log(updates: list[str]) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=40, highlight=False, soft_wrap=True)
    with CellProgress(console, live=False) as ui:
        for text in updates:
            ui.update("cu128-a-very-long-cell-id-that-passes-forty-columns", text)
    return out.getvalue().splitlines()


def test_a_line_per_suite_and_per_quarter_of_a_download() -> None:
    lines = _log(
        ["resolve", *(f"fetch torch {p}%" for p in range(0, 101, 5)), "suite 00-stack", "suite 10-capability"]
    )
    assert [line.split(": ", 1)[1] for line in lines] == [
        "resolve",
        "fetch torch 0%",
        "fetch torch 25%",
        "fetch torch 50%",
        "fetch torch 75%",
        "fetch torch 100%",
        "suite 00-stack",
        "suite 10-capability",
    ]
    assert all(
        line.startswith("  cu128-a-very-long-cell-id-that-passes-forty-columns: ") for line in lines
    ), "no hard wrapping at the console's width"
