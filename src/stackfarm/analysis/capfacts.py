"""Per-module facts for `captables`: one pass over a module's AST, summarised as plain, cacheable data.

`module_facts` walks a module once and writes its `ModuleFacts`: its imports and star imports, its dict
literals (`TableDef`), what each function returns and each name holds as a symbolic *flow* (``("index",
("cap",), 0)`` is ``get_device_capability()[0]``), and every lookup whose key has a flow (`LookupFact`). The
summary is a pure function of the module's name and bytes, so `captables` caches it by their sha256.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

from stackfarm.analysis.sourcetree import caught_names, last_name, resolve_relative, source_text, top_level

#: Bump when ModuleFacts change shape or meaning: cached summaries of the old version are then ignored.
FACTS_VERSION = "captables-facts-1"

Flow = tuple[Any, ...]
Style = Literal["subscript", "get", "in", "not in"]


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
            "lookups": [
                [x.line, x.symbol, x.style, _enc(x.key), _enc(x.container), x.text, x.guard]
                for x in self.lookups
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModuleFacts:
        tables = {k: TableDef(n, ln, _dec(keys), comp) for k, (n, ln, keys, comp) in data["tables"].items()}
        lookups = tuple(
            LookupFact(ln, sym, style, _dec(key), _dec(cont), text, guard)
            for ln, sym, style, key, cont, text, guard in data["lookups"]
        )
        return cls(
            module=data["module"],
            imports=data["imports"],
            stars=tuple(data["stars"]),
            tables=tables,
            defs={k: _dec(v) for k, v in data["defs"].items()},
            lookups=lookups,
        )


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
    return source_text(node, 120)


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
        for stmt in top_level(tree.body):
            self._declare(stmt)

    def facts(self, tree: ast.Module) -> ModuleFacts:
        self._block(tree.body, env=None, symbol="<module>", cls=None, guards=())
        return ModuleFacts(
            module=self.module,
            imports=self.imports,
            stars=tuple(self.stars),
            tables=self.tables,
            defs=self.defs,
            lookups=tuple(self.lookups),
        )

    # ----------------------------------------------------------------------- names

    def _declare(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Import):
            self._declare_import(stmt)
        elif isinstance(stmt, ast.ImportFrom):
            self._declare_import_from(stmt)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            self.names.add(stmt.name)
        elif isinstance(stmt, ast.ClassDef):
            self.names.add(stmt.name)
            self.classes.add(stmt.name)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            self._declare_assign(stmt)

    def _declare_import(self, stmt: ast.Import) -> None:
        for alias in stmt.names:
            local = alias.asname or alias.name.split(".")[0]
            self.imports[local] = alias.name if alias.asname else local

    def _declare_import_from(self, stmt: ast.ImportFrom) -> None:
        base = resolve_relative(self.module, self.is_package, stmt.level, stmt.module)
        for alias in stmt.names:
            if alias.name == "*":
                self.stars.append(base)
            else:
                self.imports[alias.asname or alias.name] = f"{base}.{alias.name}"

    def _declare_assign(self, stmt: ast.Assign | ast.AnnAssign) -> None:
        """A module-level assignment shadows any import of its names; a constant one is remembered as a key."""
        targets = _targets(stmt)
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
            return self._call_flow(node, env, cls)
        if isinstance(node, ast.Subscript):
            return self._index_flow(node, env, cls)
        if isinstance(node, ast.Attribute):
            return self._attribute_flow(node, env, cls)
        if isinstance(node, ast.Name):
            return self._ref(node.id, env)
        if isinstance(node, ast.BinOp):
            return self._sm_flow(node, env, cls)
        if isinstance(node, ast.Tuple):
            return self._pair_flow(node, env, cls)
        return None

    def _pair_flow(
        self, node: ast.Tuple, env: Mapping[str, Flow | None] | None, cls: str | None
    ) -> Flow | None:
        """``(major, minor)``."""
        if len(node.elts) != 2:
            return None
        major, minor = self.flow(node.elts[0], env, cls), self.flow(node.elts[1], env, cls)
        return ("pair", major, minor) if major and minor else None

    def _call_flow(
        self, node: ast.Call, env: Mapping[str, Flow | None] | None, cls: str | None
    ) -> Flow | None:
        func = node.func
        last = last_name(func)
        if last == "get_device_capability":
            return ("cap",)
        if last == "get_device_properties":
            return ("props",)
        if isinstance(func, ast.Name) and func.id in ("int", "tuple") and len(node.args) == 1:
            return self.flow(node.args[0], env, cls)
        dotted = self._dotted(func, env, cls)
        return ("call", dotted) if dotted else None

    def _index_flow(
        self, node: ast.Subscript, env: Mapping[str, Flow | None] | None, cls: str | None
    ) -> Flow | None:
        if not (isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)):
            return None
        inner = self.flow(node.value, env, cls)
        return ("index", inner, node.slice.value) if inner else None

    def _attribute_flow(
        self, node: ast.Attribute, env: Mapping[str, Flow | None] | None, cls: str | None
    ) -> Flow | None:
        if node.attr in ("major", "minor"):
            inner = self.flow(node.value, env, cls)
            if inner:
                return ("attr", inner, node.attr)
        dotted = self._dotted(node, env, cls)
        return ("global", dotted) if dotted else None

    def _sm_flow(
        self, node: ast.BinOp, env: Mapping[str, Flow | None] | None, cls: str | None
    ) -> Flow | None:
        """``major * 10 + minor`` (either order) is an SM number."""
        if not isinstance(node.op, ast.Add):
            return None
        for scaled, rest in ((node.left, node.right), (node.right, node.left)):
            if _times_ten(scaled):
                major, minor = self.flow(scaled.left, env, cls), self.flow(rest, env, cls)
                return ("sm", major, minor) if major and minor else None
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
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            if stmt.value is not None:
                for target in _targets(stmt):
                    self._assign(target, stmt.value, env, symbol, cls)
        elif isinstance(stmt, ast.Return):
            self._returned(stmt, env, symbol, cls)
        else:
            self._nested_blocks(stmt, env, symbol, cls, guards)

    def _returned(
        self, stmt: ast.Return, env: Mapping[str, Flow | None] | None, symbol: str, cls: str | None
    ) -> None:
        """A function's first return with a flow is what the function stands for."""
        if stmt.value is None or symbol == "<module>":
            return
        flow = self.flow(stmt.value, env, cls)
        if flow is not None:
            self.defs.setdefault(symbol, flow)

    def _nested_blocks(
        self,
        stmt: ast.stmt,
        env: dict[str, Flow | None] | None,
        symbol: str,
        cls: str | None,
        guards: tuple[str, ...],
    ) -> None:
        """Walk the blocks a compound statement holds, adding the guards its test or handlers give its body."""
        if isinstance(stmt, ast.If):
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
        if isinstance(target, ast.Name) and isinstance(value, ast.Dict):
            self._assign_table(target, value, env, symbol, cls)
        elif isinstance(target, ast.Name):
            self._assign_name(target, value, env, cls)
        elif isinstance(target, ast.Tuple | ast.List):
            self._assign_unpacked(target, value, env, symbol, cls)
        elif _is_own_attribute(target) and cls is not None:
            flow = self.flow(value, env, cls)
            if flow is not None:
                self.defs.setdefault(f"{cls}.{target.attr}", flow)

    def _assign_name(
        self, target: ast.Name, value: ast.expr, env: dict[str, Flow | None] | None, cls: str | None
    ) -> None:
        """A module or class name records its flow in `defs`; a local one in its function's env."""
        flow = self.flow(value, env, cls)
        if env is not None:
            env[target.id] = flow
        elif flow is not None:
            self.defs[f"{cls}.{target.id}" if cls else target.id] = flow

    def _assign_table(
        self,
        target: ast.Name,
        value: ast.Dict,
        env: dict[str, Flow | None] | None,
        symbol: str,
        cls: str | None,
    ) -> None:
        """A dict literal becomes a `TableDef`; a local one is also a name its function can look up."""
        scope = target.id if env is None else f"{symbol}.<locals>.{target.id}"
        name = f"{cls}.{target.id}" if cls and env is None else scope
        self.tables[name] = _table(name, value, self.consts)
        if env is not None:
            env[target.id] = ("global", f"{self.module}.{name}")

    def _assign_unpacked(
        self,
        target: ast.Tuple | ast.List,
        value: ast.expr,
        env: dict[str, Flow | None] | None,
        symbol: str,
        cls: str | None,
    ) -> None:
        """``a, b = x, y`` pairs the items; ``a, b = f()`` gives each name an index into the whole."""
        if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
            for sub, sub_value in zip(target.elts, value.elts, strict=True):
                self._assign(sub, sub_value, env, symbol, cls)
            return
        whole = self.flow(value, env, cls)
        for i, sub in enumerate(target.elts):
            if not isinstance(sub, ast.Name):
                continue
            flow = ("index", whole, i) if whole else None
            if env is not None:
                env[sub.id] = flow
            elif flow:
                self.defs[sub.id] = flow

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
                for target in _targets(stmt):
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
                LookupFact(
                    node.lineno,
                    symbol,
                    style,
                    key,
                    container,
                    _text(node),
                    guard=("except KeyError" if guard == "*" else f"`in {guard}` check") if guard else None,
                )
            )


