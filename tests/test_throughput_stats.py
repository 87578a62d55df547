"""stackfarm.throughput.stats: the interval, the verdict rules and the retry classifier.

The known-sample cases are worked out by hand: for the median of n = 5 samples, the resampled median lies
at or below the k-th smallest sample with probability P(Bin(5, k/5) >= 3), which fixes the exact percentile
bootstrap interval (k = 1: 5.8 %, k = 2: 31.7 %).
"""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from stackfarm.throughput.stats import (
    SHORTFALL_MARKER,
    Bound,
    FailureKind,
    Interval,
    RemeasureFailed,
    bootstrap_ci,
    classify,
    cv,
    decide,
    look,
    median,
)

FIVE = [497.0, 515.0, 374.0, 501.0, 760.0]  # the first five of the H200 reference run's noisy rates


def test_median_and_cv_on_known_samples() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    # stdev(1..5) with n - 1 = sqrt(2.5); mean 3
    assert cv([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(math.sqrt(2.5) / 3)
    assert cv([100.0, 100.0, 100.0]) == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        cv([1.0])
    with pytest.raises(ValueError, match="no samples"):
        median([])


def test_ci_of_constant_samples_is_a_point() -> None:
    ci = bootstrap_ci([92.6] * 5, seed=1)
    assert (ci.low, ci.high) == (92.6, 92.6)


def test_ci_of_five_medians_is_the_range_at_95_and_inner_at_80() -> None:
    ordered = sorted(FIVE)
    ci95 = bootstrap_ci(FIVE, confidence=0.95, resamples=20_000, seed=3)
    assert (ci95.low, ci95.high) == (ordered[0], ordered[-1])
    ci80 = bootstrap_ci(FIVE, confidence=0.80, resamples=20_000, seed=3)
    assert (ci80.low, ci80.high) == (ordered[1], ordered[-2])
    assert ci80.confidence == 0.80


def _exact_percentiles(samples: list[float], confidence: float) -> tuple[float, float]:
    """The percentile interval over *every* resample (n^n of them), with the ranks bootstrap_ci uses."""
    stats = sorted(statistics.median(r) for r in itertools.product(samples, repeat=len(samples)))
    alpha = 1 - confidence
    low = stats[math.floor(len(stats) * alpha / 2)]
    high = stats[math.ceil(len(stats) * (1 - alpha / 2)) - 1]
    return low, high


def test_ci_matches_exact_bootstrap_distribution() -> None:
    samples = [10.0, 12.0, 13.0, 17.0, 30.0, 31.0]  # 6^6 = 46,656 resamples: exact enumeration is cheap
    # confidences whose tails fall well inside one atom of the exact distribution (not at a jump)
    for confidence in (0.5, 0.7):
        ci = bootstrap_ci(samples, confidence=confidence, resamples=40_000, seed=11)
        low, high = _exact_percentiles(samples, confidence)
        assert ci.low == pytest.approx(low)
        assert ci.high == pytest.approx(high)


def test_ci_is_reproducible_and_order_free() -> None:
    data = [1.0, 5.0, 2.0, 8.0, 3.0, 9.0, 4.0]
    a = bootstrap_ci(data, confidence=0.6, resamples=500, seed=7)
    assert a == bootstrap_ci(list(reversed(data)), confidence=0.6, resamples=500, seed=7)
    # the median's bootstrap distribution has few atoms; the mean's has many, so there the seed shows
    seeds = {bootstrap_ci(data, resamples=200, seed=s, statistic=statistics.fmean) for s in range(5)}
    assert len(seeds) > 1, "the seed must matter with few resamples"


@pytest.mark.parametrize(
    ("samples", "problem"),
    [([1.0], "at least 2"), ([1.0, float("nan")], "finite"), ([1.0, 2.0], None)],
)
def test_ci_rejects_bad_input(samples: list[float], problem: str | None) -> None:
    if problem is None:
        assert bootstrap_ci(samples).low == 1.0
    else:
        with pytest.raises(ValueError, match=problem):
            bootstrap_ci(samples)


@pytest.mark.parametrize(
    ("low", "high", "bound", "seen"),
    [
        (93.0, 95.0, Bound(value=92.6), "pass"),
        (92.6, 95.0, Bound(value=92.6), "pass"),  # the lower bound *clears* the floor when equal
        (80.0, 92.5, Bound(value=92.6), "fail"),
        (90.0, 95.0, Bound(value=92.6), "undecided"),
        (10.0, 12.0, Bound(value=12.0, at_least=False), "pass"),  # a ceiling (latency)
        (12.5, 14.0, Bound(value=12.0, at_least=False), "fail"),
        (11.0, 13.0, Bound(value=12.0, at_least=False), "undecided"),
    ],
)
def test_look(low: float, high: float, bound: Bound, seen: str) -> None:
    assert look(Interval(low=low, high=high, confidence=0.95), bound) == seen


def test_decide_passes_and_fails_without_remeasuring() -> None:
    def never() -> list[float]:
        raise AssertionError("a decided result must not be measured again")

    fast = decide([100.0, 101.0, 99.5, 100.2, 100.9], Bound(value=92.6), more=never, max_remeasures=3)
    assert (fast.verdict, fast.remeasures) == ("pass", 0)
    slow = decide([54.1, 55.0, 53.7, 54.4, 54.9], Bound(value=92.6), more=never, max_remeasures=3)
    assert slow.verdict == "fail"
    assert SHORTFALL_MARKER in slow.explain()


def test_decide_remeasures_then_reports_inconclusive() -> None:
    calls = []

    def straddling() -> list[float]:
        calls.append(1)
        return [88.0, 97.0, 91.0, 95.0, 93.0]

    judgement = decide([88.0, 97.0, 91.0, 95.0, 93.0], Bound(value=92.6), more=straddling, max_remeasures=2)
    assert judgement.verdict == "inconclusive"
    assert len(calls) == 2 == judgement.remeasures
    assert len(judgement.samples) == 15
    assert len(judgement.history) == 3
    assert "inconclusive" in judgement.explain()
    assert "not a pass" in judgement.explain()


def test_decide_with_no_remeasures_allowed_is_inconclusive_at_once() -> None:
    judgement = decide([88.0, 97.0, 91.0], Bound(value=92.6), more=lambda: [1.0], max_remeasures=0)
    assert (judgement.verdict, judgement.remeasures) == ("inconclusive", 0)


def test_decide_resolves_with_pooled_samples() -> None:
    # The first look straddles (95 % of 5 medians = the range); the re-measure's samples are all fast, so
    # the pooled interval clears the floor.
    judgement = decide(
        [91.0, 99.0, 98.0, 97.0, 99.5],
        Bound(value=92.6),
        more=lambda: [98.0, 98.5, 99.0, 97.5, 98.2, 99.1, 98.7, 97.9],
        max_remeasures=3,
    )
    assert judgement.verdict == "pass"
    assert judgement.remeasures == 1
    assert judgement.history[0].low < 92.6 <= judgement.interval.low


def test_decide_never_retries_a_broken_measurement() -> None:
    calls = []

    def oom() -> list[float]:
        calls.append(1)
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(RemeasureFailed) as info:
        decide([88.0, 97.0, 91.0], Bound(value=92.6), more=oom, max_remeasures=5)
    assert info.value.kind is FailureKind.OUT_OF_MEMORY
    assert "not retried" in str(info.value)
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (f"decode_tok_s: {SHORTFALL_MARKER}: 54.1 < 92.6", FailureKind.SHORTFALL),
        ("ImportError: cannot import name 'fp8_kernel' from 'sgl_kernel'", FailureKind.IMPORT_ERROR),
        ("ModuleNotFoundError: No module named 'cutlass'", FailureKind.IMPORT_ERROR),
        ("torch.OutOfMemoryError: CUDA out of memory.", FailureKind.OUT_OF_MEMORY),
        # an OOM wins over the shortfall it caused
        (f"{SHORTFALL_MARKER}\nRuntimeError: CUDA error: out of memory", FailureKind.OUT_OF_MEMORY),
        ("Fatal Python error: Segmentation fault", FailureKind.CRASH),
        ("baseline server exited with code -6 before it became healthy", FailureKind.CRASH),
        ("baseline server not healthy after 600 s", FailureKind.TIMEOUT),
        ("OSError: [Errno 98] Address already in use", FailureKind.PORT_IN_USE),
        ("the server returned 0 tokens for a request of 1 x 128 new tokens", FailureKind.ZERO_TOKENS),
        ("something else entirely", FailureKind.OTHER),
    ],
)
def test_classify(text: str, kind: FailureKind) -> None:
    assert classify(text) is kind
