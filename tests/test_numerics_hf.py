"""The HF transformers engine adapter end to end on CPU: a real tiny random Llama, plain greedy vs assisted
generation, compared by stackfarm.numerics.compare; and a planted divergence the comparison must report."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackfarm.numerics.compare import Generation, compare, judge
from stackfarm.numerics.engines import HFEngine, Plant, make_prompts
from stackfarm.numerics.tinymodels import CPU_TARGET, write_assistant, write_target

pytest.importorskip("torch")
pytest.importorskip("transformers")

MAX_NEW = 24
Prompts = tuple[tuple[int, ...], ...]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("hf")
    target = write_target(root / "target", CPU_TARGET, logit_std=2.0, dtype="float32")
    return target, write_assistant(root / "assistant", target)


@pytest.fixture(scope="module")
def prompts() -> Prompts:
    return make_prompts(6, 12, CPU_TARGET.vocab, seed=3)


@pytest.fixture(scope="module")
def baseline(models: tuple[Path, Path], prompts: Prompts) -> tuple[Generation, ...]:
    return HFEngine(model=models[0]).generate(prompts, MAX_NEW)


def test_make_prompts_is_deterministic_and_avoids_special_tokens() -> None:
    a = make_prompts(3, 10, 50, seed=1)
    assert a == make_prompts(3, 10, 50, seed=1)
    assert a != make_prompts(3, 10, 50, seed=2)
    assert all(p[0] == 1 and len(p) == 10 and all(3 <= t < 50 for t in p[1:]) for p in a)


def test_greedy_output_shape(baseline: tuple[Generation, ...], prompts: Prompts) -> None:
    assert len(baseline) == len(prompts)
    for gen, prompt in zip(baseline, prompts, strict=True):
        assert gen.prompt == prompt
        assert len(gen.steps) == MAX_NEW
        assert gen.accept_length is None
        for step in gen.steps:
            assert step.token == step.top[0][0]  # greedy emits the top-1
            assert step.gap is not None
            assert step.gap >= 0


def test_assisted_matches_greedy(
    models: tuple[Path, Path], prompts: Prompts, baseline: tuple[Generation, ...]
) -> None:
    assisted = HFEngine(model=models[0], assistant=models[1]).generate(prompts, MAX_NEW)
    result = compare(baseline, assisted, near_tie_tol=1e-2)
    verdict = judge(result, max_near_tie_rate=0.25)
    assert verdict.ok, verdict.message
    assert not result.real
    assert result.accept_length is not None
    assert result.accept_length >= 1.0
    # float32 on CPU: the verify path's logprobs agree with plain decoding to rounding.
    assert result.max_logprob_err is not None
    assert result.max_logprob_err < 1e-4
    assert result.median_gap is not None
    assert result.median_gap > 0.1


def test_planted_divergence_is_reported_real(
    models: tuple[Path, Path], prompts: Prompts, baseline: tuple[Generation, ...]
) -> None:
    """The speculative path emits its least likely token at step 3 of prompt 1: the comparison must fail it."""
    planted = HFEngine(model=models[0], assistant=models[1], plant=Plant(position=3, prompts=(1,)))
    result = compare(baseline, planted.generate(prompts, MAX_NEW), near_tie_tol=1e-2)
    first = result.first_divergence
    assert first is not None
    assert (first.prompt_index, first.position, first.kind) == (1, 3, "real")
    assert first.candidate_token != first.runner_up
    verdict = judge(result, max_near_tie_rate=1.0)  # even when every near-tie were tolerated
    assert not verdict.ok
    assert "prompt 1 @ 3: real" in verdict.message


def test_bfloat16_runs(models: tuple[Path, Path], prompts: Prompts) -> None:
    engine = HFEngine(model=models[0], dtype="bfloat16")
    gens = engine.generate(prompts[:2], 8)
    assert [len(g.steps) for g in gens] == [8, 8]


def test_missing_model_is_an_engine_error(tmp_path: Path) -> None:
    from stackfarm.numerics.engines import EngineError

    with pytest.raises(EngineError, match="cannot load the model at"):
        HFEngine(model=tmp_path / "nowhere").generate([(1, 2, 3)], 2)
