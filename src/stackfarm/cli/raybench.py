"""`stackfarm bench`'s Ray rows: the same plan on a one-node and on a two-node Ray cluster, wall time side by
side (the driver's `stackfarm run --executor ray:ADDRESS`, from dispatch to the merged report; the clusters'
start-up is not counted).

The plan is six cells of the test suite's fake stack (tests/fakestack.py: real tiny wheels on a local index, so
nothing is downloaded), each running a suite that sleeps SECONDS, standing for a suite's GPU time; every node
has one (logical) GPU and one slot of the default runner kind. Both runs push to a fresh folder of the verdict
store server, so neither reuses the other's verdicts; the cache is warmed first, so neither pays the unpacking.
A row says why when Ray is not installed, the checkout has no tests/, or no store server answers.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import attest, storekeys
from ..executors.ray import kind_resource
from ..gha import DEFAULT_RUNNER

Row = tuple[str, float, str]
#: The sleep of each cell's suite (its "GPU time") and the number of cells.
SECONDS = 3.0
CELLS = 6
#: The suite each cell runs beside the fake stack's import check.
_SLEEP_SUITE = f"""
import time


def test_gpu_time():
    time.sleep({SECONDS})
"""


@contextlib.contextmanager
def _fakestack(root: Path) -> Iterator[ModuleType]:
    sys.path.insert(0, str(root / "tests"))
    try:
        yield importlib.import_module("fakestack")
    finally:
        sys.path.remove(str(root / "tests"))


def _stacks(fakestack: ModuleType) -> list[dict[str, str]]:
    """Six cells of the fake index: two CUDAs x three SGLang releases (0.5.9.post1 is written for this)."""
    old, new, cu130 = dict(fakestack.OLD), dict(fakestack.NEW), dict(fakestack.CU130)
    return [
        old,
        new,
        {**old, "sglang": "0.5.9.post1"},
        cu130,
        {**new, "cuda": "13.0", "torch": "2.9.1+cu130"},
        {**cu130, "sglang": "0.5.9.post1"},
    ]


#: `stackfarm ARGV` timed, its output discarded: (wall seconds, exit code).
Timed = Callable[[list[str]], tuple[float, int]]


def _on_cluster(timed: Timed, nodes: int, argv: list[str], store: str) -> tuple[float, int, float]:
    """(wall seconds of the run, its exit code, the cluster's start-up seconds) on `nodes` nodes."""
    from ray.cluster_utils import Cluster

    resources = {kind_resource(DEFAULT_RUNNER.name): 1}
    start = time.perf_counter()
    cluster: Any = Cluster()  # Ray leaves its methods untyped
    try:
        for index in range(nodes):
            extra: dict[str, Any] = {"include_dashboard": False} if index == 0 else {}
            cluster.add_node(
                num_cpus=1, num_gpus=1, resources=resources, object_store_memory=80 * 1024**2, **extra
            )
        cluster.wait_for_nodes()
        started = time.perf_counter() - start
        seconds, code = timed([*argv, "--executor", f"ray:{cluster.address}", "--store", f"{store}-{nodes}"])
    finally:
        cluster.shutdown()
    return seconds, code, started


def two_nodes_vs_one(timed: Timed, store: str | None, why: str, root: Path) -> list[Row]:
    """The Ray rows (see the module's docstring)."""
    name = f"ray: {CELLS} fake cells ({SECONDS:.0f} s suite each), 1 node vs 2 nodes"
    try:
        import ray.cluster_utils  # noqa: F401 - only asked whether it is there
    except ImportError:
        return [(name, float("nan"), "skipped: ray is not installed (pip install 'stackfarm[ray]')")]
    if not (root / "tests" / "fakestack.py").is_file():
        return [(name, float("nan"), f"skipped: {root} has no tests/fakestack.py (stackfarm is installed)")]
    if store is None:
        return [(name, float("nan"), f"skipped: {why}")]
    import pytest

    with (
        tempfile.TemporaryDirectory(prefix="stackfarm-raybench-") as tmp,
        pytest.MonkeyPatch.context() as env,
    ):
        with _fakestack(root) as fakestack:
            project = fakestack.make_project(Path(tmp), env)
            fakestack.write_wheel(
                project.wheels, "sglang", "0.5.9.post1", requires=fakestack.SGLANG_PINS["0.5.9"]
            )
            project.suite("00-ok", "pass")
            (project.suite("05-gpu-time", "pass") / "test_it.py").write_text(_SLEEP_SUITE)
            project.write_matrix(_stacks(fakestack))
        key, _, _ = attest.generate(Path(tmp) / "node-key")  # every node signs with it; the driver trusts it
        env.setenv(storekeys.RUNNER_KEY_ENV, str(key))
        env.setenv("PYTHONPATH", str(root / "src"))
        env.chdir(project.root)
        argv = project.argv()
        timed([*argv, "--suites", "00-*"])  # warms the cache: neither run below unpacks
        base = f"{store}/raybench-{uuid.uuid4().hex[:12]}"
        one, code1, start1 = _on_cluster(timed, 1, argv, base)
        two, code2, start2 = _on_cluster(timed, 2, argv, base)
    return [
        (
            f"ray: {CELLS} fake cells ({SECONDS:.0f} s suite each), 1 node x 1 GPU",
            one,
            f"exit {code1}; cluster start {start1:.1f} s, not counted",
        ),
        (
            "ray: the same plan, 2 nodes x 1 GPU",
            two,
            f"exit {code2}; 1-node / 2-node = {one / two:.2f}x (ideal 2x); cluster start {start2:.1f} s",
        ),
    ]


__all__ = ["CELLS", "SECONDS", "two_nodes_vs_one"]
