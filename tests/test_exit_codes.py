"""The README's exit-code table, walked: every code it documents is produced by real `stackfarm` processes.

The table is parsed from README.md ("## Verdicts and exit codes"); each code has scenarios here, each one a real
`python -m stackfarm ...` process on the fake stack (tests/fakestack.py: real wheels on a local find_links
index, real pytest suites), whose exit status must be that code. A code the README lists without a scenario,
or a scenario for a code the README does not list, fails. Usage and configuration errors (2) must also say how
to fix them and run nothing; environment errors (4) name what stood in the way.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fakestack import NEW, OLD, FakeProject, cell_id
from stackfarm import verdict
from stackfarm.errors import ExitCode

pytest_plugins = ("fakestack",)

README = Path(__file__).resolve().parents[1] / "README.md"
CELL = cell_id(OLD)
SECRET = "Pa55-w0rd-XYZ"


def readme_exit_codes() -> dict[int, str]:
    """exit code -> meaning, from the table under the README's "Verdicts and exit codes" heading."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Verdicts and exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (.+?) \|$", section, flags=re.MULTILINE)
    assert rows, "the README's exit-code table was not found"
    return {int(code): meaning for code, meaning in rows}


# --------------------------------------------------------------------------- what the scenarios need


@dataclass
class Done:
    code: int
    out: str  # stdout and stderr together


