"""The JUnit stackfarm writes is valid for the family it declares (xunit2), and its consumers read it right.

The rules (junit-10.xsd, the Jenkins/surefire schema pytest targets with ``junit_family=xunit2``), checked here
by our own reader rather than a copied schema file:

- <testsuites> allows name, time, tests, failures, disabled, errors — no ``skipped``;
- <testsuite> requires name, tests, failures, errors, skipped, time, timestamp, hostname (our rule: the
  optional ones always written), allows id, package, file, log, url, version, disabled; its children are one
  optional <properties> first, then <testcase>s, then <system-out>/<system-err>;
- <testcase> requires name, classname, time; allows assertions, status, class; no ``file``/``line`` and no
  <properties> (xunit2 has neither); its children are <skipped>, <error>, <failure>, <system-out>,
  <system-err>;
- <property> has name and value; <failure>, <error> and <skipped> message and type.

The realistic run is the fake stack's (tests/fakestack.py): one cell each passed, failed, incomplete, error
(an index that does not answer), conflict and excluded. Its merged file is read by our checker, by junitparser,
by junit2html (rendered in Chromium: one row per cell) and by a small JUnit-to-annotation reader like the
ones CI systems use (``::error file=...,line=...::message``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
from junitparser import JUnitXml

from fakestack import CONFLICT, CU130, NEW, OLD, FakeProject, cell_id
from stackfarm import junit, verdict
from stackfarm.errors import ExitCode

pytest_plugins = ("fakestack",)

TESTSUITES = {"name", "time", "tests", "failures", "disabled", "errors"}
TESTSUITE_REQUIRED = {"name", "tests", "failures", "errors", "skipped", "time", "timestamp", "hostname"}
TESTSUITE = TESTSUITE_REQUIRED | {"id", "package", "file", "log", "url", "version", "disabled"}
TESTCASE_REQUIRED = {"name", "classname", "time"}
TESTCASE = TESTCASE_REQUIRED | {"assertions", "status", "class"}
CHILD_ATTRS = {"property": {"name", "value"}, "failure": {"message", "type"}, "error": {"message", "type"},
               "skipped": {"message", "type"}, "properties": set(), "system-out": set(), "system-err": set()}  # fmt: skip
TESTSUITE_CHILDREN = ("properties", "testcase", "system-out", "system-err")
TESTCASE_CHILDREN = {"skipped", "error", "failure", "system-out", "system-err"}


def xunit2_problems(path: Path) -> list[str]:
    """Every way the file breaks the xunit2 rules above (empty when it is valid)."""
    root = ET.parse(path).getroot()
    out: list[str] = []

    def attrs(elem: ET.Element, where: str, allowed: set[str], required: set[str] | None = None) -> None:
        if required is None:
            required = set()
        out.extend(f"{where}: attribute {a!r} is not in xunit2" for a in sorted(set(elem.attrib) - allowed))
        out.extend(f"{where}: required attribute {a!r} missing" for a in sorted(required - set(elem.attrib)))

    if root.tag != "testsuites":
        return [f"root is <{root.tag}>, not <testsuites>"]
    attrs(root, "<testsuites>", TESTSUITES)
    for n, suite in enumerate(root):
        where = f"testsuite {suite.get('name', n)!r}"
        if suite.tag != "testsuite":
            out.append(f"<testsuites> holds <{suite.tag}>")
            continue
        attrs(suite, where, TESTSUITE, TESTSUITE_REQUIRED)
        order = [TESTSUITE_CHILDREN.index(c.tag) if c.tag in TESTSUITE_CHILDREN else -1 for c in suite]
        if -1 in order or order != sorted(order) or order.count(0) > 1:
            out.append(f"{where}: children {[c.tag for c in suite]} are not properties?, testcase*, system-*")
        for prop in suite.iter("property"):
            attrs(prop, f"{where} property", CHILD_ATTRS["property"], {"name", "value"})
        cases = suite.findall("testcase")
        if suite.get("tests") != str(len(cases)):
            out.append(f"{where}: tests={suite.get('tests')} but {len(cases)} testcases")
        for case in cases:
            cwhere = f"{where} testcase {case.get('name')!r}"
            attrs(case, cwhere, TESTCASE, TESTCASE_REQUIRED)
            for child in case:
                if child.tag not in TESTCASE_CHILDREN:
                    out.append(f"{cwhere}: <{child.tag}> is not allowed in a testcase")
                else:
                    attrs(child, f"{cwhere} <{child.tag}>", CHILD_ATTRS[child.tag])
            if len(case.findall("skipped")) > 1:
                out.append(f"{cwhere}: more than one <skipped>")
    return out


# --------------------------------------------------------------------------- the files the runner writes


def test_runner_written_files_are_xunit2(tmp_path: Path) -> None:
    skipped = tmp_path / "c1" / "20-after.xml"
    junit.write_skipped_suite(skipped, cell="c1", suite="20-after", reason="gated: 10-gate did not pass")
    errored = tmp_path / "c1" / "30-lost.xml"
    junit.write_skipped_suite(errored, cell="c1", suite="30-lost", reason="pytest died", kind="error")
    steps = tmp_path / "c1" / "00-patches.xml"
    junit.write_steps(
        steps, cell="c1", suite="00-patches",
        steps=[junit.Step(name="set/0001.patch", failure=None, properties={"patch.set/0001.patch.status": "applied"}),
               junit.Step(name="set/0002.patch", failure="drift: hunk 2\nmore", properties={})],
    )  # fmt: skip
    for path in (skipped, errored, steps):
        assert xunit2_problems(path) == [], path
    (suite,) = list(JUnitXml.fromfile(str(steps)))
    assert {str(c.classname) for c in suite} == {"c1.00-patches"}


def test_the_checker_finds_what_pytest_xunit2_files_break(tmp_path: Path) -> None:
    """pytest's own per-suite files carry testcase properties once a suite calls record_property: invalid
    xunit2, which is why the merged file moves them (see below)."""
    (tmp_path / "test_p.py").write_text("def test_p(record_property):\n    record_property('x', 1)\n")
    xml = tmp_path / "p.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", f"--junitxml={xml}",
         "test_p.py"], cwd=tmp_path, check=True, capture_output=True,
    )  # fmt: skip
    assert any("<properties> is not allowed in a testcase" in p for p in xunit2_problems(xml))


# --------------------------------------------------------------------------- a realistic run

#: Passes on CUDA 13.0, needs a GPU on 12.8 (incomplete), fails on SGLang 0.5.10.
CHECK_SUITE = """
import pytest


