"""`stackfarm plan` for people: one line per cell (never wrapped, so `grep <cell id>` finds it whole), each
kind summarised past SHOWN rows unless `--all`, and a count line last: what a 100,000-cell matrix prints is
still a page, and says how to see the rest."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.text import Text

from ..artifacts import REFUSED
from ..plan import Cell, Plan

#: Rows shown per kind (cells to run, conflicts, excluded) before the rest of that kind is one summary line.
SHOWN = 1000


def index_problem(reason: str) -> str:
    """A few words for why an index gave no answer: "index unauthorized" (401), ..., else "index unreachable"."""
    return next((f"index {word}" for word in REFUSED.values() if f"{word}: " in reason), "index unreachable")


def _run_detail(cell: Cell, unreachable: Mapping[tuple[str, str], str], drivers: Mapping[str, str]) -> str:
    missing = [c for c in cell.components if (c.distribution, c.version) in unreachable]
    detail = (
        "; ".join(
            f"{index_problem(unreachable[c.distribution, c.version])} for {c.distribution}" for c in missing
        )
        if missing
        else cell.origin
    )
    return f"{detail}; {drivers[cell.id]}" if cell.id in drivers else detail


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def count_line(p: Plan, unreachable_cells: int = 0) -> str:
    """ "1,000 cells: 990 to run, 6 conflicts, 4 excluded" (and how many wait on an index that did not answer)."""
    total = len(p.cells) + len(p.conflicts) + len(p.excluded)
    line = (
        f"{_plural(total, 'cell')}: {len(p.cells):,} to run, {_plural(len(p.conflicts), 'conflict')}, "
        f"{len(p.excluded):,} excluded"
    )
    if unreachable_cells:
        line += f" ({unreachable_cells:,} of those to run wait on an index that did not answer)"
    return line


def rows(
    p: Plan,
    unreachable: Mapping[tuple[str, str], str],
    drivers: Mapping[str, str],
    *,
    every: bool = False,
) -> list[tuple[str, str, str]]:
    """(cell id, status, detail) of each row shown; past SHOWN of a kind (unless `every`), one row ("", "…",
    what was left out)."""
    limit = None if every else SHOWN
    kinds: list[tuple[str, str, int, list[tuple[str, str]]]] = [
        (
            "cells to run",
            "run",
            len(p.cells),
            [(c.id, _run_detail(c, unreachable, drivers)) for c in p.cells[:limit]],
        ),
        (
            "conflicts",
            "conflict",
            len(p.conflicts),
            [(c.cell.id, "; ".join(c.problems)) for c in p.conflicts[:limit]],
        ),
        ("excluded cells", "excluded", len(p.excluded), [(e.cell.id, e.reason) for e in p.excluded[:limit]]),
    ]
    out: list[tuple[str, str, str]] = []
    for name, status, total, shown in kinds:
        # A cell no runner kind's driver can run is never dispatched: a status of its own.
        out += [
            (cell, "unrunnable" if status == "run" and cell in drivers else status, detail)
            for cell, detail in shown
        ]
        if total > len(shown):
            out.append(("", "…", f"{total - len(shown):,} more {name} not shown (`plan --all` lists them)"))
    return out


_STYLE = {"conflict": "yellow", "excluded": "dim", "unrunnable": "red"}


def render(
    console: Console,
    p: Plan,
    unreachable: Mapping[tuple[str, str], str],
    drivers: Mapping[str, str],
    *,
    every: bool = False,
) -> None:
    """The plan's rows as aligned columns, its warnings, then the count line."""
    shown = rows(p, unreachable, drivers, every=every)
    width = max([len("cell"), *(len(cell) for cell, _, _ in shown)])
    lines = [("cell".ljust(width), "status  ", "", "detail")]
    lines += [
        (cell.ljust(width), status.ljust(8), _STYLE.get(status, ""), detail) for cell, status, detail in shown
    ]
    if console.color_system is None:  # a pipe or a CI log: plain text, at the speed of a file write
        console.file.write(
            "".join(f"{cell}  {status}  {detail}".rstrip() + "\n" for cell, status, _, detail in lines)
        )
        console.file.flush()
    else:
        text = Text()
        for cell, status, style, detail in lines:
            text.append(f"{cell}  ")
            text.append(status, style=style)
            text.append(f"  {detail}".rstrip() + "\n")
        console.print(text, end="", soft_wrap=True)
    for warning in p.warnings:
        console.print(Text.assemble(("warning:", "yellow"), f" {warning}"), soft_wrap=True)
    waiting = sum(1 for c in p.cells if any((x.distribution, x.version) in unreachable for x in c.components))
    console.print(count_line(p, waiting), soft_wrap=True)


__all__ = ["SHOWN", "count_line", "index_problem", "render", "rows"]
