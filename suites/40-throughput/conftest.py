"""40-throughput: what each testcase states goes into the suite's record (family.py: what the report renders)
as well as into its JUnit properties (for JUnit readers).

- `setting`: a fact the run measured with (the configuration table), ``setting(key, value)``;
- `check_property`: a fact of the testcase's threshold check, ``check_property(key, value)``; the check goes
  into the record when the testcase ends, as far as it got (a check that failed before judging has no verdict);
- a testcase that does not apply (stackfarm.suitekit.not_applicable) states its class among the configuration,
  as its JUnit properties do;
- `figure`: a measured figure, ``figure(name, stats)``: its statistics as properties, the figure into the record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stackfarm import families
from stackfarm.family import Results
from stackfarm.junit import NA_PROPERTY

#: This folder's family.py (its record classes).
FAMILY = families.module(Path(__file__).with_name(families.FAMILY_FILE))

#: The type of pytest's record_property fixture, and of `setting` and `check_property`.
RecordProperty = Callable[[str, object], None]


@pytest.fixture
def setting(
    request: pytest.FixtureRequest, record_property: RecordProperty, results: Results[Any]
) -> RecordProperty:
    """record_property, and the fact into the record's configuration."""

    def add(key: str, value: object) -> None:
        record_property(key, value)
        results.add("config", FAMILY.Setting(testcase=request.node.name, key=key, value=str(value)))

    return add


@pytest.fixture
def check_property(
    request: pytest.FixtureRequest, record_property: RecordProperty, results: Results[Any]
) -> Iterator[RecordProperty]:
    """record_property, and the fact into the testcase's check (added to the record when the testcase ends)."""
    stated: dict[str, object] = {}

    def add(key: str, value: object) -> None:
        record_property(key, value)
        stated[key] = value

    yield add
    if "figure" in stated:
        results.add("checks", FAMILY.Check.of(request.node.name, stated))


@pytest.fixture
def figure(
    request: pytest.FixtureRequest, record_property: RecordProperty, results: Results[Any]
) -> Callable[[str, dict[str, Any]], None]:
    """``figure(name, stats)``: a measured figure's statistics (family.STATS) and samples as properties
    ``<name>.<stat>``, and the figure into the record (family.figure_facts)."""

    def add(name: str, stats: dict[str, Any]) -> None:
        for key in FAMILY.STATS:
            record_property(f"{name}.{key}", stats[key])
        record_property(f"{name}.samples", json.dumps([round(x, 4) for x in stats["samples"]]))
        shown, rows = FAMILY.figure_facts(request.node.name, name, stats)
        if shown is not None:
            results.add("figures", shown)
        for row in rows:
            results.add("config", row)

    return add


@pytest.fixture(autouse=True)
def _not_applicable(request: pytest.FixtureRequest, results: Results[Any]) -> Iterator[None]:
    """After the testcase: the class of a `not_applicable` skip (the property suitekit's hook states last)."""
    yield
    for key, value in request.node.user_properties:
        if key == NA_PROPERTY:
            results.add("config", FAMILY.Setting(testcase=request.node.name, key=key, value=str(value)))
