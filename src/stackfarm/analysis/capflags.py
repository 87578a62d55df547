"""A feature's flag followed into the functions it is passed to: the callee's conditions are flag sites too.

SGLang often reads a server argument in one place and decides with it in another:
``set_torch_symm_mem_all_reduce(self.server_args.enable_torch_symm_mem)`` (0.5.9's model_runner.py:782) hands
the flag to ``parallel_state.set_torch_symm_mem_all_reduce(enable)``, which stores it in a module global that
``init_model_parallel_group`` passes on as ``GroupCoordinator(use_torch_symm_mem_all_reduce=...)``, whose
``__init__`` keeps it as ``self.use_torch_symm_mem_all_reduce`` and tests it. `followed_sites` follows that data
flow: an argument that *is* a flag read (``x.<flag>``, ``d["<flag>"]``, ``d.get("<flag>")``) or a name that
carries one, passed positionally or by keyword to a callee the evaluator resolves (a function of the tree, a
class of the tree (its ``__init__``), a method bound to a resolvable object), makes the callee's parameter a
carrier of the flag; inside the callee a plain assignment of a carrier to a local, to ``self.<attr>`` or to a
``global`` passes it on, and every condition (as `capgates.flag_sites` finds them) that reads a carrier is a
flag site, recorded with the call sites on the way (``via``), so a finding names both file:line.

Bounded: at most `MAX_HOPS` calls deep, each (function, carrier) followed once (no recursion loops). A callee
the evaluator cannot resolve is not followed: nothing is concluded from it (no site, so never an ``ok``).
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeGuard

from stackfarm.analysis.arch import Arch
from stackfarm.analysis.capgates import FlagSite, condition_of, modules_naming
from stackfarm.analysis.pysource import Evaluator
from stackfarm.analysis.pyvalues import ClassValue, Function, function_locals
from stackfarm.analysis.sourcetree import SourceError, SourceTree, resolve_relative, source_text

#: How many calls deep a flag is followed from where it is read.
MAX_HOPS = 2
_Def = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class _Carriers:
    """What carries the flag inside one function: names (parameters, locals, globals) and ``self.<attr>``s."""

    names: frozenset[str] = frozenset()
    attrs: frozenset[str] = frozenset()
    #: The feature's own flags (read as ``x.<flag>``, ``d["<flag>"]``, ``d.get("<flag>")``): at the first read.
    flags: frozenset[str] = frozenset()

    def carries(self, node: ast.expr) -> bool:
        """Whether `node` itself is a carrier (the whole expression, not a part of it)."""
        if isinstance(node, ast.Name):
            return node.id in self.names
        if isinstance(node, ast.Attribute):
            return node.attr in self.flags or (_on_self(node) and node.attr in self.attrs)
        if isinstance(node, ast.Subscript):
            return isinstance(node.slice, ast.Constant) and node.slice.value in self.flags
        return _get_key(node) in self.flags

    def read_in(self, node: ast.AST) -> bool:
        """Whether a carrier is read anywhere in `node`."""
        return any(isinstance(n, ast.expr) and self.carries(n) for n in ast.walk(node))


@dataclass(frozen=True)
class FoundGate:
    """A deciding function found by following a flag: a class of the tree constructed under a flag test."""

    #: "module:Class.__init__", as matrix.toml's [features] gate spells it.
    gate: str
    #: The call sites and the flag test on the way, "file:line `text`" each.
    via: tuple[str, ...]


@dataclass(frozen=True)
class _Function:
    module: str
    rel: str
    symbol: str
    node: _Def = field(compare=False)


@dataclass
class _Follow:
    tree: SourceTree
    flags: frozenset[str]
    max_hops: int
    evaluator: Evaluator = field(init=False)
    sites: list[FlagSite] = field(default_factory=list)
    seen: set[tuple[int, str]] = field(default_factory=set)
    gates: dict[str, FoundGate] = field(default_factory=dict)
    #: The calls a carrier is passed to that could not be followed ("file:line `call`"), in order.
    unresolved: dict[str, None] = field(default_factory=dict)
    #: module -> its functions with their qualnames (parsed once).
    functions: dict[str, list[_Function]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.evaluator = Evaluator(self.tree, Arch(9, 0), "")  # only resolves names: the GPU does not matter

    # ------------------------------------------------------------------- the walk

    def start(self, module: str, rel: str, module_ast: ast.Module) -> None:
        """The first reads: calls anywhere in the module that pass a flag read as an argument."""
        first = _Carriers(flags=self.flags)
        for fn in self._functions_of(module, rel, module_ast):
            for node in _own_statements(fn.node):
                if isinstance(node, ast.If) and _positive(node.test, first):
                    self._gates_in(fn, node, ())
            for flag, call, param_of in self._passing(fn, first):
                self._hop(fn, call, param_of, flag=flag, via=(), hops=1)

    def _functions_of(self, module: str, rel: str, module_ast: ast.Module) -> list[_Function]:
        if module not in self.functions:
            self.functions[module] = [_Function(module, rel, s, n) for s, n in _defs(module_ast, "")]
        return self.functions[module]

    def _passing(self, fn: _Function, carriers: _Carriers) -> Iterator[tuple[str, ast.Call, int | str]]:
        """(what it carries, the call, positional index or keyword) for each carrier passed in `fn`'s own body."""
        for node in _own_nodes(fn.node):
            if not isinstance(node, ast.Call):
                continue
            for i, arg in enumerate(node.args):
                if isinstance(arg, ast.Starred):
                    break  # positions after a *args are not known
                if carriers.carries(arg):
                    yield _carried(arg), node, i
            for kw in node.keywords:
                if kw.arg is not None and carriers.carries(kw.value):
                    yield _carried(kw.value), node, kw.arg

    def _hop(
        self,
        caller: _Function,
        call: ast.Call,
        param_of: int | str,
        *,
        flag: str,
        via: tuple[str, ...],
        hops: int,
    ) -> None:
        """Follow one passed carrier into the callee of `call`, if it resolves."""
        callee = self._callee(caller, call)
        param = _parameter(callee[0].node, param_of, callee[1]) if callee is not None else None
        if callee is None or param is None:  # unresolved (or into **kwargs): not followed, nothing concluded
            self.unresolved.setdefault(f"{caller.rel}:{call.lineno} `{source_text(call, 80)}`")
            return
        func = callee[0]
        if (id(func.node), param) in self.seen:
            return
        self.seen.add((id(func.node), param))
        path = self.tree.path_of(func.module)
        if path is None:  # a callee of no file in the tree (a compiled module): unknown, never nothing
            self.unresolved.setdefault(f"{caller.rel}:{call.lineno} `{source_text(call, 80)}`")
            return
        assert not isinstance(func.node, ast.Lambda)  # `_callee` returns none
        target = _Function(func.module, self.tree.relative(path), func.qualname, func.node)
        here = (*via, f"{caller.rel}:{call.lineno} `{source_text(call, 80)}` passes {flag} as `{param}`")
        self._inside(target, _Carriers(names=frozenset({param})), flag, here, hops)

    def _resolve(self, fn: _Function, func: ast.expr) -> object:
        """What `func` names in `fn`: a name the function imports itself (``from x import Y`` in its body, as
        GroupCoordinator.__init__ does), else the evaluator's value of the expression (unknown where it fails)."""
        try:
            if isinstance(func, ast.Name):
                for node in _own_nodes(fn.node):
                    if not isinstance(node, ast.ImportFrom):
                        continue
                    for alias in node.names:
                        if (alias.asname or alias.name) == func.id:
                            path = self.tree.path_of(fn.module)
                            package = path is not None and path.name == "__init__.py"
                            source = resolve_relative(fn.module, package, node.level, node.module)
                            return self.evaluator.lookup(f"{source}.{alias.name}")
            return self.evaluator.expression(fn.module, func, function_locals(fn.node))
        except (SourceError, RecursionError):
            return None

    def _callee(self, caller: _Function, call: ast.Call) -> tuple[Function, int] | None:
        """The function `call` runs (a class's ``__init__``), and how many leading parameters are already bound."""
        value = self._resolve(caller, call.func)
        try:
            if isinstance(value, ClassValue):
                init = self.evaluator.lookup(f"{value.module}.{value.qualname}.__init__")
                if not isinstance(init, Function) or init.module == "":
                    return None
                return (init, 1 + len(init.args)) if not isinstance(init.node, ast.Lambda) else None
        except (SourceError, RecursionError):
            return None
        if isinstance(value, Function) and not isinstance(value.node, ast.Lambda):
            return value, len(value.args)
        return None

    def _inside(self, fn: _Function, carriers: _Carriers, flag: str, via: tuple[str, ...], hops: int) -> None:
        """The carriers' sites in `fn`, and where it passes them on (within the same module, or by a call)."""
        flow = _propagate(fn.node, carriers)
        self._follow_flow(fn, flow, flag, via, hops)
        if not (flow.new_attrs or flow.globals_):
            return
        # a `self.<attr>` or a global that carries it is read by the module's other functions too
        for other in self._module_functions(fn):
            if other.node is fn.node:
                continue
            shadowed = set(function_locals(other.node)) - _declared_global(other.node)
            wide = _Carriers(names=frozenset(flow.globals_ - shadowed), attrs=flow.new_attrs)
            key = ",".join(sorted(wide.names)) + "|" + ",".join(sorted(wide.attrs))
            if (id(other.node), key) in self.seen or not wide.read_in(other.node):
                continue
            self.seen.add((id(other.node), key))
            self._follow_flow(other, _propagate(other.node, wide), flag, via, hops)

    def _module_functions(self, fn: _Function) -> list[_Function]:
        if fn.module not in self.functions:
            path = self.tree.path_of(fn.module)
            try:
                module_ast = self.tree.parse(path) if path is not None else None
            except SourceError:
                module_ast = None
            if module_ast is None:
                return []
            self._functions_of(fn.module, fn.rel, module_ast)
        return self.functions[fn.module]

    def _follow_flow(self, fn: _Function, flow: _Flow, flag: str, via: tuple[str, ...], hops: int) -> None:
        self._sites(fn, flow, flag, via)
        for _, call, param_of in self._passing(fn, flow.carriers):
            if hops < self.max_hops:
                self._hop(fn, call, param_of, flag=flag, via=via, hops=hops + 1)
            else:  # not followed: what the callee decides is unknown, as for a callee that does not resolve
                where = f"{fn.rel}:{call.lineno} `{source_text(call, 80)}`"
                self.unresolved.setdefault(f"{where} (past {self.max_hops} calls)")

    def _gates_in(self, fn: _Function, stmt: ast.If, via: tuple[str, ...]) -> None:
        """The tree's classes constructed where `stmt`'s flag test holds (see `_positive`): their ``__init__`` decides
        the feature."""
        here = (*via, f"{fn.rel}:{stmt.test.lineno} `{source_text(stmt.test, 80)}`")
        for sub in stmt.body:
            for node in ast.walk(sub):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name | ast.Attribute):
                    continue
                value = self._resolve(fn, node.func)
                if not isinstance(value, ClassValue) or not _defines_init(value.node):
                    continue
                gate = f"{value.module}:{value.qualname}.__init__"
                self.gates.setdefault(gate, FoundGate(gate, (*here, f"{fn.rel}:{node.lineno} constructs it")))

    def _sites(self, fn: _Function, flow: _Flow, flag: str, via: tuple[str, ...]) -> None:
        local_names = function_locals(fn.node)
        for node in _own_statements(fn.node):
            condition = condition_of(node)
            if condition is None:
                continue
            carriers = flow.at(condition.lineno)
            if not carriers.read_in(condition):
                continue
            if isinstance(node, ast.If) and _positive(node.test, carriers):
                self._gates_in(fn, node, via)
            sure = tuple(sorted(carriers.names - flow.partial))  # a partial carrier stays unknown
            self.sites.append(
                FlagSite(
                    fn.module,
                    fn.rel,
                    condition.lineno,
                    fn.symbol,
                    source_text(condition, 120),
                    condition,
                    local_names,
                    via=via,
                    carriers=sure,
                    carrier_attrs=tuple(sorted(carriers.attrs)),
                    flag=flag,
                )
            )


