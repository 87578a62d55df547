"""A small declarative schema for TOML tables: typed fields, each with the fix to show when a value is wrong.

A table is declared once, next to the code that owns its meaning, as a `Table` of fields::

    SCHEMA = Table({
        "prompts": Int("a whole number of prompts, e.g. prompts = 8", min=1, max=4096),
        "dtype": Enum(("bfloat16", "float16"), "the run's dtype", noun="dtype"),
        "tolerance": Map(Table({"atol": Number("...", min=0)}), "per dtype", keys=("bfloat16", "float16")),
    }, noun="setting")

`first_problem(mapping, schema)` returns the first `Problem` (the keys down to the bad one, what is wrong, the
fix), or None; a library turns it into its own error. `check(doc, table, mapping, schema)` raises matrix.toml's
ConfigError at the line of the offending key, with a did-you-mean for misspelt keys. Only the standard library
is used (and stackfarm.errors): suites import their declarations in the cell's own Python.

Fields: `Str` (optionally a pattern or a check), `Int` and `Number` (with min / max), `Bool`, `Enum` (one of some
choices), `List` (of a field), `Either` (the first of some fields that fits), `Table` (known keys, some
required, cross-key `rules`) and `Map` (free-form keys, each value one field).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .errors import ConfigError, did_you_mean

#: No value: a Problem about a key that is missing, or about a whole table.
NOTHING: Any = type("Nothing", (), {"__repr__": lambda _self: "nothing"})()


@dataclass(frozen=True)
class Problem:
    """What is wrong with one value: where (keys from the checked table down), what, and the fix."""

    #: Keys from the checked table down to the offending one; () for the table itself.
    path: tuple[str, ...]
    #: A predicate on the key: "must be a number, got 'x' (a string)", "is an unknown setting; ...".
    message: str
    fix: str = ""
    value: Any = NOTHING

    @property
    def key(self) -> str:
        """The dotted path, e.g. "tolerance.bfloat16.atol" ("" for the table itself)."""
        return ".".join(self.path)

    def within(self, *outer: str) -> Problem:
        return Problem((*outer, *self.path), self.message, self.fix, self.value)


def kind_of(value: object) -> str:
    """How TOML would call a value's type: "a string", "an integer", "a table"..."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "a table"
    return type(value).__name__


def _got(value: object) -> str:
    return f"got {value!r} ({kind_of(value)})"


class Field:
    """A value's type and bounds. `help` says what a right value looks like: it is the fix of every problem."""

    help: str

    def problem(self, value: Any) -> Problem | None:  # pragma: no cover - every field overrides it
        raise NotImplementedError

    def _bad(self, message: str, value: Any, *path: str) -> Problem:
        return Problem(tuple(path), message, self.help, value)


def _hinted(message: str, word: str, choices: Iterable[str]) -> str:
    hint = did_you_mean(word, choices)
    return f"{message}; {hint}" if hint else message


@dataclass(frozen=True)
class Str(Field):
    help: str
    #: The whole string must match (re.fullmatch).
    pattern: str | None = None
    #: Further check: a message (a predicate, e.g. "is not a version") or None.
    check: Callable[[str], str | None] | None = None
    nonempty: bool = True

    def problem(self, value: Any) -> Problem | None:
        if not isinstance(value, str):
            return self._bad(f"must be a string, {_got(value)}", value)
        if self.nonempty and not value:
            return self._bad("must not be empty", value)
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            return self._bad(f"{value!r} is not {self.help}", value)
        found = self.check(value) if self.check is not None else None
        return self._bad(found, value) if found else None


@dataclass(frozen=True)
class Enum(Field):
    choices: tuple[str, ...]
    help: str = ""
    #: What one choice is ("dtype", "shape"): the message reads "names an unknown dtype 'fp8'".
    noun: str = "value"

    def problem(self, value: Any) -> Problem | None:
        if value in self.choices:
            return None
        fix = self.help or f"one of: {', '.join(map(repr, self.choices))}"
        message = _hinted(f"names an unknown {self.noun} {value!r}", str(value), self.choices)
        return Problem((), f"{message} (known: {', '.join(self.choices)})", fix, value)


def _range(value: float, low: float | None, high: float | None) -> str | None:
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        return f"{value!r} is outside [{lo}, {hi}]"
    return None


@dataclass(frozen=True)
class Int(Field):
    help: str
    min: int | None = None
    max: int | None = None

    def problem(self, value: Any) -> Problem | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return self._bad(f"must be an integer, {_got(value)}", value)
        outside = _range(value, self.min, self.max)
        return self._bad(outside, value) if outside else None


