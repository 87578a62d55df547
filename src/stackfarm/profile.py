"""Host profiles (`--profile runners/<kind>.toml`): what one GPU host is, layered over matrix.toml.

A profile is a committed TOML file that says what a runner host really has, so a run there (and its offline
bundle, stackfarm.wheelhouse) is reproducible from the repository::

    [profile]
    name = "1x-h200"                      # shown in the grid and the verdict
    runner = "1x-h200"                    # the [runners.<kind>] of matrix.toml this host is
    python = "3.12"                       # the host's Python (X.Y): the cells' python axis there
    platform = "manylinux_2_39_x86_64"    # its wheel platform tag
    provides = ["torch==2.11.0", ...]     # what the host already has installed: never carried
    pins = ["transformers==5.12.1"]       # carried whatever the host has (the host's copy breaks the stack)
    nodeps = ["cuda-tile==1.7.0"]         # carried as is, outside pip's resolution (verified on the host)
    leave_out = { tilelang = "why" }      # dependencies deliberately not carried (named in the manifest)

    [targets]            # narrows matrix.toml's: archs a subset of its archs (its other runners stay)
    [[deviation]]        # what the host deliberately lacks (00-stack passes it with a note)
    [indexes.<name>]     # where the host finds the wheels a suite fetches (find_links may name ${VAR})
    [[route]]            # ...and which requirements go there (before matrix.toml's routes)
    [suites.<NN-name>]   # a suite's keys and settings, merged over matrix.toml's

Every table is checked by the same declarations as matrix.toml's (stackfarm.schema, stackfarm.matrix_tables,
stackfarm.matrix's readers), with errors at the profile's file:line. matrix.toml is validated whole first, so a
profile narrowing the archs leaves the other runners, their thresholds and the features' `off` entries for the
other archs valid (they are not asked on this host).

The profile's name and sha256 are inputs of every cell run under it (stackfarm.cellinputs.cell_inputs), so a verdict
made under a profile is never reused without it, and the reverse.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from . import matrix as matrix_module
from . import matrix_tables, schema
from .errors import ConfigError, did_you_mean
from .matrix import Matrix, Suite
from .matrix_tables import HostProfile
from .schema import List, Map, Str, Table
from .suite_config import parse_settings, settings_schema

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: The tables a profile may hold.
TOP_KEYS = ("profile", "targets", "deviation", "indexes", "route", "suites")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_PLATFORM = r"(manylinux_\d+_\d+|manylinux2014|manylinux2010|manylinux1|musllinux_\d+_\d+|linux)_[a-z0-9_]+"


def _requirement(pinned: bool) -> Any:
    def check(text: str) -> str | None:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            return f"= {text!r} is not a requirement ({exc})"
        if pinned and not (len(req.specifier) == 1 and next(iter(req.specifier)).operator == "=="):
            return f"= {text!r} names no exact version (write name==version, as `pip freeze` prints it)"
        return None

    return check


def _name(text: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", text) else "is not a distribution name"


#: [profile]
PROFILE = Table(
    {
        "name": Str('the profile\'s name, shown in the grid and the verdict, e.g. name = "1x-h200"'),
        "runner": Str('the [runners.<kind>] of matrix.toml this host is, e.g. runner = "1x-h200"'),
        "description": Str("what the host is"),
        "python": Str('the host Python\'s X.Y, quoted, e.g. python = "3.12"', pattern=r"3\.\d{1,2}"),
        "platform": Str(
            'the host\'s wheel platform tag, e.g. platform = "manylinux_2_39_x86_64"', pattern=_PLATFORM
        ),
        "provides": List(
            Str("name==version", check=_requirement(True)),
            'what the host already has installed, as `pip freeze` prints it, e.g. provides = ["torch==2.11.0"]',
            unique=True,
        ),
        "pins": List(
            Str("a requirement", check=_requirement(False)),
            'requirements carried whatever the host has, e.g. pins = ["transformers==5.12.1"]',
            unique=True,
        ),
        "nodeps": List(
            Str("name==version", check=_requirement(True)),
            "wheels carried as they are, outside pip's resolution and without their dependencies: a version that "
            'resolution cannot take beside the rest and that was verified on the host, e.g. nodeps = ["cuda-tile==1.7.0"]',
            unique=True,
        ),
        "leave_out": Map(
            Str('why it is not carried, e.g. tilelang = "not imported by the suites"'),
            'dependencies deliberately not carried: leave_out = { <distribution> = "why" }',
            keys=_name,
            noun="distribution",
        ),
    },
    required=("name", "runner", "python", "platform"),
    noun="key",
)


def _read(path: Path) -> tuple[str, dict[str, Any]]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            path, "no such profile", fix="pass --profile runners/<kind>.toml (a file of the repo)"
        ) from None
    except OSError as exc:
        raise ConfigError(path, f"cannot read it ({exc.strerror or exc})", fix="check the path") from None
    try:
        text = raw.decode("utf-8")
        return text, tomllib.loads(text)
    except UnicodeDecodeError:
        raise ConfigError(path, "is not UTF-8 text", fix="save it as UTF-8 (TOML files are UTF-8)") from None
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"line (\d+)", str(exc))
        raise ConfigError(
            path,
            f"malformed TOML: {exc}",
            line=int(found.group(1)) if found else None,
            fix="correct the syntax there",
        ) from None


def read_toml(path: Path) -> dict[str, Any]:
    """The profile's tables, parsed (errors at its line)."""
    return _read(path)[1]


