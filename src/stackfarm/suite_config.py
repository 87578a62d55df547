"""Which schema checks a suite's ``[suites.<NN-name>.settings]`` and what the table parses to: the suite's
family (its family.py, stackfarm.families). A suite without a family, or a family that declares no settings,
accepts none (`NONE`: any key is an error, like an unknown key). matrix.load and the host profiles
(stackfarm.profile) ask here; neither names a suite.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import families
from .errors import ConfigError, StackfarmError
from .family import SuiteFamily
from .schema import Table

#: Accepts no key: the settings of a suite that declares none.
NONE = Table(
    {},
    "remove it: this suite reads no settings (its family.py declares a suite's settings)",
    noun="setting: this suite declares none",
)


def family_of(suite_dir: Path) -> SuiteFamily[Any, Any] | None:
    """The family a suite folder declares in its family.py (stackfarm.families), None for a suite without one."""
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
    """The schema of a suite's [suites.<name>.settings]: its family's; `NONE` where it declares none."""
    family = family_of(suite_dir)
    if family is None or family.settings_schema is None:
        return NONE
    return family.settings_schema


def parse_settings(doc_path: Path, suite_dir: Path, raw: Mapping[str, Any], line: int | None) -> Any:
    """The family's settings object of a checked table (None for a suite without a family)."""
    family = family_of(suite_dir)
    if family is None:
        return None
    try:
        return family.parse(raw)
    except (StackfarmError, ValueError, TypeError) as exc:
        where = f"[suites.{suite_dir.name}.settings]"
        raise ConfigError(doc_path, f"{where}: {exc}", line=line, fix="fix the setting") from None


__all__ = ["NONE", "family_of", "parse_settings", "settings_schema"]