@dataclass(frozen=True)
class Number(Field):
    """An integer or a float, finite, within [min, max]; `positive` also refuses 0."""

    help: str
    min: float | None = None
    max: float | None = None
    positive: bool = False

    def problem(self, value: Any) -> Problem | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return self._bad(f"must be a number, {_got(value)}", value)
        number = float(value)
        if not math.isfinite(number):
            return self._bad(f"{value!r} is outside the finite numbers", value)
        outside = _range(number, self.min, self.max)
        if outside:
            return self._bad(outside, value)
        return (
            self._bad(f"must be a number > 0, got {value!r}", value)
            if self.positive and number <= 0
            else None
        )


@dataclass(frozen=True)
class Bool(Field):
    help: str = "true or false"

    def problem(self, value: Any) -> Problem | None:
        return None if isinstance(value, bool) else self._bad(f"must be true or false, {_got(value)}", value)


@dataclass(frozen=True)
class List(Field):
    item: Field
    help: str
    min_len: int = 0
    max_len: int | None = None
    unique: bool = False

    def problem(self, value: Any) -> Problem | None:
        if not isinstance(value, list | tuple):
            return self._bad(f"must be a list, {_got(value)}", value)
        found = self._length_problem(value) or self._item_problem(value)
        if found is not None:
            return found
        if self.unique and len(set(map(repr, value))) != len(value):
            return self._bad("lists a value twice", value)
        return None

    def _length_problem(self, value: list[Any] | tuple[Any, ...]) -> Problem | None:
        if len(value) < self.min_len:
            return self._bad(
                f"must be a non-empty list, got {list(value)!r}"
                if self.min_len == 1
                else f"must list at least {self.min_len} items, got {len(value)}",
                value,
            )
        if self.max_len is not None and len(value) > self.max_len:
            return self._bad(f"must list at most {self.max_len} items, got {len(value)}", value)
        return None

    def _item_problem(self, value: list[Any] | tuple[Any, ...]) -> Problem | None:
        """The first item's problem, said of the item by its number (1 first)."""
        for number, item in enumerate(value, 1):
            found = self.item.problem(item)
            if found is not None:
                where = "".join(f".{p}" for p in found.path)
                return Problem((), f"item {number}{where} {found.message}", self.help or found.fix, value)
        return None


@dataclass(frozen=True)
class Either(Field):
    """The first of `options` that fits; the message is that of the first option."""

    options: tuple[Field, ...]
    help: str

    def problem(self, value: Any) -> Problem | None:
        found = [option.problem(value) for option in self.options]
        if any(p is None for p in found):
            return None
        first = found[0]
        assert first is not None
        return Problem(first.path, first.message, self.help, value)


#: A cross-key rule of a table: given the table (checked key by key already), its problems.
Rule = Callable[[Mapping[str, Any]], Iterable[Problem]]


@dataclass(frozen=True)
class Table(Field):
    """A table of known keys; unknown keys are problems (with a close-match suggestion)."""

    fields: Mapping[str, Field]
    help: str = ""
    required: tuple[str, ...] = ()
    #: Run once every key is fine, in order; the first problem counts.
    rules: tuple[Rule, ...] = ()
    #: What one key is: "`x` is an unknown setting" ("": "`x` is unknown").
    noun: str = ""

    def problem(self, value: Any) -> Problem | None:
        if not isinstance(value, Mapping):
            return self._bad(f"must be a table, {_got(value)}", value)
        for key, item in value.items():
            found = self._key_problem(key, item)
            if found is not None:
                return found
        for key in self.required:
            if key not in value:
                known = self.fields[key]
                return Problem((), f"needs `{key}`", f"add {key}: {known.help}" if known.help else "")
        return self._rule_problem(value)

    def _key_problem(self, key: str, item: Any) -> Problem | None:
        """An unknown key (with the nearest known one), else its value's problem, said of the key."""
        known = self.fields.get(key)
        if known is None:
            message = _hinted(f"is an unknown {self.noun}" if self.noun else "is unknown", key, self.fields)
            fix = f"use one of: {', '.join(self.fields)}" if self.fields else self.help
            return Problem((key,), message, fix, item)
        found = known.problem(item)
        return found.within(key) if found is not None else None

    def _rule_problem(self, value: Mapping[str, Any]) -> Problem | None:
        for rule in self.rules:
            for found in rule(value):
                return found
        return None


