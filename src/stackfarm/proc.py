"""The one door for subprocesses: every external command stackfarm runs goes through `call`.

Each command runs in its own process group, so a timeout or a stop kills the command *and* what it started.
A process a suite starts in a session of its own (an SGLang server, an engine) registers its group with
`register_group`; the runner reaps those groups after the suite, whatever way it ended. `stop` ends every
command in flight (the run's Ctrl-C / SIGTERM path) and makes new ones refuse to start.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import StackfarmError

#: The file a suite's helpers append the process groups they start to (one pgid a line); set by the runner.
GROUPS_ENV = "STACKFARM_PROCESS_GROUPS"
#: "1": every command started through `call` gets SIGTERM when its parent dies (see `call`).
DIE_WITH_PARENT_ENV = "STACKFARM_DIE_WITH_PARENT"
#: Seconds between SIGTERM and SIGKILL when a group is stopped.
GRACE = 5.0

#: Set when the run stops (Ctrl-C, SIGTERM): long loops (downloads, waits) check it and give up at once.
STOP = threading.Event()
_live: dict[int, subprocess.Popen[str]] = {}
_lock = threading.Lock()


class Stopped(StackfarmError):
    """The run is stopping: no new command starts."""


@dataclass(frozen=True, kw_only=True)
class Outcome:
    args: tuple[str, ...]
    returncode: int
    output: str
    elapsed: float
    timed_out: bool = False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def kill_group(pgid: int, grace: float = GRACE) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 1.0)
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.05)
        if not _group_alive(pgid):
            return


def register_group(pgid: int | None = None) -> None:
    """Record a process group a suite started in a session of its own, so the runner can reap it."""
    target = os.environ.get(GROUPS_ENV)
    if not target:
        return
    with open(target, "a", encoding="utf-8") as out:
        out.write(f"{pgid if pgid is not None else os.getpgid(0)}\n")


def reap_groups(path: Path, grace: float = GRACE) -> list[int]:
    """Kill every group listed in `path` that is still alive; the groups it killed."""
    try:
        lines = path.read_text(encoding="utf-8").split()
    except OSError:
        return []
    killed = []
    for line in dict.fromkeys(lines):
        if line.isdigit() and int(line) > 1 and _group_alive(int(line)):
            kill_group(int(line), grace)
            killed.append(int(line))
    path.unlink(missing_ok=True)
    return killed


def stop(sig: int = signal.SIGTERM) -> None:
    """Stop the run: every command in flight gets `sig` (its whole group), then SIGKILL after the grace time."""
    STOP.set()
    with _lock:
        groups = list(_live)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline and any(_group_alive(g) for g in groups):
        time.sleep(0.05)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def _tracked(process: subprocess.Popen[str]) -> Iterator[None]:
    with _lock:
        _live[process.pid] = process
    try:
        yield
    finally:
        with _lock:
            _live.pop(process.pid, None)


def _drain(process: subprocess.Popen[str]) -> str:
    """What a killed command printed; a process of another session may still hold the pipe: stop reading."""
    try:
        output, _ = process.communicate(timeout=GRACE)
    except subprocess.TimeoutExpired:
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        process.wait()
        return "(output cut: a process outside the command's group held its pipe)"
    return output or ""


@functools.cache
def _term_with_parent() -> Callable[[], None]:
    """What a child runs before exec to get SIGTERM when its parent thread dies (prctl PR_SET_PDEATHSIG);
    libc is looked up here, in the parent: the child only calls it (nothing to allocate between fork and exec)."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    return functools.partial(prctl, pr_set_pdeathsig, int(signal.SIGTERM))


def call(
    args: Sequence[str | Path],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    log: Path | None = None,
    die_with_parent: bool | None = None,
) -> Outcome:
    """Run a command to completion in its own process group, capturing stdout+stderr (into `log` as well).

    On a timeout the whole group is killed (the command and everything it started); the Outcome says so.
    `die_with_parent`: the command gets SIGTERM when the thread that started it dies, however it dies (Linux).
    None: when $STACKFARM_DIE_WITH_PARENT is 1, which a Ray worker sets for the `stackfarm run` it starts: a
    worker killed with its node (SIGKILL, no handler runs) leaves no cell, suite or server running."""
    argv = tuple(str(a) for a in args)
    if shutil.which(argv[0]) is None and not Path(argv[0]).exists():
        raise StackfarmError(f"command not found: {argv[0]}")
    if STOP.is_set():
        raise Stopped(f"not started, the run is stopping: {argv[0]}")
    full_env = {**os.environ, **(env or {})}
    if die_with_parent is None:
        die_with_parent = full_env.get(DIE_WITH_PARENT_ENV) == "1"
    start = time.monotonic()
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=full_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
        preexec_fn=_term_with_parent() if die_with_parent and sys.platform == "linux" else None,  # noqa: PLW1509 - one prctl call, looked up before the fork
    )
    timed_out = False
    with _tracked(process):
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(process.pid)
            output = _drain(process)
        except BaseException:
            kill_group(process.pid, grace=1.0)
            process.communicate()
            raise
    outcome = Outcome(
        args=argv,
        returncode=124 if timed_out else process.returncode,
        output=output or "",
        elapsed=time.monotonic() - start,
        timed_out=timed_out,
    )
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"+ {' '.join(argv)}\n{outcome.output}", encoding="utf-8")
    return outcome


__all__ = [
    "DIE_WITH_PARENT_ENV",
    "GROUPS_ENV",
    "STOP",
    "Outcome",
    "Stopped",
    "call",
    "kill_group",
    "reap_groups",
    "register_group",
    "stop",
]
