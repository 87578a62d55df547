"""How 15-toolchain gets the wheels its analysis needs beyond the cell's own: Triton (the version the cell's
torch pins) and the nvidia-cuda-nvcc wheel of the cell's CUDA release, found on the index the cell's matrix
routes them to ([indexes], [[route]]) and kept in the shared sha256 cache, as the farm fetches every wheel."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from stackfarm import families
from stackfarm.analysis.arch import ArchError, parse_target
from stackfarm.analysis.backendsel import cell_choices, families_of
from stackfarm.analysis.jitcompile import compile_findings
from stackfarm.analysis.jitfindings import ToolFinding, Unavailable, analyse
from stackfarm.artifacts import Cache
from stackfarm.cellspec import CellSpec
from stackfarm.errors import IndexUnreachableError, StackfarmError
from stackfarm.plan import Component
from stackfarm.profile import load_matrix
from stackfarm.resolve import Resolver

SUITE = "15-toolchain"
#: This folder's family (family.py): its settings class.
FAMILY = families.load_one(Path(__file__).with_name(families.FAMILY_FILE))


def settings(cell: CellSpec) -> dict[str, Any]:
    """The suite's settings as matrix.load parsed them (family.py's ToolchainSettings), as the analysis reads them."""
    table: dict[str, Any] = FAMILY.settings_of(cell.settings.get(SUITE, {})).as_table()
    return table


class _Wheels:
    def __init__(self, cell: CellSpec) -> None:
        self.cell = cell
        self.python = cell.values.get("python", "3.11")

    @functools.cached_property
    def resolver(self) -> Resolver:
        if not self.cell.matrix or not Path(self.cell.matrix).is_file():
            where = (
                f"{self.cell.matrix} is not readable here" if self.cell.matrix else "the cell names no matrix"
            )
            raise Unavailable(f"no [indexes] to look wheels up on: {where}")
        matrix = load_matrix(self.cell.matrix, self.cell.profile or None)
        return Resolver(matrix, Cache())

    def _component(self, distribution: str, version: str) -> Component:
        index = self.resolver.matrix.index_for(distribution, version)
        return Component(axis="toolchain", distribution=distribution, version=version, index=index)

    def fetch(self, distribution: str, version: str) -> Path:
        try:
            artifact = self.resolver.artifact(self._component(distribution, version), self.python)
            return self.resolver.cache.unpack(artifact)
        except IndexUnreachableError as exc:
            raise Unavailable(f"(offline?) {exc}") from exc
        except StackfarmError as exc:
            raise Unavailable(f"{distribution}=={version}: {exc}") from exc

    def versions(self, distribution: str) -> list[str]:
        from stackfarm.artifacts import list_versions

        matrix = self.resolver.matrix
        try:
            return list_versions(matrix.indexes[matrix.default_index], distribution)
        except IndexUnreachableError as exc:
            raise Unavailable(f"(offline?) {exc}") from exc
        except StackfarmError as exc:
            raise Unavailable(f"{distribution}: {exc}") from exc

    def requires(self, distribution: str, version: str) -> list[str]:
        try:
            meta = self.resolver.metadata(self._component(distribution, version), self.python)
        except IndexUnreachableError as exc:
            raise Unavailable(f"(offline?) {exc}") from exc
        except StackfarmError as exc:
            raise Unavailable(f"{distribution}=={version}: {exc}") from exc
        return [str(r) for r in meta.get_all("Requires-Dist") or []]


def cell_findings(cell: CellSpec) -> list[ToolFinding]:
    wheels = _Wheels(cell)
    found = analyse(cell, wheels.fetch, wheels.requires, settings(cell))
    conf = settings(cell)
    if conf.get("compile", False):
        archs = []
        for name in cell.archs:
            try:
                archs.append(parse_target(name))
            except ArchError:
                continue  # analyse reports a bad [targets] arch once
        found += compile_findings(
            cell, archs, fetch=wheels.fetch, requires=wheels.requires, versions=wheels.versions,
            environ=conf.get("environ", {}),
        )  # fmt: skip
    selection = cell_choices(cell, conf.get("selectors", {}), families_of(cell, conf),
                             platform=conf.get("platform"), environ=conf.get("environ", {}))  # fmt: skip
    return found + selection
