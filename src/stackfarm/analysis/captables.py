"""Capability-keyed tables and feature gates in a Python tree, found with `ast`, judged for a target GPU.

**Tables.** SGLang keeps per-architecture settings in dict literals keyed by the compute-capability major
(``{9: ..., 10: ...}``), by ``major * 10 + minor`` or by ``(major, minor)``, and looks them up with a value that
came from ``torch.cuda.get_device_capability()``. A subscript lookup of a missing key crashes (SGLang 0.5.9 on
sm_120: ``KeyError: 12``); ``.get`` or ``in`` turns the feature off without a word. Nothing here is a hand list:

1. every module is summarised once into `ModuleFacts` (imports, dict literals, what each function returns and
   each name holds as a symbolic *flow* such as ``index(cap, 0)``, and every lookup whose key has a flow); the
   summary is a pure function of the file's bytes, cached by its sha256;
2. flows are resolved across modules (``major, minor = ...``, ``self.cc = ...[0]``, helpers that return the
   capability, re-exports through ``from x import *``) into a key kind: ``major``, ``minor``, ``sm`` or ``pair``;
3. a lookup with a capability-kind key into a dict literal is a `CapLookup`.

Only files that can hold capability flows are parsed: those that call ``get_device_capability`` /
``get_device_properties``, then, to a fixpoint, those that mention a name found to carry a capability.

**Gates.** `evaluate_gate` runs a feature's deciding function with `pysource.Evaluator` for one GPU and says
whether the GPU alone turns it off (and where), or crashes it. `flag_sites` finds every condition that reads a
server argument of the feature, so a gate nobody listed still shows up.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stackfarm.analysis.arch import Arch, ArchError, parse_target
from stackfarm.analysis.cache import JsonCache, digest_bytes
from stackfarm.analysis.pysource import (
    UNKNOWN,
    Crash,
    End,
    Evaluator,
    Instance,
    SourceError,
    SourceTree,
    function_locals,
    resolve_relative,
    truth,
)

#: Bump when ModuleFacts change shape or meaning: cached summaries of the old version are then ignored.
FACTS_VERSION = "captables-facts-1"
_SOURCES = (b"get_device_capability", b"get_device_properties")

Flow = tuple[Any, ...]
KeyKind = Literal["major", "minor", "sm", "pair"]
_KEY_KINDS: dict[str, KeyKind] = {"major": "major", "minor": "minor", "sm": "sm", "pair": "pair"}
Style = Literal["subscript", "get", "in", "not in"]
TableVerdict = Literal["ok", "missing-crash", "missing-graceful"]
GateState = Literal["on", "off", "crash", "unknown"]


class FeatureError(ValueError):
    """matrix.toml's [features] table is malformed; the message names the key and the fix."""


# --------------------------------------------------------------------------- per-module facts


@dataclass(frozen=True)
class TableDef:
    """A dict literal bound to a module, class or function-local name."""

    name: str
    line: int
    #: The keys, when every one is a constant (an int or a tuple of ints); None when some key is computed.
    keys: tuple[Any, ...] | None
    #: The first key that is not a constant, as source text.
    computed: str | None = None


@dataclass(frozen=True)
class LookupFact:
    line: int
    symbol: str
    style: Style
    key: Flow
    container: Flow
    text: str
    #: Why a subscript cannot raise (an enclosing ``if key in table`` or ``except KeyError``), or None.
    guard: str | None = None