@dataclass(frozen=True)
class Followed:
    """What following a feature's flags finds: flag sites in callees, and the gates constructed under a test."""

    sites: tuple[FlagSite, ...]
    gates: tuple[FoundGate, ...]
    #: The calls a flag (or a carrier of it) is passed to whose callee could not be resolved: not followed.
    unresolved: tuple[str, ...] = ()


def follow_flags(
    tree: SourceTree, packages: Sequence[str], flags: Collection[str], *, max_hops: int = MAX_HOPS
) -> Followed:
    """Follow `flags` from where `packages` read them (see the module docstring)."""
    if not flags:
        return Followed((), ())
    follow = _Follow(tree, frozenset(flags), max_hops)
    for path, module_ast in modules_naming(tree, packages, sorted(flags)):
        follow.start(tree.module_of(path), tree.relative(path), module_ast)
    return Followed(
        tuple(dict.fromkeys(follow.sites)), tuple(follow.gates.values()), tuple(follow.unresolved)
    )


def followed_sites(
    tree: SourceTree, packages: Sequence[str], flags: Collection[str], *, max_hops: int = MAX_HOPS
) -> tuple[FlagSite, ...]:
    """The flag sites reached by following `flags` through the calls they are passed to; each carries
    `FlagSite.via`, the call sites on the way. The direct reads are `capgates.flag_sites`'."""
    return follow_flags(tree, packages, flags, max_hops=max_hops).sites


