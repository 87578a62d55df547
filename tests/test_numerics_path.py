"""The path model (stackfarm.numerics.pathmodel) in HF transformers on CPU: the planted function holds with large
margins in float32 and bfloat16, a planted attention or MLP defect is a real divergence on every prompt and never a
near-tie, and two correct but numerically different paths (greedy vs assisted, float32 vs bfloat16) agree."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from stackfarm.numerics import pathmodel
from stackfarm.numerics.compare import Generation, compare, judge
from stackfarm.numerics.engines import HFEngine, make_prompts
from stackfarm.numerics.tinymodels import write_assistant

SHAPE = pathmodel.CPU_PATH
PROMPTS = make_prompts(6, 16, SHAPE.vocab, seed=3)
NEW = 24


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("path")
    out = {"target": pathmodel.write_target_path(root / "target", SHAPE, seed=3)}
    for bug in pathmodel.BUGS:
        out[bug] = pathmodel.write_target_path(root / bug, SHAPE, seed=3, bug=bug)
    out["assistant"] = write_assistant(root / "assistant", out["target"], layers=2)
    return out


def _greedy(model: Path, dtype: str = "float32", assistant: Path | None = None) -> tuple[Generation, ...]:
    return HFEngine(model=model, dtype=dtype, assistant=assistant).generate(PROMPTS, NEW)


@pytest.fixture(scope="module")
def baseline(models: dict[str, Path]) -> tuple[Generation, ...]:
    return _greedy(models["target"])


def test_previous_token_attention_is_sharp_at_every_lag() -> None:
    """At every lag the positions allow, a wrong lag scores at most 70 % of the right one (RoPE base 1.5)."""
    assert pathmodel.lag_margin(SHAPE) > 0.3
    assert pathmodel.lag_margin(pathmodel.PATH_TARGET) > 0.3
    assert pathmodel.lag_margin(pathmodel.PATH_TARGET, base=10000.0) < 0.05  # Llama's base could not do it


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_planted_function_holds_with_large_margins(
    models: dict[str, Path], baseline: tuple[Generation, ...], dtype: str
) -> None:
    runs = baseline if dtype == "float32" else _greedy(models["target"], dtype)
    for gen in runs:
        assert list(gen.tokens) == pathmodel.path_sequence(gen.prompt, NEW, SHAPE.vocab, seed=3)
    gaps = [s.gap for g in runs for s in g.steps if s.gap is not None]
    assert len(gaps) == len(PROMPTS) * NEW
    assert min(gaps) > 10.0, f"top-1/top-2 gaps should stay far above any rounding: min {min(gaps)}"


def test_the_function_needs_the_previous_token() -> None:
    """The planted function is not a function of the last token alone (attention must look back)."""
    a = pathmodel.path_sequence((5, 7, 9), 4, SHAPE.vocab, seed=3)
    b = pathmodel.path_sequence((5, 8, 9), 4, SHAPE.vocab, seed=3)
    assert a[0] != b[0]


@pytest.mark.parametrize("bug", pathmodel.BUGS)
def test_a_planted_defect_is_real_on_every_prompt(
    models: dict[str, Path], baseline: tuple[Generation, ...], bug: str
) -> None:
    comparison = compare(baseline, _greedy(models[bug]), near_tie_tol=1e-2, drift_factor=2.0)
    assert comparison.near_ties == 0
    assert len(comparison.real) == len(PROMPTS), [d.describe() for d in comparison.divergences]
    assert all(d.gap is not None and d.gap > 10.0 for d in comparison.real)
    assert not judge(comparison, max_near_tie_rate=0.25, max_drift=0.1).ok


def test_correct_paths_agree(models: dict[str, Path], baseline: tuple[Generation, ...]) -> None:
    """Greedy vs assisted generation (the multi-token verify path, a 2-layer self-draft that computes the same
    function) and float32 vs bfloat16: no divergence, no near-tie, the verdict passes."""
    for candidate in (
        _greedy(models["target"], assistant=models["assistant"]),
        _greedy(models["target"], "bfloat16"),
    ):
        comparison = compare(baseline, candidate, near_tie_tol=1e-2, drift_factor=2.0)
        assert comparison.divergences == ()
        assert comparison.tie_steps == 0
        assert judge(comparison, max_near_tie_rate=0.25, max_drift=0.1).ok


def test_bad_shapes_are_refused() -> None:
    from dataclasses import replace

    with pytest.raises(ValueError, match="intermediate >= vocab"):
        pathmodel.path_target_specs(replace(SHAPE, intermediate=SHAPE.vocab // 2))
