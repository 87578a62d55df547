"""The runner end to end on a synthetic stack: real wheels, real pytest processes, nothing downloaded.

Each test builds a project on the fake find_links index (tests/fakestack.py), runs `stackfarm run` with the
local backend and checks the exit code (stackfarm.errors.ExitCode) and the verdicts:

- a cell passes only when every enabled suite ran and every testcase passed; no suite at all is incomplete;
- a testcase skipped for want of a GPU leaves the cell incomplete (exit 3), an "n/a: " skip does not count;
- pytest's exit 5 (no tests), a crash at import and a dying interpreter are errors: the cell failed;
- a failing gate skips the later suites ("gated: ...") and fails the cell;
- unchanged inputs reuse the verdict with the same exit code; --force runs again;
- a conflict fails the run; an unreachable index with nothing failed is an environment error (exit 4).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable
from email.parser import Parser

import pytest
from packaging.utils import parse_wheel_filename

from fakestack import CONFLICT, CU130, NEW, OLD, SGLANG_PINS, FakeProject, cell_id, write_stack
from stackfarm import verdict
from stackfarm.errors import ExitCode

pytest_plugins = ("fakestack",)

CELL = cell_id(OLD)
NEW_CELL = cell_id(NEW)

# --------------------------------------------------------------------------- reading the reports
# Every assertion on a report file goes through these helpers: when a format changes, adapt them here.


def verdict_status(project: FakeProject, cell: str = CELL) -> str:
    """The cell's verdict from reports/<cell>/verdict.json: passed, failed, incomplete, conflict, excluded or
    error), read through the verdict store."""
    return str(verdict.read(project.reports / cell / "verdict.json").report.status)


def summary_row(project: FakeProject, cell: str = CELL) -> str:
    """The cell's row of reports/summary.md."""
    text = (project.reports / "summary.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("|") and f"`{cell}`" in line]
    assert len(rows) == 1, f"summary.md has {len(rows)} rows for {cell}:\n{text}"
    return rows[0]


def summary_status(project: FakeProject, cell: str = CELL) -> str:
    """The status column of the cell's summary row (the one before "first failure"), e.g. "✅ passed"."""
    columns = [c.strip() for c in summary_row(project, cell).strip("|").split(" | ")]
    return columns[-2]


def junit_cases(project: FakeProject, suite: str, cell: str = CELL) -> list[tuple[str, str]]:
    """(result, message) of every testcase of `<cell>::<suite>` in the merged reports/junit.xml; result is
    passed, failure, error or skipped."""
    root = ET.parse(project.reports / "junit.xml").getroot()
    found = [ts for ts in root.iter("testsuite") if ts.get("name") == f"{cell}::{suite}"]
    assert found, f"junit.xml has no testsuite {cell}::{suite}"
    out = []
    for case in found[0].iter("testcase"):
        results = [r for r in case if r.tag in ("failure", "error", "skipped")]
        if not results:
            out.append(("passed", ""))
        else:
            out.append((results[0].tag, results[0].get("message") or results[0].text or ""))
    return out


def ran(project: FakeProject, cell: str = CELL) -> list[str]:
    """The suites that really ran in `cell` so far (pytest imported their module), in order."""
    return [suite for c, suite in project.runs() if c == cell]


# --------------------------------------------------------------------------- the fake index itself


def _record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_the_fake_wheels_are_real_wheels(fake_project: FakeProject) -> None:
    wheels = sorted(fake_project.wheels.glob("*.whl"))
    assert len(wheels) == 10
    for wheel in wheels:
        name, version, _build, tags = parse_wheel_filename(wheel.name)
        with zipfile.ZipFile(wheel) as zf:
            infos = {n.split("/")[0] for n in zf.namelist() if ".dist-info/" in n}
            assert infos == {f"{name.replace('-', '_')}-{version}.dist-info"}
            info = infos.pop()
            meta = Parser().parsestr(zf.read(f"{info}/METADATA").decode())
            assert (meta["Name"], meta["Version"]) == (name, str(version))
            assert f"Tag: {next(iter(tags))}" in zf.read(f"{info}/WHEEL").decode()
            rows = list(csv.reader(io.StringIO(zf.read(f"{info}/RECORD").decode())))
            assert {row[0] for row in rows} == set(zf.namelist())
            for path, digest, size in rows:
                if path == f"{info}/RECORD":
                    assert (digest, size) == ("", "")
                    continue
                data = zf.read(path)
                assert (digest, int(size)) == (_record_digest(data), len(data)), path
            if name == "sglang":
                assert meta.get_all("Requires-Dist") == list(SGLANG_PINS[str(version)])
    # The same inputs give the same bytes: a rebuilt index keeps every sha256 (and so every input hash).
    before = {w.name: w.read_bytes() for w in wheels}
    fake_project.wheels.joinpath(wheels[0].name).unlink()
    write_stack(fake_project.wheels)
    assert {w.name: w.read_bytes() for w in sorted(fake_project.wheels.glob("*.whl"))} == before


def test_plan_lists_the_cells_and_the_conflict(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    from stackfarm.cli import main

    fake_project.suite("00-ok", "pass")
    matrix = fake_project.write_matrix([OLD, NEW, CU130, CONFLICT])
    capsys.readouterr()
    assert main(["plan", "--json", "--matrix", str(matrix)]) == ExitCode.OK
    plan = json.loads(capsys.readouterr().out)
    cells = {c["id"]: c for c in plan["cells"]}
    assert sorted(cells) == sorted([CELL, NEW_CELL, cell_id(CU130)])
    kernels = {cid: [c["distribution"] for c in cell["components"]] for cid, cell in cells.items()}
    assert kernels[CELL] == ["torch", "sgl-kernel", "flashinfer-python", "flashinfer-cubin", "sglang"]
    assert kernels[NEW_CELL] == ["torch", "sglang-kernel", "flashinfer-python", "flashinfer-cubin", "sglang"]
    assert cells[cell_id(CU130)]["values"]["torch"] == "2.9.1+cu130"
    assert [c["id"] for c in plan["conflicts"]] == [cell_id(CONFLICT)]
    problems = " ".join(plan["conflicts"][0]["problems"])
    assert "requires sglang-kernel==0.4.1; the cell has sgl-kernel 0.3.21" in problems
    assert "flashinfer-python==0.6.7.post2" in problems
    assert not fake_project.reports.exists()


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda text: text.replace('sglang = ["0.5.9"]', 'sglang = ["0.5.9", "0.5.99"]'), "0.5.99"),
        (lambda text: text + "\n[suites.99-missing]\ngate = false\n", "99-missing"),
    ],
    ids=["version-not-on-the-index", "unknown-suite"],
)
def test_an_invalid_matrix_is_a_config_error_before_any_work(
    fake_project: FakeProject,
    capsys: pytest.CaptureFixture[str],
    edit: Callable[[str], str],
    expected: str,
) -> None:
    fake_project.suite("00-ok", "pass")
    matrix = fake_project.write_matrix()
    matrix.write_text(edit(matrix.read_text()))
    assert fake_project.run() == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert expected in err
    assert "matrix.toml" in err
    assert not fake_project.reports.exists(), "nothing may be written when the matrix is wrong"
    assert ran(fake_project) == []


