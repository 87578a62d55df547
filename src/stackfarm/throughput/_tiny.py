"""A tiny Llama target and its EAGLE-3 draft, as config files only (SGLang fills dummy weights).

Private to this package: a stand-in for `stackfarm.numerics.tinymodels`, which was being written in
parallel and did not exist yet; switch to it once it does. Throughput does not depend on the weights'
values, so ``--load-format dummy`` is enough here (the numerics suite needs real, peaked weights).

The shapes are those SGLang 0.5.15 accepts for EAGLE-3 (see ../shared/device/README.md): the target needs
at least 4 layers, because the draft captures the hidden states after layers [0, 1, 2] (+1 inside SGLang);
the draft reads draft_vocab_size, target_hidden_size and eagle_config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HIDDEN = 256
HEADS = 4
INTERMEDIATE = 512
VOCAB = 1024
MAX_POSITIONS = 2048
TARGET_LAYERS = 4
AUX_LAYERS = (0, 1, 2)


def _llama(architecture: str, layers: int) -> dict[str, Any]:
    return {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }


def write_tiny_pair(folder: Path) -> tuple[Path, Path]:
    """Write target/ and draft/ config folders under `folder`; return their paths."""
    target, draft = folder / "tiny-llama", folder / "tiny-llama-eagle3"
    draft_config = _llama("LlamaForCausalLMEagle3", 1) | {
        "draft_vocab_size": VOCAB,
        "target_hidden_size": HIDDEN,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS), "use_aux_hidden_state": True},
    }
    for path, config in ((target, _llama("LlamaForCausalLM", TARGET_LAYERS)), (draft, draft_config)):
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return target, draft


__all__ = ["VOCAB", "write_tiny_pair"]
