"""`stackfarm plan --json`'s document (stackfarm.planjson) on the fake stack: each cell's input hash is the one
the runner stores with its verdict, `stored` follows the runner's own reuse rule on the shared store (a
folder store here; tests/test_store.py covers the server), durations come from a
history folder, runner kinds from [runners], and a wheel that cannot be looked up leaves a null hash with why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from fakestack import (
    AT_IMPORT_SYMBOL,
    LAZY_SYMBOL,
    NEW,
    OLD,
    FakeProject,
    cell_id,
    native_kernel_files,
    write_wheel,
)
from stackfarm import verdict
from stackfarm.artifacts import Cache
from stackfarm.errors import ExitCode
from stackfarm.matrix import load
from stackfarm.planjson import conflict_entry, plan_document
from stackfarm.resolve import Resolver, plan_matrix
from stackfarm.store import open_store

pytest_plugins = ("fakestack",)
pytestmark = pytest.mark.usefixtures("signing_runner")  # runs that push to a store sign what they push

RUNNERS = """
[runners.1x-h200]
arch = "sm_90"
gpus = 1
labels = ["self-hosted", "sm_90"]
cells = ["*-sgl0.5.9"]

[runners.2x-h200]
arch = "sm_90"
gpus = 2
labels = ["self-hosted", "sm_90", "gpus-2"]
cells = ["*"]
"""


def document(project: FakeProject, **kwargs: Any) -> dict[str, Any]:
    """The plan document of the project, hashed as `stackfarm run --backend local` on this GPU-less host."""
    matrix = load(project.matrix)
    resolver = Resolver(matrix, Cache())
    planned, unreachable = plan_matrix(matrix, resolver, None)
    kwargs = {"backend": "local", "gpu": False, **kwargs}
    doc = plan_document(matrix, planned, unreachable, resolver, **kwargs)
    back: dict[str, Any] = json.loads(json.dumps(doc, default=str))
    return back  # what `plan --json` prints


def cells(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in doc["cells"]}


def test_the_input_hash_is_the_runners_and_stored_follows_reuse(
    fake_project: FakeProject, tmp_path: Path
) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, NEW], extra=RUNNERS)
    store = open_store(tmp_path / "store")
    before = cells(document(fake_project, store=store))
    assert [c["stored"] for c in before.values()] == [False, False], "an empty store holds nothing"
    assert fake_project.run("--cells", cell_id(OLD), "--store", store.where) == ExitCode.OK
    stored = verdict.read(verdict.path_of(fake_project.reports, cell_id(OLD)))
    after = cells(document(fake_project, store=store))
    assert after[cell_id(OLD)]["input_hash"] == stored.input_hash == before[cell_id(OLD)]["input_hash"]
    assert after[cell_id(OLD)]["stored"] is True
    assert after[cell_id(NEW)]["stored"] is False, "never run"
    assert after[cell_id(NEW)]["input_hash"] not in (None, stored.input_hash)
    # Hashed for another backend or a GPU runner, the same verdict does not stand.
    docker = cells(document(fake_project, store=store, backend="docker", gpu=True))
    assert docker[cell_id(OLD)]["stored"] is False
    assert document(fake_project)["hash_basis"] == {"backend": "local", "gpu": False}
    assert document(fake_project, store=store)["store"] == str(tmp_path / "store")
    # A verdict whose JUnit file is gone is not reused by the runner: not stored either.
    [junit] = (tmp_path / "store").glob("*/*/*/00-ok.xml")
    junit.unlink()
    doc = document(fake_project, store=store)
    assert cells(doc)[cell_id(OLD)]["stored"] is False
    assert any("00-ok.xml is listed in the manifest but missing" in w for w in doc["warnings"])


def test_changed_inputs_are_not_stored(fake_project: FakeProject, tmp_path: Path) -> None:
    suite = fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    store = open_store(tmp_path / "store")
    assert fake_project.run("--store", store.where) == ExitCode.OK
    assert cells(document(fake_project, store=store))[cell_id(OLD)]["stored"] is True
    (suite / "test_it.py").write_text((suite / "test_it.py").read_text() + "\n\ndef test_more():\n    pass\n")
    assert cells(document(fake_project, store=store))[cell_id(OLD)]["stored"] is False


def test_runner_kind_gpus_arch_and_estimates(fake_project: FakeProject, tmp_path: Path) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, NEW], extra=RUNNERS)
    assert fake_project.run() == ExitCode.OK
    history = tmp_path / "history"
    for run in ("1", "2", "3"):
        assert fake_project.run("--force") == ExitCode.OK  # a fresh run id, fresh suite times
        shutil.copytree(fake_project.reports, history / run)
    times = {
        c: sorted(
            sum(s.time for s in verdict.read(history / r / c / "verdict.json").report.suites) for r in "123"
        )
        for c in (cell_id(OLD), cell_id(NEW))
    }
    doc = cells(document(fake_project, history=history))
    old, new = doc[cell_id(OLD)], doc[cell_id(NEW)]
    assert (old["runner"], old["gpus"], old["arch"], old["labels"]) == (
        "1x-h200",
        1,
        "sm_90",
        ["self-hosted", "sm_90"],
    )
    assert (new["runner"], new["gpus"]) == ("2x-h200", 2)
    assert old["estimated_seconds"] == times[cell_id(OLD)][1] > 0, "the median of three runs"
    assert new["estimated_seconds"] == times[cell_id(NEW)][1]
    assert all(c["estimated_seconds"] is None for c in cells(document(fake_project)).values())


def test_a_wheel_that_cannot_be_looked_up_leaves_the_hash_null_with_the_reason(
    fake_project: FakeProject,
) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, NEW])
    matrix = load(fake_project.matrix)
    resolver = Resolver(matrix, Cache())
    planned, _ = plan_matrix(matrix, resolver, None)
    unreachable = {("sglang", "0.5.10"): "https://index.example: connection refused"}
    doc = cells(plan_document(matrix, planned, unreachable, resolver))
    assert doc[cell_id(NEW)]["input_hash"] is None
    assert doc[cell_id(NEW)]["input_hash_error"] == "https://index.example: connection refused"
    assert doc[cell_id(OLD)]["input_hash"]
    assert doc[cell_id(OLD)]["input_hash_error"] is None
    # A wheel gone from the index since planning: the lookup's own error.
    (fake_project.wheels / "flashinfer_cubin-0.6.3-py3-none-any.whl").unlink()
    doc = cells(plan_document(matrix, planned, {}, Resolver(matrix, Cache())))
    assert doc[cell_id(OLD)]["input_hash"] is None
    assert "flashinfer-cubin" in doc[cell_id(OLD)]["input_hash_error"]


# --------------------------------------------------------------------------- driver-API symbols route cells

DRIVERS = """
[runners.driver-550]
labels = ["self-hosted", "d550"]
gpus = 1
driver = "550.54.14"
cells = ["*"]

