"""Per-suite JUnit results, the merged ``reports/junit.xml`` and the human summaries.

JUnit is read and written only through junitparser. Every file is written atomically (temp file in the
same directory, fsync, ``os.replace``), so an interrupted run never leaves a half-written report.
"""

from __future__ import annotations

import html
import io
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from junitparser import Error, Failure, JUnitXml, JUnitXmlError, Skipped, TestCase, TestSuite

Outcome = Literal["passed", "failed", "skipped", "error"]
CellStatus = Literal["ran", "reused", "conflict", "excluded", "error"]

__all__ = [
    "CellReport",
    "CellStatus",
    "Outcome",
    "Step",
    "SuiteResult",
    "merge",
    "read_suite",
    "report_from_json",
    "summary_html",
    "summary_markdown",
    "write_atomic",
    "write_bytes_atomic",
    "write_skipped_suite",
    "write_steps",
    "write_summaries",
]


@dataclass(frozen=True, kw_only=True)
class SuiteResult:
    cell: str
    suite: str  # e.g. "00-stack"
    outcome: Outcome  # suite-level verdict decided by the runner
    tests: int
    failures: int
    errors: int
    skipped: int
    time: float
    first_failure: str | None  # "testname: first line of the message", or None
    xml: Path | None  # the per-suite JUnit file, if one exists

    @property
    def passed(self) -> int:
        return max(self.tests - self.failures - self.errors - self.skipped, 0)


@dataclass(frozen=True, kw_only=True)
class CellReport:
    cell: str
    status: CellStatus
    reason: str  # "" when ran/reused; why otherwise
    properties: dict[str, str]  # component versions, artifact sha256s, patch-set hashes, input hash
    suites: tuple[SuiteResult, ...]


def report_from_json(data: Mapping[str, Any]) -> CellReport:
    """The CellReport stored in a verdict.json (the runner's `asdict` of it)."""
    suites = tuple(
        SuiteResult(**{**s, "xml": Path(s["xml"]) if s.get("xml") else None}) for s in data["suites"]
    )
    return CellReport(**{**data, "suites": suites})


