"""The worker (stackfarm.worker): one cell of a stored plan by index (a Kubernetes Indexed Job's
$JOB_COMPLETION_INDEX) or id, run end to end on the fake stack through `stackfarm run --cells`."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import uuid
from pathlib import Path

import pytest

from fakestack import CU130, NEW, OLD, FakeProject, cell_id
from stackfarm import verdict
from stackfarm.artifacts import Cache
from stackfarm.cli import main
from stackfarm.emit import k8s
from stackfarm.errors import ExitCode, StackfarmError
from stackfarm.matrix import load
from stackfarm.planjson import plan_document
from stackfarm.resolve import Resolver, plan_matrix
from stackfarm.store import open_store
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


# --------------------------------------------------------------------------- the plan is the contract

SERVER = os.environ.get("STACKFARM_TEST_STORE", "")


def _plan_file(project: FakeProject, capsys: pytest.CaptureFixture[str], where: Path, *args: str) -> Path:
    """`stackfarm plan --json ARGS` of the project written to `where` (its exit code 0 checked)."""
    capsys.readouterr()
    assert main(["plan", "--json", *args]) == ExitCode.OK
    where.write_text(capsys.readouterr().out)
    return where


def _worker(project: FakeProject, plan: Path, index: str, *args: str) -> int:
    """A fan-out worker as the emitters start one: the plan and an index, no --matrix, no --backend."""
    return main(["run", "--plan", str(plan), "--cell-index", index, "--reports", str(project.reports),
                 "--jobs", "1", *args])  # fmt: skip


@pytest.fixture
def elsewhere(fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The project's matrix as X (not ./matrix.toml), and a working folder without any matrix.toml: a worker
    that fell back to ./matrix.toml would find none."""
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, NEW])
    x = fake_project.matrix.with_name("x.toml")
    fake_project.matrix.rename(x)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return x


def test_a_docker_plan_on_a_machine_without_an_engine_is_refused_naming_both_bases(
    fake_project: FakeProject,
    elsewhere: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    signing_runner: tuple[Path, Path],
) -> None:
    """`plan --matrix X --backend docker`, run by a worker where no Docker engine answers (STACKFARM_DOCKER names
    no executable: the auto-detection's "no engine"): exit 4, both bases named, nothing run, nothing pushed."""
    monkeypatch.setenv("STACKFARM_DOCKER", str(tmp_path / "no-docker"))
    store = tmp_path / "store"
    store.mkdir()
    plan = _plan_file(fake_project, capsys, tmp_path / "plan.json", "--matrix", str(elsewhere),
                      "--backend", "docker", "--no-gpu", "--store", str(store))  # fmt: skip
    doc = json.loads(plan.read_text())
    assert doc["matrix"] == {
        "path": str(elsewhere),
        "sha256": hashlib.sha256(elsewhere.read_bytes()).hexdigest(),
    }
    assert (doc["hash_basis"], doc["store"]) == ({"backend": "docker", "gpu": False}, str(store))
    assert _worker(fake_project, plan, "0") == ExitCode.ENVIRONMENT
    err = capsys.readouterr().err
    assert "the plan's input hashes are for backend docker, without a GPU" in err, err
    assert "this machine can run backend local, without a GPU (no Docker engine answers" in err, err
    assert "stackfarm plan --json --backend local --no-gpu" in err, err
    assert fake_project.runs() == [], "nothing ran"
    assert not list(store.glob("*/*")), "nothing pushed"
    # A GPU plan on a machine without a GPU is refused the same way, naming both.
    gpu_plan = _plan_file(fake_project, capsys, tmp_path / "gpu.json", "--matrix", str(elsewhere),
                          "--backend", "local")  # fmt: skip
    assert _worker(fake_project, gpu_plan, "0") == ExitCode.ENVIRONMENT
    err = capsys.readouterr().err
    assert "for backend local, with a GPU; this machine can run backend local, without a GPU" in err, err
    # Asking for another backend than the plan's is a usage error naming both.
    local_plan = _plan_file(fake_project, capsys, tmp_path / "local.json", "--matrix", str(elsewhere),
                            "--backend", "local", "--no-gpu")  # fmt: skip
    assert _worker(fake_project, local_plan, "0", "--backend", "host") == ExitCode.CONFIG
    assert (
        "--backend host: the plan's input hashes are for backend local, without a GPU"
        in capsys.readouterr().err
    )


