"""JUnit files, read and written only through junitparser: the per-suite files the runner writes itself (a
suite it did not run, the steps it performs) and the counts of a suite's file, skip reasons included.

Every file written here is valid xunit2 (the Jenkins/surefire junit-10 schema pytest targets with
``junit_family=xunit2``; `write_xml` enforces it): properties only on a testsuite, never on a testcase (a
testcase's properties move onto its testsuite as ``<testcase name>::<property>``); each testsuite carries
name, tests, failures, errors, skipped, time, timestamp and hostname, each testcase name, classname and time;
no attribute the schema lacks (no ``skipped`` on <testsuites>, no ``file``/``line`` on a testcase: a
location goes into the failure message as ``path:line: ...``, see `with_location`).

A skipped testcase counts as "does not apply to this cell" (`Counts.not_applicable`) only when it carries the
testcase property `NA_PROPERTY` with a value of `NA`: the hook of `stackfarm.suitekit` (loaded by
suites/conftest.py) writes it, and only for a skip raised by ``suitekit.not_applicable(NA.<class>, text)``. pytest
writes testcase properties into its per-suite files (xunit2 as well: the family lacks them, pytest writes them
anyway, and those files are what `count` reads). A skip whose text merely starts ``n/a: `` is an unanswered one.

What the counts *mean* (passed, incomplete, ...) is not decided here: stackfarm.verdict owns that rule.
"""

from __future__ import annotations

import enum
import hashlib
import io
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from junitparser import (
    Error,
    Failure,
    JUnitXml,
    JUnitXmlError,
    Properties,
    Property,
    Skipped,
    TestCase,
    TestSuite,
)

from .files import write_bytes_atomic

#: How suitekit.not_applicable's skip message starts. Only a reader's hint: the text alone never makes a skip
#: "does not apply" (see `NA_PROPERTY`).
NOT_APPLICABLE = "n/a: "
#: The testcase property that marks a skip "does not apply to this cell"; its value is one of `NA`.
NA_PROPERTY = "stackfarm.not_applicable"


class NA(str, enum.Enum):
    """Why a testcase has no question to answer for this cell: the reason classes of suitekit.not_applicable."""

    #: The cell has no such component (no flashinfer, no sglang, ...): nothing of it to check.
    COMPONENT_ABSENT = "component-absent"
    #: The component's release does not have the feature, module or gate the testcase is about (and what the
    #: testcase would check is decided elsewhere in that release).
    FEATURE_ABSENT = "feature-absent"
    #: The component is not built for this arch, by design (a flashinfer cubin family ships for the GPUs it
    #: targets only): no code of it is ever loaded there.
    ARCH_NOT_TARGETED = "arch-not-targeted"
    #: The cell's runner kind ([runners.<kind>] gpus) has fewer GPUs than the testcase needs, and this machine
    #: is that kind: no run of this cell is asked the question.
    RUNNER_GPUS = "runner-gpus"
    #: The matrix does not ask the question: the suite's settings leave it unset (no baseline to compare with,
    #: no planted acceptance, no bench tool).
    NOT_CONFIGURED = "not-configured"

    def __str__(self) -> str:
        return self.value


def na_class(value: object) -> NA | None:
    """The reason class `value` names, None when it names none."""
    try:
        return NA(value)
    except ValueError:
        return None


# junitparser ships py.typed but leaves most methods and its attribute descriptors unannotated.


# --------------------------------------------------------------------------- xunit2

