from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Literal

import pytest
from junitparser import JUnitXml, TestSuite

from conftest import cell_report
from stackfarm import reports
from stackfarm.errors import EnvironmentProblem
from stackfarm.verdict import CellReport, SourceLine, Status, SuiteResult

# Tiny real suites; each becomes one pytest process writing its own --junitxml, as the runner does.
SUITES = {
    "pass": "def test_one():\n    pass\n\ndef test_two():\n    assert 1 + 1 == 2\n",
    "fail": (
        "import pytest\n\n"
        "def test_ok():\n    pass\n\n"
        "def test_bad():\n    assert False, 'boom <script>alert(1)</script> | pipe'\n\n"
        "@pytest.mark.skip(reason='later')\ndef test_later():\n    pass\n"
    ),
    "skip": "import pytest\n\npytestmark = pytest.mark.skip(reason='needs GPU')\n\ndef test_gpu(): pass\n",
    "empty": "X = 1\n",
}


@pytest.fixture(scope="module")
def xmls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("suites")
    (root / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    procs, out = [], {}
    for name, body in SUITES.items():
        (root / f"test_{name}.py").write_text(body)
        out[name] = root / f"{name}.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"test_{name}.py"]
        cmd.append(f"--junitxml={out[name]}")
        procs.append(subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL))
    assert [p.wait(timeout=120) for p in procs] == [0, 1, 0, 5]
    return out


def _read(path: Path, suite: str, cell: str = "c1") -> SuiteResult:
    return reports.read_suite(path, cell=cell, suite=suite)


def _suites(path: Path) -> dict[str, TestSuite]:
    return {str(ts.name): ts for ts in JUnitXml.fromfile(str(path))}


def _props(ts: TestSuite) -> dict[str, str]:
    props = ts.properties()  # type: ignore[no-untyped-call]  # junitparser: unannotated
    return {str(p.name): str(p.value) for p in props}


# --------------------------------------------------------------------------- read_suite


def test_read_suite_outcomes_and_counts(xmls: dict[str, Path]) -> None:
    ok = _read(xmls["pass"], "00-stack")
    assert (ok.outcome, ok.tests, ok.failures, ok.errors, ok.skipped) == ("passed", 2, 0, 0, 0)
    assert ok.first_failure is None
    assert ok.xml == xmls["pass"]
    assert (ok.cell, ok.suite) == ("c1", "00-stack")

    bad = _read(xmls["fail"], "01-kernels")
    assert (bad.outcome, bad.tests, bad.failures, bad.errors, bad.skipped) == ("failed", 3, 1, 0, 1)
    assert bad.first_failure is not None
    assert bad.first_failure.startswith("test_bad: ")
    assert "boom <script>" in bad.first_failure
    assert "\n" not in bad.first_failure

    skipped = _read(xmls["skip"], "02-gpu")
    assert (skipped.outcome, skipped.tests, skipped.skipped) == ("skipped", 1, 1)

    empty = _read(xmls["empty"], "03-empty")
    assert (empty.outcome, empty.tests) == ("error", 0)  # no tests is not a pass


def test_read_suite_missing_or_garbage_file_is_error(tmp_path: Path) -> None:
    missing = _read(tmp_path / "nope.xml", "00-stack")
    assert (missing.outcome, missing.tests, missing.xml) == ("error", 0, None)
    (tmp_path / "bad.xml").write_text("<testsuites><testsuite")
    assert _read(tmp_path / "bad.xml", "00-stack").outcome == "error"


@pytest.mark.parametrize("kind", ["skipped", "error"])
def test_write_skipped_suite(tmp_path: Path, kind: Literal["skipped", "error"]) -> None:
    path = tmp_path / "c1" / "01-kernels.xml"
    reports.write_skipped_suite(
        path, cell="c1", suite="01-kernels", reason="gated off by 00-stack", kind=kind
    )
    (ts,) = list(JUnitXml.fromfile(str(path)))
    assert ts.name == "c1::01-kernels"
    (case,) = list(ts)
    assert (case.classname, case.name) == ("c1.01-kernels", "suite")
    assert case.result[0].message == "gated off by 00-stack"
    res = _read(path, "01-kernels")
    assert (res.outcome, res.tests) == (kind, 1)
    assert (res.skipped, res.errors) == ((1, 0) if kind == "skipped" else (0, 1))
    if kind == "error":
        assert res.first_failure == "suite: gated off by 00-stack"
    assert sorted(p.name for p in path.parent.iterdir()) == ["01-kernels.xml"]


# --------------------------------------------------------------------------- merge


def _plan(cell: str, status: str, reason: str) -> CellReport:
    return cell_report(cell=cell, status=status, reason=reason, properties={"axis.torch": "2.9.1"}, suites=())


