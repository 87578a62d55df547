"""10-capability: the analysis runs once per session, at collection; each finding becomes one testcase.

The arch x component grid goes to the terminal summary, to ``capability.md`` beside the JUnit file, into the
suite's record (``10-capability.json``, family.py: what the report renders) and, for JUnit readers, into the
testsuite properties ``capability.<arch>.<component>``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from capability_findings import Analysis, Finding, analyse, grid, grid_markdown

from stackfarm import families
from stackfarm.cellspec import load
from stackfarm.family import Results

#: This folder's family.py (its record classes).
FAMILY = families.module(Path(__file__).with_name(families.FAMILY_FILE))

#: The type of pytest's record_property / record_testsuite_property fixtures.
RecordProperty = Callable[[str, object], None]


@functools.cache
def analysis() -> Analysis:
    path = os.environ.get("STACKFARM_CELL")
    if not path:
        out = Analysis()
        out.add(
            Finding(
                "error",
                "all",
                "-",
                "",
                0,
                "STACKFARM_CELL",
                "",
                "fail",
                "STACKFARM_CELL is not set: suites are run by stackfarm (python -m stackfarm run)",
            )
        )
        return out
    try:
        cell = load(path)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        out = Analysis()
        out.add(Finding("error", "all", "-", path, 0, "cell.json", "", "fail", f"cannot read {path}: {exc}"))
        return out
    return analyse(cell)


def pytest_configure(config: pytest.Config) -> None:
    # pytest warns that record_property "is incompatible with junit_family xunit2", yet writes the properties
    # (the runner's reports read them); one warning per finding would bury the real ones.
    config.addinivalue_line("filterwarnings", "ignore:record_property is incompatible:pytest.PytestWarning")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "finding" not in metafunc.fixturenames:
        return
    findings = analysis().findings
    ids = _unique([f"{f.kind}-{f.id}" for f in findings])
    metafunc.parametrize("finding", findings, ids=ids)


def _unique(ids: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for i in ids:
        seen[i] = seen.get(i, 0) + 1
        out.append(i if seen[i] == 1 else f"{i}#{seen[i]}")
    return out


@pytest.fixture(scope="session", autouse=True)
def _grid_properties(record_testsuite_property: RecordProperty, results: Results[Any]) -> None:
    for (arch, component), text in sorted(grid(analysis()).items()):
        record_testsuite_property(f"capability.{arch}.{component}", text)
        results.add("grid", FAMILY.GridCell(arch=arch, component=component, text=text))
    for name, seconds in analysis().timings.items():
        record_testsuite_property(f"capability.seconds.{name}", f"{seconds:.3f}")
        results.add("timings", FAMILY.Timing(step=name, seconds=seconds))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if not analysis.cache_info().currsize:
        return
    cell = Path(os.environ.get("STACKFARM_CELL", "cell")).parent.name or "cell"
    text = grid_markdown(analysis(), f"capability map: {cell}")
    terminalreporter.write_sep("=", "capability map (arch x component)")
    terminalreporter.write_line(text)
    xml = getattr(config.option, "xmlpath", None)
    if xml:
        target = Path(xml).with_name("capability.md")
        try:
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            terminalreporter.write_line(f"(could not write {target}: {exc})")
