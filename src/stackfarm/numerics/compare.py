"""Compare two engines' greedy generations and explain every divergence (pure functions, no torch).

Greedy decoding emits the argmax at each step. Two numerically different but equally correct paths (plain decode
vs EAGLE-3's tree verify, fused vs unfused allreduce) may round the top two logits differently, so where the
baseline's top-1 and top-2 were (nearly) tied, the paths can legitimately pick different tokens; from there on the
sequences are conditioned on different prefixes and comparing them further says nothing. So each prompt is
judged at its *first* divergence only:

- ``near-tie``: the baseline's top-1/top-2 logprob gap at that step is within the tie tolerance and the candidate
  picked the baseline's runner-up: rounding can explain it. Tolerated up to a rate (`judge`).
- ``real``: anything else: a large gap, or a token the baseline did not even rank second. Always a failure.

The tie tolerance is ``max(near_tie_tol, drift_factor x drift)``, where the drift is the largest difference of the
top-1 logprob between the two runs over the steps they ran on the same prefix: the noise the two numerical paths
were *seen* to have where they agree. Rounding noise in nats scales with the logits' magnitude, so a fixed
tolerance alone would be too tight for a peaked model and too loose for a flat one; the drift measures it. A drift
beyond ``max_drift`` is a failure of its own: the paths compute different numbers even where tokens agree.

SGLang's and vLLM's own spec-decode tests either demand exact equality (flaky in bf16) or a fraction of matching
prompts (which hides real bugs among ties); classifying by the gap is the difference.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

#: How a prompt's two generations relate.
Kind = Literal["near-tie", "real"]


@dataclass(frozen=True, kw_only=True)
class Step:
    """One generated position: the emitted token and the engine's best alternatives there."""

    token: int
    #: (token, logprob) pairs, best first: the top-2 of the distribution the token was drawn from; empty if unknown.
    top: tuple[tuple[int, float], ...] = ()

    @property
    def gap(self) -> float | None:
        """top-1 minus top-2 logprob (>= 0), or None when fewer than two are known."""
        if len(self.top) < 2:
            return None
        return self.top[0][1] - self.top[1][1]


