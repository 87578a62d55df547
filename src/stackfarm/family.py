"""The one seam between the harness and a suite family: what a suite declares, once, in ``suites/NN-name/family.py``.

A family is one object, ``FAMILY = SuiteFamily(...)``, the way pytest treats a plugin and nox a session:

- its **settings**: the schema of ``[suites.<name>.settings]`` (stackfarm.schema, checked by matrix.load with the
  file, line and key of every error) and the frozen object parsed from it once (``settings.from_mapping``); the
  runner hands it to the suite as JSON in ``CellSpec.settings[<name>]`` (`to_json`), the suite reads it back with
  the same ``from_mapping`` (`SuiteFamily.settings_of`, the ``settings`` fixture of suites/conftest.py);
- its **record**: a frozen dataclass tree (primitives, tuples, mappings, nested frozen dataclasses) the suite
  fills through the ``results`` fixture (`Results`) and writes beside its JUnit file as ``<suite>.json``
  (`write_record`); JUnit keeps pass/fail/skip and the one-line reason, the record carries what the report shows.
  The verdict binds the record's sha256 (``SuiteResult.record_sha256``) as it binds the JUnit file's: a record
  whose bytes are not the ones bound is never rendered (`read_record`);
- its **section**: the cell page's HTML, rendered from the decoded records (`SectionContext`);
- its **needs**: a GPU, the image's tools, the stack table flags it reads, extra wheels (`Needs`): chosen by
  the family's hook, which may ask the index through the runner (`WheelQuery`), so no suite resolves a wheel;
- its **tables** (`OwnedTable`): the top-level tables of matrix.toml it owns besides [suites.<name>]
  (40-throughput's [thresholds.<runner kind>]), declared here and checked by matrix.load through the family
  registry with the file, line and key of every error, so that the config layer imports no suite library;
- its **format 0** (`SuiteFamily.legacy`): how a suite run held from before its family wrote records (a verdict
  that binds no record sha256, no ``<suite>.json``) becomes a record, read from that run's JUnit file once, at
  the report, the way the verdict store migrates an old format. It is the one reader of a suite's JUnit
  properties, and it reads only runs that predate records: a run that binds a record is never read so.

The codec (`to_json` / `from_json`) is generic over frozen dataclass trees (dataclasses.fields and
typing.get_type_hints), so no family writes a serialiser. The record file has a schema version, as the verdict
store has its format: ``{"schema": RECORD_SCHEMA, "family": <name>, "record": {...}}``.

Ground floor: imports the standard library, stackfarm.errors and stackfarm.schema only.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

from .errors import Unavailable
from .schema import Field, Table

#: The record file's format: 1 is ``{"schema", "family", "record"}`` with `to_json`'s encoding.
RECORD_SCHEMA = 1

S = TypeVar("S")
R = TypeVar("R")
T = TypeVar("T")


class Settings(Protocol):
    """A family's settings class: a frozen dataclass parsed once from its checked table."""

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> Any: ...


class WheelQuery(Protocol):
    """What a family's `Needs.wheels` hook may ask while it decides which wheels a cell needs: the cell's stack,
    and the index the matrix routes each distribution to (the runner answers with its resolver). A query the
    index cannot answer raises `Unavailable` with the reason (the runner keeps it for `Needs.unresolved`)."""

    #: The cell's stack: distribution -> version.
    @property
    def stack(self) -> Mapping[str, str]: ...

    def requires(self, distribution: str, version: str) -> list[str]:
        """The release's Requires-Dist, from the index's metadata."""
        ...

    def versions(self, distribution: str) -> list[str]:
        """The releases the default index has of `distribution` (with a usable wheel), oldest first."""
        ...


@dataclass(frozen=True)
class StackOnly:
    """A `WheelQuery` that knows the stack only: every index question is `Unavailable` (a hook's unit test, a
    caller without an index)."""

    stack: Mapping[str, str]

    def requires(self, distribution: str, version: str) -> list[str]:
        raise Unavailable(f"{distribution}=={version}: no index to read its metadata from")

    def versions(self, distribution: str) -> list[str]:
        raise Unavailable(f"{distribution}: no index to list its releases from")


