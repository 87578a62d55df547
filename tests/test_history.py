"""history: reports/ folders read back, figures over runs, verdict changes with the inputs that changed.

The runs here are small synthetic reports/ folders (verdict.json + JUnit written through junitparser, as the
runner and pytest write them), modelling the seeds' upgrade: a patch set edited between two nights breaks
10-capability on one cell.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from junitparser import Error, Failure, JUnitXml, Properties, Property, Skipped, TestCase, TestSuite

from conftest import cell_report
from stackfarm import history, htmlreport, verdict
from stackfarm.errors import StackfarmError
from stackfarm.family import record_bytes
from stackfarm.history import Outcome
from stackfarm.verdict import CellReport, SuiteResult

CELL = "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"
OTHER = "cu130-torch2.11.0-sk0.4.4-fi0.6.12-sgl0.5.15"

#: (testcase name, outcome, message, properties)
CaseSpec = tuple[str, str, str, Mapping[str, str]]


def _case(name: str, outcome: str, message: str, props: Mapping[str, str]) -> TestCase:
    case = TestCase(name=name, classname="suite.test_it", time=0.01)
    if outcome == "failed":
        case.result = [Failure(message)]
    elif outcome == "error":
        case.result = [Error(message)]
    elif outcome == "skipped":
        case.result = [Skipped(message)]
    if props:
        holder = Properties()  # type: ignore[no-untyped-call]  # junitparser: unannotated
        for key, value in props.items():
            holder.add_property(Property(key, value))
        case.append(holder)  # type: ignore[no-untyped-call]  # junitparser: unannotated
    return case


def _outcome(cases: Sequence[CaseSpec]) -> Outcome:
    kinds = [c[1] for c in cases]
    if "error" in kinds:
        return "error"
    if "failed" in kinds:
        return "failed"
    return "skipped" if kinds and all(k == "skipped" for k in kinds) else "passed"


def write_cell(
    reports: Path,
    cell: str,
    suites: Mapping[str, Sequence[CaseSpec]],
    *,
    properties: Mapping[str, str] | None = None,
    suite_properties: Mapping[str, Mapping[str, str]] | None = None,
    inputs: Mapping[str, Any] | None = None,
    timestamp: str = "2026-11-01T02:17:00+00:00",
    xml_prefix: str = "reports",
    records: Mapping[str, Mapping[str, Any]] | None = None,
) -> CellReport:
    """One cell of a reports/ folder: per-suite JUnit files, the records of suites with a family (`records`:
    suite -> the record as JSON data, written as <suite>.json and bound by its sha256) and the verdict.json
    that points at them."""
    folder = reports / cell
    folder.mkdir(parents=True, exist_ok=True)
    results = []
    for suite, cases in suites.items():
        ts = TestSuite("pytest")
        ts.timestamp = timestamp
        for key, value in (suite_properties or {}).get(suite, {}).items():
            ts.add_property(key, value)
        ts.add_testcases([_case(*c) for c in cases])
        xml = JUnitXml()
        xml.add_testsuite(ts)
        xml.update_statistics()  # type: ignore[no-untyped-call]  # junitparser: unannotated
        xml.write(str(folder / f"{suite}.xml"))
        outcome = _outcome(cases)
        record_sha256 = None
        if suite in (records or {}):
            blob = record_bytes(suite, (records or {})[suite])
            (folder / f"{suite}.json").write_bytes(blob)
            record_sha256 = hashlib.sha256(blob).hexdigest()
        bad = next((f"{c[0]}: {c[2]}" for c in cases if c[1] in ("failed", "error")), None)
        results.append(
            SuiteResult(
                cell=cell,
                suite=suite,
                outcome=outcome,
                tests=len(cases),
                failures=sum(c[1] == "failed" for c in cases),
                errors=sum(c[1] == "error" for c in cases),
                skipped=sum(c[1] == "skipped" for c in cases),
                time=0.5,
                first_failure=bad,
                # As the runner records it: relative to the folder it ran in, which a copy does not keep.
                xml=Path(xml_prefix) / cell / f"{suite}.xml",
                record_sha256=record_sha256,
            )
        )
    report = cell_report(
        cell=cell, status="ran", reason="", properties=dict(properties or {}), suites=tuple(results)
    )
    data: dict[str, Any] = {"input_hash": (properties or {}).get("stackfarm.input_hash", "0" * 64)}
    if inputs is not None:
        data["inputs"] = dict(inputs)
    data["report"] = verdict.to_json(report)
    (folder / "verdict.json").write_text(json.dumps(data, default=str, indent=1))
    return report


def _props(patch_hash: str, input_hash: str) -> dict[str, str]:
    return {
        "axis.sglang": "0.5.9",
        "sglang.version": "0.5.9",
        "sglang.sha256": "8a936c4d25fea605f44254e533cff2144c73ceffbc1f8738aba393461bbb64d1",
        "patches.sm120-capability.sha256": patch_hash,
        "stackfarm.input_hash": input_hash,
    }


def _inputs(patch_hash: str) -> dict[str, Any]:
    return {"values": {"sglang": "0.5.9"}, "patch_sets": {"sm120-capability": patch_hash}, "gpu": False}


GOOD: dict[str, list[CaseSpec]] = {
    "00-stack": [
        ("test_files[sglang]", "passed", "", {"sglang.files_checked": "1941", "sglang.sha256": "ab" * 32})
    ],
    "10-capability": [("test_finding[table-sm_120]", "passed", "", {"arch": "sm_120", "line": "42"})],
    "40-throughput": [("test_decode", "passed", "", {"decode_tok_s": "92.6"})],
}
BAD: dict[str, list[CaseSpec]] = {
    **GOOD,
    "10-capability": [("test_finding[table-sm_120]", "failed", "KeyError: 12 in the symm-mem table", {})],
    "40-throughput": [("test_decode", "passed", "", {"decode_tok_s": "89.5"})],
}


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Three nights: all green; a patch edit breaks 10-capability on CELL; the fix lands."""
    root = tmp_path / "history"
    a, b = "a" * 64, "b" * 64
    nights = [("run-9", GOOD, a, "1" * 64), ("run-10", BAD, b, "2" * 64), ("run-11", GOOD, a, "1" * 64)]
    for name, suites, patch, digest in nights:
        write_cell(root / name, CELL, suites, properties=_props(patch, digest), inputs=_inputs(patch))
        write_cell(root / name, OTHER, GOOD, properties=_props("c" * 64, "3" * 64))
    return root