def test_a_matrix_of_other_content_than_the_plans_is_refused_naming_both_hashes(
    fake_project: FakeProject, elsewhere: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _plan_file(fake_project, capsys, tmp_path / "plan.json", "--matrix", str(elsewhere),
                      "--backend", "local", "--no-gpu")  # fmt: skip
    planned = hashlib.sha256(elsewhere.read_bytes()).hexdigest()
    elsewhere.write_text(elsewhere.read_text() + "\n# edited after the plan\n")
    now = hashlib.sha256(elsewhere.read_bytes()).hexdigest()
    assert _worker(fake_project, plan, "0") == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert (
        f"this matrix (sha256 {now}) is not the one {plan} was made from ({elsewhere}, sha256 {planned})"
        in err
    )
    assert fake_project.runs() == []


def _merge_green_through(
    fake_project: FakeProject, elsewhere: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """A local-basis plan of X with a store: every worker adopts X, the basis and the store (none of them on
    its command line), and the merge from the store with the plan is green; with a cell left out it is 3."""
    open_store(where).probe(create=True)
    plan = _plan_file(fake_project, capsys, tmp_path / "plan.json", "--matrix", str(elsewhere),
                      "--backend", "local", "--no-gpu", "--store", where)  # fmt: skip
    doc = json.loads(plan.read_text())
    assert [c["status"] for c in doc["cells"]] == ["run", "run"]
    merge = ["report", "--from", where, "--plan", str(plan), "--matrix", str(elsewhere), "--gate"]
    assert _worker(fake_project, plan, "0") == ExitCode.OK
    capsys.readouterr()
    assert main([*merge, "--reports", str(tmp_path / "m1")]) == ExitCode.INCOMPLETE, (
        "a planned cell is missing"
    )
    out = capsys.readouterr().out
    second = doc["cells"][1]["id"]
    assert f"{second}: the store holds no verdict for its inputs" in out, out
    assert _worker(fake_project, plan, "1") == ExitCode.OK
    assert sorted(c for c, _ in fake_project.runs()) == sorted(c["id"] for c in doc["cells"])
    for cell in doc["cells"]:  # pushed under the plan's hashes
        assert (
            verdict.read(verdict.path_of(fake_project.reports, cell["id"])).input_hash == cell["input_hash"]
        )
    capsys.readouterr()
    assert main([*merge, "--reports", str(tmp_path / "m2")]) == ExitCode.OK
    assert "merged 2 verdict(s)" in capsys.readouterr().out


def test_a_local_plan_merges_green_through_a_folder_store(
    fake_project: FakeProject,
    elsewhere: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signing_runner: tuple[Path, Path],
) -> None:
    _merge_green_through(fake_project, elsewhere, tmp_path, capsys, str(tmp_path / "store"))


@pytest.mark.integration
@pytest.mark.skipif(not SERVER, reason="STACKFARM_TEST_STORE is not set: start the store with .ci/servers.sh")
def test_a_local_plan_merges_green_through_the_real_store(
    fake_project: FakeProject,
    elsewhere: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signing_runner: tuple[Path, Path],
) -> None:
    _merge_green_through(
        fake_project, elsewhere, tmp_path, capsys, f"{SERVER.rstrip('/')}/plan-{uuid.uuid4().hex[:12]}"
    )


def test_report_with_the_plan_and_no_store_counts_every_planned_cell(
    fake_project: FakeProject, elsewhere: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`report --reports R --plan P --gate` (the artifacts of the jobs, no store): 1 of 2 planned cells there
    is incomplete (exit 3), naming the missing cell; both there is green."""
    plan = _plan_file(fake_project, capsys, tmp_path / "plan.json", "--matrix", str(elsewhere),
                      "--backend", "local", "--no-gpu")  # fmt: skip
    cells = [c["id"] for c in json.loads(plan.read_text())["cells"]]
    assert _worker(fake_project, plan, "0") == ExitCode.OK
    capsys.readouterr()
    merge = ["report", "--reports", str(fake_project.reports), "--plan", str(plan), "--gate"]
    assert main(merge) == ExitCode.INCOMPLETE
    out = capsys.readouterr().out
    assert "1 of 2 planned cell(s) have their verdict" in out, out
    assert f"{cells[1]}: no verdict under {fake_project.reports}/ (its job left none)" in out, out
    assert "gate: exit 3" in out
    assert main(merge[:-1]) == 0, "without --gate: the report, exit 0"
    assert _worker(fake_project, plan, "1") == ExitCode.OK
    assert main(merge) == ExitCode.OK
    # A verdict there of other inputs than the plan's is not the planned cell's.
    other = json.loads(plan.read_text())
    other["cells"][1]["input_hash"] = "0" * 64
    plan.write_text(json.dumps(other))
    capsys.readouterr()
    assert main(merge) == ExitCode.INCOMPLETE
    assert f"{cells[1]}: its verdict is of other inputs" in capsys.readouterr().out
    # ... also when that verdict says it was made by the host backend (an older run left in reports/): only a
    # plan hashed for the host backend takes a verdict of any hash.
    path = fake_project.reports / cells[1] / "verdict.json"
    stored = json.loads(path.read_text())
    stored["backend"] = "host"
    path.write_text(json.dumps(stored))
    assert main(merge) == ExitCode.INCOMPLETE
    assert f"{cells[1]}: its verdict is of other inputs" in capsys.readouterr().out
