"""15-toolchain's wheels come from the runner (stackfarm.handover.hand_over): family.py's hook names them with the
rules the analysis applies, the runner resolves them on the matrix's index, and what it cannot have arrives in
CellSpec.unavailable with the reason: the suite's finding is unanswered with that reason, never a cell error."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fakestack import write_wheel
from stackfarm import families
from stackfarm.analysis.jitfindings import analyse
from stackfarm.artifacts import Cache
from stackfarm.cellspec import CellSpec, InstalledComponent
from stackfarm.handover import Handed, hand_over
from stackfarm.matrix import Suite, load
from stackfarm.resolve import Resolver

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "suites" / "15-toolchain"
TORCH_PINS = ("triton==3.5.1", 'nvidia-cuda-nvrtc-cu12==12.8.93; platform_system == "Linux"')


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKFARM_CACHE", str(tmp_path / "cache"))


def _handed(tmp_path: Path, unreachable: dict[tuple[str, str], str] | None = None) -> Handed:
    """A local index with torch 2.9.1 (pinning Triton 3.5.1 and CUDA 12.8's NVRTC) and Triton 3.5.1, no nvcc."""
    write_wheel(tmp_path / "wheels", "torch", "2.9.1", requires=TORCH_PINS)
    write_wheel(tmp_path / "wheels", "triton", "3.5.1")
    matrix_file = tmp_path / "matrix.toml"
    matrix_file.write_text(
        '[axes]\ncuda = ["12.8"]\ntorch = ["2.9.1"]\nsgl_kernel = ["0.3.21"]\nflashinfer = ["0.6.3"]\n'
        'sglang = ["0.5.9"]\npython = ["3.11"]\n\n[indexes.local]\nfind_links = "wheels"\n',
        encoding="utf-8",
    )
    matrix = load(matrix_file)
    family = families.load_one(SUITE / families.FAMILY_FILE)
    suite = Suite(name=family.name, path=SUITE, parsed_settings=family.parse({}))
    stack = {"torch": "2.9.1", "flashinfer-python": "0.6.3", "sglang": "0.5.9"}
    return hand_over((suite,), stack, Resolver(matrix, Cache()), "3.11", unreachable)


def test_the_runner_hands_over_the_wheels_the_hook_names_and_why_it_lacks_one(tmp_path: Path) -> None:
    handed = _handed(tmp_path)
    assert list(handed.extras) == ["triton==3.5.1"]
    triton = handed.extras["triton==3.5.1"]
    assert (Path(triton.root) / "triton-3.5.1.dist-info").is_dir(), "unpacked in the shared cache"
    # the nvcc wheel of the CUDA release torch pins: not on this index, so unavailable with the reason
    assert list(handed.unavailable) == ["nvidia-cuda-nvcc-cu12==12.8.93"]
    assert handed.unavailable["nvidia-cuda-nvcc-cu12==12.8.93"].startswith("nvidia-cuda-nvcc-cu12==12.8.93: ")


def test_an_unreachable_index_is_handed_over_as_unavailable_not_a_cell_error(tmp_path: Path) -> None:
    handed = _handed(tmp_path, unreachable={("torch", "2.9.1"): "the index is unreachable"})
    assert handed.extras == {}
    assert handed.unavailable == {"torch==2.9.1": "(offline?) the index is unreachable"}


def _torch(tmp_path: Path) -> InstalledComponent:
    """torch 2.9.1 as a cell has it: its METADATA pins Triton 3.5.1."""
    root = tmp_path / "site"
    info = root / "torch-2.9.1.dist-info"
    info.mkdir(parents=True)
    metadata = "".join(f"Requires-Dist: {r}\n" for r in TORCH_PINS)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: 2.9.1\n{metadata}")
    return InstalledComponent(axis="torch", distribution="torch", version="2.9.1", filename="", sha256="",
                              source="", root=str(root))  # fmt: skip


@pytest.mark.parametrize(
    ("unavailable", "why"),
    [
        ({"triton==3.5.1": "(offline?) the index is unreachable"}, "(offline?) the index is unreachable"),
        ({}, "triton==3.5.1: not resolved by the runner"),
    ],
)
def test_the_suite_reports_what_the_runner_could_not_hand_over_as_unanswered(
    tmp_path: Path, unavailable: dict[str, str], why: str
) -> None:
    sys.path.insert(0, str(SUITE))
    from toolchain_cell import _Wheels  # type: ignore[import-not-found]  # the suite folder, put on sys.path above

    cell = CellSpec(id="c", values={"cuda": "12.8"}, backend="local", components=(_torch(tmp_path),),
                    archs=("sm_90",))  # fmt: skip
    cell = replace(cell, unavailable=unavailable)
    wheels = _Wheels(cell)
    found = {f.id: f for f in analyse(cell, wheels.fetch, wheels.requires, {})}
    triton = found["triton-sm_90"]
    assert triton.outcome == "skip", "unanswered, never a pass"
    assert triton.message == f"triton 3.5.1 (pinned by the cell's torch) cannot be had here: {why}"