def load(path: Path | str, matrix: Matrix, *, hosted: bool = True) -> Matrix:
    """`matrix` as seen on the profile's host. `hosted`: the profile's [indexes] and [[route]] apply (on the
    host); False for building its bundle elsewhere (the wheels then come from matrix.toml's own indexes)."""
    path = Path(path).expanduser().absolute()
    text, data = _read(path)
    doc = matrix_module._Doc(path, text)
    for key in data:
        if key not in TOP_KEYS:
            hint = did_you_mean(key, TOP_KEYS)
            raise doc.error(
                f"`{key}` is not a table a profile may hold" + (f"; {hint}" if hint else ""),
                table="top level",
                key=key,
                fix=f"use {', '.join(TOP_KEYS)} (the rest of the matrix stays in {matrix.path.name})",
            )
    table = data.get("profile")
    if not isinstance(table, dict):
        raise doc.error(
            "a profile needs a [profile] table", table="profile", fix='add [profile] with name = "..."'
        )
    schema.check(doc, "profile", table, PROFILE)
    profile = _profile(path, text, table)
    if profile.runner not in matrix.runners:
        hint = did_you_mean(profile.runner, matrix.runners)
        raise doc.error(
            f"runner `{profile.runner}` is not a [runners.<kind>] of {matrix.path}"
            + (f"; {hint}" if hint else ""),
            table="profile",
            key="runner",
            fix=f"use one of: {', '.join(matrix.runners) or 'none (add one there)'}",
        )
    archs, reference = _targets(doc, data, matrix)
    runner = matrix.runners[profile.runner]
    if runner.arch is not None and runner.arch not in archs:
        raise doc.error(
            f"runner `{runner.name}` is {runner.arch}, which the profile's [targets] archs leave out",
            table="targets",
            key="archs",
            fix=f"add {runner.arch!r} to archs",
        )
    deviations = matrix_module._deviations(doc, data) if "deviation" in data else ()
    changes: dict[str, Any] = {
        "archs": archs,
        "reference_arch": reference,
        "platform": profile.platform,
        "axes": {**matrix.axes, "python": (profile.python,)},
        # Every cell run under the profile runs on its runner: its kind comes first and takes every cell.
        "runners": {runner.name: dataclasses.replace(runner, cells=("*",)), **matrix.runners},
        "deviations": (
            *deviations,
            *(d for d in matrix.deviations if d.component not in {x.component for x in deviations}),
        ),
        "suites": _suites(doc, data, matrix.suites),
        "profile": profile,
    }
    if hosted:
        changes.update(_indexes(doc, data, matrix))
    return dataclasses.replace(matrix, **changes)


def _profile(path: Path, text: str, table: Mapping[str, Any]) -> HostProfile:
    provides: dict[str, str] = {}
    for line in table.get("provides", ()):
        req = Requirement(line)
        provides[canonicalize_name(req.name)] = next(iter(req.specifier)).version
    return HostProfile(
        name=str(table["name"]),
        path=path,
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        runner=str(table["runner"]),
        python=str(table["python"]),
        platform=str(table["platform"]),
        provides=provides,
        pins=tuple(str(p) for p in table.get("pins", ())),
        nodeps=tuple(str(p) for p in table.get("nodeps", ())),
        leave_out={canonicalize_name(k): str(v) for k, v in table.get("leave_out", {}).items()},
    )