[runners.driver-570]
labels = ["self-hosted", "d570"]
gpus = 1
driver = "570.86.15"
cells = ["*"]
"""


def _native_kernels(project: FakeProject, tmp_path: Path, *suites: str) -> None:
    """OLD's kernel wheel with real libraries (fakestack.native_kernel_files: cuGreenCtxStreamCreate, CUDA 12.5,
    at import; cuCtxGetDevice_v2, CUDA 13.0, in a library no extension needs), two kinds of older drivers."""
    files = native_kernel_files(tmp_path / "cc")
    files["sgl_kernel/__init__.py"] = (
        f'__version__ = "{OLD["sgl_kernel"]}"\n__distribution__ = "sgl-kernel"\n'
    )
    write_wheel(project.wheels, "sgl-kernel", OLD["sgl_kernel"], files=files)
    for suite in ("00-ok", *suites):
        project.suite(suite, "pass")
    project.write_matrix([OLD], extra=DRIVERS)


def test_the_symbols_an_import_links_route_a_cell_past_an_older_driver(
    fake_project: FakeProject, tmp_path: Path
) -> None:
    _native_kernels(fake_project, tmp_path)
    # Nothing unpacked and no --symbols: the symbols are unknown (said), the CUDA 12.8 floor alone routes it.
    [unread] = document(fake_project)["cells"]
    assert (unread["runner"], unread["driver_symbols"]) == ("driver-550", None)
    assert "is not unpacked in the cache (`plan --symbols` reads it)" in unread["driver_symbols_note"]
    [cell] = document(fake_project, fetch_symbols=True)["cells"]
    assert cell["driver_symbols"] == [AT_IMPORT_SYMBOL], "the lazy library's symbol does not count"
    assert (cell["status"], cell["runner"]) == ("run", "driver-570")
    assert cell["driver_floor"]["driver"] == "555.42.02"
    assert cell["passed_over"] == [
        f"runner driver-550: driver 550.54.14 < 555.42.02: {AT_IMPORT_SYMBOL} is a CUDA 12.5 driver API: "
        "driver >= 555.42.02 (no forward_compat on this runner)"
    ]
    # The plan's worker adopts that kind: it hashes the cell as the plan did (else it would refuse the cell).
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(document(fake_project, fetch_symbols=True)))
    argv = ["--plan", str(plan), "--cell-index", "0", "--backend", "local"]
    assert fake_project.run(*argv) == ExitCode.OK
    assert verdict.read(verdict.path_of(fake_project.reports, cell["id"])).input_hash == cell["input_hash"]


def test_a_suite_that_dlopens_every_library_counts_the_lazy_ones(
    fake_project: FakeProject, tmp_path: Path
) -> None:
    """With 05-import in the matrix (its GPU part dlopens each library) the lazy library's CUDA 13.0 symbol
    counts: no kind's driver runs the cell, unrunnable, never dispatched."""
    _native_kernels(fake_project, tmp_path, "05-import")
    [cell] = document(fake_project, fetch_symbols=True)["cells"]
    assert sorted(cell["driver_symbols"]) == sorted([AT_IMPORT_SYMBOL, LAZY_SYMBOL])
    assert (cell["status"], cell["runner"]) == ("unrunnable", None)
    assert f"{LAZY_SYMBOL} is a CUDA 13.0 driver API" in cell["unrunnable"]


