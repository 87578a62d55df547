"""Which release broke a cell: from a good cell and a bad one, the one axis whose change flips the verdict, then
the first bad release of that axis on its index.

1. **The axis.** From the good cell, change one axis at a time to the bad cell's value (in the stack's order);
   the first such cell that fails names the axis. A change that only makes a conflict (sglang's own pins) or an
   error tells nothing and the next axis is tried. When no single change fails, the failure needs several
   changes together, and the bisect says so.
2. **The release.** The releases of that axis' wheels published on its index between the two values (post
   releases included, pre-releases only when an end is one) are bisected, every other axis held at the good
   cell's value: ⌈log₂ n⌉ cells for n releases after the good value up to the bad one.

Every cell goes through the runner into the reports folder, so a verdict stored there for the same inputs is
reused and costs nothing: a bisect right after a nightly runs at most ⌈log₂ n⌉ + (differing axes) cells. A
cell is *bad* when it failed, *good* when it ran and nothing failed (passed, or incomplete: on a machine without
a GPU the GPU suites skip alike on both sides), and *untestable* otherwise (a conflict, an error): a release
that is untestable is left out of the bisect.

The twin rule (`regression_twins`): a failed cell is shown to be a regression only where a *twin*, a cell
differing from it in exactly one axis, passes; without one, the failure may be the stack's as a whole.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from packaging.version import InvalidVersion, Version

from . import stack
from .artifacts import list_versions
from .errors import StackfarmError, UsageError
from .matrix import Matrix
from .plan import Cell, Conflict, plan
from .resolve import Resolver
from .stack import cell_id
from .verdict import CellReport, Status

Judgement = Literal["good", "bad", "untestable"]
#: Runs one cell (through the runner, reusing a stored verdict) and gives its report.
RunCell = Callable[[Cell], CellReport]


def judge(report: CellReport) -> Judgement:
    if report.status is Status.FAILED:
        return "bad"
    if report.status in (Status.PASSED, Status.INCOMPLETE):
        return "good"
    return "untestable"


@dataclass(frozen=True, kw_only=True)
class Probe:
    """One cell the bisect looked at."""

    cell: str
    values: Mapping[str, str]
    status: str
    judgement: Judgement
    #: False when the runner reused a stored verdict (or the cell was a conflict: nothing ran).
    ran: bool
    problem: str


@dataclass(kw_only=True)
class Finding:
    good: Probe
    bad: Probe
    axis: str | None = None
    #: The axis' releases from the good value (first) to the bad one (last), in bisect order.
    releases: tuple[str, ...] = ()
    first_bad: Probe | None = None
    last_good: Probe | None = None
    probes: list[Probe] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def cells_run(self) -> int:
        return sum(p.ran for p in self.probes)

    @property
    def search_run(self) -> int:
        """Cells run by the search itself (the axis, then the releases): the good and bad cells left out."""
        return sum(p.ran for p in self.probes if p.cell not in (self.good.cell, self.bad.cell))

    @property
    def reused(self) -> int:
        return sum(not p.ran and p.status != "conflict" for p in self.probes)

    @property
    def differing(self) -> tuple[str, ...]:
        return differing_axes(self.good.values, self.bad.values)

    @property
    def bound(self) -> int:
        """⌈log₂ n⌉ + differing axes, n = the releases after the good value up to the bad one: what the search
        runs at most (the good and bad cells aside, which a nightly has usually stored)."""
        n = max(len(self.releases) - 1, 1)
        return math.ceil(math.log2(n)) + len(self.differing)


def differing_axes(good: Mapping[str, str], bad: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(a for a in stack.AXES if a in good and a in bad and good[a] != bad[a])


def _check_ends(finding: Finding) -> None:
    """Refuse a --good cell that is not good, or a --bad one that did not fail."""
    if finding.good.judgement != "good":
        raise StackfarmError(
            f"--good {finding.good.cell} is {finding.good.status}, not good: "
            f"{finding.good.problem or 'nothing failed but it did not run'}"
        )
    if finding.bad.judgement != "bad":
        raise StackfarmError(
            f"--bad {finding.bad.cell} is {finding.bad.status}, not failed"
            + (f": {finding.bad.problem}" if finding.bad.problem else "")
        )


def _between(version: Version, good: Version, bad: Version) -> bool:
    """Strictly between the ends; a pre-release only when an end is one; a local label only one of the ends'."""
    low, high = min(good, bad), max(good, bad)
    if not low < version < high:
        return False
    if version.is_prerelease and not (good.is_prerelease or bad.is_prerelease):
        return False
    return version.local in {good.local, bad.local}