# --------------------------------------------------------------------------- AST helpers


def _carried(node: ast.expr) -> str:
    """The name of what `node` carries, for the `via` line."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        return str(node.args[0].value)
    return source_text(node, 40)


def _on_self(node: ast.expr) -> TypeGuard[ast.Attribute]:
    """``self.<attr>``."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _get_key(node: ast.expr) -> object:
    """The constant key of ``d.get("<key>", ...)``; None for any other expression."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
        return None
    if node.args and isinstance(node.args[0], ast.Constant):
        return node.args[0].value
    return None


def _defs(node: ast.AST, prefix: str) -> Iterator[tuple[str, _Def]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}.{child.name}".lstrip(".")
            yield name, child
            yield from _defs(child, name)
        elif isinstance(child, ast.ClassDef):
            yield from _defs(child, f"{prefix}.{child.name}".lstrip("."))
        else:
            yield from _defs(child, prefix)


def _own_nodes(fn: _Def) -> Iterator[ast.AST]:
    """Every node of `fn`'s body, nested functions and classes left out (they are functions of their own)."""
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _own_statements(fn: _Def) -> list[ast.stmt]:
    return sorted(
        (n for n in _own_nodes(fn) if isinstance(n, ast.stmt)), key=lambda n: (n.lineno, n.col_offset)
    )