@dataclass(frozen=True, kw_only=True)
class Generation:
    """One prompt's greedy output from one engine configuration."""

    prompt: tuple[int, ...]
    steps: tuple[Step, ...]
    #: Tokens per target forward pass (speculative engines), None when not speculative or not reported.
    accept_length: float | None = None

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(s.token for s in self.steps)


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """Where one prompt's candidate output first leaves the baseline, and why that may be fine."""

    prompt_index: int
    position: int
    kind: Kind
    baseline_token: int | None
    candidate_token: int | None
    #: The baseline's top-1 minus top-2 logprob at `position`; None when unknown.
    gap: float | None
    #: The baseline's second choice at `position`; None when unknown.
    runner_up: int | None
    reason: str

    def describe(self) -> str:
        gap = "unknown" if self.gap is None else f"{self.gap:.4g}"
        return (
            f"prompt {self.prompt_index} @ {self.position}: {self.kind} "
            f"(baseline {self.baseline_token}, candidate {self.candidate_token}, gap {gap}; {self.reason})"
        )


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Everything the suite reports about one (baseline, candidate) pair of runs."""

    prompts: int
    identical: int
    #: Tokens in the common prefixes, over all baseline tokens.
    prefix_tokens: int
    total_tokens: int
    divergences: tuple[Divergence, ...]
    near_tie_tol: float
    #: The tie tolerance actually applied: max(near_tie_tol, drift_factor x max_logprob_err).
    tie_tol: float
    accept_length: float | None
    #: Median / minimum of the baseline's top-2 gaps over every step: how peaked the test model is.
    median_gap: float | None
    min_gap: float | None
    #: Baseline steps whose gap is within tie_tol: where a divergence would be excused.
    tie_steps: int
    #: The largest |baseline - candidate| top-1 logprob over the steps both ran on the same prefix: how far the
    #: two numerical paths drift apart where they agree on the token. None when no step has logprobs.
    max_logprob_err: float | None = None

    @property
    def match_rate(self) -> float:
        """Prompts whose outputs are identical, over all prompts."""
        return self.identical / self.prompts if self.prompts else 1.0

    @property
    def token_match_rate(self) -> float:
        return self.prefix_tokens / self.total_tokens if self.total_tokens else 1.0

    @property
    def near_ties(self) -> int:
        return sum(1 for d in self.divergences if d.kind == "near-tie")

    @property
    def real(self) -> tuple[Divergence, ...]:
        return tuple(d for d in self.divergences if d.kind == "real")

    @property
    def first_divergence(self) -> Divergence | None:
        """The earliest divergence (by position, then prompt), or None when every prompt matched."""
        return min(self.divergences, key=lambda d: (d.position, d.prompt_index), default=None)

    def properties(self) -> dict[str, str]:
        """The JUnit properties the suite records for this pair."""
        first = self.first_divergence
        return {
            "match_rate": f"{self.match_rate:.4f}",
            "token_match_rate": f"{self.token_match_rate:.4f}",
            "first_divergence": "none" if first is None else first.describe(),
            "divergences": "; ".join(d.describe() for d in self.divergences) or "none",
            "near_ties": str(self.near_ties),
            "real_divergences": str(len(self.real)),
            "accept_length": "n/a" if self.accept_length is None else f"{self.accept_length:.3f}",
            "median_gap": _fmt(self.median_gap),
            "min_gap": _fmt(self.min_gap),
            "tie_steps": f"{self.tie_steps}/{self.total_tokens}",
            "max_abs_err": _fmt(self.max_logprob_err),
            "tolerance": f"near_tie_tol={self.near_tie_tol:g}",
            "tie_tol": f"{self.tie_tol:.4g}",
        }


@dataclass(frozen=True, kw_only=True)
class Verdict:
    ok: bool
    message: str


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where the sequences differ (a length difference counts), or None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def classify(
    prompt_index: int, baseline: Generation, candidate: Generation, near_tie_tol: float
) -> Divergence | None:
    """The candidate's first divergence from the baseline on one prompt, classified; None when identical."""
    position = first_difference(baseline.tokens, candidate.tokens)
    if position is None:
        return None
    base = baseline.steps[position] if position < len(baseline.steps) else None
    cand = candidate.steps[position] if position < len(candidate.steps) else None
    base_token = None if base is None else base.token
    cand_token = None if cand is None else cand.token
    if base is None or cand is None:
        return Divergence(
            prompt_index=prompt_index,
            position=position,
            kind="real",
            baseline_token=base_token,
            candidate_token=cand_token,
            gap=None,
            runner_up=None,
            reason=f"lengths differ ({len(baseline.steps)} vs {len(candidate.steps)} tokens)",
        )
    gap = base.gap
    runner_up = base.top[1][0] if len(base.top) >= 2 else None
    if gap is None:
        kind: Kind = "real"
        reason = "the baseline reported no top-2 logprobs, so the divergence cannot be explained"
    elif gap > near_tie_tol:
        kind, reason = "real", f"gap {gap:.4g} > tolerance {near_tie_tol:g}"
    elif cand.token != runner_up:
        kind = "real"
        reason = f"gap {gap:.4g} is a near-tie, but the candidate's token is not the baseline's runner-up {runner_up}"
    else:
        kind, reason = "near-tie", f"gap {gap:.4g} <= {near_tie_tol:g}, candidate took the runner-up"
    return Divergence(
        prompt_index=prompt_index,
        position=position,
        kind=kind,
        baseline_token=base.token,
        candidate_token=cand.token,
        gap=gap,
        runner_up=runner_up,
        reason=reason,
    )


def _logprob_errors(base: Generation, cand: Generation, upto: int) -> list[float]:
    """|top-1 logprob difference| at the shared-prefix steps where both report the same top-1 token."""
    return [
        abs(b.top[0][1] - c.top[0][1])
        for b, c in zip(base.steps[:upto], cand.steps[:upto], strict=False)
        if b.top and c.top and b.top[0][0] == c.top[0][0]
    ]


