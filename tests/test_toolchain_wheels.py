"""15-toolchain on real wheels (integration): the compilers PyPI ships, on the failures real threads report and
on the releases that fixed them, and the suite on the default matrix's cells from the artifact cache.

- triton-lang/triton#8539 ``ptxas fatal : Value 'sm_121a' is not defined``: Triton 3.5.1's compiler.py
  (``sm_arch_from_capability``: suffix "a" from capability 90; ``get_ptxas()``: the one bundled ptxas, 12.8.93)
  asks for sm_121a, which that ptxas does not know. Triton 3.6.0's ``get_ptxas(arch)`` picks the bundled
  ``ptxas-blackwell`` (12.9.86) from capability 100: it accepts sm_121a.
- flashinfer-ai/flashinfer#1966 ``Instruction 'cvt with .e2m1x2' not supported on .target 'sm_120'``: flashinfer
  0.6.3's CompilationContext keeps FLASHINFER_CUDA_ARCH_LIST="12.0" as compute_120/sm_120 (no suffix), and CUDA
  12.8.1's ptxas (nvidia-cuda-nvcc-cu12 12.8.93) rejects the FP4 conversion there. 0.6.7.post2's
  ``_normalize_cuda_arch`` makes it compute_120f/sm_120f, which CUDA 13.0's nvcc (13.0.88) compiles; under CUDA
  12.8 the same code refuses up front ("SM 12.x requires CUDA >= 12.9").
- flashinfer#1657/#1658 ``Unsupported gpu architecture 'compute_90a'``: CUDA 11.8's ptxas rejects the sm_90a
  flashinfer asks for on Hopper; CUDA 12.8's accepts it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stackfarm.analysis.arch import parse_target
from stackfarm.analysis.jitfindings import flashinfer_finding, triton_finding
from stackfarm.analysis.toolchain import Toolkit, toolkit_in, wheel_bin_dir
from stackfarm.cellspec import CellSpec, InstalledComponent
from test_elfsyms import real_component
from test_toolchain import run_suite

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def _wheel(distribution: str, version: str) -> Path:
    """An unpacked wheel from the default matrix's indexes, kept in the real artifact cache."""
    from stackfarm.artifacts import Cache
    from stackfarm.matrix import load
    from stackfarm.plan import Component
    from stackfarm.resolve import Resolver

    matrix = load(REPO / "matrix.toml")
    resolver = Resolver(matrix, Cache())
    comp = Component(axis="toolchain", distribution=distribution, version=version,
                     index=matrix.index_for(distribution, version))  # fmt: skip
    return resolver.cache.unpack(resolver.artifact(comp, "3.11"))


def _handed(cell: CellSpec) -> CellSpec:
    """The cell as the runner hands it to 15-toolchain: family.py's wheels resolved on the default matrix's
    indexes (stackfarm.handover.hand_over), in CellSpec.extras, and what could not be had in CellSpec.unavailable."""
    from dataclasses import replace

    from stackfarm import families
    from stackfarm.artifacts import Cache
    from stackfarm.handover import hand_over
    from stackfarm.matrix import Suite, load
    from stackfarm.resolve import Resolver

    folder = REPO / "suites" / "15-toolchain"
    family = families.load_one(folder / families.FAMILY_FILE)
    suite = Suite(
        name=family.name, path=folder, parsed_settings=family.parse(cell.settings.get(family.name, {}))
    )
    stack = {c.distribution: c.version for c in cell.components}
    handed = hand_over((suite,), stack, Resolver(load(REPO / "matrix.toml"), Cache()), "3.11")
    return replace(cell, extras=handed.extras, unavailable=handed.unavailable)


def _toolkit(distribution: str, version: str) -> Toolkit:
    bin_dir = wheel_bin_dir(_wheel(distribution, version))
    assert bin_dir is not None
    return toolkit_in(bin_dir, f"{distribution} {version} wheel", "test")


def test_triton_351_bundled_ptxas_rejects_sm_121a_and_360_accepts() -> None:
    sm121 = parse_target("sm_121")
    old = triton_finding(sm121, _wheel("triton", "3.5.1"), "3.5.1", {})
    assert old.outcome == "fail", old.message
    assert (old.target, old.file, old.line) == ("sm_121a", "triton/backends/nvidia/compiler.py", 99)
    assert old.compiler == "ptxas 12.8.93 (triton ptxas)"
    assert old.error == "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'"
    assert "--gpu-name=sm_121a probe.ptx" in old.command
    new = triton_finding(sm121, _wheel("triton", "3.6.0"), "3.6.0", {})
    assert new.outcome == "pass", new.message
    assert new.compiler == "ptxas-blackwell 12.9.86 (triton ptxas-blackwell)"
    # The workaround the thread gives: TRITON_PTXAS_PATH at a newer ptxas (here CUDA 13.0's).
    ptxas13 = _toolkit("nvidia-cuda-nvcc", "13.0.88").ptxas.path
    fixed = triton_finding(sm121, _wheel("triton", "3.5.1"), "3.5.1", {"TRITON_PTXAS_PATH": str(ptxas13)})
    assert fixed.outcome == "pass", fixed.message


