"""One Python source tree, as every source analyser reads it: modules, files, parsed ASTs and names across modules.

`SourceTree` maps dotted module names to files under one or more roots (unpacked wheels, a site-packages, a
patched copy) and back, reads each file once, and parses it through a process-wide cache keyed by the sha256 of
its bytes (`analysis.cache.digest_bytes`): the trees of several cells, or a patched tree that differs in two
files, are parsed once per process. It also resolves names the way Python binds them at import time
(`resolve_name`, `resolve_expr`) and linearises a class's bases across modules (`mro`).

Users: `pysource.Evaluator` (and through it the capability gates), `captables.scan_tables` and `flag_sites`,
`kernels.sgl_kernel_loader`, and the EAGLE-3 contract (`eagle3`). The few AST helpers they share live here too.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TypeAlias

from stackfarm.analysis.cache import digest_bytes


class SourceError(Exception):
    """A module or symbol that is not in the tree, or a file that does not parse."""


# --------------------------------------------------------------------------- parsing, once per content

_PARSED: dict[str, tuple[tuple[str, ...], ast.Module]] = {}


def _parsed(data: bytes, filename: str) -> tuple[tuple[str, ...], ast.Module]:
    key = digest_bytes(data)
    found = _PARSED.get(key)
    if found is None:
        lines = tuple(data.decode("utf-8", errors="replace").splitlines())
        found = (lines, ast.parse(data, filename=filename))
        _PARSED[key] = found
    return found


def parse_file(path: Path) -> ast.Module:
    """The AST of a Python file, parsed once per distinct content (keyed by sha256, not by path).

    Raises SyntaxError (or ValueError for NUL bytes) when it does not parse."""
    return _parsed(path.read_bytes(), str(path))[1]


# --------------------------------------------------------------------------- small AST helpers


def last_name(node: ast.AST) -> str | None:
    """``a.b.c`` -> ``c``, ``name`` -> ``name``; None for anything else."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def named_call(node: ast.AST, function: str, count: int) -> tuple[list[ast.expr], str | None] | None:
    """``function(a, "name", ...)`` called by its bare name with `count` positional arguments: (the arguments,
    the second one when it is a string constant, else None); None for any other node."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == function):
        return None
    if len(node.args) != count:
        return None
    second = node.args[1] if count > 1 else None
    text = second.value if isinstance(second, ast.Constant) and isinstance(second.value, str) else None
    return node.args, text


def caught_names(handler: ast.ExceptHandler) -> tuple[str, ...] | None:
    """The exception names an ``except`` clause lists (``except (a.KeyError, OSError)`` -> KeyError, OSError);
    None for a bare ``except:``, which catches everything."""
    if handler.type is None:
        return None
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return tuple(last_name(n) or "" for n in names)


def source_text(node: ast.AST, limit: int) -> str:
    """The node's source on one line, cut to `limit` characters."""
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def top_level(stmts: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements in source order, including those inside top-level if / try / with blocks
    (conditional imports and definitions)."""
    for stmt in stmts:
        yield stmt
        if isinstance(stmt, ast.If | ast.With):
            yield from top_level(stmt.body)
            yield from top_level(getattr(stmt, "orelse", []))
        elif isinstance(stmt, ast.Try):
            for part in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from top_level(part)


def resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in `module`."""
    if level == 0:
        return target or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, target] if target else base)


# --------------------------------------------------------------------------- names across modules


@dataclass(frozen=True)
class ClassRef:
    """A class statement found in the tree."""

    module: str
    file: Path
    node: ast.ClassDef = field(compare=False, hash=False, repr=False)

    @property
    def name(self) -> str:
        return self.node.name


@dataclass(frozen=True)
class ModuleName:
    """A module, as an import binds it."""

    name: str


#: What a name stands for: a class or a module of the tree, a dotted name outside it (str), or None (unknown).
Ref: TypeAlias = ClassRef | ModuleName | str | None
_Bindings: TypeAlias = dict[str, list[tuple[int, ast.stmt]]]


# --------------------------------------------------------------------------- the tree


