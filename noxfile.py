"""stackfarm's sessions: `nox -l` lists them, one line each; every cell of matrix.toml has its own session."""

# This file needs nothing but nox: the cell(...) sessions are named by stackfarm's own planner, whose imports are
# the standard library and packaging (nox depends on it, and on tomli under Python 3.10). Its answer is kept in
# .nox/ under a digest of matrix.toml and of the package's sources, so that a warm `nox -s matrix` does not plan
# the matrix before `stackfarm run` plans it again.

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2024.4"
nox.options.sessions = ["matrix"]
nox.options.reuse_venv = "yes"

ROOT = Path(__file__).parent
MATRIX = ROOT / "matrix.toml"
#: Where the cell ids of the last listing are kept (nox's own folder, ignored by git).
CELLS = ROOT / ".nox" / "stackfarm-cells.json"


def _key() -> str:
    """What the listing depends on: nox's Python, matrix.toml's bytes, the size and time of each package source."""
    digest = hashlib.sha256(
        sys.executable.encode() + b"\0" + (MATRIX.read_bytes() if MATRIX.is_file() else b"")
    )
    for path in sorted((ROOT / "src" / "stackfarm").rglob("*.py")):
        stat = path.stat()
        digest.update(f"\0{path.relative_to(ROOT)}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def _planned() -> tuple[list[str], str]:
    """(cell ids, "") from the planner, or ([], why none can be listed); no network (the index is asked at
    run time)."""
    sys.path.insert(0, str(ROOT / "src"))
    try:
        from stackfarm.matrix import load
        from stackfarm.plan import cell_id, expand

        matrix = load(MATRIX)
        kept, _, _ = expand(matrix)
    except ImportError as exc:  # the planner grew an import nox does not bring
        return [], f"the planner needs {exc.name or exc}, which nox's Python lacks"
    except Exception as exc:  # a broken matrix.toml: say so in `nox -l`, the cell sessions cannot be listed
        return [], str(exc)
    finally:
        sys.path.remove(str(ROOT / "src"))
    return [cell_id(values, with_python=len(matrix.axes["python"]) > 1) for values, _ in kept], ""


@functools.cache
def _cell_ids() -> list[str]:
    """The cell ids of the default matrix for `nox -l` and the cell(...) sessions: the kept listing when its key
    still holds, else planned again (and kept)."""
    key = _key()
    try:
        kept = json.loads(CELLS.read_text(encoding="utf-8"))
        cells, problem = (kept["cells"], kept["problem"]) if kept.get("key") == key else (None, "")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        cells, problem = None, ""
    if cells is None:
        cells, problem = _planned()
        try:
            CELLS.parent.mkdir(exist_ok=True)
            part = CELLS.with_name(f"{CELLS.name}.{os.getpid()}")
            part.write_text(json.dumps({"key": key, "cells": cells, "problem": problem}), encoding="utf-8")
            part.replace(CELLS)
        except OSError:
            pass  # a read-only checkout: planned again next time
    if problem:
        print(f"stackfarm: no cell(...) sessions: {problem}", file=sys.stderr)
    return list(cells)


def _install(session: nox.Session, *extras: str) -> None:
    """`pip install -e .[extras]` once per venv and pyproject.toml: the install is editable, so a source change
    needs no reinstall, and a warm `nox -s matrix` costs about what `stackfarm run` costs."""
    spec = f".[{','.join(extras)}]" if extras else "."
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + spec.encode()).hexdigest()
    venv = getattr(session, "virtualenv", None)
    location = getattr(venv, "location", None)
    stamp = Path(location) / ".stackfarm-installed" if location else None
    if stamp is not None and stamp.is_file() and stamp.read_text() == digest:
        return
    session.install("-e", spec, silent=True)
    if stamp is not None:
        stamp.write_text(digest)


@nox.session
def matrix(session: nox.Session) -> None:
    """Run the matrix: realise every cell and run its suites (args go to `stackfarm run`)."""
    _install(session)
    session.run("python", "-m", "stackfarm", "run", *session.posargs)


@nox.session
@nox.parametrize("cell", _cell_ids(), ids=_cell_ids())
def cell(session: nox.Session, cell: str) -> None:
    """Run one cell of matrix.toml."""
    _install(session)
    session.run("python", "-m", "stackfarm", "run", "--cells", cell, *session.posargs)


@nox.session
def plan(session: nox.Session) -> None:
    """Print the cells, conflicts and exclusions of the matrix (add --json for machines)."""
    _install(session)
    session.run("python", "-m", "stackfarm", "plan", *session.posargs)


@nox.session
def patches(session: nox.Session) -> None:
    """Patch series: check [--json] | port SET --from V --to V | resolve DIR --to V."""
    _install(session)
    session.run("python", "-m", "stackfarm", "patches", *(session.posargs or ["check"]))


@nox.session
def tests(session: nox.Session) -> None:
    """Run stackfarm's own tests: the fast ones spread over the cores (pytest-xdist), then the real integration
    and Docker tests one at a time (they share a cache of multi-GB wheels and one Docker engine)."""
    _install(session, "test")
    if session.posargs:
        session.run("pytest", *session.posargs)
        return
    session.run("pytest", "tests", "-m", "not integration and not docker", "-n", "auto")
    session.run("pytest", "tests", "-m", "integration or docker")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff and mypy (strict) over the package, tests, suites and this file."""
    _install(session, "dev", "plots")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    # Each suite folder on its own: suites share module names (conftest, test_*) with each other and tests/.
    for suite in sorted((ROOT / "suites").glob("[0-9][0-9]-*/")):
        session.run("mypy", "--strict", "--ignore-missing-imports", str(suite), env={"MYPYPATH": "src"})


@nox.session
def bench(session: nox.Session) -> None:
    """Time planning 1,000 synthetic cells, a warm no-op re-run, a cold vs warm run, two runners sharing a store,
    and the same plan on a one-node vs a two-node Ray cluster."""
    _install(session, "ray")
    session.run("python", "-m", "stackfarm", "bench", *session.posargs)


@nox.session
def bundle(session: nox.Session) -> None:
    """Save a cell's Docker image as a tarball for an air-gapped runner: -- CELL [--out PATH]."""
    _install(session)
    session.run("python", "-m", "stackfarm", "bundle", *session.posargs)


@nox.session
def qualify(session: nox.Session) -> None:
    """Release sign-off: --cell ID --release NAME --approver NAME, or --verify RECORD."""
    _install(session)
    session.run("python", "-m", "stackfarm", "qualify", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """Rebuild reports/ (junit.xml, summaries, index.html) from stored verdicts; --history DIR adds trends."""
    _install(session, "plots")
    session.run("python", "-m", "stackfarm", "report", *session.posargs)


@nox.session
def corpus(session: nox.Session) -> None:
    """Static verdicts (10-capability, EAGLE-3) over every sglang release on the index -> reports/corpus/."""
    _install(session)
    session.run("python", "-m", "stackfarm.corpus", *session.posargs)


@nox.session(name="plan-upgrade")
def plan_upgrade(session: nox.Session) -> None:
    """Walk the newer SGLang releases from a cell: -- --from CELL [--arch sm_120] [--driver V] [--gpus N]."""
    _install(session)
    session.run("python", "-m", "stackfarm", "plan-upgrade", *session.posargs)