@dataclass(frozen=True)
class ModuleFacts:
    module: str
    imports: Mapping[str, str]
    stars: tuple[str, ...]
    tables: Mapping[str, TableDef]
    defs: Mapping[str, Flow]
    lookups: tuple[LookupFact, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "imports": dict(self.imports),
            "stars": list(self.stars),
            "tables": {k: [t.name, t.line, _enc(t.keys), t.computed] for k, t in self.tables.items()},
            "defs": {k: _enc(v) for k, v in self.defs.items()},
            "lookups": [[x.line, x.symbol, x.style, _enc(x.key), _enc(x.container), x.text, x.guard]
                        for x in self.lookups],
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModuleFacts:
        tables = {k: TableDef(n, ln, _dec(keys), comp) for k, (n, ln, keys, comp) in data["tables"].items()}
        lookups = tuple(
            LookupFact(ln, sym, style, _dec(key), _dec(cont), text, guard)
            for ln, sym, style, key, cont, text, guard in data["lookups"]
        )
        return cls(
            module=data["module"], imports=data["imports"], stars=tuple(data["stars"]), tables=tables,
            defs={k: _dec(v) for k, v in data["defs"].items()}, lookups=lookups,
        )  # fmt: skip


def _enc(value: Any) -> Any:
    if isinstance(value, tuple):
        return {"t": [_enc(v) for v in value]}
    return value


def _dec(value: Any) -> Any:
    if isinstance(value, dict) and "t" in value:
        return tuple(_dec(v) for v in value["t"])
    if isinstance(value, list):
        return [_dec(v) for v in value]
    return value


def _text(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 120 else text[:117] + "..."


def _const_key(node: ast.expr, consts: Mapping[str, Any]) -> tuple[bool, Any]:
    if isinstance(node, ast.Name) and node.id in consts:
        return True, consts[node.id]
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return False, None
    ok = isinstance(value, int) or (isinstance(value, tuple) and all(isinstance(v, int) for v in value))
    return ok, value


def _table(name: str, node: ast.Dict, consts: Mapping[str, Any]) -> TableDef:
    keys: list[Any] = []
    for key in node.keys:
        if key is None:
            return TableDef(name, node.lineno, None, "**" + _text(node.values[len(keys)]))
        ok, value = _const_key(key, consts)
        if not ok:
            return TableDef(name, node.lineno, None, _text(key))
        keys.append(value)
    return TableDef(name, node.lineno, tuple(keys))


class _Collector:
    """Walks one module once and writes its `ModuleFacts`."""

    def __init__(self, module: str, is_package: bool, tree: ast.Module) -> None:
        self.module = module
        self.is_package = is_package
        self.imports: dict[str, str] = {}
        self.stars: list[str] = []
        self.tables: dict[str, TableDef] = {}
        self.defs: dict[str, Flow] = {}
        self.lookups: list[LookupFact] = []
        self.consts: dict[str, Any] = {}
        self.names: set[str] = set()
        self.classes: set[str] = set()
        for stmt in _flat(tree.body):
            self._declare(stmt)

    def facts(self, tree: ast.Module) -> ModuleFacts:
        self._block(tree.body, env=None, symbol="<module>", cls=None, guards=())
        return ModuleFacts(
            module=self.module, imports=self.imports, stars=tuple(self.stars), tables=self.tables,
            defs=self.defs, lookups=tuple(self.lookups),
        )  # fmt: skip

    # ----------------------------------------------------------------------- names

    def _declare(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                local = alias.asname or alias.name.split(".")[0]
                self.imports[local] = alias.name if alias.asname else local
        elif isinstance(stmt, ast.ImportFrom):
            base = resolve_relative(self.module, self.is_package, stmt.level, stmt.module)
            for alias in stmt.names:
                if alias.name == "*":
                    self.stars.append(base)
                else:
                    self.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            self.names.add(stmt.name)
        elif isinstance(stmt, ast.ClassDef):
            self.names.add(stmt.name)
            self.classes.add(stmt.name)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                for node in ast.walk(target):
                    if isinstance(node, ast.Name):
                        self.names.add(node.id)
                        self.imports.pop(node.id, None)
            value = stmt.value
            if len(targets) == 1 and isinstance(targets[0], ast.Name) and value is not None:
                ok, const = _const_key(value, self.consts)
                if ok:
                    self.consts[targets[0].id] = const

    def _ref(self, name: str, env: Mapping[str, Flow | None] | None) -> Flow | None:
        if env is not None and name in env:
            return env[name]
        if name in self.imports:
            return ("global", self.imports[name])
        if name in self.names:
            return ("global", f"{self.module}.{name}")
        return None

    def _dotted(self, node: ast.expr, env: Mapping[str, Flow | None] | None, cls: str | None) -> str | None:
        """The fully qualified name an attribute chain stands for: ``utils.f`` -> ``pkg.utils.f``."""
        if isinstance(node, ast.Name):
            if cls is not None and node.id in ("self", "cls"):
                return f"{self.module}.{cls}"
            if env is not None and node.id in env:
                return None
            ref = self._ref(node.id, None)
            return ref[1] if ref else None
        if isinstance(node, ast.Attribute):
            base = self._dotted(node.value, env, cls)
            return f"{base}.{node.attr}" if base else None
        return None

    # ----------------------------------------------------------------------- flows

    def flow(self, node: ast.expr, env: Mapping[str, Flow | None] | None, cls: str | None) -> Flow | None:
        if isinstance(node, ast.Call):
            func = node.func
            last = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if last == "get_device_capability":
                return ("cap",)
            if last == "get_device_properties":
                return ("props",)
            if isinstance(func, ast.Name) and func.id in ("int", "tuple") and len(node.args) == 1:
                return self.flow(node.args[0], env, cls)
            dotted = self._dotted(func, env, cls)
            return ("call", dotted) if dotted else None
        if isinstance(node, ast.Subscript):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
                inner = self.flow(node.value, env, cls)
                return ("index", inner, node.slice.value) if inner else None
            return None
        if isinstance(node, ast.Attribute):
            if node.attr in ("major", "minor"):
                inner = self.flow(node.value, env, cls)
                if inner:
                    return ("attr", inner, node.attr)
            dotted = self._dotted(node, env, cls)
            return ("global", dotted) if dotted else None
        if isinstance(node, ast.Name):
            return self._ref(node.id, env)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            for scaled, rest in ((node.left, node.right), (node.right, node.left)):
                if (
                    isinstance(scaled, ast.BinOp)
                    and isinstance(scaled.op, ast.Mult)
                    and isinstance(scaled.right, ast.Constant)
                    and scaled.right.value == 10
                ):
                    major, minor = self.flow(scaled.left, env, cls), self.flow(rest, env, cls)
                    return ("sm", major, minor) if major and minor else None
            return None
        if isinstance(node, ast.Tuple) and len(node.elts) == 2:
            major, minor = self.flow(node.elts[0], env, cls), self.flow(node.elts[1], env, cls)
            return ("pair", major, minor) if major and minor else None
        return None

    # ----------------------------------------------------------------------- statements

    def _block(
        self,
        body: Sequence[ast.stmt],
        env: dict[str, Flow | None] | None,
        symbol: str,
        cls: str | None,
        guards: tuple[str, ...],
    ) -> None:
        for stmt in body:
            self._statement(stmt, env, symbol, cls, guards)
            exit_guard = _early_exit_guard(stmt)
            if exit_guard is not None:
                guards = (*guards, exit_guard)

    def _statement(
        self,
        stmt: ast.stmt,
        env: dict[str, Flow | None] | None,
        symbol: str,
        cls: str | None,
        guards: tuple[str, ...],
    ) -> None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            self._function(stmt, env, symbol, cls)
            return
        if isinstance(stmt, ast.ClassDef):
            if env is None and symbol == "<module>":
                self._class(stmt)
            return
        self._lookups(stmt, env, symbol, cls, guards)
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                self._assign(target, stmt.value, env, symbol, cls)
        elif isinstance(stmt, ast.Return) and stmt.value is not None and symbol != "<module>":
            flow = self.flow(stmt.value, env, cls)
            if flow is not None:
                self.defs.setdefault(symbol, flow)
        elif isinstance(stmt, ast.If):
            inner = _membership_guard(stmt.test)
            self._block(stmt.body, env, symbol, cls, (*guards, inner) if inner else guards)
            self._block(stmt.orelse, env, symbol, cls, guards)
        elif isinstance(stmt, ast.Try):
            caught = any(_catches_key_error(h) for h in stmt.handlers)
            self._block(stmt.body, env, symbol, cls, (*guards, "*") if caught else guards)
            for handler in stmt.handlers:
                self._block(handler.body, env, symbol, cls, guards)
            self._block(stmt.orelse, env, symbol, cls, guards)
            self._block(stmt.finalbody, env, symbol, cls, guards)
        elif isinstance(stmt, ast.With | ast.AsyncWith | ast.For | ast.AsyncFor | ast.While):
            self._block(stmt.body, env, symbol, cls, guards)
            self._block(getattr(stmt, "orelse", []), env, symbol, cls, guards)

    def _assign(
        self,
        target: ast.expr,
        value: ast.expr,
        env: dict[str, Flow | None] | None,
        symbol: str,
        cls: str | None,
    ) -> None:
        if isinstance(target, ast.Name):
            if isinstance(value, ast.Dict):
                scope = target.id if env is None else f"{symbol}.<locals>.{target.id}"
                name = f"{cls}.{target.id}" if cls and env is None else scope
                self.tables[name] = _table(name, value, self.consts)
                if env is not None:
                    env[target.id] = ("global", f"{self.module}.{name}")
                return
            flow = self.flow(value, env, cls)
            if env is None:
                key = f"{cls}.{target.id}" if cls else target.id
                if flow is not None:
                    self.defs[key] = flow
            else:
                env[target.id] = flow
        elif isinstance(target, ast.Tuple | ast.List):
            if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
                for sub, sub_value in zip(target.elts, value.elts, strict=True):
                    self._assign(sub, sub_value, env, symbol, cls)
                return
            whole = self.flow(value, env, cls)
            for i, sub in enumerate(target.elts):
                if isinstance(sub, ast.Name):
                    flow = ("index", whole, i) if whole else None
                    if env is None:
                        if flow:
                            self.defs[sub.id] = flow
                    else:
                        env[sub.id] = flow
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id in ("self", "cls")
            and cls is not None
        ):
            flow = self.flow(value, env, cls)
            if flow is not None:
                self.defs.setdefault(f"{cls}.{target.attr}", flow)

    def _function(
        self,
        node: ast.FunctionDef | ast.AsyncFunctionDef,
        outer: dict[str, Flow | None] | None,
        outer_symbol: str,
        cls: str | None,
    ) -> None:
        if outer is None:
            symbol = f"{cls}.{node.name}" if cls else node.name
        else:
            symbol = f"{outer_symbol}.<locals>.{node.name}"
        env: dict[str, Flow | None] = dict(outer or {})
        for arg in (
            *node.args.posonlyargs,
            *node.args.args,
            *node.args.kwonlyargs,
            node.args.vararg,
            node.args.kwarg,
        ):
            if arg is not None:
                env[arg.arg] = None
        self._block(node.body, env, symbol, cls, ())

    def _class(self, node: ast.ClassDef) -> None:
        for stmt in node.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                self._function(stmt, None, "", node.name)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    self._assign(target, stmt.value, None, node.name, node.name)

    def _lookups(
        self,
        stmt: ast.stmt,
        env: Mapping[str, Flow | None] | None,
        symbol: str,
        cls: str | None,
        guards: tuple[str, ...],
    ) -> None:
        for node in _expressions(stmt):
            found = _lookup_parts(node)
            if found is None:
                continue
            style, container_node, key_node = found
            key = self.flow(key_node, env, cls)
            if key is None:
                continue
            container = self.flow(container_node, env, cls)
            if container is None or container[0] != "global":
                continue
            container_text = _text(container_node)
            guard = next((g for g in guards if g in ("*", container_text)), None)
            self.lookups.append(
                LookupFact(node.lineno, symbol, style, key, container, _text(node),
                           guard=("except KeyError" if guard == "*" else f"`in {guard}` check") if guard else None)
            )  # fmt: skip


def _flat(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements, including those inside top-level if / try / with blocks."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.With):
            yield from _flat(stmt.body)
            yield from _flat(getattr(stmt, "orelse", []))
        elif isinstance(stmt, ast.Try):
            for part in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from _flat(part)


def _expressions(stmt: ast.stmt) -> Iterator[ast.expr]:
    """The expressions a statement evaluates itself (not those of nested blocks or functions)."""
    skip: tuple[str, ...] = ("body", "orelse", "finalbody", "handlers")
    for name, value in ast.iter_fields(stmt):
        if name in skip:
            continue
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, ast.expr):
                for sub in ast.walk(item):
                    if isinstance(sub, ast.expr) and not isinstance(sub, ast.Lambda):
                        yield sub
            elif isinstance(item, ast.withitem):
                yield from (s for s in ast.walk(item.context_expr) if isinstance(s, ast.expr))


def _lookup_parts(node: ast.expr) -> tuple[Style, ast.expr, ast.expr] | None:
    """(style, container, key) when `node` looks a key up: ``T[k]``, ``T.get(k)``, ``k in T`` / ``T.keys()``."""
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Load)
        and not isinstance(node.slice, ast.Slice)
    ):
        return "subscript", node.value, node.slice
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
    ):
        return "get", node.func.value, node.args[0]
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In | ast.NotIn):
        container = node.comparators[0]
        if (
            isinstance(container, ast.Call)
            and isinstance(container.func, ast.Attribute)
            and container.func.attr == "keys"
            and not container.args
        ):
            container = container.func.value
        return ("in" if isinstance(node.ops[0], ast.In) else "not in"), container, node.left
    return None