# --------------------------------------------------------------------------- passing


def test_every_suite_passing_passes_the_cell(fake_project: FakeProject) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.suite("10-also-ok", "pass")
    fake_project.suite("20-disabled", "never", enabled=False)
    # A second cell on CUDA 13.0, excluded: an excluded cell never counts against the run.
    fake_project.write_matrix(
        axes={"cuda": ["13.0"]}, extra='\n[[exclude]]\ncuda = "13.0"\nreason = "not this time"\n'
    )
    assert fake_project.run() == ExitCode.OK
    assert verdict_status(fake_project) == "passed"
    assert "passed" in summary_status(fake_project)
    assert ran(fake_project) == ["00-ok", "10-also-ok"], "a disabled suite never runs"
    assert junit_cases(fake_project, "00-ok") == [("passed", "")] * 2
    excluded = cell_id({**OLD, "cuda": "13.0"})
    assert "excluded" in summary_status(fake_project, excluded)
    assert not any(c == excluded for c, _ in fake_project.runs())


def test_a_run_narrowed_by_suites_says_so_in_every_verdict(fake_project: FakeProject) -> None:
    """`--suites 00-*`: the verdict covers the selected suites only; it is recorded and shown as such, and a
    later run of every suite does not reuse it (the suites are inputs)."""
    fake_project.suite("00-ok", "pass")
    fake_project.suite("10-also-ok", "pass")
    fake_project.write_matrix()
    assert fake_project.run("--suites", "00-*") == ExitCode.OK
    stored = verdict.read(verdict.path_of(fake_project.reports, cell_id(OLD)))
    assert stored.report.selection == "00-*"
    assert stored.report.status_text() == "passed (only 00-*)"
    assert "passed (only 00-*)" in summary_status(fake_project)
    assert ran(fake_project) == ["00-ok"]
    from stackfarm.cli import main

    # A merged report's gate stands for whole cells: a verdict of 00-* alone is not green there.
    assert main(["report", "--reports", str(fake_project.reports), "--gate"]) == ExitCode.INCOMPLETE
    assert fake_project.run() == ExitCode.OK
    assert ran(fake_project) == ["00-ok", "00-ok", "10-also-ok"], "the narrowed verdict is not reused"
    assert verdict.read(verdict.path_of(fake_project.reports, cell_id(OLD))).report.selection == ""


