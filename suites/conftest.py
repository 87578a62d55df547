"""Shared fixtures for every suite: the cell under test, described by the file $STACKFARM_CELL; the suite
family's parsed settings and its record (stackfarm.family); and the hook that marks a testcase skipped by
``suitekit.not_applicable(NA.<class>, text)`` in the JUnit file (the only way a skip counts as "does not apply
to this cell").

A suite folder with a family.py gets:

- ``settings``: its family's frozen settings, parsed by matrix.load and handed over in CellSpec.settings;
- ``results``: its record under construction (stackfarm.family.Results: ``add(field, item)``, ``set(field,
  value)``), written at session finish as ``<suite>.json`` into $STACKFARM_SUITE_OUT (the cell's reports
  folder, beside the JUnit file; the folder of --junitxml when the runner sets none).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from stackfarm import families
from stackfarm.cellspec import CellSpec, load
from stackfarm.family import Results, SuiteFamily, record_path, write_record
from stackfarm.suitekit import pytest_runtest_makereport  # noqa: F401  # a hook: pytest finds it here

_RESULTS = pytest.StashKey[Results[Any]]()


@pytest.fixture(scope="session")
def cell() -> CellSpec:
    path = os.environ.get("STACKFARM_CELL")
    if not path:
        pytest.fail("STACKFARM_CELL is not set: suites are run by stackfarm (nox -s matrix), not by hand")
    return load(path)


def suite_family(config: pytest.Config) -> SuiteFamily[Any, Any] | None:
    """The family of the suite folder pytest runs (the folder given, or the folder of the file given)."""
    for arg in config.args:
        path = Path(arg.split("::", 1)[0]).resolve()
        folder = path if path.is_dir() else path.parent
        file = folder / families.FAMILY_FILE
        if file.is_file():
            return families.load_one(file)
    return None


def _family(config: pytest.Config, what: str) -> SuiteFamily[Any, Any]:
    family = suite_family(config)
    if family is None or getattr(family, what) is None:
        pytest.fail(
            f"this suite's family.py declares no {what} (stackfarm.family.SuiteFamily)", pytrace=False
        )
    return family


@pytest.fixture(scope="session")
def settings(cell: CellSpec, pytestconfig: pytest.Config) -> Any:
    """The suite's settings object (its family's settings class), as matrix.load parsed them."""
    family = _family(pytestconfig, "settings")
    return family.settings_of(cell.settings.get(family.name, {}))


@pytest.fixture(scope="session")
def results(pytestconfig: pytest.Config) -> Results[Any]:
    """The suite's record under construction, written as <suite>.json when the session ends."""
    return results_of(pytestconfig)


def results_of(config: pytest.Config) -> Results[Any]:
    """The session's record builder (a suite's conftest fills it at collection, its tests through `results`)."""
    if _RESULTS not in config.stash:
        family = _family(config, "record")
        config.stash[_RESULTS] = Results(family.record)
    return config.stash[_RESULTS]


def _out(config: pytest.Config) -> Path | None:
    out = os.environ.get("STACKFARM_SUITE_OUT")
    if out:
        return Path(out)
    xml = getattr(config.option, "xmlpath", None)
    return Path(xml).parent if xml else None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    family = suite_family(config)
    out = _out(config)
    if family is None or family.record is None or out is None or _RESULTS not in config.stash:
        return
    out.mkdir(parents=True, exist_ok=True)
    write_record(record_path(out, family.name), family.name, config.stash[_RESULTS].build())


def pytest_report_header() -> str:
    return f"stackfarm cell: {os.environ.get('STACKFARM_CELL', '(none)')}"