def _expressions(stmt: ast.stmt) -> Iterator[ast.expr]:
    """The expressions a statement evaluates itself (not those of nested blocks or functions)."""
    skip: tuple[str, ...] = ("body", "orelse", "finalbody", "handlers")
    for name, value in ast.iter_fields(stmt):
        if name in skip:
            continue
        for item in value if isinstance(value, list) else [value]:
            yield from _field_expressions(item)


def _field_expressions(item: object) -> Iterator[ast.expr]:
    """The expressions under one field of a statement: an expression (lambdas left out) or a ``with`` item."""
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
    get = _method_call(node, "get")
    if get is not None and get[1]:
        return "get", get[0], get[1][0]
    if isinstance(node, ast.Compare):
        return _membership_parts(node)
    return None


def _membership_parts(node: ast.Compare) -> tuple[Style, ast.expr, ast.expr] | None:
    """``k in T`` / ``k not in T``, with ``T.keys()`` read as ``T``."""
    if len(node.ops) != 1 or not isinstance(node.ops[0], ast.In | ast.NotIn):
        return None
    container = node.comparators[0]
    keys = _method_call(container, "keys")
    if keys is not None and not keys[1]:
        container = keys[0]
    return ("in" if isinstance(node.ops[0], ast.In) else "not in"), container, node.left


def _method_call(node: ast.expr, method: str) -> tuple[ast.expr, list[ast.expr]] | None:
    """(receiver, arguments) when `node` is ``receiver.method(arguments)``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method:
        return node.func.value, node.args
    return None


def _targets(stmt: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]


def _times_ten(node: ast.expr) -> TypeGuard[ast.BinOp]:
    """``x * 10``: the major half of an SM number."""
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mult)
        and isinstance(node.right, ast.Constant)
        and node.right.value == 10
    )


def _is_own_attribute(target: ast.expr) -> TypeGuard[ast.Attribute]:
    """``self.x`` / ``cls.x``: an attribute of the class being walked."""
    return (
        isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id in ("self", "cls")
    )


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
    names = caught_names(handler)
    return names is None or any(n in ("KeyError", "LookupError", "Exception", "BaseException") for n in names)


def module_facts(module: str, is_package: bool, source: bytes) -> ModuleFacts:
    """The summary of one module (a pure function of its name and bytes). Raises SyntaxError if it does not parse."""
    tree = ast.parse(source)
    return _Collector(module, is_package, tree).facts(tree)


__all__ = ["FACTS_VERSION", "Flow", "LookupFact", "ModuleFacts", "Style", "TableDef", "module_facts"]