def test_a_not_applicable_skip_does_not_count_against_the_cell(fake_project: FakeProject) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.suite("10-partly-na", "not-applicable")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.OK
    assert verdict_status(fake_project) == "passed"
    assert ("skipped", "n/a: the fake cell has no such component") in [
        (kind, message.removeprefix("Skipped: "))
        for kind, message in junit_cases(fake_project, "10-partly-na")
    ]


# --------------------------------------------------------------------------- incomplete


def test_a_testcase_skipped_for_want_of_a_gpu_leaves_the_cell_incomplete(fake_project: FakeProject) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.suite("10-gpu", "gpu-skip")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.INCOMPLETE
    assert verdict_status(fake_project) == "incomplete"
    assert "incomplete" in summary_status(fake_project)


def test_a_gpu_suite_on_a_machine_without_gpu_leaves_the_cell_incomplete(fake_project: FakeProject) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.suite("30-gpu", "never", needs_gpu=True, gate=False)
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.INCOMPLETE
    assert verdict_status(fake_project) == "incomplete"
    [(kind, message)] = junit_cases(fake_project, "30-gpu")
    assert kind == "skipped"
    assert message.startswith("needs GPU: ")
    assert ran(fake_project) == ["00-ok"]


@pytest.mark.parametrize("how", ["all-disabled", "no-suites-folder"])
def test_a_cell_that_runs_no_suite_is_incomplete_never_passed(fake_project: FakeProject, how: str) -> None:
    if how == "all-disabled":
        fake_project.suite("00-off", "pass", enabled=False)
        fake_project.suite("10-off", "pass", enabled=False)
    fake_project.write_matrix()
    if how == "no-suites-folder":
        shutil.rmtree(fake_project.suites)
    assert fake_project.run() == ExitCode.INCOMPLETE
    assert verdict_status(fake_project) == "incomplete"
    assert "incomplete" in summary_status(fake_project)
    assert ran(fake_project) == []


# --------------------------------------------------------------------------- failed


def test_a_failing_suite_fails_the_cell_and_later_suites_still_run(fake_project: FakeProject) -> None:
    fake_project.suite("00-fails", "fail", gate=False)
    fake_project.suite("10-ok", "pass")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.CELLS_FAILED
    assert verdict_status(fake_project) == "failed"
    assert "failed" in summary_status(fake_project)
    assert "synthetic failure" in summary_row(fake_project)
    assert ran(fake_project) == ["00-fails", "10-ok"]
    assert junit_cases(fake_project, "10-ok") == [("passed", "")] * 2


def test_an_incomplete_gate_lets_the_later_suites_run_and_the_cell_stays_incomplete(
    fake_project: FakeProject,
) -> None:
    fake_project.suite("10-gate", "gpu-skip", gate=True)  # one testcase passed, one skipped for want of a GPU
    fake_project.suite("20-after", "pass")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.INCOMPLETE
    assert verdict_status(fake_project) == "incomplete"
    assert ran(fake_project) == ["10-gate", "20-after"], "what the gate answered passed: the next suite runs"


def test_a_gate_that_ran_nothing_skips_the_later_suites(fake_project: FakeProject) -> None:
    fake_project.suite("10-gate", "gpu-skip", gate=True, needs_gpu=True)
    fake_project.suite("20-after", "never")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.INCOMPLETE
    assert ran(fake_project) == []
    [(kind, message)] = junit_cases(fake_project, "20-after")
    assert (kind, message.split(":")[0]) == ("skipped", "gated")


def test_a_failing_gate_skips_the_later_suites_and_fails_the_cell(fake_project: FakeProject) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.suite("10-gate", "fail", gate=True)
    fake_project.suite("20-after", "never")
    fake_project.suite("30-after-too", "pass", gate=False)
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.CELLS_FAILED
    assert verdict_status(fake_project) == "failed"
    assert ran(fake_project) == ["00-ok", "10-gate"], "nothing runs after a failing gate"
    for later in ("20-after", "30-after-too"):
        [(kind, message)] = junit_cases(fake_project, later)
        assert kind == "skipped"
        assert message.startswith("gated: 10-gate"), message