def test_runs_are_read_in_numeric_order_and_copies_find_their_xml(runs: Path) -> None:
    loaded = history.load_history(runs)
    assert [r.name for r in loaded] == ["run-9", "run-10", "run-11"]
    cell = loaded[1].cells[CELL]
    assert cell.verdict == "failed"
    suite = cell.suite("10-capability")
    assert suite is not None
    assert suite.cases[0].outcome == "failed"
    assert suite.cases[0].message == "KeyError: 12 in the symm-mem table"
    # The recorded xml path (reports/<cell>/...) does not exist here; the copy's own file is used.
    assert suite.result.xml == runs / "run-10" / CELL / "10-capability.xml"
    assert loaded[1].time == "2026-11-01T02:17:00+00:00"


def test_figures_keep_numbers_and_drop_identities(runs: Path) -> None:
    cell = history.read_run(runs / "run-9").cells[CELL]
    figures = history.figures(cell)
    assert figures["40-throughput::test_decode::decode_tok_s"] == 92.6
    assert figures["00-stack::test_files[sglang]::sglang.files_checked"] == 1941
    assert figures["00-stack::seconds"] == 0.5
    assert not [k for k in figures if k.endswith(("sha256", "::line"))], (
        "hashes and line numbers are not figures"
    )


def test_verdict_changes_name_the_inputs_that_changed(runs: Path) -> None:
    hist = history.build(history.load_history(runs))
    assert [(c.cell, c.run, c.before, c.after) for c in hist.changes] == [
        (CELL, "run-10", "passed", "failed"),
        (CELL, "run-11", "failed", "passed"),
    ]
    broke = hist.changes[0]
    assert broke.sentence().startswith(f"cell {CELL} started failing in run run-10; inputs that changed: ")
    assert "patch_sets.sm120-capability: aaaaaaaaaaaa… → bbbbbbbbbbbb…" in broke.sentence()
    assert broke.suites == (
        "10-capability: passed → failed (test_finding[table-sm_120]: KeyError: 12 in the symm-mem table)",
    )
    assert "passes again in run run-11" in hist.changes[1].sentence()
    points = hist.series[CELL]["40-throughput::test_decode::decode_tok_s"]
    assert points == [("run-9", 92.6), ("run-10", 89.5), ("run-11", 92.6)]