#: The attributes junit-10.xsd (xunit2) allows on each element; `required` ones are always written.
ALLOWED: dict[str, frozenset[str]] = {
    "testsuites": frozenset({"name", "time", "tests", "failures", "disabled", "errors"}),
    "testsuite": frozenset(
        {
            "name",
            "tests",
            "failures",
            "errors",
            "time",
            "disabled",
            "skipped",
            "timestamp",
            "hostname",
            "id",
            "package",
            "file",
            "log",
            "url",
            "version",
        }
    ),
    "testcase": frozenset({"name", "assertions", "time", "classname", "status", "class"}),
    "property": frozenset({"name", "value"}),
    "failure": frozenset({"message", "type"}),
    "error": frozenset({"message", "type"}),
    "skipped": frozenset({"message", "type"}),
    "properties": frozenset(),
    "system-out": frozenset(),
    "system-err": frozenset(),
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "testsuite": ("name", "tests", "failures", "errors", "skipped", "time", "timestamp", "hostname"),
    "testcase": ("name", "classname", "time"),
    "property": ("name", "value"),
}
#: pytest's crash location at the end of a failure's text: "path/to/test_x.py:12: AssertionError".
_CRASH_LINE = re.compile(r"^(?P<path>[^\s:][^:\n]*\.py):(?P<line>\d+): ", re.MULTILINE)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def location(case: TestCase) -> str | None:
    """ "path:line" of a testcase: its ``file``/``line`` attributes (xunit1), else pytest's crash line in the
    text of its failure or error; None when neither says."""
    elem: Any = case._elem
    path, line = elem.get("file"), elem.get("line")
    if path:
        return f"{path}:{line}" if line else str(path)
    for result in results(case):
        if isinstance(result, Failure | Error):
            found = list(_CRASH_LINE.finditer(str(result.text or "")))
            if found:
                return f"{found[-1]['path']}:{found[-1]['line']}"
    return None


def with_location(case: TestCase, where: str | None = None) -> None:
    """Put the testcase's location (`where`, else `location`) at the head of each failure and error message
    as "path:line: message"; skips keep their message (their text is the reason)."""
    where = where or location(case)
    if not where:
        return
    for result in results(case):
        if isinstance(result, Failure | Error):
            text = str(result.message or first_line(result) or type(result).__name__.lower())
            if not text.startswith(where):
                result.message = f"{where}: {text}"


def xunit2(xml: JUnitXml) -> None:
    """Make `xml` valid xunit2 in place (see the module's docstring); statistics must be current."""
    root: Any = xml._elem
    stamp, host = now(), socket.gethostname()
    _keep(root, "testsuites")
    for suite in root.iter("testsuite"):
        moved: list[tuple[str, str]] = []
        for case in suite.findall("testcase"):
            for props in case.findall("properties"):
                moved += [(f"{case.get('name')}::{p.get('name')}", p.get("value") or "") for p in props]
                case.remove(props)
            for key in ("classname", "time"):
                if case.get(key) is None:
                    case.set(key, "" if key == "classname" else "0.000")
            _keep(case, "testcase")
        if moved:
            props = suite.find("properties")
            if props is None:
                props = suite.makeelement("properties", {})
                suite.insert(0, props)
            for name, value in moved:
                props.append(props.makeelement("property", {"name": name, "value": value}))
        defaults = {
            "timestamp": stamp,
            "hostname": host,
            "tests": "0",
            "failures": "0",
            "errors": "0",
            "skipped": "0",
            "time": "0.000",
        }
        for key, value in defaults.items():
            if suite.get(key) is None:
                suite.set(key, value)
        props = suite.find("properties")
        if props is not None and list(suite).index(props) != 0:  # properties come first
            suite.remove(props)
            suite.insert(0, props)
        _keep(suite, "testsuite")


def _keep(elem: Any, tag: str) -> None:
    for key in [k for k in elem.attrib if k not in ALLOWED[tag]]:
        del elem.attrib[key]


def write_xml(path: Path, xml: JUnitXml) -> None:
    """Write a JUnit file atomically, its statistics recomputed and made valid xunit2."""
    xml.update_statistics()  # type: ignore[no-untyped-call]  # junitparser: unannotated
    xunit2(xml)
    buf = io.BytesIO()
    xml.write(buf)
    write_bytes_atomic(path, buf.getvalue())


def append(root: JUnitXml, suite: TestSuite) -> None:
    # not add_testsuite(): that silently folds a suite into an "equal" one (same name, properties, ...)
    root.append(suite)  # type: ignore[no-untyped-call]  # junitparser: unannotated


def load(path: Path) -> JUnitXml:
    """Parse a JUnit file; raises OSError / SyntaxError (ParseError) / JUnitXmlError when unusable."""
    return JUnitXml.fromfile(str(path))


UNREADABLE: tuple[type[BaseException], ...] = (OSError, SyntaxError, JUnitXmlError, ValueError)


#: A testcase's outcome as its JUnit file says it (no rule applied: stackfarm.verdict judges).
CaseOutcome = Literal["passed", "failed", "error", "skipped"]


@dataclass(frozen=True, kw_only=True)
class Case:
    """One testcase of a JUnit file, as read."""

    name: str
    classname: str
    outcome: CaseOutcome
    #: The first line of the failure, error or skip message ("" when it passed).
    message: str
    time: float
    properties: Mapping[str, str]