def _flashinfer(version: str) -> InstalledComponent:
    return real_component("flashinfer-python", version)


def test_flashinfer_063_aot_sm_120_fails_fp4_under_cuda_128() -> None:
    sm120 = parse_target("sm_120")
    kit128 = _toolkit("nvidia-cuda-nvcc-cu12", "12.8.93")
    old = flashinfer_finding(_flashinfer("0.6.3"), sm120, "aot", kit128, {})
    assert old.outcome == "fail", old.message
    assert old.target == "compute_120/sm_120"
    assert old.error.endswith("error   : Instruction 'cvt with .e2m1x2' not supported on .target 'sm_120'")
    assert old.compiler == "ptxas 12.8.93 (nvidia-cuda-nvcc-cu12 12.8.93 wheel)"
    # At JIT time the same release asks for sm_120a, where the conversion assembles.
    assert flashinfer_finding(_flashinfer("0.6.3"), sm120, "jit", kit128, {}).outcome == "pass"


def test_flashinfer_067_aot_sm_120_passes_under_cuda_130_refuses_under_128() -> None:
    sm120 = parse_target("sm_120")
    fixed = flashinfer_finding(
        _flashinfer("0.6.7.post2"), sm120, "aot", _toolkit("nvidia-cuda-nvcc", "13.0.88"), {}
    )
    assert fixed.outcome == "pass", fixed.message
    assert fixed.target == "compute_120f/sm_120f with the FP4 e2m1x2 conversion"
    assert fixed.compiler == "nvcc 13.0.88 (nvidia-cuda-nvcc 13.0.88 wheel)"
    kit128 = _toolkit("nvidia-cuda-nvcc-cu12", "12.8.93")
    refused = flashinfer_finding(_flashinfer("0.6.7.post2"), sm120, "jit", kit128, {})
    assert refused.outcome == "fail"
    assert "SM 12.x requires CUDA >= 12.9" in refused.message
    source = (Path(_flashinfer("0.6.7.post2").root) / refused.file).read_text().splitlines()
    assert source[refused.line - 1].strip().startswith("def _normalize_cuda_arch(")  # the deciding function


def _cell(torch: str, kernel: tuple[str, str], fi: str, sglang: str, cuda: str) -> CellSpec:
    comps = (real_component("torch", torch), real_component(*kernel), real_component("flashinfer-python", fi),
             real_component("sglang", sglang))  # fmt: skip
    return CellSpec(id=f"cu{cuda}-fi{fi}-sgl{sglang}", values={"torch": torch, "cuda": cuda, "python": "3.11"},
                    backend="local", components=comps, archs=("sm_120", "sm_90"), matrix=str(REPO / "matrix.toml"),
                    settings={"15-toolchain": {"flashinfer_modes": ["jit"]}})  # fmt: skip


@pytest.mark.parametrize(
    ("torch", "kernel", "fi", "sglang", "cuda", "failing"),
    [
        ("2.9.1", ("sgl-kernel", "0.3.21"), "0.6.3", "0.5.9", "12.8", set()),
        # flashinfer 0.6.7.post2 needs CUDA >= 12.9 for any SM 12.x target: its JIT has no sm_120 target here.
        ("2.9.1", ("sglang-kernel", "0.4.1"), "0.6.7.post2", "0.5.10", "12.8", {"test_finding[flashinfer-jit-sm_120]"}),
        ("2.11.0", ("sglang-kernel", "0.4.4"), "0.6.12", "0.5.15", "13.0", set()),  # the H200 stack
    ],
)  # fmt: skip
def test_default_cells(
    tmp_path: Path, torch: str, kernel: tuple[str, str], fi: str, sglang: str, cuda: str, failing: set[str]
) -> None:
    cell = _handed(_cell(torch, kernel, fi, sglang, cuda))
    cases = run_suite(tmp_path, cell)
    assert {n for n, c in cases.items() if c["outcome"] == "failed"} == failing
    assert len(cases) == 4
    assert all(c["outcome"] != "skipped" for c in cases.values()), cases


