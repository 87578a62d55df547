"""stackfarm.junit.read: the one reader of a suite's testcases and properties, as typed records."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackfarm import junit

XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4" timestamp="2026-12-01T10:00:00">
<properties><property name="capability.sm_90.torch" value="ok"/></properties>
<testcase classname="t" name="test_ok" time="0.5"><properties><property name="figure" value="3.5"/></properties></testcase>
<testcase classname="t" name="test_bad" time="1"><failure message="">

assert 1 == 2
more</failure></testcase>
<testcase classname="t" name="test_err"><error message="boom">trace</error></testcase>
<testcase classname="t" name="test_skip"><skipped message="needs a GPU"/></testcase>
</testsuite><testsuite name="second" tests="0" timestamp="2026-12-01T11:00:00"/></testsuites>
"""


def test_read_gives_typed_cases_properties_and_the_latest_timestamp(tmp_path: Path) -> None:
    path = tmp_path / "00-x.xml"
    path.write_text(XML)
    read = junit.read(path)
    assert read.properties == {"capability.sm_90.torch": "ok"}
    assert read.timestamp == "2026-12-01T11:00:00"
    assert [(c.name, c.outcome, c.message, c.time) for c in read.cases] == [
        ("test_ok", "passed", "", 0.5),
        ("test_bad", "failed", "assert 1 == 2", 1.0),
        ("test_err", "error", "boom", 0.0),
        ("test_skip", "skipped", "needs a GPU", 0.0),
    ]
    assert read.cases[0].properties == {"figure": "3.5"}
    assert read.cases[1].properties == {}


def test_an_unusable_file_raises_one_of_unreadable(tmp_path: Path) -> None:
    (tmp_path / "bad.xml").write_text("<testsuites><testsuite")
    for path in (tmp_path / "bad.xml", tmp_path / "missing.xml"):
        with pytest.raises(junit.UNREADABLE):
            junit.read(path)