@dataclass(frozen=True, kw_only=True)
class SuiteFile:
    """One per-suite JUnit file, as read: the one reader of testcases and properties (the history, the
    report's sections and qualification read suites through it)."""

    #: <testsuite> properties, merged over the file's testsuites (e.g. 10-capability's grid).
    properties: Mapping[str, str]
    cases: tuple[Case, ...]
    #: The latest testsuite timestamp, None when the file has none.
    timestamp: str | None


#: What an unreadable or missing file reads as where a reader goes on without it.
EMPTY = SuiteFile(properties={}, cases=(), timestamp=None)


def _properties(element: Any) -> dict[str, str]:
    props = element.child(Properties)
    if props is None:
        return {}
    return {str(p.name): str(p.value) for p in props.iterchildren(Property)}


def _case(case: TestCase) -> Case:
    outcome: CaseOutcome = "passed"
    text = ""
    for result in results(case)[:1]:
        outcome = (
            "failed" if isinstance(result, Failure) else "error" if isinstance(result, Error) else "skipped"
        )
        text = first_line(result) or outcome
    return Case(
        name=str(case.name or ""),
        classname=str(case.classname or ""),
        outcome=outcome,
        message=text,
        time=float(case.time or 0.0),
        properties=_properties(case),
    )


def read(path: Path) -> SuiteFile:
    """One per-suite JUnit file's properties, testcases and latest timestamp; raises one of UNREADABLE."""
    suite_props: dict[str, str] = {}
    cases: list[Case] = []
    stamps: list[str] = []
    for ts in load(path):
        suite_props.update(_properties(ts))
        if ts.timestamp:
            stamps.append(str(ts.timestamp))
        cases.extend(_case(case) for case in ts)
    return SuiteFile(properties=suite_props, cases=tuple(cases), timestamp=max(stamps, default=None))


def results(case: TestCase) -> list[Failure | Error | Skipped]:
    return [r for r in case.result if isinstance(r, Failure | Error | Skipped)]


def first_line(result: Failure | Error | Skipped) -> str:
    for text in (result.message, result.text):
        for line in str(text or "").splitlines():
            if line.strip():
                return line.strip()
    return ""


def message(case: TestCase, result: Failure | Error | Skipped) -> str:
    return f"{case.name}: {first_line(result) or type(result).__name__.lower()}"


def one_case(suite: str, outcome: str, reason: str, *, classname: str | None = None) -> TestCase:
    case = TestCase(name="suite", classname=classname or suite, time=0.0)
    if outcome == "skipped":
        case.result = [Skipped(reason)]
    elif outcome == "failed":
        case.result = [Failure(reason)]
    elif outcome == "error":
        case.result = [Error(reason)]
    return case


def write_skipped_suite(
    path: Path, *, cell: str, suite: str, reason: str, kind: Literal["skipped", "error"] = "skipped"
) -> None:
    """JUnit for a suite the runner did not run: one testcase marked Skipped(reason) or Error(reason)."""
    ts = TestSuite(f"{cell}::{suite}")
    ts.timestamp, ts.hostname = now(), socket.gethostname()
    ts.add_testcase(one_case(suite, kind, reason, classname=f"{cell}.{suite}"))
    xml = JUnitXml()
    xml.add_testsuite(ts)
    write_xml(path, xml)


@dataclass(frozen=True, kw_only=True)
class Step:
    """One testcase of a step the runner performs itself (e.g. applying a patch)."""

    name: str
    failure: str | None  # None when the step passed
    properties: dict[str, str]


def write_steps(path: Path, *, cell: str, suite: str, steps: Sequence[Step]) -> None:
    """JUnit for a runner step with one testcase per item, each carrying its properties."""
    ts = TestSuite(f"{cell}::{suite}")
    ts.timestamp, ts.hostname = now(), socket.gethostname()
    for step in steps:
        case = TestCase(step.name, classname=f"{cell}.{suite}", time=0.0)
        if step.failure is not None:
            case.result = [Failure(step.failure.splitlines()[0] if step.failure else "failed")]
            case.system_out = step.failure
        ts.add_testcase(case)
        # junitparser's TestCase has no properties: the step's names are unique, so they go on the suite.
        for name, value in step.properties.items():
            ts.add_property(name, value)
    xml = JUnitXml()
    xml.add_testsuite(ts)
    write_xml(path, xml)


