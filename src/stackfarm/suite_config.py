"""Which schema checks a suite's ``[suites.<NN-name>.settings]`` and what the table parses to: the suite's
family (its family.py, stackfarm.families) where it has one, else the legacy table still to migrate
(stackfarm.legacy_settings). matrix.load and the host profiles (stackfarm.profile) ask here; neither names a
suite.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import families, legacy_settings
from .errors import ConfigError, StackfarmError
from .family import SuiteFamily
from .schema import Table


def family_of(suite_dir: Path) -> SuiteFamily[Any, Any] | None:
    """The family a suite folder declares in its family.py (stackfarm.families), None for a legacy suite."""
    file = suite_dir / families.FAMILY_FILE
    if not file.is_file():
        return None
    try:
        return families.load_one(file)
    except families.FamilyError as exc:
        raise ConfigError(
            file, str(exc).removeprefix(f"{file.resolve()}: "), fix="fix the suite's family.py"
        ) from None


def settings_schema(suite_dir: Path) -> Table:
    """The schema of a suite's [suites.<name>.settings]: its family's, else the legacy table's (still to migrate)."""
    family = family_of(suite_dir)
    if family is None:
        return legacy_settings.schema_for(suite_dir.name)
    return family.settings_schema or legacy_settings.NONE


def parse_settings(doc_path: Path, suite_dir: Path, raw: Mapping[str, Any], line: int | None) -> Any:
    """The family's settings object of a checked table (None for a legacy suite)."""
    family = family_of(suite_dir)
    if family is None:
        return None
    try:
        return family.parse(raw)
    except (StackfarmError, ValueError, TypeError) as exc:
        where = f"[suites.{suite_dir.name}.settings]"
        raise ConfigError(doc_path, f"{where}: {exc}", line=line, fix="fix the setting") from None


__all__ = ["family_of", "parse_settings", "settings_schema"]