def _positive(test: ast.expr, carriers: _Carriers) -> bool:
    """Whether `test` holds only where the flag is set: the carrier itself, or one operand of an ``and`` chain
    (``if self.use_x and self.world_size > 1``); ``not flag``, ``flag or ...`` and comparisons do not count."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_positive(v, carriers) for v in test.values)
    return carriers.carries(test)


def _defines_init(cls: ast.ClassDef) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "__init__" for n in cls.body)


def _declared_global(fn: _Def) -> set[str]:
    return {name for n in _own_nodes(fn) if isinstance(n, ast.Global) for name in n.names}


@dataclass(frozen=True)
class _Flow:
    """The carriers of one function after its plain assignments (see `_propagate`)."""

    carriers: _Carriers
    #: The line from which each name carries the flag (0: on entry).
    since: dict[str, int]
    #: Names that carry the flag only on some paths (a parameter reassigned, a name bound elsewhere too).
    partial: frozenset[str]
    new_attrs: frozenset[str]
    globals_: frozenset[str]

    def at(self, line: int) -> _Carriers:
        """The carriers a condition at `line` reads (a name assigned the flag below it does not count)."""
        names = frozenset(n for n in self.carriers.names if self.since.get(n, 0) < line)
        return _Carriers(names, self.carriers.attrs, self.carriers.flags)


@dataclass
class _Spread:
    """The carriers found so far while `_propagate` runs a function's assignments to a fixpoint."""

    names: set[str]
    attrs: set[str]
    #: The line from which each name carries the flag (0: on entry).
    since: dict[str, int]
    globals_: set[str] = field(default_factory=set)

    def now(self, flags: frozenset[str]) -> _Carriers:
        return _Carriers(frozenset(self.names), frozenset(self.attrs), flags)

    def take(self, stmt: ast.Assign | ast.AnnAssign, declared: set[str]) -> bool:
        """Add the targets of `stmt`, whose value carries the flag; whether any of them was new."""
        changed = False
        for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
            if isinstance(target, ast.Name) and target.id not in self.names:
                self.names.add(target.id)
                self.since[target.id] = stmt.lineno
                changed = True
                if target.id in declared:
                    self.globals_.add(target.id)
            elif _on_self(target) and target.attr not in self.attrs:
                self.attrs.add(target.attr)
                changed = True
        return changed


