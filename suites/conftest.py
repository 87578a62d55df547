"""Shared fixtures for every suite: the cell under test, described by the file $STACKFARM_CELL; and the hook
that marks a testcase skipped by ``suitekit.not_applicable(NA.<class>, text)`` in the JUnit file (the only
way a skip counts as "does not apply to this cell")."""

from __future__ import annotations

import os

import pytest

from stackfarm.cellspec import CellSpec, load
from stackfarm.suitekit import pytest_runtest_makereport  # noqa: F401  # a hook: pytest finds it here


@pytest.fixture(scope="session")
def cell() -> CellSpec:
    path = os.environ.get("STACKFARM_CELL")
    if not path:
        pytest.fail("STACKFARM_CELL is not set: suites are run by stackfarm (nox -s matrix), not by hand")
    return load(path)


def pytest_report_header() -> str:
    return f"stackfarm cell: {os.environ.get('STACKFARM_CELL', '(none)')}"
