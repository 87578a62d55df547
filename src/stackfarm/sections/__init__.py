"""The sections of a cell's page: the runner's patch step (for every cell), then each suite family's own,
rendered from its record (its family.py, stackfarm.family), in the families' order.

A family renders from the records its suite wrote (``<suite>.json``), only those whose sha256 the verdict binds:
a record that is not the one bound is named in a problem line instead, never rendered as truth. A held run from
before records (format 0) is read by the family's `legacy`, once, here. htmlreport asks this module and holds no
suite-specific code; a suite without a family (00-stack, 05-import) shows its grid cell and its testcases only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from ..family import SectionContext, SuiteFamily, read_record, record_path

if TYPE_CHECKING:  # not at run time: the summaries import .grid, and history imports the summaries' module
    from ..history import CellRun, SuiteRun

#: A suite name -> its family (stackfarm.families.load): the sections rendered from records.
Families = Mapping[str, SuiteFamily[Any, Any]]


def claimed(suite: str, families: Families | None = None) -> bool:
    """Whether a section shows the suite's figures (its family's)."""
    return suite in (families or {})


def _records(
    family: SuiteFamily[Any, Any], suites: Sequence[SuiteRun]
) -> tuple[list[SuiteRun], list[Any], list[str]]:
    """(the suite runs shown, their records, why each other record is not shown): only the bytes the verdict
    binds are read as a record (stackfarm.family.read_record)."""
    shown: list[SuiteRun] = []
    records: list[Any] = []
    problems: list[str] = []
    for suite in suites:
        if family.record is None or suite.result.xml is None:
            continue
        path = record_path(suite.result.xml.parent, family.name)
        if suite.result.record_sha256 is None and family.legacy is not None and not path.exists():
            record, problem = family.legacy(suite), None  # format 0: a held run from before records
        else:
            record, problem = read_record(family.record, path, suite.result.record_sha256)
        problems += [problem] if problem is not None else []
        if record is not None:
            shown.append(suite)
            records.append(record)
    return shown, records, problems


def family_section(
    family: SuiteFamily[Any, Any], cell: CellRun, trends: Mapping[str, list[tuple[str, float]]] | None = None
) -> str:
    """The family's section from the records of its suite, and a problem line per record not shown."""
    suites = [s for s in cell.suites if s.result.suite == family.name]
    if family.section is None or not suites:
        return ""
    shown, records, problems = _records(family, suites)
    mine = {k: v for k, v in (trends or {}).items() if k.split("::", 1)[0] == family.name}
    ctx = SectionContext(cell=cell, suites=tuple(shown), records=tuple(records), trends=mine)
    out = family.section(ctx) if records else ""
    if problems:
        items = "".join(f"<li>{escape(p)}</li>" for p in problems)
        out += f'<h2>{escape(family.title)}</h2><ul class="problems">{items}</ul>'
    return out


def render(
    cell: CellRun,
    trends: Mapping[str, list[tuple[str, float]]] | None = None,
    families: Families | None = None,
) -> str:
    """The cell's sections in page order: the patch step's, then each family's from its records."""
    from .patches import render as patches  # imports the patch rule, which the summaries' grid must not need

    ordered = sorted((families or {}).values(), key=lambda f: (f.order, f.name))
    return patches(cell) + "".join(family_section(f, cell, trends) for f in ordered)


__all__ = ["Families", "claimed", "family_section", "render"]