def test_passes(cell):
    assert cell.values["sglang"], "the cell names its sglang"


def test_depends_on_the_cell(cell):
    v = cell.values
    if v["sglang"] == "0.5.10":
        raise AssertionError(f"synthetic failure on sglang {v['sglang']}")
    if v["cuda"] == "12.8" and not OK_ON_12_8:
        pytest.skip("needs GPU: the fake stack has none")
"""
#: A CUDA 12.9 torch build that only a dead index would have: its cell is an environment error.
DEAD = {**OLD, "cuda": "12.9", "torch": "2.9.1+cu129"}
EXCLUDED = {**OLD, "flashinfer": "0.6.7.post2"}
CELLS = {
    "passed": cell_id(CU130),
    "failed": cell_id(NEW),
    "incomplete": cell_id(OLD),
    "error": cell_id(DEAD),
    "conflict": cell_id(CONFLICT),
    "excluded": cell_id(EXCLUDED),
}
EXTRA = """
[indexes.dead]
url = "http://127.0.0.1:9/simple"

[[route]]
requirement = "torch==2.9.1+cu129"
index = "dead"

[[exclude]]
flashinfer = "0.6.7.post2"
sglang = "0.5.9"
reason = "fi 0.6.7 is for SGLang 0.5.10"
"""


@dataclass(frozen=True)
class Run:
    project: FakeProject
    code: int

    @property
    def merged(self) -> Path:
        return self.project.reports / "junit.xml"


def _check_suite(project: FakeProject, *, ok_on_12_8: bool) -> None:
    folder = project.suite("10-check", "pass")
    (folder / "test_it.py").write_text(f"OK_ON_12_8 = {ok_on_12_8}\n" + CHECK_SUITE, encoding="utf-8")


@pytest.fixture
def run(fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setattr("stackfarm.artifacts.RETRY_DELAYS", ())  # a closed port answers at once anyway
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    fake_project.suite("00-ok", "pass")
    _check_suite(fake_project, ok_on_12_8=False)
    fake_project.write_matrix(
        [OLD, CU130, NEW, CONFLICT, DEAD], axes={"flashinfer": ["0.6.7.post2"]}, extra=EXTRA
    )
    return Run(fake_project, fake_project.run())


def test_a_realistic_run_has_every_status(run: Run) -> None:
    assert run.code == ExitCode.CELLS_FAILED
    stored, problems = verdict.read_all(run.project.reports)
    assert problems == []
    assert {s.report.cell: str(s.report.status) for s in stored} == {c: s for s, c in CELLS.items()}


def test_the_merged_file_is_valid_xunit2(run: Run) -> None:
    assert xunit2_problems(run.merged) == []
    root = ET.parse(run.merged).getroot()
    assert "skipped" not in root.attrib
    assert root.findall(".//testcase/properties") == []
    # Testcase properties moved onto the testsuite, named by their testcase.
    text = run.merged.read_text(encoding="utf-8")
    assert 'file="' not in text
    assert 'line="' not in text


def test_junitparser_reads_the_merged_file_with_cells_apart(run: Run) -> None:
    xml = JUnitXml.fromfile(str(run.merged))
    names = [str(ts.name) for ts in xml]
    assert len(names) == len(set(names))
    by_cell: dict[str, set[str]] = {}
    for ts in xml:
        cell = str(ts.name).split("::", 1)[0]
        for case in ts:
            assert str(case.classname).startswith(f"{cell}."), case.classname
            by_cell.setdefault(cell, set()).add(str(case.classname))
    assert set(by_cell) == set(CELLS.values()), "every planned cell is in the merged file"
    assert f"{CELLS['failed']}.10-check.test_it" in by_cell[CELLS["failed"]]
    assert f"{CELLS['conflict']}.plan" in by_cell[CELLS["conflict"]]
    failed = next(ts for ts in xml if ts.name == f"{CELLS['failed']}::10-check")
    assert failed.failures == 1


# --------------------------------------------------------------------------- a JUnit-to-annotation reader

_LOCATION = re.compile(r"^(?P<file>[^\s:]+?)(?::(?P<line>\d+))?: ")


def to_annotations(path: Path) -> list[str]:
    """GitHub workflow commands for each failure and error: the location is the head of the message
    ("path:line: ..." or "path: ..."), as the merged file writes it."""
    out = []
    for ts in ET.parse(path).getroot().iter("testsuite"):
        for case in ts.iter("testcase"):
            for result in case:
                if result.tag not in ("failure", "error"):
                    continue
                message = result.get("message") or (result.text or "").strip().splitlines()[0]
                title = f"{case.get('classname')}.{case.get('name')}"
                found = _LOCATION.match(message)
                if found is None:
                    out.append(f"::error title={title}::{message}")
                    continue
                where = f"file={found['file']}" + (f",line={found['line']}" if found["line"] else "")
                out.append(f"::error {where},title={title}::{message[found.end() :]}")
    return out


def test_annotations_point_at_the_test_and_at_matrix_toml(run: Run) -> None:
    lines = to_annotations(run.merged)
    by_cell = {cell: [a for a in lines if f"title={cell}." in a] for cell in CELLS.values()}
    assert by_cell[CELLS["passed"]] == []
    assert by_cell[CELLS["incomplete"]] == []
    assert by_cell[CELLS["excluded"]] == [], "an exclusion is a skip, not an error"
    (failure,) = by_cell[CELLS["failed"]]
    test_file = run.project.suites / "10-check" / "test_it.py"
    line = next(i for i, t in enumerate(test_file.read_text().splitlines(), 1) if "raise AssertionError" in t)
    found = re.search(r"::error file=(?P<file>[^,]+),line=(?P<line>\d+),", failure)
    assert found is not None, failure
    assert found["file"].endswith("10-check/test_it.py")
    assert int(found["line"]) == line
    assert "synthetic failure on sglang 0.5.10" in failure
    # The conflict points at the [[include]] of matrix.toml that made the cell, not at stackfarm's code.
    (conflict,) = by_cell[CELLS["conflict"]]
    matrix = run.project.matrix.read_text().splitlines()
    includes = [
        i for i, t in enumerate(matrix, 1) if t.strip() == "[[include]]"
    ]  # CU130, NEW, CONFLICT, DEAD
    assert conflict.startswith(f"::error file=matrix.toml,line={includes[2]},"), conflict
    assert "requires sglang-kernel==0.4.1" in conflict
    assert "plan.py" not in conflict
    # The unreachable index: no line is known, so matrix.toml alone.
    (error,) = by_cell[CELLS["error"]]
    assert error.startswith("::error file=matrix.toml,title="), error
    assert "127.0.0.1:9" in error


# --------------------------------------------------------------------------- junit2html, in Chromium


def test_junit2html_renders_each_cell_as_its_own_row(run: Run, tmp_path: Path) -> None:
    tool = shutil.which("junit2html", path=str(Path(sys.executable).parent)) or shutil.which("junit2html")
    if tool is None:
        pytest.skip("junit2html is not installed (the test extra has it)")
    page = tmp_path / "junit.html"
    done = subprocess.run(
        [tool, str(run.merged), str(page)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    html = page.read_text(encoding="utf-8")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    flags = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
        "--force-color-profile=srgb", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,2400",
    ]  # fmt: skip
    dom = subprocess.run(
        [*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=False
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = tmp_path / "junit.png"
    subprocess.run(
        [*flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True
    )
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("STACKFARM_KEEP_SCREENSHOTS")
    if keep:  # to look at it
        shutil.copy(shot, Path(keep) / "junit2html.png")
    toc = toc_rows(dom.stdout)
    for cell in CELLS.values():
        assert any(heading.startswith(f"{cell}.") for heading in toc), f"{cell} has no row of its own"
    assert all(any(h.startswith(f"{c}.") for c in CELLS.values()) for h in toc), toc
    # The same suite of two cells: two rows, each with its own outcome (not folded into one class).
    assert toc[f"{CELLS['failed']}.10-check.test_it"] == ["passed", "failed"]
    assert toc[f"{CELLS['incomplete']}.10-check.test_it"] == ["passed", "skipped"]
    assert toc[f"{CELLS['passed']}.10-check.test_it"] == ["passed", "passed"]
    assert toc[f"{CELLS['conflict']}.plan"] == ["failed"]
    assert len(html) > 0


def toc_rows(dom: str) -> dict[str, list[str]]:
    """junit2html's table of contents: each class (a row) and the outcomes of its testcases."""
    toc = dom.split('<ul class="toc">', 1)[1]
    return {
        heading: re.findall(r'class="outcome outcome-(\w+)"', body)
        for heading, body in re.findall(r"<li>\s*([^<\s]+)\s*<ul>(.*?)</ul>", toc, re.DOTALL)
    }