SELECTORS: dict[str, dict[str, Any]] = {"attention": {"selector": "sglang.srt.server_args:ServerArgs._get_default_attn_backend",
                           "admits": {"fa3": "sglang.srt.layers.attention.attention_registry:"
                                             "create_flashattention_v3_backend"}}}  # fmt: skip


@pytest.mark.parametrize(("sglang", "fi"), [("0.5.10", "0.6.7.post2"), ("0.5.15", "0.6.12")])
def test_attention_selection_on_real_releases(sglang: str, fi: str) -> None:
    """SGLang's default attention backend per arch (its _get_default_attn_backend, 1.2: "trtllm_mha does not
    support SM120, which will fall back to flashinfer"): fa3 only on sm_90, where its creator's assert admits
    it (that assert refuses sm_120); trtllm_mha only on sm_100 (its arch check is in flashinfer's C++
    TllmGenFmhaRunner, no Python gate: not checked); on sm_120 flashinfer or triton."""
    from stackfarm.analysis.backendsel import cell_choices
    from stackfarm.analysis.capgates import evaluate_gate
    from stackfarm.analysis.sourcetree import SourceTree

    comps = (real_component("sglang", sglang), real_component("flashinfer-python", fi))
    cell = CellSpec(id="sel", values={"cuda": "12.8"}, backend="local", components=comps,
                    archs=("sm_120", "sm_100", "sm_90"))  # fmt: skip
    found = {f.id: f for f in cell_choices(cell, SELECTORS)}
    assert found["selection-attention-trtllm_mha-sm_100"].outcome == "n/a"
    assert found["selection-attention-fa3-sm_90"].outcome == "pass"
    assert not [i for i in found if i.startswith(("selection-attention-trtllm", "selection-attention-fa3")) and
                i.endswith("sm_120")]  # fmt: skip
    assert not [f.message for f in found.values() if f.outcome == "fail"]
    assert {"flashinfer", "triton"} <= {f.target for f in found.values() if f.arch == "sm_120"}
    tree = SourceTree([c.root for c in comps])
    refused = evaluate_gate(tree, SELECTORS["attention"]["admits"]["fa3"], parse_target("sm_120"), "12.8")
    assert refused.state in ("off", "crash"), refused


def test_flashinfer_jit_sm_90a_needs_a_toolkit_that_knows_it() -> None:
    """flashinfer#1657/#1658 (`nvcc fatal : Unsupported gpu architecture 'compute_90a'` from an older system
    toolkit): flashinfer 0.6.3 asks for compute_90a/sm_90a at JIT time on an H100/H200 (suffix "a" from major 9);
    CUDA 11.8's ptxas (nvidia-cuda-nvcc-cu11 11.8.89) does not know sm_90a, CUDA 12.8.1's does."""
    sm90 = parse_target("sm_90")
    old = flashinfer_finding(
        _flashinfer("0.6.3"), sm90, "jit", _toolkit("nvidia-cuda-nvcc-cu11", "11.8.89"), {}
    )
    assert old.outcome == "fail", old.message
    assert old.target == "compute_90a/sm_90a"
    assert old.error == "ptxas fatal   : Value 'sm_90a' is not defined for option 'gpu-name'"
    assert old.compiler == "ptxas 11.8.89 (nvidia-cuda-nvcc-cu11 11.8.89 wheel)"
    kit128 = _toolkit("nvidia-cuda-nvcc-cu12", "12.8.93")
    assert flashinfer_finding(_flashinfer("0.6.3"), sm90, "jit", kit128, {}).outcome == "pass"


def _default_settings() -> dict[str, Any]:
    import tomllib

    settings: dict[str, Any] = tomllib.loads((REPO / "matrix.toml").read_text())["suites"]["15-toolchain"][
        "settings"
    ]
    return settings


def _default_selection() -> tuple[dict[str, Any], list[str]]:
    conf = _default_settings()
    return conf["selectors"], ["KimiK25ForConditionalGeneration", *conf["families"]]


def _selection(sglang: str, fi: str, kernel: tuple[str, str] | None = None) -> dict[str, Any]:
    from stackfarm.analysis.backendsel import cell_choices

    selectors, families = _default_selection()
    comps = (real_component("sglang", sglang), real_component("flashinfer-python", fi),
             *([real_component(*kernel)] if kernel else []))  # fmt: skip
    cell = CellSpec(id="sel", values={"cuda": "12.8"}, backend="local", components=comps,
                    archs=("sm_120", "sm_100", "sm_90"))  # fmt: skip
    return {
        f.id: f for f in cell_choices(cell, selectors, families, platform=_default_settings()["platform"])
    }