def _no_wheels(_settings: Any, _query: WheelQuery) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True, kw_only=True)
class Needs:
    """What a family needs from the cell beyond its stack."""

    #: The suite needs a GPU (the default of [suites.<name>] needs_gpu; matrix.toml's key wins).
    gpu: bool = False
    #: Tools the suite's image must carry (the Docker backend installs them), e.g. ("nvidia-smi",).
    image_tools: tuple[str, ...] = ()
    #: The stack table's suite-facing flags it reads (stackfarm.stack), e.g. ("cuda_libraries",).
    stack_flags: tuple[str, ...] = ()
    #: Extra pinned requirement strings from the parsed settings and the cell (`WheelQuery`: its stack, and the
    #: index's metadata and releases): 20-eagle3's nearest older compare_with than the cell's sglang ->
    #: ("sglang==0.5.10",); 15-toolchain's Triton and CUDA toolkit wheels its torch pins. The runner resolves
    #: them and passes them in (CellSpec.extras); a cell only asks for what its run reads, as a host's bundle
    #: carries only that. None by default.
    wheels: Callable[[Any, WheelQuery], tuple[str, ...]] = _no_wheels
    #: What a wheel that cannot be resolved (or a query of `wheels` the index cannot answer) makes: "error", an
    #: error of the cell naming the suite and the requirement (20-eagle3: its diff has nothing to read); or
    #: "unanswered", the requirement handed to the suite with the reason (CellSpec.unavailable), which reports
    #: what it cannot answer as such (15-toolchain: an offline host's finding is unanswered, never a pass).
    unresolved: Literal["error", "unanswered"] = "error"


def _any_key(_key: str, _runners: tuple[str, ...]) -> tuple[str, str] | None:
    return None


@dataclass(frozen=True, kw_only=True)
class OwnedTable:
    """A top-level table of matrix.toml a family owns, ``[<table>.<key>]`` sub-tables (40-throughput's
    [thresholds.<runner kind>]): matrix.load checks each key with `key_problem` and each sub-table against the
    schema `entry` gives, naming the file, line and key of an error."""

    #: The schema of one sub-table, from the family's parsed settings (None: the suite is disabled, or has no
    #: settings table: its defaults apply).
    entry: Callable[[Any], Field]
    #: Why a sub-table's key is refused, given the kinds [runners] declares: (message, fix), or None.
    key_problem: Callable[[str, tuple[str, ...]], tuple[str, str] | None] = _any_key