def _targets(doc: Any, data: Mapping[str, Any], matrix: Matrix) -> tuple[tuple[str, ...], str | None]:
    table = data.get("targets", {})
    if not isinstance(table, dict):
        raise doc.error("`targets` must be a table", table="targets", fix="write it as [targets]")
    declared = Table(
        {
            "archs": List(
                Str("an arch of matrix.toml's [targets] archs"),
                f'a subset of matrix.toml\'s archs ({", ".join(matrix.archs)}), e.g. archs = ["{matrix.archs[-1]}"]',
                min_len=1,
                unique=True,
            ),
            "reference": Str("the reference arch, one of the profile's archs"),
        },
    )
    schema.check(doc, "targets", table, declared)
    archs = tuple(table.get("archs", matrix.archs))
    for arch in archs:
        if arch not in matrix.archs:
            hint = did_you_mean(arch, matrix.archs)
            raise doc.error(
                f"`{arch}` in [targets] archs is not an arch of {matrix.path.name}"
                + (f"; {hint}" if hint else ""),
                table="targets",
                key="archs",
                fix=f"a profile narrows the archs: use some of {', '.join(matrix.archs)} (or add it there)",
            )
    reference = table.get("reference", matrix.reference_arch)
    if reference is not None and reference not in archs:
        if "reference" in table:
            raise doc.error(
                f"reference arch `{reference}` is not in the profile's archs",
                table="targets",
                key="reference",
                fix="add it to archs",
            )
        reference = None  # matrix.toml's reference is not on this host: nothing is compared with it here
    return archs, reference


def _suites(doc: Any, data: Mapping[str, Any], suites: tuple[Suite, ...]) -> tuple[Suite, ...]:
    table = data.get("suites", {})
    if not isinstance(table, dict):
        raise doc.error("`suites` must be a table", table="suites", fix="write [suites.<NN-name>] tables")
    known = {s.name: s for s in suites}
    out = []
    for name in table:
        if name not in known:
            hint = did_you_mean(name, known)
            raise doc.error(
                f"suite `{name}` is not an enabled suite of the matrix" + (f"; {hint}" if hint else ""),
                table=f"suites.{name}",
                fix=f"known suites: {', '.join(known)}",
            )
    for suite in suites:
        entry = table.get(suite.name)
        if entry is None:
            out.append(suite)
            continue
        schema.check(doc, ("suites", suite.name), entry, matrix_tables.suite(settings_schema(suite.path)))
        if not entry.get("enabled", True):
            continue
        merged = {**suite.settings, **entry.get("settings", {})}
        line = doc.line_of(f"suites.{suite.name}.settings", None)
        out.append(
            dataclasses.replace(
                suite,
                needs_gpu=bool(entry.get("needs_gpu", suite.needs_gpu)),
                gate=bool(entry.get("gate", suite.gate)),
                timeout=int(entry.get("timeout", suite.timeout)),
                settings=merged,
                wheels=tuple(entry.get("wheels", suite.wheels)),
                parsed_settings=parse_settings(doc.path, suite.path, merged, line),
            )
        )
    return tuple(out)


def _expanded(doc: Any, data: Mapping[str, Any]) -> dict[str, Any]:
    """[indexes] with ${VAR} in find_links / wheel replaced by the variable's value (unset: an error there)."""
    table = data.get("indexes", {})
    if not isinstance(table, dict):
        raise doc.error("`indexes` must be a table", table="indexes", fix="write [indexes.<name>] tables")
    out: dict[str, Any] = {}
    for name, given in table.items():
        if not isinstance(given, dict):
            out[name] = given
            continue
        entry = dict(given)
        for key in ("find_links", "wheel"):
            value = entry.get(key)
            if isinstance(value, str):
                for var in _VAR.findall(value):
                    if var not in os.environ:
                        raise doc.error(
                            f"[indexes.{name}] {key} = {value!r}: ${{{var}}} is not set",
                            table=f"indexes.{name}",
                            key=key,
                            fix=f"set {var} (the bundle's env file does: `. PREFIX/stackfarm-env.sh`)",
                        )
                entry[key] = _VAR.sub(lambda m: os.environ[m.group(1)], value)
        out[name] = entry
    return out


def _indexes(doc: Any, data: Mapping[str, Any], matrix: Matrix) -> dict[str, Any]:
    """The profile's [indexes] over matrix.toml's (one marked default becomes the default) and its [[route]]s
    before matrix.toml's."""
    table = _expanded(doc, data)
    if not table and "route" not in data:
        return {}
    own, _first = matrix_module._indexes(doc, table) if table else ({}, "")
    indexes = {**matrix.indexes, **own}
    default = next(
        (n for n, e in table.items() if isinstance(e, dict) and e.get("default")), matrix.default_index
    )
    routes = matrix_module._routes(doc, data, indexes)
    return {"indexes": indexes, "default_index": default, "routes": (*routes, *matrix.routes)}


def load_matrix(path: Path | str, profile: Path | str | None, *, hosted: bool = True) -> Matrix:
    """matrix.toml, with the host profile over it when one is given (`--profile`)."""
    matrix = matrix_module.load(path)
    return matrix if profile is None else load(profile, matrix, hosted=hosted)


__all__ = ["PROFILE", "TOP_KEYS", "HostProfile", "load", "load_matrix", "read_toml"]
