"""30-numerics: each testcase's figures go into the suite's record (family.py: what the report renders) as well
as into its JUnit properties (for JUnit readers): one `Comparison` per testcase that states any of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stackfarm import families
from stackfarm.family import Results

#: This folder's family.py (its record classes).
FAMILY = families.module(Path(__file__).with_name(families.FAMILY_FILE))


@pytest.fixture(autouse=True)
def _comparison(request: pytest.FixtureRequest, results: Results[Any]) -> Iterator[None]:
    """After the testcase: the figures it stated (test_numerics._record, by their names) into the record."""
    yield
    stated = dict(request.node.user_properties)
    found = FAMILY.Comparison.of(request.node.name, stated)
    if found is not None:
        results.add("comparisons", found)
