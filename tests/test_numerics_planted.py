"""stackfarm.numerics.planted on CPU: the planted target's function, the comparison on it, and the EAGLE-3 draft's
planted acceptance, simulated the way SGLang runs the draft."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from stackfarm.numerics import planted
from stackfarm.numerics.compare import compare, judge
from stackfarm.numerics.engines import HFEngine
from stackfarm.numerics.tinymodels import GPU_TARGET, LlamaShape, write_assistant
from stackfarm.throughput._tiny import SHAPES

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

VOCAB = GPU_TARGET.vocab
NEW = 16
#: The alternating variant's pair: the reference target with one pair of tokens changed.
PAIR = (100, 102)


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny matrices: extra threads only contend on a busy CI box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("planted")
    return {
        "target": planted.write_target_planted(root / "target"),
        "alternate": planted.write_target_planted(root / "alternate", swap=PAIR),
        "draft": planted.write_draft_planted(root / "draft"),
        "half-wrong": planted.write_draft_planted(root / "half-wrong", wrong=planted.default_wrong(VOCAB)),
    }


def _prompts(rate: float = 0.5, count: int = 10) -> tuple[tuple[int, ...], ...]:
    return planted.planted_prompts(count, 12, rate=rate, vocab=VOCAB, seed=3)


def test_the_planted_function_holds_in_hf_with_a_large_margin(models: dict[str, Path]) -> None:
    prompts = (*_prompts(), (1, 7, PAIR[0]), (1, 9, PAIR[0] + 1))
    for name, swap in (("target", None), ("alternate", PAIR)):
        runs = HFEngine(model=models[name]).generate(prompts, NEW)
        for prompt, run in zip(prompts, runs, strict=True):
            assert list(run.tokens) == planted.planted_sequence(prompt, NEW, swap), (name, prompt)
        gaps = [s.gap for run in runs for s in run.steps if s.gap is not None]
        assert len(gaps) == len(prompts) * NEW
        assert min(gaps) > 50, (name, min(gaps))
    assert planted.planted_sequence((1, PAIR[0]), 4, PAIR) == [PAIR[0] + 1, PAIR[0], PAIR[0] + 1, PAIR[0]]
    assert planted.margin(models["target"]) > 150  # over every one-token context, from the weights alone


def test_the_numerics_comparison_sees_no_near_ties(models: dict[str, Path], tmp_path: Path) -> None:
    """30-numerics' CPU pair (greedy vs assisted generation) on the planted target: identical, no tie anywhere."""
    prompts = _prompts()
    assistant = write_assistant(tmp_path / "assistant", models["target"])
    base = HFEngine(model=models["target"]).generate(prompts, NEW)
    cand = HFEngine(model=models["target"], assistant=assistant).generate(prompts, NEW)
    comparison = compare(base, cand, near_tie_tol=1e-2, drift_factor=2.0)
    assert comparison.identical == len(prompts)
    assert comparison.near_ties == 0
    assert not comparison.real
    assert comparison.tie_steps == 0, "no step is within the tie tolerance: the near-tie rate is 0"
    assert comparison.min_gap is not None
    assert comparison.min_gap > 50
    assert judge(comparison, max_near_tie_rate=0.0, max_drift=0.1).ok


def test_a_planted_real_divergence_is_real_not_a_near_tie(models: dict[str, Path]) -> None:
    """The alternating variant differs from the reference on one pair: the prompt ending there diverges at
    its first token with a gap of ~hidden nats, which no tolerance explains."""
    prompts = (*_prompts(count=4), (1, 5, PAIR[0]))
    base = HFEngine(model=models["target"]).generate(prompts, NEW)
    cand = HFEngine(model=models["alternate"]).generate(prompts, NEW)
    comparison = compare(base, cand, near_tie_tol=1e-2, drift_factor=2.0)
    assert comparison.identical == len(prompts) - 1
    (divergence,) = comparison.divergences
    assert divergence.kind == "real"
    assert divergence.prompt_index == len(prompts) - 1
    assert divergence.position == 0
    assert (divergence.baseline_token, divergence.candidate_token) == (PAIR[0], PAIR[0] + 1)
    assert divergence.gap is not None
    assert divergence.gap > 50
    assert comparison.near_ties == 0
    verdict = judge(comparison, max_near_tie_rate=1.0)
    assert not verdict.ok
    assert "real" in verdict.message