@dataclass(frozen=True, kw_only=True)
class Counts:
    """What one suite's JUnit file says, before any rule is applied."""

    tests: int
    failures: int
    errors: int
    #: Skipped testcases that still owed an answer (no GPU, undecidable, gated, ...).
    skipped: int
    #: Skipped testcases marked as not applying to this cell (`NA_PROPERTY` of a known `NA` class).
    not_applicable: int
    time: float
    #: "testname: first line of the message" of the first failure or error, else None.
    first_failure: str | None
    #: "testname: reason" of the first skip that owed an answer, else None.
    first_skip: str | None
    #: sha256 of the file's bytes: a verdict binds the exact report it summarises.
    sha256: str


def na_mark(case: TestCase) -> str | None:
    """The value of the testcase's `NA_PROPERTY` (the last one), None when it has none."""
    elem: Any = case._elem
    found = [
        p.get("value") for props in elem.findall("properties") for p in props if p.get("name") == NA_PROPERTY
    ]
    return str(found[-1] or "") if found else None


def unearned(mark: str | None, skip: Skipped) -> str:
    """What to add to an unanswered skip's explanation when it claims "does not apply" without earning it."""
    if mark is not None:
        return (
            f" (marked {NA_PROPERTY}={mark!r}, not a reason class of suitekit.NA "
            f"({', '.join(c.value for c in NA)}): unanswered)"
        )
    if first_line(skip).startswith(NOT_APPLICABLE.strip()):
        return " (says n/a, but not through suitekit.not_applicable with a reason class: unanswered)"
    return ""


def count(path: Path) -> Counts:
    """Count one suite's JUnit file; raises one of UNREADABLE when the file cannot be used."""
    data = path.read_bytes()
    xml = load(path)
    tests = failures = errors = skipped = na = 0
    time = 0.0
    first: str | None = None
    first_skip: str | None = None
    for ts in xml:
        time += float(ts.time or 0.0)  # pytest's own suite time includes collection
        for case in ts:
            tests += 1
            found = results(case)
            bad = [r for r in found if isinstance(r, Failure | Error)]
            if bad:
                failures += isinstance(bad[0], Failure)
                errors += isinstance(bad[0], Error)
                first = first or message(case, bad[0])
                continue
            skips = [r for r in found if isinstance(r, Skipped)]
            if not skips:
                continue
            mark = na_mark(case)
            if na_class(mark) is not None:
                na += 1
            else:
                skipped += 1
                first_skip = first_skip or message(case, skips[0]) + unearned(mark, skips[0])
    return Counts(
        tests=tests,
        failures=failures,
        errors=errors,
        skipped=skipped,
        not_applicable=na,
        time=round(time, 3),
        first_failure=first,
        first_skip=first_skip,
        sha256=hashlib.sha256(data).hexdigest(),
    )


#: Testcase outcomes, worst first, for one verdict over several (an unknown outcome ranks as an error).
WORST_FIRST = ("failed", "error", "skipped", "passed", "n/a")
_IN_WORDS = {"skipped": "unanswered"}


def worst_of(outcomes: Sequence[str]) -> str:
    """The worst of testcase outcomes, in words: "failed (2 of 5)", "unanswered (1 of 3)" (skipped), "passed";
    "n/a" only when every one does not apply; "no finding" when there is none, never passed."""
    if not outcomes:
        return "no finding"
    rank = {o: i for i, o in enumerate(WORST_FIRST)}
    worst = min(outcomes, key=lambda o: rank.get(o, rank["error"]))
    if worst in ("passed", "n/a"):
        return worst
    return f"{_IN_WORDS.get(worst, worst)} ({outcomes.count(worst)} of {len(outcomes)})"


__all__ = [
    "ALLOWED",
    "EMPTY",
    "NA",
    "NA_PROPERTY",
    "NOT_APPLICABLE",
    "REQUIRED",
    "UNREADABLE",
    "WORST_FIRST",
    "Case",
    "CaseOutcome",
    "Counts",
    "Step",
    "SuiteFile",
    "append",
    "count",
    "first_line",
    "load",
    "location",
    "message",
    "na_class",
    "na_mark",
    "now",
    "one_case",
    "read",
    "results",
    "unearned",
    "with_location",
    "worst_of",
    "write_skipped_suite",
    "write_steps",
    "write_xml",
    "xunit2",
]