def _membership_guard(test: ast.expr) -> str | None:
    """``if key in TABLE:`` guards subscripts of TABLE in its body."""
    for node in ast.walk(test):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In):
            return _text(node.comparators[0])
    return None


def _early_exit_guard(stmt: ast.stmt) -> str | None:
    """``if key not in TABLE: return`` guards subscripts of TABLE in the statements after it."""
    if not isinstance(stmt, ast.If) or not stmt.body:
        return None
    if not isinstance(stmt.body[-1], ast.Return | ast.Raise | ast.Continue | ast.Break):
        return None
    test = stmt.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.NotIn):
        return _text(test.comparators[0])
    return None


def _catches_key_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(
        (n.attr if isinstance(n, ast.Attribute) else n.id if isinstance(n, ast.Name) else "")
        in ("KeyError", "LookupError", "Exception", "BaseException")
        for n in names
    )


def module_facts(module: str, is_package: bool, source: bytes) -> ModuleFacts:
    """The summary of one module (a pure function of its name and bytes). Raises SyntaxError if it does not parse."""
    tree = ast.parse(source)
    return _Collector(module, is_package, tree).facts(tree)


# --------------------------------------------------------------------------- resolving flows across modules


@dataclass(frozen=True)
class CapLookup:
    """A lookup into a dict literal with a key that comes from the device's compute capability."""

    table: TableDef
    table_module: str
    table_path: str
    module: str
    path: str
    lookup: LookupFact
    kind: KeyKind

    def target_key(self, gpu: Arch) -> Any:
        return {"major": gpu.major, "minor": gpu.minor, "sm": gpu.sm, "pair": (gpu.major, gpu.minor)}[
            self.kind
        ]

    def verdict(self, gpu: Arch) -> TableVerdict | None:
        """``ok`` when the GPU's key is there, else how the miss shows; None when the keys are computed."""
        if self.table.keys is None:
            return None
        if self.target_key(gpu) in self.table.keys:
            return "ok"
        if self.lookup.style == "subscript" and self.lookup.guard is None:
            return "missing-crash"
        return "missing-graceful"