class SourceTree:
    """Dotted module names -> files under `roots`; each file read once and parsed once per content.

    Two trees over the same roots (and packages) are equal: analyses keyed by a tree are then shared.
    """

    def __init__(self, roots: Sequence[Path | str], *, packages: Collection[str] | None = None) -> None:
        if isinstance(roots, str | Path):
            raise TypeError("SourceTree takes a sequence of roots: SourceTree([root])")
        self.roots = tuple(Path(r) for r in roots)
        if not self.roots:
            raise ValueError("SourceTree needs at least one root")
        #: The top-level packages that may be resolved (None: all). Where a root is a whole site-packages (host,
        #: docker), following imports into every other installed project would parse the world.
        self.packages = frozenset(packages) if packages is not None else None
        self._paths: dict[str, Path | None] = {}
        self._bytes: dict[Path, bytes] = {}
        self._bindings: dict[str, _Bindings] = {}
        self._listings: dict[str, tuple[Path, ...]] = {}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SourceTree):
            return NotImplemented
        return (self.roots, self.packages) == (other.roots, other.packages)

    def __hash__(self) -> int:
        return hash((self.roots, self.packages))

    def __repr__(self) -> str:
        return f"SourceTree({[str(r) for r in self.roots]!r})"

    @property
    def root(self) -> Path:
        """The first root: the tree under analysis (the others serve imports that leave it)."""
        return self.roots[0]

    # ----------------------------------------------------------------------- modules and files

    def path_of(self, module: str) -> Path | None:
        """The file of `module` (``a/b.py`` or ``a/b/__init__.py``) in the first root that has it."""
        if module not in self._paths:
            parts = module.split(".")
            found: Path | None = None
            if self.packages is not None and parts[0] not in self.packages:
                self._paths[module] = None
                return None
            for root in self.roots:
                base = root.joinpath(*parts)
                for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                    if candidate.is_file():
                        found = candidate
                        break
                if found:
                    break
            self._paths[module] = found
        return self._paths[module]

    def module_of(self, path: Path) -> str:
        for root in self.roots:
            try:
                rel = path.relative_to(root)
            except ValueError:
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
        raise SourceError(f"{path} is under none of {[str(r) for r in self.roots]}")

    def is_package(self, module: str) -> bool:
        path = self.path_of(module)
        return path is not None and path.name == "__init__.py"

    def files(self, folder: str) -> Iterator[Path]:
        """Every ``.py`` file under `folder` (a top-level package, or a path such as ``sglang/srt/models``)
        of each root, in a stable order (walked once per folder: the gates, flag and auto-enable passes of every
        feature all list the same packages)."""
        if folder not in self._listings:
            self._listings[folder] = tuple(
                p
                for root in self.roots
                if (root / folder).is_dir()
                for p in sorted(q for q in (root / folder).rglob("*.py") if "__pycache__" not in q.parts)
            )
        yield from self._listings[folder]

    def split(self, qualname: str) -> tuple[str, tuple[str, ...]]:
        """``a.b.C.f`` -> (``a.b``, (``C``, ``f``)): the longest prefix that is a module in the tree."""
        parts = qualname.split(".")
        for cut in range(len(parts), 0, -1):
            if self.path_of(".".join(parts[:cut])):
                return ".".join(parts[:cut]), tuple(parts[cut:])
        raise SourceError(f"no module of {qualname!r} under {[str(r) for r in self.roots]}")

    def relative(self, path: Path) -> str:
        """The path relative to the root that holds it (posix), else the path itself."""
        for root in self.roots:
            try:
                return str(PurePosixPath(path.relative_to(root)))
            except ValueError:
                continue
        return str(path)

    def site(self, path: Path, line: int) -> str:
        """``sglang/srt/models/llama.py:749``."""
        return f"{self.relative(path)}:{line}"

    # ----------------------------------------------------------------------- contents

    def read(self, path: Path) -> bytes:
        if path not in self._bytes:
            self._bytes[path] = path.read_bytes()
        return self._bytes[path]

    def digest(self, path: Path) -> str:
        """The sha256 of the file's bytes: the key of everything derived from it alone."""
        return digest_bytes(self.read(path))

    def parse(self, path: Path) -> ast.Module:
        """The file's AST (shared by every tree and file with the same bytes); SourceError if it does not parse."""
        return self._parsed(path)[1]

    def lines(self, path: Path) -> tuple[str, ...]:
        """The file's source lines (undecodable bytes replaced)."""
        return self._parsed(path)[0]

    def _parsed(self, path: Path) -> tuple[tuple[str, ...], ast.Module]:
        try:
            return _parsed(self.read(path), str(path))
        except (SyntaxError, ValueError) as exc:
            raise SourceError(f"{path}: does not parse: {exc}") from exc

    def module(self, name: str) -> ast.Module | None:
        path = self.path_of(name)
        return self.parse(path) if path else None

    # ----------------------------------------------------------------------- names across modules

    def bindings(self, module: str) -> _Bindings:
        """The module's top-level names -> the statements binding them (line, statement), in source order."""
        if module not in self._bindings:
            table: _Bindings = {}
            tree = self.module(module)
            for stmt in top_level(tree.body) if tree else ():
                for name in _bound_names(stmt):
                    table.setdefault(name, []).append((stmt.lineno, stmt))
            self._bindings[module] = table
        return self._bindings[module]

    def resolve_name(self, module: str, name: str, before: int | None = None, depth: int = 0) -> Ref:
        """What `name` is in `module` (bound before line `before`, when given), following imports in the tree."""
        if depth > 30:
            return None
        entries = self.bindings(module).get(name)
        path = self.path_of(module)
        if not entries:
            return None if path else f"{module}.{name}"
        earlier = [e for e in entries if before is None or e[0] < before]
        _line, stmt = (earlier or entries)[-1]
        if isinstance(stmt, ast.ClassDef):
            return ClassRef(module, path, stmt) if path else None
        return self._resolve_binding(module, name, stmt, depth)

    def _resolve_binding(self, module: str, name: str, stmt: ast.stmt, depth: int) -> Ref:
        """What the statement binding `name` at the top level of `module` (not a class) makes it."""
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            return self._resolve_import(module, name, stmt, depth)
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            return self.resolve_expr(module, stmt.value, stmt.lineno, depth + 1)
        return None

    def _resolve_import(self, module: str, name: str, stmt: ast.Import | ast.ImportFrom, depth: int) -> Ref:
        """The module ``import a.b`` binds, or what ``from m import name`` names in `m`."""
        if isinstance(stmt, ast.Import):
            alias = next(a for a in stmt.names if (a.asname or a.name).split(".")[0] == name)
            return ModuleName(alias.name if alias.asname else alias.name.split(".")[0])
        alias = next(a for a in stmt.names if (a.asname or a.name) == name)
        source = resolve_relative(module, self.is_package(module), stmt.level, stmt.module)
        return self._member(source, alias.name, depth)

    def resolve_expr(self, module: str, node: ast.expr, before: int | None = None, depth: int = 0) -> Ref:
        """What a name, an attribute chain or a subscripted generic (``Generic[T]``) written in `module` is."""
        if isinstance(node, ast.Name):
            return self.resolve_name(module, node.id, before, depth)
        if isinstance(node, ast.Attribute):
            base = self.resolve_expr(module, node.value, before, depth + 1)
            if isinstance(base, ModuleName):
                return self._member(base.name, node.attr, depth)
            return f"{base}.{node.attr}" if isinstance(base, str) else None
        if isinstance(node, ast.Subscript):  # Generic[T], Protocol[...]
            return self.resolve_expr(module, node.value, before, depth + 1)
        return None

    def _member(self, module: str, name: str, depth: int) -> Ref:
        """``module.name``: a submodule, a name bound in a module of the tree, or a dotted name outside it."""
        if self.path_of(f"{module}.{name}"):
            return ModuleName(f"{module}.{name}")
        if self.path_of(module):
            return self.resolve_name(module, name, None, depth + 1)
        return f"{module}.{name}"

    def bases(self, cls: ClassRef) -> list[Ref]:
        # Bases are evaluated before the class name is bound: `class LlamaModel(LlamaModel)` means the import.
        return [self.resolve_expr(cls.module, b, cls.node.lineno) for b in cls.node.bases]

    def mro(self, cls: ClassRef) -> tuple[list[ClassRef], list[str]]:
        """C3 linearisation over the classes found in the tree; bases outside it are listed as names."""
        external: list[str] = []

        def linearise(c: ClassRef, seen: frozenset[ClassRef]) -> list[ClassRef]:
            parents = []
            for ref in self.bases(c):
                if isinstance(ref, ClassRef) and ref not in seen:
                    parents.append(ref)
                elif isinstance(ref, str) and ref not in external and ref != "object":
                    external.append(ref)
            return _c3(c, [linearise(p, seen | {c}) for p in parents] + [parents])

        return linearise(cls, frozenset()), external


