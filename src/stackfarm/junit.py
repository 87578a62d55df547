"""JUnit files, read and written only through junitparser: the per-suite files the runner writes itself (a
suite it did not run, the steps it performs) and the counts of a suite's file, skip reasons included.

What the counts *mean* (passed, incomplete, ...) is not decided here: stackfarm.verdict owns that rule.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from junitparser import Error, Failure, JUnitXml, JUnitXmlError, Skipped, TestCase, TestSuite

from .files import write_bytes_atomic

#: The prefix of a skip message that means "this testcase does not apply to this cell" (suitekit.not_applicable).
NOT_APPLICABLE = "n/a: "

# junitparser ships py.typed but leaves most methods and its attribute descriptors unannotated.


def write_xml(path: Path, xml: JUnitXml) -> None:
    xml.update_statistics()  # type: ignore[no-untyped-call]  # junitparser: unannotated
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


def one_case(suite: str, outcome: str, reason: str) -> TestCase:
    case = TestCase(name="suite", classname=suite, time=0.0)
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
    ts.add_testcase(one_case(suite, kind, reason))
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
    for step in steps:
        case = TestCase(step.name, classname=suite)
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
    #: Skipped testcases whose message says they do not apply to this cell (suitekit.not_applicable).
    not_applicable: int
    time: float
    #: "testname: first line of the message" of the first failure or error, else None.
    first_failure: str | None
    #: "testname: reason" of the first skip that owed an answer, else None.
    first_skip: str | None
    #: sha256 of the file's bytes: a verdict binds the exact report it summarises.
    sha256: str


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
            if first_line(skips[0]).startswith(NOT_APPLICABLE.strip()):
                na += 1
            else:
                skipped += 1
                first_skip = first_skip or message(case, skips[0])
    return Counts(
        tests=tests, failures=failures, errors=errors, skipped=skipped, not_applicable=na,
        time=round(time, 3), first_failure=first, first_skip=first_skip,
        sha256=hashlib.sha256(data).hexdigest(),
    )  # fmt: skip


__all__ = [
    "NOT_APPLICABLE",
    "UNREADABLE",
    "Counts",
    "Step",
    "append",
    "count",
    "first_line",
    "load",
    "message",
    "one_case",
    "results",
    "write_skipped_suite",
    "write_steps",
    "write_xml",
]
