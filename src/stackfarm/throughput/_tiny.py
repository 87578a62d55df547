"""The Llama target and EAGLE-3 draft the suite serves when no model_path is set: config files only.

The shapes and configs come from `stackfarm.numerics.tinymodels` (the numerics suite's writer: the shapes
SGLang 0.5.15 was seen to accept on the H200). Only the config.json files are written here, and the servers
run with ``--load-format dummy``: throughput does not depend on the weights' values, and this way the pytest
process never imports torch. (Numerics needs real, peaked weights: it calls that module's write_* itself.)

`SHAPES` names the shapes settings.model_shape may pick: "llama-3-8b" (the suite's default: Llama-3-8B's
dimensions, 16 GB of dummy bf16 weights per server, so decode is bound by the GPU's memory bandwidth, as in
production) and "tiny" (the numerics suite's 4-layer model: fits any GPU, but at ~1.5 ms a token it measures
SGLang's Python scheduler more than the GPU).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..numerics.tinymodels import (
    GPU_TARGET,
    LlamaShape,
    check_draft,
    eagle3_config,
    llama_config,
    read_config,
)

SHAPES: dict[str, LlamaShape] = {
    "tiny": GPU_TARGET,
    "llama-3-8b": LlamaShape(
        hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=128256, max_positions=8192
    ),
}


def write_dummy_pair(folder: Path, shape: str = "tiny") -> tuple[Path, Path]:
    """Write <shape>-llama/ and <shape>-llama-eagle3/ config folders under `folder`; return their paths."""
    target, draft = folder / f"{shape}-llama", folder / f"{shape}-llama-eagle3"
    dims = SHAPES[shape]
    for path, config in ((target, llama_config(dims)), (draft, eagle3_config(dims))):
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return target, draft


def check_models(target: str, draft: str | None) -> None:
    """ModelInputError (a StackfarmError) when a configured model folder is unusable or the draft does not fit."""
    target_config = read_config(target)
    if draft is not None:
        check_draft(target_config, read_config(draft), role="eagle3")


__all__ = ["SHAPES", "check_models", "write_dummy_pair"]
