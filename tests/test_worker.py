"""The worker (stackfarm.worker): one cell of a stored plan by index (a Kubernetes Indexed Job's
$JOB_COMPLETION_INDEX) or id, run end to end on the fake stack through `stackfarm run --cells`."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest

from fakestack import CU130, NEW, OLD, FakeProject, cell_id
from stackfarm import verdict
from stackfarm.artifacts import Cache
from stackfarm.emit import k8s
from stackfarm.errors import ExitCode, StackfarmError
from stackfarm.matrix import load
from stackfarm.planjson import plan_document
from stackfarm.resolve import Resolver, plan_matrix
from stackfarm.worker import exact_glob, read_plan, select_from_plan

pytest_plugins = ("fakestack",)

PLAN = {"cells": [{"id": "a-1.0"}, {"id": "b[x]-2.0"}, {"id": "c*"}]}


def test_by_index_and_by_id() -> None:
    assert select_from_plan(PLAN, index=0) == "a-1.0"
    assert select_from_plan(PLAN, index="1") == "b[[]x]-2.0"
    assert select_from_plan(PLAN, index=" 2\n") == "c[*]"
    assert select_from_plan(PLAN, cell_id="c*") == "c[*]"
    ids = [c["id"] for c in PLAN["cells"]]
    for cell in ids:
        assert [i for i in ids if fnmatch.fnmatchcase(i, exact_glob(cell))] == [cell], "one cell, exactly"


@pytest.mark.parametrize(
    ("index", "cell", "message"),
    [
        (3, None, "the plan has 3 cells"),
        (-1, None, "the plan has 3 cells"),
        ("$(JOB_COMPLETION_INDEX)", None, "is not a number"),
        (None, "d", "the plan has no cell 'd'"),
        (None, None, "one of them"),
        (0, "a-1.0", "one of them"),
    ],
)
def test_refusals(index: int | str | None, cell: str | None, message: str) -> None:
    with pytest.raises(StackfarmError, match=message.replace("(", r"\(").replace("$", r"\$")):
        select_from_plan(PLAN, index=index, cell_id=cell)


def test_read_plan_refuses_what_is_not_a_plan(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text('{"cells": 3}')
    with pytest.raises(StackfarmError, match="no cells list"):
        read_plan(tmp_path / "p.json")
    with pytest.raises(StackfarmError, match="cannot read the plan"):
        read_plan(tmp_path / "missing.json")


def test_a_stored_plan_runs_one_cell_per_index(fake_project: FakeProject, tmp_path: Path) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, NEW, CU130])
    matrix = load(fake_project.matrix)
    resolver = Resolver(matrix, Cache())
    planned, unreachable = plan_matrix(matrix, resolver, None)
    doc = plan_document(matrix, planned, unreachable, resolver, backend="local", gpu=False)
    # The plan a Kubernetes Job's pods read: its own cells, in its order (here: every pending cell).
    path = tmp_path / "plan.json"
    path.write_text(k8s.job_plan(doc["cells"]))
    order = [c["id"] for c in doc["cells"]]
    assert sorted(order) == sorted([cell_id(OLD), cell_id(NEW), cell_id(CU130)])
    for index in ("1", "0"):
        glob = select_from_plan(read_plan(path), index=index)
        assert fake_project.run("--cells", glob) == ExitCode.OK
    assert [cell for cell, _suite in fake_project.runs()] == [order[1], order[0]], "one cell per index"
    # The verdict's inputs are the ones the plan hashed: the stored plan and the run agree.
    for cell in order[:2]:
        stored = verdict.read(verdict.path_of(fake_project.reports, cell))
        assert stored.input_hash == next(c["input_hash"] for c in doc["cells"] if c["id"] == cell)
    by_id = select_from_plan(json.loads(path.read_text()), cell_id=order[2])
    assert fake_project.run("--cells", by_id) == ExitCode.OK
    assert [cell for cell, _ in fake_project.runs()][-1] == order[2]
