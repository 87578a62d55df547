"""stackfarm.suitekit: how a suite's testcase says it cannot answer (a skip) or has nothing to answer here."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackfarm.cellspec import CellSpec
from stackfarm.junit import NOT_APPLICABLE
from stackfarm.suitekit import cell_runner, need_gpus

MATRIX = Path(__file__).resolve().parents[1] / "matrix.toml"


def _cell(cell_id: str, matrix: Path | str = MATRIX) -> CellSpec:
    return CellSpec(id=cell_id, values={}, backend="local", components=(), matrix=str(matrix))


def test_a_cell_routed_to_a_one_gpu_runner_is_not_asked_two_gpu_questions() -> None:
    cell = _cell("cu130-torch2.11.0-sk0.4.4-fi0.6.12-sgl0.5.15")  # matrix.toml: [runners.1x-h200], gpus = 1
    with pytest.raises(pytest.skip.Exception) as skipped:
        need_gpus(cell, 2, 1, "tensor parallelism")
    assert str(skipped.value).startswith(NOT_APPLICABLE)
    assert "[runners.1x-h200] has 1 GPU(s)" in str(skipped.value)


def test_a_cell_whose_runner_has_the_gpus_but_this_machine_not_is_unanswered() -> None:
    cell = _cell("cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9")  # [runners.8x-rtx-pro-6000], gpus = 8
    with pytest.raises(pytest.skip.Exception) as skipped:
        need_gpus(cell, 2, 1, "tensor parallelism")
    assert not str(skipped.value).startswith(NOT_APPLICABLE)
    assert "needs 2+ GPUs, this machine has 1" in str(skipped.value)


def test_enough_gpus_asks_nothing() -> None:
    need_gpus(_cell("any"), 2, 8, "tensor parallelism")


def test_without_a_readable_matrix_no_runner_is_known(tmp_path: Path) -> None:
    assert cell_runner(_cell("x", tmp_path / "missing.toml")) is None
    with pytest.raises(pytest.skip.Exception) as skipped:
        need_gpus(_cell("x", tmp_path / "missing.toml"), 2, 1, "tp")
    assert not str(skipped.value).startswith(NOT_APPLICABLE)
