"""Turn a cell's components into concrete wheels on their indexes, before any work starts.

A released file on an index never changes (PyPI forbids re-uploads), so a resolution is remembered on disk:
a warm re-run needs no network at all.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict

from packaging.requirements import Requirement

from .artifacts import Artifact, Cache, Target, find_artifact, requires_dist
from .errors import ArtifactError, ConfigError, IndexUnreachableError
from .matrix import Matrix, locate
from .plan import Component, Plan, plan, select
from .stack import WHEEL_AXES, distributions


class Resolver:
    def __init__(self, matrix: Matrix, cache: Cache) -> None:
        self.matrix = matrix
        self.cache = cache
        self._memo = cache.root / "resolved"
        self._lock = threading.Lock()

    def target(self, python: str) -> Target:
        return Target(python=python, platform=self.matrix.platform)

    def artifact(self, component: Component, python: str) -> Artifact:
        source = self.matrix.indexes[component.index]
        target = self.target(python)
        key = None
        if source.url is not None:
            raw = json.dumps(
                [source.url, component.distribution, component.version, target.python, target.platform]
            )
            key = self._memo / f"{hashlib.sha256(raw.encode()).hexdigest()[:32]}.json"
            if key.is_file():
                return Artifact(**json.loads(key.read_text()))
        found = find_artifact(source, component.distribution, component.version, target)
        if key is not None:
            with self._lock:
                key.parent.mkdir(parents=True, exist_ok=True)
                tmp = key.with_suffix(f".tmp{threading.get_ident()}")
                tmp.write_text(json.dumps(asdict(found)))
                tmp.replace(key)
        return found

    def check_axes(self) -> dict[tuple[str, str], str]:
        """Look every axis value up on its index. Missing values raise ConfigError (nothing has run yet);
        unreachable indexes are returned as {(distribution, version): reason} so only their cells fail."""
        unreachable: dict[tuple[str, str], str] = {}
        python = self.matrix.axes["python"][0]
        values = {(axis, v) for axis in WHEEL_AXES for v in self.matrix.axes.get(axis, ())}
        values |= {(axis, v) for rule in self.matrix.include for axis, v in rule.match if axis in WHEEL_AXES}
        cudas = self.matrix.axes.get("cuda", ())
        wanted = sorted(
            {
                (axis, dist, v)
                for axis, v in values
                for cuda in cudas
                for dist in distributions(axis, v, {"cuda": cuda})
            }
        )
        for axis, dist, version in wanted:
            comp = Component(
                axis=axis, distribution=dist, version=version, index=self.matrix.index_for(dist, version)
            )
            try:
                self.artifact(comp, python)
            except IndexUnreachableError as exc:
                unreachable[(dist, version)] = str(exc)
            except ArtifactError as exc:
                in_axes = version in self.matrix.axes.get(axis, ())
                raise ConfigError(
                    self.matrix.path,
                    f"{'[axes]' if in_axes else '[[include]]'} {axis} = {version!r}: {exc}",
                    line=locate(self.matrix.path, "axes" if in_axes else "include", axis),
                    fix="pick a version the index has, or route it to another index with [[route]]",
                ) from None
        return unreachable

    def pins(self, versions: Iterable[str]) -> Mapping[str, list[Requirement]]:
        """Each sglang version's own Requires-Dist, read from its real wheel."""
        python = self.matrix.axes["python"][0]
        pins: dict[str, list[Requirement]] = {}
        for version in versions:
            comp = Component(
                axis="sglang",
                distribution="sglang",
                version=version,
                index=self.matrix.index_for("sglang", version),
            )
            try:
                meta = self.cache.metadata(self.artifact(comp, python))
            except IndexUnreachableError:
                continue  # the cells of this version fail on their own; planning goes on
            pins[version] = requires_dist(meta, python=python)
        return pins


def plan_matrix(
    matrix: Matrix, resolver: Resolver, cells: str | None
) -> tuple[Plan, dict[tuple[str, str], str]]:
    """Look every axis value up (errors before any work), read sglang's own pins, plan, select.

    Also returns the values whose index did not answer ({(distribution, version): reason}): their cells are
    errors of the environment, the rest of the plan goes on."""
    unreachable = resolver.check_axes()
    versions = {*matrix.axes["sglang"], *(dict(r.match)["sglang"] for r in matrix.include)}
    return select(plan(matrix, resolver.pins(sorted(versions))), cells), unreachable


__all__ = ["Resolver", "plan_matrix"]
