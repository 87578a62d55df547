"""The cell description handed to every suite: one JSON file, the same in every backend.

Suites read it through `load()` (the `cell` fixture in suites/conftest.py); the runner writes it with `dump()`.
It imports nothing of the harness, not even for type checking: the suites and the analysis readers stand on it,
so it stays on the ground floor. What makes an InstalledComponent from a plan's Component and its wheel is the
builders' (`stackfarm.backends.realised`).
"""

from __future__ import annotations

import csv
import functools
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

#: The type of pytest's `record_property` fixture (pytest exports no name for it).
RecordProperty = Callable[[str, object], None]


@dataclass(frozen=True, kw_only=True)
class InstalledComponent:
    axis: str
    distribution: str
    version: str
    filename: str
    sha256: str
    source: str
    #: Where the wheel's files lie, as seen by the suite (a cache tree, a container path or a site-packages).
    root: str


@dataclass(frozen=True, kw_only=True)
class CellSpec:
    id: str
    values: dict[str, str]
    backend: str
    components: tuple[InstalledComponent, ...]
    archs: tuple[str, ...] = ()
    reference_arch: str | None = None
    models: tuple[dict[str, str], ...] = ()
    patch_sets: tuple[dict[str, Any], ...] = ()
    features: dict[str, Any] = field(default_factory=dict)
    thresholds: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    #: Why no GPU is usable here, or None when one is.
    no_gpu_reason: str | None = None
    #: sglang files (relative to its root) that the cell's patches changed: they differ from the wheel's RECORD.
    patched_files: tuple[str, ...] = ()
    #: The matrix file the cell comes from, as the suite sees it ("" when unknown). A suite reads what it needs
    #: from the fields here, not from that file: the wheels beyond the stack come resolved in `extras`.
    matrix: str = ""
    #: Parts of the stack this host deliberately lacks, from matrix.toml's [[deviation]] (Deviation.as_dict():
    #: component, missing globs, absent, reason): 00-stack passes them with a note instead of failing.
    deviations: tuple[dict[str, Any], ...] = ()
    #: The host profile the cell runs under (`--profile`, stackfarm.profile), "" without one: its name for the
    #: record; the runner already layered it (the suites' wheels come resolved where the host keeps them).
    profile: str = ""
    #: The [runners.<kind>] the cell is dispatched to and hashed for (stackfarm.driver.route; a plan's worker
    #: takes the plan's), "" when the matrix declares none: the suites ask what that kind is asked.
    runner: str = ""
    #: That kind's declaration as the verdict's inputs hash it (stackfarm.runnerkind.Runner's fields: labels,
    #: arch, gpus, cells, driver, forward_compat), None when the matrix declares none: a suite asks it what the
    #: kind is asked, without reading matrix.toml (stackfarm.suitekit.cell_runner).
    runner_kind: dict[str, Any] | None = None
    #: The wheels the suite families declare beyond the cell's stack (`stackfarm.family.Needs.wheels`, e.g.
    #: 20-eagle3's compare_with -> "sglang==0.5.9"): requirement string -> the wheel the runner resolved with
    #: the matrix's [indexes] and [[route]] and unpacked in the shared cache (`root`, as the runner sees it). A
    #: suite reads these and never resolves a wheel itself; a requirement that could not be resolved is an
    #: error of the cell, never an entry here, unless its family's Needs.unresolved is "unanswered": then it
    #: is in `unavailable`.
    extras: dict[str, InstalledComponent] = field(default_factory=dict)
    #: Requirement (or a query of the family's hook: "name==version", "name") -> why the runner could not have
    #: it, for a family that reports that as unanswered (15-toolchain: "(offline?) ..."), never as a pass.
    unavailable: dict[str, str] = field(default_factory=dict)
    #: The wheel platform tag the cell's wheels are resolved for (the matrix's [platform] tag, a host profile's
    #: when one is layered), "" when unknown: 05-import judges the libraries against it.
    platform: str = ""

    def component(self, distribution: str) -> InstalledComponent:
        for comp in self.components:
            if comp.distribution == distribution:
                return comp
        raise KeyError(f"cell {self.id} has no component {distribution}")

    def dump(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True), encoding="utf-8")
        tmp.replace(path)


def dist_info(component: InstalledComponent) -> Path | None:
    """The component's own *.dist-info folder under its root (a root may hold several wheels: docker, host)."""
    if not component.root:
        return None
    name = canonicalize_name(component.distribution)
    for candidate in sorted(Path(component.root).glob("*.dist-info")):
        if canonicalize_name(candidate.name.split("-")[0]) == name:
            return candidate
    return None


@functools.cache
def _record_paths(record: Path) -> frozenset[str]:
    with record.open(newline="", encoding="utf-8") as fh:
        return frozenset(row[0] for row in csv.reader(fh) if row)


def component_files(component: InstalledComponent) -> frozenset[str]:
    """The component's files, relative to its root, from its wheel's RECORD: what belongs to it, even where
    one site-packages holds the whole stack."""
    info = dist_info(component)
    if info is None or not (info / "RECORD").is_file():
        return frozenset()
    return _record_paths(info / "RECORD")


def visible(root: str) -> bool:
    """Whether a tree the runner handed over (CellSpec.extras) can be read where the suite runs: False when it is
    not there or not readable (a container whose user does not see the runner's cache raises PermissionError)."""
    try:
        return bool(root) and Path(root).is_dir() and os.access(root, os.R_OK | os.X_OK)
    except OSError:
        return False


def load(path: Path | str) -> CellSpec:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    data["components"] = tuple(InstalledComponent(**c) for c in data["components"])
    data["extras"] = {str(k): InstalledComponent(**c) for k, c in data.get("extras", {}).items()}
    for key in ("archs", "models", "patch_sets", "patched_files", "deviations"):
        data[key] = tuple(data.get(key, ()))
    return CellSpec(**data)


__all__ = [
    "CellSpec",
    "InstalledComponent",
    "RecordProperty",
    "component_files",
    "dist_info",
    "load",
    "visible",
]
