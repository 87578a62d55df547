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
        return [ToolFinding("error", "all", "", "", "", "", 0, "fail",
                            "STACKFARM_CELL is not set: suites are run by stackfarm (python -m stackfarm run)")]  # fmt: skip
    try:
        cell = load(path)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return [ToolFinding("error", "all", "", "", "", path, 0, "fail", f"cannot read {path}: {exc}")]
    return cell_findings(cell)


#: A finding's outcome as its testcase ends (stackfarm.junit's words).
_AS_TESTCASE = {"fail": "failed", "skip": "skipped", "pass": "passed", "n/a": "n/a"}


def arch_verdicts(found: list[ToolFinding]) -> dict[tuple[str, str], str]:
    """(arch, "toolchain" | "selection") -> the worst outcome of its findings, in words ("failed (2 of 5)"):
    stackfarm.junit.worst_of, the rule the report's section applies to the same testcases."""
    groups: dict[tuple[str, str], list[str]] = {}
    for f in found:
        kind = "selection" if f.kind == "selection" else "toolchain"
        groups.setdefault((f.arch, kind), []).append(_AS_TESTCASE.get(f.outcome, "error"))
    return {key: worst_of(outcomes) for key, outcomes in groups.items()}


@pytest.fixture(scope="session", autouse=True)
def _arch_properties(record_testsuite_property: Callable[[str, object], None], results: Results[Any]) -> None:
    """Each arch's verdicts: into the record (the report's), and as ``toolchain.<arch>.toolchain`` and
    ``toolchain.<arch>.selection`` testsuite properties for JUnit readers."""
    verdicts = arch_verdicts(findings())
    for (arch, kind), text in sorted(verdicts.items()):
        record_testsuite_property(f"toolchain.{arch}.{kind}", text)
    for arch in sorted({arch for arch, _ in verdicts}):
        toolchain, selection = (verdicts.get((arch, kind), worst_of([])) for kind in ("toolchain", "selection"))
        results.add("archs", FAMILY.ArchVerdict(arch=arch, toolchain=toolchain, selection=selection))


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
