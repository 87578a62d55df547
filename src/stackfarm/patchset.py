"""One patch set as matrix.toml declares it ([patches.<set>]): its folder and the SGLang versions it applies to.

A declaration, on the ground floor: the matrix reads it from matrix.toml and the patch machinery
(stackfarm.patches) works on it, so both import it here. Defined in stackfarm.matrix, it made every patch
module stand on the whole configuration layer (suite families, schemas, index tables).
"""

from __future__ import annotations

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


__all__ = ["PatchSet"]
