"""stackfarm.driver: a cell's driver floor, [runners.<kind>] driver / forward_compat, and driver_problems."""

from __future__ import annotations

import json

import pytest

from conftest import WriteMatrix
from fakestack import CU130, OLD, FakeProject, cell_id
from stackfarm import driver
from stackfarm.driver import cell_floor, cuda_floor, driver_key, driver_problems, runs_on, symbol_floor
from stackfarm.errors import ConfigError
from stackfarm.matrix import Runner, load
from stackfarm.plan import plan

pytest_plugins = ("fakestack",)

_RUNNERS = """
[targets]
archs = ["sm_90"]

[runners.1x-h200]
arch = "sm_90"
gpus = 1
labels = ["self-hosted", "gpus-1"]
cells = ["*"]
{extra}
"""


def test_cuda_floors() -> None:
    assert cuda_floor("12.8") == driver.Floor("525.60.13", "CUDA 12.8 needs driver >= 525.60.13 (CUDA 12.x)")
    assert cuda_floor("13.0").driver.startswith("580")  # type: ignore[union-attr]
    assert cuda_floor("9.9") is None
    assert cuda_floor("not-a-version") is None


def test_symbol_floors() -> None:
    green = symbol_floor(["cuGreenCtxCreate", "cuMemAlloc_v2", "cuInit"])
    assert green is not None
    assert green.driver == "550.54.14"
    assert "cuGreenCtxCreate is a CUDA 12.4 driver API" in green.reason
    stream = symbol_floor(["cuGreenCtxCreate", "cuGreenCtxStreamCreate"])
    assert stream is not None
    assert stream.driver.startswith("555")  # sglang#8131: a CUDA 12.4 machine's driver lacks it
    assert symbol_floor(["cuInit", "cuLaunchKernel"]) is None  # known to every driver we support: no raise


def test_cell_floor_is_the_higher_one() -> None:
    assert cell_floor("12.8", ["cuGreenCtxCreate"]).driver == "550.54.14"  # type: ignore[union-attr]
    assert cell_floor("13.0", ["cuGreenCtxCreate"]).driver.startswith("580")  # type: ignore[union-attr]
    assert cell_floor("12.8").driver == "525.60.13"  # type: ignore[union-attr]


def test_runs_on_and_forward_compat() -> None:
    floor = cell_floor("13.0")
    assert floor is not None
    assert runs_on("580.95.05", floor, "13.0") is None
    why = runs_on("570.86.15", floor, "13.0")
    assert why is not None
    assert "driver 570.86.15 < 580.65.06" in why
    assert "no forward_compat" in why
    assert runs_on("570.86.15", floor, "13.0", forward_compat=True) is None
    assert "forward compatibility" in (runs_on("470.1", floor, "13.0", forward_compat=True) or "")
    assert driver_key("570.86.15") > driver_key("570.86")
    with pytest.raises(ValueError, match="not a driver version"):
        driver_key("r570")


def test_driver_problems_report_the_cuda13_cells(write_matrix: WriteMatrix) -> None:
    path = write_matrix(_RUNNERS.format(extra='driver = "535.0"'), axes={"cuda": ["12.8", "13.0"]})
    matrix = load(path)
    assert matrix.runners["1x-h200"].driver == "535.0"
    assert matrix.runners["1x-h200"].forward_compat is False
    cells = plan(matrix, {}).cells
    problems = driver_problems(matrix, cells)
    assert sorted(problems) == sorted(c.id for c in cells if c.id.startswith("cu130"))
    assert problems
    assert all(
        p.startswith(
            "unrunnable on every runner kind whose cells globs match it: runner 1x-h200: driver 535.0 < 580.65.06"
        )
        for p in problems.values()
    )
    # the libraries' driver API raises the CUDA 12.8 floor above 535 too
    cu128 = next(c.id for c in cells if c.id.startswith("cu128"))
    more = driver_problems(matrix, cells, {cu128: ["cuGreenCtxCreate"]})
    assert "cuGreenCtxCreate" in more[cu128]


def test_driver_problems_forward_compat_and_no_driver(write_matrix: WriteMatrix) -> None:
    path = write_matrix(_RUNNERS.format(extra='driver = "570.86.15"\nforward_compat = true'),
                        axes={"cuda": ["13.0"]})  # fmt: skip
    matrix = load(path)
    assert matrix.runners["1x-h200"].forward_compat is True
    assert driver_problems(matrix, plan(matrix, {}).cells) == {}
    bare = load(write_matrix(_RUNNERS.format(extra=""), axes={"cuda": ["13.0"]}))
    assert driver_problems(bare, plan(bare, {}).cells) == {}  # a runner that states no driver is not judged