def test_a_worker_refuses_a_cell_whose_inputs_hash_otherwise_than_the_plans(
    fake_project: FakeProject, tmp_path: Path
) -> None:
    """The plan's input hash is the worker's contract: a cell whose inputs changed since (here a suite edited)
    is an environment error naming both hashes, nothing run."""
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD])
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(document(fake_project)))
    planned = json.loads(plan.read_text())["cells"][0]["input_hash"]
    (fake_project.suites / "00-ok" / "test_more.py").write_text("def test_more():\n    pass\n")
    assert fake_project.run("--plan", str(plan), "--cell-index", "0") == ExitCode.ENVIRONMENT
    reason = verdict.read(verdict.path_of(fake_project.reports, cell_id(OLD))).report.reason
    assert f"the plan's is {planned}" in reason
    assert fake_project.runs() == []


def test_a_plan_documents_conflict_is_recorded_with_its_typed_fields() -> None:
    from stackfarm.cli.runs import _conflict_report
    from stackfarm.plan import Cell, Conflict

    cell = Cell(id="c", values=(("torch", "2.8.0"),), components=(), patch_sets=())
    found = verdict.Contradiction(
        axis="torch", requirement="torch==2.9.1", text="sglang requires torch==2.9.1"
    )
    conflict = Conflict(cell=cell, problems=(found.text,), contradictions=(found,),
                        declared_at=verdict.SourceLine(path="matrix.toml", line=3))  # fmt: skip
    entry = json.loads(json.dumps(conflict_entry(conflict)))
    report = _conflict_report(entry)
    assert (report.cell, report.status, report.reason) == ("c", verdict.Status.CONFLICT, found.text)
    assert (report.contradictions, report.declared_at) == (conflict.contradictions, conflict.declared_at)
    older = _conflict_report({"id": "c", "problems": [found.text]})  # a plan document written before them
    assert (older.reason, older.contradictions, older.declared_at) == (found.text, (), None)
