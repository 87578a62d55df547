"""How 15-toolchain reads the wheels its analysis needs beyond the cell's own (Triton, the CUDA toolkit's wheels,
apache-tvm-ffi): from what the runner handed over (``CellSpec.extras``, the wheels unpacked in the shared cache,
chosen by family.py's `wheels` with the rules the analysis applies). Their Requires-Dist come from the wheels'
own METADATA (the cell's components' or the handed wheels'). The suite reads no matrix.toml and resolves
nothing: a wheel the runner could not have is unanswered with the runner's reason (``CellSpec.unavailable``),
one it did not hand over is unanswered as "not resolved by the runner"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from stackfarm import families
from stackfarm.analysis.arch import ArchError, parse_target
from stackfarm.analysis.backendsel import cell_choices, families_of
from stackfarm.analysis.jitcompile import compile_findings
from stackfarm.analysis.jitfindings import ToolFinding, Unavailable, analyse, metadata_requires
from stackfarm.cellspec import CellSpec, InstalledComponent, visible

SUITE = "15-toolchain"
#: This folder's family (family.py): its settings class.
FAMILY = families.load_one(Path(__file__).with_name(families.FAMILY_FILE))


def settings(cell: CellSpec) -> dict[str, Any]:
    """The suite's settings as matrix.load parsed them (family.py's ToolchainSettings), as the analysis reads them."""
    table: dict[str, Any] = FAMILY.settings_of(cell.settings.get(SUITE, {})).as_table()
    return table


def _same(comp: InstalledComponent, distribution: str, version: str | None = None) -> bool:
    """`comp` is `distribution` (at `version`, its local part aside, when given)."""
    if canonicalize_name(comp.distribution) != canonicalize_name(distribution):
        return False
    return version is None or comp.version.split("+")[0] == version.split("+")[0]


class _Wheels:
    """fetch / requires / versions for the analysis, over the cell's components and the wheels handed over."""

    def __init__(self, cell: CellSpec) -> None:
        self.cell = cell

    def _why(self, distribution: str, version: str | None = None) -> str:
        """The runner's reason a wheel (or a query about it) is missing, else "not resolved by the runner"."""
        key = f"{distribution}=={version}" if version is not None else distribution
        name = canonicalize_name(distribution)
        reasons = [
            why for k, why in self.cell.unavailable.items() if canonicalize_name(k.split("==")[0]) == name
        ]
        if key in self.cell.unavailable:
            return self.cell.unavailable[key]
        if reasons:
            return reasons[0]
        if self.cell.unavailable:  # the runner's queries failed elsewhere: what it could not ask
            return f"{key}: not resolved by the runner ({'; '.join(self.cell.unavailable.values())})"
        return f"{key}: not resolved by the runner"

    def _handed(self, distribution: str, version: str) -> InstalledComponent:
        found = self.cell.extras.get(f"{distribution}=={version}") or next(
            (c for c in self.cell.extras.values() if _same(c, distribution, version)), None
        )
        if found is None or not found.root:
            raise Unavailable(self._why(distribution, version))
        if not visible(found.root):  # a backend that does not show the runner's cache to the suite
            raise Unavailable(
                f"{distribution}=={version}: the tree the runner unpacked ({found.root}) is not here"
            )
        return found

    def fetch(self, distribution: str, version: str) -> Path:
        return Path(self._handed(distribution, version).root)

    def versions(self, distribution: str) -> list[str]:
        found = sorted({c.version for c in self.cell.extras.values() if _same(c, distribution)})
        if not found:
            raise Unavailable(self._why(distribution))
        return found

    def requires(self, distribution: str, version: str) -> list[str]:
        comp = next((c for c in self.cell.components if _same(c, distribution, version)), None)
        return metadata_requires(comp or self._handed(distribution, version))


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
            cell,
            archs,
            fetch=wheels.fetch,
            requires=wheels.requires,
            versions=wheels.versions,
            environ=conf.get("environ", {}),
        )
    selection = cell_choices(
        cell,
        conf.get("selectors", {}),
        families_of(cell, conf),
        platform=conf.get("platform"),
        environ=conf.get("environ", {}),
    )
    return found + selection