def _c3(head: ClassRef, seqs: list[list[ClassRef]]) -> list[ClassRef]:
    out = [head]
    while any(seqs):
        first = _c3_head(seqs)
        if first is None:  # inconsistent hierarchy: Python would refuse it; fall back to depth-first order
            return _depth_first(out, seqs)
        out.append(first)
        seqs = [s[1:] if s and s[0] == first else s for s in seqs]
    return out


def _depth_first(out: list[ClassRef], seqs: list[list[ClassRef]]) -> list[ClassRef]:
    """`out`, then what the sequences still hold, in order, each once."""
    rest = [x for s in seqs for x in s]
    return out + [x for i, x in enumerate(rest) if x not in rest[:i] and x not in out]


def _c3_head(seqs: list[list[ClassRef]]) -> ClassRef | None:
    """The first head that is in no other sequence's tail (C3's next class); None when there is none."""
    for seq in seqs:
        if seq and not any(seq[0] in s[1:] for s in seqs):
            return seq[0]
    return None


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return [stmt.name]
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    return _assigned_names(stmt)


def _assigned_names(stmt: ast.stmt) -> list[str]:
    """The plain names an assignment binds (``x = ...``, ``x: T = ...``; a bare annotation binds none)."""
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
        return [stmt.target.id]
    return []


__all__ = [
    "ClassRef",
    "ModuleName",
    "Ref",
    "SourceError",
    "SourceTree",
    "caught_names",
    "last_name",
    "named_call",
    "parse_file",
    "resolve_relative",
    "source_text",
    "top_level",
]