class Bisector:
    def __init__(self, matrix: Matrix, resolver: Resolver, run_cell: RunCell) -> None:
        self.matrix = matrix
        self.resolver = resolver
        self.run_cell = run_cell
        self._with_python = len(matrix.axes["python"]) > 1
        self._memo: dict[str, Probe] = {}

    # -- cells of any values ------------------------------------------------------------------------------

    def cell_for(self, values: Mapping[str, str]) -> Cell | Conflict:
        """The cell of these values as the matrix would plan it (its routes, patch sets, overrides), or its
        conflict with sglang's own pins."""
        one = dataclasses.replace(
            self.matrix, axes={a: (v,) for a, v in values.items()}, couples=(), include=(), exclude=()
        )
        pins = self.resolver.pins([values["sglang"]]) if "sglang" in values else {}
        planned = plan(one, pins)
        found: Cell | Conflict = planned.cells[0] if planned.cells else planned.conflicts[0]
        the_id = cell_id(values, with_python=self._with_python)
        if isinstance(found, Conflict):
            return dataclasses.replace(found, cell=dataclasses.replace(found.cell, id=the_id))
        return dataclasses.replace(found, id=the_id)

    def probe(self, values: Mapping[str, str]) -> Probe:
        the_id = cell_id(values, with_python=self._with_python)
        if the_id in self._memo:
            return self._memo[the_id]
        found = self.cell_for(values)
        if isinstance(found, Conflict):
            result = Probe(
                cell=the_id,
                values=dict(values),
                status="conflict",
                judgement="untestable",
                ran=False,
                problem="; ".join(found.problems),
            )
        else:
            report = self.run_cell(found)
            result = Probe(
                cell=the_id,
                values=dict(values),
                status=str(report.status),
                judgement=judge(report),
                ran=not report.reused,
                problem=report.first_problem(),
            )
        self._memo[the_id] = result
        return result

    # -- the releases of an axis --------------------------------------------------------------------------

    def releases(self, axis: str, good: str, bad: str, values: Mapping[str, str]) -> tuple[str, ...]:
        """The axis' values from `good` to `bad` (both included): every release published between them on the
        index whose every wheel of the axis is there; post releases included, pre-releases only when an end
        is one, local labels (+cu130) only those of the ends."""
        lo_v, hi_v = Version(good), Version(bad)
        names = {d for v in (good, bad) for d in stack.distributions(axis, v, values)}
        sources = {self.matrix.index_for(d, v) for d in names for v in (good, bad)}
        between = []
        for text, have in self._listed(sources, names).items():
            try:
                version = Version(text)
            except InvalidVersion:
                continue
            if _between(version, lo_v, hi_v) and set(stack.distributions(axis, text, values)) <= have:
                between.append(version)
        middle = [str(v) for v in sorted(set(between), reverse=lo_v > hi_v)]
        return (good, *middle, bad)

    def _listed(self, sources: set[str], names: set[str]) -> dict[str, set[str]]:
        """Every version the indexes list of `names`, with the names listed at it."""
        listed: dict[str, set[str]] = {}
        for source in sorted(sources):
            for name in sorted(names):
                for text in list_versions(self.matrix.indexes[source], name):
                    listed.setdefault(text, set()).add(name)
        return listed

    # -- the bisect ----------------------------------------------------------------------------------------

    def run(self, good: Mapping[str, str], bad: Mapping[str, str]) -> Finding:
        if set(good) != set(bad):
            raise UsageError(
                "--good/--bad",
                "the two cells have different axes: they are not of one matrix",
                fix="give two cells of one matrix (`stackfarm plan` lists them)",
            )
        finding = Finding(good=self.probe(good), bad=self.probe(bad))
        finding.probes += [finding.good, finding.bad]
        _check_ends(finding)
        axes = finding.differing
        if not axes:
            raise UsageError(
                "--good/--bad",
                "the two cells have the same values",
                fix="give a --bad cell that differs from --good in one axis or more",
            )
        finding.axis = self._guilty_axis(finding, good, bad)
        if finding.axis is None:
            finding.notes.append(
                f"no single axis of {', '.join(axes)} makes the good cell fail: the failure needs several "
                "changes together"
            )
            return finding
        return self._bisect(finding, good, bad[finding.axis])

    def _guilty_axis(self, finding: Finding, good: Mapping[str, str], bad: Mapping[str, str]) -> str | None:
        """The first differing axis whose change alone makes the good cell fail (None: no single one does)."""
        axes = finding.differing
        for axis in axes:
            if len(axes) == 1:
                return axis  # the bad cell itself is the one-axis change
            step = self._step(finding, {**good, axis: bad[axis]})
            if step.judgement == "bad":
                return axis
            if step.judgement == "untestable":
                finding.notes.append(f"{axis} alone: {step.status} ({step.problem})")
        return None

    def _step(self, finding: Finding, values: Mapping[str, str]) -> Probe:
        found = self.probe(values)
        if found not in finding.probes:
            finding.probes.append(found)
        return found

    def _bisect(self, finding: Finding, good: Mapping[str, str], bad_value: str) -> Finding:
        axis = finding.axis
        assert axis is not None
        order = list(self.releases(axis, good[axis], bad_value, good))
        finding.releases = tuple(order)
        lo, hi = 0, len(order) - 1  # order[lo] is good, order[hi] is bad
        last_good = finding.good
        first_bad = self.probe({**good, axis: bad_value})
        while hi - lo > 1:
            mid = (lo + hi) // 2
            step = self._step(finding, {**good, axis: order[mid]})
            if step.judgement == "bad":
                hi, first_bad = mid, step
            elif step.judgement == "good":
                lo, last_good = mid, step
            else:
                finding.notes.append(f"{axis} {order[mid]}: {step.status}, left out ({step.problem})")
                del order[mid]
                hi -= 1
        finding.first_bad, finding.last_good = first_bad, last_good
        return finding