@dataclass
class Scan:
    """The capability lookups of one tree, and what it cost."""

    lookups: tuple[CapLookup, ...]
    files_total: int
    files_parsed: int
    cache_hits: int
    #: Files that did not parse (a message each); they are skipped, never fatal.
    problems: tuple[str, ...] = ()


class _Resolver:
    def __init__(self, tree: SourceTree, cache: JsonCache | None) -> None:
        self.tree = tree
        self.cache = cache
        self._facts: dict[str, ModuleFacts | None] = {}
        self._kinds: dict[Flow, str | None] = {}
        self.parsed = 0
        self.hits = 0
        self.problems: list[str] = []

    def facts(self, module: str) -> ModuleFacts | None:
        if module in self._facts:
            return self._facts[module]
        path = self.tree.path_of(module)
        result: ModuleFacts | None = None
        if path is not None:
            source = self.tree.read(path)
            key = digest_bytes(f"{FACTS_VERSION}\0{module}\0".encode() + source)
            cached = self.cache.get(key) if self.cache else None
            if cached is not None:
                self.hits += 1
                result = ModuleFacts.from_json(cached)
            else:
                try:
                    result = module_facts(module, path.name == "__init__.py", source)
                except (SyntaxError, ValueError, RecursionError) as exc:
                    self.problems.append(f"{self.tree.relative(path)}: skipped, does not parse ({exc})")
                    result = None
                else:
                    self.parsed += 1
                    if self.cache:
                        self.cache.put(key, result.to_json())
        self._facts[module] = result
        return result

    def _find(self, qualname: str, want: Literal["def", "table"], depth: int = 0) -> tuple[str, Any] | None:
        """Where `qualname` is defined: (module, flow) for a def, (module, TableDef) for a table."""
        if depth > 16:
            return None
        try:
            module, attrs = self.tree.split(qualname)
        except SourceError:
            return None
        facts = self.facts(module)
        if facts is None or not attrs:
            return None
        key = ".".join(attrs)
        if want == "table" and key in facts.tables:
            return module, facts.tables[key]
        if key in facts.defs:
            flow = facts.defs[key]
            if want == "def":
                return module, flow
            if flow[0] == "global":  # an alias: TABLE = OTHER_TABLE
                return self._find(flow[1], want, depth + 1)
            return None
        if attrs[0] in facts.imports:
            return self._find(".".join([facts.imports[attrs[0]], *attrs[1:]]), want, depth + 1)
        for star in facts.stars:
            found = self._find(f"{star}.{key}", want, depth + 1)
            if found:
                return found
        return None

    def kind(self, flow: Flow | None, depth: int = 0) -> str | None:
        if flow is None or depth > 24:
            return None
        if flow in self._kinds:
            return self._kinds[flow]
        self._kinds[flow] = None  # a cycle resolves to nothing
        tag = flow[0]
        result: str | None = None
        if tag == "cap":
            result = "pair"
        elif tag == "props":
            result = "props"
        elif tag == "index":
            inner = self.kind(flow[1], depth + 1)
            result = {0: "major", 1: "minor"}.get(flow[2]) if inner == "pair" else None
        elif tag == "attr":
            result = flow[2] if self.kind(flow[1], depth + 1) in ("pair", "props") else None
        elif tag in ("sm", "pair"):
            major, minor = self.kind(flow[1], depth + 1), self.kind(flow[2], depth + 1)
            result = tag if (major, minor) == ("major", "minor") else None
        elif tag in ("call", "global"):
            found = self._find(flow[1], "def")
            result = self.kind(found[1], depth + 1) if found else None
        self._kinds[flow] = result
        return result

    def table(self, container: Flow) -> tuple[str, TableDef] | None:
        found = self._find(container[1], "table")
        return (found[0], found[1]) if found else None


