"""10-capability: the arch x component grid (``capability.<arch>.<component>`` testsuite properties) and each
finding (testcases carrying ``arch`` and ``verdict``), with the finding's ``file:line``."""

from __future__ import annotations

import re

from . import Context, register
from .html import e, findings, table

_GRID = re.compile(r"^capability\.(?P<arch>sm_[0-9a-z]+)\.(?P<component>.+)$")
KEYS = ("arch", "component", "verdict", "file", "line", "symbol", "detail")


@register("capability", name="capability", order=10)
def render(ctx: Context) -> str:
    cases = [
        (s.result.suite, c) for s in ctx.suites for c in s.cases if {"arch", "verdict"} <= c.properties.keys()
    ]
    grid: dict[tuple[str, str], str] = {}
    for suite in ctx.suites:
        for key, value in suite.properties.items():
            if (m := _GRID.match(key)) is not None:
                grid[(m["arch"], m["component"])] = value
    if not cases and not grid:
        return ""
    out = "<h2>Capability findings</h2>"
    if grid:
        archs = sorted({a for a, _ in grid})
        comps = sorted({c for _, c in grid})
        rows = [(f"<strong>{e(a)}</strong>", *(e(grid.get((a, c), "")) for c in comps)) for a in archs]
        out += table(("arch", *comps), rows)
    if cases:
        out += findings("Findings", cases, KEYS)
    return out
