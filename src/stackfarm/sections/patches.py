"""The runner's patch step, for every cell: the patch sets' hashes and each patch's status, from the cell's
verdict (`CellReport.patch_sets`, `CellReport.patches`), each status judged by the patch rule
(stackfarm.patches.model.fine) the runner's patch step applies."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..patches.model import fine
from .html import badge, e, table

if TYPE_CHECKING:
    from ..history import CellRun


def render(cell: CellRun) -> str:
    """The patch sets' hashes and each patch's status, judged by the patch rule."""
    report = cell.report
    sets, statuses = report.patch_sets, report.patches
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
                (f"<code>{e(n)}</code>", badge("passed" if fine(s) else "failed", s))
                for n, s in sorted(statuses.items())
            ),
        )
    else:
        out += '<p class="muted">No patch statuses recorded for this run.</p>'
    return out


__all__ = [
    "render",
]