def test_pytest_collecting_no_tests_is_an_error(fake_project: FakeProject) -> None:
    """A harness error (pytest exit 5), never the suite's "failed", and never reused: a re-run asks again."""
    fake_project.suite("00-ok", "pass")
    fake_project.suite("10-empty", "empty", gate=False)
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.CELLS_FAILED
    assert verdict_status(fake_project) == "error"
    stored = verdict.read(fake_project.reports / CELL / "verdict.json").report
    assert "10-empty: pytest collected no tests (exit 5)" in stored.reason
    # The suite's own JUnit file says what pytest said, for JUnit consumers.
    [case] = ET.parse(fake_project.reports / CELL / "10-empty.xml").getroot().iter("testcase")
    [result] = [r for r in case if r.tag == "error"]
    assert "collected no tests" in (result.get("message") or "")
    assert fake_project.run() == ExitCode.CELLS_FAILED
    assert ran(fake_project) == ["00-ok", "10-empty"] * 2, "an error verdict is never reused"


def test_a_suite_crashing_at_import_fails_the_cell(fake_project: FakeProject) -> None:
    # pytest exits 2 on a collection error, the code it also uses for Ctrl-C: this is no interrupt.
    fake_project.suite("00-crash", "import-crash", gate=False)
    fake_project.suite("10-ok", "pass")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.CELLS_FAILED
    assert verdict_status(fake_project) == "failed"
    assert ran(fake_project) == ["00-crash", "10-ok"]
    assert [k for k, _ in junit_cases(fake_project, "00-crash")] == ["error"]
    assert "failed" in summary_status(fake_project)


def test_a_suite_whose_python_dies_fails_the_cell(fake_project: FakeProject) -> None:
    fake_project.suite("00-dies", "dies")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.CELLS_FAILED
    assert verdict_status(fake_project) == "failed"
    [(kind, message)] = junit_cases(fake_project, "00-dies")
    assert kind == "error"
    assert "exited 3" in message


def test_a_failed_cell_outranks_an_incomplete_one(fake_project: FakeProject) -> None:
    fake_project.suite("00-by-cell", "by-cell")
    fake_project.write_matrix([OLD, NEW])
    assert fake_project.run() == ExitCode.CELLS_FAILED
    assert verdict_status(fake_project, CELL) == "incomplete"
    assert verdict_status(fake_project, NEW_CELL) == "failed"


def test_a_conflict_cell_fails_the_run_and_is_in_the_summary(fake_project: FakeProject) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, CONFLICT])
    assert fake_project.run() == ExitCode.CELLS_FAILED
    assert verdict_status(fake_project) == "passed"
    conflict = cell_id(CONFLICT)
    assert "conflict" in summary_status(fake_project, conflict)
    assert "requires sglang-kernel==0.4.1" in (fake_project.reports / "summary.md").read_text()
    assert not any(c == conflict for c, _ in fake_project.runs()), "a conflict cell runs no suite"


# --------------------------------------------------------------------------- reuse


@pytest.mark.parametrize(
    ("kind", "code", "status"),
    [
        ("pass", ExitCode.OK, "passed"),
        ("fail", ExitCode.CELLS_FAILED, "failed"),
        ("gpu-skip", ExitCode.INCOMPLETE, "incomplete"),
    ],
)
def test_unchanged_inputs_reuse_the_verdict_with_the_same_exit_code(
    fake_project: FakeProject, kind: str, code: ExitCode, status: str
) -> None:
    fake_project.suite("00-suite", kind)
    fake_project.write_matrix()
    assert fake_project.run() == code
    assert verdict_status(fake_project) == status
    assert ran(fake_project) == ["00-suite"]
    assert fake_project.run() == code, "a reused verdict gives the exit code of the run it comes from"
    assert ran(fake_project) == ["00-suite"], "a reused verdict runs no suite"
    assert verdict_status(fake_project) == status
    assert "reused" in summary_status(fake_project)
    assert status in summary_status(fake_project)


