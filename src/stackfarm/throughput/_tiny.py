"""The tiny Llama target and EAGLE-3 draft the suite serves when no model_path is set: config files only.

The shapes and configs come from `stackfarm.numerics.tinymodels` (the numerics suite's writer: the shapes
SGLang 0.5.15 was seen to accept on the H200). Only the config.json files are written here, and the servers
run with ``--load-format dummy``: throughput does not depend on the weights' values, and this way the pytest
process never imports torch. (Numerics needs real, peaked weights: it calls that module's write_* itself.)
"""

from __future__ import annotations

import json
from pathlib import Path

from ..numerics.tinymodels import GPU_TARGET, check_draft, eagle3_config, llama_config, read_config


def write_tiny_pair(folder: Path) -> tuple[Path, Path]:
    """Write tiny-llama/ and tiny-llama-eagle3/ config folders under `folder`; return their paths."""
    target, draft = folder / "tiny-llama", folder / "tiny-llama-eagle3"
    for path, config in ((target, llama_config(GPU_TARGET)), (draft, eagle3_config(GPU_TARGET))):
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return target, draft


def check_models(target: str, draft: str | None) -> None:
    """ModelInputError (a StackfarmError) when a configured model folder is unusable or the draft does not fit."""
    target_config = read_config(target)
    if draft is not None:
        check_draft(target_config, read_config(draft), role="eagle3")


__all__ = ["check_models", "write_tiny_pair"]
