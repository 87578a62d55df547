"""The runner's patch step, for every cell: the patch sets' hashes (cell properties) and each patch's status
(``patch.<set>/<patch>.status`` in cell, suite or testcase properties)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..history import CellRun
from . import Context, register
from .html import badge, e, table

_PATCH_STATUS = re.compile(r"^patch\.(?P<name>.+)\.status$")
_PATCH_SET_HASH = re.compile(r"^patches\.(?P<set>.+)\.sha256$")
#: Statuses that leave the patched tree as the set means it.
GOOD = ("applied", "already-applied", "upstreamed")


def _all_properties(cell: CellRun) -> Iterable[tuple[str, str]]:
    yield from cell.report.properties.items()
    for suite in cell.suites:
        yield from suite.properties.items()
        for case in suite.cases:
            yield from case.properties.items()


@register(name="patches", order=0)
def render(ctx: Context) -> str:
    cell = ctx.cell
    sets = {
        m["set"]: v for k, v in cell.report.properties.items() if (m := _PATCH_SET_HASH.match(k)) is not None
    }
    statuses = {m["name"]: v for k, v in _all_properties(cell) if (m := _PATCH_STATUS.match(k)) is not None}
    out = "<h2>Patches</h2>"
    if not sets and not statuses:
        return out + "<p>No patch set applies to this cell.</p>"
    if sets:
        out += table(
            ("patch set", "sha256"), ((e(s), f"<code>{e(h)}</code>") for s, h in sorted(sets.items()))
        )
    if statuses:
        out += table(
            ("patch", "status"),
            (
                (f"<code>{e(n)}</code>", badge("passed" if s in GOOD else "failed", s))
                for n, s in sorted(statuses.items())
            ),
        )
    else:
        out += '<p class="muted">No patch statuses recorded for this run.</p>'
    return out