def test_force_and_changed_inputs_run_again(fake_project: FakeProject) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.OK
    assert fake_project.run("--force") == ExitCode.OK
    assert ran(fake_project) == ["00-ok", "00-ok"]
    assert "reused" not in summary_status(fake_project)
    # Editing a suite changes the cell's inputs: it runs again, and its new outcome is the verdict.
    test_file = fake_project.suites / "00-ok" / "test_it.py"
    test_file.write_text(test_file.read_text() + "\n\ndef test_now_fails():\n    assert False\n")
    assert fake_project.run() == ExitCode.CELLS_FAILED
    assert ran(fake_project) == ["00-ok"] * 3
    assert verdict_status(fake_project) == "failed"


# --------------------------------------------------------------------------- the environment


@pytest.mark.parametrize(
    ("other", "code"),
    [("pass", ExitCode.ENVIRONMENT), ("fail", ExitCode.CELLS_FAILED)],
    ids=["nothing-failed", "another-cell-failed"],
)
def test_an_unreachable_index_is_an_environment_error(
    fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch, other: str, code: ExitCode
) -> None:
    monkeypatch.setattr("stackfarm.artifacts.RETRY_DELAYS", ())  # a closed port answers at once anyway
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    fake_project.suite("00-suite", other)
    # SGLang 0.5.10 lives on an index nobody answers on (a closed local port): only its cell has no verdict.
    fake_project.write_matrix(
        [OLD, NEW],
        extra="""
        [indexes.dead]
        url = "http://127.0.0.1:9/simple"

        [[route]]
        requirement = "sglang==0.5.10"
        index = "dead"
        """,
    )
    assert fake_project.run() == code
    assert verdict_status(fake_project) == ("passed" if other == "pass" else "failed")
    assert "127.0.0.1:9" in summary_row(fake_project, NEW_CELL)
    assert not any(c == NEW_CELL for c, _ in fake_project.runs())


def test_ctrl_c_is_interrupted_and_keeps_no_half_verdict(fake_project: FakeProject) -> None:
    fake_project.suite("00-slow", "slow")
    fake_project.write_matrix()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stackfarm", *fake_project.argv()],
        cwd=fake_project.root,
        start_new_session=True,
        # A shell that starts jobs in the background ignores SIGINT and children inherit that; a terminal
        # doesn't. Restore the default so the child behaves as under a terminal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - no threads here
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not ran(fake_project) and proc.poll() is None:
            time.sleep(0.05)
        assert ran(fake_project) == ["00-slow"], "the suite never started"
        time.sleep(0.3)  # let pytest get into the test itself
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == ExitCode.INTERRUPTED, out
    assert not (fake_project.reports / CELL / "verdict.json").exists(), "an interrupted cell keeps no verdict"
    assert not list(fake_project.reports.rglob("*.running"))
    # A re-run with a fast suite runs the cell again and completes it.
    write = fake_project.suites / "00-slow" / "test_it.py"
    write.write_text(write.read_text().replace("time.sleep(60)", "assert time.time() > 0"))
    assert fake_project.run() == ExitCode.OK
    assert ran(fake_project) == ["00-slow", "00-slow"]


# --------------------------------------------------------------------------- n/a is earned


def _suite_result(project: FakeProject, suite: str, cell: str = CELL) -> verdict.SuiteResult:
    stored = verdict.read(verdict.path_of(project.reports, cell))
    return next(s for s in stored.report.suites if s.suite == suite)


def test_a_skip_that_only_says_n_a_leaves_the_cell_incomplete(fake_project: FakeProject) -> None:
    """`pytest.skip("n/a: ...")`, or a suite recording the stackfarm.not_applicable property itself, is not
    suitekit.not_applicable with a reason class: both are unanswered questions, and the cell's reason says so."""
    fake_project.suite("00-ok", "pass")
    fake_project.suite("10-claims", "claims-na")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.INCOMPLETE
    stored = verdict.read(verdict.path_of(fake_project.reports, CELL)).report
    assert str(stored.status) == "incomplete"
    result = _suite_result(fake_project, "10-claims")
    assert (result.outcome, result.skipped, result.not_applicable) == ("incomplete", 2, 0)
    assert stored.reason == (
        "10-claims: test_says_na: n/a: whatever "
        "(says n/a, but not through suitekit.not_applicable with a reason class: unanswered)"
    )


def test_a_not_applicable_skip_is_marked_with_its_class(fake_project: FakeProject) -> None:
    fake_project.suite("10-partly-na", "not-applicable")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.OK
    result = _suite_result(fake_project, "10-partly-na")
    assert (result.outcome, result.skipped, result.not_applicable) == ("passed", 0, 1)
    (per_suite,) = (fake_project.reports / CELL).glob("10-partly-na*.xml")
    case = next(
        c for c in ET.parse(per_suite).getroot().iter("testcase") if c.get("name") == "test_does_not_apply"
    )
    assert [(p.get("name"), p.get("value")) for p in case.iter("property")] == [
        ("stackfarm.not_applicable", "component-absent")
    ]