@pytest.fixture
def cells(xmls: dict[str, Path], tmp_path: Path) -> list[CellReport]:
    gated = tmp_path / "b-01.xml"
    reports.write_skipped_suite(gated, cell="b", suite="01-kernels", reason="gated off")
    return [
        cell_report(
            cell="a",
            status="ran",
            reason="",
            properties={"axis.torch": "2.9.1", "torch.version": "2.9.1", "torch.sha256": "abc"},
            suites=(_read(xmls["pass"], "00-stack", "a"), _read(xmls["fail"], "01-kernels", "a")),
        ),
        cell_report(
            cell="b",
            status="reused",
            reason="",
            properties={"axis.torch": "2.8.0"},
            suites=(_read(xmls["pass"], "00-stack", "b"), _read(gated, "01-kernels", "b")),
        ),
        _plan("c", "conflict", "sgl-kernel 0.3.21 requires torch==2.8.*"),
        _plan("d", "error", "wheel <x> missing"),
        _plan("e", "excluded", "excluded by matrix.toml"),
    ]


def test_merge_keeps_cells_apart_and_totals_add_up(cells: list[CellReport], tmp_path: Path) -> None:
    out = tmp_path / "reports" / "junit.xml"
    reports.merge(cells, out)
    root = JUnitXml.fromfile(str(out))
    suites = _suites(out)
    assert len(suites) == len(list(root))  # no two suites share a name
    assert set(suites) == {"a::00-stack", "a::01-kernels", "b::00-stack", "b::01-kernels"} | {
        "c::plan",
        "d::plan",
        "e::plan",
    }
    ran = [s for c in cells for s in c.suites]
    assert root.tests == sum(s.tests for s in ran) + 3 == sum(ts.tests for ts in root)
    assert root.failures == sum(s.failures for s in ran) == 1
    assert root.errors == sum(s.errors for s in ran) + 2  # conflict + error
    assert root.skipped == sum(s.skipped for s in ran) + 1  # excluded
    assert suites["a::00-stack"].tests == suites["b::00-stack"].tests == 2

    assert _props(suites["a::01-kernels"]) == {
        "axis.torch": "2.9.1",
        "torch.version": "2.9.1",
        "torch.sha256": "abc",
        "torch.source": "",
        "stackfarm.cell": "a",
        "stackfarm.suite": "01-kernels",
    }
    assert _props(suites["b::00-stack"])["axis.torch"] == "2.8.0"
    assert _props(suites["c::plan"])["stackfarm.suite"] == "plan"

    (conflict,) = list(suites["c::plan"])
    assert conflict.is_error
    # No matrix.toml beside the reports folder: the location is the file without a line.
    assert conflict.result[0].message == "matrix.toml: sgl-kernel 0.3.21 requires torch==2.8.*"
    assert next(iter(suites["d::plan"])).is_error
    assert next(iter(suites["e::plan"])).is_skipped
    assert sorted(p.name for p in out.parent.iterdir()) == ["junit.xml"]


