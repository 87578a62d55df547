"""Expand a Matrix into cells: pure functions, no network, no files.

axes ──product over couple groups──▶ combinations ──exclude/include──▶ cells ──sglang's own pins──▶ Plan
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from . import stack
from .errors import ConfigError
from .matrix import Matrix, Override, Rule
from .stack import cell_id
from .verdict import Contradiction, SourceLine, input_hash


@dataclass(frozen=True, kw_only=True)
class Component:
    """One wheel a cell installs."""

    axis: str
    distribution: str
    version: str
    index: str


@dataclass(frozen=True, kw_only=True)
class Cell:
    id: str
    values: tuple[tuple[str, str], ...]
    components: tuple[Component, ...]
    patch_sets: tuple[str, ...]
    overridden: tuple[str, ...] = ()
    origin: str = "product"

    def __getitem__(self, axis: str) -> str:
        return dict(self.values)[axis]

    def as_dict(self) -> dict[str, str]:
        return dict(self.values)


@dataclass(frozen=True, kw_only=True)
class Conflict:
    """A cell whose components contradict sglang's own pins: typed where it is found, so no reader has to
    recover the axis or the matrix line from the text."""

    cell: Cell
    problems: tuple[str, ...]
    #: Each contradicted pin (axis, requirement, text), in the order of `problems`.
    contradictions: tuple[Contradiction, ...] = ()
    #: The matrix line that declares the cell: the [[include]] that made it, else the [axes] entry of the
    #: first contradicted axis; None when the matrix does not say (an axis declared only in a couple).
    declared_at: SourceLine | None = None


@dataclass(frozen=True, kw_only=True)
class Excluded:
    cell: Cell
    reason: str


@dataclass(frozen=True, kw_only=True)
class Plan:
    cells: tuple[Cell, ...]
    conflicts: tuple[Conflict, ...]
    excluded: tuple[Excluded, ...]
    warnings: tuple[str, ...]


def components(matrix: Matrix, values: Mapping[str, str]) -> tuple[Component, ...]:
    """The wheels of a cell, in the stack table's order (axes absent from the matrix have none)."""
    return tuple(
        Component(
            axis=axis, distribution=dist, version=values[axis], index=matrix.index_for(dist, values[axis])
        )
        for axis in stack.WHEEL_AXES
        if axis in values
        for dist in stack.distributions(axis, values[axis], values)
    )


def _combinations(matrix: Matrix) -> list[dict[str, str]]:
    units: list[list[dict[str, str]]] = []
    coupled: set[str] = set()
    for couple in matrix.couples:
        units.append([dict(zip(couple.axes, row, strict=True)) for row in couple.rows])
        coupled.update(couple.axes)
    for axis in matrix.axes:
        if axis not in coupled:
            units.append([{axis: value} for value in matrix.axes[axis]])
    combos = []
    for choice in itertools.product(*units):
        merged: dict[str, str] = {}
        for part in choice:
            merged.update(part)
        combos.append({axis: merged[axis] for axis in stack.AXES if axis in merged})
    return combos


def _matches(rule_match: Sequence[tuple[str, str]], values: Mapping[str, str]) -> bool:
    return all(fnmatch.fnmatchcase(values[axis], pattern) for axis, pattern in rule_match)


def _rule_text(rule: Rule) -> str:
    return ", ".join(f"{axis}={value}" for axis, value in rule.match)


def expand(matrix: Matrix) -> tuple[list[tuple[dict[str, str], str]], list[Excluded], list[str]]:
    """All combinations to consider (values, origin), the excluded ones and warnings. Raises on duplicate ids."""
    with_python = len(matrix.axes["python"]) > 1
    warnings: list[str] = []
    kept: list[tuple[dict[str, str], str]] = []
    excluded: list[Excluded] = []
    used = [False] * len(matrix.exclude)
    for values in _combinations(matrix):
        hit = next((i for i, rule in enumerate(matrix.exclude) if _matches(rule.match, values)), None)
        if hit is None:
            kept.append((values, "product"))
            continue
        used[hit] = True
        rule = matrix.exclude[hit]
        cell = _make_cell(matrix, values, "product", with_python)
        excluded.append(
            Excluded(cell=cell, reason=rule.reason or f"excluded by [[exclude]] {_rule_text(rule)}")
        )
    for rule, was_used in zip(matrix.exclude, used, strict=True):
        if not was_used:
            where = f"{matrix.path}:{rule.line}" if rule.line else str(matrix.path)
            warnings.append(f"{where}: [[exclude]] {_rule_text(rule)} matches no cell")
    for rule in matrix.include:
        values = {"python": matrix.axes["python"][0], **rule.as_dict()}
        if all(values != existing for existing, _ in kept):
            kept.append((values, "include"))
    seen: dict[str, dict[str, str]] = {}
    for values, _ in kept:
        cid = cell_id(values, with_python=with_python)
        if cid in seen:
            raise ConfigError(
                matrix.path,
                f"two combinations share the cell id `{cid}`: {seen[cid]} and {values}",
                fix="couple the axes that vary together (e.g. [couple.cuda-torch]) or exclude one of them",
            )
        seen[cid] = values
    return kept, excluded, warnings