# --------------------------------------------------------------------------- files


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.chmod(path.stat().st_mode & 0o7777 if path.exists() else 0o644)  # mkstemp makes 0600
        tmp.replace(path)  # os.replace
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable; not possible everywhere, and not essential
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` so that readers see the old file or the new one, never a mix."""
    write_bytes_atomic(path, text.encode("utf-8"))


# --------------------------------------------------------------------------- junitparser, typed
# junitparser ships py.typed but leaves most methods and its attribute descriptors unannotated.


def _write_xml(path: Path, xml: JUnitXml) -> None:
    xml.update_statistics()  # type: ignore[no-untyped-call]  # junitparser: unannotated
    buf = io.BytesIO()
    xml.write(buf)
    write_bytes_atomic(path, buf.getvalue())


def _append(root: JUnitXml, suite: TestSuite) -> None:
    # not add_testsuite(): that silently folds a suite into an "equal" one (same name, properties, ...)
    root.append(suite)  # type: ignore[no-untyped-call]  # junitparser: unannotated


def _load(path: Path) -> JUnitXml:
    """Parse a JUnit file; raises OSError / SyntaxError (ParseError) / JUnitXmlError when unusable."""
    return JUnitXml.fromfile(str(path))


def _results(case: TestCase) -> list[Failure | Error | Skipped]:
    return [r for r in case.result if isinstance(r, Failure | Error | Skipped)]


def _message(case: TestCase, result: Failure | Error | Skipped) -> str:
    for text in (result.message, result.text):
        for line in str(text or "").splitlines():
            if line.strip():
                return f"{case.name}: {line.strip()}"
    return f"{case.name}: {type(result).__name__.lower()}"


def _one_case(suite: str, outcome: Outcome, reason: str) -> TestCase:
    case = TestCase(name="suite", classname=suite, time=0.0)
    if outcome == "skipped":
        case.result = [Skipped(reason)]
    elif outcome == "failed":
        case.result = [Failure(reason)]
    elif outcome == "error":
        case.result = [Error(reason)]
    return case


# --------------------------------------------------------------------------- per-suite files


def write_skipped_suite(
    path: Path, *, cell: str, suite: str, reason: str, kind: Literal["skipped", "error"] = "skipped"
) -> None:
    """JUnit for a suite the runner did not run: one testcase marked Skipped(reason) or Error(reason)."""
    ts = TestSuite(f"{cell}::{suite}")
    ts.add_testcase(_one_case(suite, kind, reason))
    xml = JUnitXml()
    xml.add_testsuite(ts)
    _write_xml(path, xml)


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
    _write_xml(path, xml)


def read_suite(path: Path, *, cell: str, suite: str) -> SuiteResult:
    """Summarise one per-suite JUnit file. A missing or unreadable file is an "error" with zero tests."""
    try:
        xml = _load(path)
    except (OSError, SyntaxError, JUnitXmlError) as exc:
        why = "no JUnit report" if not path.exists() else f"unreadable JUnit report ({exc})"
        return SuiteResult(
            cell=cell, suite=suite, outcome="error", tests=0, failures=0, errors=0, skipped=0,
            time=0.0, first_failure=f"{suite}: {why}", xml=path if path.exists() else None,
        )  # fmt: skip
    tests = failures = errors = skipped = 0
    time = 0.0
    first: str | None = None
    for ts in xml:
        time += float(ts.time or 0.0)  # pytest's own suite time includes collection
        ts.update_statistics()  # type: ignore[no-untyped-call]  # junitparser: unannotated
        tests, failures = tests + int(ts.tests), failures + int(ts.failures)
        errors, skipped = errors + int(ts.errors), skipped + int(ts.skipped)
        for case in ts:
            bad = [r for r in _results(case) if isinstance(r, Failure | Error)]
            if first is None and bad:
                first = _message(case, bad[0])
    outcome: Outcome
    if errors:
        outcome = "error"
    elif failures:
        outcome = "failed"
    elif tests == 0:
        outcome, first = "error", f"{suite}: no tests ran"
    elif skipped >= tests:
        outcome = "skipped"
    else:
        outcome = "passed"
    return SuiteResult(
        cell=cell, suite=suite, outcome=outcome, tests=tests, failures=failures, errors=errors,
        skipped=skipped, time=round(time, 3), first_failure=first, xml=path,
    )  # fmt: skip


# --------------------------------------------------------------------------- merged JUnit

_PLAN_RESULT: dict[str, Outcome] = {"excluded": "skipped", "conflict": "error", "error": "error"}


def _merged_suite(cell: CellReport, res: SuiteResult) -> TestSuite:
    ts = TestSuite(f"{cell.cell}::{res.suite}")
    for key, value in sorted(cell.properties.items()):
        ts.add_property(key, value)
    ts.add_property("stackfarm.cell", cell.cell)
    ts.add_property("stackfarm.suite", res.suite)
    cases: list[TestCase] = []
    try:
        source = _load(res.xml) if res.xml is not None else None
    except (OSError, SyntaxError, JUnitXmlError):
        source = None
    for orig in source or ():
        if ts.timestamp is None and orig.timestamp is not None:
            ts.timestamp, ts.hostname = orig.timestamp, orig.hostname
        for prop in orig.properties():  # type: ignore[no-untyped-call]  # junitparser: unannotated
            ts.add_property(str(prop.name), str(prop.value))
        cases.extend(orig)
    if res.outcome in ("failed", "error") and not any(c.is_failure or c.is_error for c in cases):
        # The runner's verdict is red but no case says so (0 tests, crashed pytest, missing file):
        # record it, so junit.xml is never greener than the summary.
        cases.append(_one_case(res.suite, res.outcome, res.first_failure or f"suite {res.outcome}"))
    elif source is None:
        cases.append(_one_case(res.suite, res.outcome, res.first_failure or f"suite {res.outcome}"))
    ts.add_testcases(cases)
    return ts


def merge(cells: Sequence[CellReport], out: Path) -> None:
    """Write one JUnit file with a testsuite ``<cell>::<suite>`` per suite (``<cell>::plan`` for cells
    that never ran), each carrying the cell's properties; root totals are recomputed."""
    root = JUnitXml("stackfarm")
    for cell in cells:
        if cell.status in _PLAN_RESULT:
            res = SuiteResult(
                cell=cell.cell, suite="plan", outcome=_PLAN_RESULT[cell.status], tests=1, failures=0,
                errors=0, skipped=0, time=0.0, first_failure=cell.reason or cell.status, xml=None,
            )  # fmt: skip
            _append(root, _merged_suite(cell, res))
            continue
        for res in cell.suites:
            _append(root, _merged_suite(cell, res))
    _write_xml(out, root)


# --------------------------------------------------------------------------- summaries

_ICON = {"passed": "✅", "failed": "❌", "skipped": "⏭", "error": "💥"}
_STATUS_ICON = {**_ICON, "incomplete": "⏭", "conflict": "⚠️", "excluded": "⏭"}
_TOTAL_ORDER = ("passed", "failed", "incomplete", "conflict", "excluded", "error")


def _verdict(cell: CellReport) -> str:
    """passed (every suite passed), failed (a suite failed or errored), incomplete (some skipped), or the
    plan status (conflict / excluded / error)."""
    if cell.status not in ("ran", "reused"):
        return cell.status
    outcomes = {s.outcome for s in cell.suites}
    if outcomes & {"failed", "error"}:
        return "failed"
    return "passed" if outcomes == {"passed"} else "incomplete"


def _first_failure(cell: CellReport) -> str:
    if cell.status not in ("ran", "reused"):
        return cell.reason
    for s in cell.suites:
        if s.outcome != "passed" and s.first_failure:
            return f"{s.suite}: {s.first_failure}"
    return ""


def _grid_text(s: SuiteResult) -> str:
    if s.outcome == "passed":
        return f"✅ {s.passed}/{s.tests}"
    if s.outcome == "failed":
        return f"❌ {s.failures} failed" if s.failures else "❌ failed"
    return f"{_ICON[s.outcome]} {s.outcome}"


def _suite_names(cells: Iterable[CellReport]) -> list[str]:
    return sorted({s.suite for c in cells for s in c.suites})


def _totals(cells: Sequence[CellReport]) -> str:
    counts = Counter(_verdict(c) for c in cells)
    parts = [f"{counts[k]} {k}" for k in _TOTAL_ORDER if counts[k]]
    head = f"{len(cells)} cell{'' if len(cells) == 1 else 's'}"
    return f"{head}: {', '.join(parts)}" if parts else head


def _md(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    # GitHub renders raw HTML in markdown: escape it, so "<Foo at 0x..>" stays visible and inert
    return html.escape(text, quote=False).replace("\\", "\\\\").replace("|", "\\|").replace("`", "'")


