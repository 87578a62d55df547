"""backendsel: which platform SGLang resolves at run time, decided from the cell's own wheels."""

from __future__ import annotations

from pathlib import Path

from stackfarm.analysis.backendsel import families_of, platform_instances, registers
from stackfarm.cellspec import CellSpec, InstalledComponent

PLATFORM = {"attribute": "sglang.srt.platforms:current_platform",
            "cuda": "sglang.srt.platforms.cuda:CudaSRTPlatform", "plugins": "sglang.srt.platforms"}  # fmt: skip


def _cell(tmp_path: Path, entry_points: str | None) -> CellSpec:
    root = tmp_path / "wheel"
    info = root / "plugin-1.0.dist-info"
    info.mkdir(parents=True)
    if entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points)
    comp = InstalledComponent(axis="sglang", distribution="sglang", version="0", filename="", sha256="",
                              source="", root=str(root))  # fmt: skip
    return CellSpec(id="c", values={}, backend="local", components=(comp,), archs=("sm_120",),
                    models=({"target": "KimiK25ForConditionalGeneration"},))  # fmt: skip


def test_no_plugin_means_the_cuda_platform(tmp_path: Path) -> None:
    cell = _cell(tmp_path, "[console_scripts]\nsglang = sglang.cli:main\n")
    pins, why = platform_instances(cell, PLATFORM, {})
    assert pins == {("sglang.srt.platforms", "current_platform"): "sglang.srt.platforms.cuda.CudaSRTPlatform"}
    assert "no component of the cell registers a sglang.srt.platforms plugin" in why


def test_a_registered_plugin_or_sglang_platform_leaves_it_undecided(tmp_path: Path) -> None:
    cell = _cell(tmp_path, "[sglang.srt.platforms]\nnpu = sglang_npu:activate\n")
    assert registers(Path(cell.components[0].root), "sglang.srt.platforms") == [
        "plugin-1.0.dist-info: npu = sglang_npu:activate"
    ]
    pins, why = platform_instances(cell, PLATFORM, {})
    assert pins == {}
    assert "undecided" in why
    pins, why = platform_instances(_cell(tmp_path / "b", None), PLATFORM, {"SGLANG_PLATFORM": "npu"})
    assert pins == {}
    assert why.startswith("SGLANG_PLATFORM=npu")


def test_families_are_the_models_then_the_settings(tmp_path: Path) -> None:
    cell = _cell(tmp_path, None)
    assert families_of(cell, {"families": ["DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration"]}) == [
        "KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM"]  # fmt: skip
