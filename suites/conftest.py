"""Shared fixtures for every suite: the cell under test, described by the file $STACKFARM_CELL."""

from __future__ import annotations

import os

import pytest

from stackfarm.cellspec import CellSpec, load


@pytest.fixture(scope="session")
def cell() -> CellSpec:
    path = os.environ.get("STACKFARM_CELL")
    if not path:
        pytest.fail("STACKFARM_CELL is not set: suites are run by stackfarm (nox -s matrix), not by hand")
    return load(path)


def pytest_report_header() -> str:
    return f"stackfarm cell: {os.environ.get('STACKFARM_CELL', '(none)')}"