@dataclass(frozen=True)
class Map(Field):
    """A table of free-form keys (names of things), every value `value`.

    `keys` is either the names allowed (a misspelt one gets a suggestion) or a check giving a message."""

    value: Field
    help: str = ""
    keys: Sequence[str] | Callable[[str], str | None] | None = None
    #: What one key names ("dtype", "runner kind").
    noun: str = "key"
    rules: tuple[Rule, ...] = ()

    def key_problem(self, key: str) -> str | None:
        if self.keys is None:
            return None
        if callable(self.keys):
            return self.keys(key)
        if key in self.keys:
            return None
        return _hinted(f"is an unknown {self.noun}", key, self.keys) + f" (known: {', '.join(self.keys)})"

    def problem(self, value: Any) -> Problem | None:
        if not isinstance(value, Mapping):
            return self._bad(f"must be a table, {_got(value)}", value)
        for key, item in value.items():
            message = self.key_problem(str(key))
            if message is not None:
                fix = f"use one of: {', '.join(self.keys)}" if isinstance(self.keys, Sequence) else self.help
                return Problem((str(key),), message, fix, item)
            found = self.value.problem(item)
            if found is not None:
                return found.within(str(key))
        for rule in self.rules:
            for found in rule(value):
                return found
        return None


def first_problem(value: Any, schema: Field) -> Problem | None:
    """The first thing wrong with `value` under `schema`, or None."""
    return schema.problem(value)


# --------------------------------------------------------------------------- lines of a TOML file


def _part(name: str) -> str:
    escaped = re.escape(name)
    return rf"(?:\"{escaped}\"|'{escaped}'|{escaped})"


_ANY_HEADER = re.compile(r"^\s*\[\[?[^=\[\]]+\]\]?\s*(#.*)?$")


def find_line(lines: Sequence[str], parts: Sequence[str]) -> int | None:
    """The 1-based line of the key at `parts` (table names, then keys): the key's own line inside the deepest
    table header of the file that `parts` starts with, else that header's line; None when nothing is found."""
    for depth in range(len(parts), 0, -1):
        header = re.compile(
            r"^\s*\[\[?\s*" + r"\s*\.\s*".join(map(_part, parts[:depth])) + r"\s*\]\]?\s*(#.*)?$"
        )
        start = next((n for n, text in enumerate(lines, 1) if header.match(text)), None)
        if start is None:
            continue
        if depth == len(parts):
            return start
        return _key_line(lines, start, parts[depth]) or start
    return _key_line(lines, 0, parts[0]) if parts else None


def _key_line(lines: Sequence[str], start: int, key: str) -> int | None:
    """The line of `key = ...` in the table whose header is line `start` (0: before the first header)."""
    key_re = re.compile(r"^\s*" + _part(key) + r"\s*=")
    for number in range(start + 1, len(lines) + 1):
        text = lines[number - 1]
        if _ANY_HEADER.match(text):
            return None
        if key_re.match(text):
            return number
    return None


class Located(Protocol):
    """A parsed file that can say where a key is (matrix._Doc)."""

    @property
    def path(self) -> Path: ...

    def line_at(self, parts: Sequence[str]) -> int | None: ...


def _parts(table: str | Sequence[str]) -> tuple[str, ...]:
    return tuple(table.split(".")) if isinstance(table, str) else tuple(table)


def config_error(doc: Located, table: str | Sequence[str], problem: Problem) -> ConfigError:
    """matrix.toml's error for `problem` found in [table]: "`key` in [table] <message>" at the key's line."""
    full = (*_parts(table), *problem.path)
    where, key = ".".join(full[:-1]), full[-1]
    text = (
        f"`{key}` in [{where}] {problem.message}" if problem.path else f"[{'.'.join(full)}] {problem.message}"
    )
    return ConfigError(doc.path, text, line=doc.line_at(full), fix=problem.fix)


def check(doc: Located, table: str | Sequence[str], mapping: Any, schema: Field) -> None:
    """Raise ConfigError at the offending key's line when `mapping` (matrix.toml's [table]) breaks `schema`."""
    found = first_problem(mapping, schema)
    if found is not None:
        raise config_error(doc, table, found)


__all__ = [
    "NOTHING",
    "Bool",
    "Either",
    "Enum",
    "Field",
    "Int",
    "List",
    "Located",
    "Map",
    "Number",
    "Problem",
    "Rule",
    "Str",
    "Table",
    "check",
    "config_error",
    "find_line",
    "first_problem",
    "kind_of",
]
