"""noxfile.py needs nothing but nox: `nox -l` and `nox -l --json` list every session, the per-cell ones included,
from a fresh clone, with only what `pip install nox` brings (no script block sending nox through pip first).

The clone is a copy of this working tree (its tracked and unignored files: no .nox/ of an earlier listing). The
fast tests run nox in this venv with every stackfarm dependency nox does not bring made unimportable; the
integration test makes a plain venv, `pip install nox` into it (from the index), and lists through its nox.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from stackfarm.matrix import load
from stackfarm.plan import cell_id, expand
from stackfarm.tomlread import loads

REPO = Path(__file__).resolve().parents[1]


def _clone(dest: Path) -> Path:
    """A copy of the checkout as a fresh clone has it: git's tracked and unignored files, nothing under .nox/."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a file deleted in the working tree is listed, but is not in a clone made now
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    assert (dest / "noxfile.py").is_file()
    assert not (dest / ".nox").exists()
    return dest


def _closure(name: str) -> set[str]:
    """The distributions `pip install NAME` brings (markers evaluated here), NAME included."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        dist = canonicalize_name(todo.pop())
        if dist in seen:
            continue
        seen.add(dist)
        for text in importlib.metadata.requires(dist) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _not_from_nox() -> list[str]:
    """The import names of stackfarm's dependencies (and tomlkit) that `pip install nox` does not bring."""
    pyproject = REPO / "pyproject.toml"
    project = loads(pyproject, pyproject.read_text(encoding="utf-8"))["project"]
    brought = _closure("nox")
    wanted = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]} | {"tomlkit"}
    modules = importlib.metadata.packages_distributions()
    blocked = {m for m, dists in modules.items() for d in dists if canonicalize_name(d) in wanted - brought}
    assert {"junitparser", "tomlkit", "rich"} <= blocked
    return sorted(blocked)


def _listing(argv: Sequence[str], clone: Path, block: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run nox's own main with `argv` in the clone, every module of `block` unimportable."""
    code = (
        "import sys\n"
        f"for name in {list(block)!r}:\n    sys.modules[name] = None  # import NAME raises ImportError\n"
        f"sys.argv = ['nox', *{list(argv)!r}]\n"
        "from nox.__main__ import main\n"
        "main()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=clone, capture_output=True, text=True, check=False
    )


def _planned(matrix: Path) -> list[str]:
    m = load(matrix)
    kept, _, _ = expand(m)
    return [cell_id(values, with_python=len(m.axes["python"]) > 1) for values, _ in kept]


def _sessions(stdout: str) -> list[dict[str, Any]]:
    listed = json.loads(stdout)  # all of stdout is the JSON: nothing else is printed there
    assert isinstance(listed, list)
    return listed


def test_the_noxfile_has_no_script_block() -> None:
    """A PEP 723 block makes nox build a venv through pip before it reads the noxfile, on every call."""
    assert "# /// script" not in (REPO / "noxfile.py").read_text(encoding="utf-8")


def test_nox_lists_every_session_with_only_what_nox_brings(tmp_path: Path) -> None:
    clone = _clone(tmp_path / "clone")
    block = _not_from_nox()
    done = _listing(["-l", "--json"], clone, block)
    assert done.returncode == 0, done.stderr
    assert [s["session"] for s in _sessions(done.stdout)] == ["matrix"]  # nox lists the selected: the default
    done = _listing(["-l", "--json", "-s", "matrix", "tests", "cell"], clone, block)
    assert done.returncode == 0, done.stderr
    names = [s["session"] for s in _sessions(done.stdout)]
    cells = _planned(clone / "matrix.toml")
    assert len(cells) >= 2
    assert names == ["matrix", *(f"cell({c})" for c in cells), "tests"]
    assert "no cell(...) sessions" not in done.stderr


def test_the_kept_listing_follows_matrix_toml(tmp_path: Path) -> None:
    """The cell ids are kept in .nox/ for the next call, under matrix.toml's digest: an edit lists anew."""
    clone = _clone(tmp_path / "clone")
    block = _not_from_nox()
    first = _listing(["-l", "--json", "-s", "cell"], clone, block)
    assert first.returncode == 0, first.stderr
    kept = json.loads((clone / ".nox" / "stackfarm-cells.json").read_text(encoding="utf-8"))
    assert kept["cells"] == _planned(clone / "matrix.toml")
    # One cell fewer: exclude the first one's sglang release from every cell of the axis product.
    matrix = clone / "matrix.toml"
    sglang = load(matrix).axes["sglang"]
    text = matrix.read_text(encoding="utf-8")
    matrix.write_text(text + f'\n[[exclude]]\nsglang = "{sglang[0]}"\nreason = "test"\n', encoding="utf-8")
    second = _listing(["-l", "--json", "-s", "cell"], clone, block)
    assert second.returncode == 0, second.stderr
    after = [s["session"] for s in _sessions(second.stdout)]
    assert after == [f"cell({c})" for c in _planned(matrix)]
    assert len(after) < len(_sessions(first.stdout))


def test_a_broken_matrix_is_said_and_the_other_sessions_still_list(tmp_path: Path) -> None:
    clone = _clone(tmp_path / "clone")
    (clone / "matrix.toml").write_text('[axes]\ncuda = ["12.8"]\ncuda = ["13.0"]\n', encoding="utf-8")
    done = _listing(["-l", "--json", "-s", "matrix", "tests"], clone, _not_from_nox())
    assert done.returncode == 0, done.stderr
    assert [s["session"] for s in _sessions(done.stdout)] == ["matrix", "tests"]
    assert "no cell(...) sessions: " in done.stderr
    assert "matrix.toml:3: malformed TOML: `cuda` is defined twice (first at line 2)" in done.stderr


@pytest.fixture(scope="module")
def plain_nox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding nox alone, as `python3 -m pip install nox` makes it (from the index: integration)."""
    venv = tmp_path_factory.mktemp("plain-nox") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "nox"],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"pip install nox failed (no index?): {done.stderr.strip().splitlines()[-1:]}")
    return venv / "bin" / "nox"


@pytest.mark.integration
def test_a_fresh_clone_lists_through_a_plain_nox(plain_nox: Path, tmp_path: Path) -> None:
    pip = subprocess.run(
        [str(plain_nox.parent / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    installed = {canonicalize_name(d["name"]) for d in json.loads(pip)}
    assert "nox" in installed
    assert not installed & {"tomlkit", "junitparser", "rich", "stackfarm"}, "a plain venv: nox and its own"
    clone = _clone(tmp_path / "clone")
    done = subprocess.run(
        [str(plain_nox), "-l", "--json"], cwd=clone, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert [s["session"] for s in _sessions(done.stdout)] == ["matrix"]
    assert "pip" not in done.stderr.lower(), "nox went through pip before reading the noxfile"
    done = subprocess.run(
        [str(plain_nox), "-l", "--json", "-s", "matrix", "tests", "cell"],
        cwd=clone, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    names = [s["session"] for s in _sessions(done.stdout)]
    assert names == ["matrix", *(f"cell({c})" for c in _planned(clone / "matrix.toml")), "tests"]
    text = subprocess.run(
        [str(plain_nox), "-l"], cwd=clone, capture_output=True, text=True, check=True
    ).stdout
    assert all(
        f"- cell({c}) -> Run one cell of matrix.toml." in text for c in _planned(clone / "matrix.toml")
    )