def _line(component: InstalledComponent, rel: str, line: int) -> str:
    return (Path(component.root) / rel).read_text().splitlines()[line - 1].strip()


def test_mla_prefill_routes_sm_120_to_the_sm100_only_trtllm_gen_runner() -> None:
    """sglang#24633 (SGLang 0.5.10, RTX PRO 6000 sm_120: MLA prefill reaches FlashInfer's TllmGenFmhaRunner and
    fails "Unsupported architecture"; flashinfer#3263 names the same path) and sglang#37105 ("treats all
    Blackwell alike"). Deciding lines, 0.5.10's nsa_backend.py (the sparse-MLA backend's dense prefill):
        1772  if self.device_sm_major >= 10:                      # "for SM100 (Blackwell/B200)", says its comment
        1776      return flashinfer.prefill.trtllm_ragged_attention_deepseek(...)
    and flashinfer 0.6.7.post2's fmhaRunner.cuh:30 (the runner that call constructs):
        FLASHINFER_CHECK(mSM == kSM_100 || mSM == kSM_103, "Unsupported architecture");
    The same selection on sm_100 is admitted; on sm_90 the route is not taken; 0.5.5 has no such route (its dense
    prefill never calls trtllm-gen: passes on sm_120). No release up to 0.5.23 fixes it (0.5.23's
    dsa_backend.py:3402 still reads ``device_sm_major >= 10``): the failure is a true one there too."""
    found = _selection("0.5.10", "0.6.7.post2")
    bad = found["selection-mla-prefill-trtllm-gen-sm_120"]
    assert bad.outcome == "fail", bad.message
    assert (bad.file, bad.line) == ("sglang/srt/layers/attention/nsa_backend.py", 1776)
    sglang = real_component("sglang", "0.5.10")
    assert _line(sglang, bad.file, 1772) == "if self.device_sm_major >= 10:"
    assert _line(sglang, bad.file, 1776) == "return flashinfer.prefill.trtllm_ragged_attention_deepseek("
    header = "flashinfer/data/include/flashinfer/trtllm/fmha/fmhaRunner.cuh"
    assert f"({header}:30: off): mSM == kSM_100 || mSM == kSM_103 refuses SM 120" in bad.message
    assert _line(_flashinfer("0.6.7.post2"), header, 30).startswith(
        "FLASHINFER_CHECK(mSM == kSM_100 || mSM == kSM_103"
    )
    assert found["selection-mla-prefill-trtllm-gen-sm_100"].outcome == "pass"
    assert found["selection-mla-prefill-trtllm-gen-sm_90"].outcome == "pass"  # 9 >= 10 is false: not routed
    # sglang#37105's selector: DSA models' KV dtype and backends by `major >= 10` (server_args.py:1431, 1465).
    dsa = found["selection-dsa-trtllm-sm_120"]
    assert dsa.outcome == "fail"
    assert (dsa.file, dsa.line) == ("sglang/srt/server_args.py", 1466)
    assert _line(sglang, dsa.file, 1465) == "if major >= 10:"
    assert found["selection-dsa-fa3-sm_90"].outcome == "pass"
    assert "selection-dsa-trtllm-sm_90" not in found
    # The default attention backend and the per-model defaults route nothing to an arch that refuses it.
    assert found["selection-attention-fa3-sm_90"].outcome == "pass"
    assert found["selection-model-trtllm_mla-sm_100"].outcome == "pass"
    assert not [i for i in found if i.endswith("sm_120") and ("trtllm_m" in i or "fa3" in i)]
    before = _selection("0.5.5", "0.6.7.post2")
    assert before["selection-mla-prefill-trtllm-gen-sm_120"].outcome == "pass"
    assert before["selection-attention-sm_120"].outcome == "skip"  # no _get_default_attn_backend: unanswered


