"""stackfarm.numerics.tinymodels: the tiny models the numerics suite writes, and the checks on model folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stackfarm.numerics.tinymodels import (
    AUX_LAYERS,
    CPU_TARGET,
    GPU_TARGET,
    LlamaShape,
    ModelInputError,
    check_draft,
    eagle3_config,
    read_config,
    write_assistant,
    write_eagle3_draft,
    write_target,
)

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def test_target_logits_have_the_asked_std(tmp_path: Path) -> None:
    """The scaled LM head gives logits of std ~logit_std: peaked, so top-2 ties are rare."""
    transformers = pytest.importorskip("transformers")
    folder = write_target(tmp_path / "t", CPU_TARGET, logit_std=3.0, dtype="float32")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ids = torch.randint(3, CPU_TARGET.vocab, (4, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
    std = logits.std(dim=-1).mean().item()
    assert 2.4 < std < 3.6, std
    probs = torch.softmax(logits, dim=-1)
    assert probs.max(dim=-1).values.mean().item() > 5 / CPU_TARGET.vocab  # far from uniform


def test_target_is_seeded_and_complete(tmp_path: Path) -> None:
    a = write_target(tmp_path / "a", CPU_TARGET, seed=7)
    b = write_target(tmp_path / "b", CPU_TARGET, seed=7)
    c = write_target(tmp_path / "c", CPU_TARGET, seed=8)
    wa = safetensors_torch.load_file(str(a / "model.safetensors"))
    wb = safetensors_torch.load_file(str(b / "model.safetensors"))
    wc = safetensors_torch.load_file(str(c / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["lm_head.weight"], wc["lm_head.weight"])
    config = json.loads((a / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] == CPU_TARGET.hidden
    assert sum(1 for k in wa if k.endswith("q_proj.weight")) == CPU_TARGET.layers


def test_eagle3_draft_layout(tmp_path: Path) -> None:
    """The names and shapes SGLang 0.5.15's llama_eagle3 loader reads (prefix-less, 2x-wide first attention)."""
    folder = write_eagle3_draft(tmp_path / "d", GPU_TARGET)
    weights = safetensors_torch.load_file(str(folder / "model.safetensors"))
    hidden = GPU_TARGET.hidden
    assert weights["layers.0.self_attn.q_proj.weight"].shape == (
        GPU_TARGET.heads * GPU_TARGET.head_dim,
        2 * hidden,
    )
    assert weights["fc.weight"].shape == (hidden, hidden * len(AUX_LAYERS))
    assert {"layers.0.hidden_norm.weight", "norm.weight", "lm_head.weight"} <= set(weights)
    assert not any(k.startswith("model.") or "embed_tokens" in k for k in weights)
    config = read_config(folder)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(AUX_LAYERS)
    check_draft(read_config(write_target(tmp_path / "t", GPU_TARGET)), config, role="eagle3")


def test_eagle3_draft_needs_enough_target_layers(tmp_path: Path) -> None:
    with pytest.raises(ModelInputError, match="needs a target of >= 4 layers"):
        write_eagle3_draft(tmp_path / "d", LlamaShape(layers=3))


def test_assistant_is_the_targets_first_layer(tmp_path: Path) -> None:
    target = write_target(tmp_path / "t", CPU_TARGET)
    assistant = write_assistant(tmp_path / "a", target)
    wt = safetensors_torch.load_file(str(target / "model.safetensors"))
    wa = safetensors_torch.load_file(str(assistant / "model.safetensors"))
    assert read_config(assistant)["num_hidden_layers"] == 1
    assert not any(k.startswith("model.layers.1.") for k in wa)
    assert all(torch.equal(wa[k], wt[k]) for k in wa)
    check_draft(read_config(target), read_config(assistant), role="assistant")
    with pytest.raises(ModelInputError, match="cannot keep 9"):
        write_assistant(tmp_path / "b", target, layers=9)


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "file").write_text("x") and p / "file", "is not a folder"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "has no config.json"),
    ],
)
def test_read_config_reports_bad_folders(tmp_path: Path, make: object, text: str) -> None:
    with pytest.raises(ModelInputError, match=text):
        read_config(make(tmp_path))  # type: ignore[operator]


def test_read_config_reports_bad_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelInputError, match="not readable JSON"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ModelInputError, match="lacks integer vocab_size, num_hidden_layers"):
        read_config(tmp_path)


def test_check_draft_mismatches() -> None:
    target = {"hidden_size": 256, "vocab_size": 1024, "num_hidden_layers": 4}
    good = eagle3_config(GPU_TARGET)
    check_draft(target, good, role="eagle3")
    with pytest.raises(ModelInputError, match="hidden_size 512 does not fit the target's 256"):
        check_draft(target, {**good, "hidden_size": 512, "target_hidden_size": 256}, role="eagle3")
    with pytest.raises(ModelInputError, match="target hidden states of size 4096"):
        check_draft(target, {**good, "target_hidden_size": 4096}, role="eagle3")
    with pytest.raises(ModelInputError, match="draft_vocab_size 2048 exceeds"):
        check_draft(target, {**good, "draft_vocab_size": 2048}, role="eagle3")
    with pytest.raises(ModelInputError, match="reads target layers"):
        check_draft({**target, "num_hidden_layers": 3}, good, role="eagle3")
    with pytest.raises(ModelInputError, match="share the target's vocabulary"):
        check_draft(target, {**target, "vocab_size": 1000}, role="assistant")
    with pytest.raises(ValueError, match="unknown draft role"):
        check_draft(target, good, role="medusa")
