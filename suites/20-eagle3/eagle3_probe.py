"""Build a tiny EAGLE-3 target and draft with the real SGLang and exercise the contract's hooks on a GPU.

Run by test_eagle3.py in a child process of its own session (SGLang kills its whole process tree when
something fails, and leaves threads behind), one (target, draft) pair per run:

    python eagle3_probe.py --target LlamaForCausalLM --draft LlamaForCausalLMEagle3 --workdir D --out r.json

It writes the tiny configs (dummy weights: shapes are what is checked, not values), loads the target through
SGLang's own one-batch benchmark path (`load_model`: the ModelRunner set-up `python -m sglang.bench_one_batch`
uses in 0.5.9 ... 0.5.15), and then, per name the suite asks for:

- target `get_embed_and_head()` -> two tensors of shape [vocab, hidden];
- target `set_eagle3_layers_to_capture(ids)` + one prefill forward -> the aux hidden states reaching the
  logits processor are len(ids) tensors of shape [tokens, hidden];
- draft (built with `sglang.srt.model_loader.get_model`) `set_embed(embed)` / `set_embed_and_head(embed,
  head)` -> the draft's own `get_embed_and_head()` then returns the target's very tensors (same storage);
- any other name -> the attribute exists on the built model.

The result is JSON: {"sglang", "stages", "checks": [{"role", "name", "ok", "detail"}], "error", "traceback"}.
Only the standard library and stackfarm.numerics.tinymodels (itself stdlib-only) are imported at module level,
so the suite can import this file on any machine.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stackfarm.numerics.tinymodels import (
    AUX_LAYERS,
    GPU_TARGET,
    SGLANG_OFFLINE_ENV,
    eagle3_config,
    llama_config,
)
from stackfarm.proc import register_group

# The tiny Llama pair is numerics' (stdlib-only, on PYTHONPATH in every backend): one config for both suites.
HIDDEN = GPU_TARGET.hidden
HEADS = GPU_TARGET.heads
INTERMEDIATE = GPU_TARGET.intermediate
VOCAB = GPU_TARGET.vocab
MAX_POSITIONS = GPU_TARGET.max_positions
# EAGLE-3 captures after layers ids+1: with ids [0, 1, 2] the target needs at least 4 layers.
TARGET_LAYERS = GPU_TARGET.layers
AUX_LAYER_IDS = AUX_LAYERS
#: Two prompts of equal length (the benchmark helper takes rows of token ids), inside the tiny vocabulary.
PROMPTS = ((1, 17, 42, 99, 128, 7, 300, 511), (1, 900, 3, 3, 64, 65, 66, 1000))


def _llama(arch: str, layers: int) -> dict[str, Any]:
    return llama_config(GPU_TARGET, architecture=arch, layers=layers)


def _deepseek_v3(arch: str, layers: int) -> dict[str, Any]:
    # MLA + MoE at toy sizes; layer 0 dense, the rest MoE, as in the real model. Best effort: not every kernel
    # SGLang picks accepts such small ranks, which the probe then reports as a build error.
    return {
        "architectures": [arch],
        "model_type": "deepseek_v3",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "moe_intermediate_size": 128,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "q_lora_rank": 128,
        "kv_lora_rank": 128,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 64,
        "v_head_dim": 64,
        "hidden_act": "silu",
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }


def _kimi_k25(arch: str, layers: int) -> dict[str, Any]:
    # Kimi K2.5 (the seeds' model): a MoonViT vision tower and projector around a DeepseekV3 language model
    # (sglang/srt/models/kimi_k25.py builds DeepseekV3ForCausalLM(config.text_config); its EAGLE-3 hooks
    # delegate to it). The vision side at toy sizes: it is built, not run (the probe feeds token ids only).
    return {
        "architectures": [arch],
        "model_type": "kimi_k25",
        "text_config": _deepseek_v3("DeepseekV3ForCausalLM", layers),
        "vision_config": {
            "patch_size": 14,
            "init_pos_emb_height": 4,
            "init_pos_emb_width": 4,
            "init_pos_emb_time": 4,
            "pos_emb_type": "divided_fixed",
            "num_attention_heads": 2,
            "num_hidden_layers": 1,
            "hidden_size": 64,
            "intermediate_size": 128,
            "vt_hidden_size": 64,
            "merge_kernel_size": [2, 2],
            "video_attn_type": "spatial_temporal",
            "merge_type": "sd2_tpool",
            "mm_projector_type": "patchmerger",
            "text_hidden_size": HIDDEN,
        },
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }


def _llama_eagle3_draft(arch: str, layers: int) -> dict[str, Any]:
    # What SGLang's llama_eagle3.py and the EAGLE-3 worker read: the draft's fc takes len(ids) target states.
    return {**eagle3_config(GPU_TARGET), "architectures": [arch], "num_hidden_layers": layers}


#: Target classes the probe can build from a tiny config.
TINY_TARGETS: dict[str, Callable[[str, int], dict[str, Any]]] = {
    "LlamaForCausalLM": _llama,
    "DeepseekV3ForCausalLM": _deepseek_v3,
    "KimiK25ForConditionalGeneration": _kimi_k25,
}
#: Draft classes likewise.
TINY_DRAFTS: dict[str, Callable[[str, int], dict[str, Any]]] = {"LlamaForCausalLMEagle3": _llama_eagle3_draft}


def tiny_configs(target: str, draft: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The target and draft config.json contents; KeyError for a class without a tiny config."""
    return TINY_TARGETS[target](target, TARGET_LAYERS), TINY_DRAFTS[draft](draft, 1)