_CPU_BOX = """
[runners.cpu-box]
labels = ["self-hosted", "linux", "x64"]
gpus = 1
cells = ["*"]
"""


def test_a_machine_that_is_not_the_runner_kind_leaves_a_gpu_question_unanswered(
    fake_project: FakeProject,
) -> None:
    """[runners.cpu-box] gpus = 1, the fake machine has 0 GPUs: a 2-GPU question is not "does not apply"
    (this machine is not the kind the cell is routed to), it is unanswered."""
    fake_project.suite("10-tp", "two-gpus")
    fake_project.write_matrix(extra=_CPU_BOX)
    assert fake_project.run() == ExitCode.INCOMPLETE
    result = _suite_result(fake_project, "10-tp")
    assert (result.outcome, result.skipped, result.not_applicable) == ("incomplete", 1, 0)
    assert "this machine (0 GPU(s)) is not that kind" in (result.first_failure or "")
    assert "[runners.cpu-box] has 1 GPU(s)" in (result.first_failure or "")


def test_a_machine_of_the_runner_kind_is_not_asked_a_question_it_lacks_gpus_for(
    fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_project.suite("10-tp", "two-gpus")
    fake_project.write_matrix(extra=_CPU_BOX)
    monkeypatch.setenv("FAKESTACK_GPUS", "1")  # what the suite detects: the kind's count
    assert fake_project.run() == ExitCode.OK
    result = _suite_result(fake_project, "10-tp")
    assert (result.outcome, result.skipped, result.not_applicable) == ("passed", 0, 1)


# --------------------------------------------------------------------------- the python axis (local backend)
# The local backend runs a cell's suites under the cell's own Python (stackfarm.interpreters).


def _with_pythons(project: FakeProject, *pythons: str) -> None:
    """The project's matrix with these [axes] python values (cell ids then end in -py<X.Y>)."""
    text = project.matrix.read_text(encoding="utf-8")
    project.matrix.write_text(text.replace('python = ["3.11"]', f"python = {json.dumps(list(pythons))}"))


_RUNNING = f"{sys.version_info.major}.{sys.version_info.minor}"
#: A suite that says which Python ran it: reports/<cell>/python.txt.
_WHICH_PYTHON = """
import os, platform, sys
from pathlib import Path


def test_which_python(cell):
    Path(os.environ["STACKFARM_SUITE_OUT"], "python.txt").write_text(platform.python_version() + " " + sys.executable)
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == cell.values["python"]
"""


def test_a_cell_whose_python_is_missing_is_an_environment_error(
    fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A cell of a supported Python this machine lacks (no PATH entry, no uv, no pyenv version): that cell is
    an environment error naming pythonX.Y and the fix, nothing of it runs; the running Python's cell passes
    and its verdict names the interpreter that ran it. Hermetic: PATH holds only the fixture's nvidia-smi
    (the running Python is found as the running one), so no machine's own pythonX.Y answers."""
    import platform

    absent = "3.13" if _RUNNING != "3.13" else "3.12"
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path_factory.mktemp("no-pyenv")))
    monkeypatch.setenv("PATH", str(fake_project.root.parent / "bin"))
    fake_project.suite("00-ok", "pass")
    (fake_project.suites / "00-ok" / "test_which.py").write_text(_WHICH_PYTHON)
    fake_project.write_matrix()
    _with_pythons(fake_project, _RUNNING, absent)
    assert fake_project.run() == ExitCode.ENVIRONMENT
    mine, missing = f"{CELL}-py{_RUNNING}", f"{CELL}-py{absent}"
    assert verdict_status(fake_project, mine) == "passed"
    assert verdict_status(fake_project, missing) == "error"
    reason = verdict.read(fake_project.reports / missing / "verdict.json").report.reason
    assert f"python{absent}" in reason
    assert f"uv python install {absent}" in reason
    assert f"python{absent}" in summary_row(fake_project, missing)
    assert [c for c, _ in fake_project.runs()] == [mine], f"nothing of the {absent} cell ran"
    facts = verdict.read(fake_project.reports / mine / "verdict.json").report.backend_facts
    assert facts.local_python == platform.python_version()
    assert facts.local_python_path == sys.executable
    ran_by = (fake_project.reports / mine / "python.txt").read_text().split()
    assert ran_by == [platform.python_version(), sys.executable]


