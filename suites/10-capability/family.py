"""10-capability as a suite family (stackfarm.family): its settings, its record, its report section.

Settings ([suites.10-capability.settings]): `environ` (the deployment's environment for the gate evaluation),
`table_packages` / `flag_packages` (the packages scanned, default ["sglang"]).

Record (``10-capability.json``): the arch x component grid ("verdict xN, ..." over the findings that did not
pass, or "ok"), every finding with its testcase, arch, component, verdict, file:line, symbol and detail, and the
seconds of each analysis step. The section joins each finding with its testcase's outcome in the JUnit file
(JUnit says pass/fail/skip, the record says what was found).

Format 0 (`legacy`): a run held from before this family wrote records (its verdict binds no record sha256) kept
the same facts in its JUnit file, as the report's renderer of then read them: the grid as testsuite properties
``capability.<arch>.<component>``, the seconds as ``capability.seconds.<step>``, each finding as the properties
of a testcase that has ``arch`` and ``verdict``. `legacy` builds the record from those, so a held report's page
shows the section it showed then.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stackfarm.family import Needs, SectionContext, SuiteFamily
from stackfarm.schema import Table
from stackfarm.settings_kit import ENVIRON, PACKAGES

if TYPE_CHECKING:  # the report's types: matrix.load imports this file too, and needs none of them
    from stackfarm.history import Case, SuiteRun

NAME = "10-capability"

SCHEMA = Table({"environ": ENVIRON, "table_packages": PACKAGES, "flag_packages": PACKAGES}, noun="setting")


@dataclass(frozen=True, kw_only=True)
class CapabilitySettings:
    """[suites.10-capability.settings], parsed."""

    environ: dict[str, str] = field(default_factory=dict)
    table_packages: tuple[str, ...] = ("sglang",)
    flag_packages: tuple[str, ...] = ("sglang",)

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> CapabilitySettings:
        return cls(
            environ={str(k): str(v) for k, v in dict(table.get("environ", {})).items()},
            table_packages=tuple(str(p) for p in table.get("table_packages", ("sglang",))),
            flag_packages=tuple(str(p) for p in table.get("flag_packages", ("sglang",))),
        )


@dataclass(frozen=True, kw_only=True)
class GridCell:
    arch: str
    component: str
    #: "verdict xN, ..." over the findings that did not pass, or "ok".
    text: str


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One judged finding, as its testcase (`testcase`, pytest's name) reports it."""

    testcase: str
    arch: str
    component: str
    verdict: str
    file: str
    line: int = 0
    symbol: str = ""
    detail: str = ""
    feature: str = ""


@dataclass(frozen=True, kw_only=True)
class Timing:
    step: str
    seconds: float


@dataclass(frozen=True, kw_only=True)
class CapabilityRecord:
    grid: tuple[GridCell, ...] = ()
    findings: tuple[Finding, ...] = ()
    timings: tuple[Timing, ...] = ()


#: The columns of the findings table (after suite, outcome, testcase).
KEYS = ("arch", "component", "verdict", "file", "line", "symbol", "detail")


def _facts(finding: Finding) -> dict[str, str]:
    """The finding as the findings table shows it (its outcome comes from its testcase in JUnit)."""
    return {
        "arch": finding.arch,
        "component": finding.component,
        "verdict": finding.verdict,
        "file": finding.file,
        "line": str(finding.line),
        "symbol": finding.symbol,
        "detail": finding.detail,
    }


def render(ctx: SectionContext[CapabilityRecord]) -> str:
    """The grid (arch x component), then each finding with its file:line."""
    from stackfarm.sections.html import findings, record_cases

    cases: list[tuple[str, Case]] = []
    grid: dict[tuple[str, str], str] = {}
    for suite, record in zip(ctx.suites, ctx.records, strict=True):
        cases += record_cases(suite, record.findings, _facts)
        grid |= {(g.arch, g.component): g.text for g in record.grid}
    if not cases and not grid:
        return ""
    out = "<h2>Capability findings</h2>" + (_grid_table(grid) if grid else "")
    return out + (findings("Findings", cases, KEYS) if cases else "")


def _grid_table(grid: Mapping[tuple[str, str], str]) -> str:
    """arch x component: "verdict xN, ..." or "ok" in each cell."""
    from stackfarm.sections.html import e, table

    archs = sorted({a for a, _ in grid})
    comps = sorted({c for _, c in grid})
    rows = [(f"<strong>{e(a)}</strong>", *(e(grid.get((a, c), "")) for c in comps)) for a in archs]
    return table(("arch", *comps), rows)


# --------------------------------------------------------------------------- format 0: a held run's properties

#: A grid cell's testsuite property in a held run: ``capability.sm_90.torch`` (the renderer of then matched this).
_GRID_PROPERTY = re.compile(r"^capability\.(?P<arch>sm_[0-9a-z]+)\.(?P<component>.+)$")
_SECONDS_PREFIX = "capability.seconds."


def _line(text: str) -> int:
    """A held ``line`` property as a number (0, "no line", for anything that is not one)."""
    return int(text) if text.isdigit() else 0


def _held_finding(case: Case) -> Finding:
    props = case.properties
    return Finding(
        testcase=case.name,
        arch=props["arch"],
        component=props.get("component", ""),
        verdict=props["verdict"],
        file=props.get("file", ""),
        line=_line(props.get("line", "")),
        symbol=props.get("symbol", ""),
        detail=props.get("detail", ""),
        feature=props.get("feature", ""),
    )


def _held_seconds(step: str, text: str) -> Timing | None:
    try:
        return Timing(step=step, seconds=float(text))
    except ValueError:
        return None


def legacy(suite: SuiteRun) -> CapabilityRecord | None:
    """Format 0: the record of a run held from before records, from its JUnit properties (the grid from the
    testsuite's, each finding from a testcase carrying ``arch`` and ``verdict``); None when it holds neither."""
    findings = tuple(_held_finding(c) for c in suite.cases if {"arch", "verdict"} <= c.properties.keys())
    grid = tuple(
        GridCell(arch=m["arch"], component=m["component"], text=value)
        for key, value in suite.properties.items()
        if (m := _GRID_PROPERTY.match(key)) is not None
    )
    if not findings and not grid:
        return None
    timings = tuple(
        t
        for key, value in suite.properties.items()
        if key.startswith(_SECONDS_PREFIX)
        and (t := _held_seconds(key.removeprefix(_SECONDS_PREFIX), value)) is not None
    )
    return CapabilityRecord(grid=grid, findings=findings, timings=timings)


FAMILY: SuiteFamily[CapabilitySettings, CapabilityRecord] = SuiteFamily(
    name=NAME,
    title="Capability findings",
    order=10,
    settings_schema=SCHEMA,
    settings=CapabilitySettings,
    record=CapabilityRecord,
    section=render,
    #: capability_findings scans the binaries of the components the stack table flags ``scanned``.
    needs=Needs(stack_flags=("scanned",)),
    legacy=legacy,
)


__all__ = [
    "FAMILY",
    "KEYS",
    "NAME",
    "SCHEMA",
    "CapabilityRecord",
    "CapabilitySettings",
    "Finding",
    "GridCell",
    "Timing",
    "legacy",
    "render",
]
