"""What the runner hands a cell's suites beyond its stack: the wheels their families declare (`Needs.wheels`,
asked through a `WheelQuery` over the runner's resolver), resolved with the matrix's [indexes] and [[route]] and
unpacked in the shared cache as the cell's own wheels are (CellSpec.extras), and, for a family whose
`Needs.unresolved` is "unanswered", what cannot be had with the reason (CellSpec.unavailable). The suites never
read matrix.toml or resolve a wheel: this module does it for them, in the runner's process; `stackfarm bundle`
asks it which wheels a host's offline bundle must carry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from . import families
from .artifacts import list_versions
from .cellspec import InstalledComponent
from .errors import ArtifactError, IndexUnreachableError, StackfarmError, Unavailable
from .family import SuiteFamily
from .matrix import Matrix, Suite
from .plan import Component
from .resolve import Resolver


@dataclass(frozen=True)
class Handed:
    """What the runner hands a cell's suites beyond its stack: requirement -> the resolved wheel (CellSpec.extras),
    and, for a family whose `Needs.unresolved` is "unanswered", requirement (or query) -> why it cannot be had
    (CellSpec.unavailable)."""

    extras: dict[str, InstalledComponent]
    unavailable: dict[str, str]


@dataclass(frozen=True)
class _Query:
    """The runner's `WheelQuery`: the cell's stack, and the index the matrix routes a distribution to (the
    runner's resolver); a failure raises `Unavailable` with the reason a suite shows, and is kept in `failed`."""

    stack: Mapping[str, str]
    resolver: Resolver
    python: str
    unreachable: Mapping[tuple[str, str], str]
    failed: dict[str, str] = field(default_factory=dict)

    def requires(self, distribution: str, version: str) -> list[str]:
        comp = _component(distribution, version, self.resolver.matrix)
        try:
            if (distribution, version) in self.unreachable:
                raise IndexUnreachableError(self.unreachable[(distribution, version)])
            meta = self.resolver.metadata(comp, self.python)
        except StackfarmError as exc:
            raise self._failed(f"{distribution}=={version}", exc) from exc
        return [str(r) for r in meta.get_all("Requires-Dist") or []]

    def versions(self, distribution: str) -> list[str]:
        matrix = self.resolver.matrix
        try:
            return list_versions(matrix.indexes[matrix.default_index], distribution)
        except StackfarmError as exc:
            raise self._failed(distribution, exc) from exc

    def _failed(self, key: str, exc: StackfarmError) -> Unavailable:
        self.failed[key] = _why(key, exc)
        return Unavailable(self.failed[key])


def _why(requirement: str, exc: StackfarmError) -> str:
    """Why a wheel or a query cannot be had, as 15-toolchain has always said it."""
    return f"(offline?) {exc}" if isinstance(exc, IndexUnreachableError) else f"{requirement}: {exc}"


def hand_over(
    suites: tuple[Suite, ...],
    stack: Mapping[str, str],
    resolver: Resolver,
    python: str,
    unreachable: Mapping[tuple[str, str], str] | None = None,
) -> Handed:
    """Every wheel the suites' families declare beyond the stack (`Needs.wheels`, asked through `_Query`),
    resolved with the matrix's [indexes] and [[route]] and unpacked in the shared cache, as the cell's own
    wheels are. One that cannot be resolved is an ArtifactError of the cell naming the suite and the
    requirement (never a silent pass), or, for a family whose `Needs.unresolved` is "unanswered", handed over
    with the reason in `Handed.unavailable`, as are the queries its hook could not have answered."""
    handed = Handed(extras={}, unavailable={})
    for suite, family in _families(suites):
        query = _Query(stack=stack, resolver=resolver, python=python, unreachable=unreachable or {})
        honest = family.needs.unresolved == "unanswered"
        wanted = _wanted(suite, family, query, honest=honest)
        if honest:
            handed.unavailable.update(query.failed)
        for requirement in (r for r in wanted if r not in handed.extras):
            _hand(handed, suite.name, requirement, query, honest=honest)
    return handed


def _wanted(suite: Suite, family: SuiteFamily[Any, Any], query: _Query, *, honest: bool) -> list[str]:
    """The requirements the family's hook names; a query it could not have answered raises out of it: an
    ArtifactError of the cell, or for an honest family none (its failures are in `query.failed`)."""
    try:
        return [str(r) for r in family.needs.wheels(suite.parsed_settings, query)]
    except Unavailable as exc:
        if not honest:
            raise ArtifactError(f"suite {suite.name}: its wheels cannot be told: {exc}") from exc
        return []


def _hand(handed: Handed, suite: str, requirement: str, query: _Query, *, honest: bool) -> None:
    """Resolve one requirement into `handed.extras`; one that cannot be resolved is an ArtifactError of the
    cell, or for an honest family an entry of `handed.unavailable` with the reason."""
    comp = _pinned(suite, requirement, query.resolver.matrix)  # no pin: the family's error, the cell's
    try:
        handed.extras[requirement] = _resolved(comp, query.resolver, query.python, query.unreachable)
    except ArtifactError as exc:
        if not honest:
            raise ArtifactError(
                f"suite {suite} needs {requirement}, which cannot be resolved: {exc}"
            ) from exc
        handed.unavailable[requirement] = _why(requirement, exc)


def required(
    suites: tuple[Suite, ...],
    stack: Mapping[str, str],
    resolver: Resolver,
    python: str,
) -> list[tuple[str, Component]]:
    """(suite, component) of every wheel a family requires beyond the stack (a family whose `Needs.unresolved`
    is "error": without it the cell cannot be judged): what a host's offline bundle must carry. A family that
    answers "unanswered" without its wheels is left to the host's own tools."""
    out: list[tuple[str, Component]] = []
    for suite, family in _families(suites):
        if family.needs.unresolved == "unanswered":
            continue
        query = _Query(stack=stack, resolver=resolver, python=python, unreachable={})
        out += [
            (suite.name, _pinned(suite.name, r, resolver.matrix))
            for r in _wanted(suite, family, query, honest=False)
        ]
    return out


def _resolved(
    comp: Component, resolver: Resolver, python: str, unreachable: Mapping[tuple[str, str], str]
) -> InstalledComponent:
    """The wheel of a pinned component, resolved and unpacked; raises ArtifactError."""
    if (comp.distribution, comp.version) in unreachable:
        raise IndexUnreachableError(unreachable[(comp.distribution, comp.version)])
    artifact = resolver.artifact(comp, python)
    root = resolver.cache.unpack(artifact)
    return InstalledComponent(
        axis=comp.axis,
        distribution=comp.distribution,
        version=artifact.version,
        filename=artifact.filename,
        sha256=artifact.sha256,
        source=artifact.source,
        root=str(root),
    )


def _families(suites: tuple[Suite, ...]) -> list[tuple[Suite, SuiteFamily[Any, Any]]]:
    """Each suite with its family, in suite order; a suite without a family.py declares no wheels."""
    out = []
    for suite in suites:
        file = suite.path / families.FAMILY_FILE
        if file.is_file():
            out.append((suite, families.load_one(file)))
    return out


def _component(name: str, version: str, matrix: Matrix) -> Component:
    return Component(axis=name, distribution=name, version=version, index=matrix.index_for(name, version))


def _pinned(suite: str, requirement: str, matrix: Matrix) -> Component:
    """The component a pinned requirement ("sglang==0.5.9") names, on the index the matrix routes it to."""
    try:
        parsed = Requirement(requirement)
    except InvalidRequirement as exc:
        raise ArtifactError(f"suite {suite} needs {requirement!r}, which is no requirement: {exc}") from None
    pins = [s.version for s in parsed.specifier if s.operator in ("==", "===") and "*" not in s.version]
    if len(pins) != 1 or len(parsed.specifier) != 1:
        raise ArtifactError(
            f"suite {suite} needs {requirement!r}: a wheel it needs is pinned (name==version)"
        )
    return _component(parsed.name, pins[0], matrix)


__all__ = ["Handed", "hand_over", "required"]
