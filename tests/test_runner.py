"""The runner end to end on a real cell (real wheels from PyPI, real pytest processes, real JUnit)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from junitparser import JUnitXml

from stackfarm.cli import main
from stackfarm.errors import ExitCode

REPO = Path(__file__).resolve().parent.parent

#: The seeds' starting point: the smallest real cell of the default matrix (cached after the first run).
CELL = "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"
AXES = """
[axes]
cuda = ["12.8"]
torch = ["2.9.1"]
sgl_kernel = ["0.3.21"]
flashinfer = ["0.6.3"]
sglang = ["0.5.9"]
"""


def _suite(root: Path, name: str, body: str) -> None:
    folder = root / "suites" / name
    folder.mkdir(parents=True)
    (root / "suites").mkdir(exist_ok=True)
    (folder / "test_it.py").write_text(textwrap.dedent(body))


def _project(tmp_path: Path, extra: str = "", *, real_stack_suite: bool = False) -> Path:
    """A matrix folder with its own suites; the conftest is the real one (it gives the `cell` fixture)."""
    (tmp_path / "suites").mkdir(exist_ok=True)
    shutil.copy(REPO / "suites" / "conftest.py", tmp_path / "suites" / "conftest.py")
    if real_stack_suite:
        shutil.copytree(REPO / "suites" / "00-stack", tmp_path / "suites" / "00-stack")
    (tmp_path / "matrix.toml").write_text(AXES + extra)
    return tmp_path / "matrix.toml"


def _run(matrix: Path, *args: str) -> int:
    # The local backend explicitly: `auto` would pick Docker where CI started an engine.
    return main(
        [
            "run",
            "--matrix",
            str(matrix),
            "--reports",
            str(matrix.parent / "reports"),
            "--backend",
            "local",
            *args,
        ]
    )


def _suites(reports: Path) -> dict[str, tuple[str, str]]:
    """suite name -> (result kind, message) of the first testcase that did not pass, from the merged JUnit."""
    found = {}
    for suite in JUnitXml.fromfile(str(reports / "junit.xml")):
        kinds = [(type(r).__name__.lower(), r.message or "") for case in suite for r in case.result]
        found[suite.name] = kinds[0] if kinds else ("passed", "")
    return found


pytestmark = pytest.mark.integration


def test_real_cell_end_to_end_with_gates(tmp_path: Path) -> None:
    _suite(tmp_path, "05-fails", "def test_fails():\n    assert 1 + 1 == 3\n")
    _suite(tmp_path, "06-after", "def test_never_runs():\n    pass\n")
    matrix = _project(tmp_path, real_stack_suite=True)

    assert _run(matrix) == ExitCode.CELLS_FAILED
    reports = tmp_path / "reports"
    suites = _suites(reports)
    assert suites[f"{CELL}::00-stack"] == ("passed", "")
    assert suites[f"{CELL}::05-fails"][0] == "failure"
    kind, message = suites[f"{CELL}::06-after"]
    assert kind == "skipped"
    assert "gated: 05-fails did not pass" in message
    # Properties carry the component versions and the artifacts' hashes.
    stack = next(s for s in JUnitXml.fromfile(str(reports / "junit.xml")) if s.name.endswith("00-stack"))
    props = {p.name: p.value for p in stack.properties()}  # type: ignore[no-untyped-call]  # junitparser: unannotated
    assert props["torch.version"] == "2.9.1"
    assert len(props["sgl-kernel.sha256"]) == 64
    for name in ("summary.md", "summary.html", f"{CELL}/verdict.json"):
        assert (reports / name).is_file()
    assert "❌" in (reports / "summary.md").read_text()
    assert not list(reports.rglob(".*.running")), "no half-written suite report may remain"


def test_unchanged_inputs_reuse_the_verdict_and_force_reruns(tmp_path: Path) -> None:
    _suite(tmp_path, "00-ok", "import time\n\ndef test_ok():\n    assert time.time() > 0\n")
    matrix = _project(tmp_path)
    assert _run(matrix) == ExitCode.OK
    log = tmp_path / "reports" / CELL / "00-ok.log"
    first = log.stat().st_mtime_ns
    assert _run(matrix) == ExitCode.OK
    assert log.stat().st_mtime_ns == first, "a reused verdict must not run the suite again"
    # Editing a suite changes the cell's inputs: it runs again.
    (tmp_path / "suites" / "00-ok" / "test_it.py").write_text("def test_ok():\n    assert 2 * 2 == 4\n")
    assert _run(matrix) == ExitCode.OK
    second = log.stat().st_mtime_ns
    assert second != first
    assert _run(matrix, "--force") == ExitCode.OK
    assert log.stat().st_mtime_ns != second


def test_gpu_suite_is_skipped_with_reason_never_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("stackfarm.cli.runs.gpu_unavailable_reason", lambda: "no NVIDIA GPU (test)")
    _suite(tmp_path, "30-gpu", "def test_gpu():\n    raise AssertionError('must not run')\n")
    matrix = _project(tmp_path, "\n[suites.30-gpu]\nneeds_gpu = true\n")
    assert _run(matrix) == ExitCode.INCOMPLETE, "a skipped suite is not a pass"
    kind, message = _suites(tmp_path / "reports")[f"{CELL}::30-gpu"]
    assert (kind, message) == ("skipped", "needs GPU: no NVIDIA GPU (test)")


def test_suite_collecting_nothing_is_an_error(tmp_path: Path) -> None:
    _suite(tmp_path, "00-empty", "def helper():\n    return 1\n")
    matrix = _project(tmp_path)
    assert _run(matrix) == ExitCode.CELLS_FAILED
    # A harness error of the cell (never the suite's "failed"): the merged JUnit carries the cell's error,
    # the suite's own file what pytest said.
    merged = _suites(tmp_path / "reports")
    [(kind, message)] = [v for k, v in merged.items() if k.startswith(CELL)]
    assert kind == "error"
    assert "collected no tests" in message
    [suite] = JUnitXml.fromfile(str(tmp_path / "reports" / CELL / "00-empty.xml"))
    assert [type(r).__name__ for case in suite for r in case.result] == ["Error"]


def test_one_broken_cell_does_not_stop_the_others(tmp_path: Path) -> None:
    _suite(tmp_path, "00-ok", "def test_ok():\n    assert 2 > 1\n")
    # A second torch whose index is a closed local port: that cell errors, the other one runs.
    extra = """
