"""Turn a cell's components into concrete wheels on their indexes, before any work starts.

An index's answer (which file, which sha256) is remembered on disk in ``resolved/`` so a warm re-run needs no
network, but it is not trusted for ever: it expires after ANSWER_TTL, ``Resolver(refresh=True)`` asks again,
an unreadable one counts as absent, and bytes that do not hash to it drop it (Resolver.fetch then asks the
index once more before it gives up).
"""

from __future__ import annotations

import email.message
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import TypeVar

from packaging.requirements import Requirement

from . import indexauth
from .artifacts import Artifact, Cache, ShaMismatchError, Source, Target, find_artifact, requires_dist
from .errors import ArtifactError, ConfigError, IndexUnreachableError
from .matrix import Matrix, locate
from .plan import Component, Plan, plan, select
from .stack import WHEEL_AXES, distributions

#: Seconds a remembered index answer stands; after that the index is asked again.
ANSWER_TTL = 24 * 3600.0
_T = TypeVar("_T")


class Resolver:
    """``refresh``: ask the index again for every component (once per project and process), replacing what
    ``resolved/`` remembers (`stackfarm run --refresh`)."""

    def __init__(self, matrix: Matrix, cache: Cache, *, refresh: bool = False) -> None:
        self.matrix = matrix
        self.cache = cache
        self.refresh = refresh
        self._memo = cache.root / "resolved"
        self._lock = threading.Lock()
        self._asked: set[tuple[str, str]] = set()  # (index, distribution) listed afresh in this process

    def target(self, python: str) -> Target:
        return Target(python=python, platform=self.matrix.platform)

    def _key(self, source: Source, component: Component, target: Target) -> Path | None:
        if source.url is None:
            return None  # a local folder or file is looked at each time: its sha256 is its bytes'
        raw = json.dumps(
            [source.url, component.distribution, component.version, target.python, target.platform]
        )
        return self._memo / f"{hashlib.sha256(raw.encode()).hexdigest()[:32]}.json"

    @staticmethod
    def _remembered(key: Path) -> Artifact | None:
        """The answer in ``key`` while it stands; an unreadable, old-style or expired one is None."""
        try:
            data = json.loads(key.read_text(encoding="utf-8"))
            age = time.time() - float(data["resolved_at"])
            found = Artifact(**data["artifact"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # cut short, or from before answers expired: asked again and rewritten
        return found if 0 <= age < ANSWER_TTL else None

    def _remember(self, key: Path, found: Artifact) -> None:
        with self._lock:
            key.parent.mkdir(parents=True, exist_ok=True)
            tmp = key.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
            tmp.write_text(
                json.dumps({"resolved_at": time.time(), "artifact": asdict(found)}), encoding="utf-8"
            )
            tmp.replace(key)

    def artifact(self, component: Component, python: str) -> Artifact:
        return self._answer(component, python, again=False)

    def _answer(self, component: Component, python: str, *, again: bool) -> Artifact:
        """The index's answer, remembered unless ``again`` (or refresh) asks the index itself."""
        source = self.matrix.indexes[component.index]
        target = self.target(python)
        key = self._key(source, component, target)
        if key is not None and not (again or self.refresh) and (hit := self._remembered(key)) is not None:
            return hit
        project = (str(source.url), component.distribution)
        with self._lock:
            fresh = again or (self.refresh and project not in self._asked)
            self._asked.add(project)
        found = find_artifact(source, component.distribution, component.version, target, fresh=fresh)
        if "@" in found.url:  # an index that lists its files with credentials: kept in memory, never on disk
            found = replace(found, url=indexauth.take_credentials(found.url))
        if key is not None:
            self._remember(key, found)
        return found

    def fetch(
        self, component: Component, python: str, progress: Callable[[int, int | None], None] | None = None
    ) -> tuple[Artifact, Path]:
        """The component's wheel, verified: when its bytes do not hash to the answer, the answer is dropped
        and the index asked once more; a second mismatch is an ArtifactError that says so."""
        return self._verified(component, python, lambda found: self.cache.fetch(found, progress))

    def metadata(self, component: Component, python: str) -> email.message.Message:
        """The component's METADATA (the index's PEP 658 file where it serves one, else the wheel's), verified
        and asked again on a mismatch like ``fetch``."""
        return self._verified(component, python, self.cache.metadata)[1]

    def _verified(
        self, component: Component, python: str, use: Callable[[Artifact], _T]
    ) -> tuple[Artifact, _T]:
        found = self.artifact(component, python)
        try:
            return found, use(found)
        except ShaMismatchError as first:
            again = self._answer(component, python, again=True)
            if again.sha256 == found.sha256 and again.metadata_sha256 == found.metadata_sha256:
                raise self._inconsistent(component, found, first.actual) from None
            try:
                return again, use(again)
            except ShaMismatchError as second:
                raise self._inconsistent(component, again, second.actual) from None

    def _inconsistent(self, component: Component, found: Artifact, actual: str) -> ArtifactError:
        where = self.matrix.indexes[component.index].url or component.index
        return ArtifactError(
            f"{found.filename} from {where}: the index says sha256 {found.sha256}, its bytes hash to {actual}, "
            "and asking it again did not help (a broken mirror or proxy, or a re-upload)\n"
            f"  fix: try again later, or route {component.distribution} to another index with [[route]]; "
            "nothing unverified was kept"
        )

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

    def pins(
        self, versions: Iterable[str], unreachable: dict[tuple[str, str], str] | None = None
    ) -> Mapping[str, list[Requirement]]:
        """Each sglang version's own Requires-Dist, read from its real wheel. A version whose wheel cannot be
        fetched or read goes into ``unreachable`` as ("sglang", version) -> why (so its cells are errors of
        the environment, never run unchecked); without that dict, the error is raised."""
        python = self.matrix.axes["python"][0]
        pins: dict[str, list[Requirement]] = {}
        for version in versions:
            if unreachable is not None and ("sglang", version) in unreachable:
                continue
            comp = Component(
                axis="sglang",
                distribution="sglang",
                version=version,
                index=self.matrix.index_for("sglang", version),
            )
            try:
                meta = self.metadata(comp, python)  # no wheel download where the index serves PEP 658 files
            except ArtifactError as exc:
                if unreachable is None:
                    raise
                unreachable[("sglang", version)] = (
                    f"sglang {version}: its wheel could not be read, so its pins were not checked: {exc}"
                )
                continue
            pins[version] = requires_dist(meta, python=python)
        return pins


def plan_matrix(
    matrix: Matrix, resolver: Resolver, cells: str | None
) -> tuple[Plan, dict[tuple[str, str], str]]:
    """Look every axis value up (errors before any work), read sglang's own pins, plan, select.

    Also returns the values whose index did not answer, or whose sglang wheel could not be read
    ({(distribution, version): reason}): their cells are errors of the environment, the rest of the plan goes
    on."""
    unreachable = resolver.check_axes()
    versions = {*matrix.axes["sglang"], *(dict(r.match)["sglang"] for r in matrix.include)}
    pins = resolver.pins(sorted(versions), unreachable)
    return select(plan(matrix, pins), cells), unreachable


__all__ = ["ANSWER_TTL", "Resolver", "plan_matrix"]
