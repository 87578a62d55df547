"""The sections of a cell's page, one renderer per suite family, registered by suite-name prefix.

A suite library renders what its own suite found (its testcase and testsuite properties) as tables, with
file:line locations where a finding has them, and charts where there are figures; htmlreport asks this registry
and holds no suite-specific code. The prefix matches the suite's name without its ordinal: ``"throughput"``
matches ``40-throughput``. A section registered with no prefix renders for every cell (the runner's patch
statuses).

    @register("throughput", "perf", "bench", title="Throughput", order=40)
    def render(ctx: Context) -> str: ...

The built-in renderers (capability, toolchain, eagle3, numerics, throughput, patches) load on the first `render`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not at run time: the summaries import .grid, and history imports the summaries' module
    from ..history import CellRun, SuiteRun

#: The modules of the built-in renderers, imported on first use (they import history, which the summaries'
#: grid module must not need).
BUILTIN = ("patches", "capability", "toolchain", "eagle3", "numerics", "throughput")


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
    """The section that renders `suite`, if one does."""
    return next((s for s in load() if s.prefixes and s.matches(suite)), None)


def claimed(suite: str) -> bool:
    return for_suite(suite) is not None


def render(cell: CellRun, trends: Mapping[str, list[tuple[str, float]]] | None = None) -> str:
    """The cell's sections, each given the suites it claims (a prefix-less section gets every suite)."""
    out = []
    for section in load():
        suites: Sequence[SuiteRun] = (
            [s for s in cell.suites if section.matches(s.result.suite)] if section.prefixes else cell.suites
        )
        if section.prefixes and not suites:
            continue
        mine = {
            k: v
            for k, v in (trends or {}).items()
            if not section.prefixes or section.matches(k.split("::", 1)[0])
        }
        out.append(section.render(Context(cell=cell, suites=tuple(suites), trends=mine)))
    return "".join(out)


__all__ = ["BUILTIN", "Context", "Renderer", "Section", "claimed", "for_suite", "load", "register", "render"]
