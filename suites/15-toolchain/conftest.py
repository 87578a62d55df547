"""15-toolchain: the analysis runs once per session, at collection; each finding becomes one testcase."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from toolchain_cell import cell_findings

from stackfarm import families
from stackfarm.analysis.jitfindings import ToolFinding
from stackfarm.cellspec import load
from stackfarm.family import Results
from stackfarm.junit import worst_of

#: This folder's family.py (its record classes).
FAMILY = families.module(Path(__file__).with_name(families.FAMILY_FILE))


@functools.cache
def findings() -> list[ToolFinding]:
    path = os.environ.get("STACKFARM_CELL")
    if not path:
        return [
            ToolFinding(
                "error",
                "all",
                "",
                "",
                "",
                "",
                0,
                "fail",
                "STACKFARM_CELL is not set: suites are run by stackfarm (python -m stackfarm run)",
            )
        ]
    try:
        cell = load(path)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return [ToolFinding("error", "all", "", "", "", path, 0, "fail", f"cannot read {path}: {exc}")]
    return cell_findings(cell)


def arch_verdicts(found: list[ToolFinding]) -> dict[tuple[str, str], str]:
    """(arch, "toolchain" | "selection") -> the worst outcome of its findings, in words ("failed (2 of 5)"):
    family.py's arch_verdicts, the rule the record (and so the report's section) carries."""
    return {
        (v.arch, kind): text
        for v in FAMILY.arch_verdicts(found)
        for kind, text in (("toolchain", v.toolchain), ("selection", v.selection))
        if text != worst_of([])
    }


@pytest.fixture(scope="session", autouse=True)
def _arch_properties(record_testsuite_property: Callable[[str, object], None], results: Results[Any]) -> None:
    """Each arch's verdicts: into the record (the report's), and as ``toolchain.<arch>.toolchain`` and
    ``toolchain.<arch>.selection`` testsuite properties for JUnit readers."""
    for (arch, kind), text in sorted(arch_verdicts(findings()).items()):
        record_testsuite_property(f"toolchain.{arch}.{kind}", text)
    results.set("archs", FAMILY.arch_verdicts(findings()))


def pytest_configure(config: pytest.Config) -> None:
    # pytest warns that record_property "is incompatible with junit_family xunit2", yet writes the properties.
    config.addinivalue_line("filterwarnings", "ignore:record_property is incompatible:pytest.PytestWarning")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "finding" not in metafunc.fixturenames:
        return
    found = findings()
    seen: dict[str, int] = {}
    ids = []
    for f in found:
        seen[f.id] = seen.get(f.id, 0) + 1
        ids.append(f.id if seen[f.id] == 1 else f"{f.id}#{seen[f.id]}")
    metafunc.parametrize("finding", found, ids=ids)
