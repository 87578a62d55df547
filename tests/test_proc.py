"""stackfarm.proc: a command started with die_with_parent (or $STACKFARM_DIE_WITH_PARENT=1) ends when the
process that started it is killed with SIGKILL, which runs no handler (a Ray worker lost with its node)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: A parent that starts `sleep 300` through proc.call and prints the sleep's pid (read from its pid file).
PARENT = """
import sys, threading, time
from pathlib import Path
from stackfarm import proc
threading.Thread(target=proc.call, args=(["sh", "-c", f"echo $$ > {sys.argv[1]}; exec sleep 300"],),
                 kwargs={"die_with_parent": None if sys.argv[2] == "env" else sys.argv[2] == "yes"},
                 daemon=True).start()
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(") ", 1)[1].startswith("Z"))


def _child_after_parent_killed(tmp_path: Path, mode: str, env: dict[str, str]) -> int:
    pid_file = tmp_path / f"child-{mode}.pid"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(pid_file), mode],
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), **env},
    )
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.is_file() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
    finally:
        parent.kill()
        parent.wait()
    return child


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize(("mode", "env"), [("yes", {}), ("env", {"STACKFARM_DIE_WITH_PARENT": "1"})])
def test_the_command_dies_with_its_parent(tmp_path: Path, mode: str, env: dict[str, str]) -> None:
    child = _child_after_parent_killed(tmp_path, mode, env)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the command outlived its parent"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_without_it_the_command_outlives_its_parent(tmp_path: Path) -> None:
    child = _child_after_parent_killed(tmp_path, "no", {})
    try:
        time.sleep(0.5)
        assert _alive(child), "a plain call is left alone (it has a session of its own)"
    finally:
        os.kill(child, signal.SIGKILL)