[indexes.pypi]
url = "https://pypi.org/simple"
default = true
[indexes.dead]
url = "http://127.0.0.1:9/simple"
[[route]]
requirement = "torch==2.9.0"
index = "dead"
[[include]]
cuda = "12.8"
torch = "2.9.0"
sgl_kernel = "0.3.21"
flashinfer = "0.6.3"
sglang = "0.5.9"
[[override]]
axis = "torch"
when = { torch = "2.9.0" }
reason = "a deliberately unreachable cell for this test"
"""
    matrix = _project(tmp_path, extra)
    assert _run(matrix, "--jobs", "2") == ExitCode.ENVIRONMENT, "nothing failed; one cell had no index"
    suites = _suites(tmp_path / "reports")
    assert suites[f"{CELL}::00-ok"] == ("passed", "")
    kind, message = suites["cu128-torch2.9.0-sk0.3.21-fi0.6.3-sgl0.5.9::plan"]
    assert kind == "error"
    assert "127.0.0.1:9" in message


def test_version_missing_from_the_index_stops_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _suite(tmp_path, "00-ok", "def test_ok():\n    assert 2 > 1\n")
    matrix = _project(tmp_path)
    matrix.write_text(matrix.read_text().replace('sglang = ["0.5.9"]', 'sglang = ["0.5.9", "0.5.99"]'))
    assert _run(matrix) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "0.5.99" in err
    assert "matrix.toml:" in err
    assert not (tmp_path / "reports").exists(), "nothing may be written when the matrix is wrong"


def test_ctrl_c_leaves_complete_reports_and_a_rerun_resumes(tmp_path: Path) -> None:
    _suite(tmp_path, "00-slow", "import time\n\ndef test_slow():\n    time.sleep(60)\n")
    matrix = _project(tmp_path)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stackfarm",
            "run",
            "--matrix",
            str(matrix),
            "--reports",
            str(tmp_path / "reports"),
            "--backend",
            "local",
        ],
        cwd=tmp_path,
        start_new_session=True,
        # A shell that starts jobs in the background (CI, this test's own runner) ignores SIGINT, and children
        # inherit that; a terminal doesn't. Restore the default so the child behaves as under a terminal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - no threads yet here
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    running = tmp_path / "reports" / CELL / ".00-slow.xml.running"
    while time.monotonic() < deadline and not _pytest_started(proc.pid):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, out
    assert not running.exists()
    assert not list((tmp_path / "reports").rglob("*.tmp"))
    if (tmp_path / "reports" / "junit.xml").exists():
        JUnitXml.fromfile(str(tmp_path / "reports" / "junit.xml"))  # complete, parseable
    # A re-run with a fast suite completes the cell.
    (tmp_path / "suites" / "00-slow" / "test_it.py").write_text("def test_fast():\n    assert 1\n")
    assert _run(matrix) == ExitCode.OK


def _pytest_started(pid: int) -> bool:
    """True once the runner (pid) has a pytest child."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
        if ppid == pid and b"-m\0pytest\0" in cmdline:
            return True
    return False


