"""05-import's analysis, run once per session: every native library of the cell judged by
stackfarm.analysis.abicheck, the flashinfer trio and the SONAMEs shipped twice, and the cell's driver floor.

Every check judges what is installed, never what the cell claims: each component is looked up as an installed
distribution (its ``*.dist-info``, read with importlib.metadata: its name, version and RECORD) along the path
the suite's Python sees the stack on: the roots the backend put the cell's wheels in (a cache tree per wheel on
the local backend, the site-packages of the image or the host), then the Python's own ``sys.path``. The first
installation found is the one an import would load. A component the cell names that is installed nowhere has
no libraries to judge (00-stack reports it missing); the versions the checks name are the installed ones.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from email.parser import Parser
from importlib.metadata import PathDistribution
from pathlib import Path

from packaging.utils import canonicalize_name

from stackfarm.analysis.abicheck import CellAbi, LibraryVerdict, Platform, check_cell
from stackfarm.cellspec import CellSpec, InstalledComponent, load
from stackfarm.driver import Floor, cell_floor

SUITE = "05-import"

_DIST_FOLDER = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-[^-]*)*\.(?:dist|egg)-info$")
#: torch/version.py's `cuda = '12.8'` (or `cuda: Optional[str] = '12.8'`, or None for a CPU build).
_TORCH_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(?:(['\"])(?P<cuda>[^'\"]*)\1|None)", re.MULTILINE)


@dataclass(frozen=True)
class Installed:
    """One installed distribution, as importlib.metadata reads its *.dist-info (or *.egg-info) folder."""

    name: str
    version: str
    #: Where its files lie (the folder holding the dist-info: a site-packages, a cache tree).
    root: Path
    info: Path
    #: How many files its RECORD lists (0 without one).
    files: int


def _read(info: Path) -> Installed:
    dist = PathDistribution(info)
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    meta = Parser().parsestr(text, headersonly=True)
    folder = _DIST_FOLDER.match(info.name)
    # A dist-info without METADATA is a broken installation; its folder name still says what it was.
    name = meta.get("Name") or (folder["name"] if folder else info.name)
    version = meta.get("Version") or (folder["version"] if folder else "")
    return Installed(
        name=str(name),
        version=str(version),
        root=Path(str(dist.locate_file(""))),
        info=info,
        files=len(dist.files or ()),
    )


def search_path(cell: CellSpec) -> list[str]:
    """Where the suite looks for installed distributions: the cell's roots, then this Python's sys.path."""
    roots = [c.root for c in cell.components if c.root]
    return list(dict.fromkeys(p for p in (*roots, *sys.path) if p))


def installed(distribution: str, path: Iterable[str]) -> Installed | None:
    """The installation of `distribution` an import along `path` would load: the first entry holding one."""
    want = canonicalize_name(distribution)
    for entry in path:
        folder = Path(entry)
        if not folder.is_dir():
            continue
        for info in sorted([*folder.glob("*.dist-info"), *folder.glob("*.egg-info")]):
            match = _DIST_FOLDER.match(info.name)
            if match and canonicalize_name(match["name"]) == want and info.is_dir():
                return _read(info)
    return None


def installed_cell(cell: CellSpec, path: Sequence[str]) -> tuple[CellSpec, dict[str, Installed]]:
    """The cell as installed: each component's version and root those of its installation along `path`; a
    component installed nowhere keeps no root (nothing of it is read)."""
    found: dict[str, Installed] = {}
    components: list[InstalledComponent] = []
    for comp in cell.components:
        inst = installed(comp.distribution, path)
        if inst is None:
            components.append(replace(comp, root=""))
            continue
        found[comp.distribution] = inst
        components.append(replace(comp, version=inst.version, root=str(inst.root)))
    return replace(cell, components=tuple(components)), found


def torch_cuda(torch: Installed | None) -> str | None:
    """The CUDA the installed torch was built for (torch/version.py, read, not imported); None when unknown."""
    if torch is None:
        return None
    try:
        text = (torch.root / "torch" / "version.py").read_text(encoding="utf-8")
    except OSError:
        return None
    match = _TORCH_CUDA.search(text)
    return match["cuda"] if match and match["cuda"] else None


@dataclass
class Findings:
    #: The cell as installed (installed_cell): the versions and roots the checks judge.
    cell: CellSpec | None
    abi: CellAbi = field(default_factory=CellAbi)
    platform: Platform = field(default_factory=lambda: Platform("", None))
    #: Why the cell could not be analysed at all ("" when it was).
    error: str = ""
    seconds: float = 0.0
    #: The cell's own description (what it claims), for the record only.
    claimed: CellSpec | None = None
    #: Every installed distribution the checks read, by the cell's distribution name.
    installed: dict[str, Installed] = field(default_factory=dict)
    #: Where they were looked up (search_path).
    path: tuple[str, ...] = ()

    @property
    def torch(self) -> str:
        inst = self.installed.get("torch")
        if inst is not None:
            return inst.version
        claimed = self.claimed or self.cell
        if claimed is not None and any(c.distribution == "torch" for c in claimed.components):
            return "(not installed)"
        return "(none)"

    @property
    def cuda(self) -> str | None:
        """The CUDA of the installed torch (None without one, or for a CPU build)."""
        return torch_cuda(self.installed.get("torch"))

    def driver_symbols(self) -> list[str]:
        return sorted({s for v in self.abi.libraries for s in v.driver_symbols})

    def floor(self) -> Floor | None:
        if self.cell is None:
            return None
        return cell_floor(self.cuda or "", self.driver_symbols())


def cell_platform(cell: CellSpec) -> Platform:
    """The platform tag the cell's wheels are resolved for (CellSpec.platform, the matrix's [platform] or its
    host profile's, handed over by the runner); without one, the glibc of the machine running the suite."""
    if cell.platform:
        return Platform.from_tag(cell.platform)
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
    lookup = search_path(cell)
    try:
        mine, found = installed_cell(cell, lookup)
    except Exception as exc:  # an unreadable installation: one failing testcase, never a dead suite
        return Findings(
            cell,
            platform=where,
            claimed=cell,
            path=tuple(lookup),
            error=f"the installed distributions could not be read: {type(exc).__name__}: {exc}",
        )
    out = Findings(mine, platform=where, claimed=cell, installed=found, path=tuple(lookup))
    try:
        out.abi = check_cell(mine, where)
    except Exception as exc:  # a bug or an input nobody foresaw: one failing testcase, never a dead suite
        out.error = f"the analysis failed: {type(exc).__name__}: {exc}"
        return out
    out.seconds = round(time.perf_counter() - start, 3)
    return out


def library_id(verdict: LibraryVerdict) -> str:
    return f"{verdict.lib.component}-{verdict.lib.relpath}"