def describe(finding: Finding) -> list[str]:
    """The bisect's outcome in lines, as `stackfarm bisect` prints it."""
    good, bad = finding.good, finding.bad
    lines = [
        f"good: {good.cell} ({good.status})",
        f"bad:  {bad.cell} ({bad.status}: {bad.problem})",
    ]
    axis = finding.axis
    if axis is None:
        lines += finding.notes
    else:
        releases = finding.releases
        lines.append(f"axis: {axis} ({good.values[axis]} -> {bad.values[axis]} alone flips the verdict)")
        lines.append(f"releases between them: {' '.join(releases[1:-1]) or 'none'} (n = {len(releases) - 1})")
        lines += [f"note: {n}" for n in finding.notes]
        if finding.first_bad is not None and finding.last_good is not None:
            lines.append(
                f"first bad release: {axis} {finding.first_bad.values[axis]} — {finding.first_bad.cell}"
            )
            lines.append(f"  finding: {finding.first_bad.problem}")
            was = finding.last_good.problem or "nothing failed"
            lines.append(
                f"last good release: {axis} {finding.last_good.values[axis]} ({finding.last_good.status}: "
                f"{was})"
            )
    ends = finding.cells_run - finding.search_run
    lines.append(
        f"cells run: {finding.cells_run} ({finding.search_run} by the search, bound ⌈log₂ n⌉ + "
        f"{len(finding.differing)} axes = {finding.bound}; {ends} of the good/bad cells); "
        f"stored verdicts reused: {finding.reused}"
    )
    return lines


# --------------------------------------------------------------------------- twins


def twins(report: CellReport, others: Iterable[CellReport]) -> list[CellReport]:
    """The cells differing from `report` in exactly one axis."""
    mine = dict(report.values)
    return [
        o
        for o in others
        if o.cell != report.cell
        and set(o.values) == set(mine)
        and sum(o.values[a] != v for a, v in mine.items()) == 1
    ]


def regression_twins(failed: CellReport, others: Iterable[CellReport]) -> list[CellReport]:
    """The passing twins of a failed cell: where there is one, the axis they differ in is what broke it."""
    return [t for t in twins(failed, others) if t.status is Status.PASSED]


def twin_check(reports: Sequence[CellReport]) -> dict[str, list[tuple[str, str]]]:
    """Each failed cell -> (axis, passing twin) pairs; an empty list: not shown to be a regression."""
    out: dict[str, list[tuple[str, str]]] = {}
    for r in reports:
        if r.status is not Status.FAILED:
            continue
        out[r.cell] = [
            (next(a for a, v in r.values.items() if t.values[a] != v), t.cell)
            for t in regression_twins(r, reports)
        ]
    return out


__all__ = [
    "Bisector",
    "Finding",
    "Probe",
    "describe",
    "differing_axes",
    "judge",
    "regression_twins",
    "twin_check",
    "twins",
]
