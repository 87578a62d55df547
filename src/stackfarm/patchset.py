"""One patch set as matrix.toml declares it ([patches.<set>]): its folder and the SGLang versions it applies to.

A declaration, on the ground floor: the matrix reads it from matrix.toml and the patch machinery
(stackfarm.patches) works on it, so both import it here. Defined in stackfarm.matrix, it made every patch
module stand on the whole configuration layer (suite families, schemas, index tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet


@dataclass(frozen=True, kw_only=True)
class PatchSet:
    """A quilt-style series under patches/<name>/ for the SGLang versions in `applies_to`."""

    name: str
    applies_to: SpecifierSet
    path: Path
    optional: bool = False

    def applies(self, version: str) -> bool:
        """Whether the set is for this SGLang version: the one rule (plan, patch step, upgrade planner and
        tables ask here). A pre-release counts: "<0.5.10" holds 0.5.10rc1 only as written."""
        return self.applies_to.contains(version, prereleases=True)


def sets_for(sets: Sequence[PatchSet], version: str) -> tuple[PatchSet, ...]:
    """The sets that apply to ``version`` (`PatchSet.applies`), in matrix order (the order they are applied in)."""
    return tuple(ps for ps in sets if ps.applies(version))


__all__ = ["PatchSet", "sets_for"]
