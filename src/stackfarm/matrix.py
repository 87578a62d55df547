"""Load and validate matrix.toml into frozen dataclasses: the one place that knows its schema.

Every error names the file, the line, the key and a fix (with a close-match suggestion for typos). Every table is
checked in `load`, before any work starts: the tables read by one library or suite are declared next to the code
that owns their meaning and checked here through stackfarm.schema: [suites.*] settings (each suite's family.py: stackfarm.suite_config),
the top-level tables a suite family owns, such as [thresholds.<kind>] (its family.py's SuiteFamily.tables: 40-throughput's,
declared in stackfarm.throughput.thresholds; this module names no suite library), [runners], [features], [docker]
(stackfarm.matrix_tables).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from . import indexauth, matrix_tables, schema, tomlread
from .errors import ConfigError, did_you_mean
from .families import discover_suites
from .patchset import PatchSet
from .runnerkind import Runner
from .stack import AXES, BY_AXIS, DISTRIBUTION_AXIS, PINNED_AXES, axis_of, python_problem
from .suite_config import family_of, parse_settings, settings_schema
from .wheelsource import Source

_TOP_KEYS = (
    "axes",
    "couple",
    "include",
    "exclude",
    "override",
    "indexes",
    "route",
    "platform",
    "targets",
    "models",
    "patches",
    "suites",
    "features",
    "thresholds",
    "runners",
    "docker",
    "store",
    "deviation",
)
_ARCH = re.compile(r"^sm_\d{2,3}[af]?$")


@dataclass(frozen=True, kw_only=True)
class Couple:
    """Axes that vary together (conda-forge's zip_keys): the i-th values of each axis form one row."""

    name: str
    axes: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True, kw_only=True)
class Rule:
    """An include or exclude rule: axis -> fnmatch pattern (include takes exact values)."""

    match: tuple[tuple[str, str], ...]
    reason: str
    line: int | None

    def as_dict(self) -> dict[str, str]:
        return dict(self.match)


@dataclass(frozen=True, kw_only=True)
class Override:
    """A deliberate departure from one of sglang's own pins, for the cells that match `when`."""

    when: tuple[tuple[str, str], ...]
    axis: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Route:
    """Artifacts matching `requirement` come from the index named `index` instead of the default."""

    requirement: Requirement
    index: str


@dataclass(frozen=True, kw_only=True)
class Model:
    name: str
    target: str
    draft: str


@dataclass(frozen=True, kw_only=True)
class Suite:
    """One pytest suite under suites/<NN-name>/, run in NN order."""

    name: str
    path: Path
    needs_gpu: bool = False
    gate: bool = True
    timeout: int = 1800
    #: [suites.<name>.settings] as written (an input of the verdict; what a legacy suite reads).
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: Requirements of wheels the suite needs beyond the cell's stack (`wheels`): carried by a host's bundle.
    wheels: tuple[str, ...] = ()
    #: The settings parsed once by the suite's family (stackfarm.family), None for a suite without one: the
    #: runner hands it to the suite as JSON in CellSpec.settings.
    parsed_settings: Any = None


@dataclass(frozen=True, kw_only=True)
class Deviation:
    """A part of the stack a host deliberately lacks ([[deviation]]): 00-stack passes it with a note."""

    component: str
    #: Globs (relative to the wheel's root, ** for any depth) of the files left out; () with `absent`.
    missing: tuple[str, ...]
    #: The whole wheel is left out.
    absent: bool
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "missing": list(self.missing),
            "absent": self.absent,
            "reason": self.reason,
        }