def test_out_of_tree_platform_branch_is_decided_from_the_cells_wheels() -> None:
    """SGLang 0.5.15's _get_default_attn_backend asks ``current_platform.is_out_of_tree()`` first
    (server_args.py:4324), a platform resolved at run time from installed plugins (platforms/__init__.py
    _resolve_platform: none activated on a CUDA GPU -> CudaSRTPlatform, whose _enum is CUDA). Neither wheel
    registers a ``sglang.srt.platforms`` entry point, so the branch is decided: the default on sm_90 is fa3
    (admitted), and no choice stays unresolved."""
    found = _selection("0.5.15", "0.6.12")
    assert not [i for i in found if "unresolved" in i], [
        f.message for f in found.values() if "unresolved" in f.id
    ]
    assert found["selection-attention-fa3-sm_90"].outcome == "pass"
    assert "CudaSRTPlatform" in found["selection-attention-fa3-sm_90"].note
    assert (
        found["selection-mla-prefill-trtllm-gen-sm_120"].outcome == "fail"
    )  # still >= 10 (dsa_backend.py:2369)


def test_dsa_defaults_of_059_reach_flashmla_kernels_without_sm_120_code() -> None:
    """SGLang 0.5.9's DSA defaults (server_args.py:1143 KV fp8 from major >= 10, then 1158-1163: fp8 ->
    nsa_prefill_backend "flashmla_auto", nsa_decode_backend "flashmla_kv") on sm_120 pick FlashMLA, whose
    kernels in sgl-kernel 0.3.21 (sgl_kernel/flashmla_ops.abi3.so) carry sm_90a/sm_100a code only: the choice
    fails with the library named, as 10-capability reads it; on sm_90 the bf16 defaults pick fa3 + FlashMLA
    sparse, both present there."""
    found = _selection("0.5.9", "0.6.3", ("sgl-kernel", "0.3.21"))
    bad = found["selection-dsa-flashmla_kv-sm_120"]
    assert bad.outcome == "fail", bad.message
    assert (bad.file, bad.line) == ("sglang/srt/server_args.py", 1163)
    assert (
        _line(real_component("sglang", "0.5.9"), bad.file, 1163) == 'self.nsa_decode_backend = "flashmla_kv"'
    )
    assert "sgl_kernel/flashmla_ops.abi3.so has no SASS or PTX for sm_120" in bad.message
    assert found["selection-dsa-flashmla_sparse-sm_90"].outcome == "pass"
    assert found["selection-dsa-fa3-sm_90"].outcome == "pass"


def test_first_use_compile_of_flashinfers_rope_with_the_cells_toolkit() -> None:
    """The real first-use compile: flashinfer 0.6.12's rope module with the CUDA 13.0.2 toolkit wheels torch
    2.11.0 pins (cuda-toolkit[...]==13.0.2: nvcc 13.0.88, nvvm, crt, cudart 13.0.96, cccl 13.0.85) for sm_120
    (flashinfer asks compute_120f/sm_120f there) and sm_90 (compute_90a/sm_90a): both compile. The vendored CCCL
    matters: flashinfer's fastdiv.cuh uses cuda::fast_mod_div, which CUDA 13.0's own CCCL lacks, and cpp_ext
    puts data/cccl first (-I). A CUDA 12.8 cell (torch 2.9.1 pins no cuda-toolkit) is unanswered with the reason."""
    import sys

    from stackfarm.analysis.jitcompile import compile_findings

    sys.path.insert(0, str(REPO / "suites" / "15-toolchain"))
    from toolchain_cell import _Wheels  # type: ignore[import-not-found]  # the suite folder, put on sys.path above

    archs = [parse_target("sm_120"), parse_target("sm_90")]
    found = {}
    for torch, fi, cuda in (("2.11.0", "0.6.12", "13.0"), ("2.9.1", "0.6.3", "12.8")):
        comps = (real_component("torch", torch), real_component("flashinfer-python", fi))
        cell = CellSpec(id=f"c{cuda}", values={"cuda": cuda, "python": "3.11"}, backend="local", components=comps,
                        archs=("sm_120", "sm_90"), settings={"15-toolchain": {"compile": True}})  # fmt: skip
        wheels = _Wheels(_handed(cell))
        for f in compile_findings(cell, archs, fetch=wheels.fetch, requires=wheels.requires,
                                  versions=wheels.versions, environ={}):  # fmt: skip
            found[(cuda, f.arch)] = f
    sm120 = found[("13.0", "sm_120")]
    assert sm120.outcome == "pass", sm120.message
    assert sm120.target == "rope (flashinfer/data/csrc/rope.cu) for arch=compute_120f,code=sm_120f"
    assert "/flashinfer/data/cccl/libcudacxx/include" in sm120.command
    assert found[("13.0", "sm_90")].target.endswith("arch=compute_90a,code=sm_90a")
    assert found[("13.0", "sm_90")].outcome == "pass"
    old = found[("12.8", "sm_120")]
    assert old.outcome == "skip"
    assert "CUDA 12.x on PyPI has no nvcc wheel" in old.message
