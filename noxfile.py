# /// script
# dependencies = ["nox>=2024.4", "packaging>=24", "tomlkit>=0.12"]
# ///
"""stackfarm's sessions: `nox -l` lists them, one line each; every cell of matrix.toml has its own session."""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2024.4"
nox.options.sessions = ["matrix"]
nox.options.reuse_venv = "yes"

ROOT = Path(__file__).parent
# The harness itself plans the per-cell sessions; it needs only packaging and tomlkit to do so.
sys.path.insert(0, str(ROOT / "src"))


@functools.cache
def _cell_ids() -> list[str]:
    """Cell ids for `nox -l`, from the default matrix alone (no network: sglang's pins are checked at run time)."""
    try:
        from stackfarm.matrix import load
        from stackfarm.plan import cell_id, expand
    except ImportError:  # nox's Python lacks packaging/tomlkit (the script block above installs them)
        return []
    try:
        matrix = load(ROOT / "matrix.toml")
        kept, _, _ = expand(matrix)
    except Exception as exc:  # a broken matrix.toml: say so in `nox -l`, the cell sessions cannot be listed
        print(f"stackfarm: no cell(...) sessions: {exc}", file=sys.stderr)
        return []
    return [cell_id(values, with_python=len(matrix.axes["python"]) > 1) for values, _ in kept]


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
    """Time planning 1,000 synthetic cells, a warm no-op re-run, and a cold vs warm run."""
    _install(session)
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
