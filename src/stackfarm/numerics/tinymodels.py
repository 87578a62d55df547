"""Tiny random-weight Llama models the suite writes itself: a target, an EAGLE-3 draft, an HF assistant draft.

Random weights give near-uniform logits (a tiny model's logprobs are all about -log(vocab)), so top-1 and top-2
are nearly tied at almost every step and any numerical noise flips greedy decoding: a real divergence would hide
among the ties. Here the LM head is scaled so the logits have a chosen standard deviation (`logit_std`): after
the final RMSNorm (weight 1) the hidden state has unit RMS, so logit_i = sum_j W_ij h_j has standard deviation
std(W) * sqrt(hidden), and W is drawn with the std that makes that `logit_std`. With std 2 and 1024 tokens the
median top-1/top-2 gap is ~0.37 nats and ~3.5 % of steps fall below the 1e-2 near-tie tolerance (measured: 9 of
256 steps, 8 prompts x 32 tokens, float32 and bfloat16 alike), where near-uniform weights put most steps there.

The shapes are the ones SGLang 0.5.15 was seen to accept on the H200 (/work/shared/device/README.md): >= 4 target
layers so the EAGLE-3 auxiliary layers (0, 1, 2) exist, an EAGLE-3 draft of one `LlamaForCausalLMEagle3` layer
whose first attention takes [embedding, fc(aux hidden states)] (2 x hidden wide), `draft_vocab_size`,
`target_hidden_size` and `eagle_config` in its config.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import StackfarmError

if TYPE_CHECKING:
    import torch

#: Std of every random weight except the scaled LM head (Llama's initializer_range).
INIT_STD = 0.02
#: The target layers whose hidden states EAGLE-3 feeds its draft (SGLang adds one to each internally).
AUX_LAYERS = (0, 1, 2)


class ModelInputError(StackfarmError):
    """A model folder the suite was pointed at is unusable (missing, no config, a draft that does not fit)."""


#: The environment every SGLang child of the suites runs in: nothing downloaded, and JIT caches outside any
#: per-run folder so that only the first run on a machine compiles (~70 s on the H200).
SGLANG_OFFLINE_ENV: Mapping[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "FLASHINFER_NO_DOWNLOAD": "1",
    "TRITON_CACHE_DIR": "/tmp/stackfarm-sgl-jit/triton",
    "TVM_FFI_CACHE_DIR": "/tmp/stackfarm-sgl-jit/tvm-ffi",
    "FLASHINFER_WORKSPACE_BASE": "/tmp/stackfarm-sgl-jit/flashinfer",
}


@dataclass(frozen=True, kw_only=True)
class LlamaShape:
    hidden: int = 256
    intermediate: int = 512
    layers: int = 4
    heads: int = 4
    kv_heads: int = 4
    vocab: int = 1024
    max_positions: int = 2048

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


#: The GPU end-to-end target (SGLang): the H200 probe's shape.
GPU_TARGET = LlamaShape()
#: The CPU target (HF transformers in CI): small enough that 8 prompts x 32 tokens take seconds.
CPU_TARGET = LlamaShape(hidden=64, intermediate=128, vocab=256, max_positions=512)


def llama_config(
    shape: LlamaShape,
    *,
    architecture: str = "LlamaForCausalLM",
    layers: int | None = None,
    dtype: str = "bfloat16",
) -> dict[str, Any]:
    """A Llama config.json as HF transformers and SGLang read it."""
    return {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers if layers is None else layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "vocab_size": shape.vocab,
        "max_position_embeddings": shape.max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        # Engines are told to ignore EOS (SGLang) or given none (HF), so every run has max_new_tokens tokens.
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": dtype,
        "initializer_range": INIT_STD,
        "use_cache": True,
    }


def head_std(hidden: int, logit_std: float) -> float:
    """The LM-head weight std that gives logits of standard deviation `logit_std` from a unit-RMS hidden state."""
    return logit_std / math.sqrt(hidden)


def _write(folder: Path, config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    generation = {"bos_token_id": 1, "pad_token_id": 0, "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return folder


def _layer(prefix: str, shape: LlamaShape, rnd: Any, ones: Any, in_dim: int) -> dict[str, torch.Tensor]:
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return {
        f"{prefix}self_attn.q_proj.weight": rnd(q, in_dim),
        f"{prefix}self_attn.k_proj.weight": rnd(kv, in_dim),
        f"{prefix}self_attn.v_proj.weight": rnd(kv, in_dim),
        f"{prefix}self_attn.o_proj.weight": rnd(shape.hidden, q),
        f"{prefix}mlp.gate_proj.weight": rnd(shape.intermediate, shape.hidden),
        f"{prefix}mlp.up_proj.weight": rnd(shape.intermediate, shape.hidden),
        f"{prefix}mlp.down_proj.weight": rnd(shape.hidden, shape.intermediate),
        f"{prefix}input_layernorm.weight": ones(shape.hidden),
        f"{prefix}post_attention_layernorm.weight": ones(shape.hidden),
    }


def _generators(seed: int) -> tuple[Any, Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)

    def rnd(*size: int, std: float = INIT_STD) -> torch.Tensor:
        return torch.randn(*size, generator=gen) * std

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n)

    return gen, rnd, ones


def write_target(
    folder: Path,
    shape: LlamaShape = GPU_TARGET,
    *,
    seed: int = 1234,
    logit_std: float = 2.0,
    dtype: str = "bfloat16",
) -> Path:
    """A seeded random LlamaForCausalLM (float32 weights on disk; engines cast to their dtype)."""
    _, rnd, ones = _generators(seed)
    tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rnd(shape.vocab, shape.hidden)}
    for i in range(shape.layers):
        tensors.update(_layer(f"model.layers.{i}.", shape, rnd, ones, shape.hidden))
    tensors["model.norm.weight"] = ones(shape.hidden)
    tensors["lm_head.weight"] = rnd(shape.vocab, shape.hidden, std=head_std(shape.hidden, logit_std))
    return _write(folder, llama_config(shape, dtype=dtype), tensors)


def eagle3_config(target: LlamaShape, *, dtype: str = "bfloat16") -> dict[str, Any]:
    """The config of a one-layer LlamaForCausalLMEagle3 draft for `target`, as SGLang 0.5.15 reads it."""
    config = llama_config(target, architecture="LlamaForCausalLMEagle3", layers=1, dtype=dtype)
    config.update(
        {
            # read unconditionally when tie_word_embeddings is False; == vocab, so no d2t map is needed
            "draft_vocab_size": target.vocab,
            # fc's input is target_hidden_size x number of aux layers
            "target_hidden_size": target.hidden,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS),
                "use_aux_hidden_state": True,
            },
        }
    )
    return config


def write_eagle3_draft(
    folder: Path,
    target: LlamaShape = GPU_TARGET,
    *,
    seed: int = 4321,
    logit_std: float = 2.0,
    dtype: str = "bfloat16",
) -> Path:
    """A seeded random EAGLE-3 draft (checkpoint names without "model.": SGLang's loader adds it)."""
    if target.layers < max(AUX_LAYERS) + 2:
        raise ModelInputError(
            f"an EAGLE-3 draft needs a target of >= {max(AUX_LAYERS) + 2} layers (aux layers {AUX_LAYERS}), "
            f"this target has {target.layers}"
        )
    _, rnd, ones = _generators(seed)
    tensors = _layer("layers.0.", target, rnd, ones, 2 * target.hidden)
    tensors["layers.0.hidden_norm.weight"] = ones(target.hidden)
    tensors["fc.weight"] = rnd(target.hidden, target.hidden * len(AUX_LAYERS))
    tensors["norm.weight"] = ones(target.hidden)
    tensors["lm_head.weight"] = rnd(target.vocab, target.hidden, std=head_std(target.hidden, logit_std))
    # embed_tokens is the target's: SGLang's EAGLE-3 worker hands it over (set_embed).
    return _write(folder, eagle3_config(target, dtype=dtype), tensors)


def write_assistant(folder: Path, target_folder: Path, *, layers: int = 1) -> Path:
    """An HF assisted-generation draft: the target's first `layers` layers with its embeddings, norm and head.

    A layer-skipping self-draft proposes what the target would often say, so assisted generation accepts some
    drafts and really exercises the multi-token verify path (a random draft would be rejected every time).
    """
    from safetensors.torch import load_file

    config = read_config(target_folder)
    if layers > int(config["num_hidden_layers"]):
        raise ModelInputError(
            f"{target_folder} has {config['num_hidden_layers']} layers, cannot keep {layers}"
        )
    weights = load_file(str(target_folder / "model.safetensors"))
    keep = {f"model.layers.{i}." for i in range(layers)}
    tensors = {
        name: t
        for name, t in weights.items()
        if not name.startswith("model.layers.") or any(name.startswith(k) for k in keep)
    }
    return _write(folder, {**config, "num_hidden_layers": layers}, tensors)


def read_config(folder: Path | str) -> dict[str, Any]:
    """A model folder's config.json, or a ModelInputError that says what is wrong with the folder."""
    path = Path(folder)
    if not path.exists():
        raise ModelInputError(f"model path {path} does not exist")
    if not path.is_dir():
        raise ModelInputError(f"model path {path} is not a folder")
    config = path / "config.json"
    if not config.is_file():
        raise ModelInputError(f"model path {path} has no config.json")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelInputError(f"{config} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelInputError(f"{config} is not a JSON object")
    missing = [
        k for k in ("hidden_size", "vocab_size", "num_hidden_layers") if not isinstance(data.get(k), int)
    ]
    if missing:
        raise ModelInputError(f"{config} lacks integer {', '.join(missing)}")
    return data


def check_draft(target: Mapping[str, Any], draft: Mapping[str, Any], *, role: str) -> None:
    """Raise ModelInputError when `draft` cannot serve `target` ("eagle3": SGLang; "assistant": HF)."""
    t_hidden, d_hidden = target["hidden_size"], draft["hidden_size"]
    if role == "eagle3":
        fed = draft.get("target_hidden_size", d_hidden)
        if fed != t_hidden:
            raise ModelInputError(
                f"the EAGLE-3 draft reads target hidden states of size {fed} (target_hidden_size), "
                f"the target's hidden_size is {t_hidden}"
            )
        if d_hidden != t_hidden:
            # The draft embeds tokens with the target's embedding table (SGLang's set_embed).
            raise ModelInputError(
                f"the EAGLE-3 draft's hidden_size {d_hidden} does not fit the target's {t_hidden}: "
                "it embeds tokens with the target's embedding table"
            )
        d_vocab = draft.get("draft_vocab_size") or draft["vocab_size"]
        if d_vocab > target["vocab_size"]:
            raise ModelInputError(
                f"draft_vocab_size {d_vocab} exceeds the target's vocab_size {target['vocab_size']}"
            )
        layers = target["num_hidden_layers"]
        aux = (draft.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or list(AUX_LAYERS)
        if max(aux) + 1 >= layers:
            raise ModelInputError(f"the draft reads target layers {aux} (+1), the target has only {layers}")
    elif role == "assistant":
        if draft["vocab_size"] != target["vocab_size"]:
            raise ModelInputError(
                f"an assistant draft must share the target's vocabulary: {draft['vocab_size']} vs {target['vocab_size']}"
            )
    else:
        raise ValueError(f"unknown draft role {role!r}")


__all__ = [
    "AUX_LAYERS",
    "CPU_TARGET",
    "GPU_TARGET",
    "INIT_STD",
    "LlamaShape",
    "ModelInputError",
    "check_draft",
    "eagle3_config",
    "head_std",
    "llama_config",
    "read_config",
    "write_assistant",
    "write_eagle3_draft",
    "write_target",
]
