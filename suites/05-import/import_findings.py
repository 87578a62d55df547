"""05-import's analysis, run once per session: every native library of the cell judged by
stackfarm.analysis.abicheck, the flashinfer trio and the SONAMEs shipped twice, and the cell's driver floor."""

from __future__ import annotations

import functools
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from stackfarm.analysis.abicheck import CellAbi, LibraryVerdict, Platform, check_cell
from stackfarm.cellspec import CellSpec, load
from stackfarm.driver import Floor, cell_floor
from stackfarm.matrix import Matrix
from stackfarm.matrix import load as load_matrix

SUITE = "05-import"


@dataclass
class Findings:
    cell: CellSpec | None
    abi: CellAbi = field(default_factory=CellAbi)
    platform: Platform = field(default_factory=lambda: Platform("", None))
    #: Why the cell could not be analysed at all ("" when it was).
    error: str = ""
    seconds: float = 0.0

    @property
    def torch(self) -> str:
        if self.cell is None:
            return "(none)"
        return next((c.version for c in self.cell.components if c.distribution == "torch"), "(none)")

    def driver_symbols(self) -> list[str]:
        return sorted({s for v in self.abi.libraries for s in v.driver_symbols})

    def floor(self) -> Floor | None:
        if self.cell is None:
            return None
        return cell_floor(self.cell.values.get("cuda", ""), self.driver_symbols())


def cell_matrix(cell: CellSpec) -> Matrix | None:
    """The matrix the cell comes from, when the suite can read it."""
    if not cell.matrix or not Path(cell.matrix).is_file():
        return None
    try:
        return load_matrix(cell.matrix)
    except Exception:  # an unreadable matrix is not this suite's question: the host platform is used instead
        return None


def cell_platform(cell: CellSpec) -> Platform:
    """The matrix's [platform] tag; without a readable matrix, the glibc of the machine running the suite."""
    matrix = cell_matrix(cell)
    if matrix is not None and matrix.platform:
        return Platform.from_tag(matrix.platform)
    libc, version = platform.libc_ver()
    parts = version.split(".")
    if libc == "glibc" and len(parts) >= 2:
        return Platform.from_tag(f"manylinux_{parts[0]}_{parts[1]}_{platform.machine()}")
    return Platform(f"{libc or 'unknown'} {version}".strip(), None)


@functools.cache
def findings() -> Findings:
    path = os.environ.get("STACKFARM_CELL")
    if not path:
        return Findings(
            None, error="STACKFARM_CELL is not set: suites are run by stackfarm (python -m stackfarm run)"
        )
    try:
        cell = load(path)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return Findings(None, error=f"cannot read {path}: {exc}")
    start = time.perf_counter()
    where = cell_platform(cell)
    try:
        abi = check_cell(cell, where)
    except Exception as exc:  # a bug or an input nobody foresaw: one failing testcase, never a dead suite
        return Findings(cell, platform=where, error=f"the analysis failed: {type(exc).__name__}: {exc}")
    return Findings(cell, abi, where, seconds=round(time.perf_counter() - start, 3))


def library_id(verdict: LibraryVerdict) -> str:
    return f"{verdict.lib.component}-{verdict.lib.relpath}"