@pytest.mark.integration
def test_a_cell_of_another_python_runs_its_suites_there(fake_project: FakeProject) -> None:
    """With a real second interpreter on this machine (PATH, uv or pyenv): its cell's suites run under it, in a
    venv built once with stackfarm's requirements from the package index, and the verdict says which."""
    from stackfarm.errors import EnvironmentProblem
    from stackfarm.interpreters import find

    other = next((v for v in ("3.12", "3.13", "3.10") if v != _RUNNING), "3.12")
    try:
        interp = find(other)
    except EnvironmentProblem as exc:
        pytest.skip(f"no second interpreter here: {str(exc).splitlines()[0]}")
    fake_project.suite("00-ok", "pass")
    (fake_project.suites / "00-ok" / "test_which.py").write_text(_WHICH_PYTHON)
    fake_project.write_matrix()
    _with_pythons(fake_project, other)
    cell = CELL  # one python value: the id has no -py suffix
    assert fake_project.run() == ExitCode.OK, summary_row(fake_project, cell)
    version, executable = (fake_project.reports / cell / "python.txt").read_text().split()
    assert version == interp.version
    assert executable.startswith(str(fake_project.cache / "interpreters"))
    facts = verdict.read(fake_project.reports / cell / "verdict.json").report.backend_facts
    assert facts.local_python == interp.version
    assert facts.local_python_source == interp.source


