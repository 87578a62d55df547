"""The Ray executor (stackfarm.executors.ray, stackfarm.cli.rayrun): `stackfarm run --executor ray:ADDRESS`.

The integration test runs a real local Ray cluster (ray.cluster_utils.Cluster: a head node and a worker node,
each a raylet of its own, on this machine), six fake-stack cells across two runner kinds, and the real verdict
store server ($STACKFARM_TEST_STORE, .ci/servers.sh). The kind-a node is killed while its cells run (they
wait for a release file), a replacement kind-a node joins (as an autoscaler would add one), and the run must
end with every verdict merged exactly once, each signed by a node of the cell's own kind, no kind-b cell ever
started on a kind-a node. The unit tests check what needs no cluster: `--executor`'s values, the cluster
check's sentences, the worker's command line, and the refusals before any work."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakestack import CU130, NEW, OLD, REPO, SGLANG_PINS, FakeProject, cell_id, write_wheel
from stackfarm import attest, indexwait, store, storekeys, verdict
from stackfarm.cli import main
from stackfarm.cli.rayrun import _tasks, _unmerged, _worker_args
from stackfarm.errors import ExitCode
from stackfarm.executors import LOCAL, Executor, option, parse
from stackfarm.executors.ray import CellOutcome, cluster_problems, kind_resource
from stackfarm.matrix import load
from stackfarm.store import open_store
from stackfarm.verdict import Cause, Status

pytest_plugins = ("fakestack",)

SERVER = os.environ.get("STACKFARM_TEST_STORE", "")

#: Kind a runs the CUDA 12.8 cells, kind b the CUDA 13.0 ones; one GPU each (Ray's logical GPUs here).
RUNNERS = """
[runners.a]
labels = ["self-hosted", "kind-a"]
gpus = 1
cells = ["cu128-*"]

[runners.b]
labels = ["self-hosted", "kind-b"]
gpus = 1
cells = ["cu130-*"]
"""
#: A third SGLang release with 0.5.9's pins: six distinct cells on the fake index.
POST1 = {**OLD, "sglang": "0.5.9.post1"}
CELLS = [
    OLD,
    NEW,
    POST1,
    CU130,
    {**NEW, "cuda": "13.0", "torch": "2.9.1+cu130"},
    {**CU130, "sglang": "0.5.9.post1"},
]

#: The suite every cell runs: it records "<cell> <Ray node>" when it starts, then waits for the release file.
WAIT_SUITE = """
import json
import os
import time
from pathlib import Path


def test_waits_for_the_release():
    cell = json.loads(Path(os.environ["STACKFARM_CELL"]).read_text())["id"]
    with open(os.environ["RAYTEST_STARTS"], "a", encoding="utf-8") as log:
        log.write(f"{cell} {os.environ.get('STACKFARM_RAY_NODE', '?')}\\n")
    deadline = time.monotonic() + 180
    while not Path(os.environ["RAYTEST_RELEASE"]).exists():
        assert time.monotonic() < deadline, "never released"
        time.sleep(0.1)
