"""A small YAML writer for the emitters' documents (dicts, lists, strings, numbers, booleans, None), so that
emitting needs no YAML library: block style, a string quoted (as JSON, which YAML reads as a double-quoted
scalar) unless it is a plain word no YAML reader could take for anything else, multi-line scripts as literal
blocks. `yaml.safe_load(dump(x)) == x` for every document the emitters build (tests/test_emit.py checks it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Strings written without quotes: a letter first, then letters, digits and `_ . / -` only.
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*\Z")
#: Words YAML 1.1 readers take for booleans or null (PyYAML, GitHub's parser for `on`).
_RESERVED = frozenset(["y", "yes", "n", "no", "true", "false", "on", "off", "null"])
#: Characters YAML does not allow unescaped in a stream (outside its printable set).
_UNPRINTABLE = re.compile("[\x7f-\x84\x86-\x9f\ufffe\uffff]")
#: A line a literal block can hold as it is (no tabs, no carriage returns, no trailing blanks).
_BLOCK_LINE = re.compile(r"[^\t\r]*[^\s]\Z|\Z")


def scalar(value: object) -> str:
    """One value on one line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _RESERVED:
        return text
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m[0]):04x}", json.dumps(text, ensure_ascii=False))


def _block(text: str) -> bool:
    """Whether a string goes out as a literal block (`|`): several lines, each safe in a block."""
    lines = text.split("\n")
    return (
        len(lines) > 1
        and not text.startswith((" ", "\n"))
        and not text.endswith("\n\n")
        and all(_BLOCK_LINE.match(line) for line in lines)
        and not _UNPRINTABLE.search(text)
    )


def _lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, Mapping):
        out = []
        for key, item in value.items():
            head = f"{pad}{scalar(key)}:"
            out += _after(head, item, indent)
        return out
    out = []
    for item in value:
        if isinstance(item, Mapping | list | tuple) and item:
            inner = _lines(item, indent + 2)
            out.append(f"{pad}- {inner[0][indent + 2 :]}")
            out += inner[1:]
        else:
            out += _after(f"{pad}-", item, indent)
    return out


def _after(head: str, item: Any, indent: int) -> list[str]:
    """`head` (a key or a dash) followed by `item`, on one line or nested below it."""
    if isinstance(item, Mapping | list | tuple):
        if not item:
            return [f"{head} {'{}' if isinstance(item, Mapping) else '[]'}"]
        return [head, *_lines(item, indent + 2)]
    if isinstance(item, str) and _block(item):
        chomp = "" if item.endswith("\n") else "-"
        body = item.removesuffix("\n").split("\n")
        pad = " " * (indent + 2)
        return [f"{head} |{chomp}", *(f"{pad}{line}" if line else "" for line in body)]
    return [f"{head} {scalar(item)}"]


def dump(document: Mapping[str, Any] | Sequence[Any]) -> str:
    """One YAML document."""
    if not document:
        return ("{}" if isinstance(document, Mapping) else "[]") + "\n"
    return "\n".join(_lines(document, 0)) + "\n"


def dump_all(documents: Iterable[Mapping[str, Any]]) -> str:
    """A YAML stream: the documents separated by `---` lines (what `kubectl apply -f` reads)."""
    return "---\n" + "---\n".join(dump(d) for d in documents)


__all__ = ["dump", "dump_all", "scalar"]