def test_merge_locates_a_cell_that_never_ran_where_the_plan_typed_it(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.toml"
    cells = [
        CellReport(cell="c", status=Status.CONFLICT, reason="sglang 0.5.9 requires torch==2.9.1",
                   declared_at=SourceLine(path=str(matrix), line=3)),
        CellReport(cell="d", status=Status.ERROR, reason="/p/runners/x.toml:7: `gpus` must be a number",
                   declared_at=SourceLine(path="/p/runners/x.toml", line=7)),
        CellReport(cell="f", status=Status.CONFLICT, reason="older verdict", declared_at=None),
    ]  # fmt: skip
    reports.merge(cells, tmp_path / "reports" / "junit.xml", matrix=matrix)
    root = JUnitXml.fromfile(str(tmp_path / "reports" / "junit.xml"))
    messages = {str(ts.name): next(iter(ts)).result[0].message for ts in root}
    assert messages == {
        "c::plan": "matrix.toml:3: sglang 0.5.9 requires torch==2.9.1",
        "d::plan": "/p/runners/x.toml:7: `gpus` must be a number",
        "f::plan": "matrix.toml: older verdict",
    }


def test_merge_never_greener_than_the_verdict(xmls: dict[str, Path], tmp_path: Path) -> None:
    empty = _read(xmls["empty"], "03-empty")
    lost = SuiteResult(
        cell="a", suite="04-lost", outcome="error", tests=0, failures=0, errors=0, skipped=0,
        time=0.0, first_failure="pytest killed", xml=None,
    )  # fmt: skip
    cell = cell_report(cell="a", status="ran", reason="", properties={}, suites=(empty, lost))
    reports.merge([cell], tmp_path / "junit.xml")
    root = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    assert root.errors == 2
    assert {str(ts.name) for ts in root} == {"a::03-empty", "a::04-lost"}


# --------------------------------------------------------------------------- write_atomic


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "summary.md"
    reports.write_atomic(target, "one ✅")
    reports.write_atomic(target, "two")
    assert target.read_text(encoding="utf-8") == "two"
    assert [p.name for p in target.parent.iterdir()] == ["summary.md"]
    assert target.stat().st_mode & 0o777 == 0o644


def test_write_atomic_failure_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "junit.xml"
    target.write_text("old")

    def boom(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(EnvironmentProblem, match="disk full"):
        reports.write_atomic(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["junit.xml"]


# --------------------------------------------------------------------------- summaries


def test_markdown_grid_status_and_totals(cells: list[CellReport]) -> None:
    md = reports.summary_markdown(cells, title="nightly")
    lines = md.splitlines()
    assert lines[0] == "## nightly"
    header = next(line for line in lines if line.startswith("| cell"))
    assert header == "| cell | 00-stack | 01-kernels | status | first failure |"
    row = {line.split("|")[1].strip(): line for line in lines if line.startswith("| `")}
    assert set(row) == {"`a`", "`b`", "`c`", "`d`", "`e`"}
    assert "✅ 2/2 passed" in row["`a`"]
    assert "❌ 1 of 3 failed: test_bad: AssertionError: boom" in row["`a`"], "the reason in the grid cell"
    assert "01-kernels: test_bad: AssertionError: boom \\<script\\>" in row["`a`"]
    assert "&lt;" not in row["`a`"], "markdown without HTML entities"
    assert re.search(r"(?<!\\)<script", md) is None, "no raw tag reaches the markdown"
    assert "\\| pipe" in row["`a`"]  # a pipe in a message cannot break the table
    assert row["`a`"].count(" | ") == row["`b`"].count(" | ")
    # b: one passed suite and one gated-off suite -> skipped, not passed, and the cell is not a pass
    assert "⏭ skipped" in row["`b`"]
    assert "✅ passed" not in row["`b`"]
    assert "incomplete (reused)" in row["`b`"]
    assert row["`c`"].count("—") == 2
    assert "sgl-kernel 0.3.21 requires torch==2.8.*" in row["`c`"]
    assert "- `c` — conflict: sgl-kernel 0.3.21 requires torch==2.8.*" in lines
    assert "- `d` — error: wheel \\<x\\> missing" in lines
    assert not any(line.startswith("- `e`") for line in lines)  # excluded is not a problem
    assert "**5 cells: 1 failed, 1 incomplete, 1 conflict, 1 excluded, 1 error**" in lines


def test_markdown_all_passed() -> None:
    suite = SuiteResult(
        cell="a", suite="00-stack", outcome="passed", tests=3, failures=0, errors=0, skipped=0,
        time=1.0, first_failure=None, xml=None,
    )  # fmt: skip
    md = reports.summary_markdown(
        [cell_report(cell="a", status="ran", reason="", properties={}, suites=(suite,))]
    )
    assert "| `a` | ✅ 3/3 passed | ✅ passed |  |" in md
    assert "**1 cell: 1 passed**" in md


def test_html_is_escaped_and_standalone(cells: list[CellReport]) -> None:
    page = reports.summary_html(cells, title="<b>matrix</b>")
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page
    assert "boom &lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;matrix&lt;/b&gt;" in page
    assert "wheel &lt;x&gt; missing" in page
    assert 'class="o o-passed"' in page
    assert 'class="o o-failed"' in page
    assert 'class="o o-skipped"' in page
    assert 'class="o v-conflict"' in page
    assert "1 of 3 failed" in page  # a's 01-kernels
    assert '<span class="why">test_bad: AssertionError: boom &lt;script&gt;' in page, "the reason under it"
    assert page.count("<details>") == len(cells)
    assert "torch.sha256" in page
    assert "http" not in page  # no external resources


def test_write_summaries(cells: list[CellReport], tmp_path: Path) -> None:
    out = tmp_path / "reports"
    reports.write_summaries(cells, out)
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "summary.html", "summary.md"]
    assert len(_suites(out / "junit.xml")) == 7
    assert (out / "summary.md").read_text(encoding="utf-8") == reports.summary_markdown(cells)


def test_merge_moves_testcase_properties_onto_the_suite_and_locates_failures(tmp_path: Path) -> None:
    (tmp_path / "test_fig.py").write_text(
        "def test_figures(record_property):\n    record_property('decode_tok_s.median', '218.7')\n\n"
        "def test_bad():\n    assert 1 == 2, 'nope'\n"
    )
    xml = tmp_path / "40-throughput.xml"
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore",
        f"--junitxml={xml}",
    ]
    subprocess.run([*cmd, "test_fig.py"], cwd=tmp_path, env=env, capture_output=True, check=False)
    cell = cell_report(cell="c1", status="ran", suites=(_read(xml, "40-throughput", "c1"),))
    out = tmp_path / "reports" / "junit.xml"
    reports.merge([cell], out)
    (suite,) = list(JUnitXml.fromfile(str(out)))
    assert _props(suite)["test_figures::decode_tok_s.median"] == "218.7"
    assert "<properties>" not in "".join(ET.tostring(c._elem, encoding="unicode") for c in suite)
    bad = next(c for c in suite if c.name == "test_bad")
    assert bad.classname == "c1.40-throughput.test_fig"
    assert bad.result[0].message.startswith("test_fig.py:5: "), bad.result[0].message