def _capability_names(resolver: _Resolver, modules: Sequence[str]) -> set[str]:
    names: set[str] = set()
    for module in modules:
        facts = resolver.facts(module)
        if facts is None:
            continue
        for name, flow in facts.defs.items():
            if resolver.kind(flow) in ("pair", "props", "major", "minor", "sm"):
                names.add(name.rsplit(".", 1)[-1])
    return names


def scan_tables(tree: SourceTree, packages: Sequence[str], cache: JsonCache | None = None) -> Scan:
    """Every capability-keyed dict lookup in `packages` (top-level package names) of `tree`."""
    resolver = _Resolver(tree, cache)
    files = [p for package in packages for p in tree.files(package)]
    texts = {p: tree.read(p) for p in files}
    chosen = [p for p in files if any(s in texts[p] for s in _SOURCES)]
    modules = [tree.module_of(p) for p in chosen]
    seen_names: set[str] = set()
    while True:
        names = _capability_names(resolver, modules) - seen_names
        if not names:
            break
        seen_names |= names
        pattern = re.compile(rb"\b(?:" + b"|".join(re.escape(n.encode()) for n in sorted(names)) + rb")\b")
        more = [p for p in files if p not in chosen and pattern.search(texts[p])]
        chosen += more
        modules += [tree.module_of(p) for p in more]
    out: dict[tuple[str, int, str, str], CapLookup] = {}
    for module, path in zip(modules, chosen, strict=True):
        facts = resolver.facts(module)
        if facts is None:
            continue
        for lookup in facts.lookups:
            kind = _KEY_KINDS.get(resolver.kind(lookup.key) or "")
            if kind is None:
                continue
            found = resolver.table(lookup.container)
            if found is None:
                continue
            table_module, table = found
            table_path = tree.path_of(table_module)
            cap = CapLookup(
                table=table, table_module=table_module, table_path=tree.relative(table_path) if table_path else "",
                module=module, path=tree.relative(path), lookup=lookup, kind=kind,
            )  # fmt: skip
            out.setdefault((cap.path, lookup.line, lookup.style, table.name), cap)
    lookups = tuple(sorted(out.values(), key=lambda c: (c.path, c.lookup.line, c.lookup.style)))
    return Scan(lookups, len(files), resolver.parsed, resolver.hits, tuple(resolver.problems))