@dataclass(frozen=True, kw_only=True)
class Matrix:
    path: Path
    axes: Mapping[str, tuple[str, ...]]
    couples: tuple[Couple, ...]
    include: tuple[Rule, ...]
    exclude: tuple[Rule, ...]
    overrides: tuple[Override, ...]
    indexes: Mapping[str, Source]
    default_index: str
    routes: tuple[Route, ...]
    platform: str
    archs: tuple[str, ...]
    reference_arch: str | None
    models: tuple[Model, ...]
    patch_sets: tuple[PatchSet, ...]
    suites: tuple[Suite, ...]
    features: Mapping[str, Any]
    thresholds: Mapping[str, Mapping[str, Any]]
    docker: Mapping[str, Any] = field(default_factory=dict)
    #: [runners.<kind>] in file order; empty when matrix.toml has no [runners] table.
    runners: Mapping[str, Runner] = field(default_factory=dict)
    #: [[deviation]] entries: parts of the stack deliberately left out (CellSpec.deviations hands them to suites).
    deviations: tuple[Deviation, ...] = ()
    #: [store] trusted_keys: the runner public keys (files or folders) whose store entries are believed.
    trusted_runner_keys: tuple[Path, ...] = ()
    #: The host profile layered over the file (`--profile`, stackfarm.profile), None without one.
    profile: matrix_tables.HostProfile | None = None
    #: The 1-based line of each axis's entry in [axes] (where a conflict on that axis points).
    axis_lines: Mapping[str, int] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.path.parent

    def index_for(self, distribution: str, version: str) -> str:
        """The name of the index serving this artifact: the first matching route, else the default."""
        for route in self.routes:
            same = canonicalize_name(route.requirement.name) == canonicalize_name(distribution)
            if same and route.requirement.specifier.contains(version, prereleases=True):
                return route.index
        return self.default_index


class _Doc:
    """The parsed file plus enough of its text to point at the line of a key."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()
        #: The axes this matrix declares (set once [axes] is read): optional axes may be absent.
        self.axes: tuple[str, ...] = ()

    def line_of(self, table: str, key: str | None = None, *, nth: int = 0) -> int | None:
        """The 1-based line of `key` inside [table] (or of the table header), best effort.

        `nth` picks the entry of an array of tables ([[include]] number nth, counting from 0)."""
        if table == "top level" and key is not None:  # a [key] table, or `key = ...` before the first table
            key_re = re.compile(r"^\s*[\"']?" + re.escape(key) + r"[\"']?\s*=")
            return self.line_of(key) or next(
                (n for n, t in enumerate(self.lines, 1) if key_re.match(t)), None
            )
        header = re.compile(
            r"^\s*\[\[?\s*" + re.escape(table).replace(r"\.", r"\s*\.\s*") + r"\s*\]\]?\s*(#.*)?$"
        )
        starts = [number for number, text in enumerate(self.lines, 1) if header.match(text)]
        start = starts[nth] if nth < len(starts) else None
        if key is None:
            return start
        key_re = re.compile(r"^\s*[\"']?" + re.escape(key) + r"[\"']?\s*=")
        for number in range(start or 1, len(self.lines) + 1):
            text = self.lines[number - 1]
            if start is not None and number > start and text.lstrip().startswith("["):
                break
            if key_re.match(text) or (start is None and re.search(re.escape(key) + r"\s*=", text)):
                return number
        return start

    def line_at(self, parts: Sequence[str]) -> int | None:
        """The line of the key at `parts` (table names, then keys), for stackfarm.schema."""
        return schema.find_line(self.lines, parts)

    def error(
        self, message: str, *, table: str, key: str | None = None, fix: str = "", nth: int = 0
    ) -> ConfigError:
        return ConfigError(self.path, message, line=self.line_of(table, key, nth=nth), fix=fix)


def load(path: Path | str) -> Matrix:
    """Read and validate a matrix file; raise ConfigError for anything wrong, before any work starts."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            path, "no such matrix file", fix="pass --matrix PATH or create matrix.toml"
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            path,
            "is a folder, not a matrix file",
            fix=f"pass --matrix {path / 'matrix.toml'} (the file itself)",
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            path,
            f"is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
            line=path.read_bytes()[: exc.start].count(b"\n") + 1,
            fix="save matrix.toml as UTF-8 (TOML files are UTF-8)",
        ) from None
    except OSError as exc:
        raise ConfigError(
            path, f"cannot read it ({exc.strerror or exc})", fix="check the path and its permissions"
        ) from None
    data = tomlread.loads(path, text)  # a ConfigError at the line (and column) when it does not parse
    return _build(_Doc(path, text), data)