def _inputs_of(root: Path, backend: str = "local") -> dict[str, object]:
    from stackfarm.cellinputs import cell_inputs
    from stackfarm.matrix import load
    from stackfarm.plan import plan

    matrix = load(root / "matrix.toml")
    cell = plan(matrix, {}).cells[0]
    return cell_inputs(matrix, cell, {}, backend=backend, gpu=False)


def _repo_copy(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(REPO / "suites", root / "suites")
    shutil.copytree(REPO / "patches", root / "patches")
    shutil.copytree(REPO / "docker", root / "docker")
    shutil.copy(REPO / "matrix.toml", root / "matrix.toml")
    return root


def test_routing_to_another_runner_kind_is_a_new_input(tmp_path: Path) -> None:
    """The runner kind decides what a cell is asked (n/a where it has too few GPUs, its thresholds): moving
    the cell to another kind must not reuse the old verdict."""
    root = _repo_copy(tmp_path)
    before = _inputs_of(root)
    text = (root / "matrix.toml").read_text()
    moved = text.replace('cells = ["*-sgl0.5.9", "*-sgl0.5.10"]', 'cells = ["*-sgl0.5.10"]')
    assert moved != text
    (root / "matrix.toml").write_text(moved)
    after = _inputs_of(root)
    assert before["runner"]["name"] == "8x-rtx-pro-6000"  # type: ignore[index]
    assert after["runner"]["name"] == "1x-h200"  # type: ignore[index]


def test_the_docker_recipe_is_an_input_of_docker_cells_only(tmp_path: Path) -> None:
    root = _repo_copy(tmp_path)
    before, local = _inputs_of(root, "docker"), _inputs_of(root)
    (root / "docker" / "Dockerfile").write_text((root / "docker" / "Dockerfile").read_text() + "\n# edited\n")
    assert _inputs_of(root, "docker")["docker"] != before["docker"]
    assert local["docker"] is None
    assert _inputs_of(root)["docker"] is None


def test_a_lazy_local_backend_has_its_own_name(tmp_path: Path) -> None:
    from stackfarm.artifacts import Cache
    from stackfarm.backends.local import LocalBackend

    assert LocalBackend(Cache(tmp_path), lazy=True).name == "local-lazy"
    assert LocalBackend(Cache(tmp_path), lazy=False).name == "local"