# --------------------------------------------------------------------------- features and gates


@dataclass(frozen=True)
class Feature:
    """One entry of matrix.toml's [features]: a capability the deployment wants."""

    name: str
    #: Candidate deciding functions, "module:qualname"; every one present in the tree is evaluated.
    gates: tuple[str, ...] = ()
    #: Server arguments that switch the feature on; every condition reading one is evaluated too.
    flags: tuple[str, ...] = ()
    #: Globs (relative to a component's tree) of the binaries the feature needs.
    libs: tuple[str, ...] = ()
    #: Target archs where the feature is expected off, with the reason.
    off: Mapping[Arch, str] = field(default_factory=dict)


_FEATURE_KEYS = ("gate", "flags", "libs", "off", "description")


def _strings(name: str, key: str, value: object) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
        raise FeatureError(f"[features.{name}] {key} must be a string or a list of strings, got {value!r}")
    return tuple(items)


def parse_features(raw: Mapping[str, Any]) -> tuple[Feature, ...]:
    """Read matrix.toml's [features] (as `CellSpec.features` carries it); raises `FeatureError` naming the key."""
    features = []
    for name, entry in raw.items():
        if not isinstance(entry, Mapping):
            raise FeatureError(f"[features] {name} must be a table ([features.{name}]), got {entry!r}")
        unknown = sorted(set(entry) - set(_FEATURE_KEYS))
        if unknown:
            raise FeatureError(f"[features.{name}] unknown key(s) {unknown}; known: {list(_FEATURE_KEYS)}")
        gates = _strings(name, "gate", entry.get("gate", []))
        for gate in gates:
            if ":" not in gate:
                raise FeatureError(
                    f"[features.{name}] gate {gate!r} must be 'module:qualname', "
                    "e.g. 'sglang.srt.layers.communicator:apply_flashinfer_allreduce_fusion'"
                )
        off_raw = entry.get("off", {})
        if not isinstance(off_raw, Mapping):
            raise FeatureError(f"[features.{name}] off must be a table of arch = reason, got {off_raw!r}")
        off: dict[Arch, str] = {}
        for arch, reason in off_raw.items():
            try:
                off[parse_target(arch)] = str(reason)
            except ArchError as exc:
                raise FeatureError(f"[features.{name}] off: {exc}") from exc
        features.append(
            Feature(
                name=name,
                gates=gates,
                flags=_strings(name, "flags", entry.get("flags", [])),
                libs=_strings(name, "libs", entry.get("libs", [])),
                off=off,
            )
        )
    return tuple(features)


