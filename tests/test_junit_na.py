"""n/a is earned: junit.count counts a skip as "does not apply" only when suitekit's hook marked it (testcase
property stackfarm.not_applicable = a known reason class), for pytest's own per-suite files (xunit2, which pytest
writes testcase properties into anyway) as the runner reads them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

from stackfarm import junit
from stackfarm.junit import NA, NA_PROPERTY

REPO = Path(__file__).resolve().parent.parent

SUITE = """
import pytest

from stackfarm.suitekit import NA, not_applicable


@pytest.fixture
def needs_sglang():
    not_applicable(NA.COMPONENT_ABSENT, "the cell has no sglang")


def test_passes():
    pass


def test_marked():
    not_applicable(NA.FEATURE_ABSENT, "the release has no such gate")


def test_marked_in_a_fixture(needs_sglang):
    pass


def test_plain_text():
    pytest.skip("n/a: whatever")


def test_untyped_call():
    not_applicable("the old call")


def test_forged(record_property):
    record_property("stackfarm.not_applicable", "component-absent")
    pytest.skip("n/a: forged")


def test_forged_over_a_real_one(record_property):
    record_property("stackfarm.not_applicable", "arch-not-targeted")
    not_applicable(NA.RUNNER_GPUS, "a real one")


def test_gpu():
    pytest.skip("needs GPU: none here")
"""


def _run(tmp_path: Path) -> Path:
    """The suite above under a copy of the real suites/conftest.py, as the runner runs it (backends.pytest_argv)."""
    suite = tmp_path / "suites" / "10-na"
    suite.mkdir(parents=True)
    shutil.copy(REPO / "suites" / "conftest.py", tmp_path / "suites" / "conftest.py")
    (suite / "test_it.py").write_text(textwrap.dedent(SUITE), encoding="utf-8")
    xml = tmp_path / "10-na.xml"
    env = {**os.environ, "STACKFARM_CELL": str(tmp_path / "cell.json"), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(suite), f"--junitxml={xml}", "-q", "-p", "no:cacheprovider",
         "-W", "ignore::pytest.PytestWarning"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return xml


def _cases(xml: Path) -> dict[str, tuple[str, list[tuple[str | None, str | None]]]]:
    """name -> (skip message, the testcase's properties)."""
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        skipped = case.find("skipped")
        props = [(p.get("name"), p.get("value")) for p in case.iter("property")]
        out[str(case.get("name"))] = ((skipped.get("message") or "") if skipped is not None else "", props)
    return out


def test_only_the_hooks_mark_counts(tmp_path: Path) -> None:
    xml = _run(tmp_path)
    cases = _cases(xml)
    mark = NA_PROPERTY
    assert cases["test_marked"] == ("n/a: the release has no such gate", [(mark, "feature-absent")])
    assert cases["test_marked_in_a_fixture"] == ("n/a: the cell has no sglang", [(mark, "component-absent")])
    assert cases["test_plain_text"] == ("n/a: whatever", [])
    assert cases["test_untyped_call"] == ("n/a: the old call", [])
    assert cases["test_forged"] == ("n/a: forged", []), "a suite's own property of that name is dropped"
    assert cases["test_forged_over_a_real_one"] == ("n/a: a real one", [(mark, "runner-gpus")])
    counts = junit.count(xml)
    assert (counts.tests, counts.not_applicable, counts.skipped) == (8, 3, 4)
    assert counts.first_skip == (
        "test_plain_text: n/a: whatever "
        "(says n/a, but not through suitekit.not_applicable with a reason class: unanswered)"
    )


def _file(tmp_path: Path, props: str, message: str) -> Path:
    path = tmp_path / "s.xml"
    path.write_text(
        '<testsuites><testsuite name="s" tests="2" failures="0" errors="0" skipped="1" time="0">'
        '<testcase classname="t" name="test_ok" time="0"/>'
        f'<testcase classname="t" name="test_x" time="0">{props}<skipped message="{message}"/></testcase>'
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    return path


def test_count_wants_a_known_class(tmp_path: Path) -> None:
    for na in NA:
        prop = f'<properties><property name="{NA_PROPERTY}" value="{na.value}"/></properties>'
        counts = junit.count(_file(tmp_path, prop, "n/a: yes"))
        assert (counts.not_applicable, counts.skipped, counts.first_skip) == (1, 0, None), na
    prop = f'<properties><property name="{NA_PROPERTY}" value="vibes"/></properties>'
    counts = junit.count(_file(tmp_path, prop, "n/a: trust me"))
    assert (counts.not_applicable, counts.skipped) == (0, 1)
    assert counts.first_skip is not None
    assert counts.first_skip.startswith(
        f"test_x: n/a: trust me (marked {NA_PROPERTY}='vibes', not a reason class"
    )


def test_a_plain_n_a_text_is_unanswered(tmp_path: Path) -> None:
    counts = junit.count(_file(tmp_path, "", "n/a: the cell has no flashinfer"))
    assert (counts.not_applicable, counts.skipped) == (0, 1)
    assert counts.first_skip == (
        "test_x: n/a: the cell has no flashinfer "
        "(says n/a, but not through suitekit.not_applicable with a reason class: unanswered)"
    )
    other = junit.count(_file(tmp_path, "", "needs GPU: none here"))
    assert other.first_skip == "test_x: needs GPU: none here", "other skips keep their own explanation"