@dataclass(frozen=True, kw_only=True)
class SectionContext(Generic[R]):
    """What a family's section gets: the cell as the report knows it, the family's suite runs, the records
    decoded from them (only those whose sha256 the verdict binds), and the cell's figures over time."""

    #: The cell as the report knows it (stackfarm.history.CellRun: this module imports nothing of the report).
    cell: Any
    #: The family's suite runs (stackfarm.history.SuiteRun), one per record, in the same order.
    suites: tuple[Any, ...]
    records: tuple[R, ...]
    trends: Mapping[str, list[tuple[str, float]]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SuiteFamily(Generic[S, R]):
    """One suite family: its name (the suite folder's, e.g. "10-capability"), settings, record, section, needs."""

    name: str
    title: str
    #: The section's place on the cell page (the suite's ordinal, by convention).
    order: int
    #: The schema of [suites.<name>.settings]; None: the suite reads no settings (any key is an error).
    settings_schema: Table | None = None
    #: The frozen settings class (`Settings`): parsed once by matrix.load, handed over as JSON.
    settings: type[S] | None = None
    #: The frozen record class the suite writes as <suite>.json; None: the suite writes none.
    record: type[R] | None = None
    section: Callable[[SectionContext[R]], str] | None = None
    needs: Needs = field(default_factory=Needs)
    #: Format 0: the record of a held run that wrote none, from that run (stackfarm.history.SuiteRun: its
    #: testcases' names, outcomes and properties, its testsuite properties); None when it holds no figures.
    #: None here: a held run of this family shows no section, only its grid cell.
    legacy: Callable[[Any], R | None] | None = None
    #: The top-level tables of matrix.toml the family owns (table name -> its declaration); none by default.
    tables: Mapping[str, OwnedTable] = field(default_factory=dict)

    def parse(self, table: Mapping[str, Any]) -> S | None:
        """The settings object of a checked table (None for a family without settings)."""
        if self.settings is None:
            return None
        parsed: S = getattr(self.settings, "from_mapping")(table)  # noqa: B009  # the Settings protocol
        return parsed

    def settings_of(self, handed: Mapping[str, Any]) -> S:
        """The settings object handed over in CellSpec.settings[<name>] (`to_json` of the parsed object: a
        family's `from_mapping` reads its JSON form as it reads the table, ``from_mapping(to_json(s)) == s``)."""
        parsed = self.parse(handed)
        if parsed is None:
            raise TypeError(f"suite family {self.name} declares no settings")
        return parsed


# --------------------------------------------------------------------------- the codec


def to_json(value: Any) -> Any:
    """A frozen dataclass tree as JSON data: dataclasses as objects, tuples as lists, enums as their values."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    raise TypeError(
        f"{type(value).__name__} is not part of a record (primitives, tuples, mappings, dataclasses)"
    )


def from_json(kind: type[T], data: Any) -> T:
    """`data` (as `to_json` wrote it) as a `kind`; raises ValueError naming the field that does not fit."""
    out: T = _decode(kind, data, kind.__name__)
    return out


def _decode(kind: Any, data: Any, where: str) -> Any:
    if kind is Any:
        return data
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        return _decode_dataclass(kind, data, where)
    origin = typing.get_origin(kind)
    if origin is None and kind not in (dict, Mapping):
        return _decode_scalar(kind, data, where)
    return _decode_generic(origin or kind, typing.get_args(kind), data, where)


def _decode_generic(origin: Any, args: tuple[Any, ...], data: Any, where: str) -> Any:
    """A union, a Literal, a tuple or list, a mapping (typing's origin of the declared type)."""
    if origin in (typing.Union, types.UnionType):
        return _decode_union(args, data, where)
    if origin is typing.Literal:
        if data not in args:
            raise ValueError(f"{where}: {data!r} is not one of {list(args)}")
        return data
    if origin is tuple or origin is list:
        return _decode_sequence(origin, args, data, where)
    if origin in (dict, Mapping):
        return _decode_mapping(args, data, where)
    raise ValueError(f"{where}: {origin} is not a record type (primitives, tuples, mappings, dataclasses)")


def _decode_dataclass(kind: type, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(kind)
    known = {f.name: f for f in dataclasses.fields(kind) if f.init}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    values = {name: _decode(hints[name], data[name], f"{where}.{name}") for name in known if name in data}
    try:
        return kind(**values)
    except TypeError as exc:  # a required field missing
        raise ValueError(f"{where}: {exc}") from None


def _decode_union(args: tuple[Any, ...], data: Any, where: str) -> Any:
    if data is None and type(None) in args:
        return None
    problems = []
    for arg in (a for a in args if a is not type(None)):
        try:
            return _decode(arg, data, where)
        except (ValueError, TypeError) as exc:
            problems.append(str(exc))
    raise ValueError("; ".join(problems) or f"{where}: {data!r} does not fit")


def _decode_sequence(origin: Any, args: tuple[Any, ...], data: Any, where: str) -> Any:
    if not isinstance(data, list | tuple):
        raise ValueError(f"{where}: expected a list, got {type(data).__name__}")
    if origin is tuple and args and args[-1] is not Ellipsis:  # a fixed-length tuple
        if len(args) != len(data):
            raise ValueError(f"{where}: expected {len(args)} items, got {len(data)}")
        return tuple(_decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True)))
    item = args[0] if args else Any
    items = [_decode(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
    return tuple(items) if origin is tuple else items


def _decode_mapping(args: tuple[Any, ...], data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
    value = args[1] if len(args) == 2 else Any
    return {str(k): _decode(value, v, f"{where}.{k}") for k, v in data.items()}


def _decode_scalar(kind: Any, data: Any, where: str) -> Any:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(data)
    if kind is float and _is_number(data):
        return float(data)
    if not _fits(kind, data):
        raise ValueError(f"{where}: expected {getattr(kind, '__name__', kind)}, got {data!r}")
    return data


def _is_number(data: Any) -> bool:
    return isinstance(data, int | float) and not isinstance(data, bool)


def _fits(kind: Any, data: Any) -> bool:
    """`data` is a `kind` (None for NoneType; a bool is no int, though Python says it is)."""
    if kind is type(None):
        return data is None
    return isinstance(kind, type) and isinstance(data, kind) and not (kind is int and isinstance(data, bool))


# --------------------------------------------------------------------------- records


def record_path(out: Path, suite: str) -> Path:
    """Where a suite's record lies: ``<suite>.json`` in the cell's reports folder, beside ``<suite>.xml``."""
    return out / f"{suite}.json"


def record_bytes(family: str, record: Any) -> bytes:
    """The bytes of a record file: its schema version, its family, the record."""
    doc = {"schema": RECORD_SCHEMA, "family": family, "record": to_json(record)}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def write_record(path: Path, family: str, record: Any) -> Path:
    """Write a record atomically (a temp file renamed over it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(record_bytes(family, record))
    tmp.replace(path)
    return path


def sha256_of(path: Path) -> str | None:
    """The file's sha256, None when there is no file."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def read_record(kind: type[T], path: Path, bound: str | None) -> tuple[T | None, str | None]:
    """(the record, None) when the file's bytes are the ones the verdict binds (`bound`, its sha256) and decode
    as `kind`; else (None, why): a record nobody vouches for is never rendered as truth."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, (f"{path.name}: the verdict binds a record that is not there" if bound else None)
    except OSError as exc:
        return None, f"{path.name}: cannot read the record ({exc.strerror or exc})"
    if bound is None:
        return None, f"{path.name}: the verdict binds no record sha256: not shown"
    if hashlib.sha256(raw).hexdigest() != bound:
        return None, f"{path.name}: not the record the verdict binds (its sha256 differs): not shown"
    try:
        doc = json.loads(raw)
        if doc.get("schema") != RECORD_SCHEMA:
            return (
                None,
                f"{path.name}: record schema {doc.get('schema')!r}, this stackfarm reads {RECORD_SCHEMA}",
            )
        return from_json(kind, doc["record"]), None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"{path.name}: not a record of its family ({exc})"


class Results(Generic[R]):
    """A record under construction (the ``results`` fixture): tuple fields accumulate with `add`, scalar
    fields are `set`; `build` makes the frozen record."""

    def __init__(self, kind: type[R]) -> None:
        self.kind = kind
        self._fields = {f.name: f for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
        self._items: dict[str, list[Any]] = {}
        self._values: dict[str, Any] = {}

    def _field(self, name: str) -> dataclasses.Field[Any]:
        if name not in self._fields:
            raise KeyError(
                f"{self.kind.__name__} has no field {name!r}; its fields: {', '.join(self._fields)}"
            )
        return self._fields[name]

    def add(self, name: str, item: Any) -> None:
        """Append `item` to the tuple field `name`."""
        self._field(name)
        self._items.setdefault(name, []).append(item)

    def set(self, name: str, value: Any) -> None:
        """Set the field `name`."""
        self._field(name)
        self._values[name] = value

    def build(self) -> R:
        values = dict(self._values)
        for name, items in self._items.items():
            values[name] = (*values.get(name, ()), *items)
        return self.kind(**values)


__all__ = [
    "RECORD_SCHEMA",
    "Needs",
    "OwnedTable",
    "Results",
    "SectionContext",
    "Settings",
    "StackOnly",
    "SuiteFamily",
    "Unavailable",
    "WheelQuery",
    "from_json",
    "read_record",
    "record_bytes",
    "record_path",
    "sha256_of",
    "to_json",
    "write_record",
]
