"""plan: axes -> cells, with couple groups, include/exclude rules, cell ids and sglang's own pins.

Matrices are written as small TOML files into tmp_path and loaded, so these tests go through matrix.load too.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import BASE_AXES, WriteMatrix
from stackfarm import matrix, stack
from stackfarm.errors import ConfigError
from stackfarm.plan import (
    Cell,
    Component,
    Plan,
    cell_id,
    components,
    contradictions,
    expand,
    input_hash,
    plan,
    select,
)
from stackfarm.verdict import Contradiction, SourceLine

REPO = Path(__file__).resolve().parents[1]


#: What sglang 0.5.9 pins in its wheel (plus one distribution stackfarm does not track).
PINS_059 = [
    Requirement("torch==2.9.1"),
    Requirement("sgl-kernel==0.3.21"),
    Requirement("flashinfer_python==0.6.3"),
    Requirement("flashinfer_cubin==0.6.3"),
    Requirement("torchao==0.9.0"),
]
PINS_0510 = [
    Requirement("torch==2.9.1"),
    Requirement("sglang-kernel==0.4.1"),
    Requirement("flashinfer_python==0.6.7.post2"),
    Requirement("flashinfer_cubin==0.6.7.post2"),
]

BuildMatrix = Callable[..., matrix.Matrix]


@pytest.fixture
def build(write_matrix: WriteMatrix) -> BuildMatrix:
    """Write a valid matrix (one value per axis unless `axes` says otherwise) plus `body`, and load it."""

    def make(body: str = "", **axes: list[str]) -> matrix.Matrix:
        return matrix.load(write_matrix(body, axes=dict(axes)))

    return make


def ids(cells: tuple[Cell, ...] | list[Cell]) -> list[str]:
    return [c.id for c in cells]


def only_cell(p: Plan) -> Cell:
    assert len(p.cells) == 1, ids(p.cells)
    return p.cells[0]


# --------------------------------------------------------------------------- expansion


def test_single_cell(build: BuildMatrix) -> None:
    m = build()
    p = plan(m, {})
    cell = only_cell(p)
    assert cell.id == "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"
    assert cell.as_dict() == {k: v[0] for k, v in BASE_AXES.items()}
    assert cell["sglang"] == "0.5.9"
    assert cell.origin == "product"
    assert cell.overridden == ()
    assert cell.patch_sets == ()
    assert (p.conflicts, p.excluded, p.warnings) == ((), (), ())


def test_product_without_couples(build: BuildMatrix) -> None:
    axes = {
        "cuda": ["12.8", "13.0"],
        "torch": ["2.8.0", "2.9.1"],
        "sgl_kernel": ["0.3.21", "0.4.1"],
        "sglang": ["0.5.9", "0.5.10"],
    }
    p = plan(build(**axes), {})
    assert len(p.cells) == 2 * 2 * 2 * 1 * 2 * 1
    got = {tuple(c.as_dict()[a] for a in axes) for c in p.cells}
    assert got == set(itertools.product(*axes.values()))
    assert len(set(ids(p.cells))) == len(p.cells)


def test_product_with_a_couple_group(build: BuildMatrix) -> None:
    rows = {("12.8", "2.9.1"), ("13.0", "2.9.1+cu130")}
    m = build(
        """
        [couple.cuda-torch]
        cuda = ["12.8", "13.0"]
        torch = ["2.9.1", "2.9.1+cu130"]
        """,
        cuda=["12.8", "13.0"],
        torch=["2.9.1", "2.9.1+cu130"],
        sglang=["0.5.9", "0.5.10"],
    )
    p = plan(m, {})
    assert len(p.cells) == 2 * 2  # two rows instead of 2 x 2, times sglang
    assert {(c["cuda"], c["torch"]) for c in p.cells} == rows  # coupled axes vary together
    assert {(c["cuda"], c["torch"], c["sglang"]) for c in p.cells} == {
        (*r, s) for r in rows for s in ("0.5.9", "0.5.10")
    }


def test_two_couple_groups(build: BuildMatrix) -> None:
    m = build(
        """
        [couple.cuda-torch]
        cuda = ["12.8", "13.0"]
        torch = ["2.9.1", "2.9.1+cu130"]

        [couple.sglang-pins]
        sglang = ["0.5.9", "0.5.10"]
        sgl_kernel = ["0.3.21", "0.4.1"]
        flashinfer = ["0.6.3", "0.6.7.post2"]
        """,
        cuda=["12.8", "13.0"],
        torch=["2.9.1", "2.9.1+cu130"],
        sglang=["0.5.9", "0.5.10"],
        sgl_kernel=["0.3.21", "0.4.1"],
        flashinfer=["0.6.3", "0.6.7.post2"],
    )
    p = plan(m, {})
    assert sorted(ids(p.cells)) == sorted(
        [
            "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9",
            "cu128-torch2.9.1-sk0.4.1-fi0.6.7.post2-sgl0.5.10",
            "cu130-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9",
            "cu130-torch2.9.1-sk0.4.1-fi0.6.7.post2-sgl0.5.10",
        ]
    )


def test_couple_group_listing_part_of_an_axis(build: BuildMatrix) -> None:
    # A couple row set is what varies: an axis value no row names is not planned.
    m = build(
        """
        [couple.ct]
        cuda = ["12.8"]
        torch = ["2.9.1"]
        """,
        cuda=["12.8", "13.0"],
    )
    assert ids(plan(m, {}).cells) == ["cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"]


def test_real_matrix_plan() -> None:
    m = matrix.load(REPO / "matrix.toml")
    p = plan(m, {"0.5.9": PINS_059, "0.5.10": PINS_0510})
    product = {c.id for c in p.cells if c.origin == "product"}
    assert product == {
        "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9",
        "cu128-torch2.9.1-sk0.4.1-fi0.6.7.post2-sgl0.5.10",
        "cu130-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9",
        "cu130-torch2.9.1-sk0.4.1-fi0.6.7.post2-sgl0.5.10",
    }
    cu130 = next(c for c in p.cells if c.id == "cu130-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9")
    torch = next(comp for comp in cu130.components if comp.distribution == "torch")
    assert (torch.version, torch.index) == ("2.9.1+cu130", "pytorch-cu130")
    # The include keeping the old kernels under sglang 0.5.10 contradicts 0.5.10's own pins.
    (conflict,) = (c for c in p.conflicts if c.cell.id == "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.10")
    assert conflict.cell.origin == "include"
    assert any(
        "sglang-kernel==0.4.1" in problem and "sgl-kernel 0.3.21" in problem for problem in conflict.problems
    )
    assert p.excluded == ()
    assert p.warnings == ()


# --------------------------------------------------------------------------- cell ids


def test_cell_id_format() -> None:
    values = {
        "cuda": "12.8",
        "torch": "2.9.1",
        "sgl_kernel": "0.3.21",
        "flashinfer": "0.6.3",
        "sglang": "0.5.9",
        "python": "3.11",
    }
    assert cell_id(values) == "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"
    assert cell_id(values, with_python=True) == "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9-py3.11"
    assert (
        cell_id({**values, "cuda": "13.0", "torch": "2.9.1+cu130"})
        == "cu130-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"
    )
    assert (
        cell_id({**values, "flashinfer": "0.6.7.post2"}) == "cu128-torch2.9.1-sk0.3.21-fi0.6.7.post2-sgl0.5.9"
    )


def test_cell_id_drops_torch_local_label(build: BuildMatrix) -> None:
    m = build(cuda=["13.0"], torch=["2.9.1+cu130"])
    cell = only_cell(plan(m, {}))
    assert cell.id == "cu130-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"
    assert cell["torch"] == "2.9.1+cu130"  # the value keeps it


def test_python_suffix_only_with_several_pythons(build: BuildMatrix) -> None:
    assert ids(plan(build(python=["3.12"]), {}).cells) == ["cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"]
    p = plan(build(python=["3.11", "3.12"]), {})
    assert sorted(ids(p.cells)) == [
        "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9-py3.11",
        "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9-py3.12",
    ]


def test_duplicate_cell_ids_are_refused(build: BuildMatrix, tmp_path: Path) -> None:
    m = build(torch=["2.9.1", "2.9.1+cu130"])  # one cuda, torch uncoupled: both ids read torch2.9.1
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as info:
        plan(m, {})
    assert sorted(tmp_path.rglob("*")) == before
    exc = info.value
    assert "two combinations share the cell id `cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9`" in str(exc)
    assert "couple" in exc.fix
    assert "[couple.cuda-torch]" in str(exc)
    assert exc.path == tmp_path / "matrix.toml"
    with pytest.raises(ConfigError):
        expand(m)


def test_coupling_resolves_duplicate_ids(build: BuildMatrix) -> None:
    m = build(
        """
        [couple.cuda-torch]
        cuda = ["12.8", "13.0"]
        torch = ["2.9.1", "2.9.1+cu130"]
        """,
        cuda=["12.8", "13.0"],
        torch=["2.9.1", "2.9.1+cu130"],
    )
    assert sorted(ids(plan(m, {}).cells)) == [
        "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9",
        "cu130-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9",
    ]


# --------------------------------------------------------------------------- exclude / include


def test_exclude_with_patterns(build: BuildMatrix) -> None:
    m = build(
        """
        [[exclude]]
        sglang = "0.5.1*"
        sgl_kernel = "0.3.*"
        reason = "0.5.1x needs the renamed kernel"
        """,
        sgl_kernel=["0.3.21", "0.4.1"],
        sglang=["0.5.9", "0.5.10"],
    )
    p = plan(m, {})
    assert sorted(ids(p.cells)) == [
        "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9",
        "cu128-torch2.9.1-sk0.4.1-fi0.6.3-sgl0.5.10",
        "cu128-torch2.9.1-sk0.4.1-fi0.6.3-sgl0.5.9",
    ]
    (excluded,) = p.excluded
    assert excluded.cell.id == "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.10"
    assert excluded.reason == "0.5.1x needs the renamed kernel"
    assert p.warnings == ()


def test_exclude_without_reason_explains_itself(build: BuildMatrix) -> None:
    m = build('\n[[exclude]]\ncuda = "13.?"\n', cuda=["12.8", "13.0"])
    p = plan(m, {})
    assert ids(p.cells) == ["cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"]
    assert [(e.cell["cuda"], e.reason) for e in p.excluded] == [("13.0", "excluded by [[exclude]] cuda=13.?")]


def test_exclude_that_matches_nothing_warns_with_file_and_line(build: BuildMatrix, tmp_path: Path) -> None:
    m = build('\n[[exclude]]\ncuda = "11.*"\n')
    path = tmp_path / "matrix.toml"
    line = path.read_text().splitlines().index("[[exclude]]") + 1
    p = plan(m, {})
    assert len(p.cells) == 1
    assert p.excluded == ()
    assert p.warnings == (f"{path}:{line}: [[exclude]] cuda=11.* matches no cell",)


def test_second_unused_exclude_warns_with_its_own_line(build: BuildMatrix, tmp_path: Path) -> None:
    m = build('\n[[exclude]]\ncuda = "13.*"\n\n[[exclude]]\nsglang = "0.4.*"\n', cuda=["12.8", "13.0"])
    path = tmp_path / "matrix.toml"
    second = [n for n, t in enumerate(path.read_text().splitlines(), 1) if t == "[[exclude]]"][1]
    p = plan(m, {})
    assert p.warnings == (f"{path}:{second}: [[exclude]] sglang=0.4.* matches no cell",)


def test_include_adds_a_cell(build: BuildMatrix) -> None:
    m = build(
        """
        [[include]]
        cuda = "12.8"
        torch = "2.9.1"
        sgl_kernel = "0.3.21"
        flashinfer = "0.6.3"
        sglang = "0.5.10"
        reason = "keep the current kernels"
        """
    )
    p = plan(m, {})
    assert [(c.id, c.origin) for c in p.cells] == [
        ("cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9", "product"),
        ("cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.10", "include"),
    ]
    assert p.cells[1]["python"] == "3.11"  # an include without python takes the first python


def test_include_of_an_existing_cell_is_not_duplicated(build: BuildMatrix) -> None:
    m = build(
        """
        [[include]]
        cuda = "12.8"
        torch = "2.9.1"
        sgl_kernel = "0.3.21"
        flashinfer = "0.6.3"
        sglang = "0.5.9"
        """
    )
    p = plan(m, {})
    assert [(c.id, c.origin) for c in p.cells] == [("cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9", "product")]


def test_include_with_several_pythons_gets_the_suffix(build: BuildMatrix) -> None:
    m = build(
        """
        [[include]]
        cuda = "12.8"
        torch = "2.9.1"
        sgl_kernel = "0.3.21"
        flashinfer = "0.6.3"
        sglang = "0.5.10"
        python = "3.12"
        """,
        python=["3.11", "3.12"],
    )
    p = plan(m, {})
    assert [c.id for c in p.cells if c.origin == "include"] == [
        "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.10-py3.12"
    ]
    assert len(p.cells) == 3


# --------------------------------------------------------------------------- components


@pytest.mark.parametrize(
    ("version", "distribution"),
    [
        ("0.3.21", "sgl-kernel"),
        ("0.3.99", "sgl-kernel"),
        ("0.4.0", "sglang-kernel"),
        ("0.4.1", "sglang-kernel"),
    ],
)
def test_kernel_distribution(version: str, distribution: str) -> None:
    """sgl-kernel was renamed sglang-kernel at 0.4.0: the stack table names the one of each release."""
    assert stack.distributions("sgl_kernel", version)[0] == distribution


def test_components(build: BuildMatrix) -> None:
    m = build(
        """
        [indexes.pypi]
        url = "https://pypi.org/simple"
        default = true

        [indexes.pytorch-cu130]
        url = "https://download.pytorch.org/whl/cu130"

        [[route]]
        requirement = "torch==2.9.1+cu130"
        index = "pytorch-cu130"
        """,
        cuda=["13.0"],
        torch=["2.9.1+cu130"],
        sgl_kernel=["0.4.1"],
        flashinfer=["0.6.7.post2"],
        sglang=["0.5.10"],
    )
    cell = only_cell(plan(m, {}))
    assert cell.components == (
        Component(axis="torch", distribution="torch", version="2.9.1+cu130", index="pytorch-cu130"),
        Component(axis="sgl_kernel", distribution="sglang-kernel", version="0.4.1", index="pypi"),
        Component(axis="flashinfer", distribution="flashinfer-python", version="0.6.7.post2", index="pypi"),
        Component(axis="flashinfer", distribution="flashinfer-cubin", version="0.6.7.post2", index="pypi"),
        Component(axis="sglang", distribution="sglang", version="0.5.10", index="pypi"),
    )
    assert components(m, cell.as_dict()) == cell.components
    old = components(m, {**cell.as_dict(), "sgl_kernel": "0.3.21"})
    assert [c.distribution for c in old if c.axis == "sgl_kernel"] == ["sgl-kernel"]


def test_patch_sets_follow_the_sglang_version(build: BuildMatrix, tmp_path: Path) -> None:
    (tmp_path / "patches" / "fix").mkdir(parents=True)
    (tmp_path / "patches" / "fix" / "series").write_text("0001.patch\n", encoding="utf-8")
    m = build('\n[patches.fix]\napplies_to = "sglang>=0.5.9,<0.5.10"\n', sglang=["0.5.9", "0.5.10"])
    p = plan(m, {})
    assert {c["sglang"]: c.patch_sets for c in p.cells} == {"0.5.9": ("fix",), "0.5.10": ()}


# --------------------------------------------------------------------------- conflicts with sglang's pins


def test_cell_matching_the_pins_is_runnable(build: BuildMatrix) -> None:
    p = plan(build(), {"0.5.9": PINS_059})
    assert ids(p.cells) == ["cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"]
    assert p.conflicts == ()
    assert p.cells[0].overridden == ()


def test_renamed_kernel_is_a_conflict_naming_both(build: BuildMatrix) -> None:
    p = plan(build(sgl_kernel=["0.4.1"]), {"0.5.9": PINS_059})
    assert p.cells == ()
    (conflict,) = p.conflicts
    assert conflict.cell.id == "cu128-torch2.9.1-sk0.4.1-fi0.6.3-sgl0.5.9"
    assert conflict.problems == (
        "sglang 0.5.9 requires sgl-kernel==0.3.21; the cell has sglang-kernel 0.4.1",
    )


def test_version_mismatch_is_a_conflict(build: BuildMatrix) -> None:
    p = plan(build(flashinfer=["0.6.7.post2"]), {"0.5.9": PINS_059})
    assert p.cells == ()
    (conflict,) = p.conflicts
    assert conflict.problems == (
        "sglang 0.5.9 requires flashinfer_python==0.6.3; the cell has flashinfer-python 0.6.7.post2",
        "sglang 0.5.9 requires flashinfer_cubin==0.6.3; the cell has flashinfer-cubin 0.6.7.post2",
    )


def test_torch_local_version_satisfies_the_public_pin(build: BuildMatrix) -> None:
    # PEP 440: ==2.9.1 without a local label matches 2.9.1+cu130
    p = plan(build(cuda=["13.0"], torch=["2.9.1+cu130"]), {"0.5.9": PINS_059})
    assert ids(p.cells) == ["cu130-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"]
    assert p.conflicts == ()


def test_torch_mismatch(build: BuildMatrix) -> None:
    p = plan(build(torch=["2.8.0"]), {"0.5.9": PINS_059})
    (conflict,) = p.conflicts
    assert conflict.problems == ("sglang 0.5.9 requires torch==2.9.1; the cell has torch 2.8.0",)


def test_a_conflict_carries_its_axis_requirement_and_matrix_line(build: BuildMatrix) -> None:
    m = build(torch=["2.8.0"])
    (conflict,) = plan(m, {"0.5.9": PINS_059}).conflicts
    text = "sglang 0.5.9 requires torch==2.9.1; the cell has torch 2.8.0"
    assert conflict.contradictions == (Contradiction(axis="torch", requirement="torch==2.9.1", text=text),)
    # [axes] is line 1, cuda line 2, torch line 3 (conftest.write_matrix)
    assert conflict.declared_at == SourceLine(path=str(m.path), line=3)


def test_a_conflict_made_by_an_include_points_at_the_include(build: BuildMatrix) -> None:
    m = build(
        """
        [[include]]
        cuda = "12.8"
        torch = "2.9.1"
        sgl_kernel = "0.4.1"
        flashinfer = "0.6.3"
        sglang = "0.5.9"
        reason = "the renamed kernel on the old sglang"
        """,
    )
    (conflict,) = plan(m, {"0.5.9": PINS_059}).conflicts
    assert [(c.axis, c.requirement) for c in conflict.contradictions] == [
        ("sgl_kernel", "sgl-kernel==0.3.21")
    ]
    header = m.path.read_text().splitlines().index("[[include]]") + 1
    assert conflict.declared_at == SourceLine(path=str(m.path), line=header)


def test_unrelated_pins_are_ignored(build: BuildMatrix) -> None:
    cell = only_cell(plan(build(), {}))
    assert _problems(cell, [Requirement("torchao==0.1.0"), Requirement("numpy<2")]) == []
    assert _problems(cell, PINS_059) == []


def test_pins_of_another_sglang_do_not_apply(build: BuildMatrix) -> None:
    p = plan(build(sgl_kernel=["0.4.1"]), {"0.5.10": PINS_0510})
    assert ids(p.cells) == ["cu128-torch2.9.1-sk0.4.1-fi0.6.3-sgl0.5.9"]


def test_pin_names_are_normalised(build: BuildMatrix) -> None:
    cell = only_cell(plan(build(), {}))
    pins = [
        Requirement("Torch==2.8.0"),
        Requirement("SGL_Kernel==0.3.21"),
        Requirement("FlashInfer.Python==0.6.3"),
    ]
    assert _problems(cell, pins) == [
        ("torch", "sglang 0.5.9 requires Torch==2.8.0; the cell has torch 2.9.1")
    ]


def test_override_turns_a_conflict_into_a_runnable_cell(build: BuildMatrix) -> None:
    m = build(
        """
        [[override]]
        axis = "flashinfer"
        when = { sglang = "0.5.9" }
        reason = "flashinfer 0.6.7 fixes the sm_120 allreduce fusion"
        """,
        flashinfer=["0.6.7.post2"],
    )
    p = plan(m, {"0.5.9": PINS_059})
    assert p.conflicts == ()
    cell = only_cell(p)
    assert cell.overridden == (
        "sglang 0.5.9 requires flashinfer_python==0.6.3; the cell has flashinfer-python 0.6.7.post2"
        " (overridden: flashinfer 0.6.7 fixes the sm_120 allreduce fusion)",
        "sglang 0.5.9 requires flashinfer_cubin==0.6.3; the cell has flashinfer-cubin 0.6.7.post2"
        " (overridden: flashinfer 0.6.7 fixes the sm_120 allreduce fusion)",
    )


def test_override_only_covers_its_axis_and_its_cells(build: BuildMatrix) -> None:
    m = build(
        """
        [[override]]
        axis = "flashinfer"
        when = { sglang = "0.5.9" }
        reason = "newer flashinfer"
        """,
        flashinfer=["0.6.7.post2"],
        torch=["2.8.0"],
        sglang=["0.5.9", "0.5.10"],
    )
    p = plan(m, {"0.5.9": PINS_059, "0.5.10": PINS_0510})
    assert p.cells == ()
    by_sglang = {c.cell["sglang"]: c for c in p.conflicts}
    # 0.5.9: flashinfer is overridden, torch is not
    assert by_sglang["0.5.9"].problems == ("sglang 0.5.9 requires torch==2.9.1; the cell has torch 2.8.0",)
    assert len(by_sglang["0.5.9"].cell.overridden) == 2
    # 0.5.10: `when` does not match, so nothing is overridden
    assert by_sglang["0.5.10"].cell.overridden == ()
    assert len(by_sglang["0.5.10"].problems) == 2  # torch and the kernel rename


def test_override_without_when_covers_every_cell(build: BuildMatrix) -> None:
    m = build('\n[[override]]\naxis = "torch"\nreason = "try the next torch"\n', torch=["2.8.0"])
    cell = only_cell(plan(m, {"0.5.9": PINS_059}))
    assert cell.overridden == (
        "sglang 0.5.9 requires torch==2.9.1; the cell has torch 2.8.0 (overridden: try the next torch)",
    )


# --------------------------------------------------------------------------- select


@pytest.fixture
def wide_plan(build: BuildMatrix) -> Plan:
    m = build(
        '\n[[exclude]]\ncuda = "12.9"\nsglang = "0.5.10"\n',
        cuda=["12.8", "12.9", "13.0"],
        sglang=["0.5.9", "0.5.10"],
        sgl_kernel=["0.3.21", "0.4.1"],
    )
    return plan(m, {"0.5.9": PINS_059})


def test_select_without_pattern_keeps_everything(wide_plan: Plan) -> None:
    assert select(wide_plan, None) is wide_plan
    assert select(wide_plan, "") is wide_plan


def test_select_with_a_glob(wide_plan: Plan) -> None:
    chosen = select(wide_plan, "cu130-*")
    assert chosen.cells
    assert all(c.id.startswith("cu130-") for c in chosen.cells)
    assert {c.id for c in chosen.cells} == {c.id for c in wide_plan.cells if c["cuda"] == "13.0"}
    assert {c.cell.id for c in chosen.conflicts} == {
        c.cell.id for c in wide_plan.conflicts if c.cell["cuda"] == "13.0"
    }
    assert chosen.excluded == ()
    assert chosen.warnings == wide_plan.warnings


def test_select_with_alternatives(wide_plan: Plan) -> None:
    chosen = select(wide_plan, "cu128-*-sgl0.5.10, *-sk0.3.21-*-sgl0.5.9 ,cu129-*")
    expected = {
        c.id
        for c in wide_plan.cells
        if (c["cuda"] == "12.8" and c["sglang"] == "0.5.10")
        or (c["sgl_kernel"] == "0.3.21" and c["sglang"] == "0.5.9")
        or c["cuda"] == "12.9"
    }
    assert {c.id for c in chosen.cells} == expected
    assert {e.cell.id for e in chosen.excluded} == {e.cell.id for e in wide_plan.excluded}  # all cu129
    assert len(chosen.excluded) == 2


def test_select_matching_nothing(wide_plan: Plan) -> None:
    chosen = select(wide_plan, "cu999-*")
    assert (chosen.cells, chosen.conflicts, chosen.excluded) == ((), (), ())


# --------------------------------------------------------------------------- input_hash


def test_input_hash_is_stable_across_dict_order() -> None:
    a = {"cell": "cu128", "components": {"torch": "2.9.1", "sglang": "0.5.9"}, "suites": ["00-stack"]}
    b = {"suites": ["00-stack"], "components": {"sglang": "0.5.9", "torch": "2.9.1"}, "cell": "cu128"}
    assert input_hash(a) == input_hash(b)
    assert len(input_hash(a)) == 64
    assert int(input_hash(a), 16) >= 0
    assert input_hash(a) == input_hash(json.loads(json.dumps(a)))


def test_input_hash_changes_with_any_value() -> None:
    base = {
        "cell": "cu128",
        "components": {"torch": "2.9.1", "sglang": "0.5.9"},
        "suites": ["00-stack"],
        "n": 1,
    }
    variants = [
        {**base, "cell": "cu130"},
        {**base, "components": {"torch": "2.9.1+cu130", "sglang": "0.5.9"}},
        {**base, "components": {"torch": "2.9.1", "sglang": "0.5.10"}},
        {**base, "suites": ["00-stack", "10-perf"]},
        {**base, "suites": []},
        {**base, "n": 2},
        {**base, "n": "1"},
        {**base, "extra": None},
        {k: v for k, v in base.items() if k != "n"},
    ]
    hashes = {input_hash(base)} | {input_hash(v) for v in variants}
    assert len(hashes) == len(variants) + 1


def test_input_hash_of_paths_and_objects() -> None:
    assert input_hash({"p": Path("/a/b")}) == input_hash({"p": "/a/b"})  # default=str


# --------------------------------------------------------------------------- size


def test_a_thousand_cells(build: BuildMatrix) -> None:
    m = build(
        cuda=[f"12.{i}" for i in range(10)],
        sgl_kernel=[f"0.3.{i}" for i in range(10)],
        flashinfer=[f"0.6.{i}" for i in range(10)],
    )
    p = plan(m, {"0.5.9": PINS_059})
    assert len(p.cells) + len(p.conflicts) == 1000
    assert len({c.id for c in p.cells} | {c.cell.id for c in p.conflicts}) == 1000
    # only sgl_kernel 0.3.21 / flashinfer 0.6.3 would satisfy the pins, and neither is in these axes
    assert len(p.conflicts) == 1000
    unpinned = plan(m, {})
    assert len(unpinned.cells) == 1000
    assert len(select(unpinned, "cu125-*").cells) == 100


def _problems(cell: Cell, pins: list[Requirement]) -> list[tuple[str, str]]:
    """(axis, text) of each contradiction of the cell against `pins`."""
    return [(c.axis, c.text) for c in contradictions(cell, pins)]