"""


# --------------------------------------------------------------------------- no cluster needed


def test_executor_values() -> None:
    assert parse("local") == LOCAL
    assert parse("ray") == Executor("ray", None)
    assert parse("ray:10.0.0.5:6379") == Executor("ray", "10.0.0.5:6379")
    assert parse("ray:ray://head:10001") == Executor("ray", "ray://head:10001")
    assert str(parse("ray:10.0.0.5:6379")) == "ray:10.0.0.5:6379"
    with pytest.raises(argparse.ArgumentTypeError, match="not an executor: give local"):
        option("dask")
    with pytest.raises(ValueError, match="needs an address after the colon"):
        parse("ray:")


def test_cluster_problems_name_the_kind_and_the_fix() -> None:
    nodes = [
        {"Alive": True, "Resources": {"GPU": 1.0, kind_resource("a"): 2.0}},
        {"Alive": False, "Resources": {"GPU": 8.0, kind_resource("b"): 1.0}},  # lost: it counts for nothing
    ]
    assert cluster_problems({"a": 1}, nodes) == []
    [no_b] = cluster_problems({"b": 1}, nodes)
    assert no_b.startswith(
        "runner kind b: no live node of the cluster declares the resource stackfarm-kind-b"
    )
    assert """--resources '{"stackfarm-kind-b": 1}'""" in no_b
    [few] = cluster_problems({"a": 4}, nodes)
    assert few.startswith(
        "runner kind a: a cell asks for 4 GPU(s) ([runners.a] gpus), and its nodes have at most 1"
    )


def test_the_worker_runs_one_exact_cell_with_the_runs_options() -> None:
    args = argparse.Namespace(matrix=Path("m.toml"), store="http://s/x", backend="local", plan=None,
                              force=True, refresh=False, suites="00-*", profile=None, python=None)  # fmt: skip
    argv = _worker_args(args, "cu128-a[1]*")
    assert argv == ("--matrix", "m.toml", "--store", "http://s/x", "--backend", "local",
                    "--cells", "cu128-a[[]1][*]", "--force", "--suites", "00-*")  # fmt: skip
    planned = _worker_args(argparse.Namespace(**{**vars(args), "plan": "p.json"}), "cu128-a[1]*")
    assert planned[planned.index("--cells") + 1] == "cu128-a[1]*", "with --plan: the exact id"


def test_ray_needs_a_store_and_refuses_cell_index(
    fake_project: FakeProject, signing_runner: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    assert main(fake_project.argv("--executor", "ray:127.0.0.1:1")) == ExitCode.CONFIG
    assert (
        "--executor ray:127.0.0.1:1: needs --store: each node pushes its signed verdicts"
        in capsys.readouterr().err
    )
    where = str(fake_project.root / "store")
    assert (
        main(fake_project.argv("--executor", "ray", "--cell-index", "0", "--store", where)) == ExitCode.CONFIG
    )
    assert "--cell-index: picks one cell of a plan for a worker" in capsys.readouterr().err
    assert fake_project.runs() == [], "nothing ran"


def test_each_cell_asks_for_its_kind_and_a_cell_no_kind_runs_is_an_error(
    fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_project.write_matrix(
        [OLD, CU130], extra=RUNNERS.replace('cells = ["cu130-*"]', 'cells = ["cu999-*"]')
    )
    monkeypatch.chdir(fake_project.root)
    args = argparse.Namespace(matrix=fake_project.matrix, store="s", backend="local", plan=None, force=False,
                              refresh=False, suites=None, profile=None, python=None)  # fmt: skip
    tasks, unrouted = _tasks(
        args,
        load(fake_project.matrix),
        [cell_id(OLD), cell_id(CU130)],
        {cell_id(OLD): OLD["cuda"], cell_id(CU130): CU130["cuda"]},
    )
    [task] = tasks
    assert (task.cell, task.kind, task.gpus, task.cwd) == (cell_id(OLD), "a", 1, str(fake_project.root))
    [report] = unrouted
    assert (report.cell, report.status, report.cause) == (cell_id(CU130), Status.ERROR, Cause.ENVIRONMENT)
    assert report.reason == "matches no [runners.*] cells glob: no node kind of the cluster would run it"


def test_a_kind_whose_driver_cannot_run_a_cell_is_passed_over(
    fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Ray driver dispatches by stackfarm.driver.route, as plan and the emitters do: a CUDA 13.0 cell goes
    past a kind with a 570 driver to the next kind whose globs match, and is an error when none can run it."""
    old_driver = """
[runners.a]
labels = ["kind-a"]
gpus = 1
driver = "570.86.15"
cells = ["*"]
"""
    fake_project.write_matrix(
        [OLD, CU130], extra=old_driver + '\n[runners.b]\nlabels = ["kind-b"]\ngpus = 1\ncells = ["*"]\n'
    )
    monkeypatch.chdir(fake_project.root)
    args = argparse.Namespace(matrix=fake_project.matrix, store="s", backend="local", plan=None, force=False,
                              refresh=False, suites=None, profile=None, python=None)  # fmt: skip
    cudas = {cell_id(OLD): OLD["cuda"], cell_id(CU130): CU130["cuda"]}
    tasks, unrouted = _tasks(args, load(fake_project.matrix), list(cudas), cudas)
    assert {t.cell: t.kind for t in tasks} == {cell_id(OLD): "a", cell_id(CU130): "b"}
    assert unrouted == []
    fake_project.write_matrix([OLD, CU130], extra=old_driver)
    tasks, unrouted = _tasks(args, load(fake_project.matrix), list(cudas), cudas)
    assert [t.cell for t in tasks] == [cell_id(OLD)]
    [report] = unrouted
    assert report.cell == cell_id(CU130)
    assert "runner a:" in report.reason
    assert "580" in report.reason


