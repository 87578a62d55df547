"""The registry of suite families: each ``suites/NN-name/family.py`` holding ``FAMILY = SuiteFamily(...)``.

`load(suites_root)` imports each family.py by its path, once (cached by path), and returns suite name -> family.
The config layer (matrix.load), the runner, the report and the suites' own conftest iterate this registry and
name no suite; a suite folder without family.py (00-stack, 05-import) declares no settings, record or section.

Low floor: imports stackfarm.family and importlib only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from .family import SuiteFamily

#: The file a suite folder declares its family in.
FAMILY_FILE = "family.py"
_SUITE = re.compile(r"^\d\d-")
_CACHE: dict[Path, SuiteFamily[Any, Any]] = {}
_MODULES: dict[Path, ModuleType] = {}


class FamilyError(Exception):
    """A family.py that cannot be imported or declares no FAMILY of its folder."""


def _module_name(path: Path) -> str:
    return (
        "stackfarm_family_"
        + re.sub(r"\W", "_", path.parent.name)
        + "_"
        + hashlib.sha256(str(path).encode()).hexdigest()[:10]
    )


def load_one(path: Path) -> SuiteFamily[Any, Any]:
    """The FAMILY of one family.py (imported once per path; its dataclasses' modules stay importable)."""
    path = path.resolve()
    if path in _CACHE:
        return _CACHE[path]
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FamilyError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # typing.get_type_hints resolves a record's annotations through it
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise FamilyError(f"{path}: {type(exc).__name__}: {exc}") from exc
    found = getattr(module, "FAMILY", None)
    if not isinstance(found, SuiteFamily):
        raise FamilyError(f"{path}: declares no FAMILY = SuiteFamily(...)")
    if found.name != path.parent.name:
        raise FamilyError(f"{path}: FAMILY.name is {found.name!r}, its folder is {path.parent.name!r}")
    _CACHE[path], _MODULES[path] = found, module
    return found


def module(path: Path) -> ModuleType:
    """The imported family.py (its record and settings classes), for the suite's own conftest and tests."""
    load_one(path)
    return _MODULES[path.resolve()]


def default_root() -> Path:
    """The suites folder a report reads families from when it is given none: ./suites, else the checkout's."""
    here = Path.cwd() / "suites"
    return here if here.is_dir() else Path(__file__).resolve().parents[2] / "suites"


def discover_suites(root: Path) -> dict[str, Path]:
    """Suites are the folders suites/NN-name/ under `root` holding test_*.py files, in NN order (with or
    without a family.py: `load` gives the families among them)."""
    folder = root / "suites"
    if not folder.is_dir():
        return {}
    return {
        path.name: path
        for path in sorted(folder.iterdir())
        if path.is_dir() and _SUITE.match(path.name) and any(path.glob("test_*.py"))
    }


def load(suites_root: Path) -> Mapping[str, SuiteFamily[Any, Any]]:
    """Suite name -> family, for every suites_root/NN-name/family.py, in folder order."""
    if not suites_root.is_dir():
        return {}
    return {
        folder.name: load_one(folder / FAMILY_FILE)
        for folder in sorted(suites_root.iterdir())
        if folder.is_dir() and _SUITE.match(folder.name) and (folder / FAMILY_FILE).is_file()
    }


__all__ = ["FAMILY_FILE", "FamilyError", "default_root", "discover_suites", "load", "load_one", "module"]