def stackfarm(project: FakeProject, *args: str, env: dict[str, str] | None = None) -> Done:
    """A real `python -m stackfarm` process in the project folder (the fixture's environment: cache, PATH)."""
    done = subprocess.run(
        [sys.executable, "-m", "stackfarm", *args],
        cwd=project.root,
        env={**os.environ, "COLUMNS": "400", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return Done(done.returncode, done.stdout + done.stderr)


def run_args(project: FakeProject, *args: str) -> tuple[str, ...]:
    return tuple(project.argv(*args))


def nothing_ran(project: FakeProject) -> None:
    assert project.runs() == [], "a usage error must stop before any suite runs"
    assert not list(project.reports.glob("*/verdict.json")), "a usage error stores no verdict"


class _Refusing(BaseHTTPRequestHandler):
    """A private index that lets nobody in: every request is answered 401."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="private"')
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def private_index() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


Scenario = Callable[[FakeProject, str], None]
SCENARIOS: dict[int, dict[str, Scenario]] = {}


def scenario(code: int, name: str) -> Callable[[Scenario], Scenario]:
    def add(fn: Scenario) -> Scenario:
        SCENARIOS.setdefault(code, {})[name] = fn
        return fn

    return add


# --------------------------------------------------------------------------- 0, 1, 3: verdicts


@scenario(0, "every-cell-passed")
def _passed(project: FakeProject, _index: str) -> None:
    project.suite("00-ok", "pass")
    project.write_matrix()
    done = stackfarm(project, *run_args(project))
    assert done.code == 0, done.out


@scenario(1, "a-suite-failed")
def _failed(project: FakeProject, _index: str) -> None:
    project.suite("00-bad", "fail")
    project.write_matrix()
    done = stackfarm(project, *run_args(project))
    assert done.code == 1, done.out


@scenario(3, "a-gpu-skip")
def _incomplete(project: FakeProject, _index: str) -> None:
    project.suite("00-ok", "pass")
    project.suite("10-gpu", "gpu-skip")
    project.write_matrix()
    done = stackfarm(project, *run_args(project))
    assert done.code == 3, done.out


@scenario(3, "report-gate-says-why")
def _gate_incomplete(project: FakeProject, _index: str) -> None:
    """A gate over a verdict of selected suites only exits 3, and says so: which cell, and why."""
    project.suite("00-ok", "pass")
    project.suite("10-more", "pass")
    project.write_matrix()
    assert stackfarm(project, *run_args(project, "--suites", "00-*")).code == 0
    done = stackfarm(project, "report", "--reports", str(project.reports), "--gate")
    assert done.code == 3, done.out
    assert "gate: exit 3" in done.out, done.out
    assert f"{CELL}: incomplete: it passed only the suites of --suites '00-*'" in done.out, done.out


# --------------------------------------------------------------------------- 2: usage and configuration


def _usage(project: FakeProject, done: Done, *expected: str) -> None:
    assert done.code == 2, done.out
    for text in expected:
        assert text in done.out, done.out
    assert "fix:" in done.out or "usage:" in done.out, f"a usage error says how to fix it:\n{done.out}"
    nothing_ran(project)


def _usage_run(
    project: FakeProject, *args: str, expect: tuple[str, ...], env: dict[str, str] | None = None
) -> None:
    project.suite("00-ok", "pass")
    project.write_matrix()
    _usage(project, stackfarm(project, *run_args(project, *args), env=env), *expect)


@scenario(2, "cells-match-nothing")
def _no_cells(project: FakeProject, _index: str) -> None:
    _usage_run(project, "--cells", "cu99-*", expect=("--cells 'cu99-*'", "no cell of", "stackfarm plan"))


@scenario(2, "suites-match-nothing")
def _no_suites(project: FakeProject, _index: str) -> None:
    _usage_run(project, "--suites", "99-*", expect=("--suites '99-*'", "no suite of", "00-ok"))


@scenario(2, "python-missing")
def _no_python(project: FakeProject, _index: str) -> None:
    _usage_run(
        project,
        "--backend",
        "host",
        "--python",
        "/nonexistent/python3",
        expect=("--python /nonexistent/python3",),
    )


@scenario(2, "jobs-zero")
def _jobs_zero(project: FakeProject, _index: str) -> None:
    _usage_run(project, "--jobs", "0", expect=("--jobs", "1 or more"))


@scenario(2, "jobs-negative")
def _jobs_negative(project: FakeProject, _index: str) -> None:
    _usage_run(project, "--jobs=-3", expect=("--jobs", "1 or more"))


@scenario(2, "lazy-run-of-a-full-tree-suite")
def _lazy(project: FakeProject, _index: str) -> None:
    """A lazy run of a suite that imports the stack: refused before any work, nothing stored to be reused."""
    project.suite("00-stack", "pass")
    project.suite("30-numerics", "pass")
    project.write_matrix()
    done = stackfarm(project, *run_args(project), env={"STACKFARM_LAZY": "1"})
    _usage(project, done, "30-numerics needs full trees", "--suites '00-stack,")


@scenario(2, "bisect-bad-not-in-the-matrix")
def _bisect(project: FakeProject, _index: str) -> None:
    project.suite("00-ok", "pass")
    project.write_matrix()
    where = ("--matrix", str(project.matrix), "--reports", str(project.reports), "--backend", "local")
    done = stackfarm(project, "bisect", *where, "--good", CELL, "--bad", "cu99-nothing")
    _usage(project, done, "--bad cu99-nothing", "is neither in the plan")


@scenario(2, "report-of-an-empty-folder")
def _report_nothing(project: FakeProject, _index: str) -> None:
    project.reports.mkdir()
    done = stackfarm(project, "report", "--reports", str(project.reports))
    _usage(project, done, "holds no verdict", "stackfarm run")


@scenario(2, "matrix-error")
def _matrix_error(project: FakeProject, _index: str) -> None:
    project.suite("00-ok", "pass")
    project.write_matrix(extra="\n[axis]\ncuda = ['12.8']\n")
    _usage(project, stackfarm(project, *run_args(project)), f"{project.matrix}:")


# --------------------------------------------------------------------------- 4: the environment


@scenario(4, "plan-on-an-index-answering-401")
def _unauthorized(project: FakeProject, index: str) -> None:
    """A private index that refuses the credentials: "unauthorized", the index named without its password,
    the netrc fix; exit 4 (the environment), not "unreachable", not a matrix error."""
    project.suite("00-ok", "pass")
    authed = index.replace("http://", f"http://user:{SECRET}@")
    project.write_matrix(
        [OLD, NEW],
        extra=f"""
        [indexes.private]
        url = "{authed}"

        [[route]]
        requirement = "sglang==0.5.10"
        index = "private"
        """,
    )
    done = stackfarm(project, "plan", "--matrix", str(project.matrix))
    assert done.code == 4, done.out
    row = next(line for line in done.out.splitlines() if line.strip().startswith(cell_id(NEW)))
    assert "index unauthorized for sglang" in row, done.out
    assert "unreachable" not in row, done.out
    assert f"unauthorized: {index}/sglang/ answered HTTP 401" in done.out, done.out
    assert "credentials were sent and refused" in done.out
    assert "fix: correct the credentials for 127.0.0.1" in done.out, done.out
    assert "`machine 127.0.0.1` line of ~/.netrc" in done.out
    assert SECRET not in done.out


@scenario(4, "run-on-an-index-answering-401-without-credentials")
def _no_credentials(project: FakeProject, index: str) -> None:
    """No credentials anywhere: the cell is an environment error whose reason says how to give them."""
    project.suite("00-ok", "pass")
    project.write_matrix(
        [OLD, NEW],
        extra=f"""
        [indexes.private]
        url = "{index}"

        [[route]]
        requirement = "sglang==0.5.10"
        index = "private"
        """,
    )
    done = stackfarm(project, *run_args(project), env={"NETRC": str(project.root / "no-netrc")})
    assert done.code == 4, done.out
    assert [c for c, _ in project.runs()] == [CELL], "only the cell of the public index ran"
    reason = verdict.read(verdict.path_of(project.reports, cell_id(NEW))).report.reason
    assert f"unauthorized: {index}/sglang/ answered HTTP 401" in reason
    assert "no credentials were sent" in reason
    assert "fix: put `machine 127.0.0.1 login USER password TOKEN` in ~/.netrc" in reason


@scenario(4, "report-over-an-unreadable-verdict")
def _unreadable(project: FakeProject, _index: str) -> None:
    """Every verdict unreadable: each file is named with why, never "no verdicts: run stackfarm run first"."""
    (project.reports / "cell-a").mkdir(parents=True)
    (project.reports / "cell-a" / "verdict.json").symlink_to(project.root / "gone.json")
    (project.reports / "cell-b").mkdir()
    (project.reports / "cell-b" / "verdict.json").write_text("{not json", encoding="utf-8")
    done = stackfarm(project, "report", "--reports", str(project.reports))
    assert done.code == 4, done.out
    assert f"{project.reports}/cell-a/verdict.json: cannot read the verdict" in done.out, done.out
    assert f"{project.reports}/cell-b/verdict.json: not a verdict" in done.out, done.out
    assert "run `stackfarm run` first" not in done.out


@scenario(4, "a-docker-plans-worker-without-an-engine")
def _basis_refused(project: FakeProject, _index: str) -> None:
    """A worker of a plan hashed for Docker, where no engine answers: refused before any work, both hash bases
    named (its verdicts would be pushed under hashes no merge of the plan reads), never a silent local run."""
    project.suite("00-ok", "pass")
    project.write_matrix()
    plan = stackfarm(
        project, "plan", "--json", "--matrix", str(project.matrix), "--backend", "docker", "--no-gpu"
    )
    assert plan.code == 0, plan.out
    (project.root / "plan.json").write_text(plan.out)
    no_engine = {"STACKFARM_DOCKER": str(project.root / "no-docker")}
    done = stackfarm(project, "run", "--plan", "plan.json", "--cell-index", "0", "--reports",
                     str(project.reports), env=no_engine)  # fmt: skip
    assert done.code == 4, done.out
    assert (
        "the plan's input hashes are for backend docker, without a GPU; this machine can run backend local"
        in done.out
    )
    nothing_ran(project)


# --------------------------------------------------------------------------- 130: interrupted


@scenario(130, "ctrl-c")
def _interrupted(project: FakeProject, _index: str) -> None:
    project.suite("00-slow", "slow")
    project.write_matrix()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stackfarm", *run_args(project)],
        cwd=project.root,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - no threads here
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not project.runs() and proc.poll() is None:
            time.sleep(0.05)
        assert project.runs(), "the suite never started"
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out


# --------------------------------------------------------------------------- the walk


def test_the_readme_table_is_the_one_the_code_returns() -> None:
    documented = readme_exit_codes()
    assert set(documented) == {int(c) for c in ExitCode}, "README table and stackfarm.errors.ExitCode differ"
    assert set(documented) == set(SCENARIOS), "every documented code needs a scenario here, and only those"


@pytest.mark.parametrize(
    "code_name",
    [f"{code}-{name}" for code in sorted(readme_exit_codes()) for name in SCENARIOS.get(code, {})],
)
def test_each_documented_exit_code(code_name: str, fake_project: FakeProject, private_index: str) -> None:
    code, name = code_name.split("-", 1)
    SCENARIOS[int(code)][name](fake_project, private_index)
