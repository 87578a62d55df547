"""Reading TOML (matrix.toml): the standard library's :mod:`tomllib` (``tomli`` on Python 3.10), whose errors
become ConfigErrors naming the file, the line and the column, and for a key or a table written twice the
second definition (the error's line) and the first.

Every reader of TOML goes through here; tomlkit is only for writing a TOML file with its comments kept.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (a conditional dependency in pyproject.toml)
    import tomli as tomllib

#: "Invalid value (at line 3, column 9)": where Python < 3.14 and tomli < 2.1 say it (no lineno attribute).
_AT = re.compile(r"^(?P<msg>.*?)\s*\(at (?:line (?P<line>\d+), column (?P<col>\d+)|end of document)\)$", re.S)
#: A key at the start of a line: bare, "quoted" or 'literal' parts, dotted.
_KEY = re.compile(
    r"""^\s*(?P<key>(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""
)
_HEADER = re.compile(r"^\s*\[")


def loads(path: Path | str, text: str) -> dict[str, Any]:
    """The TOML document ``text`` (the file ``path``) as plain dicts and lists; ConfigError when it does not
    parse, at the line and column tomllib names."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message, line, column = _position(exc, text)
        where = f" (line {line}, column {column})" if line and column else ""
        raise ConfigError(
            path,
            f"malformed TOML: {_explain(message, text.splitlines(), line)}{where}",
            line=line,
            fix="correct the syntax there",
        ) from None


def _position(exc: ValueError, text: str) -> tuple[str, int | None, int | None]:
    """(message without its position, line, column) of a TOMLDecodeError of any Python / tomli version."""
    line: int | None = getattr(exc, "lineno", None)
    column: int | None = getattr(exc, "colno", None)
    message = str(getattr(exc, "msg", "") or exc)
    found = _AT.match(message)
    if found:
        message = found.group("msg")
        if line is None and found.group("line"):
            line, column = int(found.group("line")), int(found.group("col"))
        elif line is None:  # at the end of the document
            line = max(1, len(text.splitlines()))
    return message, line, column


def _explain(message: str, lines: list[str], line: int | None) -> str:
    """tomllib's message, in words that name what is written twice and where it was first."""
    declared = re.fullmatch(r"Cannot declare (\(.*\)) twice", message)
    if declared:
        try:
            parts = ast.literal_eval(declared.group(1))
        except (ValueError, SyntaxError):
            return message
        name = ".".join(str(p) for p in parts)
        first = _first_header(lines, [str(p) for p in parts], before=line)
        return f"[{name}] is defined twice" + (f" (first at line {first})" if first else "")
    if message == "Cannot overwrite a value" and line is not None and 0 < line <= len(lines):
        key = _KEY.match(lines[line - 1])
        if key is None:
            return message
        name = _plain(key.group("key"))
        first = _first_key(lines, name, before=line)
        return f"`{name}` is defined twice" + (f" (first at line {first})" if first else "")
    return message


def _plain(key: str) -> str:
    """A dotted key as its parts name it: ``"a" . 'b'`` is ``a.b``."""
    return ".".join(
        part.strip().strip("\"'") for part in re.split(r"\.(?=(?:[^\"']|\"[^\"]*\"|'[^']*')*$)", key)
    )


def _first_header(lines: list[str], parts: list[str], *, before: int | None) -> int | None:
    """The line of the first ``[a.b]`` / ``[[a.b]]`` header of the table ``parts``, before line ``before``."""
    pattern = r"\s*\.\s*".join(r"""["']?""" + re.escape(p) + r"""["']?""" for p in parts)
    header = re.compile(r"^\s*\[\[?\s*" + pattern + r"\s*\]\]?\s*(#.*)?$")
    end = (before or len(lines) + 1) - 1
    return next((n for n, text in enumerate(lines[:end], 1) if header.match(text)), None)


def _first_key(lines: list[str], name: str, *, before: int) -> int | None:
    """The line where ``name`` was first set in the table that line ``before`` is in."""
    for number in range(before - 1, 0, -1):
        text = lines[number - 1]
        key = _KEY.match(text)
        if key is not None and _plain(key.group("key")) == name:
            return number
        if _HEADER.match(text):
            return None
    return None


__all__ = ["loads"]
