"""The sections of a cell's page: each suite family's own (its family.py, rendered from its record), and the
renderers of the families not migrated yet, registered by suite-name prefix.

A suite family with a family.py (stackfarm.family) renders its section from the records its suite wrote
(``<suite>.json``), only those whose sha256 the verdict binds: a record that is not the one bound is named in a
problem line instead, never rendered as truth. The legacy renderers below render what their suite found (its
testcase and testsuite properties) as tables, with file:line locations where a finding has them, and charts
where there are figures; htmlreport asks this module and holds no suite-specific code. The prefix matches the suite's name without its ordinal: ``"throughput"``
matches ``40-throughput``. A section registered with no prefix renders for every cell (the runner's patch
statuses).

    @register("throughput", "perf", "bench", title="Throughput", order=40)
    def render(ctx: Context) -> str: ...

The built-in renderers (patches, and still to migrate: numerics, throughput) load on the first `render`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING, Any

from ..family import SectionContext, SuiteFamily, read_record, record_path

if TYPE_CHECKING:  # not at run time: the summaries import .grid, and history imports the summaries' module
    from ..history import CellRun, SuiteRun

#: The modules of the built-in renderers, imported on first use (they import history, which the summaries'
#: grid module must not need).
BUILTIN = ("patches", "numerics", "throughput")
#: A suite name -> its family (stackfarm.families.load): the sections rendered from records.
Families = Mapping[str, SuiteFamily[Any, Any]]


@dataclass(frozen=True, kw_only=True)
class Context:
    """What a renderer gets: the cell, the suites its prefixes matched, and the cell's figures over time
    (``suite::testcase::property`` -> [(run, value)], from history.json)."""

    cell: CellRun
    suites: tuple[SuiteRun, ...]
    trends: Mapping[str, list[tuple[str, float]]] = field(default_factory=dict)


Renderer = Callable[[Context], str]


@dataclass(frozen=True, kw_only=True)
class Section:
    name: str
    prefixes: tuple[str, ...]
    order: int
    render: Renderer

    def matches(self, suite: str) -> bool:
        bare = suite.split("-", 1)[1] if suite[:1].isdigit() and "-" in suite else suite
        return any(bare.startswith(p) for p in self.prefixes)


_REGISTRY: dict[str, Section] = {}
_LOADED: list[str] = []  # the built-in modules imported so far


def register(*prefixes: str, name: str, order: int = 50) -> Callable[[Renderer], Renderer]:
    """Register a renderer for the suites whose names (less the ordinal) start with one of `prefixes`."""

    def add(fn: Renderer) -> Renderer:
        _REGISTRY[name] = Section(name=name, prefixes=tuple(prefixes), order=order, render=fn)
        return fn

    return add


def load() -> list[Section]:
    """Every registered section, in page order (the built-in ones imported once)."""
    for module in BUILTIN:
        if module not in _LOADED:
            importlib.import_module(f"{__name__}.{module}")
            _LOADED.append(module)
    return sorted(_REGISTRY.values(), key=lambda s: (s.order, s.name))


def for_suite(suite: str) -> Section | None:
    """The legacy section that renders `suite`, if one does."""
    return next((s for s in load() if s.prefixes and s.matches(suite)), None)


def claimed(suite: str, families: Families | None = None) -> bool:
    """Whether a section shows the suite's figures (its family's, or a legacy renderer's)."""
    return suite in (families or {}) or for_suite(suite) is not None


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
    """The cell's sections in page order: each family's from its records, each legacy renderer given the suites
    it claims (a prefix-less section gets every suite)."""
    registry: Families = families or {}
    parts: list[tuple[int, str, SuiteFamily[Any, Any] | Section]] = [
        *((f.order, f.name, f) for f in registry.values()),
        *((s.order, s.name, s) for s in load()),
    ]
    return "".join(
        family_section(part, cell, trends)
        if isinstance(part, SuiteFamily)
        else _legacy(part, cell, trends, registry)
        for _, _, part in sorted(parts, key=lambda p: (p[0], p[1]))
    )


def _legacy(
    section: Section, cell: CellRun, trends: Mapping[str, list[tuple[str, float]]] | None, families: Families
) -> str:
    mine_suites = [s for s in cell.suites if s.result.suite not in families]
    suites: Sequence[SuiteRun] = (
        [s for s in mine_suites if section.matches(s.result.suite)] if section.prefixes else cell.suites
    )
    if section.prefixes and not suites:
        return ""
    mine = {
        k: v
        for k, v in (trends or {}).items()
        if not section.prefixes or section.matches(k.split("::", 1)[0])
    }
    return section.render(Context(cell=cell, suites=tuple(suites), trends=mine))


__all__ = [
    "BUILTIN",
    "Context",
    "Families",
    "Renderer",
    "Section",
    "claimed",
    "family_section",
    "for_suite",
    "load",
    "register",
    "render",
]
