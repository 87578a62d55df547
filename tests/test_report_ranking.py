"""The root causes of summary.md, summary.html and index.html rank what failed first, then what errored, then
the questions left unanswered (skips, incomplete suites), and list the suites a gate kept from running under
that gate, not as root causes of their own.

The run is the real runner on the fake stack (two cells, stackfarm.tests' fakestack), shaped like the default
matrix on a machine without a GPU: every cell has "needs GPU" skips (the most widespread reason), one cell has
a real failure, a suite crashes in both, and a failing (or unanswered) gate keeps two suites from running.
"""

from __future__ import annotations

import html
import re

from fakestack import NEW, OLD, FakeProject, cell_id
from stackfarm.errors import ExitCode

pytest_plugins = ("fakestack",)

OLD_CELL, NEW_CELL = cell_id(OLD), cell_id(NEW)


def _run(project: FakeProject) -> None:
    project.suite("00-stack", "pass")
    project.suite("10-gpu", "gpu-skip", gate=False)  # both cells: needs GPU (incomplete)
    project.suite("20-bycell", "by-cell", gate=False)  # 0.5.10 fails, 0.5.9 needs GPU
    project.suite("25-crash", "import-crash", gate=False)  # both cells: an error
    project.suite("30-gate", "by-cell")  # a gate: fails on 0.5.10, unanswered on 0.5.9
    project.suite("40-after", "never", gate=False)
    project.suite("50-after", "never", gate=False)
    project.write_matrix([OLD, NEW])
    assert project.run() == ExitCode.CELLS_FAILED


def _causes_md(project: FakeProject) -> list[str]:
    md = (project.reports / "summary.md").read_text(encoding="utf-8")
    section = md.split("**Failures by root cause**", 1)[1].split("\n**", 1)[0]
    return [line for line in section.splitlines() if line.startswith(("- ", "  - "))]


def test_failures_rank_before_errors_before_unanswered_and_gated_suites_sit_under_their_gate(
    fake_project: FakeProject,
) -> None:
    _run(fake_project)
    lines = _causes_md(fake_project)
    heads = [line for line in lines if line.startswith("- ")]
    kinds = [re.match(r"- \S+ (failed|error|unanswered)", line) for line in heads]
    assert all(kinds), heads
    order = [k[1] for k in kinds if k]
    assert order == sorted(order, key=["failed", "error", "unanswered"].index), heads
    assert order[:2] == ["failed", "failed"], heads
    assert "synthetic failure on sglang X.Y" in heads[0]
    assert "needs GPU" in heads[-1] or "needs GPU" in heads[-2]
    # The widest reason (both cells need a GPU) comes after the one cell's real failure.
    gpu = next(i for i, line in enumerate(heads) if "10-gpu" in line)
    assert "2 cells" in heads[gpu]
    assert gpu > next(i for i, line in enumerate(heads) if "20-bycell" in line and "failed" in line)
    # Suites behind the gate are no root causes: they are listed under it (failed on one cell, unanswered
    # on the other).
    assert not any("40-after" in line or "50-after" in line for line in heads), heads
    under = [line for line in lines if line.startswith("  - ")]
    assert under == ["  - gated off behind it (not run): 40-after, 50-after"] * 2, lines
    for gate_line in (i for i, line in enumerate(lines) if line.startswith("- ") and "30-gate" in line):
        assert lines[gate_line + 1] == under[0]

    page = html.unescape((fake_project.reports / "index.html").read_text(encoding="utf-8"))
    causes = page.split("<h2>Failures by root cause</h2>", 1)[1]
    severities = re.findall(r'<li data-cells="\d+" data-severity="(\w+)">', causes)
    assert severities == order
    assert causes.count("gated off behind it (not run): 40-after, 50-after") == 2
    assert "40-after: " not in causes.split("gated off")[0]

    summary = html.unescape((fake_project.reports / "summary.html").read_text(encoding="utf-8"))
    assert re.findall(r'<li data-cells="\d+" data-severity="(\w+)">', summary) == order
    assert summary.count("gated off behind it (not run): 40-after, 50-after") == 2


def test_a_conflict_ranks_with_the_failures() -> None:
    """A conflict fails the run (exit 1), so its root cause is a failure, before any environment error."""
    from stackfarm.sections.grid import root_causes
    from stackfarm.verdict import CellReport, Status

    cells = [
        CellReport(cell="cu130-x-sgl0.5.9", status=Status.ERROR, values={}, reason="index unreachable"),
        CellReport(cell="cu130-y-sgl0.5.10", status=Status.ERROR, values={}, reason="index unreachable"),
        CellReport(
            cell="cu128-z-sgl0.5.10",
            status=Status.CONFLICT,
            values={},
            reason="sglang 0.5.10 requires flashinfer 0.6.7",
        ),
    ]
    found = root_causes(cells)
    assert [(c.severity, c.cells) for c in found] == [
        ("failed", ("cu128-z-sgl0.5.10",)),
        ("error", ("cu130-x-sgl0.5.9", "cu130-y-sgl0.5.10")),
    ]
    assert found[0].reason.startswith("conflict: ")