@dataclass(frozen=True)
class GateResult:
    """What one gate decides for one GPU."""

    symbol: str
    gpu: Arch
    #: on: some path enables it (maybe depending on run-time settings); off: every path disables it on this GPU;
    #: crash: every path raises, at least one with an error (KeyError ...) rather than a deliberate refusal;
    #: unknown: the gate could not be evaluated (the reason says why).
    state: GateState
    path: str = ""
    line: int = 0
    reason: str = ""


def _end_reason(end: End, tree: SourceTree) -> str:
    where = _where(tree, end.module, end.line)
    if end.kind == "crash":
        text = f"raises {end.detail} at {where}"
    elif end.kind == "raise":
        text = f"raises at {where} ({end.detail})"
    elif end.kind == "return":
        text = f"returns {_short(end.value)} at {where}"
    else:
        text = f"reaches the end at {where}"
    if end.via:
        text += " (reached through " + " <- ".join(_where(tree, m, ln) for m, ln in end.via) + ")"
    if end.decision is not None:
        d = end.decision
        text += f", because `{d.text}` is {d.value} at {_where(tree, d.module, d.line)}"
    return text


def _where(tree: SourceTree, module: str, line: int) -> str:
    path = tree.path_of(module)
    return f"{tree.relative(path) if path else module}:{line}"


def _short(value: object) -> str:
    if value is UNKNOWN:
        return "a value known only at run time"
    if isinstance(value, Instance):
        return f"a {value.cls.qualname if value.cls else 'new'} object"
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def _is_on(end: End, constructor: bool) -> bool:
    if end.kind == "fall":
        return True
    if end.kind != "return":
        return False
    if constructor:
        return False  # an early return from __init__ leaves the object disabled
    return truth(end.value) is not False


