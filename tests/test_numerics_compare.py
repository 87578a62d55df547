"""stackfarm.numerics.compare and .settings: divergence classification and the suite's settings, pure logic.

The generations here are small synthetic ones; each models a case the suite must tell apart. The "H200 probe"
case restates what /work/shared/device/README.md measured for SGLang 0.5.15 (tiny random Llama, EAGLE-3 vs plain
decode): first divergences at positions 4 and 15 where the baseline's top-1/top-2 gap was 0.0 and 2^-8.
"""

from __future__ import annotations

import math

import pytest

from stackfarm.numerics.compare import Generation, Step, classify, compare, first_difference, judge
from stackfarm.numerics.settings import DEFAULT_TOLERANCES, Settings, SettingsError, Tolerance, parse


def _gen(
    tokens: list[int],
    gaps: list[float] | None = None,
    runner_ups: list[int] | None = None,
    prompt: tuple[int, ...] = (1, 5, 9),
    accept: float | None = None,
) -> Generation:
    """A generation whose step i emitted tokens[i] at logprob -0.1, runner-up runner_ups[i] at -0.1 - gaps[i]."""
    gaps = gaps if gaps is not None else [1.0] * len(tokens)
    runner_ups = runner_ups if runner_ups is not None else [t + 1 for t in tokens]
    steps = tuple(
        Step(token=t, top=((t, -0.1), (r, -0.1 - g)))
        for t, g, r in zip(tokens, gaps, runner_ups, strict=True)
    )
    return Generation(prompt=prompt, steps=steps, accept_length=accept)


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 7, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2
    assert first_difference([], []) is None


def test_identical_runs_match() -> None:
    base = [_gen([10, 11, 12]), _gen([20, 21, 22])]
    result = compare(base, base, near_tie_tol=1e-2)
    assert result.match_rate == 1.0
    assert result.token_match_rate == 1.0
    assert result.divergences == ()
    assert result.first_divergence is None
    assert result.max_logprob_err == 0.0
    assert judge(result, max_near_tie_rate=0.0).ok


def test_h200_probe_divergences_are_near_ties() -> None:
    """The measured case: exact and 2^-8 ties, the speculative path taking the runner-up."""
    tokens = list(range(100, 132))
    gaps = [0.05] * 32
    gaps[4], gaps[15] = 0.0, 2.0**-8
    base = [_gen(tokens, gaps), _gen(tokens, gaps), _gen(tokens), _gen(tokens)]
    diverged_a = tokens[:4] + [tokens[4] + 1] + [7] * 27  # takes the runner-up at 4, then anything
    diverged_b = tokens[:15] + [tokens[15] + 1] + [7] * 16
    cand = [_gen(diverged_a), _gen(diverged_b), _gen(tokens), _gen(tokens)]
    result = compare(base, cand, near_tie_tol=1e-2)
    assert [(d.prompt_index, d.position, d.kind) for d in result.divergences] == [
        (0, 4, "near-tie"),
        (1, 15, "near-tie"),
    ]
    assert result.divergences[1].gap == pytest.approx(0.00390625)
    assert result.match_rate == 0.5
    assert result.prefix_tokens == 4 + 15 + 32 + 32
    assert result.first_divergence is not None
    assert result.first_divergence.position == 4
    assert judge(result, max_near_tie_rate=0.5).ok
    verdict = judge(result, max_near_tie_rate=0.25)
    assert not verdict.ok
    assert "2 of 4 prompts diverge at near-ties" in verdict.message


def test_large_gap_is_real() -> None:
    base = [_gen([1, 2, 3], gaps=[1.0, 0.5, 1.0])]
    cand = [_gen([1, 3, 3])]  # the runner-up of step 1, but the baseline preferred token 2 by 0.5 nats
    (div,) = compare(base, cand, near_tie_tol=1e-2).divergences
    assert div.kind == "real"
    assert "0.5 > tolerance" in div.reason
    assert not judge(compare(base, cand, near_tie_tol=1e-2), max_near_tie_rate=1.0).ok


