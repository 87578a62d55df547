"""Faults while cells run, on the synthetic stack of tests/fakestack.py: SIGTERM, suite timeouts, processes a
suite leaves behind, a stored verdict that no longer matches the files on disk. Each case was a wrong answer
or a leak before; each test here fails without its fix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fakestack import OLD, FakeProject, cell_id
from stackfarm import proc, verdict
from stackfarm.errors import ExitCode

pytest_plugins = ("fakestack",)

CELL = cell_id(OLD)


def custom_suite(project: FakeProject, name: str, body: str, **config: object) -> Path:
    folder = project.suites / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"test_{name.replace('-', '_')}.py").write_text(textwrap.dedent(body), encoding="utf-8")
    project.suite_config[name] = dict(config)
    return folder


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait_for(path: Path, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


# A suite whose pytest starts a child in its own group (`sleep`), records both pids, then waits.
SPAWNS = """
    import os, subprocess, time
    from pathlib import Path

    def test_spawns():
        child = subprocess.Popen(["sleep", "300"])
        Path(os.environ["PIDS_FILE"]).write_text(f"{os.getpid()} {child.pid}")
        time.sleep(300)
"""


def test_sigterm_stops_the_run_kills_the_suite_and_keeps_no_verdict(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "pids"
    monkeypatch.setenv("PIDS_FILE", str(pids))
    custom_suite(fake_project, "00-spawns", SPAWNS)
    fake_project.write_matrix()
    run = subprocess.Popen(
        [sys.executable, "-m", "stackfarm", *fake_project.argv()],
        cwd=fake_project.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        pytest_pid, child_pid = map(int, wait_for(pids).split())
        run.send_signal(signal.SIGTERM)  # what a CI runner cancelling the job sends
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == ExitCode.INTERRUPTED, out
    assert not alive(pytest_pid), "the suite's pytest outlived stackfarm"
    assert not alive(child_pid), "a process the suite started outlived stackfarm"
    assert not verdict.path_of(fake_project.reports, CELL).exists(), "an interrupted cell keeps no verdict"


def test_a_suite_timeout_kills_its_whole_process_group(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "pids"
    monkeypatch.setenv("PIDS_FILE", str(pids))
    custom_suite(fake_project, "00-spawns", SPAWNS, timeout=3)
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.CELLS_FAILED
    pytest_pid, child_pid = map(int, pids.read_text().split())
    assert not alive(pytest_pid)
    assert not alive(child_pid), "the suite's child survived its timeout"
    report = verdict.read(verdict.path_of(fake_project.reports, CELL)).report
    assert report.status is verdict.Status.FAILED
    assert "timed out after 3s" in report.reason


# A suite that starts a "server" in a session of its own and registers it, as the throughput suite does.
LEAVES_A_SERVER = """
    import os, subprocess
    from pathlib import Path
    from stackfarm.proc import register_group

    def test_starts_a_server():
        server = subprocess.Popen(["sleep", "300"], start_new_session=True)
        register_group(server.pid)
        Path(os.environ["PIDS_FILE"]).write_text(str(server.pid))
"""


def test_processes_a_suite_registered_are_reaped_when_it_ends(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "pids"
    monkeypatch.setenv("PIDS_FILE", str(pids))
    src = Path(__file__).resolve().parents[1] / "src"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    custom_suite(fake_project, "00-server", LEAVES_A_SERVER)
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.OK
    server = int(pids.read_text())
    assert not alive(server), "the suite's server outlived the suite"


def test_a_verdict_whose_junit_changed_on_disk_is_not_reused(fake_project: FakeProject) -> None:
    """After a SIGKILL mid-suite the JUnit on disk is another run's: the stored verdict must not stand."""
    fake_project.suite("00-suite", "pass")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.OK
    junit = fake_project.reports / CELL / "00-suite.xml"
    junit.write_text(junit.read_text() + "<!-- from another run -->")
    before = len(fake_project.runs())
    assert fake_project.run() == ExitCode.OK
    assert len(fake_project.runs()) == before + 1, "the suite ran again"
    assert "another run" not in junit.read_text()


def test_a_truncated_verdict_is_run_again_not_a_traceback(fake_project: FakeProject) -> None:
    fake_project.suite("00-suite", "pass")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.OK
    path = verdict.path_of(fake_project.reports, CELL)
    path.write_text(path.read_text()[:40])
    assert fake_project.run() == ExitCode.OK
    assert json.loads(path.read_text())["report"]["status"] == "passed"


def test_editing_stackfarm_itself_is_a_new_input() -> None:
    from stackfarm import cellinputs

    digest = cellinputs.own_sources()
    assert len(digest) == 64
    assert cellinputs.hash_tree(Path(cellinputs.__file__).parent) == digest


def test_call_kills_the_group_on_timeout(tmp_path: Path) -> None:
    marker = tmp_path / "child"
    script = f"sleep 300 & echo $! > {marker}; wait"
    outcome = proc.call(["sh", "-c", script], timeout=1)
    assert outcome.timed_out
    assert outcome.returncode == 124
    assert not alive(int(marker.read_text()))


def test_a_reports_folder_that_cannot_be_written_is_an_environment_error(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_project.suite("00-suite", "pass")
    fake_project.write_matrix()
    blocker = fake_project.root / "not-a-folder"
    blocker.write_text("a file where the reports folder should be")
    from stackfarm.cli import main

    code = main([*fake_project.argv()[:3], "--reports", str(blocker / "reports"), "--backend", "local"])
    assert code == ExitCode.ENVIRONMENT
    err = capsys.readouterr().err
    assert "cannot make the reports folder" in err
    assert "Traceback" not in err
    assert fake_project.runs() == [], "nothing ran"


def test_matrix_values_are_never_read_as_markup(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_project.suite("00-suite", "pass")
    fake_project.write_matrix(
        extra='\n[[exclude]]\nsglang = "0.5.9"\nreason = "[/red] not [bold]this[/bold] one"\n'
    )
    from stackfarm.cli import main

    assert main(["plan", "--matrix", str(fake_project.matrix)]) == 0
    assert "[/red] not [bold]this[/bold] one" in capsys.readouterr().out


def test_a_second_run_on_the_same_reports_waits_and_never_interleaves(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "pids"
    monkeypatch.setenv("PIDS_FILE", str(pids))
    custom_suite(fake_project, "00-spawns", SPAWNS)
    fake_project.write_matrix()
    first = subprocess.Popen(
        [sys.executable, "-m", "stackfarm", *fake_project.argv()],
        cwd=fake_project.root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(pids)  # the first run is inside its suite, holding the reports folder
        second = subprocess.run(
            [sys.executable, "-m", "stackfarm", *fake_project.argv()],
            cwd=fake_project.root,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "STACKFARM_LOCK_TIMEOUT": "1"},
            check=False,
        )
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    assert second.returncode == ExitCode.ENVIRONMENT, second.stderr
    assert "waiting for another stackfarm run" in second.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"\xff\xfe[axes]\n", "is not UTF-8 text"), (None, "is a folder, not a matrix file")],
)
def test_an_unreadable_matrix_is_a_config_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, message: str
) -> None:
    from stackfarm.cli import main

    path = tmp_path / "matrix.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert main(["plan", "--matrix", str(path)]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