def test_realise_only_realises_every_cell_and_keeps_no_verdict(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run --realise-only` (a CI build step): each cell's stack realised (the local backend: its wheels
    fetched and unpacked into the cache), no suite run, no verdict written; a verdict already there stays
    as it was (a realised stack is not a result), and a later run runs the suites."""
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, NEW])
    assert fake_project.run("--cells", CELL) == ExitCode.OK
    kept = (fake_project.reports / CELL / "verdict.json").read_bytes()
    before = fake_project.runs()
    capsys.readouterr()
    assert fake_project.run("--realise-only") == ExitCode.OK
    out = capsys.readouterr().out
    assert f"realised {CELL}: backend local (local.python {sys.version_info.major}." in out
    assert f"realised {NEW_CELL}: backend local" in out
    assert "2 of 2 cell(s) realised, no suite run, no verdict kept" in out
    assert fake_project.runs() == before, "no suite ran"
    assert (fake_project.reports / CELL / "verdict.json").read_bytes() == kept
    assert not (fake_project.reports / NEW_CELL / "verdict.json").exists()
    unpacked = {p.name for p in fake_project.cache.rglob("*.dist-info")}
    assert any(name.startswith("sglang-0.5.10") for name in unpacked), f"NEW's sglang unpacked: {unpacked}"
    assert fake_project.run() == ExitCode.OK
    assert verdict_status(fake_project, NEW_CELL) == "passed"


def test_realise_only_names_a_cell_it_could_not_realise_and_realises_the_others(
    fake_project: FakeProject,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A cell whose Python this machine lacks cannot be realised: exit 4 naming it (and why), the other cell
    realised all the same; no verdict of either is written (an error of a build step is not a verdict)."""
    absent = "3.13" if _RUNNING != "3.13" else "3.12"
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path_factory.mktemp("no-pyenv")))
    monkeypatch.setenv("PATH", str(fake_project.root.parent / "bin"))
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    _with_pythons(fake_project, _RUNNING, absent)
    assert fake_project.run("--realise-only") == ExitCode.ENVIRONMENT
    out = capsys.readouterr().out
    mine, missing = f"{CELL}-py{_RUNNING}", f"{CELL}-py{absent}"
    assert f"realised {mine}: backend local" in out
    assert f"not realised {missing}: " in out
    assert f"python{absent}" in out
    assert "1 of 2 cell(s) realised" in out
    assert not list(fake_project.reports.rglob("verdict.json"))
    assert fake_project.runs() == []


def test_realise_only_runs_a_plans_cell_as_the_buildkite_build_step_does(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """The build step's line: `run --realise-only --plan plan.json --cells ID` realises that cell alone, on the
    plan's terms (its matrix, its hash basis: the plan's input hash or nothing), and keeps no verdict."""
    from stackfarm.cli import main

    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, NEW])
    capsys.readouterr()
    assert (
        main(["plan", "--json", "--matrix", str(fake_project.matrix), "--backend", "local", "--no-gpu"]) == 0
    )
    plan = fake_project.root / "plan.json"
    plan.write_text(capsys.readouterr().out)
    reports = ["--reports", str(fake_project.reports)]
    assert main(["run", "--realise-only", "--plan", str(plan), "--cells", NEW_CELL, *reports]) == ExitCode.OK
    out = capsys.readouterr().out
    assert f"realised {NEW_CELL}: backend local" in out
    assert "1 of 1 cell(s) realised" in out
    assert not list(fake_project.reports.rglob("verdict.json"))
    assert fake_project.runs() == []


# --------------------------------------------------------------------------- wheels a suite family declares

_WANTS_FAMILY = """
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stackfarm.family import Needs, SuiteFamily
from stackfarm.schema import List, Str, Table


@dataclass(frozen=True, kw_only=True)
class WantsSettings:
    wants: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> "WantsSettings":
        return cls(wants=tuple(str(w) for w in table.get("wants", ())))


FAMILY = SuiteFamily(
    name="50-wants",
    title="Wants",
    order=50,
    settings_schema=Table({"wants": List(Str("a requirement"), "requirements")}, noun="setting"),
    settings=WantsSettings,
    needs=Needs(wheels=lambda s, q: tuple(w.replace("{sglang}", q.stack["sglang"]) for w in s.wants),
                unresolved=UNRESOLVED),
)
"""

_WANTS_TEST = """
from pathlib import Path


def test_the_runner_handed_the_wheels(cell, settings):
    wanted = (w.replace("{sglang}", "0.5.9") for w in settings.wants)
    assert sorted(cell.extras) == sorted(w for w in wanted if w not in UNAVAILABLE)
    for requirement, wheel in cell.extras.items():
        name, version = requirement.split("==")
        assert (wheel.distribution, wheel.version) == (name, version)
        assert (Path(wheel.root) / f"{name}-{version}.dist-info").is_dir(), wheel.root
    assert cell.platform == "manylinux_2_39_x86_64"


def test_what_the_runner_could_not_resolve(cell):
    assert {r: why.split(":")[0] for r, why in cell.unavailable.items()} == UNAVAILABLE
"""


def _wants(
    project: FakeProject, *wants: str, unresolved: str = "error", unavailable: tuple[str, ...] = ()
) -> None:
    folder = project.suites / "50-wants"
    folder.mkdir(parents=True, exist_ok=True)
    family = _WANTS_FAMILY.lstrip().replace("UNRESOLVED", repr(unresolved))
    (folder / "family.py").write_text(family, encoding="utf-8")
    test = _WANTS_TEST.lstrip().replace("UNAVAILABLE", repr({r: r for r in unavailable}))
    (folder / "test_wants.py").write_text(test, encoding="utf-8")
    project.suite_config["50-wants"] = {}
    project.write_matrix(extra=f"\n[suites.50-wants.settings]\nwants = {json.dumps(list(wants))}\n")


def test_the_wheels_a_family_declares_are_resolved_by_the_runner_and_handed_over(
    fake_project: FakeProject,
) -> None:
    """Needs.wheels (20-eagle3's compare_with): the runner resolves each requirement on the matrix's index,
    unpacks it in the shared cache and hands it in CellSpec.extras; the suite resolves nothing itself."""
    _wants(fake_project, "sglang==0.5.10", "sglang=={sglang}")
    assert fake_project.run() == ExitCode.OK
    assert verdict_status(fake_project) == "passed"


def test_a_declared_wheel_that_cannot_be_resolved_is_an_error_of_the_cell(fake_project: FakeProject) -> None:
    """Never a silent pass: the cell is an error naming the suite and the requirement, and no suite runs."""
    _wants(fake_project, "sglang==9.9")
    assert fake_project.run() != ExitCode.OK
    stored = verdict.read(fake_project.reports / CELL / "verdict.json").report
    assert str(stored.status) == "error"
    assert "suite 50-wants needs sglang==9.9, which cannot be resolved" in stored.reason
    assert not (fake_project.reports / CELL / "50-wants.xml").exists(), "no suite ran"


def test_a_family_that_reports_unresolvable_wheels_unanswered_gets_them_with_the_reason(
    fake_project: FakeProject,
) -> None:
    """Needs.unresolved="unanswered" (15-toolchain): the runner hands the wheels it resolved in CellSpec.extras and
    the one it could not in CellSpec.unavailable, with the reason; the suite runs, the cell is no error."""
    _wants(
        fake_project, "sglang=={sglang}", "sglang==9.9", unresolved="unanswered", unavailable=("sglang==9.9",)
    )
    assert fake_project.run() == ExitCode.OK
    assert verdict_status(fake_project) == "passed"