def test_near_tie_but_not_the_runner_up_is_real() -> None:
    base = [_gen([1, 2, 3], gaps=[1.0, 0.0, 1.0])]
    cand = [_gen([1, 9, 3])]  # tied top-2 were 2 and 3; 9 is neither
    (div,) = compare(base, cand, near_tie_tol=1e-2).divergences
    assert div.kind == "real"
    assert div.runner_up == 3
    assert "not the baseline's runner-up" in div.reason


def test_unknown_logprobs_and_lengths_are_real() -> None:
    bare = Generation(prompt=(1,), steps=(Step(token=1), Step(token=2)))
    other = Generation(prompt=(1,), steps=(Step(token=1), Step(token=3)))
    assert classify(0, bare, other, 1e-2) is not None
    assert classify(0, bare, other, 1e-2).kind == "real"  # type: ignore[union-attr]
    short = Generation(prompt=(1,), steps=(Step(token=1),))
    div = classify(0, bare, short, 1e-2)
    assert div is not None
    assert div.kind == "real"
    assert div.position == 1
    assert "lengths differ" in div.reason


def test_tolerance_boundary_is_inclusive() -> None:
    base = [_gen([1, 2], gaps=[1.0, 0.01])]
    cand = [_gen([1, 3])]
    assert compare(base, cand, near_tie_tol=0.01).divergences[0].kind == "near-tie"
    assert compare(base, cand, near_tie_tol=0.0099).divergences[0].kind == "real"


def test_accept_length_gaps_and_drift() -> None:
    base = [_gen([1, 2, 3], gaps=[0.001, 0.3, 2.0])]
    cand_steps = (Step(token=1, top=((1, -0.13), (2, -1.0))), *base[0].steps[1:])
    cand = [Generation(prompt=base[0].prompt, steps=cand_steps, accept_length=2.5)]
    result = compare(base, cand, near_tie_tol=1e-2)
    assert result.accept_length == 2.5
    assert result.median_gap == pytest.approx(0.3)
    assert result.min_gap == pytest.approx(0.001)
    assert result.tie_steps == 1
    assert result.max_logprob_err == pytest.approx(0.03)
    props = result.properties()
    assert props["accept_length"] == "2.500"
    assert props["max_abs_err"] == "0.03"
    assert props["first_divergence"] == "none"


def test_compare_rejects_other_prompts_and_bad_tolerance() -> None:
    with pytest.raises(ValueError, match="not the same prompts"):
        compare([_gen([1])], [], near_tie_tol=1e-2)
    with pytest.raises(ValueError, match="prompt 0 differs"):
        compare([_gen([1], prompt=(1, 2))], [_gen([1], prompt=(1, 3))], near_tie_tol=1e-2)
    with pytest.raises(ValueError, match="near_tie_tol"):
        compare([], [], near_tie_tol=math.nan)


# --------------------------------------------------------------------------- settings


def test_settings_defaults() -> None:
    settings = parse(None)
    assert settings == Settings()
    assert settings.near_tie_tol == 1e-2
    assert settings.tolerances["bfloat16"] == Tolerance(atol=2.0**-6, rtol=2.0**-6)
    assert set(settings.tolerances) == set(DEFAULT_TOLERANCES)


def test_settings_override_one_dtype_keeps_the_rest() -> None:
    settings = parse({"tolerance": {"bfloat16": {"atol": 0.8}}, "prompts": 4, "cpu_dtypes": ["float32"]})
    assert settings.tolerances["bfloat16"] == Tolerance(atol=0.8, rtol=2.0**-6)
    assert settings.tolerances["float16"] == DEFAULT_TOLERANCES["float16"]
    assert settings.prompts == 4
    assert settings.cpu_dtypes == ("float32",)