def _check_keys(
    doc: _Doc, table: str, data: Mapping[str, Any], allowed: tuple[str, ...], *, nth: int = 0
) -> None:
    for key in data:
        if key not in allowed:
            hint = did_you_mean(key, allowed)
            raise doc.error(
                f"`{key}` in [{table}] is unknown" + (f"; {hint}" if hint else ""),
                table=table,
                key=key,
                fix=f"use one of: {', '.join(allowed)}",
                nth=nth,
            )


def _table(doc: _Doc, data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise doc.error(f"`{key}` must be a table", table=key, fix=f"write it as [{key}]")
    return value


def _array_of_tables(doc: _Doc, data: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise doc.error(
            f"`{key}` must be an array of tables", table=key, fix=f"write each entry as [[{key}]]"
        )
    return value


def _version(doc: _Doc, table: str, key: str, value: object, *, nth: int = 0) -> str:
    if not isinstance(value, str):
        raise doc.error(
            f"`{key}` in [{table}] must be a version string, got {value!r}",
            table=table,
            key=key,
            nth=nth,
            fix='quote it, e.g. "12.8"',
        )
    try:
        Version(value)
    except InvalidVersion:
        raise doc.error(
            f"`{value}` in [{table}] {key} is not a PEP 440 version", table=table, key=key, nth=nth
        ) from None
    return value


def _python(doc: _Doc, table: str, value: str, *, nth: int = 0) -> None:
    """A python axis value must be a CPython feature release stackfarm runs under (stackfarm.stack.PYTHONS)."""
    problem = python_problem(value)
    if problem is not None:
        where = f"[{table}]" if table == "axes" else f"[[{table}]]"
        raise doc.error(
            f'{where} python = "{value}": {problem[0]}', table=table, key="python", nth=nth, fix=problem[1]
        )


def _build(doc: _Doc, data: dict[str, Any]) -> Matrix:
    _check_keys(doc, "top level", data, _TOP_KEYS)
    axes = _axes(doc, _table(doc, data, "axes"))
    doc.axes = tuple(axes)
    indexes, default_index = _indexes(doc, _table(doc, data, "indexes"))
    platform = _table(doc, data, "platform")
    _check_keys(doc, "platform", platform, ("tag",))
    targets = _table(doc, data, "targets")
    _check_keys(doc, "targets", targets, ("archs", "reference"))
    archs = tuple(targets.get("archs", ["sm_90"]))
    for arch in archs:
        if not isinstance(arch, str) or not _ARCH.match(arch):
            raise doc.error(
                f"`{arch}` in [targets] archs is not a GPU arch",
                table="targets",
                key="archs",
                fix='e.g. "sm_120"',
            )
    reference = targets.get("reference")
    if reference is not None and reference not in archs:
        raise doc.error(
            f"reference arch `{reference}` is not in archs",
            table="targets",
            key="reference",
            fix="add it to archs",
        )
    suites = _suites(doc, _table(doc, data, "suites"))
    runners = _runners(doc, data, archs)
    return Matrix(
        path=doc.path,
        axes=axes,
        couples=_couples(doc, _table(doc, data, "couple"), axes),
        include=_rules(doc, data, "include"),
        exclude=_rules(doc, data, "exclude"),
        overrides=_overrides(doc, data),
        indexes=indexes,
        default_index=default_index,
        routes=_routes(doc, data, indexes),
        platform=str(platform.get("tag", "manylinux_2_39_x86_64")),
        archs=archs,
        reference_arch=reference,
        models=_models(doc, data),
        patch_sets=_patch_sets(doc, _table(doc, data, "patches")),
        suites=suites,
        features=_features(doc, _table(doc, data, "features"), archs),
        thresholds=_owned_tables(doc, data, suites, runners).get("thresholds")
        or _table(doc, data, "thresholds"),
        docker=_docker(doc, _table(doc, data, "docker")),
        runners=runners,
        deviations=_deviations(doc, data),
        trusted_runner_keys=_store(doc, _table(doc, data, "store"), doc.path.parent),
        axis_lines={axis: line for axis in axes if (line := doc.line_of("axes", axis)) is not None},
    )


def _deviations(doc: _Doc, data: Mapping[str, Any]) -> tuple[Deviation, ...]:
    found = []
    for nth, entry in enumerate(_array_of_tables(doc, data, "deviation")):
        problem = schema.first_problem(entry, matrix_tables.DEVIATION)
        if problem is not None:
            key = problem.path[0] if problem.path else None
            text = (
                f"`{key}` in [[deviation]] {problem.message}" if key else f"a [[deviation]] {problem.message}"
            )
            raise doc.error(text, table="deviation", key=key, fix=problem.fix, nth=nth)
        component = str(entry["component"])
        if axis_of(component) is None:
            names = sorted(DISTRIBUTION_AXIS)
            hint = did_you_mean(component, names)
            raise doc.error(
                f"`{component}` in [[deviation]] is not a distribution of the stack"
                + (f"; {hint}" if hint else ""),
                table="deviation",
                key="component",
                nth=nth,
                fix=f"use one of: {', '.join(names)}",
            )
        found.append(
            Deviation(
                component=component,
                missing=tuple(entry.get("missing", ())),
                absent=bool(entry.get("absent", False)),
                reason=str(entry["reason"]),
            )
        )
    return tuple(found)


def _store(doc: _Doc, table: dict[str, Any], root: Path) -> tuple[Path, ...]:
    """[store] trusted_keys, each relative to matrix.toml and checked to exist."""
    schema.check(doc, "store", table, matrix_tables.STORE)
    found = []
    for given in table.get("trusted_keys", ()):
        key = (root / Path(given).expanduser()).resolve()
        if not key.exists():
            raise doc.error(
                f"`trusted_keys` names {given!r}, which does not exist ({key})",
                table="store",
                key="trusted_keys",
                fix="commit the runners' public keys (`stackfarm qualify --keygen DIR` writes DIR/"
                "stackfarm-signing.pub.pem) and name the file or its folder",
            )
        found.append(key)
    return tuple(found)


def _docker(doc: _Doc, table: dict[str, Any]) -> dict[str, Any]:
    schema.check(doc, "docker", table, matrix_tables.DOCKER)
    return table


def _features(doc: _Doc, table: dict[str, Any], archs: Sequence[str]) -> dict[str, Any]:
    declared = matrix_tables.feature(archs)
    for name, entry in table.items():
        schema.check(doc, ("features", name), entry, declared)
    return table


def _runners(doc: _Doc, data: Mapping[str, Any], archs: Sequence[str]) -> dict[str, Runner]:
    table = _table(doc, data, "runners")
    if "runners" in data and not table:
        raise doc.error("[runners] lists no runner", table="runners", fix="add a [runners.<kind>] table")
    declared = matrix_tables.runner(archs)
    runners = {}
    for name, entry in table.items():
        schema.check(doc, ("runners", name), entry, declared)
        problem = matrix_tables.runner_count_rule(name, entry)
        if problem is not None:
            raise schema.config_error(doc, ("runners", name), problem)
        cells = entry.get("cells", ["*"])
        runners[name] = Runner(
            name=name,
            labels=tuple(entry["labels"]),
            arch=entry.get("arch"),
            gpus=int(entry.get("gpus", 1)),
            cells=(cells,) if isinstance(cells, str) else tuple(cells),
            driver=str(entry["driver"]).strip() if "driver" in entry else None,
            forward_compat=bool(entry.get("forward_compat", False)),
        )
    return runners


def _owned_tables(
    doc: _Doc, data: dict[str, Any], suites: Sequence[Suite], runners: Mapping[str, Runner]
) -> dict[str, dict[str, Any]]:
    """Each top-level table a suite family owns (stackfarm.family.OwnedTable: 40-throughput's [thresholds]),
    checked by its declaration: every key of [<table>.<key>] by `key_problem`, every sub-table against the
    schema the family's parsed settings imply (a disabled suite's: its defaults). A table no family owns is
    not checked (no suite reads it)."""
    parsed = {s.name: s.parsed_settings for s in suites}
    out: dict[str, dict[str, Any]] = {}
    for name, path in discover_suites(doc.path.parent).items():
        family = family_of(path)
        for table_name, owned in (family.tables if family is not None else {}).items():
            table = _table(doc, data, table_name)
            declared = owned.entry(parsed.get(name))
            for key, entry in table.items():
                problem = owned.key_problem(key, tuple(runners))
                if problem is not None:
                    raise doc.error(problem[0], table=f"{table_name}.{key}", fix=problem[1])
                schema.check(doc, (table_name, key), entry, declared)
            out[table_name] = table
    return out


def _axes(doc: _Doc, table: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    _check_keys(doc, "axes", table, AXES)
    axes: dict[str, tuple[str, ...]] = {}
    for axis in AXES:
        if axis not in table:
            part = BY_AXIS[axis]
            if part.default is not None:
                axes[axis] = part.default
            elif not part.optional:
                raise doc.error(
                    f"axis `{axis}` is missing", table="axes", fix=f'add {axis} = ["..."] to [axes]'
                )
            continue
        values = table[axis]
        if not isinstance(values, list) or not values:
            raise doc.error(
                f"axis `{axis}` is empty" if values == [] else f"axis `{axis}` must be a list",
                table="axes",
                key=axis,
                fix=f'give it at least one value, e.g. {axis} = ["..."]',
            )
        checked = tuple(_version(doc, "axes", axis, value) for value in values)
        if axis == "python":
            for value in checked:
                _python(doc, "axes", value)
        if len(set(checked)) != len(checked):
            raise doc.error(
                f"axis `{axis}` lists a value twice", table="axes", key=axis, fix="remove the repeat"
            )
        axes[axis] = checked
    return axes


def _couples(doc: _Doc, table: dict[str, Any], axes: Mapping[str, tuple[str, ...]]) -> tuple[Couple, ...]:
    couples = []
    seen: set[str] = set()
    for name, group in table.items():
        where = f"couple.{name}"
        if not isinstance(group, dict) or len(group) < 2:
            raise doc.error(
                f"[{where}] must list two or more axes", table=where, fix="e.g. cuda = [...], torch = [...]"
            )
        _check_keys(doc, where, group, AXES)
        lengths = {len(values) for values in group.values()}
        if len(lengths) != 1:
            raise doc.error(
                f"the lists in [{where}] have different lengths",
                table=where,
                fix="one value per row in each list",
            )
        for axis, values in group.items():
            if axis in seen:
                raise doc.error(f"axis `{axis}` is in two couple groups", table=where, key=axis)
            seen.add(axis)
            for value in values:
                if str(value) not in axes[axis]:
                    raise doc.error(
                        f"`{value}` in [{where}] {axis} is not a value of that axis",
                        table=where,
                        key=axis,
                        fix=f"add it to [axes] {axis} or use one of {list(axes[axis])}",
                    )
        names = tuple(group)
        rows = tuple(zip(*(tuple(str(v) for v in group[a]) for a in names), strict=True))
        couples.append(Couple(name=name, axes=names, rows=rows))
    return tuple(couples)


def _match(doc: _Doc, table: str, entry: Mapping[str, Any], nth: int) -> tuple[tuple[str, str], ...]:
    match = []
    for axis, value in entry.items():
        if axis == "reason":
            continue
        if axis not in AXES:
            hint = did_you_mean(axis, AXES)
            raise doc.error(
                f"`{axis}` in [[{table}]] is not an axis" + (f"; {hint}" if hint else ""),
                table=table,
                key=axis,
                nth=nth,
                fix=f"use one of: {', '.join(AXES)}",
            )
        match.append((axis, str(value)))
    if not match:
        raise doc.error(
            f"an entry of [[{table}]] matches nothing", table=table, fix="name at least one axis", nth=nth
        )
    return tuple(match)


def _rules(doc: _Doc, data: Mapping[str, Any], key: str) -> tuple[Rule, ...]:
    rules = []
    for nth, entry in enumerate(_array_of_tables(doc, data, key)):
        match = _match(doc, key, entry, nth)
        if key == "include":
            missing = [axis for axis in doc.axes if axis not in entry and axis != "python"]
            if missing:
                raise doc.error(
                    f"an [[include]] cell must give every axis; missing {', '.join(missing)}",
                    table=key,
                    fix="an include adds one whole cell",
                    nth=nth,
                )
            for axis, value in match:
                _version(doc, key, axis, value, nth=nth)
                if axis == "python":
                    _python(doc, key, value, nth=nth)
        rules.append(Rule(match=match, reason=str(entry.get("reason", "")), line=doc.line_of(key, nth=nth)))
    return tuple(rules)


def _overrides(doc: _Doc, data: Mapping[str, Any]) -> tuple[Override, ...]:
    overrides = []
    for nth, entry in enumerate(_array_of_tables(doc, data, "override")):
        _check_keys(doc, "override", entry, ("when", "axis", "reason"), nth=nth)
        axis = entry.get("axis")
        if axis not in PINNED_AXES:
            raise doc.error(
                f"override axis `{axis}` cannot be overridden",
                table="override",
                key="axis",
                fix=f"use {', '.join(PINNED_AXES)} (the pins sglang declares)",
                nth=nth,
            )
        if not entry.get("reason"):
            raise doc.error(
                "an override needs a reason",
                table="override",
                fix='add reason = "why this is deliberate"',
                nth=nth,
            )
        when = _match(doc, "override", entry.get("when", {}), nth) if entry.get("when") else ()
        overrides.append(Override(when=when, axis=axis, reason=str(entry["reason"])))
    return tuple(overrides)


def _indexes(doc: _Doc, table: dict[str, Any]) -> tuple[dict[str, Source], str]:
    if not table:
        return {"pypi": Source(name="pypi", url="https://pypi.org/simple")}, "pypi"
    indexes: dict[str, Source] = {}
    default = None
    for name, entry in table.items():
        where = f"indexes.{name}"
        if not isinstance(entry, dict):
            raise doc.error(
                f"[{where}] must be a table", table=where, fix='e.g. url = "https://pypi.org/simple"'
            )
        _check_keys(doc, where, entry, ("url", "find_links", "wheel", "default"))
        kinds = [k for k in ("url", "find_links", "wheel") if k in entry]
        if len(kinds) != 1:
            raise doc.error(
                f"[{where}] needs exactly one of url, find_links, wheel", table=where, fix="keep one of them"
            )
        base = doc.path.parent
        indexes[name] = Source(
            name=name,
            # Credentials written into the URL stay in indexauth's memory: every URL the program sees has none.
            url=indexauth.take_credentials(str(entry["url"]).rstrip("/")) if "url" in entry else None,
            find_links=(base / entry["find_links"]) if "find_links" in entry else None,
            wheel=(base / entry["wheel"]) if "wheel" in entry else None,
        )
        if entry.get("default"):
            default = name
    return indexes, default or next(iter(indexes))


def _routes(doc: _Doc, data: Mapping[str, Any], indexes: Mapping[str, Source]) -> tuple[Route, ...]:
    routes = []
    for nth, entry in enumerate(_array_of_tables(doc, data, "route")):
        _check_keys(doc, "route", entry, ("requirement", "index"), nth=nth)
        try:
            requirement = Requirement(str(entry.get("requirement", "")))
        except InvalidRequirement as exc:
            raise doc.error(
                f"route requirement is invalid: {exc}",
                table="route",
                key="requirement",
                fix='e.g. "torch==2.9.1+cu130"',
                nth=nth,
            ) from None
        index = str(entry.get("index", ""))
        if index not in indexes:
            hint = did_you_mean(index, indexes)
            raise doc.error(
                f"route index `{index}` is not in [indexes]" + (f"; {hint}" if hint else ""),
                table="route",
                key="index",
                fix=f"use one of: {', '.join(indexes)}",
                nth=nth,
            )
        routes.append(Route(requirement=requirement, index=index))
    return tuple(routes)


def _models(doc: _Doc, data: Mapping[str, Any]) -> tuple[Model, ...]:
    models = []
    for nth, entry in enumerate(_array_of_tables(doc, data, "models")):
        _check_keys(doc, "models", entry, ("name", "target", "draft"), nth=nth)
        for key in ("name", "target", "draft"):
            if not isinstance(entry.get(key), str):
                raise doc.error(
                    f"a [[models]] entry needs `{key}`", table="models", fix=f'add {key} = "..."', nth=nth
                )
        models.append(Model(name=entry["name"], target=entry["target"], draft=entry["draft"]))
    return tuple(models)


def _patch_sets(doc: _Doc, table: dict[str, Any]) -> tuple[PatchSet, ...]:
    sets = []
    for name, entry in table.items():
        where = f"patches.{name}"
        if not isinstance(entry, dict):
            raise doc.error(f"[{where}] must be a table", table=where)
        _check_keys(doc, where, entry, ("applies_to", "optional"))
        try:
            spec = SpecifierSet(str(entry.get("applies_to", "")).removeprefix("sglang"))
        except InvalidSpecifier:
            raise doc.error(
                f"applies_to of [{where}] is not a version specifier",
                table=where,
                key="applies_to",
                fix='e.g. "sglang>=0.5.9,<0.5.10"',
            ) from None
        path = doc.path.parent / "patches" / name
        if not (path / "series").is_file():
            raise doc.error(
                f"patch set `{name}` has no {path / 'series'}",
                table=where,
                fix="create the series file or remove the set",
            )
        sets.append(
            PatchSet(name=name, applies_to=spec, path=path, optional=bool(entry.get("optional", False)))
        )
    return tuple(sets)


def _suites(doc: _Doc, table: dict[str, Any]) -> tuple[Suite, ...]:
    found = discover_suites(doc.path.parent)
    for name in table:
        if name not in found:
            hint = did_you_mean(name, found)
            raise doc.error(
                f"suite `{name}` in [suites] does not exist under suites/" + (f"; {hint}" if hint else ""),
                table=f"suites.{name}",
                fix=f"known suites: {', '.join(found) or 'none'}",
            )
    suites = []
    for name, path in found.items():
        entry = table.get(name, {})
        schema.check(doc, ("suites", name), entry, matrix_tables.suite(settings_schema(path)))
        if not entry.get("enabled", True):
            continue
        raw = dict(entry.get("settings", {}))
        family = family_of(path)
        suites.append(
            Suite(
                name=name,
                path=path,
                needs_gpu=bool(entry.get("needs_gpu", family.needs.gpu if family else False)),
                gate=bool(entry.get("gate", True)),
                timeout=math.ceil(entry.get("timeout", 1800)),
                settings=raw,
                wheels=tuple(entry.get("wheels", ())),
                parsed_settings=parse_settings(
                    doc.path, path, raw, doc.line_of(f"suites.{name}.settings", None)
                ),
            )
        )
    return tuple(suites)


def locate(path: Path, table: str, key: str | None = None) -> int | None:
    """The line of `key` in [table] of a matrix file, for errors found after loading."""
    try:
        return _Doc(path, path.read_text(encoding="utf-8")).line_of(table, key)
    except OSError:
        return None


__all__ = [
    "AXES",
    "Couple",
    "Deviation",
    "Matrix",
    "Model",
    "Override",
    "Route",
    "Rule",
    "Runner",
    "Suite",
    "discover_suites",
    "load",
    "locate",
]
