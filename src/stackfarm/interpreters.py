"""The interpreter of a cell's `python` axis, and a Python there that can run the suites.

Found the way nox finds a session's Python: ``pythonX.Y`` on PATH, then uv's managed Pythons (``uv python find
X.Y``, when uv is installed), then pyenv's installed versions (``$PYENV_ROOT/versions/X.Y.*/bin/pythonX.Y``:
pyenv puts shims on PATH for every installed version, but a shim of a version that is not activated fails).
Every candidate is run and must say it is X.Y; one that does not (a broken shim, a link to another version) is
passed over, and the error names each one tried.

The running interpreter's own X.Y is `sys.executable` itself: nothing is built. Another interpreter gets a venv
(`python -m venv`, then `pip install` of stackfarm's runtime requirements: pytest, packaging, pyelftools...)
cached under ``<cache>/interpreters/``, keyed by the interpreter's real path and full version, stackfarm's
requirements and where its package lies; stackfarm itself is importable there by a ``.pth`` file naming a
folder that holds only a link to the running stackfarm package (the very sources of this run).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .errors import EnvironmentProblem
from .proc import Outcome, call

#: A python axis value: major.minor.
_AXIS = re.compile(r"^(\d+)\.(\d+)$")
#: What a candidate prints when run: its real executable and its full version.
_PROBE = "import platform, sys; print(sys.executable); print(platform.python_version())"
#: The stackfarm package (a folder), made importable in another interpreter's venv.
PACKAGE = Path(__file__).resolve().parent
#: stackfarm's runtime requirements when its distribution metadata cannot be read (a bare source checkout);
#: kept equal to pyproject.toml's [project] dependencies by tests/test_interpreters.py.
FALLBACK_REQUIREMENTS = (
    "packaging>=24",
    'tomli>=1.1; python_version < "3.11"',
    "tomlkit>=0.12",
    "junitparser>=3.1",
    "pytest>=8",
    "pytest-xdist>=3.5",
    "rich>=13",
    "pyelftools>=0.31",
    "filelock>=3.12",
    "cryptography>=42",
    "installer>=0.7",
    "docker>=7.1",
)
_COMPLETE = ".stackfarm-complete"


@dataclass(frozen=True)
class Interpreter:
    """A Python found for a python axis value."""

    #: The axis value asked for ("3.12").
    wanted: str
    #: The executable as found (PATH entry, uv's or pyenv's path, or sys.executable).
    path: str
    #: Its full version, as it says when run ("3.12.1").
    version: str
    #: Where it was found: "running", "PATH", "uv" or "pyenv".
    source: str

    @property
    def running(self) -> bool:
        return self.source == "running"


#: Runs `argv` and returns (returncode, output); a test replaces it.
Runner = Callable[[Sequence[str]], tuple[int, str]]


def _run(argv: Sequence[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd="/",
            env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return done.returncode, done.stdout + done.stderr


def axis_version(value: str) -> tuple[int, int]:
    """(major, minor) of a python axis value, or EnvironmentProblem for anything not like 3.11."""
    match = _AXIS.fullmatch(value.strip())
    if match is None:
        raise EnvironmentProblem(
            f"python axis value {value!r} is not like 3.11: no interpreter can be looked up for it",
            fix='give [axes] python as major.minor values, e.g. python = ["3.11", "3.12"]',
        )
    return int(match[1]), int(match[2])


def candidates(
    wanted: str,
    *,
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    run: Runner = _run,
) -> list[tuple[str, str]]:
    """(source, executable) to try for python `wanted`, in order: PATH, uv, pyenv. Nothing is run except
    `uv python find` (when uv is on PATH)."""
    environ = os.environ if env is None else env
    search = path if path is not None else environ.get("PATH", "")
    name = f"python{wanted}"
    out: list[tuple[str, str]] = []
    on_path = shutil.which(name, path=search)
    if on_path:
        out.append(("PATH", on_path))
    uv = shutil.which("uv", path=search)
    if uv:
        code, text = run([uv, "python", "find", wanted])
        found = text.strip().splitlines()[-1].strip() if code == 0 and text.strip() else ""
        if found and Path(found).is_file():
            out.append(("uv", found))
    pyenv_root = Path(environ.get("PYENV_ROOT") or Path(environ.get("HOME", "~")).expanduser() / ".pyenv")
    versions = pyenv_root / "versions"
    if versions.is_dir():
        # Newest patch level first; "3.12.1" and "3.12-dev" match 3.12, "3.120" does not.
        found_dirs = [
            d for d in versions.iterdir() if re.fullmatch(rf"{re.escape(wanted)}(?:[.-].*)?", d.name)
        ]
        for folder in sorted(found_dirs, key=lambda d: _version_key(d.name), reverse=True):
            binary = folder / "bin" / name
            if binary.is_file():
                out.append(("pyenv", str(binary)))
    seen: set[str] = set()
    unique = []
    for source, exe in out:  # one executable found twice (PATH and pyenv) is tried once, by its first source
        if exe not in seen:
            seen.add(exe)
            unique.append((source, exe))
    return unique


def _version_key(text: str) -> Version:
    try:
        return Version(text)
    except ValueError:
        return Version("0")


def probe(executable: str, run: Runner = _run) -> tuple[str | None, str]:
    """(full version, "") when `executable` runs and says its version; (None, why not) otherwise."""
    code, text = run([executable, "-c", _PROBE])
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if code != 0 or len(lines) < 2 or not re.fullmatch(r"\d+\.\d+\.\d+\S*", lines[-1]):
        # A shell's or pyenv's "command not found" comes first; a Python's traceback ends with its error.
        said = (lines[0] if code == 127 else lines[-1]) if lines else "no output"
        return None, f"does not run (exit {code}: {said[:160]})"
    return lines[-1], ""


def find(
    wanted: str,
    *,
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    run: Runner = _run,
    running: tuple[str, str] | None = None,
) -> Interpreter:
    """The interpreter for python axis value `wanted`; EnvironmentProblem naming `pythonX.Y`, what was tried
    and the fix when there is none. `running` (executable, version) defaults to this interpreter."""
    major, minor = axis_version(wanted)
    exe, version = running or (sys.executable, platform.python_version())
    if Version(version).release[:2] == (major, minor):
        return Interpreter(wanted=wanted, path=exe, version=version, source="running")
    tried = []
    for source, candidate in candidates(wanted, path=path, env=env, run=run):
        full, why = probe(candidate, run)
        if full is not None and Version(full).release[:2] == (major, minor):
            return Interpreter(wanted=wanted, path=candidate, version=full, source=source)
        tried.append(f"{candidate} ({source}): {why or f'it is Python {full}'}")
    looked = "; ".join(tried) if tried else "none on PATH, no uv-managed one, none under pyenv's versions/"
    raise EnvironmentProblem(
        f"the cell's python {wanted} needs the interpreter python{wanted}, which this machine lacks ({looked})",
        fix=f"install python{wanted} (e.g. `uv python install {wanted}`, `pyenv install {wanted}`, or your "
        f"distribution's python{wanted} package), or leave {wanted} out of [axes] python",
    )


def requirements() -> list[str]:
    """stackfarm's runtime requirements (its distribution's Requires-Dist without extras), as pip reads them."""
    try:
        listed = importlib.metadata.requires("stackfarm")
    except importlib.metadata.PackageNotFoundError:
        listed = None
    out = []
    for text in listed if listed is not None else FALLBACK_REQUIREMENTS:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue
        out.append(str(req))
    return sorted(out)


def requires_python() -> SpecifierSet:
    """stackfarm's Requires-Python (">=3.10" when its metadata cannot be read)."""
    try:
        found = importlib.metadata.metadata("stackfarm").get_all("Requires-Python") or []
    except importlib.metadata.PackageNotFoundError:
        found = []
    return SpecifierSet(str(found[0]) if found else ">=3.10")