def _cuda_home() -> str | None:
    """A CUDA toolkit folder with bin/nvcc and include/cuda_runtime.h, for SGLang's JIT kernels (tvm-ffi).

    Without CUDA_HOME, tvm-ffi guesses dirname(dirname(which nvcc)), wrong when nvcc is a wrapper script (as
    on the lent H200 machines); the wrapper names the real nvcc, so look there too.
    """
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
        with contextlib.suppress(OSError):
            head = Path(nvcc).read_bytes()[:4096].decode("utf-8", errors="ignore")
            candidates += [str(Path(m).parent.parent) for m in re.findall(r"(/\S+/bin/nvcc)\b", head)]
    candidates += sorted((str(p) for p in Path("/usr/local").glob("cuda*")), reverse=True)
    for candidate in candidates:
        if candidate and all((Path(candidate) / f).is_file() for f in ("bin/nvcc", "include/cuda_runtime.h")):
            return candidate
    return None


def _prepare_toolchain(scratch: Path) -> str:
    """Point CUDA_HOME at a toolkit whose lib64 has libcudart.so (a symlinked shim when it has only .so.N)."""
    home = _cuda_home()
    if home is None:
        return (
            "no CUDA toolkit with bin/nvcc and include/cuda_runtime.h found: SGLang's JIT kernels will fail"
        )
    root = Path(home)
    if not any((root / d / "libcudart.so").exists() for d in ("lib64", "lib")):
        found = [
            p for d in ("lib64", "lib", "targets/x86_64-linux/lib") for p in (root / d).glob("libcudart.so.*")
        ]
        if found:
            shim = scratch / "cuda-home"
            (shim / "lib64").mkdir(parents=True, exist_ok=True)
            for name in ("bin", "include", "nvvm"):
                if (root / name).exists() and not (shim / name).exists():
                    (shim / name).symlink_to((root / name).resolve())
            if not (shim / "lib64/libcudart.so").exists():
                (shim / "lib64/libcudart.so").symlink_to(found[0].resolve())
            root = shim
    os.environ["CUDA_HOME"] = str(root)
    os.environ["PATH"] = (
        f"{root / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    return f"CUDA_HOME={root} (toolkit {home})"


def _write_model(folder: Path, config: dict[str, Any]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    generation = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")
    return str(folder)


class _Probe:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.start = time.monotonic()
        self.result: dict[str, Any] = {"target": args.target, "draft": args.draft, "stages": [], "checks": []}

    def stage(self, text: str) -> None:
        line = f"[{time.monotonic() - self.start:6.1f}s] {text}"
        print(line, flush=True)
        self.result["stages"].append(line)

    def check(self, role: str, name: str, ok: bool, detail: str) -> None:
        self.stage(f"check {role}.{name}: {'ok' if ok else 'FAILED'}: {detail}")
        self.result["checks"].append({"role": role, "name": name, "ok": bool(ok), "detail": detail})

    def guarded(self, role: str, name: str, action: Callable[[], tuple[bool, str]]) -> None:
        try:
            ok, detail = action()
        except Exception as exc:  # a hook that raises is a failed check, with its traceback
            ok, detail = False, f"{type(exc).__name__}: {exc} | {traceback.format_exc(limit=3)[-600:]}"
        self.check(role, name, ok, detail)

    def run(self) -> None:
        args = self.args
        workdir = Path(args.workdir)
        target_config, draft_config = tiny_configs(args.target, args.draft)
        target_dir = _write_model(workdir / "target", target_config)
        draft_dir = _write_model(workdir / "draft", draft_config)
        self.stage(_prepare_toolchain(workdir))
        self._import_sglang()
        bench, server_args, runner, target = self._load_target(target_dir)
        tensors: dict[str, Any] = {}
        self._check_target(bench, runner, target, tensors)
        draft = self._build_draft(server_args, draft_dir)
        self._check_draft(draft, tensors)

    def _import_sglang(self) -> None:
        args = self.args
        import sglang
        import torch

        self.result["sglang"] = getattr(sglang, "__version__", "?")
        # SGLang's registry skips a model module that fails to import and may then build another class for the
        # architecture (0.5.15 without nvidia-cutlass-dsl builds TransformersMoEForCausalLM for DeepseekV3):
        # import the modules ourselves, so such a failure is reported as what it is.
        for module in (args.target_module, args.draft_module):
            if module:
                try:
                    importlib.import_module(module)
                except Exception as exc:
                    raise RuntimeError(f"cannot import {module}: {type(exc).__name__}: {exc}") from exc
        self.stage(
            f"sglang {self.result['sglang']} from {Path(sglang.__file__).parent}, torch {torch.__version__}"
        )

    def _load_target(self, target_dir: str) -> tuple[Any, Any, Any, Any]:
        """bench_one_batch (the module), the server args, the target's model runner and the target model."""
        args = self.args
        try:
            from sglang.benchmark import one_batch as bench
        except ImportError:
            from sglang import bench_one_batch as bench
        from sglang.srt.server_args import PortArgs, ServerArgs

        server_args = ServerArgs(
            model_path=target_dir,
            load_format="dummy",
            skip_tokenizer_init=True,
            attention_backend=args.attention_backend,
            sampling_backend="pytorch",
            disable_cuda_graph=True,
            mem_fraction_static=0.3,
            max_total_tokens=4096,
            context_length=MAX_POSITIONS,
            random_seed=0,
            log_level="error",
        )
        # The same preparation bench_one_batch's main() and latency_test() do, where this version has it.
        for name in (
            "_set_envs_and_config",
            "initialize_moe_config",
            "initialize_fp8_gemm_config",
            "initialize_fp4_gemm_config",
        ):
            prepare = getattr(bench, name, None)
            if prepare is not None:
                prepare(server_args)
        port_args = PortArgs.init_new(server_args)
        bench.get_tokenizer = lambda *_a, **_k: None  # ids are fed directly: the tiny model has no tokenizer
        self.stage("loading the target through bench_one_batch.load_model")
        loaded, _tokenizer = bench.load_model(server_args, port_args, 0, 0)
        runner = getattr(loaded, "torch_runner", loaded)
        target = runner.model
        self.stage(f"target built: {type(target).__name__}")
        if type(target).__name__ != args.target:
            raise RuntimeError(f"SGLang built {type(target).__name__}, not {args.target}")
        return bench, server_args, runner, target

    def _check_target(self, bench: Any, runner: Any, target: Any, tensors: dict[str, Any]) -> None:
        """Call the target's hooks: get_embed_and_head first (its tensors go to the draft), then the others."""
        import torch
        from sglang.srt.layers.logits_processor import LogitsProcessor

        needs_target = [n for n in self.args.target_needs.split(",") if n]

        def embed_and_head() -> tuple[bool, str]:
            embed, head = target.get_embed_and_head()
            tensors.update(embed=embed, head=head)
            want = (VOCAB, HIDDEN)
            ok = tuple(embed.shape) == want and tuple(head.shape) == want
            return ok, f"embed {tuple(embed.shape)}, head {tuple(head.shape)}, expected {want} each"

        def capture() -> tuple[bool, str]:
            seen: list[Any] = []

            def hook(_module: Any, hook_args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                aux = kwargs.get("aux_hidden_states", hook_args[4] if len(hook_args) > 4 else None)
                seen.append(aux)

            handles = [
                m.register_forward_pre_hook(hook, with_kwargs=True)
                for m in target.modules()
                if isinstance(m, LogitsProcessor)
            ]
            try:
                target.set_eagle3_layers_to_capture(list(AUX_LAYER_IDS))
                reqs = bench.prepare_synthetic_inputs_for_latency_test(
                    len(PROMPTS), len(PROMPTS[0]), custom_inputs=[list(p) for p in PROMPTS]
                )
                bench.extend(reqs, runner)
                torch.cuda.synchronize()
            finally:
                for handle in handles:
                    handle.remove()
            if not handles:
                return False, "the target has no LogitsProcessor to observe the aux hidden states at"
            if not seen or seen[-1] is None:
                return (
                    False,
                    f"forward ran ({len(seen)} logits call(s)) but no aux hidden states reached the logits",
                )
            aux = seen[-1]
            shapes = [tuple(aux.shape)] if isinstance(aux, torch.Tensor) else [tuple(t.shape) for t in aux]
            tokens = sum(len(p) for p in PROMPTS)
            if isinstance(aux, torch.Tensor):  # some models concatenate before the logits processor
                ok = shapes[0] == (tokens, HIDDEN * len(AUX_LAYER_IDS))
            else:
                ok = len(shapes) == len(AUX_LAYER_IDS) and all(s == (tokens, HIDDEN) for s in shapes)
            want = f"{len(AUX_LAYER_IDS)} x {(tokens, HIDDEN)}"
            return ok, f"ids {list(AUX_LAYER_IDS)} -> aux {shapes}, expected {want}"

        known_target = {"get_embed_and_head": embed_and_head, "set_eagle3_layers_to_capture": capture}
        for name in sorted(
            set(needs_target) | {"get_embed_and_head"}, key=lambda n: n != "get_embed_and_head"
        ):
            action = known_target.get(name) or self._present(target, name)
            self.guarded("target", name, action)

    def _build_draft(self, server_args: Any, draft_dir: str) -> Any:
        from sglang.srt.configs.device_config import DeviceConfig
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_loader import get_model

        args = self.args
        self.stage("building the draft with sglang.srt.model_loader.get_model")
        draft_model_config = ModelConfig.from_server_args(
            server_args, model_path=draft_dir, is_draft_model=True
        )
        draft = get_model(
            model_config=draft_model_config,
            load_config=LoadConfig(load_format="dummy"),
            device_config=DeviceConfig("cuda", 0),
        )
        self.stage(f"draft built: {type(draft).__name__}")
        if type(draft).__name__ != args.draft:
            raise RuntimeError(f"SGLang built {type(draft).__name__}, not {args.draft}")
        return draft

    def _check_draft(self, draft: Any, tensors: dict[str, Any]) -> None:
        """Hand the target's tensors to the draft (set_embed / set_embed_and_head), then the other hooks."""

        def shares(names: tuple[str, ...]) -> tuple[bool, str]:
            if "embed" not in tensors:
                return False, "the target's get_embed_and_head() gave no tensors to share"
            args_ = [tensors[n] for n in names]
            getattr(draft, "set_embed" if names == ("embed",) else "set_embed_and_head")(*args_)
            if not hasattr(draft, "get_embed_and_head"):
                return (
                    True,
                    "accepted the target's tensors (the draft has no get_embed_and_head to verify with)",
                )
            got = dict(zip(("embed", "head"), draft.get_embed_and_head(), strict=True))
            same = {n: got[n].data_ptr() == tensors[n].data_ptr() for n in names}
            return all(same.values()), f"draft now shares the target's storage: {same}"

        known_draft = {
            "set_embed": lambda: shares(("embed",)),
            "set_embed_and_head": lambda: shares(("embed", "head")),
        }
        for name in [n for n in self.args.draft_needs.split(",") if n]:
            self.guarded("draft", name, known_draft.get(name) or self._present(draft, name))

    @staticmethod
    def _present(model: Any, name: str) -> Callable[[], tuple[bool, str]]:
        def action() -> tuple[bool, str]:
            present = hasattr(model, name)
            value = getattr(model, name, None)
            what = "callable" if callable(value) else type(value).__name__
            return (
                present,
                f"attribute present on the built model ({what})" if present else "attribute missing",
            )

        return action


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--target-needs", default="get_embed_and_head,set_eagle3_layers_to_capture")
    parser.add_argument("--draft-needs", default="set_embed,set_embed_and_head")
    parser.add_argument("--target-module", default="", help="the module defining --target, imported first")
    parser.add_argument("--draft-module", default="", help="the module defining --draft, imported first")
    parser.add_argument("--attention-backend", default="triton")  # fa3 is left out of the H200 bundle
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError):  # OSError: already a group leader
        os.setsid()  # our own process group: SGLang's tree-kill on failure must not reach pytest
    register_group()  # ... and the runner reaps the group should the suite end first
    for key, value in SGLANG_OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    probe = _Probe(args)
    try:
        probe.run()
    except BaseException as exc:  # everything goes into the result file
        probe.result["error"] = f"{type(exc).__name__}: {exc}"
        probe.result["traceback"] = traceback.format_exc()[-6000:]
        print(probe.result["traceback"], file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps(probe.result, indent=1), encoding="utf-8")
    sys.stdout.flush()
    # SGLang leaves non-daemon threads and helper processes behind; do not wait for them.
    os._exit(0)


if __name__ == "__main__":
    main()
