"""Pure statistics for throughput figures: median, bootstrap confidence interval, CV, verdicts, retries.

A figure is judged by the interval, never by one number: a median that happens to clear a threshold on a
noisy runner proves nothing. The rules (issue 8):

- ``pass`` when the interval's lower bound clears a floor (or its upper bound stays under a ceiling);
- ``fail`` when the whole interval is on the wrong side;
- otherwise the result is *undecided*: measure again (the new samples are pooled with the old, so the
  interval narrows) up to ``max_remeasures`` times, then report ``inconclusive``, which is not a pass.

Only an undecided performance result is measured again. A measurement that broke (ImportError, CUDA OOM,
a crashed server, a timeout, zero tokens) is never retried: `classify` tells the two apart from the error
text, the way SGLang's CI retries only on performance-shortfall messages.
"""

from __future__ import annotations

import enum
import math
import random
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

#: A single look at an interval; `decide` turns "undecided" into more samples or "inconclusive".
Look = Literal["pass", "fail", "undecided"]
#: The final verdict of a check.
Verdict = Literal["pass", "fail", "inconclusive"]


def median(samples: Sequence[float]) -> float:
    if not samples:
        raise ValueError("the median of no samples is undefined")
    return float(statistics.median(samples))


def cv(samples: Sequence[float]) -> float:
    """Coefficient of variation: sample standard deviation (n - 1) over the mean."""
    if len(samples) < 2:
        raise ValueError(f"the CV needs at least 2 samples, got {len(samples)}")
    mean = statistics.fmean(samples)
    if mean == 0:
        raise ValueError("the CV of samples with mean 0 is undefined")
    return statistics.stdev(samples) / abs(mean)


@dataclass(frozen=True, kw_only=True)
class Interval:
    low: float
    high: float
    #: e.g. 0.95
    confidence: float

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"interval low {self.low} > high {self.high}")


