"""30-numerics (and suites named ``equivalence``): each comparison's figures (``max_abs_err``, ``tolerance``,
``match_rate``, ``first_divergence``, ``near_ties``) as a table, match rates as bars on a 0..1 scale."""

from __future__ import annotations

from ..history import as_number
from . import Context, register
from .html import Bar, bar_chart, case_rows, table

KEYS = ("max_abs_err", "tolerance", "match_rate", "first_divergence", "near_ties")


@register("numerics", "equivalence", name="numerics", order=30)
def render(ctx: Context) -> str:
    cases = [(s.result.suite, c) for s in ctx.suites for c in s.cases if any(k in c.properties for k in KEYS)]
    if not cases:
        return ""
    out = "<h2>Equivalence</h2>" + table(("suite", "outcome", "testcase", *KEYS), case_rows(cases, KEYS))
    bars = [
        Bar(label=c.name, value=v)
        for _, c in cases
        if (v := as_number(c.properties.get("match_rate", ""))) is not None
    ]
    return out + (bar_chart("match rate", bars, top=1.0) if bars else "")