def test_without_recorded_inputs_the_properties_say_what_changed(tmp_path: Path) -> None:
    for name, suites, patch in (("n1", GOOD, "a" * 64), ("n2", BAD, "b" * 64)):
        write_cell(tmp_path / name, CELL, suites, properties=_props(patch, patch))
    (change,) = history.changes(history.load_history(tmp_path))
    assert change.inputs[0].startswith("patches.sm120-capability.sha256: aaaaaaaaaaaa…")
    # Same inputs, different verdict: said so, not left blank.
    for name, suites in (("m1", GOOD), ("m2", BAD)):
        write_cell(tmp_path / "same" / name, CELL, suites, properties=_props("a" * 64, "1" * 64))
    (flaky,) = history.changes(history.load_history(tmp_path / "same"))
    assert "none (the same inputs" in flaky.sentence()


def test_main_writes_json_markdown_and_html(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    written = history.write(runs, out)
    assert any(f"cell {CELL} started failing in run run-10" in c.sentence() for c in written.changes)
    data = json.loads((out / "history.json").read_text())
    assert [r["name"] for r in data["runs"]] == ["run-9", "run-10", "run-11"]
    assert data["runs"][1]["cells"][CELL] == "failed"
    assert data["series"][CELL]["40-throughput::test_decode::decode_tok_s"][1] == ["run-10", 89.5]
    md = (out / "history.md").read_text()
    assert "started failing in run run-10" in md
    assert "| 92.6 | 92.6 | 89.5 | 92.6 |" in md, "first, last, min and max of the moved figure"
    assert not (out / "history.html").exists(), "the HTML page is the report's, not this module's"
    page = htmlreport.write_history(history.build(history.load_history(runs)), out).read_text()
    assert page.count("<svg") >= 1
    assert 'data-outcome="failed"' in page


def test_bad_input_is_reported_not_crashed_on(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (runs / "run-10" / OTHER / "verdict.json").write_text("{not json")
    run = history.read_run(runs / "run-10")
    assert CELL in run.cells
    assert OTHER not in run.cells
    assert any("not a verdict" in p for p in run.problems)
    with pytest.raises(StackfarmError, match="no such history folder"):
        history.write(tmp_path / "nowhere", tmp_path)
    (tmp_path / "empty" / "x").mkdir(parents=True)
    with pytest.raises(StackfarmError):
        history.write(tmp_path / "empty", tmp_path)


def test_diff_inputs_goes_into_nested_tables() -> None:
    before = {"artifacts": {"sglang": "1" * 64, "torch": "2" * 64}, "gpu": False, "suites": {"00-stack": "x"}}
    after = {"artifacts": {"sglang": "3" * 64, "torch": "2" * 64}, "gpu": True, "new": 1}
    assert [str(d) for d in history.diff_inputs(before, after)] == [
        "artifacts.sglang: 111111111111… → 333333333333…",
        "gpu: false → true",
        "new (added)",
        "suites (removed)",
    ]
