"""The stack table: one entry per component, and an optional axis added by that entry alone."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conftest import WriteMatrix
from stackfarm import families, stack
from stackfarm.artifacts import Cache
from stackfarm.errors import ConfigError
from stackfarm.matrix import load
from stackfarm.plan import contradictions, plan
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
    assert set(stack.with_property("scanned")) == {
        "torch", "sgl-kernel", "sglang-kernel", "flashinfer-python", "flashinfer-cubin"
    }  # fmt: skip
    assert set(stack.PINNED_AXES) == {"torch", "sgl_kernel", "flashinfer"}
    with pytest.raises(KeyError, match="not a suite-facing flag"):
        stack.with_property("optional")


def test_flashinfer_jit_cache_is_neither_scanned_nor_a_cuda_library() -> None:
    """What the suites did before the table was their owner: 10-capability scanned torch, sgl-kernel and
    flashinfer-python/-cubin, 00-stack checked the cudart of torch and sgl-kernel. The jit-cache's AOT modules
    are built per GPU family and picked per GPU: the every-unit scan would fail those never loaded there."""
    part = stack.BY_AXIS["flashinfer_jit_cache"]
    assert not part.scanned
    assert not part.cuda_libraries
    assert "flashinfer-jit-cache" not in stack.with_property("scanned")


# --------------------------------------------------------------------------- the suites read the table

SUITES = Path(__file__).resolve().parents[1] / "suites"
#: The suites that read the stack table's flags, and the files that hold their lists.
READERS = ("00-stack", "10-capability", "15-toolchain")


def _suite_module(path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A suite's module imported from its file (its folder on sys.path, as pytest's rootdir-less import has it)."""
    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location(
        f"_suite_{path.parent.name}_{path.stem}".replace("-", "_"), path
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_list_the_suites_use_comes_from_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    sgl_kernel = stack.BY_AXIS["sgl_kernel"].names
    found = _suite_module(SUITES / "00-stack" / "test_stack.py", monkeypatch)
    assert stack.with_property("cuda_libraries") == found._CUDA_LIBRARIES
    found = _suite_module(SUITES / "10-capability" / "capability_findings.py", monkeypatch)
    assert stack.with_property("scanned") == found._BINARY_COMPONENTS
    assert sgl_kernel == found._KERNELS
    found = _suite_module(SUITES / "10-capability" / "test_capability.py", monkeypatch)
    assert set(found._KERNELS) == set(sgl_kernel)
    assert found._KERNELS[0] == "sglang-kernel", "check_installed tries the current name first"


def _literal_lists(path: Path) -> list[tuple[int, list[str]]]:
    """(line, names) of each tuple, list or set literal in `path` naming two or more stack distributions."""
    names = set(stack.DISTRIBUTION_AXIS)
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            strings = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len([s for s in strings if s in names]) >= 2:
                out.append((node.lineno, strings))
    return out


@pytest.mark.parametrize("suite", READERS)
def test_the_suites_keep_no_list_of_stack_distributions(suite: str) -> None:
    """A list of the stack's distributions in a suite is a copy of the table that can drift (it did: the two
    lists disagreed over flashinfer-jit-cache); they read stackfarm.stack instead."""
    kept = {
        str(p.relative_to(SUITES)): found
        for p in sorted((SUITES / suite).glob("*.py"))
        if (found := _literal_lists(p))
    }
    assert kept == {}


def test_the_families_declare_the_flags_they_read() -> None:
    registry = families.load(SUITES)
    for family in registry.values():
        unknown = set(family.needs.stack_flags) - set(stack.SUITE_FLAGS)
        assert not unknown, f"{family.name} declares stack flags the table does not have: {unknown}"
    assert registry["10-capability"].needs.stack_flags == ("scanned",)
    assert registry["15-toolchain"].needs.stack_flags == ()


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
    assert contradictions(cell, [Requirement("flashinfer-jit-cache==0.6.3")]) == []
