"""What stackfarm prints into a pipe (a CI log) is never hard-wrapped, and a plan of a huge matrix is still a
page: every row one line (`grep <cell id>` finds it whole), each kind summarised past plantext.SHOWN rows unless
`--all`, and a count line last."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from fakestack import OLD, FakeProject, cell_id
from stackfarm.cli import main, plantext
from stackfarm.matrix import Matrix, load
from stackfarm.plan import Plan, plan

pytest_plugins = ("fakestack",)

CELL = cell_id(OLD)


@pytest.mark.parametrize("columns", [None, "40"], ids=["default-width", "COLUMNS=40"])
def test_progress_into_a_pipe_keeps_each_line_whole(fake_project: FakeProject, columns: str | None) -> None:
    """The real progress output of `stackfarm run` into a pipe: each line that names the cell names it whole,
    and the verdict line keeps its reason on the same line, whatever width rich believes the pipe has."""
    fake_project.suite("00-bad", "fail")
    fake_project.write_matrix()
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = columns
    done = subprocess.run(
        [sys.executable, "-m", "stackfarm", *fake_project.argv()],
        cwd=fake_project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    naming = [line for line in lines if "cu128-" in line or "sgl0.5.9" in line]
    assert naming, done.stderr
    assert all(CELL in line for line in naming), "a line holds a piece of the cell id:\n" + "\n".join(naming)
    assert f"  {CELL}: suite 00-bad" in lines
    [verdict_line] = [line for line in lines if f"{CELL}: failed" in line]
    assert "synthetic failure" in verdict_line, lines


# --------------------------------------------------------------------------- a plan of a big matrix


def _versions(prefix: str, count: int) -> str:
    return "[" + ", ".join(f'"{prefix}.{i}"' for i in range(count)) + "]"


@pytest.fixture
def big(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Plan]:
    """A synthetic 20 x 25 x 10 matrix (5,000 cells, as `stackfarm bench` plans 1,000): sglang 0.5.0 pins a
    torch no cell has (its 500 cells conflict), one [[exclude]] rule takes 225 cells out. No index holds such
    a matrix, so the plan's index look-ups are stood in for: `plan_matrix` returns this plan (planned by the
    real stackfarm.plan from the real matrix file), and everything after it is the real `stackfarm plan`."""
    path = tmp_path / "matrix.toml"
    path.write_text(
        f"""
[axes]
cuda = {_versions("12", 20)}
torch = {_versions("2", 25)}
sgl_kernel = ["0.3.21"]
flashinfer = ["0.6.3"]
sglang = {_versions("0.5", 10)}

[[exclude]]
cuda = "12.1"
torch = "2.*"
sglang = "0.5.[1-9]*"
reason = "synthetic: cuda 12.1 is not built past 0.5.0"
""",
        encoding="utf-8",
    )
    matrix = load(path)
    planned = plan(matrix, {"0.5.0": [Requirement("torch==9.9")]})

    def plan_matrix(
        m: Matrix, resolver: object, cells: str | None
    ) -> tuple[Plan, dict[tuple[str, str], str]]:
        del m, resolver, cells
        return planned, {}

    monkeypatch.setattr("stackfarm.cli.runs.plan_matrix", plan_matrix)
    monkeypatch.setenv("COLUMNS", "40")  # a narrow pipe: rows must stay whole all the same
    return path, planned


def test_a_big_plan_is_summarised_and_counted(
    big: tuple[Path, Plan], capsys: pytest.CaptureFixture[str]
) -> None:
    path, planned = big
    assert (len(planned.cells), len(planned.conflicts), len(planned.excluded)) == (4275, 500, 225)
    assert main(["plan", "--matrix", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 3 * plantext.SHOWN + 10, f"{len(lines)} lines for a summarised plan"
    assert lines[-1] == "5,000 cells: 4,275 to run, 500 conflicts, 225 excluded"
    more = [" ".join(line.split()) for line in lines if line.lstrip().startswith("…")]
    assert more == ["… 3,275 more cells to run not shown (`plan --all` lists them)"]
    shown = [line.split()[0] for line in lines[1:-1] if not line.lstrip().startswith("…")]
    assert len(shown) == plantext.SHOWN + 500 + 225
    # Each row is one line, its id whole: the first cell of each kind is found by grep.
    for cell in (planned.cells[0].id, planned.conflicts[0].cell.id, planned.excluded[0].cell.id):
        [row] = [line for line in lines if line.startswith(cell + " ")]
        assert len(row.split("  ")) >= 3, row


def test_plan_all_lists_every_row(big: tuple[Path, Plan], capsys: pytest.CaptureFixture[str]) -> None:
    path, planned = big
    assert main(["plan", "--matrix", str(path), "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 5000 + 1, "a header, one line per cell, the count line"
    assert not any(line.lstrip().startswith("…") for line in lines)
    conflict = planned.conflicts[-1]
    [row] = [line for line in lines if line.startswith(conflict.cell.id + " ")]
    assert row.split(None, 2)[1:] == ["conflict", "; ".join(conflict.problems)]


def test_a_small_plan_ends_with_its_count_line(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    from fakestack import CONFLICT

    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, CONFLICT])
    assert main(["plan", "--matrix", str(fake_project.matrix)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "2 cells: 1 to run, 1 conflict, 0 excluded"
    assert any(line.startswith(f"{CELL} ") and " run " in line for line in lines)
