"""What a walk of the upgrade planner concludes from its judged candidates (stackfarm.upgrade_plan's records):
where each blocker appears and goes away (`timeline`), and the recommendation read from them (`recommend`).

Kept apart from stackfarm.upgrade, which forms and judges the stacks; the rule itself is in stackfarm.upgrade's
module docstring.
"""

from __future__ import annotations

from collections.abc import Sequence

from packaging.version import Version

from .upgrade_plan import Blocker, Candidate, Recommendation, Span


def timeline(cands: Sequence[Candidate]) -> tuple[Span, ...]:
    """For every blocker of the walk (start first): the release where it first appears, and the first
    release after that without it."""
    order = [c.sglang for c in cands]
    where: dict[str, list[str]] = {}
    first: dict[str, Blocker] = {}
    for cand in cands:
        for b in cand.blockers:
            where.setdefault(b.key, []).append(cand.sglang)
            first.setdefault(b.key, b)
    spans = []
    for key, present in where.items():
        appears = present[0]
        later = order[order.index(appears) + 1 :]
        gone = next((v for v in later if v not in present), None)
        b = first[key]
        spans.append(
            Span(
                key=key,
                kind=b.kind,
                outcome=b.outcome,
                title=b.title,
                appears=appears,
                gone=gone,
                releases=tuple(present),
                current=appears == order[0],
            )
        )
    return tuple(sorted(spans, key=lambda s: (order.index(s.appears), s.kind, s.title)))


def _acceptable(cand: Candidate, strict: bool) -> bool:
    """Not unavailable, and failing nothing new (`strict`: nothing at all)."""
    fails = [b for b in cand.blockers if b.outcome == "fail"]
    return cand.status != "unavailable" and not (fails if strict else cand.new_failures)


def _held_back_by(cand: Candidate) -> str:
    """The first three titles that keep `cand` back: its new failures, else all its blockers."""
    return "; ".join(b.title for b in (cand.new_failures or cand.blockers)[:3])


def _nothing_to_recommend(start: Candidate, cands: Sequence[Candidate], strict: bool) -> Recommendation:
    if not cands:
        why = f"no release newer than sglang {start.sglang} on the index"
    else:
        blocked = next(c for c in cands if not _acceptable(c, strict))
        why = f"no candidate passes: the first, sglang {blocked.sglang}, fails on {_held_back_by(blocked)}"
    return Recommendation(release=None, cell=None, values={}, reason=why)


def _carry(best: Candidate) -> tuple[str, ...]:
    """The patch sets the recommended stack still carries, each with its verdict and note."""
    return tuple(
        f"{c.chosen or c.member} ({c.verdict}{': ' + c.note if c.note else ''})"
        for c in best.patches
        if c.chosen or c.verdict == "partial"
    )


def _retire(start: Candidate, best: Candidate) -> tuple[str, ...]:
    """The lineages the start cell carries that the recommended release no longer needs."""
    carried = {c.lineage for c in start.patches if c.chosen}
    return tuple(
        f"{c.lineage}: {c.note or 'upstreamed'}"
        for c in best.patches
        if c.verdict == "retire" and c.lineage in carried
    )


def _why_best(best: Candidate, cands: Sequence[Candidate], strict: bool) -> str:
    """Why `best` is the one, and what stops the release after it."""
    why = f"sglang {best.sglang} is the newest candidate whose static verdicts on {best.cell} " + (
        "fail nothing" if strict else "fail nothing the current stack does not already fail"
    )
    after = [c for c in cands if Version(c.sglang) > Version(best.sglang)]
    stop = next((c for c in after if not _acceptable(c, strict)), None)
    if stop is not None:
        why += f"; sglang {stop.sglang} is next: " + _held_back_by(stop)
    return why


def recommend(start: Candidate, cands: Sequence[Candidate], *, strict: bool = False) -> Recommendation:
    """The newest candidate that is not unavailable and fails nothing new (`strict`: nothing at all)."""
    good = [c for c in cands if _acceptable(c, strict)]
    if not good:
        return _nothing_to_recommend(start, cands, strict)
    best = good[-1]
    return Recommendation(
        release=best.sglang,
        cell=best.cell,
        values=dict(best.values),
        carry=_carry(best),
        retire=_retire(start, best),
        open=tuple(b.title for b in best.blockers if b.outcome == "open"),
        accepted=tuple(b.title for b in best.blockers if b.outcome == "fail" and b.current),
        proof=tuple(dict.fromkeys((start.cell, best.cell))),
        reason=_why_best(best, cands, strict),
    )


__all__ = ["recommend", "timeline"]