def _make_cell(matrix: Matrix, values: Mapping[str, str], origin: str, with_python: bool) -> Cell:
    patch_sets = tuple(ps.name for ps in matrix.patch_sets if ps.applies(values["sglang"]))
    return Cell(
        id=cell_id(values, with_python=with_python),
        values=tuple((axis, values[axis]) for axis in stack.AXES if axis in values),
        components=components(matrix, values),
        patch_sets=patch_sets,
        origin=origin,
    )


def _override_for(overrides: Sequence[Override], axis: str, values: Mapping[str, str]) -> Override | None:
    return next((o for o in overrides if o.axis == axis and _matches(o.when, values)), None)


def contradictions(cell: Cell, pins: Sequence[Requirement]) -> list[Contradiction]:
    """Every sglang pin the cell's components contradict, with the axis it names."""
    found = []
    by_axis: dict[str, list[Component]] = {}
    for comp in cell.components:
        by_axis.setdefault(comp.axis, []).append(comp)
    for req in pins:
        name = canonicalize_name(req.name)
        axis = stack.DISTRIBUTION_AXIS.get(name)
        if axis is None or axis not in by_axis:
            continue
        mine = by_axis[axis]
        same = [c for c in mine if c.distribution == name]
        if not same:
            have = ", ".join(f"{c.distribution} {c.version}" for c in mine)
            text = f"sglang {cell['sglang']} requires {req}; the cell has {have}"
            found.append(Contradiction(axis=axis, requirement=str(req), text=text))
            continue
        for comp in same:
            if not req.specifier.contains(comp.version, prereleases=True):
                text = (
                    f"sglang {cell['sglang']} requires {req}; the cell has {comp.distribution} {comp.version}"
                )
                found.append(Contradiction(axis=axis, requirement=str(req), text=text))
    return found


def _declared_at(matrix: Matrix, values: Mapping[str, str], axis: str) -> SourceLine:
    """Where the matrix declares a conflicting cell: the [[include]] whose every value is the cell's, else the
    [axes] entry of the contradicted `axis` (no line when [axes] does not list it)."""
    rule = next((r for r in matrix.include if all(values.get(k) == v for k, v in r.match)), None)
    line = rule.line if rule is not None else matrix.axis_lines.get(axis)
    return SourceLine(path=str(matrix.path), line=line)


def plan(matrix: Matrix, pins: Mapping[str, Sequence[Requirement]]) -> Plan:
    """Cells to run, conflicts and exclusions. `pins` maps each sglang version to its wheel's Requires-Dist."""
    with_python = len(matrix.axes["python"]) > 1
    kept, excluded, warnings = expand(matrix)
    cells: list[Cell] = []
    conflicts: list[Conflict] = []
    for values, origin in kept:
        cell = _make_cell(matrix, values, origin, with_python)
        remaining: list[Contradiction] = []
        overridden: list[str] = []
        for found in contradictions(cell, pins.get(values["sglang"], ())):
            override = _override_for(matrix.overrides, found.axis, values)
            if override is None:
                remaining.append(found)
            else:
                overridden.append(f"{found.text} (overridden: {override.reason})")
        cell = Cell(
            id=cell.id,
            values=cell.values,
            components=cell.components,
            patch_sets=cell.patch_sets,
            overridden=tuple(overridden),
            origin=origin,
        )
        if remaining:
            declared_at = _declared_at(matrix, values, remaining[0].axis)
            conflicts.append(
                Conflict(
                    cell=cell,
                    problems=tuple(c.text for c in remaining),
                    contradictions=tuple(remaining),
                    declared_at=declared_at,
                )
            )
        else:
            cells.append(cell)
    return Plan(
        cells=tuple(cells), conflicts=tuple(conflicts), excluded=tuple(excluded), warnings=tuple(warnings)
    )


def select(plan_: Plan, pattern: str | None) -> Plan:
    """Keep the cells whose id matches an fnmatch pattern (comma-separated alternatives)."""
    if not pattern:
        return plan_
    globs = [p.strip() for p in pattern.split(",") if p.strip()]

    def keep(cell: Cell) -> bool:
        return any(fnmatch.fnmatchcase(cell.id, g) for g in globs)

    return Plan(
        cells=tuple(c for c in plan_.cells if keep(c)),
        conflicts=tuple(c for c in plan_.conflicts if keep(c.cell)),
        excluded=tuple(e for e in plan_.excluded if keep(e.cell)),
        warnings=plan_.warnings,
    )


__all__ = [
    "Cell",
    "Component",
    "Conflict",
    "Excluded",
    "Plan",
    "cell_id",
    "components",
    "contradictions",
    "expand",
    "input_hash",
    "plan",
    "select",
]