def _md_row(cols: Iterable[str]) -> str:
    return "| " + " | ".join(cols) + " |"


def summary_markdown(cells: Sequence[CellReport], *, title: str = "stackfarm matrix") -> str:
    names = _suite_names(cells)
    lines = [f"## {_md(title)}", ""]
    lines.append(_md_row(["cell", *(_md(n) for n in names), "status", "first failure"]))
    lines.append(_md_row(["---"] * (len(names) + 3)))
    for c in cells:
        by_name = {s.suite: s for s in c.suites}
        grid = [_grid_text(by_name[n]) if n in by_name else "—" for n in names]
        verdict = _verdict(c)
        status = f"{_STATUS_ICON[verdict]} {verdict}" + (" (reused)" if c.status == "reused" else "")
        lines.append(_md_row([f"`{_md(c.cell)}`", *grid, status, _md(_first_failure(c))]))
    problems = [c for c in cells if c.status in ("conflict", "error")]
    if problems:
        lines += ["", "**Conflicts and errors**", ""]
        lines += [f"- `{_md(c.cell)}` — {c.status}: {_md(c.reason, 400)}" for c in problems]
    lines += ["", f"**{_totals(cells)}**", ""]
    return "\n".join(lines)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }
table { border-collapse: collapse; margin-bottom: 1rem; }
th, td { border: 1px solid #ccc; padding: .3rem .6rem; text-align: left; vertical-align: top; }
td.passed { background: #d4f4d4; } td.failed { background: #f8d0d0; }
td.skipped, td.incomplete, td.excluded, td.none { background: #e6e6e6; color: #555; }
td.error, td.conflict { background: #fde0b8; }
.counts { font-size: .8em; color: #444; display: block; } .fail { font-family: monospace; font-size: .85em; }
details { margin: .3rem 0; } code { font-size: .9em; }
"""


def summary_html(cells: Sequence[CellReport], *, title: str = "stackfarm matrix") -> str:
    e = html.escape
    names = _suite_names(cells)
    head = "".join(f"<th>{e(n)}</th>" for n in names)
    rows: list[str] = []
    for c in cells:
        by_name = {s.suite: s for s in c.suites}
        tds: list[str] = []
        for n in names:
            s = by_name.get(n)
            if s is None:
                tds.append('<td class="none">—</td>')
                continue
            counts = f"{s.passed}/{s.failures}/{s.skipped}/{s.errors}"
            tds.append(
                f'<td class="{e(s.outcome)}">{_ICON[s.outcome]} {e(s.outcome)}'
                f'<span class="counts" title="passed/failed/skipped/error">{e(counts)}</span></td>'
            )
        verdict = _verdict(c)
        reused = " (reused)" if c.status == "reused" else ""
        rows.append(
            f"<tr><th><code>{e(c.cell)}</code></th>{''.join(tds)}"
            f'<td class="{e(verdict)}">{_STATUS_ICON[verdict]} {e(verdict)}{e(reused)}</td>'
            f'<td class="fail">{e(_first_failure(c))}</td></tr>'
        )
    details: list[str] = []
    for c in cells:
        props = "".join(
            f"<tr><th>{e(k)}</th><td><code>{e(v)}</code></td></tr>" for k, v in sorted(c.properties.items())
        )
        reason = f"<p>{e(c.reason)}</p>" if c.reason else ""
        details.append(
            f"<details><summary><code>{e(c.cell)}</code> — {e(_verdict(c))}</summary>{reason}"
            f"<table>{props or '<tr><td>no properties</td></tr>'}</table></details>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>\n"
        f"<h1>{e(title)}</h1>\n"
        f"<table><thead><tr><th>cell</th>{head}<th>status</th><th>first failure</th></tr></thead>\n"
        f"<tbody>\n{chr(10).join(rows)}\n</tbody></table>\n"
        f"<p><strong>{e(_totals(cells))}</strong></p>\n<h2>Cells</h2>\n{chr(10).join(details)}\n"
        "</body></html>\n"
    )


def write_summaries(cells: Sequence[CellReport], reports_dir: Path) -> None:
    merge(cells, reports_dir / "junit.xml")
    write_atomic(reports_dir / "summary.md", summary_markdown(cells))
    write_atomic(reports_dir / "summary.html", summary_html(cells))