def _propagate(fn: _Def, carriers: _Carriers) -> _Flow:
    """Carriers passed on by plain assignments in `fn` (``x = carrier``, ``self.a = carrier``, a ``global``),
    to a fixpoint, with the line each name starts carrying from."""
    spread = _Spread(set(carriers.names), set(carriers.attrs), dict.fromkeys(carriers.names, 0))
    declared = _declared_global(fn)
    assigns = [n for n in _own_nodes(fn) if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None]
    changed = True
    while changed:
        changed = False
        now = spread.now(carriers.flags)
        for stmt in assigns:
            assert stmt.value is not None
            if now.carries(stmt.value):
                changed = spread.take(stmt, declared) or changed
    final = spread.now(carriers.flags)
    partial = _partial(fn, final, spread.since)
    return _Flow(
        final, spread.since, partial, frozenset(spread.attrs - carriers.attrs), frozenset(spread.globals_)
    )


def _partial(fn: _Def, final: _Carriers, since: dict[str, int]) -> frozenset[str]:
    """The carriers that hold the flag only on some paths: bound elsewhere too, or a parameter reassigned."""
    spec = fn.args
    params = {a.arg for a in (*spec.posonlyargs, *spec.args, *spec.kwonlyargs)}
    bound_otherwise: set[str] = set()
    for node in _own_nodes(fn):
        if isinstance(node, ast.stmt) and not _passes_on(node, final):
            bound_otherwise |= {t.id for t in _stores(node)}
    return frozenset(n for n in final.names if n in bound_otherwise or (since[n] > 0 and n in params))


def _passes_on(stmt: ast.stmt, carriers: _Carriers) -> bool:
    """A plain assignment of a carrier: it binds its targets to the flag, not to something else."""
    return (
        isinstance(stmt, ast.Assign | ast.AnnAssign)
        and stmt.value is not None
        and carriers.carries(stmt.value)
    )


def _stores(stmt: ast.stmt) -> Iterator[ast.Name]:
    """The names `stmt` itself binds (assignment targets, loop and ``with`` variables), not its nested blocks'."""
    for name, value in ast.iter_fields(stmt):
        if name in ("body", "orelse", "finalbody", "handlers", "cases", "value", "test", "iter"):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, ast.AST):
                yield from (
                    n for n in ast.walk(item) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                )


def _parameter(
    fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, param_of: int | str, skip: int
) -> str | None:
    """The parameter of `fn` that positional argument `param_of` (after `skip` bound ones) or keyword binds."""
    spec = fn.args
    positional = [a.arg for a in (*spec.posonlyargs, *spec.args)]
    if isinstance(param_of, int):
        index = param_of + skip
        return positional[index] if index < len(positional) else None
    named = positional[len(spec.posonlyargs) :] + [a.arg for a in spec.kwonlyargs]
    return param_of if param_of in named else None


__all__ = ["MAX_HOPS", "Followed", "FoundGate", "follow_flags", "followed_sites"]
