"""Format 0 of the suite families (stackfarm.family.SuiteFamily.legacy): a run held from before 10-capability and
15-toolchain wrote records (its verdict binds no record sha256, there is no <suite>.json, the findings are in the
JUnit testcase and testsuite properties) still renders its capability and toolchain sections, the ones its page
showed then; a run that binds a record is never read from its properties.

The held runs are the H200 runs committed in tests/test_gpu_runs (both from before records). The second one's
index.html was written by the renderer of then, so its sections are the renderings to keep; the first one's page
predates the toolchain section, so that section is checked by its rows.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stackfarm import families, history, htmlreport, sections
from stackfarm.family import SuiteFamily, record_path, sha256_of, write_record
from stackfarm.history import Case, CellRun, SuiteRun
from stackfarm.junit import NA_PROPERTY

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "tests" / "test_gpu_runs"
HELD = ("h200-2026-12-02", "h200-2026-12-02b")
CAPABILITY, TOOLCHAIN = "10-capability", "15-toolchain"
TITLES = {CAPABILITY: "Capability findings", TOOLCHAIN: "Toolchain and backend selection"}


@pytest.fixture(scope="module")
def registry() -> sections.Families:
    return families.load(REPO / "suites")


def _cell(name: str) -> CellRun:
    (cell,) = history.read_run(RUNS / name).cells.values()
    return cell


def _section(page: str, title: str) -> str | None:
    """The page's section under <h2>title</h2>, up to the next <h2>; None when there is none."""
    start = page.find(f"<h2>{title}</h2>")
    if start < 0:
        return None
    end = page.find("<h2>", start + 4)
    return page[start : end if end >= 0 else len(page)]


@pytest.mark.parametrize("name", HELD)
def test_the_held_runs_predate_records(name: str) -> None:
    cell = _cell(name)
    for suite in (CAPABILITY, TOOLCHAIN):
        run = cell.suite(suite)
        assert run is not None
        assert run.result.xml is not None
        assert run.result.record_sha256 is None, "a held run's verdict binds no record"
        assert not record_path(run.result.xml.parent, suite).exists()


@pytest.mark.parametrize("name", HELD)
def test_a_held_run_renders_its_capability_and_toolchain_sections(
    name: str, registry: sections.Families
) -> None:
    page = htmlreport.cell_page(_cell(name), registry=registry)
    held = (RUNS / name / _cell(name).cell / "index.html").read_text()
    for suite, title in TITLES.items():
        shown = _section(page, title)
        assert shown is not None, f"{name}: no {suite} section"
        assert "problems" not in shown, shown
        then = _section(held, title)
        if then is not None:  # the page of then had this section: it is the same
            assert shown == then
    assert _section(held, TITLES[TOOLCHAIN]) is not None or name == HELD[0]


def test_the_first_runs_toolchain_section_has_its_rows(registry: sections.Families) -> None:
    """h200-2026-12-02's page of then had no toolchain section (it predates it): the section judges sm_90 from
    the two testcases (triton, flashinfer-jit), both passed, no selection finding."""
    shown = _section(htmlreport.cell_page(_cell(HELD[0]), registry=registry), TITLES[TOOLCHAIN])
    assert shown is not None
    assert "<td><strong>sm_90</strong></td><td>passed</td><td>no finding</td>" in shown
    assert "Findings: 2 passed, 0 not passed" in shown
    assert "test_finding[triton-sm_90]" in shown
    assert "test_finding[flashinfer-jit-sm_90]" in shown
    assert "triton/backends/nvidia/compiler.py:99" in shown


def test_the_capability_record_of_a_held_run(registry: sections.Families) -> None:
    run = _cell(HELD[1]).suite(CAPABILITY)
    assert run is not None
    legacy = registry[CAPABILITY].legacy
    assert legacy is not None
    record = legacy(run)
    assert record is not None
    assert {(g.arch, g.component, g.text) for g in record.grid} >= {("sm_90", "torch", "ok")}
    assert len(record.findings) == sum("verdict" in c.properties for c in run.cases)
    assert {t.step for t in record.timings} == {"binaries", "tables", "gates"}
    first = record.findings[0]
    assert (first.arch, first.component, first.file, first.line) == (
        "sm_90", "torch", "torch/lib/libtorch_cuda.so", 0
    )  # fmt: skip


def _case(name: str, outcome: Any = "passed", **props: str) -> Case:
    return Case(name=name, classname="c", outcome=outcome, message="", time=0.0, properties=props)


def _suite_run(template: SuiteRun, cases: tuple[Case, ...], properties: dict[str, str]) -> SuiteRun:
    return dataclasses.replace(template, cases=cases, properties=properties)