def compare(
    baseline: Sequence[Generation],
    candidate: Sequence[Generation],
    *,
    near_tie_tol: float,
    drift_factor: float = 0.0,
) -> Comparison:
    """Compare two runs over the same prompts, prompt by prompt (see the module docstring for the tolerance)."""
    for name, value in (("near_tie_tol", near_tie_tol), ("drift_factor", drift_factor)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
    if len(baseline) != len(candidate):
        raise ValueError(f"the runs cover {len(baseline)} and {len(candidate)} prompts: not the same prompts")
    for i, (base, cand) in enumerate(zip(baseline, candidate, strict=True)):
        if base.prompt != cand.prompt:
            raise ValueError(
                f"prompt {i} differs between the runs: {base.prompt[:8]}... vs {cand.prompt[:8]}..."
            )
    # The drift first (it sets the tolerance): shared prefixes do not depend on the tolerance.
    errors: list[float] = []
    for base, cand in zip(baseline, candidate, strict=True):
        upto = first_difference(base.tokens, cand.tokens)
        errors += _logprob_errors(base, cand, len(base.steps) if upto is None else upto)
    drift = max(errors) if errors else None
    tie_tol = max(near_tie_tol, drift_factor * (drift or 0.0))
    divergences: list[Divergence] = []
    prefix = total = 0
    for i, (base, cand) in enumerate(zip(baseline, candidate, strict=True)):
        found = classify(i, base, cand, tie_tol)
        total += len(base.steps)
        prefix += len(base.steps) if found is None else found.position
        if found is not None:
            divergences.append(found)
    gaps = [g for gen in baseline for s in gen.steps if (g := s.gap) is not None]
    accepts = [g.accept_length for g in candidate if g.accept_length is not None]
    return Comparison(
        prompts=len(baseline),
        identical=len(baseline) - len(divergences),
        prefix_tokens=prefix,
        total_tokens=total,
        divergences=tuple(divergences),
        near_tie_tol=near_tie_tol,
        tie_tol=tie_tol,
        accept_length=statistics.fmean(accepts) if accepts else None,
        median_gap=statistics.median(gaps) if gaps else None,
        min_gap=min(gaps) if gaps else None,
        tie_steps=sum(1 for g in gaps if g <= tie_tol),
        max_logprob_err=drift,
    )


def judge(comparison: Comparison, *, max_near_tie_rate: float, max_drift: float = math.inf) -> Verdict:
    """Pass when there is no real divergence, near-ties stay within the tolerated share of prompts, and the two
    runs' logprobs drift apart by at most `max_drift` nats where they agree on the tokens."""
    rate = comparison.near_ties / comparison.prompts if comparison.prompts else 0.0
    problems = [d.describe() for d in comparison.real]
    drift = comparison.max_logprob_err
    if drift is not None and drift > max_drift:
        problems.append(
            f"the top-1 logprobs differ by up to {drift:.4g} nats where the runs agree on the tokens "
            f"(> max_drift {max_drift:g}): the two paths compute different numbers"
        )
    if rate > max_near_tie_rate:
        problems.append(
            f"{comparison.near_ties} of {comparison.prompts} prompts diverge at near-ties "
            f"(rate {rate:.3f} > tolerated {max_near_tie_rate:g})"
        )
    summary = (
        f"{comparison.identical}/{comparison.prompts} prompts identical, "
        f"{comparison.prefix_tokens}/{comparison.total_tokens} tokens before the first divergences, "
        f"{comparison.near_ties} near-tie(s), {len(comparison.real)} real "
        f"(tie tolerance {comparison.tie_tol:.3g}, drift {_fmt(drift)})"
    )
    if problems:
        return Verdict(ok=False, message=f"{summary}: " + "; ".join(problems))
    return Verdict(ok=True, message=summary)


__all__ = [
    "Comparison",
    "Divergence",
    "Generation",
    "Kind",
    "Step",
    "Verdict",
    "classify",
    "compare",
    "first_difference",
    "judge",
]
