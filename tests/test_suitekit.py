"""stackfarm.suitekit: how a suite's testcase says it cannot answer (a skip) or has nothing to answer here."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from stackfarm.cellspec import CellSpec, InstalledComponent
from stackfarm.driver import routed_runner
from stackfarm.junit import NOT_APPLICABLE
from stackfarm.matrix import load
from stackfarm.suitekit import NA, NotApplicableSkip, cell_runner, check_installed, need_gpus, not_applicable

MATRIX = Path(__file__).resolve().parents[1] / "matrix.toml"
#: matrix.toml routes it to [runners.1x-h200], gpus = 1.
ONE_GPU_CELL = "cu130-torch2.11.0-sk0.4.4-fi0.6.12-sgl0.5.15"


def _cell(cell_id: str, matrix: Path | str = MATRIX) -> CellSpec:
    """The cell as the runner hands it over: with the runner kind its CUDA floor routes it to (CellSpec.runner_kind,
    as the verdict's inputs hash it); none where the matrix cannot be read or declares no kind for it."""
    path = Path(matrix)
    cuda = f"{cell_id[2:4]}.{cell_id[4]}" if cell_id.startswith("cu") else ""  # cu128 -> 12.8
    kind = routed_runner(load(path), cell_id, cuda) if path.is_file() else None
    return CellSpec(
        id=cell_id,
        values={},
        backend="local",
        components=(),
        matrix=str(matrix),
        runner=kind.name if kind else "",
        runner_kind=asdict(kind) if kind else None,
    )


def test_a_cell_routed_to_a_one_gpu_runner_is_not_asked_two_gpu_questions() -> None:
    """This machine is the kind (1 GPU detected, [runners.1x-h200] gpus = 1): no run of the cell is asked."""
    with pytest.raises(NotApplicableSkip) as skipped:
        need_gpus(_cell(ONE_GPU_CELL), 2, 1, "tensor parallelism")
    assert skipped.value.na is NA.RUNNER_GPUS
    assert str(skipped.value).startswith(NOT_APPLICABLE)
    assert "[runners.1x-h200] has 1 GPU(s)" in str(skipped.value)


def test_a_machine_that_is_not_the_cells_runner_kind_leaves_the_question_unanswered() -> None:
    """0 GPUs detected is not a [runners.1x-h200] machine (1 GPU): what this machine lacks says nothing about
    the kind, so the 2-GPU question is a plain skip that names both counts."""
    with pytest.raises(pytest.skip.Exception) as skipped:
        need_gpus(_cell(ONE_GPU_CELL), 2, 0, "tensor parallelism")
    assert not isinstance(skipped.value, NotApplicableSkip)
    message = str(skipped.value)
    assert message.startswith("needs 2+ GPUs, this machine has 0: tensor parallelism")
    assert "[runners.1x-h200] has 1 GPU(s), but this machine (0 GPU(s)) is not that kind" in message


def test_a_cell_whose_runner_has_the_gpus_but_this_machine_not_is_unanswered() -> None:
    cell = _cell("cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9")  # [runners.8x-rtx-pro-6000], gpus = 8
    with pytest.raises(pytest.skip.Exception) as skipped:
        need_gpus(cell, 2, 1, "tensor parallelism")
    assert not isinstance(skipped.value, NotApplicableSkip)
    assert not str(skipped.value).startswith(NOT_APPLICABLE)
    assert "needs 2+ GPUs, this machine has 1" in str(skipped.value)


def test_enough_gpus_asks_nothing() -> None:
    need_gpus(_cell("any"), 2, 8, "tensor parallelism")


def test_the_suite_reads_the_kind_the_runner_handed_over_not_the_matrix(tmp_path: Path) -> None:
    handed = _cell(ONE_GPU_CELL)
    moved = CellSpec(**{**handed.__dict__, "matrix": str(tmp_path / "gone.toml")})
    assert cell_runner(moved) == cell_runner(handed) is not None, "matrix.toml is not read again"


def test_without_a_readable_matrix_no_runner_is_known(tmp_path: Path) -> None:
    assert cell_runner(_cell("x", tmp_path / "missing.toml")) is None
    with pytest.raises(pytest.skip.Exception) as skipped:
        need_gpus(_cell("x", tmp_path / "missing.toml"), 2, 1, "tp")
    assert not isinstance(skipped.value, NotApplicableSkip)
    assert not str(skipped.value).startswith(NOT_APPLICABLE)


def test_not_applicable_raises_its_own_skip_with_the_class() -> None:
    with pytest.raises(NotApplicableSkip) as skipped:
        not_applicable(NA.FEATURE_ABSENT, "the release has no such gate")
    assert isinstance(skipped.value, pytest.skip.Exception)
    assert (skipped.value.na, skipped.value.text) == (NA.FEATURE_ABSENT, "the release has no such gate")
    assert str(skipped.value) == "n/a: the release has no such gate"


def test_not_applicable_without_a_class_is_a_plain_skip() -> None:
    """The old call, a text alone: nothing says which reason it is, so it is an unanswered skip."""
    with pytest.raises(pytest.skip.Exception) as skipped:
        not_applicable("the cell has no flashinfer")  # type: ignore[arg-type]  # the old, untyped call
    assert not isinstance(skipped.value, NotApplicableSkip)
    assert str(skipped.value) == "n/a: the cell has no flashinfer"


def test_a_component_the_cell_lacks_does_not_apply() -> None:
    cell = CellSpec(
        id="x", values={}, backend="local",
        components=(InstalledComponent(axis="torch", distribution="torch", version="2.9.1", filename="",
                                       sha256="", source="", root=""),),
    )  # fmt: skip
    with pytest.raises(NotApplicableSkip) as skipped:
        check_installed(cell, ("flashinfer-python",))
    assert skipped.value.na is NA.COMPONENT_ABSENT
    assert str(skipped.value) == "n/a: the cell has no flashinfer-python"


def test_every_class_has_a_distinct_kebab_case_value() -> None:
    values = [c.value for c in NA]
    assert len(set(values)) == len(values)
    assert all(v == v.lower() and " " not in v and "_" not in v for v in values)