@pytest.mark.parametrize(
    ("outcome", "status", "cause", "reason"),
    [
        (CellOutcome(cell="c", kind="a", status="error", cause="environment", lost="no attempt finished (…)"),
         Status.ERROR, Cause.ENVIRONMENT, "no attempt finished (…)"),
        (CellOutcome(cell="c", kind="a", host="h1", status="passed", input_hash="f" * 64, exit_code=4),
         Status.ERROR, Cause.ENVIRONMENT,
         "its node (h1) judged it passed, but the store holds no verdict: c: the store holds no verdict"),
        (CellOutcome(cell="c", kind="a", host="h1", exit_code=2, output="…\nerror: bad matrix\n"),
         Status.ERROR, Cause.ENVIRONMENT, "its worker on h1 exited 2: error: bad matrix"),
        (CellOutcome(cell="c", kind="a", status="error", cause="internal", reason="a patch did not apply"),
         Status.ERROR, Cause.INTERNAL, "a patch did not apply"),
    ],
)  # fmt: skip
def test_a_cell_the_store_holds_no_verdict_of_is_an_error_never_a_result(
    outcome: CellOutcome, status: Status, cause: Cause, reason: str
) -> None:
    report = _unmerged(outcome, ["c: the store holds no verdict"])
    assert (report.cell, report.status, report.cause, report.reason) == ("c", status, cause, reason)


# --------------------------------------------------------------------------- a real cluster


@pytest.fixture
def server_base() -> str:
    if not SERVER:
        pytest.skip("STACKFARM_TEST_STORE is not set: start the verdict store with .ci/servers.sh (as root)")
    base = f"{SERVER.rstrip('/')}/ray-{uuid.uuid4().hex[:12]}"
    store.HttpTransport(base).probe(create=True)
    return base


@pytest.fixture
def cluster() -> Iterator[Any]:
    """A real Ray cluster on this machine, shut down (every raylet and worker it started) after the test."""
    cluster_utils = pytest.importorskip(
        "ray.cluster_utils", reason="ray is not installed (pip install .[ray])"
    )
    import ray

    made = cluster_utils.Cluster()
    try:
        yield made
    finally:
        if ray.is_initialized():
            ray.shutdown()
        made.shutdown()


def _node(cluster: Any, kind: str, key: Path, **more: Any) -> Any:
    """A node of runner kind `kind` with 2 slots of it and 2 logical GPUs, signing with its own runner key."""
    return cluster.add_node(
        num_cpus=2, num_gpus=2, resources={kind_resource(kind): 2}, object_store_memory=80 * 1024**2,
        env_vars={storekeys.RUNNER_KEY_ENV: str(key)}, **more,
    )  # fmt: skip


def _starts(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text().splitlines() if path.is_file() else []
    return [(cell, node) for cell, node in (line.split(" ", 1) for line in lines if line)]


@pytest.mark.integration
def test_six_cells_two_kinds_a_node_lost_every_verdict_merged_once(
    fake_project: FakeProject,
    cluster: Any,
    server_base: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store, "RETRY_DELAYS", (0.0, 0.0))
    indexwait.reset()
    write_wheel(fake_project.wheels, "sglang", "0.5.9.post1", requires=SGLANG_PINS["0.5.9"])
    (fake_project.suite("05-wait", "pass") / "test_it.py").write_text(WAIT_SUITE)
    fake_project.write_matrix(CELLS, extra=RUNNERS)
    kind_of = {cell_id(c): ("a" if c["cuda"] == "12.8" else "b") for c in CELLS}
    assert sorted(kind_of.values()) == ["a"] * 3 + ["b"] * 3, "six cells, three of each kind"

    # Each kind's nodes sign with their own runner key; the driver signs nothing and trusts both.
    key_a, pub_a, id_a = attest.generate(tmp_path / "key-a")
    key_b, pub_b, id_b = attest.generate(tmp_path / "key-b")
    monkeypatch.delenv(storekeys.RUNNER_KEY_ENV, raising=False)
    monkeypatch.setenv(storekeys.TRUSTED_RUNNER_KEYS_ENV, f"{pub_a}{os.pathsep}{pub_b}")
    starts, release = tmp_path / "starts.log", tmp_path / "release"
    monkeypatch.setenv("RAYTEST_STARTS", str(starts))
    monkeypatch.setenv("RAYTEST_RELEASE", str(release))
    monkeypatch.chdir(fake_project.root)  # the project folder: the same path on every node (one machine)

    # The nodes (and the driver) import this checkout's stackfarm.
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    )
    head = _node(cluster, "b", key_b, include_dashboard=False)
    node_a = _node(cluster, "a", key_a)
    cluster.wait_for_nodes()
    nodes_a = [node_a.node_id]

    # The driver in a process of its own, as a user runs it; this thread plays the cluster's operator: once a
    # kind-a cell runs on node A, node A is killed, a fresh kind-a node joins, and the cells are released.
    argv = [sys.executable, "-m", "stackfarm", *fake_project.argv("--executor", f"ray:{cluster.address}",
                                                                   "--store", server_base)]  # fmt: skip
    driver = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not any(node == node_a.node_id for _, node in _starts(starts)):
            assert driver.poll() is None, driver.communicate()[0]
            assert time.monotonic() < deadline, "no cell started on node A"
            time.sleep(0.2)
        cluster.remove_node(node_a, allow_graceful=False)
        nodes_a.append(_node(cluster, "a", key_a).node_id)
        release.touch()
        out, _ = driver.communicate(timeout=300)
    finally:
        release.touch()
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    (tmp_path / "driver.log").write_text(out)
    assert driver.returncode == ExitCode.OK, out

    # Routing: kind-b cells started only on the head (kind b), kind-a cells only on kind-a nodes.
    started = _starts(starts)
    for cell, node in started:
        assert node in (nodes_a if kind_of[cell] == "a" else [head.node_id]), (cell, node, started)
    lost = [cell for cell, node in started if node == node_a.node_id]
    assert lost, "a kind-a cell was running on node A when it was killed"
    for cell in lost:
        assert (cell, nodes_a[1]) in started, f"{cell} was rescheduled onto the new kind-a node"

    # Every verdict merged exactly once: six cells, six verdicts, each its node kind's signed entry.
    assert "merged 6 verdict(s) from" in out
    assert "have none" not in out
    stored, problems = verdict.read_all(fake_project.reports)
    assert problems == []
    assert sorted(s.report.cell for s in stored) == sorted(kind_of), "one verdict per cell, none twice"
    assert all(str(s.report.status) == "passed" for s in stored)
    reader = open_store(server_base)
    for s in stored:
        manifest = json.loads(reader.transport.get(f"{s.input_hash}/{s.report.cell}/manifest.json") or b"")
        _, signer = storekeys.unseal(manifest, reader.keys)
        assert signer.key_id == (id_a if kind_of[s.report.cell] == "a" else id_b), s.report.cell
    summary = (fake_project.reports / "summary.md").read_text()
    assert "6 cells" in summary or "6 passed" in summary, summary