def test_routing_takes_the_first_matching_kind(write_matrix: WriteMatrix) -> None:
    body = (
        _RUNNERS.format(extra='driver = "580.95"')
        + """
[runners.1x-old]
arch = "sm_90"
gpus = 1
labels = ["old"]
cells = ["*"]
driver = "535.0"
"""
    )
    matrix = load(write_matrix(body, axes={"cuda": ["13.0"]}))
    cells = plan(matrix, {}).cells
    assert driver.runner_for(matrix, cells[0].id).name == "1x-h200"  # type: ignore[union-attr]
    assert driver_problems(matrix, cells) == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [("535.0", "must be a string"), ('"r535"', "is not an NVIDIA driver version"),
     ('"570.86.15.1"', "is not an NVIDIA driver version")],
)  # fmt: skip
def test_runner_driver_is_validated(write_matrix: WriteMatrix, value: str, message: str) -> None:
    path = write_matrix(_RUNNERS.format(extra=f"driver = {value}"))
    with pytest.raises(ConfigError, match=message):
        load(path)


def test_runner_forward_compat_is_a_bool(write_matrix: WriteMatrix) -> None:
    with pytest.raises(ConfigError, match="forward_compat"):
        load(write_matrix(_RUNNERS.format(extra='forward_compat = "yes"')))


def test_installed_driver_without_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda _name: None)
    assert driver.installed_driver() is None


def test_plan_says_which_cells_the_routed_runner_cannot_run(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stackfarm plan` reports it before any GPU time is spent: a CUDA 13 cell on a runner with driver 535."""
    from stackfarm.cli import main

    fake_project.suite("00-suite", "pass")
    fake_project.write_matrix(
        [OLD, CU130],
        extra="""
        [runners.1x-old]
        labels = ["self-hosted", "gpu"]
        gpus = 1
        driver = "535.0"
        """,
    )
    # A cell no runner kind can run keeps the plan incomplete (exit 3), a status of its own, no runner.
    assert main(["plan", "--json", "--matrix", str(fake_project.matrix)]) == 3
    doc = json.loads(capsys.readouterr().out)
    problems = doc["driver_problems"]
    assert list(problems) == [cell_id(CU130)]
    assert "535" in problems[cell_id(CU130)]
    by_id = {c["id"]: c for c in doc["cells"]}
    assert (by_id[cell_id(CU130)]["status"], by_id[cell_id(CU130)]["runner"]) == ("unrunnable", None)
    assert (by_id[cell_id(OLD)]["status"], by_id[cell_id(OLD)]["runner"]) == ("run", "1x-old")


def test_route_passes_over_a_kind_whose_driver_is_too_old(write_matrix: WriteMatrix) -> None:
    """The one dispatch rule: the first kind whose globs match and whose driver runs the floor; a cell no such
    kind can run is unrunnable (naming each kind passed over); one no glob matches is unrouted."""
    old = Runner(name="old", labels=("old",), arch="sm_90", gpus=1, cells=("*",), driver="570.86.15")
    new = Runner(name="new", labels=("new",), arch="sm_90", gpus=1, cells=("cu130-*",), driver="580.95.05")
    cu130, cu128 = cell_id(CU130), cell_id(OLD)
    found = driver.route(cu130, "13.0", (old, new))
    assert (found.status, found.runner) == ("run", new)
    assert found.passed_over == ("runner old: driver 570.86.15 < 580.65.06: CUDA 13.0 needs driver >= 580.65.06 "
                                 "(CUDA 13.x) (no forward_compat on this runner)",)  # fmt: skip
    assert driver.route(cu128, "12.8", (old, new)).runner == old
    alone = driver.route(cu130, "13.0", (old,))
    assert (alone.status, alone.runner) == ("unrunnable", None)
    assert "runner old: driver 570.86.15 < 580.65.06" in alone.reason
    # The symbols its libraries loaded at import link raise the floor past a driver the CUDA floor allows.
    green = driver.route(cu128, "12.8", (old,), ["cuCtxGetDevice_v2"])
    assert green.status == "unrunnable"
    assert "cuCtxGetDevice_v2 is a CUDA 13.0 driver API" in green.reason
    assert driver.route(cu128, "12.8", (new,)).status == "unrouted"
    # The kind a verdict names: where it runs, else the first kind its globs match, else none.
    assert (found.named, alone.named, green.named) == (new, old, old)
    assert driver.route(cu128, "12.8", (new,)).named is None
