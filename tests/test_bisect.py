"""`stackfarm bisect` (stackfarm.bisect): the axis whose change alone flips the verdict, then the first bad
release of it on the index, in at most ⌈log₂ n⌉ + (differing axes) cells, stored verdicts reused; and the twin
rule. End to end on the fake stack with more releases on its find_links index, and pure on a fake runner."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping

import pytest
from packaging.version import Version

import fakestack
from fakestack import OLD, FakeProject, cell_id, write_wheel
from stackfarm.bisect import Bisector, Finding, describe, regression_twins, twin_check, twins
from stackfarm.cli import bisect as bisect_cli
from stackfarm.errors import ExitCode, StackfarmError
from stackfarm.plan import Cell, Conflict
from stackfarm.verdict import CellReport, Status

pytest_plugins = ("fakestack",)

#: Fails from flashinfer 0.6.5 on: the regression the bisect must find.
BY_VERSION = """
    from packaging.version import Version


    def test_flashinfer_works(cell):
        version = cell.values["flashinfer"]
        assert Version(version) < Version("0.6.5"), f"synthetic regression in flashinfer {version}"
"""
#: More releases on the index: 0.6.6 lacks its cubin wheel (not a candidate), 0.6.8rc1 is a pre-release.
FLASHINFER = ("0.6.4", "0.6.4.post1", "0.6.5", "0.6.7", "0.6.8", "0.6.9")
BAD = {**OLD, "torch": "2.9.2", "flashinfer": "0.6.9"}


@pytest.fixture
def project(fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch) -> FakeProject:
    wheels = fake_project.wheels
    # SGLang 0.5.9 pinning loosely, so that torch and flashinfer can each move alone.
    write_wheel(wheels, "sglang", "0.5.9",
                requires=("torch>=2.9.1", "sgl-kernel==0.3.21", "flashinfer-python>=0.6.3"))  # fmt: skip
    write_wheel(wheels, "torch", "2.9.2")
    for version in FLASHINFER:
        write_wheel(wheels, "flashinfer-python", version)
        write_wheel(wheels, "flashinfer-cubin", version)
    write_wheel(wheels, "flashinfer-python", "0.6.6")
    write_wheel(wheels, "flashinfer-python", "0.6.8rc1")
    write_wheel(wheels, "flashinfer-cubin", "0.6.8rc1")
    monkeypatch.setitem(fakestack.SUITES, "by-version", BY_VERSION)
    fake_project.suite("00-ok", "pass")
    fake_project.suite("10-flashinfer", "by-version")
    fake_project.write_matrix([OLD, BAD])
    return fake_project


def bisect(project: FakeProject, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    bisect_cli.register(parser.add_subparsers())
    where = ["--matrix", str(project.matrix), "--reports", str(project.reports), "--backend", "local"]
    parsed = parser.parse_args(["bisect", *where, *args])
    code = parsed.func(parsed)
    out = capsys.readouterr().out
    return code, out


def test_bisect_finds_the_axis_and_the_first_bad_release(
    project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    # The nightly ran both cells: the bisect reuses their verdicts.
    assert project.run() == ExitCode.CELLS_FAILED
    before = len({cell for cell, _ in project.runs()})
    code, out = bisect(project, capsys, "--good", cell_id(OLD), "--bad", cell_id(BAD))
    assert code == ExitCode.OK
    assert "axis: flashinfer (0.6.3 -> 0.6.9 alone flips the verdict)" in out
    assert "releases between them: 0.6.4 0.6.4.post1 0.6.5 0.6.7 0.6.7.post2 0.6.8 (n = 7)" in out
    assert "first bad release: flashinfer 0.6.5" in out
    assert "synthetic regression in flashinfer 0.6.5" in out
    assert "last good release: flashinfer 0.6.4.post1 (passed" in out
    run = sorted({cell for cell, _ in project.runs()})
    searched = len(run) - before
    bound = math.ceil(math.log2(7)) + 2  # n = 7 releases, 2 differing axes
    assert searched == 5 <= bound
    assert re.search(rf"cells run: 5 \(5 by the search, bound .* = {bound}; 0 of the good/bad", out)
    assert "stored verdicts reused: 2" in out
    assert cell_id({**OLD, "flashinfer": "0.6.6"}) not in run, "0.6.6 lacks a wheel: not a candidate"
    # Again: every verdict is stored, nothing runs.
    code, out = bisect(project, capsys, "--good", cell_id(OLD), "--bad", cell_id(BAD))
    assert code == ExitCode.OK
    assert "cells run: 0 " in out
    assert len({cell for cell, _ in project.runs()}) == len(run)
    # The twin check over what the store now holds: 0.6.5 fails where its twin 0.6.4.post1 passes.
    code, out = bisect(project, capsys, "--twins")
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert (
        f"flashinfer: {cell_id({**OLD, 'flashinfer': '0.6.4.post1'})}"
        in lines[cell_id({**OLD, "flashinfer": "0.6.5"})]
    )
    assert lines[cell_id(BAD)] == f"flashinfer: {cell_id({**BAD, 'flashinfer': '0.6.3'})}"
    assert code == ExitCode.CELLS_FAILED, "a regression shown by a twin fails the check"


def test_bisect_refuses_a_good_cell_that_fails(
    project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(StackfarmError, match=r"--good .* is failed, not good"):
        bisect(project, capsys, "--good", cell_id(BAD), "--bad", cell_id(OLD))
    with pytest.raises(StackfarmError, match="neither in the plan"):
        bisect(project, capsys, "--good", "cu99-nothing", "--bad", cell_id(BAD))


# --------------------------------------------------------------------------- pure, on a fake runner


class FakeBisector(Bisector):
    """Cells are judged by `fails(values)`; the releases of each axis are `published`."""

    def __init__(
        self,
        fails: Callable[[Mapping[str, str]], bool],
        published: Mapping[str, list[str]],
        untestable: frozenset[str] = frozenset(),
    ) -> None:
        # No matrix, no resolver: cell_for and releases below stand in for both.
        self.fails = fails
        self.published = published
        self.untestable = untestable
        self.ran: list[str] = []
        self._with_python = False
        self._memo = {}
        self.run_cell = self._run

    def cell_for(self, values: Mapping[str, str]) -> Cell | Conflict:
        cell = Cell(id=cell_id(values), values=tuple(values.items()), components=(), patch_sets=())
        if any(v in self.untestable for v in values.values()):
            return Conflict(cell=cell, problems=("pins contradict the cell",))
        return cell

    def _run(self, cell: Cell) -> CellReport:
        self.ran.append(cell.id)
        bad = self.fails(cell.as_dict())
        return CellReport(cell=cell.id, status=Status.FAILED if bad else Status.PASSED, values=cell.as_dict(),
                          reason=f"broken by {cell.as_dict()}" if bad else "")  # fmt: skip

    def releases(self, axis: str, good: str, bad: str, values: Mapping[str, str]) -> tuple[str, ...]:
        inside = [v for v in self.published[axis] if Version(good) < Version(v) < Version(bad)]
        return (good, *inside, bad)


GOOD = {"cuda": "12.8", "torch": "2.9.1", "sgl_kernel": "0.3.21", "flashinfer": "0.6.0", "sglang": "0.5.9"}


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 100, 257])
@pytest.mark.parametrize("breaks_at", [0.0, 0.5, 1.0])
def test_the_number_of_cells_is_at_most_log2_n_plus_axes(n: int, breaks_at: float) -> None:
    published = [f"0.6.{i}" for i in range(1, n + 1)]
    first_bad = published[min(int(breaks_at * n), n - 1)]
    bisector = FakeBisector(
        lambda v: Version(v["flashinfer"]) >= Version(first_bad), {"flashinfer": published, "torch": []}
    )
    bad = {**GOOD, "flashinfer": published[-1], "torch": "2.9.2"}
    finding = bisector.run(GOOD, bad)
    assert finding.axis == "flashinfer"
    assert finding.first_bad is not None
    assert finding.first_bad.values["flashinfer"] == first_bad
    assert len(bisector.ran) - 2 == finding.search_run <= math.ceil(math.log2(n)) + 2 == finding.bound


def test_untestable_releases_and_axes_are_left_out() -> None:
    published = [f"0.6.{i}" for i in range(1, 11)]
    bisector = FakeBisector(
        lambda v: Version(v["flashinfer"]) >= Version("0.6.6"),
        {"flashinfer": published},
        untestable=frozenset({"0.6.5", "2.9.2"}),
    )
    bad = {**GOOD, "flashinfer": "0.6.10", "torch": "2.9.2", "sglang": "0.5.10"}
    with pytest.raises(StackfarmError, match=r"--bad .* is conflict"):
        bisector.run(GOOD, bad)
    bisector = FakeBisector(
        lambda v: Version(v["flashinfer"]) >= Version("0.6.6"),
        {"flashinfer": published},
        untestable=frozenset({"0.6.5"}),
    )
    finding = bisector.run(GOOD, {**GOOD, "flashinfer": "0.6.10", "sglang": "0.5.10"})
    assert finding.first_bad is not None
    assert finding.first_bad.values["flashinfer"] == "0.6.6"
    assert finding.last_good is not None
    assert finding.last_good.values["flashinfer"] == "0.6.4"
    assert any("0.6.5: conflict, left out" in n for n in finding.notes)


def test_no_single_axis_says_so() -> None:
    both = FakeBisector(lambda v: v["torch"] == "2.9.2" and v["flashinfer"] == "0.6.9", {})
    finding = both.run(GOOD, {**GOOD, "torch": "2.9.2", "flashinfer": "0.6.9"})
    assert finding.axis is None
    assert finding.first_bad is None
    assert "no single axis of torch, flashinfer makes the good cell fail" in "\n".join(describe(finding))


# --------------------------------------------------------------------------- twins


def _report(status: Status, **values: str) -> CellReport:
    merged = {**GOOD, **values}
    return CellReport(cell=cell_id(merged), status=status, values=merged)


def test_a_failure_is_a_regression_only_beside_a_passing_twin() -> None:
    failed = _report(Status.FAILED, flashinfer="0.6.5")
    twin = _report(Status.PASSED, flashinfer="0.6.4")
    far = _report(Status.PASSED, flashinfer="0.6.4", torch="2.9.2")  # two axes away: no twin
    failing_twin = _report(Status.FAILED, torch="2.9.2", flashinfer="0.6.5")
    alone = _report(Status.FAILED, flashinfer="0.6.9", torch="2.9.2", sglang="0.5.10")
    reports = [failed, twin, far, failing_twin, alone]
    assert twins(failed, reports) == [twin, failing_twin]
    assert regression_twins(failed, reports) == [twin]
    checked = twin_check(reports)
    assert checked[failed.cell] == [("flashinfer", twin.cell)]
    assert checked[failing_twin.cell] == [("flashinfer", far.cell)]
    assert checked[alone.cell] == []


def test_describe_without_a_finding_is_short() -> None:
    probe = FakeBisector(lambda v: False, {}).probe(GOOD)
    lines = describe(Finding(good=probe, bad=probe))
    assert lines[0].startswith("good: ")