@pytest.mark.integration
def test_a_failed_verdict_is_never_retried_and_a_kind_without_nodes_is_refused(
    fake_project: FakeProject,
    cluster: Any,
    server_base: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One kind-a node. A run that needs kind b too is refused before any cell runs (exit 4, the fix named);
    a stored plan's kind-a cells then run: the one whose suite fails is judged failed once, never run again."""
    monkeypatch.setattr(store, "RETRY_DELAYS", (0.0, 0.0))
    indexwait.reset()
    fake_project.suite("00-by-cell", "by-cell")  # a GPU skip on SGLang 0.5.9, a failure on 0.5.10
    fake_project.write_matrix([OLD, NEW, CU130], extra=RUNNERS)
    key, _, _ = attest.generate(tmp_path / "key-a")
    monkeypatch.setenv(storekeys.RUNNER_KEY_ENV, str(key))  # the node signs with it, the driver trusts it
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.chdir(fake_project.root)
    _node(cluster, "a", key, include_dashboard=False)
    cluster.wait_for_nodes()
    where = ["--executor", f"ray:{cluster.address}", "--store", server_base]

    assert main(fake_project.argv(*where)) == ExitCode.ENVIRONMENT
    err = capsys.readouterr().err
    assert "the Ray cluster cannot run every kind of this run's cells" in err
    assert "runner kind b: no live node of the cluster declares the resource stackfarm-kind-b" in err
    assert fake_project.runs() == [], "refused before any cell ran"

    capsys.readouterr()
    assert (
        main(["plan", "--json", "--matrix", str(fake_project.matrix), "--backend", "local", "--no-gpu"]) == 0
    )
    plan = tmp_path / "plan.json"
    plan.write_text(capsys.readouterr().out)
    code = main(fake_project.argv(*where, "--plan", str(plan), "--cells", "cu128-*"))
    out, err = capsys.readouterr()
    assert code == ExitCode.CELLS_FAILED, out
    assert "another hash basis" not in err, "the node hashed each cell as the plan did"
    assert sorted(fake_project.runs()) == sorted([(cell_id(OLD), "00-by-cell"), (cell_id(NEW), "00-by-cell")])
    assert "merged 2 verdict(s) from" in out
    statuses = {s.report.cell: str(s.report.status) for s in verdict.read_all(fake_project.reports)[0]}
    assert statuses == {cell_id(OLD): "incomplete", cell_id(NEW): "failed"}
