"""30-numerics as a suite family (stackfarm.family): its settings, its record, its report section.

Settings ([suites.30-numerics.settings]): declared beside the code that owns their meaning,
stackfarm.numerics.settings (the tolerances' reasoning is there); parsed once by matrix.load, handed over as
JSON and read back by `Settings.from_mapping`.

Record (``30-numerics.json``): one comparison per testcase that reports one (kernels vs float32 references,
EAGLE-3 vs baseline greedy, the tree kernels), with its figures as the testcase states them (``"n/a"`` where
one does not apply): max_abs_err, tolerance, match_rate, first_divergence, near_ties. The section joins each
comparison with its testcase's outcome in the JUnit file and draws the match rates as bars on a 0..1 scale.

Format 0 (`legacy`): a run held from before this family wrote records carries the same figures as its
testcases' JUnit properties under those exact names; `legacy` reads them into the same record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stackfarm.family import SectionContext, SuiteFamily
from stackfarm.numerics.settings import SCHEMA, SUITE, Settings

if TYPE_CHECKING:  # the report's types: matrix.load imports this file too, and needs none of them
    from stackfarm.history import Case

NAME = SUITE

#: The figures of a comparison, in the table's column order (the testcases' property names).
KEYS = ("max_abs_err", "tolerance", "match_rate", "first_divergence", "near_ties")


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One testcase's figures (`testcase`, pytest's name), as text the way the testcase states them."""

    testcase: str
    max_abs_err: str = ""
    tolerance: str = ""
    match_rate: str = ""
    first_divergence: str = ""
    near_ties: str = ""

    @classmethod
    def of(cls, testcase: str, figures: Mapping[str, object]) -> Comparison | None:
        """The comparison of a testcase that states any of `KEYS` (None for one that states none)."""
        if not any(k in figures for k in KEYS):
            return None
        return cls(testcase=testcase, **{k: str(figures[k]) for k in KEYS if k in figures})


@dataclass(frozen=True, kw_only=True)
class NumericsRecord:
    comparisons: tuple[Comparison, ...] = ()


def legacy(suite: Any) -> NumericsRecord | None:
    """Format 0: the record of a held run (stackfarm.history.SuiteRun) from its testcases' properties."""
    found = [c for case in suite.cases if (c := Comparison.of(case.name, case.properties)) is not None]
    return NumericsRecord(comparisons=tuple(found)) if found else None


def _facts(comparison: Comparison) -> dict[str, str]:
    """The comparison as the table shows it (its outcome comes from its testcase in JUnit)."""
    return {k: getattr(comparison, k) for k in KEYS}


def render(ctx: SectionContext[NumericsRecord]) -> str:
    """Each comparison's figures as a table, then the match rates as bars on a 0..1 scale."""
    from stackfarm.history import as_number
    from stackfarm.sections.html import Bar, bar_chart, case_rows, record_cases, table

    cases: list[tuple[str, Case]] = []
    for suite, record in zip(ctx.suites, ctx.records, strict=True):
        cases += record_cases(suite, record.comparisons, _facts)
    if not cases:
        return ""
    out = "<h2>Equivalence</h2>" + table(("suite", "outcome", "testcase", *KEYS), case_rows(cases, KEYS))
    bars = [
        Bar(label=c.name, value=v)
        for _, c in cases
        if (v := as_number(c.properties.get("match_rate", ""))) is not None
    ]
    return out + (bar_chart("match rate", bars, top=1.0) if bars else "")


FAMILY: SuiteFamily[Settings, NumericsRecord] = SuiteFamily(
    name=NAME,
    title="Equivalence",
    order=30,
    settings_schema=SCHEMA,
    settings=Settings,
    record=NumericsRecord,
    section=render,
    legacy=legacy,
)
