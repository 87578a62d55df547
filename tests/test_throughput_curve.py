"""The acceptance curve of 40-throughput on CPU: its arithmetic (break-even, the accept-length check), its figures
from groups of requests against a fake server that plays the planted models, its settings and threshold names."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest

from stackfarm.errors import StackfarmError
from stackfarm.throughput import curve
from stackfarm.throughput.measure import BASELINE, EAGLE3, Measurement, PlantedTokens, RequestResult
from stackfarm.throughput.settings import Settings
from stackfarm.throughput.thresholds import (
    ThresholdError,
    figure_names,
    higher_is_better,
    key_problem,
    resolve,
    unit,
)

PLANTED = PlantedTokens(vocab=1024, wrong_lo=512, wrong_hi=1024)


def test_break_even_interpolates_the_first_crossing() -> None:
    found = curve.break_even({0.0: 0.5, 0.5: 1.25, 0.9: 1.85})
    assert found.how == "crossing"
    assert found.value == pytest.approx(1 / 3)  # 0 + (1 - 0.5) / (1.25 - 0.5) x 0.5
    assert curve.break_even({0.9: 2.0, 0.0: 0.8, 0.5: 0.9}).value == pytest.approx(0.5 + 0.1 / 1.1 * 0.4)
    assert curve.break_even({0.0: 1.0, 0.5: 2.0}) == curve.BreakEven(value=0.0, how="ahead")
    behind = curve.break_even({0.0: 0.3, 0.5: 0.6, 0.9: 0.95})
    assert behind.value is None
    assert "slower at every measured rate" in behind.describe()
    assert curve.break_even({}).how == "none"
    assert curve.break_even({0.5: 0.7}).how == "none"


def test_break_even_per_round_keeps_only_rounds_that_cross() -> None:
    ratios = {0.0: [0.5, 0.6, 1.1], 0.5: [1.25, 1.1, 1.3], 0.9: [1.8, 1.9, 2.0]}
    samples = curve.break_even_samples(ratios)
    assert samples == pytest.approx([1 / 3, 0.4 / 0.5 * 0.5])  # the third round is ahead: no crossing


def test_accept_length_check_allows_the_prefill_token_and_catches_a_missing_plant() -> None:
    # rate 0: 128 tokens / 127 verifies per request
    ok = curve.check_accept_length([128 / 127] * 5, 0.0, steps=3, tolerance=0.1, resamples=200)
    assert ok.ok
    assert ok.expected == 1.0
    assert "pass" in ok.explain()
    half = curve.check_accept_length([2.5, 2.504, 2.51], 0.5, steps=3, tolerance=0.1, resamples=200)
    assert half.ok
    assert half.expected == pytest.approx(2.5)
    missed = curve.check_accept_length([1.008] * 5, 0.9, steps=3, tolerance=0.1, resamples=200)
    assert not missed.ok
    assert "planted acceptance did not happen" in missed.explain()
    assert "3.7 +- 0.1" in missed.explain()
    assert curve.check_accept_length([3.75], 0.9, steps=3, tolerance=0.1).ok  # one sample: within tol of it
    with pytest.raises(ValueError, match="no accept-length samples"):
        curve.check_accept_length([], 0.5, steps=3, tolerance=0.1)


def test_groups_plant_exactly_the_rate() -> None:
    assert curve.right_in_group(0.0, 10) == (False,) * 10
    assert sum(curve.right_in_group(0.5, 10)) == 5
    assert sum(curve.right_in_group(0.9, 10)) == 9
    assert curve.right_in_group(1.0, 4) == (True,) * 4
    assert curve.whole(0.9, 10)
    assert not curve.whole(0.33, 10)
    assert curve.split("eagle3_over_baseline@0.9") == ("eagle3_over_baseline", 0.9)
    assert curve.split("eagle3_over_baseline@1.5") is None
    assert curve.split("ttft_ms@0.5") is None


def _planted_server(url: str, prompts: Sequence[Sequence[int]], n: int) -> RequestResult:
    """A server that plays the planted models: EAGLE-3 accepts 4 per verify after a right token, 1 after a
    wrong one, each verify costing 2 ms; the baseline decodes a token per 1 ms."""
    (prompt,) = prompts
    right = not PLANTED.wrong_lo <= prompt[-1] < PLANTED.wrong_hi
    if url == "eagle3":
        accept = 4.0 if right else 1.0
        seconds = (n - 1) / accept * 0.002
    else:
        accept, seconds = 0.0, (n - 1) * 0.001
    return RequestResult(batch_size=1, input_len=len(prompt), output_len=n, tokens=(n,), first_s=(0.01,),
                         last_s=(0.01 + seconds,), first_tokens=(1,),
                         accept_length=accept if url == "eagle3" else None)  # fmt: skip


def test_the_curve_from_groups_of_requests() -> None:
    settings = Settings.from_mapping({"acceptance": [0.0, 0.5, 0.9], "repeats": 2, "output_tokens": 17})
    m = Measurement({BASELINE: "baseline", EAGLE3: "eagle3"}, settings, run=_planted_server, planted=PLANTED)
    m.run_curve(2)
    got = m.figures()
    assert set(curve.figure_names(settings.acceptance)) <= set(got)
    for rate in (0.0, 0.5, 0.9):
        assert len(m.curve[(EAGLE3, rate)]) == 2
        assert all(len(g) == 10 for g in m.curve[(EAGLE3, rate)])
        assert got[curve.at("accept_length", rate)] == pytest.approx([1 + 3 * rate] * 2)
        assert got[curve.at("decode_tok_s", rate)] == pytest.approx([1000.0] * 2)
    # a group at rate r decodes 16 tokens per request: (1 - r) x 16 / 1 + r x 16 / 4 verifies of 2 ms
    for rate in (0.0, 0.5, 0.9):
        seconds = 10 * ((1 - rate) * 16 * 0.002 + rate * 4 * 0.002)
        assert got[curve.at("eagle3_decode_tok_s", rate)] == pytest.approx([160 / seconds] * 2)
    assert got[curve.at("eagle3_over_baseline", 0.0)] == pytest.approx([0.5, 0.5])
    ratio = {r: 160 / (10 * ((1 - r) * 16 * 0.002 + r * 4 * 0.002)) / 1000 for r in (0.5, 0.9)}
    assert ratio[0.5] == pytest.approx(0.8)
    assert got[curve.at("eagle3_over_baseline", 0.5)] == pytest.approx([ratio[0.5]] * 2)
    want = 0.5 + (1 - ratio[0.5]) * 0.4 / (ratio[0.9] - ratio[0.5])  # between 0.5 (0.8) and 0.9 (1.54)
    assert got[curve.BREAK_EVEN] == pytest.approx([want, want])
    more = m.remeasure(curve.at("eagle3_over_baseline", 0.9))()
    assert len(more) == 2, "a curve figure is re-measured by curve rounds"
    assert m.curve_rounds == 4


def test_planted_prompts_end_where_they_should() -> None:
    import random

    rng = random.Random(0)
    rights = [PLANTED.last_token(rng, True) for _ in range(2000)]
    wrongs = [PLANTED.last_token(rng, False) for _ in range(2000)]
    assert all(3 <= t < 512 for t in rights)
    assert all(512 <= t < 1024 for t in wrongs)
    settings = Settings.from_mapping({"acceptance": [0.5]})
    m = Measurement({BASELINE: "b"}, settings, planted=PLANTED)
    assert all(p[-1] < 512 for p in m._prompts(50)), "outside the curve: full acceptance"


def test_settings_of_the_curve() -> None:
    settings = Settings.from_mapping({"acceptance": [0.0, 0.5, 0.9]})
    assert settings.acceptance == (0.0, 0.5, 0.9)
    assert "eagle3_over_baseline@0.9" in settings.figures()
    assert "break_even_acceptance" in settings.figures()
    assert "break_even_acceptance" not in Settings().figures()
    bad: dict[str, dict[str, Any]] = {
        "needs eagle3 = true": {"acceptance": [0.5], "eagle3": False},
        "are not whole numbers of requests": {"acceptance": [0.25]},
        "lists a rate twice": {"acceptance": [0.5, 0.5]},
        "plants chain drafting": {"acceptance": [0.5], "speculative_eagle_topk": 4},
        "plants its own models": {"acceptance": [0.5], "model_path": "/m", "draft_model_path": "/d"},
        "is outside [0, 1]": {"acceptance": [1.2]},
    }
    for message, raw in bad.items():
        with pytest.raises(StackfarmError, match=re.escape(message)):
            Settings.from_mapping(raw)
    assert Settings.from_mapping({"acceptance": [0.25], "acceptance_requests": 4}).acceptance == (0.25,)


def test_threshold_names_of_the_curve() -> None:
    measured = figure_names((1,), eagle3=True, acceptance=(0.0, 0.5, 0.9))
    assert "accept_length@0.5" in measured
    assert unit("eagle3_over_baseline@0.9") == "ratio"
    assert unit("decode_tok_s@0.5") == "tok/s"
    assert unit("accept_length@0.5") == "tokens"
    assert unit("break_even_acceptance") == "acceptance"
    assert not higher_is_better("break_even_acceptance")
    assert higher_is_better("eagle3_over_baseline@0.9")
    assert key_problem("eagle3_over_baseline@0.9", measured) is None
    assert "rate 0.7 is not in settings.acceptance (0, 0.5, 0.9)" in str(
        key_problem("eagle3_over_baseline@0.7", measured)
    )
    plain = figure_names((1,), eagle3=True)
    assert "settings.acceptance is not set" in str(key_problem("break_even_acceptance", plain))
    table = {"1x-h200": {"eagle3_over_baseline@0.9": 1.5, "break_even_acceptance": 0.6}}
    checks = {c.name: c for c in resolve(table, "1x-h200", measured=measured).checks}
    assert checks["eagle3_over_baseline@0.9"].kind == "relative"
    assert checks["eagle3_over_baseline@0.9"].bound.describe() == ">= 1.5"
    assert checks["break_even_acceptance"].bound.describe() == "<= 0.6"
    with pytest.raises(ThresholdError, match=r"rate 0\.7 is not in settings\.acceptance"):
        resolve({"1x-h200": {"eagle3_over_baseline@0.7": 1.0}}, "1x-h200", measured=measured)
