"""10-capability's and 20-eagle3's finding classes pinned on real SGLang wheels: one old (0.4.10.post2), one
middle (0.5.5, 0.5.10) and the newest (0.5.23) release each, unpatched, on sm_80 / sm_90 / sm_100 / sm_120
(reference sm_90) with matrix.toml's [features].

Every expectation quotes the source lines of that release that decide it (paths inside the wheel). The wheels
come through the farm's artifacts layer (matrix.toml's index) into the shared cache: marked integration, and
skipped with the reason when a wheel cannot be fetched. Classes no release produces are said so here, with
the lines that show why; their behaviour is pinned on small trees in test_capauto.py / test_eagle3.py.

10-capability's classes (kind:verdict): table ok / missing-crash / missing-graceful; gate ok / gated-off /
missing-crash / unknown, an absent configured gate (n/a, or a failure when nothing decides the feature);
flag ok / gated-off / unknown; auto ok / auto-on-gated-off / auto-off-gate-on / unknown; expectation. A
feature's gate found by following its flag through the calls it is passed to (torch-symm-mem without its
configured gate) is pinned on 0.4.10.post2, 0.5.9 and 0.5.23.
20-eagle3's: implemented / inherited / delegated / missing / optional-missing / class-not-in-release.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomllib

from stackfarm.analysis.eagle3 import check_class, derive_contract
from stackfarm.analysis.sourcetree import SourceTree
from stackfarm.cellspec import CellSpec, InstalledComponent

REPO = Path(__file__).resolve().parent.parent
ARCHS = ("sm_80", "sm_90", "sm_100", "sm_120")
pytestmark = pytest.mark.integration


def _tree(version: str) -> Path:
    from stackfarm.matrix import load as load_matrix
    from stackfarm.sglangtrees import sglang_trees

    try:
        trees = sglang_trees(load_matrix(REPO / "matrix.toml"), [version], echo=lambda _: None)
    except Exception as exc:  # no index, no network: the pin cannot be checked here
        pytest.skip(f"cannot fetch the sglang {version} wheel: {type(exc).__name__}: {exc}")
    if version not in trees:
        pytest.skip(f"cannot fetch the sglang {version} wheel")
    return trees[version]


_ANALYSED: dict[tuple[str, str], list[Any]] = {}


def _findings(version: str, *, flags_only: str = "") -> list[Any]:
    """Every static 10-capability finding of the unpatched release (analysed once per test session); with
    `flags_only`, the analysis of that one feature of matrix.toml with its configured gate left out."""
    if (version, flags_only) not in _ANALYSED:
        sys.path.insert(0, str(REPO / "suites" / "10-capability"))
        capability = importlib.import_module("capability_findings")
        root = _tree(version)
        raw = tomllib.loads((REPO / "matrix.toml").read_text(encoding="utf-8"))
        if flags_only:
            raw["features"] = {flags_only: {"flags": raw["features"][flags_only]["flags"]}}
        comp = InstalledComponent(axis="sglang", distribution="sglang", version=version, filename="x.whl",
                                  sha256=root.name, source="pypi", root=str(root))  # fmt: skip
        cell = CellSpec(id=version, values={"cuda": "12.8", "sglang": version}, backend="local",
                        components=(comp,), archs=ARCHS, reference_arch="sm_90", features=raw["features"],
                        settings={"10-capability": {}})  # fmt: skip
        _ANALYSED[version, flags_only] = list(capability.analyse(cell).findings)
    return _ANALYSED[version, flags_only]


def _pick(version: str, **want: object) -> Callable[[str], Any]:
    """The finding per arch among those whose attributes equal `want` (exactly one per arch)."""
    chosen = [f for f in _findings(version) if all(getattr(f, k) == v for k, v in want.items())]
    by_arch: dict[str, Any] = {}
    for f in chosen:
        assert f.arch not in by_arch, f"two findings for {want} on {f.arch}"
        by_arch[f.arch] = f
    return lambda arch: by_arch[arch]


def _verdicts(version: str, **want: object) -> dict[str, tuple[str, str]]:
    return {
        f.arch: (f.outcome, f.verdict)
        for f in _findings(version)
        if all(getattr(f, k) == v for k, v in want.items())
    }


# --------------------------------------------------------------------------------------------- old: 0.4.10.post2


def test_old_0_4_10_post2_gates_found_through_flags() -> None:
    """0.4.10.post2 has no apply_flashinfer_allreduce_fusion; the fusion is decided where the flag is read as a
    dict subscript, sglang/srt/layers/communicator.py:429-433:

        if (
            _is_sm100_supported                         # :41 `_is_sm100_supported = is_cuda() and is_sm100_supported()`
            and _is_flashinfer_available
            and hasattr(layernorm, "forward_with_allreduce_fusion")
            and global_server_args_dict["enable_flashinfer_allreduce_fusion"]
            and hidden_states.shape[0] <= 128

    (deepseek_v2.py:1842 reads it as `global_server_args_dict.get("enable_flashinfer_allreduce_fusion", False)`).
    So the configured gates are n/a, decided there; the condition is off on sm_80 / sm_90 / sm_120 (sm_100 only,
    the reference sm_90 included: said in the message) and not decided by the GPU on sm_100."""
    absent = [
        f
        for f in _findings("0.4.10.post2")
        if f.kind == "gate" and f.feature == "flashinfer-allreduce-fusion"
    ]
    assert {(f.symbol, f.outcome, f.verdict) for f in absent} == {
        ("apply_flashinfer_allreduce_fusion", "n/a", "absent"),
        ("gen_trtllm_comm_module", "n/a", "absent"),
    }
    assert "decided here by the conditions that read its flags: sglang/srt/layers/communicator.py:429" in (
        absent[0].message
    )
    assert "sglang/srt/models/deepseek_v2.py:1842" in absent[0].message
    flag = _verdicts("0.4.10.post2", kind="flag", file="sglang/srt/layers/communicator.py", line=429)
    assert flag == {
        "sm_80": ("fail", "gated-off"),
        "sm_90": ("fail", "gated-off"),
        "sm_100": ("pass", "ok"),
        "sm_120": ("fail", "gated-off"),
    }
    sm120 = _pick("0.4.10.post2", kind="flag", line=429)("sm_120")
    assert "false on the reference sm_90 too, not false on sm_100" in sm120.message


def test_old_0_4_10_post2_absent_features_tables_and_auto() -> None:
    """0.4.10.post2 has no torch symmetric-memory all-reduce at all: no
    sglang/srt/distributed/device_communicators/torch_symm_mem.py, and its server_args.py:222 flag is
    `enable_symm_mem`, not `enable_torch_symm_mem`: a failure (nothing decides the feature), as for fa3-attention
    (no attention_registry.py; its fa3 backend is picked in model_runner.py:1428). Without torch_symm_mem.py
    (its TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES and _WORLD_SIZES_MULTIMEM come with it) there is no capability-keyed
    table; server_args.py only declares `enable_flashinfer_allreduce_fusion: bool = False` (:179) and never
    assigns it: no auto-enable finding. The fa3 expectation off.sm_120 passes (nothing contradicts it)."""
    found = _findings("0.4.10.post2")
    failed = {f.symbol for f in found if f.kind == "gate" and (f.outcome, f.verdict) == ("fail", "absent")}
    assert failed == {"torch-symm-mem-allreduce", "fa3-attention"}
    assert not [f for f in found if f.kind in ("table", "auto")]
    assert _verdicts("0.4.10.post2", kind="expectation", symbol="features.fa3-attention.off") == {
        "sm_120": ("pass", "gated-off")
    }


# --------------------------------------------------------------------------------------------- middle: 0.5.5, 0.5.10


def test_middle_0_5_5_auto_enable_on_sm120_where_the_use_gate_is_off() -> None:
    """0.5.5, sglang/srt/server_args.py:942-968 (ServerArgs._handle_model_specific_adjustments, GptOss):

        elif model_arch in ["GptOssForCausalLM"]:
            ...
            if is_blackwell_supported():                # utils/common.py:204 capability major in [10, 12], CUDA >= 12.8
                if not self.enable_dp_attention:
                    self.enable_flashinfer_allreduce_fusion = True          # :968

    while the use-gate, sglang/srt/layers/communicator.py:567-571, admits only sm90 / sm100:

        if (
            (_is_sm100_supported or _is_sm90_supported)  # :63-64 torch capability probes
            and _is_flashinfer_available
            and hasattr(layernorm, "forward_with_allreduce_fusion")
            and get_global_server_args().enable_flashinfer_allreduce_fusion

    So on sm_120 the release switches the flag on where its use-gate keeps the fusion off: auto-on-gated-off,
    naming both sites; sm_100 is consistent (on and on), sm_80 / sm_90 do not run it (:966 is false)."""
    auto = _verdicts("0.5.5", kind="auto", line=968)
    assert auto == {
        "sm_80": ("pass", "ok"),
        "sm_90": ("pass", "ok"),
        "sm_100": ("pass", "ok"),
        "sm_120": ("fail", "auto-on-gated-off"),
    }
    sm120 = _pick("0.5.5", kind="auto", line=968)("sm_120")
    assert "sglang/srt/server_args.py:968" in sm120.message
    assert "sglang/srt/layers/communicator.py:568 gated-off" in sm120.message
    assert "`is_blackwell_supported()` is false at sglang/srt/server_args.py:966" in (
        _pick("0.5.5", kind="auto", line=968)("sm_90").message
    )
    # the use-gate itself (communicator.py:568, found through the flag: no apply_flashinfer_allreduce_fusion yet)
    assert _verdicts("0.5.5", kind="flag", line=568) == {
        "sm_80": ("fail", "gated-off"),
        "sm_90": ("pass", "ok"),
        "sm_100": ("pass", "ok"),
        "sm_120": ("fail", "gated-off"),
    }


def test_middle_0_5_5_tables_and_symm_mem_gate() -> None:
    """0.5.5, sglang/srt/distributed/device_communicators/torch_symm_mem.py:72-83 (TorchSymmMemCommunicator.__init__):

        self.device_capability = torch.cuda.get_device_capability(device)[0]
        if self.device_capability < 9:                                      # :74
            ... return                                                      # :80
        if (
            self.world_size
            not in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]   # :83

    and all_reduce_utils.py:3 `TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {9: {...}, 10: {...}}`: KeyError 12 on
    sm_120 (missing-crash, table and gate), a deliberate return on sm_80 (gated-off), on on sm_90 / sm_100.
    attention_registry.py:128 asserts capability 8 or 9 in create_flashattention_v3_backend: off on sm_120 as
    matrix.toml declares (FA3 is Hopper-only), so that gate and its expectation pass."""
    assert _verdicts("0.5.5", kind="table", line=83) == {
        "sm_80": ("fail", "missing-crash"),
        "sm_90": ("pass", "ok"),
        "sm_100": ("pass", "ok"),
        "sm_120": ("fail", "missing-crash"),
    }
    assert "raises KeyError: 12 on sm_120" in _pick("0.5.5", kind="table", line=83)("sm_120").message
    gate = _verdicts("0.5.5", kind="gate", symbol="TorchSymmMemCommunicator.__init__")
    assert gate == {
        "sm_80": ("fail", "gated-off"),
        "sm_90": ("pass", "ok"),
        "sm_100": ("pass", "ok"),
        "sm_120": ("fail", "missing-crash"),
    }
    fa3 = _verdicts("0.5.5", kind="gate", symbol="create_flashattention_v3_backend")
    assert fa3["sm_120"] == ("pass", "gated-off")
    assert _verdicts("0.5.5", kind="expectation", symbol="features.fa3-attention.off") == {
        "sm_120": ("pass", "gated-off")
    }


def test_middle_0_5_10_auto_enable_agrees_with_its_gate() -> None:
    """0.5.10 (the default matrix's release), sglang/srt/server_args.py:2085-2110: the auto-enable condition
    `... and (is_sm90_supported() or is_sm100_supported()) and self.tp_size > 1 ...` sets
    `self.enable_flashinfer_allreduce_fusion = True` (:2110) on sm_90 / sm_100 only, and the use-gate
    sglang/srt/layers/communicator.py apply_flashinfer_allreduce_fusion returns `(_is_sm90_supported or
    _is_sm100_supported) and ...`: consistent on every arch (ok); on sm_120 neither runs."""
    assert _verdicts("0.5.10", kind="auto", line=2110) == dict.fromkeys(ARCHS, ("pass", "ok"))
    sm120 = _pick("0.5.10", kind="auto", line=2110)("sm_120")
    assert "does not run on sm_120" in sm120.message
    assert "its use-gate is off there too" in sm120.message
    gate = _verdicts("0.5.10", kind="gate", symbol="apply_flashinfer_allreduce_fusion")
    assert gate["sm_120"] == ("fail", "gated-off")
    assert gate["sm_90"] == ("pass", "ok")


# --------------------------------------------------------------------------------------------- newest: 0.5.23


def test_newest_0_5_23_auto_enable_through_the_platform_object() -> None:
    """0.5.23 moved the auto-enable to a registered post-process, sglang/srt/arg_groups/overrides.py:987-1001:

        if (
            view.flashinfer_allreduce_fusion_backend is None
            and (is_mimo or model_arch in _FLASHINFER_ALLREDUCE_FUSION_ARCHS)
            and not prefer_custom_dsv41
            and (get_platform().is_sm90 or get_platform().is_sm100)          # :991
            ...
            return {"flashinfer_allreduce_fusion_backend": backend}          # :1001

    get_platform() is runtime_context.PlatformContext: `__getattr__` (runtime_context.py:1862-1874) maps "is_sm90"
    to utils/common.py's is_sm90_supported (:1831) and calls it. So it runs on sm_90 / sm_100 and not on sm_80 /
    sm_120, and the use-gate, layer_boundary/residual/add_norm.py:146 `(_is_sm90_supported or _is_sm100_supported)
    and ... get_exec().comm.flashinfer_allreduce_fusion_backend is not None`, agrees on every arch: ok. The
    deprecated-flag translation (serving_hook.py:286-296, `cfg.enable_flashinfer_allreduce_fusion and
    cfg.flashinfer_allreduce_fusion_backend is None`) is the same on every GPU: no finding."""
    assert _verdicts("0.5.23", kind="auto", line=1001) == dict.fromkeys(ARCHS, ("pass", "ok"))
    sm120 = _pick("0.5.23", kind="auto", line=1001)("sm_120")
    assert "does not run on sm_120" in sm120.message
    assert "is false at sglang/srt/arg_groups/overrides.py:988" in sm120.message  # the test starts at :988
    assert "its use-gate is off there too (sglang/srt/layers/layer_boundary/residual/add_norm.py:146" in (
        sm120.message
    )
    assert "runs on sm_90" in _pick("0.5.23", kind="auto", line=1001)("sm_90").message
    assert not [f for f in _findings("0.5.23") if f.kind == "auto" and f.file.endswith("serving_hook.py")]
    assert _verdicts("0.5.23", kind="flag", line=146) == {
        "sm_80": ("fail", "gated-off"),
        "sm_90": ("pass", "ok"),
        "sm_100": ("pass", "ok"),
        "sm_120": ("fail", "gated-off"),
    }


def test_newest_0_5_23_no_ok_on_an_unresolved_value() -> None:
    """No finding of 0.5.23 passes on a value that could not be resolved (the unresolved case itself, the PEP 562
    `current_platform` hook of sglang/srt/platforms/__init__.py:213, is pinned in test_captables.py), and the
    configured gate apply_flashinfer_allreduce_fusion (gone since 0.5.21) is n/a, decided by the flag reads."""
    found = _findings("0.5.23")
    assert not [f for f in found if f.outcome == "pass" and "could not be resolved" in f.message]
    absent = [f for f in found if f.kind == "gate" and f.symbol == "apply_flashinfer_allreduce_fusion"]
    assert [(f.arch, f.outcome) for f in absent] == [("all", "n/a")]
    assert "sglang/srt/arg_groups/overrides.py:988" in absent[0].message


def test_newest_0_5_23_tables_are_graceful_and_symm_mem_is_off_on_sm120() -> None:
    """0.5.23, torch_symm_mem.py:80 `TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES.get(self.device_capability)` and :174
    `self._WORLD_SIZES_MULTIMEM.get(self.device_capability, ())`: the lookups moved to .get(), so sm_120 (key
    12) is missing-graceful (silently off) rather than the KeyError of 0.5.5; the gate returns at :89 (`if
    supported_max_sizes is None`): gated-off on sm_120 and sm_80, on on sm_90 / sm_100."""
    assert _verdicts("0.5.23", kind="table", line=80) == {
        "sm_80": ("fail", "missing-graceful"),
        "sm_90": ("pass", "ok"),
        "sm_100": ("pass", "ok"),
        "sm_120": ("fail", "missing-graceful"),
    }
    assert _verdicts("0.5.23", kind="gate", symbol="TorchSymmMemCommunicator.__init__") == {
        "sm_80": ("fail", "gated-off"),
        "sm_90": ("pass", "ok"),
        "sm_100": ("pass", "ok"),
        "sm_120": ("fail", "gated-off"),
    }


def test_classes_no_release_produces() -> None:
    """auto-off-gate-on (not switched on where the reference is, though no use-gate is off) occurs in no release
    from 0.4.10.post2 to 0.5.23: every auto-enable either runs on the reference sm_90 with a use-gate off on the
    arch it skips (0.5.9 / 0.5.10: server_args `is_sm90_supported() or is_sm100_supported()` vs communicator's
    `_is_sm90_supported or _is_sm100_supported`), or does not run on sm_90 at all (0.5.1-0.5.7's sm100 /
    Blackwell branches), or agrees with its use-gate (0.5.19+'s post-process). Pinned here on the three releases; on a tree in
    test_capauto.py."""
    for version in ("0.4.10.post2", "0.5.5", "0.5.23"):
        assert not [f for f in _findings(version) if f.verdict == "auto-off-gate-on"], version


# --------------------------------------------------------------------------------------------- flags followed into callees

SYMM = "torch-symm-mem-allreduce"
SYMM_GATE = "sglang.srt.distributed.device_communicators.torch_symm_mem:TorchSymmMemCommunicator.__init__"


def _symm_by_flag(version: str) -> list[Any]:
    return [f for f in _findings(version, flags_only=SYMM) if f.feature == SYMM]


def test_old_0_4_10_post2_symm_mem_by_its_flag_alone() -> None:
    """0.4.10.post2 never names `enable_torch_symm_mem` (its server_args.py:222 flag is `enable_symm_mem`, read
    by pynccl_allocator.py:35 and engine.py:626-627, none of them the torch symmetric-memory all-reduce, which
    this release does not have): with flags only, one failure saying nothing decides the feature."""
    found = _symm_by_flag("0.4.10.post2")
    assert [(f.kind, f.arch, f.symbol, f.outcome, f.verdict) for f in found] == [
        ("gate", "all", SYMM, "fail", "absent")
    ]
    assert "no condition in sglang 0.4.10.post2 reads its flags ['enable_torch_symm_mem']" in found[0].message


def test_middle_0_5_9_symm_mem_gate_found_by_following_its_flag() -> None:
    """0.5.9 reads the flag only as a call argument, sglang/srt/model_executor/model_runner.py:782
    `set_torch_symm_mem_all_reduce(self.server_args.enable_torch_symm_mem)`; followed:

        parallel_state.py:1524  def set_torch_symm_mem_all_reduce(enable: bool):
                         :1526      _ENABLE_TORCH_SYMM_MEM_ALL_REDUCE = enable            # a `global`
                         :1377  if use_torch_symm_mem_allreduce is None:                # init_model_parallel_group
                         :1378      use_torch_symm_mem_allreduce = _ENABLE_TORCH_SYMM_MEM_ALL_REDUCE
                         :1379  return GroupCoordinator(... use_torch_symm_mem_all_reduce=use_torch_symm_mem_allreduce,
                         :302   self.use_torch_symm_mem_all_reduce = use_torch_symm_mem_all_reduce   # __init__
                         :383   if self.use_torch_symm_mem_all_reduce and self.world_size > 1:
                         :384       self.torch_symm_mem_comm = TorchSymmMemCommunicator(

    (two calls deep). :383 is not decided by the GPU (world_size is a run-time input: no flag finding); the class
    constructed under it is the configured gate, found without it: torch_symm_mem.py:74 `if
    self.device_capability < 9: ... return` (:80) is off on sm_80, :83
    `TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]` raises KeyError: 12 on sm_120, on on sm_90 /
    sm_100: the configured gate's verdicts, each naming the way there."""
    found = _symm_by_flag("0.5.9")
    gate = {f.arch: f for f in found if f.kind == "gate"}
    assert {a: (f.symbol, f.outcome, f.verdict) for a, f in gate.items()} == {
        "sm_80": ("TorchSymmMemCommunicator.__init__", "fail", "gated-off"),
        "sm_90": ("TorchSymmMemCommunicator.__init__", "pass", "ok"),
        "sm_100": ("TorchSymmMemCommunicator.__init__", "pass", "ok"),
        "sm_120": ("TorchSymmMemCommunicator.__init__", "fail", "missing-crash"),
    }
    assert "raises KeyError: 12 at sglang/srt/distributed/device_communicators/torch_symm_mem.py:83" in (
        gate["sm_120"].message
    )
    way = gate["sm_120"].message
    assert f"gate {SYMM_GATE} on sm_120" in way
    assert "found by following enable_torch_symm_mem: sglang/srt/model_executor/model_runner.py:782 " in way
    assert "sglang/srt/distributed/parallel_state.py:1379 `GroupCoordinator(" in way
    assert "sglang/srt/distributed/parallel_state.py:383 `self.use_torch_symm_mem_all_reduce and" in way
    assert "sglang/srt/distributed/parallel_state.py:384 constructs it" in way
    assert not [f for f in found if f.kind == "flag"]
    # with the configured gate (matrix.toml), the same verdicts: judged once, as configured
    configured = _verdicts("0.5.9", kind="gate", symbol="TorchSymmMemCommunicator.__init__")
    assert configured == {a: (f.outcome, f.verdict) for a, f in gate.items()}
    assert not [f for f in _findings("0.5.9") if f.feature == SYMM and "found by following" in f.message]


def test_middle_0_5_3_renamed_symm_mem_gate_found_through_the_flag() -> None:
    """0.5.3 calls the class SymmMemCommunicator (sglang/srt/distributed/device_communicators/symm_mem.py), so the
    configured TorchSymmMemCommunicator.__init__ is absent; model_runner.py:657
    `set_symm_mem_all_reduce(self.server_args.enable_torch_symm_mem)` -> parallel_state.py:1376-1378 (the global
    _ENABLE_SYMM_MEM_ALL_REDUCE) -> :1269 -> GroupCoordinator -> :354 `SymmMemCommunicator(` leads to it, so the
    absent gate is n/a, decided by the renamed one: symm_mem.py:78 `if self.device_capability < 9:` returns (:84)
    on sm_80, :85 `SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]` (all_reduce_utils.py:3, keys 9 / 10)
    raises KeyError: 12 on sm_120. Before the flag was followed nothing decided the feature here (a failure)."""
    found = [f for f in _findings("0.5.3") if f.feature == SYMM and f.kind == "gate"]
    absent = [f for f in found if f.arch == "all"]
    assert [(f.symbol, f.outcome, f.verdict) for f in absent] == [
        ("TorchSymmMemCommunicator.__init__", "n/a", "absent")
    ]
    renamed = "sglang.srt.distributed.device_communicators.symm_mem:SymmMemCommunicator.__init__"
    assert f"decided here by {renamed}" in absent[0].message
    assert {f.arch: (f.symbol, f.outcome, f.verdict) for f in found if f.arch != "all"} == {
        "sm_80": ("SymmMemCommunicator.__init__", "fail", "gated-off"),
        "sm_90": ("SymmMemCommunicator.__init__", "pass", "ok"),
        "sm_100": ("SymmMemCommunicator.__init__", "pass", "ok"),
        "sm_120": ("SymmMemCommunicator.__init__", "fail", "missing-crash"),
    }
    sm120 = next(f for f in found if f.arch == "sm_120")
    assert (
        "raises KeyError: 12 at sglang/srt/distributed/device_communicators/symm_mem.py:85" in sm120.message
    )
    assert "sglang/srt/model_executor/model_runner.py:657 `set_symm_mem_all_reduce(" in sm120.message


def test_newest_0_5_23_symm_mem_gate_found_by_following_its_flag() -> None:
    """0.5.23 reads it in sglang/srt/distributed/bootstrap.py:254 `set_torch_symm_mem_all_reduce(
    get_exec().comm.enable_torch_symm_mem)`; parallel_state.py:2347-2349 store it in the global, :2178-2179
    and the GroupCoordinator call at :2186 (`use_torch_symm_mem_all_reduce=use_torch_symm_mem_allreduce`, :2193)
    pass it on, :427 keeps it, :535 `if self.use_torch_symm_mem_all_reduce and self.world_size > 1:` constructs
    TorchSymmMemCommunicator; its __init__ (torch_symm_mem.py:80-89, `supported_max_sizes =
    TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES.get(self.device_capability)`, `if supported_max_sizes is None: ...
    return`) is off on sm_80 and sm_120, on on sm_90 / sm_100: the configured gate's verdicts."""
    found = _symm_by_flag("0.5.23")
    gate = {f.arch: (f.outcome, f.verdict) for f in found if f.kind == "gate"}
    assert gate == {
        "sm_80": ("fail", "gated-off"),
        "sm_90": ("pass", "ok"),
        "sm_100": ("pass", "ok"),
        "sm_120": ("fail", "gated-off"),
    }
    assert gate == _verdicts("0.5.23", kind="gate", symbol="TorchSymmMemCommunicator.__init__")
    sm120 = next(f for f in found if f.kind == "gate" and f.arch == "sm_120")
    assert "because `supported_max_sizes is None` is True at " in sm120.message
    assert (
        "found by following enable_torch_symm_mem: sglang/srt/distributed/bootstrap.py:254 " in sm120.message
    )
    assert "sglang/srt/distributed/parallel_state.py:535 `self.use_torch_symm_mem_all_reduce" in sm120.message
    assert not [f for f in found if f.kind == "flag"]


# --------------------------------------------------------------------------------------------- EAGLE-3, newest


def test_newest_0_5_23_eagle3_verdicts() -> None:
    """0.5.23: models/kimi_k25.py:928 and :965 define set_eagle3_layers_to_capture and get_embed_and_head on
    KimiK25ForConditionalGeneration (implemented; the class is `class KimiK25ForConditionalGeneration(nn.Module)`,
    :640, so `named_modules` is torch.nn.Module's: inherited); speculative/pp_draft_embedding.py:86 probes
    `hasattr(target_model, "get_embed_and_head_for_draft")`, which only the Gemma models define
    (models/gemma3_causal.py:954): optional-missing, which passes. LlamaForCausalLMEagle3 (models/llama_eagle3.py:272,
    `(LlamaForCausalLM)`) inherits set_embed / set_embed_and_head (models/llama.py:910, :895). No target class is
    missing from the release and none misses a required method (0.4.10.post2's missing and class-not-in-release
    are pinned in test_eagle3.py); no class delegates (no __getattr__ forwarding among these classes)."""
    root = _tree("0.5.23")
    contract = derive_contract(root)
    tree = SourceTree([root])
    kimi = {f.method: f for f in check_class(tree, "KimiK25ForConditionalGeneration", "target", contract,
                                             include_optional=True)}  # fmt: skip
    assert kimi["set_eagle3_layers_to_capture"].verdict == "implemented"
    assert kimi["set_eagle3_layers_to_capture"].provider_file == "sglang/srt/models/kimi_k25.py:928"
    assert kimi["get_embed_and_head"].verdict == "implemented"
    assert (kimi["named_modules"].verdict, kimi["named_modules"].provider_class) == (
        "inherited",
        "torch.nn.Module",
    )
    assert kimi["get_embed_and_head_for_draft"].verdict == "optional-missing"
    assert kimi["get_embed_and_head_for_draft"].ok
    draft = {f.method: f for f in check_class(tree, "LlamaForCausalLMEagle3", "draft", contract)}
    assert (draft["set_embed"].verdict, draft["set_embed"].provider_class) == (
        "inherited",
        "LlamaForCausalLM",
    )
    for name in ("DeepseekV3ForCausalLM", "LlamaForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM"):
        verdicts = {f.verdict for f in check_class(tree, name, "target", contract, include_optional=True)}
        assert verdicts <= {"implemented", "inherited", "optional-missing"}, (name, verdicts)


def _eagle3(version: str) -> dict[str, dict[str, str]]:
    """class -> {method: verdict} over the corpus's targets and draft (optional names included)."""
    from stackfarm.corpus import DRAFTS, TARGETS

    root = _tree(version)
    contract = derive_contract(root)
    tree = SourceTree([root])
    wanted = [("target", t) for t in TARGETS] + [("draft", d) for d in DRAFTS]
    return {
        name: {f.method: f.verdict for f in check_class(tree, name, role, contract, include_optional=True)}  # type: ignore[arg-type]
        for role, name in wanted
    }


def _not_implemented(verdicts: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    return {c: {m: v for m, v in ms.items() if v != "implemented"} for c, ms in verdicts.items()}


def test_eagle3_classes_old_middle_newest() -> None:
    """Every EAGLE-3 verdict class of the corpus's classes on 0.4.10.post2, 0.5.5, 0.5.9 and 0.5.23:

    - 0.4.10.post2: no models/gpt_oss.py and no models/kimi_k25.py (class-not-in-release); models/qwen2.py,
      deepseek_v2.py and glm4_moe.py never mention set_eagle3_layers_to_capture (missing; qwen3.py does, :1
      occurrence); glm4_moe.py:754 `class Glm4MoeForCausalLM(DeepseekV2ForCausalLM)` inherits
      get_embed_and_head; the draft inherits set_embed / set_eagle3_layers_to_capture from LlamaForCausalLM;
      no hasattr-probed name yet (no optional-missing);
    - 0.5.5: still no models/kimi_k25.py; every other target implements both hooks; the draft inherits forward,
      set_embed, set_embed_and_head, set_eagle3_layers_to_capture;
    - 0.5.9: models/kimi_k25.py:648 `class KimiK25ForConditionalGeneration(nn.Module)` defines neither hook
      (missing: the kimi-k25-eagle3 patch set adds them; upstream from 0.5.10);
    - 0.5.23: nothing missing, every class present; optional-missing only for hasattr-probed names
      (pp_draft_embedding.py:86 get_embed_and_head_for_draft; eagle_worker_v2's set_lm_head_from_target).
    No class of these delegates through __getattr__ in any of them (delegated never occurs)."""
    old = _not_implemented(_eagle3("0.4.10.post2"))
    assert old["GptOssForCausalLM"] == {"*": "class-not-in-release"}
    assert old["KimiK25ForConditionalGeneration"] == {"*": "class-not-in-release"}
    for name in ("Qwen2ForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        assert old[name] == {"set_eagle3_layers_to_capture": "missing"}, name
    assert old["Glm4MoeForCausalLM"] == {
        "get_embed_and_head": "inherited",
        "set_eagle3_layers_to_capture": "missing",
    }
    assert old["Qwen3ForCausalLM"] == {}
    assert old["LlamaForCausalLMEagle3"] == {
        "set_eagle3_layers_to_capture": "inherited",
        "set_embed": "inherited",
    }
    middle = _not_implemented(_eagle3("0.5.5"))
    assert middle.pop("KimiK25ForConditionalGeneration") == {"*": "class-not-in-release"}
    assert set(middle.pop("LlamaForCausalLMEagle3").values()) == {"inherited"}
    assert all(v == {} for v in middle.values()), middle
    kimi_0_5_9 = _eagle3("0.5.9")["KimiK25ForConditionalGeneration"]
    assert kimi_0_5_9 == {"get_embed_and_head": "missing", "set_eagle3_layers_to_capture": "missing"}
    new = _eagle3("0.5.23")
    verdicts = {v for ms in new.values() for v in ms.values()}
    assert verdicts == {"implemented", "inherited", "optional-missing"}
    optional = {m for ms in new.values() for m, v in ms.items() if v == "optional-missing"}
    assert optional == {"get_embed_and_head_for_draft", "set_lm_head_from_target"}
    for version_verdicts in (old, middle, new):
        assert "delegated" not in {v for ms in version_verdicts.values() for v in ms.values()}