def bootstrap_ci(
    samples: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
    statistic: Callable[[Sequence[float]], float] = median,
) -> Interval:
    """Percentile bootstrap interval of `statistic` (the median by default), reproducible by `seed`.

    The `resamples` statistics are sorted; the bounds are the order statistics at ranks
    floor(B * alpha/2) and ceil(B * (1 - alpha/2)) - 1 (0-based), alpha = 1 - confidence. The samples are
    sorted first, so the interval does not depend on the order in which they were measured.

    Worth knowing: for the median of n = 5 samples the 95 % interval is [min, max] (the resampled median
    falls at or below the smallest sample with probability P(Bin(5, 1/5) >= 3) = 5.8 % > 2.5 %), so with 5
    repeats a check passes only when even the slowest repeat clears the threshold.
    """
    if len(samples) < 2:
        raise ValueError(f"a bootstrap interval needs at least 2 samples, got {len(samples)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if resamples < 100:
        raise ValueError(f"use at least 100 resamples, got {resamples}")
    data = sorted(float(x) for x in samples)
    if not all(math.isfinite(x) for x in data):
        raise ValueError(f"samples must be finite numbers: {data}")
    rng = random.Random(seed)
    n = len(data)
    stats = sorted(statistic([data[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    alpha = 1.0 - confidence
    lo_rank = math.floor(resamples * alpha / 2)
    hi_rank = min(math.ceil(resamples * (1 - alpha / 2)) - 1, resamples - 1)
    return Interval(low=stats[lo_rank], high=stats[hi_rank], confidence=confidence)


@dataclass(frozen=True, kw_only=True)
class Bound:
    """A threshold on a figure: a floor (`at_least`) for throughput, a ceiling for latency."""

    value: float
    at_least: bool = True

    def describe(self) -> str:
        return f"{'>=' if self.at_least else '<='} {self.value:g}"


def look(interval: Interval, bound: Bound) -> Look:
    """One verdict from one interval: clear on the right side, clear on the wrong side, or neither."""
    if bound.at_least:
        if interval.low >= bound.value:
            return "pass"
        return "fail" if interval.high < bound.value else "undecided"
    if interval.high <= bound.value:
        return "pass"
    return "fail" if interval.low > bound.value else "undecided"


@dataclass(frozen=True, kw_only=True)
class Judgement:
    verdict: Verdict
    bound: Bound
    #: The interval the verdict was read from (all samples pooled).
    interval: Interval
    median: float
    samples: tuple[float, ...]
    #: How many times more samples were taken (0 when the first look decided).
    remeasures: int
    #: The interval after each look, first to last.
    history: tuple[Interval, ...]

    def explain(self) -> str:
        ci = f"{self.interval.confidence:.0%} CI [{self.interval.low:.4g}, {self.interval.high:.4g}]"
        where = f"median {self.median:.4g}, {ci} over {len(self.samples)} samples"
        if self.verdict == "pass":
            return f"pass: {where} clears {self.bound.describe()}"
        if self.verdict == "fail":
            return f"fail ({SHORTFALL_MARKER}): {where} is entirely outside {self.bound.describe()}"
        return (
            f"inconclusive ({SHORTFALL_MARKER} not ruled out) after {self.remeasures} re-measure(s): "
            f"{where} straddles "
            f"{self.bound.describe()} (not a pass; the runner is too noisy or the figure sits on the threshold)"
        )


def decide(
    samples: Sequence[float],
    bound: Bound,
    *,
    more: Callable[[], Sequence[float]],
    max_remeasures: int,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> Judgement:
    """Judge `samples` against `bound`, calling `more()` for extra samples while undecided.

    `more()` is called at most `max_remeasures` times. When it raises, the error is classified and raised
    again as `RemeasureFailed`: a broken measurement is not a shortfall and is never retried.
    """
    if max_remeasures < 0:
        raise ValueError(f"max_remeasures must be >= 0, got {max_remeasures}")
    pooled = [float(x) for x in samples]
    history: list[Interval] = []
    remeasures = 0
    while True:
        interval = bootstrap_ci(pooled, confidence=confidence, resamples=resamples, seed=seed)
        history.append(interval)
        seen = look(interval, bound)
        if seen != "undecided" or remeasures >= max_remeasures:
            verdict: Verdict = "inconclusive" if seen == "undecided" else seen
            return Judgement(
                verdict=verdict,
                bound=bound,
                interval=interval,
                median=median(pooled),
                samples=tuple(pooled),
                remeasures=remeasures,
                history=tuple(history),
            )
        try:
            extra = [float(x) for x in more()]
        except Exception as exc:
            raise RemeasureFailed(classify(f"{type(exc).__name__}: {exc}"), exc) from exc
        if not extra:
            raise ValueError("a re-measure returned no samples")
        pooled.extend(extra)
        remeasures += 1


# ------------------------------------------------------------------------------------------ retries


class FailureKind(enum.Enum):
    #: The figure did not clear its threshold: the only kind that is measured again.
    SHORTFALL = "shortfall"
    IMPORT_ERROR = "import-error"
    OUT_OF_MEMORY = "out-of-memory"
    CRASH = "crash"
    TIMEOUT = "timeout"
    ZERO_TOKENS = "zero-tokens"
    PORT_IN_USE = "port-in-use"
    OTHER = "other"


#: Marker our own shortfall messages carry; `classify` reads it like SGLang CI reads its perf asserts.
SHORTFALL_MARKER = "performance shortfall"

#: Checked in order: a log with an OOM *and* a shortfall message is an OOM (the shortfall is its effect).
_PATTERNS: tuple[tuple[FailureKind, re.Pattern[str]], ...] = (
    (FailureKind.OUT_OF_MEMORY, re.compile(r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY", re.I)),
    (
        FailureKind.IMPORT_ERROR,
        re.compile(r"\b(ImportError|ModuleNotFoundError)\b|undefined symbol|cannot open shared object"),
    ),
    (
        FailureKind.CRASH,
        re.compile(
            r"Segmentation fault|SIGSEGV|SIGABRT|core dumped|illegal memory access|CUDA error|"
            r"exited with code|died|Traceback \(most recent call last\)",
        ),
    ),
    (FailureKind.PORT_IN_USE, re.compile(r"address already in use|port \d+ is already in use", re.I)),
    (FailureKind.ZERO_TOKENS, re.compile(r"\b0 tokens\b|zero tokens", re.I)),
    (FailureKind.TIMEOUT, re.compile(r"timed out|timeout|not healthy after", re.I)),
    (FailureKind.SHORTFALL, re.compile(re.escape(SHORTFALL_MARKER), re.I)),
)


def classify(text: str) -> FailureKind:
    """What kind of failure an error message (or a log tail) describes."""
    for kind, pattern in _PATTERNS:
        if pattern.search(text):
            return kind
    return FailureKind.OTHER


class RemeasureFailed(Exception):
    """A re-measure broke; `kind` says how. Not retried: only an undecided result is measured again."""

    def __init__(self, kind: FailureKind, cause: BaseException) -> None:
        self.kind = kind
        self.cause = cause
        super().__init__(f"re-measure failed ({kind.value}, not retried): {type(cause).__name__}: {cause}")


__all__ = [
    "SHORTFALL_MARKER",
    "Bound",
    "FailureKind",
    "Interval",
    "Judgement",
    "Look",
    "RemeasureFailed",
    "Verdict",
    "bootstrap_ci",
    "classify",
    "cv",
    "decide",
    "look",
    "median",
]
