"""The stack table: one entry per component, and an optional axis added by that entry alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import WriteMatrix
from stackfarm import stack
from stackfarm.artifacts import Cache
from stackfarm.errors import ConfigError
from stackfarm.matrix import load
from stackfarm.plan import pin_problems, plan
from stackfarm.resolve import Resolver


def test_every_part_is_named_once() -> None:
    assert len(set(stack.AXES)) == len(stack.AXES)
    assert len({p.id_prefix for p in stack.PARTS}) == len(stack.PARTS)
    names = [n for p in stack.PARTS for n in p.names]
    assert len(names) == len(set(names)), "a distribution belongs to one axis"
    assert set(stack.REQUIRED_AXES) == {"cuda", "torch", "sgl_kernel", "flashinfer", "sglang", "python"}


def test_renames_map_back_to_their_axis() -> None:
    assert stack.distributions("sgl_kernel", "0.3.21") == ("sgl-kernel",)
    assert stack.distributions("sgl_kernel", "0.4.0") == ("sglang-kernel",)
    assert stack.axis_of("SGL_Kernel") == "sgl_kernel"
    assert stack.axis_of("sglang-kernel") == "sgl_kernel"
    assert stack.axis_of("numpy") is None


def test_docker_stages_in_stage_order() -> None:
    stages = stack.docker_stages()
    assert list(stages) == ["torch", "kernels", "sglang"]
    assert stages["kernels"][:2] == ("sgl_kernel", "flashinfer")
    # every wheel axis is installed by some stage
    assert {a for axes in stages.values() for a in axes} == set(stack.WHEEL_AXES)


def test_properties_the_suites_read() -> None:
    assert set(stack.with_property("cuda_libraries")) == {"torch", "sgl-kernel", "sglang-kernel"}
    assert "flashinfer-cubin" in stack.with_property("scanned")
    assert set(stack.PINNED_AXES) == {"torch", "sgl_kernel", "flashinfer"}


def test_cell_id_is_unchanged_without_optional_axes() -> None:
    values = {"cuda": "12.8", "torch": "2.9.1+cu128", "sgl_kernel": "0.3.21", "flashinfer": "0.6.3"}
    assert stack.cell_id({**values, "sglang": "0.5.9", "python": "3.11"}) == (
        "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"
    )


# --------------------------------------------------------------------------- an optional axis, end to end


def test_a_matrix_without_the_optional_axis_has_no_such_component(write_matrix: WriteMatrix) -> None:
    cell = plan(load(write_matrix()), {}).cells[0]
    assert "nccl" not in cell.as_dict()
    assert [c.distribution for c in cell.components] == [
        "torch", "sgl-kernel", "flashinfer-python", "flashinfer-cubin", "sglang",
    ]  # fmt: skip


def test_the_optional_nccl_axis_adds_its_wheel_per_cuda_major(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        'nccl = ["2.27.3"]\n\n[couple.cuda-torch]\ncuda = ["12.8", "13.0"]\ntorch = ["2.9.1", "2.11.0"]\n',
        axes={"cuda": ["12.8", "13.0"], "torch": ["2.9.1", "2.11.0"]},
    )
    cells = {c["cuda"]: c for c in plan(load(path), {}).cells}
    assert cells["12.8"].id == "cu128-torch2.9.1-nccl2.27.3-sk0.3.21-fi0.6.3-sgl0.5.9"
    nccl = {c["cuda"]: [x for x in c.components if x.axis == "nccl"] for c in cells.values()}
    assert [(x.distribution, x.version) for x in nccl["12.8"]] == [("nvidia-nccl-cu12", "2.27.3")]
    assert [(x.distribution, x.version) for x in nccl["13.0"]] == [("nvidia-nccl-cu13", "2.27.3")]


def test_an_optional_axis_is_looked_up_for_each_cuda(
    write_matrix: WriteMatrix, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = write_matrix('nccl = ["2.27.3"]\n', axes={"cuda": ["12.8"]})
    asked: list[tuple[str, str]] = []
    resolver = Resolver(load(path), Cache(tmp_path / "cache"))
    monkeypatch.setattr(
        resolver, "artifact", lambda comp, _py: asked.append((comp.distribution, comp.version))
    )
    resolver.check_axes()
    assert ("nvidia-nccl-cu12", "2.27.3") in asked
    assert ("nvidia-nccl-cu13", "2.27.3") not in asked


def test_an_optional_axis_cannot_be_overridden(write_matrix: WriteMatrix) -> None:
    path = write_matrix('nccl = ["2.27.3"]\n\n[[override]]\naxis = "nccl"\nreason = "x"\n')
    with pytest.raises(ConfigError, match="override axis `nccl` cannot be overridden"):
        load(path)


def test_a_pin_on_an_axis_the_matrix_lacks_is_no_conflict(write_matrix: WriteMatrix) -> None:
    from packaging.requirements import Requirement

    cell = plan(load(write_matrix()), {}).cells[0]
    assert pin_problems(cell, [Requirement("flashinfer-jit-cache==0.6.3")]) == []