def test_toolchain_verdicts_of_a_held_run_are_the_renderer_of_then(registry: sections.Families) -> None:
    """An arch is the worst of its testcases: a skip marked does-not-apply is "n/a" (never unanswered); the
    kind comes from the ``kind`` property or the testcase id."""
    template = _cell(HELD[0]).suite(TOOLCHAIN)
    assert template is not None
    cases = (
        _case("test_finding[triton-sm_100]", arch="sm_100"),
        _case("test_finding[toolkit-sm_100]", "failed", arch="sm_100"),
        _case("test_finding[selection-sm_100-x]", "skipped", arch="sm_100", **{NA_PROPERTY: "hardware"}),
        _case("test_check[x]", "skipped", arch="sm_120", kind="selection-attention"),
        _case("test_other", "failed"),  # no arch: not a finding
    )
    legacy = registry[TOOLCHAIN].legacy
    assert legacy is not None
    record = legacy(_suite_run(template, cases, {}))
    assert record is not None
    assert [(v.arch, v.toolchain, v.selection) for v in record.archs] == [
        ("sm_100", "failed (1 of 2)", "n/a"),
        ("sm_120", "no finding", "unanswered (1 of 1)"),
    ]
    assert [f.testcase for f in record.findings] == [c.name for c in cases[:4]]
    assert legacy(_suite_run(template, cases[4:], {})) is None, "no finding: no record, no section"


def test_a_held_run_without_findings_shows_no_section(registry: sections.Families) -> None:
    cell = _cell(HELD[0])
    bare = tuple(
        _suite_run(s, tuple(_case(c.name, c.outcome) for c in s.cases), {}) if s.result.suite in TITLES else s
        for s in cell.suites
    )
    page = htmlreport.cell_page(dataclasses.replace(cell, suites=bare), registry=registry)
    assert all(_section(page, title) is None for title in TITLES.values())


def _never(_suite: Any) -> Any:
    raise AssertionError("a run that binds a record was read from its properties")


def _copied(tmp_path: Path, name: str, suite: str) -> tuple[CellRun, SuiteRun]:
    """The held cell with `suite`'s JUnit file copied under tmp_path (a record can be put beside it)."""
    cell = _cell(name)
    run = cell.suite(suite)
    assert run is not None
    assert run.result.xml is not None
    xml = tmp_path / run.result.xml.name
    shutil.copy(run.result.xml, xml)
    moved = dataclasses.replace(run, result=dataclasses.replace(run.result, xml=xml))
    suites = tuple(moved if s.result.suite == suite else s for s in cell.suites)
    return dataclasses.replace(cell, suites=suites), moved


def _binding(cell: CellRun, suite: str, sha256: str | None) -> CellRun:
    suites = tuple(
        dataclasses.replace(s, result=dataclasses.replace(s.result, record_sha256=sha256))
        if s.result.suite == suite
        else s
        for s in cell.suites
    )
    return dataclasses.replace(cell, suites=suites)


@pytest.mark.parametrize("suite", [CAPABILITY, TOOLCHAIN])
def test_a_run_that_binds_a_record_is_never_read_from_properties(
    suite: str, tmp_path: Path, registry: sections.Families
) -> None:
    family: SuiteFamily[Any, Any] = dataclasses.replace(registry[suite], legacy=_never)
    cell, run = _copied(tmp_path, HELD[1], suite)
    assert run.result.xml is not None
    path = record_path(run.result.xml.parent, suite)

    # bound, but not there: a problem line, not the properties
    out = sections.family_section(family, _binding(cell, suite, "0" * 64), {})
    assert "the verdict binds a record that is not there" in out
    assert "<table" not in out

    # bound and there: the record is what is shown (an empty one: no findings, no section body)
    assert family.record is not None
    write_record(path, suite, family.record())
    out = sections.family_section(family, _binding(cell, suite, sha256_of(path)), {})
    assert out == "", out

    # a record file but no binding (a held run with a stray record): never read, neither file nor properties
    out = sections.family_section(family, _binding(cell, suite, None), {})
    assert "binds no record sha256" in out
    assert "<table" not in out


def test_a_bound_record_is_shown_not_the_properties(tmp_path: Path, registry: sections.Families) -> None:
    family: SuiteFamily[Any, Any] = dataclasses.replace(registry[CAPABILITY], legacy=_never)
    cell, run = _copied(tmp_path, HELD[1], CAPABILITY)
    assert run.result.xml is not None
    assert family.record is not None
    path = record_path(run.result.xml.parent, CAPABILITY)
    grid_cell = families.module(REPO / "suites" / CAPABILITY / "family.py").GridCell
    record = family.record(grid=(grid_cell(arch="sm_1", component="c", text="from the record"),))
    write_record(path, CAPABILITY, record)
    out = sections.family_section(family, _binding(cell, CAPABILITY, sha256_of(path)), {})
    assert "from the record" in out
    assert "libtorch_cuda.so" not in out, "the held properties are not read"


def test_the_families_declare_format_0(registry: sections.Families) -> None:
    for suite in TITLES:
        held: Callable[[Any], Any] | None = registry[suite].legacy
        assert held is not None, f"{suite} has no format 0"