def evaluate_gate(
    tree: SourceTree,
    gate: str,
    gpu: Arch,
    cuda: str,
    *,
    assume: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> GateResult:
    """Run gate ``module:qualname`` for `gpu` and decide on / off / crash (see `GateResult.state`).

    `assume` sets attributes (the feature's server flags), `environ` is the deployment's environment.
    """
    module, _, qualname = gate.partition(":")
    evaluator = Evaluator(tree, gpu, cuda, assume=assume, environ=environ)
    try:
        ends = evaluator.run(f"{module}.{qualname}")
    except SourceError as exc:
        return GateResult(gate, gpu, "unknown", reason=f"cannot evaluate {gate}: {exc}")
    path = tree.path_of(module)
    rel = tree.relative(path) if path else module
    constructor = qualname.endswith("__init__")
    on = [e for e in ends if _is_on(e, constructor)]
    if on:
        return GateResult(gate, gpu, "on", rel, on[0].line, reason=_end_reason(on[0], tree))
    crashes = [e for e in ends if e.kind == "crash"]
    failing = crashes or ends
    if not failing:
        return GateResult(gate, gpu, "unknown", rel, reason="no path through the gate could be followed")
    first = failing[0]
    # "where it is decided": the crash itself, else the last test decided on the way to the first end
    place = first if crashes or first.decision is None else first.decision
    reasons = "; ".join(dict.fromkeys(_end_reason(e, tree) for e in failing))
    where = _where(tree, place.module, place.line)
    return GateResult(gate, gpu, "crash" if crashes else "off", where.rsplit(":", 1)[0], place.line, reasons)


@dataclass(frozen=True)
class FlagSite:
    """A condition in the tree that reads one of a feature's flags."""

    module: str
    path: str
    line: int
    symbol: str
    text: str
    node: ast.expr = field(compare=False, repr=False)
    local_names: tuple[str, ...] = field(compare=False, repr=False, default=())


def flag_sites(tree: SourceTree, packages: Sequence[str], flags: Sequence[str]) -> tuple[FlagSite, ...]:
    """Every if / assert / return / boolean condition in `packages` that reads ``<something>.<flag>``."""
    if not flags:
        return ()
    needles = [f.encode() for f in flags]
    sites: list[FlagSite] = []
    for package in packages:
        for path in tree.files(package):
            if not any(n in tree.read(path) for n in needles):
                continue
            try:
                module_ast = tree.parse(path)
            except SourceError:
                continue
            module = tree.module_of(path)
            sites.extend(_sites_in(module_ast, module, tree.relative(path), set(flags)))
    return tuple(dict.fromkeys(sites))


def _sites_in(module_ast: ast.Module, module: str, rel: str, flags: set[str]) -> Iterator[FlagSite]:
    def visit(node: ast.AST, symbol: str, local_names: tuple[str, ...]) -> Iterator[FlagSite]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from visit(child, f"{symbol}.{child.name}".lstrip("."), function_locals(child))
                continue
            if isinstance(child, ast.ClassDef):
                yield from visit(child, f"{symbol}.{child.name}".lstrip("."), local_names)
                continue
            condition = _condition_of(child)
            if condition is not None and any(
                isinstance(n, ast.Attribute) and n.attr in flags for n in ast.walk(condition)
            ):
                yield FlagSite(module, rel, condition.lineno, symbol or "<module>", _text(condition),
                               condition, local_names)  # fmt: skip
            yield from visit(child, symbol, local_names)

    yield from visit(module_ast, "", ())


def _condition_of(node: ast.AST) -> ast.expr | None:
    if isinstance(node, ast.If | ast.While | ast.Assert):
        return node.test
    if isinstance(node, ast.Return) and isinstance(node.value, ast.BoolOp | ast.Compare | ast.UnaryOp):
        return node.value
    return None


def evaluate_site(
    tree: SourceTree,
    site: FlagSite,
    gpu: Arch,
    cuda: str,
    *,
    assume: Mapping[str, object],
    environ: Mapping[str, str] | None = None,
) -> bool | None:
    """The condition's truth on `gpu` (None when unknown), with the feature's flags set as `assume` says."""
    evaluator = Evaluator(tree, gpu, cuda, assume=assume, environ=environ)
    try:
        value = evaluator.expression(site.module, site.node, site.local_names)
    except Crash:
        return False
    t = truth(value)
    return None if t is UNKNOWN else bool(t)


__all__ = [
    "FACTS_VERSION",
    "CapLookup",
    "Feature",
    "FeatureError",
    "FlagSite",
    "GateResult",
    "KeyKind",
    "LookupFact",
    "ModuleFacts",
    "Scan",
    "TableDef",
    "evaluate_gate",
    "evaluate_site",
    "flag_sites",
    "module_facts",
    "parse_features",
    "scan_tables",
]
