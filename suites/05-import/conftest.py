"""05-import: the static analysis runs once, at collection; each native library becomes one testcase."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from import_findings import findings, library_id

#: The type of pytest's record_property / record_testsuite_property fixtures.
RecordProperty = Callable[[str, object], None]


def pytest_configure(config: pytest.Config) -> None:
    # record_property "is incompatible with junit_family xunit2" yet writes the properties the reports read.
    config.addinivalue_line("filterwarnings", "ignore:record_property is incompatible:pytest.PytestWarning")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "native" not in metafunc.fixturenames:
        return
    libraries = findings().abi.libraries
    metafunc.parametrize("native", libraries, ids=[library_id(v) for v in libraries])


@pytest.fixture(scope="session", autouse=True)
def _suite_properties(record_testsuite_property: RecordProperty) -> None:
    found = findings()
    record_testsuite_property("import.platform", found.platform.tag)
    record_testsuite_property("import.seconds", f"{found.seconds:.3f}")
    # What the checks judged: each component's installation (never the cell's claim), or that it has none.
    for comp in found.claimed.components if found.claimed is not None else ():
        inst = found.installed.get(comp.distribution)
        where = f"{inst.version} ({inst.info})" if inst is not None else "not installed"
        record_testsuite_property(f"import.installed.{comp.distribution}", where)
    for name, seconds in found.abi.timings.items():
        record_testsuite_property(f"import.seconds.{name}", f"{seconds:.3f}")
    floor = found.floor()
    if floor is not None:
        record_testsuite_property("import.driver_floor", floor.driver)
        record_testsuite_property("import.driver_floor_reason", floor.reason)