@pytest.mark.parametrize(
    ("raw", "key", "text"),
    [
        ({"near_tie_tol": "1e-2"}, "near_tie_tol", "must be a number, got '1e-2' (a string)"),
        ({"tolerance": {"bfloat16": {"atol": "loose"}}}, "tolerance.bfloat16.atol", "must be a number"),
        ({"tolerance": {"bfloat16": {"rtol": True}}}, "tolerance.bfloat16.rtol", "must be a number"),
        ({"tolerance": {"bfloat16": {"atl": 1}}}, "tolerance.bfloat16.atl", "unknown key"),
        ({"tolerance": {"bf16": {"atol": 1}}}, "tolerance.bf16", "unknown dtype"),
        ({"max_near_tie_rate": 1.5}, "max_near_tie_rate", "outside [0, 1]"),
        ({"near_tie_tol": math.inf}, "near_tie_tol", "outside"),
        ({"prompts": 2.5}, "prompts", "must be an integer"),
        ({"near_tie_tolerance": 0.1}, "near_tie_tolerance", "did you mean `near_tie_tol`?"),
        ({"draft_path": "/models/d"}, "draft_path", "without model_path"),
        ({"dtype": "fp8"}, "dtype", "unknown dtype"),
        ({"fp32_lm_head": "yes"}, "fp32_lm_head", "true or false"),
        ({"cpu_dtypes": []}, "cpu_dtypes", "non-empty list"),
        ({"max_drift": -1}, "max_drift", "outside"),
        ({"drift_factor": "2"}, "drift_factor", "must be a number"),
    ],
)
def test_settings_errors_name_the_key(raw: dict[str, object], key: str, text: str) -> None:
    with pytest.raises(SettingsError) as info:
        parse(raw)
    assert info.value.key == key
    assert text in str(info.value)
    assert str(info.value).startswith("[suites.30-numerics.settings] ")


def test_tolerance_bound() -> None:
    tol = Tolerance(atol=0.1, rtol=0.01)
    assert tol.bound(-10.0) == pytest.approx(0.2)
    assert tol.describe() == "atol=0.1 rtol=0.01"


def _with_logprob(gen: Generation, shift: float) -> Generation:
    """The same tokens with every top-1 logprob moved by `shift` (another numerical path's noise)."""
    steps = tuple(
        Step(token=s.token, top=((s.top[0][0], s.top[0][1] + shift), *s.top[1:])) for s in gen.steps
    )
    return Generation(prompt=gen.prompt, steps=steps)


def test_drift_widens_the_tie_tolerance() -> None:
    """A divergence at a 0.03 gap is real for a quiet pair of paths, a near-tie when they drift by 0.02."""
    base = [_gen([1, 2, 3], gaps=[1.0, 1.0, 0.03]), _gen([4, 5, 6])]
    quiet = [_gen([1, 2, 4]), base[1]]
    noisy = [_with_logprob(_gen([1, 2, 4]), 0.02), base[1]]
    assert compare(base, quiet, near_tie_tol=1e-2, drift_factor=2.0).divergences[0].kind == "real"
    result = compare(base, noisy, near_tie_tol=1e-2, drift_factor=2.0)
    assert result.max_logprob_err == pytest.approx(0.02)
    assert result.tie_tol == pytest.approx(0.04)
    assert result.divergences[0].kind == "near-tie"
    assert compare(base, noisy, near_tie_tol=1e-2).divergences[0].kind == "real"  # drift_factor 0: fixed


def test_large_drift_fails_by_itself() -> None:
    base = [_gen([1, 2, 3])]
    drifted = [_with_logprob(base[0], 0.5)]
    result = compare(base, drifted, near_tie_tol=1e-2, drift_factor=2.0)
    assert result.divergences == ()
    verdict = judge(result, max_near_tie_rate=0.0, max_drift=0.1)
    assert not verdict.ok
    assert "differ by up to 0.5 nats" in verdict.message
    assert judge(result, max_near_tie_rate=0.0).ok  # no drift limit: tokens alone agree
