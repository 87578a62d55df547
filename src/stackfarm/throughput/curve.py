"""EAGLE-3 vs baseline as a curve over planted acceptance rates (settings.acceptance): pure arithmetic, no I/O.

With the planted models (stackfarm.numerics.planted) a single-stream request accepts all its draft tokens
(accept length steps + 1 = 4) when its prompt ends in the draft's right set, and none (accept length 1) when it
ends in the wrong set. A *sample at rate r* is a group of `acceptance_requests` requests, round(r x n) of them
right, run one after another on each server (baseline group, then EAGLE-3 group: an interleaved pair). Figures:

- ``decode_tok_s@<r>``, ``eagle3_decode_tok_s@<r>``: a group's decode tokens / its decode seconds (tok/s);
- ``eagle3_over_baseline@<r>``: the EAGLE-3 group's rate over the baseline group's, per pair;
- ``accept_length@<r>``: the mean of the EAGLE-3 group's per-request accept lengths; planted: 1 + steps x r.
  `check_accept_length` passes when 1 + steps x r lies within the figure's interval widened by a tolerance
  (SGLang's per-request figure counts the prefill token: 128 tokens / 127 verifies = 1.008, not 1);
- ``break_even_acceptance``: per round, where eagle3_over_baseline crosses 1, linearly interpolated between the
  rates around the first crossing (`break_even`); a round whose ratios never cross gives no sample.

Rates are spelled with ``f"{r:g}"``: ``eagle3_over_baseline@0.9``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .stats import Interval, bootstrap_ci, median

#: Figures measured at each rate, by their name before "@".
AT_RATE = ("decode_tok_s", "eagle3_decode_tok_s", "eagle3_over_baseline", "accept_length")
BREAK_EVEN = "break_even_acceptance"


def label(rate: float) -> str:
    return f"{rate:g}"


def at(figure: str, rate: float) -> str:
    return f"{figure}@{label(rate)}"


def split(name: str) -> tuple[str, float] | None:
    """("eagle3_over_baseline", 0.9) for "eagle3_over_baseline@0.9"; None for a name without a rate."""
    base, sep, rate = name.partition("@")
    if not sep or base not in AT_RATE:
        return None
    try:
        value = float(rate)
    except ValueError:
        return None
    return (base, value) if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def is_curve_figure(name: str) -> bool:
    return name == BREAK_EVEN or split(name) is not None


def figure_names(rates: Sequence[float]) -> tuple[str, ...]:
    names = [at(base, r) for r in sorted(set(rates)) for base in AT_RATE]
    return (*names, BREAK_EVEN) if rates else ()


def right_in_group(rate: float, requests: int) -> tuple[bool, ...]:
    """Which requests of a group end in the right set: round(rate x requests) of them, evenly spread."""
    k = round(rate * requests)
    return tuple((i + 1) * k // requests > i * k // requests for i in range(requests))


def whole(rate: float, requests: int) -> bool:
    """Whether `requests` per group plant `rate` exactly (rate x requests is a whole number)."""
    return abs(rate * requests - round(rate * requests)) < 1e-9


def expected_accept_length(rate: float, steps: int) -> float:
    return 1.0 + steps * rate


@dataclass(frozen=True, kw_only=True)
class BreakEven:
    """Where EAGLE-3 starts to pay: the interpolated rate, or None with why not."""

    value: float | None
    #: "crossing", "ahead" (>= 1 at the lowest rate already), "behind" (< 1 at every rate), "none" (< 2 points).
    how: str

    def describe(self) -> str:
        if self.value is not None:
            return f"{self.value:.4g}" + (" (ahead from the lowest rate)" if self.how == "ahead" else "")
        return {
            "behind": "none: EAGLE-3 is slower at every measured rate",
            "none": "none: fewer than two rates measured",
        }.get(self.how, self.how)


def break_even(points: Mapping[float, float]) -> BreakEven:
    """The acceptance rate where eagle3_over_baseline reaches 1: between the first pair of neighbouring rates
    (ascending) with the ratio below 1 then at or above it, by linear interpolation. Already >= 1 at the lowest
    rate: that rate (how "ahead": the break-even lies at or below it)."""
    curve = sorted(points.items())
    if not curve:
        return BreakEven(value=None, how="none")
    if curve[0][1] >= 1.0:
        return BreakEven(value=curve[0][0], how="ahead")
    for (r0, y0), (r1, y1) in itertools.pairwise(curve):
        if y0 < 1.0 <= y1:
            return BreakEven(value=r0 + (1.0 - y0) * (r1 - r0) / (y1 - y0), how="crossing")
    return BreakEven(value=None, how="behind" if len(curve) > 1 else "none")


def break_even_samples(ratios: Mapping[float, Sequence[float]]) -> list[float]:
    """One break-even per round (the i-th ratio of every rate forms round i's curve), where it crosses."""
    rounds = min((len(v) for v in ratios.values()), default=0)
    found = (break_even({r: v[i] for r, v in ratios.items()}) for i in range(rounds))
    return [b.value for b in found if b.value is not None and b.how == "crossing"]


@dataclass(frozen=True, kw_only=True)
class AcceptCheck:
    rate: float
    expected: float
    tolerance: float
    median: float
    interval: Interval | None
    ok: bool

    def explain(self) -> str:
        where = f"median {self.median:.4g}"
        if self.interval is not None:
            where += (
                f", {self.interval.confidence:.0%} CI [{self.interval.low:.4g}, {self.interval.high:.4g}]"
            )
        verdict = "pass" if self.ok else "fail (the planted acceptance did not happen)"
        return f"{verdict}: accept length at rate {label(self.rate)} {where}; planted 1 + steps x r = " + (
            f"{self.expected:.4g} +- {self.tolerance:g}"
        )


def check_accept_length(
    samples: Sequence[float],
    rate: float,
    *,
    steps: int,
    tolerance: float,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> AcceptCheck:
    """Pass when the planted accept length 1 + steps x rate lies within the samples' interval widened by
    `tolerance` on each side (a single sample: within `tolerance` of it)."""
    if not samples:
        raise ValueError(f"no accept-length samples at rate {rate:g}")
    expected = expected_accept_length(rate, steps)
    interval = (
        bootstrap_ci(samples, confidence=confidence, resamples=resamples, seed=seed)
        if len(samples) > 1
        else None
    )
    low, high = (interval.low, interval.high) if interval else (samples[0], samples[0])
    ok = low - tolerance <= expected <= high + tolerance
    return AcceptCheck(
        rate=rate, expected=expected, tolerance=tolerance, median=median(samples), interval=interval, ok=ok
    )


__all__ = [
    "AT_RATE",
    "BREAK_EVEN",
    "AcceptCheck",
    "BreakEven",
    "at",
    "break_even",
    "break_even_samples",
    "check_accept_length",
    "expected_accept_length",
    "figure_names",
    "is_curve_figure",
    "label",
    "right_in_group",
    "split",
    "whole",
]