@pytest.mark.parametrize("rate", planted.PLANTED_RATES)
def test_the_drafts_acceptance_is_the_planted_rate(models: dict[str, Path], rate: float) -> None:
    """Per prompt the accept length is 4 (last token in the right set) or 1; the mean is exactly 1 + 3r."""
    prompts = _prompts(rate)
    sims = planted.simulate_eagle3(models["target"], models["half-wrong"], prompts, NEW)
    lo, hi = planted.default_wrong(VOCAB)
    for prompt, sim in zip(prompts, sims, strict=True):
        assert list(sim.tokens) == planted.planted_sequence(prompt, NEW), (
            "speculation never changes the output"
        )
        assert sim.accept_length == (1.0 if lo <= prompt[-1] < hi else 4.0)
    right = sum(1 for s in sims if s.accept_length == 4.0)
    assert right / len(prompts) == rate
    assert statistics.fmean(s.accept_length for s in sims) == pytest.approx(
        planted.expected_accept_length(rate)
    )


def test_the_identity_draft_accepts_everything_and_an_alternating_target_half(
    models: dict[str, Path],
) -> None:
    """As measured in SGLang on the H200: 4.0 on the repeating target, 2.0 where the target alternates."""
    sims = planted.simulate_eagle3(models["target"], models["draft"], _prompts(count=3), NEW)
    assert [s.accept_length for s in sims] == [4.0, 4.0, 4.0]
    sims = planted.simulate_eagle3(models["alternate"], models["draft"], [(1, 5, PAIR[0]), (1, 5, 7)], NEW)
    assert [s.accept_length for s in sims] == [2.0, 4.0]


def test_prompts_carry_exactly_the_rate() -> None:
    lo, hi = planted.default_wrong(VOCAB)
    for rate, count in ((0.0, 10), (0.5, 10), (0.9, 10), (0.9, 20), (1.0, 7)):
        prompts = planted.planted_prompts(count, 8, rate=rate, vocab=VOCAB)
        assert all(len(p) == 8 and p[0] == 1 and all(3 <= t < VOCAB for t in p[1:]) for p in prompts)
        right = sum(1 for p in prompts if not lo <= p[-1] < hi)
        assert right == round(rate * count)
    assert planted.expected_accept_length(0.9) == pytest.approx(3.7)
    with pytest.raises(ValueError, match="closed under XOR 1"):
        planted.draft_specs(GPU_TARGET, wrong=(3, 10))


def test_sharded_writing_loads_in_hf_and_behaves_the_same(tmp_path: Path) -> None:
    shape = LlamaShape(hidden=64, intermediate=128, layers=4, heads=4, kv_heads=2, vocab=256)
    folder = planted.write_target_planted(tmp_path / "sharded", shape, shard_bytes=200_000)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    assert all((folder / s).is_file() for s in shards)
    assert json.loads((folder / planted.SIDECAR).read_text()) == {
        "role": "target",
        "function": "repeat",
        "swap": None,
        "seed": 0,
    }
    prompts = planted.planted_prompts(3, 6, rate=1.0, vocab=shape.vocab)
    for prompt, run in zip(prompts, HFEngine(model=folder).generate(prompts, 6), strict=True):
        assert list(run.tokens) == planted.planted_sequence(prompt, 6)


def test_the_llama_3_8b_shape_is_described_without_being_made() -> None:
    """The 8B shape's tensors are specs until their shard is written (on the GPU machine): nothing is made here."""
    shape = SHAPES["llama-3-8b"]
    target = planted.target_specs(shape)
    draft = planted.draft_specs(shape, wrong=planted.default_wrong(shape.vocab))
    total = sum(s.nbytes(2) for s in target)
    assert 14e9 < total < 17e9, total  # ~16 GB of bf16, embedding tied
    assert "lm_head.weight" not in {s.name for s in target}
    names = {s.name: s.shape for s in draft}
    assert names["fc.weight"] == (4096, 3 * 4096)
    assert names["layers.0.self_attn.q_proj.weight"] == (4096, 8192)
    assert names["lm_head.weight"] == (shape.vocab, 4096)


def test_the_model_setting() -> None:
    from stackfarm.numerics.settings import SettingsError, parse

    assert parse(None).model == "path", "the default is the path model (every kernel matters, no near-ties)"
    assert parse({"model": "planted"}).model == "planted"
    assert parse({"model": "random"}).model == "random"
    with pytest.raises(SettingsError, match="unknown model 'plated'"):
        parse({"model": "plated"})
    with pytest.raises(SettingsError, match='model = "planted" is a model the suite writes'):
        parse({"model": "planted", "model_path": "/models/x"})
    with pytest.raises(SettingsError, match='model = "path" is a model the suite writes'):
        parse({"model": "path", "model_path": "/models/x"})