def venv_key(interpreter: Interpreter, reqs: Sequence[str], package: Path = PACKAGE) -> str:
    """What a cached venv is keyed by: the interpreter's real path and version, the requirements, the
    stackfarm package it links to."""
    real = os.path.realpath(interpreter.path)
    blob = json.dumps([real, interpreter.version, sorted(reqs), str(package)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class SuitePythons:
    """A Python that can run the suites, per python axis value: sys.executable for the running X.Y, else a venv
    of that interpreter with stackfarm's requirements (built once, cached under `cache_root`)."""

    def __init__(self, cache_root: Path, *, finder: Callable[[str], Interpreter] = find) -> None:
        self.root = cache_root / "interpreters"
        self.finder = finder
        self._lock = threading.Lock()
        self._found: dict[str, Interpreter] = {}
        self._pythons: dict[str, str] = {}

    def interpreter(self, wanted: str) -> Interpreter:
        with self._lock:
            if wanted not in self._found:
                self._found[wanted] = self.finder(wanted)
            return self._found[wanted]

    def python(self, wanted: str, progress: Callable[[str], None] = lambda _text: None) -> str:
        """The executable the suites of a python-`wanted` cell run under."""
        interp = self.interpreter(wanted)
        if interp.running:
            return interp.path
        with self._lock:
            if wanted not in self._pythons:
                self._pythons[wanted] = str(self._venv(interp, progress))
            return self._pythons[wanted]

    def _venv(self, interp: Interpreter, progress: Callable[[str], None]) -> Path:
        spec = requires_python()
        if not spec.contains(interp.version, prereleases=True):
            raise EnvironmentProblem(
                f"python{interp.wanted} ({interp.path}) is Python {interp.version}, and stackfarm (which every "
                f"suite imports) requires Python {spec}: the cell's suites cannot run there",
                fix=f"leave {interp.wanted} out of [axes] python",
            )
        reqs = requirements()
        folder = self.root / f"py{interp.wanted}-{venv_key(interp, reqs)}"
        python = folder / "bin" / "python"
        if (folder / _COMPLETE).is_file() and python.exists():
            return python
        from filelock import FileLock  # a runtime requirement; imported here as the lock is rarely needed

        self.root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder) + ".lock"):
            if (folder / _COMPLETE).is_file() and python.exists():
                return python
            if folder.exists():
                shutil.rmtree(folder)  # a build cut short: start again
            progress(f"venv for python {interp.version}")
            self._check(
                call([interp.path, "-m", "venv", str(folder)], timeout=600),
                interp,
                "python -m venv",
                fix=f"install the venv module of python{interp.wanted} (Debian/Ubuntu: python{interp.wanted}-venv)",
            )
            progress(f"pip install stackfarm's requirements for python {interp.version}")
            pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *reqs]
            self._check(
                call(pip, timeout=1800),
                interp,
                "pip install " + " ".join(reqs),
                fix="make the package index reachable (pip's own settings: PIP_INDEX_URL, a proxy), "
                f"or install {', '.join(reqs)} for python{interp.wanted} there yourself",
            )
            self._link_stackfarm(folder, python, interp)
            (folder / _COMPLETE).write_text(
                json.dumps({"interpreter": interp.path, "version": interp.version, "requirements": reqs}),
                encoding="utf-8",
            )
        return python

    @staticmethod
    def _check(outcome: Outcome, interp: Interpreter, what: str, *, fix: str) -> None:
        code = outcome.returncode
        if code == 0:
            return
        tail = " | ".join(outcome.output.strip().splitlines()[-4:])
        raise EnvironmentProblem(
            f"cannot make a Python {interp.version} that runs the suites ({interp.path}): `{what}` failed "
            f"(exit {code}): {tail[-600:]}",
            fix=fix,
        )

    @staticmethod
    def _link_stackfarm(folder: Path, python: Path, interp: Interpreter) -> None:
        """stackfarm importable in the venv: a folder holding only a link to this run's package, named by a .pth
        file (stackfarm's own installation may sit in a site-packages of another Python: never that whole)."""
        code, text = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        if code != 0:
            raise EnvironmentProblem(
                f"the venv of {interp.path} at {folder} does not run: {text.strip()[-300:]}"
            )
        site = Path(text.strip().splitlines()[-1])
        holder = folder / "stackfarm-src"
        holder.mkdir(exist_ok=True)
        link = holder / "stackfarm"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(PACKAGE, target_is_directory=True)
        (site / "stackfarm-src.pth").write_text(f"{holder}\n", encoding="utf-8")


__all__ = [
    "FALLBACK_REQUIREMENTS",
    "Interpreter",
    "SuitePythons",
    "axis_version",
    "candidates",
    "find",
    "probe",
    "requirements",
    "requires_python",
    "venv_key",
]
