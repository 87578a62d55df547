"""Upstreamed: the definitions a patch adds, and whether a release defines them itself.

A patch that only adds definitions (methods, classes, table keys) is upstreamed when the release defines
every one of them, whatever their bodies: applying it would define them twice.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from .model import Hunk, Patch

_DEF = re.compile(r"^(\s*)(?:async\s+)?(def|class)\s+([A-Za-z_]\w*)")
_ASSIGN = re.compile(r"^(\s*)([A-Za-z_]\w*)\s*(?::[^=]+)?=\s*[\[{(]\s*$")
_KEY = re.compile(r"^(\s*)(-?\d+|'[^']*'|\"[^\"]*\")\s*:")

#: One step of a path to a definition: ("class"|"def"|"assign"|"key", name or literal key).
Step = tuple[str, str]


def _definition(line: str) -> tuple[int, Step] | None:
    for pattern, kind in ((_DEF, ""), (_ASSIGN, "assign"), (_KEY, "key")):
        match = pattern.match(line)
        if match:
            if kind == "":
                return len(match[1]), (match[2], match[3])
            return len(match[1]), (kind, match[2])
    return None


def _continues(inside: int | None, text: str) -> bool:
    """Whether a non-blank line sits inside the added definition indented by ``inside`` (deeper, or its
    closing bracket at the same indentation)."""
    if inside is None:
        return False
    indent = len(text) - len(text.lstrip())
    return indent > inside or (indent == inside and text.strip()[:1] in ")]}")


def _leave_scopes(stack: list[tuple[int, Step]], text: str) -> None:
    """Pop the scopes a non-blank line is not inside of (a closing bracket stays in its own scope)."""
    indent = len(text) - len(text.lstrip())
    closing = text.strip()[:1] in ")]}"
    while stack and stack[-1][0] >= indent and not (closing and stack[-1][0] == indent):
        stack.pop()


def added_definitions(hunk: Hunk) -> tuple[tuple[Step, ...], ...] | None:
    """The definitions (paths like class/def, or assign/key for table entries) that the hunk adds.

    None when the hunk changes anything besides whole added definitions -- an edited condition, a removed
    line -- because then "the names exist upstream" says nothing about whether upstream made the change.
    Indentation gives the nesting (SGLang is black-formatted); the hunk heading seeds the outer scope.
    """
    stack: list[tuple[int, Step]] = []
    seed = _definition(hunk.heading) if hunk.heading else None
    if seed is not None and seed[0] == 0:
        stack.append(seed)
    added: list[tuple[Step, ...]] = []
    inside: int | None = None  # indentation of the added definition we are in
    pending_decorator = False
    for raw in hunk.body:
        kind, text = raw[:1], raw[1:]
        if kind == "\\":
            continue
        if kind == "-":
            if text.strip():
                return None
            continue
        blank = not text.strip()
        if not blank:
            if _continues(inside, text) and kind == "+":
                continue  # a line of the added definition we are in
            # Any other line ends that definition (a context line in its middle, too).
            inside = None
            _leave_scopes(stack, text)
        definition = None if blank else _definition(text)
        if kind == "+":
            if blank or text.strip().startswith("#"):
                continue
            if text.strip().startswith("@"):
                pending_decorator = True
                continue
            if definition is None:
                return None
            added.append((*(step for _, step in stack), definition[1]))
            inside = definition[0]
            pending_decorator = False
            continue
        if pending_decorator:
            return None
        if definition is not None:
            stack.append(definition)
    return tuple(added) if added else None


def _find(nodes: Iterable[ast.AST], step: Step) -> ast.AST | None:
    kind, name = step
    for node in nodes:
        if kind == "class" and isinstance(node, ast.ClassDef) and node.name == name:
            return node
        if kind == "def" and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
        if kind == "assign":
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if kind == "key" and isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                with contextlib.suppress(ValueError, TypeError, SyntaxError):
                    if key is not None and ast.literal_eval(key) == ast.literal_eval(name):
                        return value
    return None


def _children(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Dict):
        return [node]
    body = getattr(node, "body", None)
    return list(body) if isinstance(body, list) else [node]


def defined_in(source: str, path: Sequence[Step]) -> int | None:
    """The line where ``source`` defines ``path`` (looking through nested scopes), or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    current: list[ast.AST] = list(tree.body)
    found: ast.AST | None = None
    for step in path:
        found = _find(current, step)
        if found is None:
            # The hunk heading names only the outermost scope: look one level deeper for the next step.
            for node in ast.walk(
                ast.Module(body=[n for n in current if isinstance(n, ast.stmt)], type_ignores=[])
            ):
                found = _find(_children(node), step) if node is not tree else None
                if found is not None:
                    break
        if found is None:
            return None
        current = _children(found)
    return getattr(found, "lineno", None)


def _name(path: Sequence[Step]) -> str:
    out = ""
    for kind, name in path:
        out += f"[{name}]" if kind == "key" else (f".{name}" if out else name)
    return out


def _text_in(tree: Path, rel: str) -> str | None:
    """The text of ``tree/rel``, or None when there is no such file."""
    path = tree / rel
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


def upstream_evidence(patch: Patch, tree: Path | Callable[[str], str | None]) -> str | None:
    """Why the release at ``tree`` already has this patch's change, or None when that cannot be shown.

    ``tree`` is an unpacked wheel, or a function from a tree-relative path to the file's text (or None).
    """
    read = tree if callable(tree) else functools.partial(_text_in, tree)
    found: list[str] = []
    for fp in patch.files:
        source = read(fp.path) if fp.old_path is not None and fp.path.endswith(".py") else None
        if source is None:
            return None
        for hunk in fp.hunks:
            paths = added_definitions(hunk)
            if paths is None:
                return None
            for path in paths:
                line = defined_in(source, path)
                if line is None:
                    return None
                found.append(f"{fp.path}:{line} {_name(path)}")
    return "upstream defines everything it adds: " + "; ".join(found) if found else None


__all__ = [
    "added_definitions",
    "defined_in",
    "upstream_evidence",
]
