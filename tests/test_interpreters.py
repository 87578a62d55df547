"""stackfarm.interpreters: which interpreter a cell's python axis value gets, and the error where none is.

Discovery is tested on a made-up machine (a PATH folder, a pyenv root, a uv on PATH, and a fake runner that
answers for each executable as that interpreter would): no real second Python is needed.
"""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from stackfarm import interpreters, tomlread
from stackfarm.artifacts import Cache
from stackfarm.backends.local import LocalBackend
from stackfarm.errors import EnvironmentProblem, ExitCode
from stackfarm.interpreters import Interpreter, SuitePythons, candidates, find, venv_key
from stackfarm.plan import Cell
from stackfarm.verdict import BackendFacts

REPO = Path(__file__).resolve().parents[1]
#: What the fake machine's "running" interpreter is (never the wanted versions below).
RUNNING = ("/usr/bin/python3.11", "3.11.7")


def _exe(folder: Path, name: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\nexit 99\n")  # never run: the fake runner answers for it
    path.chmod(0o755)
    return str(path)


class FakeRunner:
    """Answers `<exe> -c PROBE` with the version given for that executable, `uv python find` with uv's."""

    def __init__(self, versions: Mapping[str, str | None], uv: str | None = None) -> None:
        self.versions = versions
        self.uv = uv
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> tuple[int, str]:
        self.calls.append(list(argv))
        if argv[1:3] == ["python", "find"]:
            return (0, f"{self.uv}\n") if self.uv else (2, "error: No interpreter found for Python 3.12")
        version = self.versions.get(argv[0])
        if version is None:
            return 127, f"pyenv: {Path(argv[0]).name}: command not found\n\nNote: See 'pyenv help global'"
        return 0, f"{argv[0]}\n{version}\n"


def _machine(tmp_path: Path) -> tuple[Path, Path]:
    """An empty PATH folder and an empty pyenv root."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "pyenv" / "versions").mkdir(parents=True)
    return tmp_path / "bin", tmp_path / "pyenv"


def test_the_running_interpreters_version_is_sys_executable_and_nothing_runs(tmp_path: Path) -> None:
    runner = FakeRunner({})
    found = find("3.11", path=str(tmp_path), env={}, run=runner, running=RUNNING)
    assert found == Interpreter(wanted="3.11", path=RUNNING[0], version="3.11.7", source="running")
    assert runner.calls == []
    mine = find(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert (mine.path, mine.version, mine.running) == (sys.executable, platform.python_version(), True)


def test_path_first_then_uv_then_pyenv(tmp_path: Path) -> None:
    bin_dir, pyenv = _machine(tmp_path)
    on_path = _exe(bin_dir, "python3.12")
    uv_python = _exe(tmp_path / "uv-pythons" / "cpython-3.12.9" / "bin", "python3.12")
    _exe(bin_dir, "uv")
    old = _exe(pyenv / "versions" / "3.12.1" / "bin", "python3.12")
    new = _exe(pyenv / "versions" / "3.12.4" / "bin", "python3.12")
    _exe(pyenv / "versions" / "3.120.0" / "bin", "python3.12")  # another minor altogether
    env = {"PYENV_ROOT": str(pyenv)}
    runner = FakeRunner({}, uv=uv_python)
    assert candidates("3.12", path=str(bin_dir), env=env, run=runner) == [
        ("PATH", on_path), ("uv", uv_python), ("pyenv", new), ("pyenv", old),
    ]  # fmt: skip


def test_a_candidate_that_does_not_run_or_is_another_version_is_passed_over(tmp_path: Path) -> None:
    bin_dir, pyenv = _machine(tmp_path)
    shim = _exe(bin_dir, "python3.12")  # a pyenv shim of a version that is not activated: exit 127
    liar = _exe(pyenv / "versions" / "3.12.4" / "bin", "python3.12")  # a link to another interpreter
    real = _exe(pyenv / "versions" / "3.12.1" / "bin", "python3.12")
    runner = FakeRunner({liar: "3.11.7", real: "3.12.1"})
    found = find("3.12", path=str(bin_dir), env={"PYENV_ROOT": str(pyenv)}, run=runner, running=RUNNING)
    assert found == Interpreter(wanted="3.12", path=real, version="3.12.1", source="pyenv")
    assert [c[0] for c in runner.calls] == [shim, liar, real]


def test_a_missing_interpreter_names_python_x_y_and_the_fix(tmp_path: Path) -> None:
    bin_dir, pyenv = _machine(tmp_path)
    shim = _exe(bin_dir, "python3.9")
    with pytest.raises(EnvironmentProblem) as caught:
        find("3.9", path=str(bin_dir), env={"PYENV_ROOT": str(pyenv)}, run=FakeRunner({}), running=RUNNING)
    text = str(caught.value)
    assert "python3.9" in text
    assert f"{shim} (PATH): does not run (exit 127: pyenv: python3.9: command not found)" in text
    assert "uv python install 3.9" in text
    assert caught.value.exit_code == ExitCode.ENVIRONMENT
    with pytest.raises(EnvironmentProblem, match="none on PATH, no uv-managed one"):
        find("3.9", path=str(tmp_path / "nowhere"), env={"PYENV_ROOT": str(pyenv)}, run=FakeRunner({}),
             running=RUNNING)  # fmt: skip


def test_an_axis_value_that_is_no_major_minor_is_refused() -> None:
    with pytest.raises(EnvironmentProblem, match=r"not like 3\.11"):
        find("3", running=RUNNING)


def test_an_interpreter_below_requires_python_is_refused(tmp_path: Path) -> None:
    old = Interpreter(wanted="3.9", path="/opt/python3.9", version="3.9.18", source="PATH")
    pythons = SuitePythons(tmp_path, finder=lambda _v: old)
    with pytest.raises(EnvironmentProblem, match=r"python3.9 \(/opt/python3.9\) is Python 3.9.18.*requires"):
        pythons.python("3.9")
    assert not (tmp_path / "interpreters").exists(), "nothing was built"


def test_the_venv_key_follows_interpreter_version_and_requirements() -> None:
    a = Interpreter(wanted="3.12", path="/opt/a/python3.12", version="3.12.1", source="PATH")
    b = Interpreter(wanted="3.12", path="/opt/a/python3.12", version="3.12.4", source="PATH")
    c = Interpreter(wanted="3.12", path="/opt/b/python3.12", version="3.12.1", source="PATH")
    keys = {venv_key(a, ["pytest>=8"]), venv_key(b, ["pytest>=8"]), venv_key(c, ["pytest>=8"]),
            venv_key(a, ["pytest>=9"])}  # fmt: skip
    assert len(keys) == 4
    assert venv_key(a, ["x", "y"]) == venv_key(a, ["y", "x"])


def test_the_fallback_requirements_are_pyprojects() -> None:
    pyproject = REPO / "pyproject.toml"
    project = tomlread.loads(pyproject, pyproject.read_text(encoding="utf-8"))["project"]
    assert sorted(interpreters.FALLBACK_REQUIREMENTS) == sorted(project["dependencies"])
    assert sorted(interpreters.requirements()) == sorted(project["dependencies"])
    assert str(interpreters.requires_python()) == project["requires-python"]


def _cell(python: str) -> Cell:
    return Cell(id=f"c-py{python}", values=(("python", python),), components=(), patch_sets=(),
                origin="product")  # fmt: skip


def test_local_backend_realise_raises_for_a_missing_interpreter(tmp_path: Path) -> None:
    def finder(wanted: str) -> Interpreter:
        return find(wanted, path=str(tmp_path), env={"PYENV_ROOT": str(tmp_path)}, run=FakeRunner({}),
                    running=RUNNING)  # fmt: skip

    backend = LocalBackend(Cache(tmp_path / "cache"), pythons=SuitePythons(tmp_path / "cache", finder=finder))
    with pytest.raises(EnvironmentProblem, match=r"python3\.9"):
        backend.realise(_cell("3.9"), {}, tmp_path / "work", lambda _t: None)


def test_local_backend_runs_the_running_python_and_says_its_version(tmp_path: Path) -> None:
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    backend = LocalBackend(Cache(tmp_path / "cache"))
    cell = _cell(running)
    assert backend.realise(cell, {}, tmp_path / "work", lambda _t: None) == ()
    assert backend.facts(cell) == BackendFacts(
        local_python=platform.python_version(),
        local_python_path=sys.executable,
        local_python_source="running",
    )
    spec = tmp_path / "cell.json"
    spec.write_text(
        json.dumps({"id": "c", "values": {"python": running}, "backend": "local", "components": []})
    )
    assert backend.suite_python(spec) == sys.executable