# --------------------------------------------------------------------------- stackfarm report


def _rows(project: FakeProject) -> dict[str, str]:
    text = (project.reports / "summary.md").read_text(encoding="utf-8")
    return {
        cell: next(line for line in text.splitlines() if line.startswith(f"| `{cell}`"))
        for cell in CELLS.values()
    }


def test_report_lists_every_planned_cell_and_a_single_cell_run_updates_its_row(run: Run) -> None:
    from stackfarm.cli import main

    reports = run.project.reports
    for name in ("summary.md", "summary.html", "junit.xml", "index.html"):
        (reports / name).unlink()
    assert main(["report", "--reports", str(reports)]) == 0
    before = _rows(run.project)
    for status, cell in CELLS.items():
        columns = [c.strip() for c in before[cell].strip("|").split(" | ")]
        assert status in columns[-2], (status, before[cell])
    page = (reports / "index.html").read_text(encoding="utf-8")
    assert {c: s for s, c in CELLS.items()} == dict(
        re.findall(r'<tr data-cell="([^"]+)" data-verdict="(\w+)"', page)
    )
    suites = {str(ts.name).split("::")[0] for ts in JUnitXml.fromfile(str(reports / "junit.xml"))}
    assert suites == set(CELLS.values())

    # One cell again, its suite now passing: only its row changes.
    _check_suite(run.project, ok_on_12_8=True)
    assert run.project.run("--cells", CELLS["incomplete"]) == ExitCode.OK
    after = _rows(run.project)
    assert "✅ passed" in after[CELLS["incomplete"]]
    assert {c: r for c, r in after.items() if c != CELLS["incomplete"]} == {
        c: r for c, r in before.items() if c != CELLS["incomplete"]
    }
    assert xunit2_problems(reports / "junit.xml") == []
