"""A kernel library's own arch check, read from the C++ header it ships: the gate no Python selector sees.

FlashInfer's TRT-LLM-gen runners refuse a GPU in their constructor, in the header the wheel ships
(``flashinfer/data/include/flashinfer/trtllm/fmha/fmhaRunner.cuh``)::

    explicit TllmGenFmhaRunner(...) : mSM(getSMVersion()), ... {
      FLASHINFER_CHECK(mSM == kSM_100 || mSM == kSM_103, "Unsupported architecture");

`check(header, symbol, arch)` finds `symbol`'s definition, its first ``*_CHECK(<condition>, ...)`` whose condition
reads the SM variable (a name initialised from ``getSMVersion()``, which is ``major * 10 + minor``), and evaluates
that condition for `arch` with the ``constexpr`` integer constants of the headers beside it (``kSM_100 = 100``).
The condition language is the one such checks are written in: names, integers, ``== != < <= > >=``, ``&& || !``
and parentheses; anything else leaves the gate unknown, never on.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stackfarm.analysis.arch import Arch

State = Literal["on", "off", "unknown"]

_CHECK = re.compile(r"\b[A-Z_]*CHECK\s*\(")
_SM_VAR = re.compile(r"\b(\w+)\s*(?:\(\s*|=\s*)getSMVersion\s*\(\s*\)")
_CONST = re.compile(r"\bconstexpr\s+[\w:]+\s+(\w+)\s*=\s*(\d+)\s*;")
_HEADERS = ("*.h", "*.cuh", "*.hpp")


@dataclass(frozen=True)
class CxxGate:
    """The verdict of one C++ arch check for one arch, and where it is (`line` 0 when it was not found)."""

    state: State
    line: int
    condition: str
    reason: str


def _balanced(text: str, start: int) -> str | None:
    """The text inside the parentheses opened just before `start`, or None when they never close."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def _first_argument(args: str) -> str:
    depth = 0
    for i, ch in enumerate(args):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            return args[:i]
    return args


@functools.lru_cache(maxsize=16)
def constants(include_root: Path) -> dict[str, int]:
    """Every ``constexpr <int type> NAME = <integer>;`` in the headers under `include_root`."""
    found: dict[str, int] = {}
    for pattern in _HEADERS:
        for path in sorted(include_root.rglob(pattern)):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            for name, value in _CONST.findall(text):
                found.setdefault(name, int(value))
    return found


def _evaluate(condition: str, names: dict[str, int]) -> bool | None:
    """`condition` as C++ with `names` bound; None when it uses anything outside the check language."""
    python = condition.replace("&&", " and ").replace("||", " or ")
    python = re.sub(r"!(?!=)", " not ", python)
    try:
        node = ast.parse(python.strip(), mode="eval").body
    except SyntaxError:
        return None
    value = _value(node, names)
    return value if isinstance(value, bool) else None


def _value(node: ast.expr, names: dict[str, int]) -> int | bool | None:  # one case per node type
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _value(node.operand, names)
        return None if inner is None else not inner
    if isinstance(node, ast.BoolOp):
        parts = [_value(v, names) for v in node.values]
        if any(p is None for p in parts):
            return None
        return all(parts) if isinstance(node.op, ast.And) else any(parts)
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left, right = _value(node.left, names), _value(node.comparators[0], names)
        if left is None or right is None:
            return None
        ops = {
            ast.Eq: left == right,
            ast.NotEq: left != right,
            ast.Lt: left < right,
            ast.LtE: left <= right,
            ast.Gt: left > right,
            ast.GtE: left >= right,
        }
        return ops.get(type(node.ops[0]))
    return None


def check(header: Path, symbol: str, arch: Arch, include_root: Path) -> CxxGate:
    """Whether the arch check in `symbol`'s definition in `header` lets `arch` through."""
    try:
        text = header.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return CxxGate("unknown", 0, "", f"cannot read {header}: {exc}")
    sm_vars = set(_SM_VAR.findall(text))
    start = next(
        (
            m.end()
            for m in re.finditer(rf"\b{re.escape(symbol)}\s*\(", text)
            if _balanced(text, m.end()) is not None and "{" in text[m.end() : m.end() + 2000]
        ),
        None,
    )
    if start is None:
        return CxxGate("unknown", 0, "", f"{header.name} defines no {symbol}")
    if not sm_vars:
        return CxxGate("unknown", 0, "", f"{header.name} reads no getSMVersion(): no arch check to evaluate")
    for match in _CHECK.finditer(text, start):
        args = _balanced(text, match.end())
        if args is None:
            break
        condition = " ".join(_first_argument(args).split())
        if not sm_vars & set(re.findall(r"\w+", condition)):
            continue
        line = text.count("\n", 0, match.start()) + 1
        names = {**constants(include_root), **dict.fromkeys(sm_vars, arch.major * 10 + arch.minor)}
        result = _evaluate(condition, names)
        if result is None:
            return CxxGate("unknown", line, condition, f"cannot evaluate {condition!r} for {arch}")
        sm = arch.major * 10 + arch.minor
        verdict = "admits" if result else "refuses"
        return CxxGate("on" if result else "off", line, condition, f"{condition} {verdict} SM {sm} ({arch})")
    return CxxGate("unknown", 0, "", f"{symbol} in {header.name} has no *_CHECK on the SM version")


__all__ = ["CxxGate", "check", "constants"]
