"""Where SGLang's EAGLE-3 code touches a model: the walker behind `eagle3_derive.derive_contract`.

SGLang's naming is the only type information there is: a model expression is ``<...runner...>.model`` or an
alias of one, its role (target or draft) told by the names on the way (``target_worker``, ``draft_*runner*``).
`Knowledge` says what the enclosing conditions mean for EAGLE-3 (three-valued: true, false, or open), so
`UseCollector` records only the uses on an EAGLE-3 path, each with its site, arity and guards.
"""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias

from stackfarm.analysis.eagle3_contract import ROLES, Role, Use, UseKind
from stackfarm.analysis.sourcetree import SourceTree, last_name, named_call, resolve_relative, source_text

#: A model expression's role as its name tells it; "runner" is a ModelRunner's own model, whose role the
#: enclosing conditions decide (the same ModelRunner class loads the target and the draft).
_Tag = Literal["target", "draft", "runner"]
Tri: TypeAlias = bool | None  # three-valued: None is "depends on something we cannot know statically"
Guard: TypeAlias = tuple[ast.expr, bool]  # an enclosing condition and whether we are in its true branch

EAGLE3 = "EAGLE3"
NO_SPEC = "NONE"
_RUNNER_NAME = re.compile(r"runner(_list)?$")
#: How deep the walker follows a model passed to a helper function (helpers calling helpers).
_FOLLOW_DEPTH = 4
_Fn: TypeAlias = ast.FunctionDef | ast.AsyncFunctionDef


# ---------------------------------------------------------------------------------------- three-valued logic


def not3(value: Tri) -> Tri:
    return None if value is None else not value


def all3(values: Iterable[Tri]) -> Tri:
    seen = list(values)
    if any(v is False for v in seen):
        return False
    return True if all(v is True for v in seen) else None


def any3(values: Iterable[Tri]) -> Tri:
    seen = list(values)
    if any(v is True for v in seen):
        return True
    return False if all(v is False for v in seen) else None


def logic3(node: ast.expr, value: Callable[[ast.expr], Tri]) -> tuple[bool, Tri]:
    """(True, the result) when `node` is ``and`` / ``or`` / ``not`` over operands that `value` judges;
    (False, None) for any other node."""
    if isinstance(node, ast.BoolOp):
        parts = [value(v) for v in node.values]
        return True, all3(parts) if isinstance(node.op, ast.And) else any3(parts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return True, not3(value(node.operand))
    return False, None


@dataclass(frozen=True)
class World:
    """One way the code can run: the speculative algorithm and which model the ModelRunner holds."""

    algorithm: str
    role: Role


@dataclass(frozen=True)
class Knowledge:
    """What conditions mean: `SpeculativeAlgorithm` predicates per algorithm, and EAGLE-3 flags with the
    roles for which they can be true (attributes the runner sets only on EAGLE-3 paths, such as
    eagle_use_aux_hidden_state).
    """

    predicates: Mapping[str, Mapping[str, Tri]]
    flags: Mapping[str, frozenset[Role]] = field(default_factory=dict)
    #: Attributes EAGLE-3 sets (on a path specific to speculation, for these roles) that other features set
    #: too (0.5.23's eagle_use_aux_hidden_state, also set by --enable-return-aux-hidden-states): open either
    #: way, but a use under one is on the EAGLE-3 path.
    shared: Mapping[str, frozenset[Role]] = field(default_factory=dict)

    def value(self, node: ast.expr, world: World) -> Tri:
        connective, result = logic3(node, lambda operand: self.value(operand, world))
        if connective:
            return result
        predicate = _bare_method(node)
        if predicate is not None:
            table = self.predicates.get(predicate)
            return None if table is None else table.get(world.algorithm)
        return self._leaf_value(node, world)

    def _leaf_value(self, node: ast.expr, world: World) -> Tri:
        """A name's or a constant's value: ``is_draft_worker``, an EAGLE-3 flag, a literal; else open."""
        name = last_name(node)
        if name == "is_draft_worker":
            return world.role == "draft"
        if name is not None and name in self.flags:
            # Flags are set only on EAGLE-3 paths: false without speculation, else open (config-dependent).
            return False if world.algorithm == NO_SPEC or world.role not in self.flags[name] else None
        if isinstance(node, ast.Constant):
            return bool(node.value)
        return None

    def guard(self, guard: Guard, world: World) -> Tri:
        value = self.value(guard[0], world)
        return value if guard[1] else not3(value)

    def reachable(self, guards: Sequence[Guard], role: Role) -> bool:
        world = World(EAGLE3, role)
        return all(self.guard(g, world) is not False for g in guards)

    def enabled_by_eagle3(self, guards: Sequence[Guard], role: Role) -> bool:
        """True when a condition that must hold reads an attribute EAGLE-3 sets for this role (`shared`)."""
        for test, positive in guards:
            if positive and any(
                (n := last_name(node)) is not None and role in self.shared.get(n, frozenset())
                for node in ast.walk(test)
            ):
                return True
        return False

    def specific(self, guards: Sequence[Guard], role: Role) -> bool:
        """True when these conditions cannot hold without speculative decoding: an EAGLE-3(-family) path."""
        world = World(NO_SPEC, role)
        return any(self.guard(g, world) is False for g in guards)


def _bare_method(node: ast.expr) -> str | None:
    """The method name of ``x.method()`` called without arguments (a `SpeculativeAlgorithm` predicate)."""
    if (
        isinstance(node, ast.Call)
        and not node.args
        and not node.keywords
        and isinstance(node.func, ast.Attribute)
    ):
        return node.func.attr
    return None


def _text(node: ast.AST) -> str:
    return source_text(node, 100)


def _guard_text(guards: Sequence[Guard]) -> str:
    return " and ".join(_text(g) if positive else f"not ({_text(g)})" for g, positive in guards)


@dataclass
class Scope:
    """Where the walker is: the module, the class, and the aliases of models and runners seen there."""

    file: Path
    worker_module: bool
    speculative: bool
    class_name: str = ""
    class_models: dict[str, _Tag] = field(default_factory=dict)
    class_runners: dict[str, _Tag] = field(default_factory=dict)
    local_models: dict[str, _Tag] = field(default_factory=dict)
    local_runners: dict[str, _Tag] = field(default_factory=dict)


def _segments(node: ast.expr) -> list[str] | None:
    """`self.draft_runner_list[i].model` -> ["self", "draft_runner_list[]", "model"]; None for others."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _segments(node.value)
        return None if head is None else [*head, node.attr]
    if isinstance(node, ast.Subscript | ast.Call):
        inner = node.value if isinstance(node, ast.Subscript) else node.func
        head = _segments(inner)
        return (
            None
            if head is None
            else [*head[:-1], head[-1] + ("[]" if isinstance(node, ast.Subscript) else "()")]
        )
    return None


def _tag_from_names(names: Sequence[str]) -> _Tag:
    # SGLang's naming is the only type information there is: the target is reached through `target_worker`,
    # the draft through `draft_*runner*`/`mtp_*runner*`/`draft_worker`; a bare `model_runner` is either.
    bare = [n.rstrip("[]()") for n in names]
    if any(n.startswith(("draft", "mtp")) for n in bare):
        return "draft"
    if any("target" in n for n in bare):
        return "target"
    return "runner"


def _runner_tag(node: ast.expr, scope: Scope) -> _Tag | None:
    if isinstance(node, ast.Name) and node.id in scope.local_runners:
        return scope.local_runners[node.id]
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and node.attr in scope.class_runners
    ):
        return scope.class_runners[node.attr]
    names = _segments(node)
    if not names or not _RUNNER_NAME.search(names[-1].rstrip("[]()")):
        return None
    return _tag_from_names(names)


def _model_tag(node: ast.expr, scope: Scope) -> _Tag | None:
    if isinstance(node, ast.Name):
        return scope.local_models.get(node.id)
    if not isinstance(node, ast.Attribute):
        return None
    if isinstance(node.value, ast.Name) and node.value.id == "self":
        if node.attr in scope.class_models:
            return scope.class_models[node.attr]
        if node.attr == "model" and scope.class_name.endswith("ModelRunner"):
            return "runner"
    if node.attr == "model":
        return _runner_tag(node.value, scope)
    return None


def _assignments(fn: ast.AST) -> list[ast.Assign]:
    return [n for n in ast.walk(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1]


def _assigned_aliases(
    assigns: Sequence[ast.Assign],
    scope: Scope,
    models: dict[str, _Tag],
    runners: dict[str, _Tag],
    *,
    on_self: bool,
) -> None:
    """Record `name = <model or runner expr>` (or `self.name = ...` when on_self), flow-insensitively."""
    for _ in range(2):  # a second pass picks up aliases of aliases
        for node in assigns:
            key = _alias_key(node.targets[0], on_self=on_self)
            if key is None:
                continue
            if (tag := _model_tag(node.value, scope)) is not None:
                models[key] = tag
            elif (tag := _runner_tag(node.value, scope)) is not None:
                runners[key] = tag


def _alias_key(target: ast.expr, *, on_self: bool) -> str | None:
    """The alias an assignment target names: ``self.<key>`` when `on_self`, else a plain ``<key>``."""
    if not on_self:
        return target.id if isinstance(target, ast.Name) else None
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return target.attr
    return None


def _exits(stmts: Sequence[ast.stmt]) -> bool:
    return bool(stmts) and isinstance(stmts[-1], ast.Return | ast.Raise | ast.Continue | ast.Break)


class _Substitute(ast.NodeTransformer):
    """A helper's condition as its caller sees it: parameters replaced by the caller's argument expressions."""

    def __init__(self, mapping: Mapping[str, ast.expr]) -> None:
        self.mapping = mapping

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if isinstance(node.ctx, ast.Load) and node.id in self.mapping:
            return copy.deepcopy(self.mapping[node.id])
        return node


class UseCollector:
    """Walks one module with the stack of enclosing conditions, recording model uses on EAGLE-3 paths.

    A model passed to a function of the tree (``configure_aux_hidden_state_capture(model=self.model, ...)``,
    ``resolve_target_embed_and_head(target_model)``) is followed into it: the parameter is the model there, with
    the caller's conditions, and the helper's own conditions read with the caller's arguments. Uses in an
    ``except`` handler are optional: they run only when the guarded code failed (a fallback, not the path).
    """

    def __init__(
        self,
        tree: SourceTree,
        scope: Scope,
        knowledge: Knowledge,
        lines: Sequence[str],
        *,
        depth: int = 0,
        seen: set[tuple[int, tuple[tuple[str, str], ...]]] | None = None,
    ) -> None:
        self.tree = tree
        self.scope = scope
        self.lines = lines
        self.knowledge = knowledge
        self.uses: list[Use] = []
        #: The flags that decided whether a recorded use is on an EAGLE-3 path (shown in the report).
        self.flags_used: set[str] = set()
        self.depth = depth
        self.seen = seen if seen is not None else set()
        #: The helper's parameters -> the caller's argument expressions (for its conditions).
        self.substitute: dict[str, ast.expr] = {}
        #: Inside an except handler: uses there are optional.
        self.fallback = 0
        self.methods: dict[str, _Fn] = {}
        self.local_imports: dict[str, tuple[str, str]] = {}

    # -- statements ----------------------------------------------------------------------------------------

    def module(self, module: ast.Module) -> None:
        for node in module.body:
            if isinstance(node, ast.ClassDef):
                self.class_(node)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.function(node, _assignments(node))

    def class_(self, node: ast.ClassDef) -> None:
        """Walk a class's methods, with the ``self.<alias>`` models any of them assigns."""
        self.scope.class_name = node.name
        self.scope.class_models, self.scope.class_runners = {}, {}
        methods = [m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
        self.methods = {m.name: m for m in methods}
        assigns = {id(m): _assignments(m) for m in methods}
        everything = [a for m in methods for a in assigns[id(m)]]
        _assigned_aliases(
            everything, self.scope, self.scope.class_models, self.scope.class_runners, on_self=True
        )
        for method in methods:
            self.function(method, assigns[id(method)])
        self.scope.class_name = ""
        self.scope.class_models, self.scope.class_runners = {}, {}
        self.methods = {}

    def function(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, assigns: Sequence[ast.Assign]) -> None:
        # Every model expression spells `.model` or a class alias of one: skip functions that mention neither.
        text = "\n".join(self.lines[fn.lineno - 1 : fn.end_lineno])
        if "model" not in text and not any(alias in text for alias in self.scope.class_models):
            return
        self.scope.local_models, self.scope.local_runners = {}, {}
        self.local_imports = _local_imports(fn)
        _assigned_aliases(
            assigns, self.scope, self.scope.local_models, self.scope.local_runners, on_self=False
        )
        self.block(fn.body, [])

    def follow(
        self, fn: _Fn, bound: Mapping[str, _Tag], arguments: Mapping[str, ast.expr], guards: list[Guard]
    ) -> None:
        """Walk helper `fn` with its parameters `bound` to models, under the caller's `guards`."""
        self.scope.local_models, self.scope.local_runners = dict(bound), {}
        self.local_imports = _local_imports(fn)
        self.substitute = dict(arguments)
        _assigned_aliases(
            _assignments(fn), self.scope, self.scope.local_models, self.scope.local_runners, on_self=False
        )
        self.block(fn.body, guards)

    def _test(self, test: ast.expr) -> ast.expr:
        if not self.substitute:
            return test
        replaced = _Substitute(self.substitute).visit(copy.deepcopy(test))
        return ast.copy_location(replaced, test) if isinstance(replaced, ast.expr) else test

    def block(self, stmts: Sequence[ast.stmt], guards: list[Guard]) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                self.expr(stmt.test, guards)
                test = self._test(stmt.test)
                self.block(stmt.body, [*guards, (test, True)])
                self.block(stmt.orelse, [*guards, (test, False)])
                if _exits(stmt.body) and not stmt.orelse:
                    # `if not (eagle and not is_draft_worker): return`: what follows runs only when it is false
                    guards = [*guards, (test, False)]
            elif isinstance(stmt, ast.Try):
                self.block(stmt.body, guards)
                self.fallback += 1
                for handler in stmt.handlers:
                    self.block(handler.body, guards)
                self.fallback -= 1
                self.block(stmt.orelse, guards)
                self.block(stmt.finalbody, guards)
            elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                # A closure runs where it is called; the conditions around its definition are the best guess.
                self.block(stmt.body, guards)
            elif not isinstance(stmt, ast.ClassDef):
                self.other(stmt, guards)

    def other(self, node: ast.AST, guards: list[Guard]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self.block([child], guards)
            elif isinstance(child, ast.expr):
                self.expr(child, guards)
            else:
                self.other(child, guards)

    # -- expressions ---------------------------------------------------------------------------------------

    def expr(self, node: ast.expr, guards: list[Guard]) -> None:
        if isinstance(node, ast.BoolOp):
            # `hasattr(m, "x") and m.x`: each operand runs only when the ones before it allowed it.
            positive = isinstance(node.op, ast.And)
            for i, value in enumerate(node.values):
                self.expr(value, [*guards, *((v, positive) for v in node.values[:i])])
            return
        if isinstance(node, ast.IfExp):
            self.expr(node.test, guards)
            self.expr(node.body, [*guards, (node.test, True)])
            self.expr(node.orelse, [*guards, (node.test, False)])
            return
        if isinstance(node, ast.Call) and self.call(node, guards):
            return
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            tag = _model_tag(node.value, self.scope)
            if tag is not None:
                self.record(tag, node.attr, "attribute", node=node, receiver=node.value, guards=guards)
                return
        self.other(node, guards)

    def call(self, node: ast.Call, guards: list[Guard]) -> bool:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("hasattr", "getattr") and len(node.args) >= 2:
            return self.named_lookup(node, func.id, guards)
        if isinstance(func, ast.Attribute):
            tag = _model_tag(func.value, self.scope)
            if tag is not None:
                self.record(tag, func.attr, "call", node=node, receiver=func.value, guards=guards, call=node)
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    self.expr(arg, guards)
                return True
        self.helper(node, guards)
        return False

    def named_lookup(self, node: ast.Call, builtin: str, guards: list[Guard]) -> bool:
        """``hasattr(<model>, "x")`` (a probe) / ``getattr(<model>, "x"[, default])``: whether it was a use."""
        receiver, name = node.args[0], node.args[1]
        tag = _model_tag(receiver, self.scope)
        if tag is None or not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            return False
        probe = builtin == "hasattr"
        kind: UseKind = "probe" if probe else "attribute"
        optional = probe or len(node.args) > 2
        self.record(tag, name.value, kind, node=node, receiver=receiver, guards=guards, optional=optional)
        for arg in node.args[2:]:
            self.expr(arg, guards)
        return True

    # -- helpers that take the model -------------------------------------------------------------------------

    def helper(self, node: ast.Call, guards: list[Guard]) -> None:
        """A call passing a model (or a runner) to a function of the tree: follow it there."""
        if self.depth >= _FOLLOW_DEPTH:
            return
        given = _given(node)
        if not any(_model_tag(a, self.scope) or _runner_tag(a, self.scope) for _, a in given):
            return
        found = self._function_of(node.func)
        if found is None:
            return
        path, fn, is_method = found
        arguments = _bind_arguments(fn, given, is_method=is_method)
        bound, runners = self.tags_of(arguments)
        visit = (id(fn), tuple(sorted({**bound, **{f"{n}.runner": t for n, t in runners.items()}}.items())))
        if visit in self.seen:
            return
        self.seen.add(visit)
        self.follow_into(path, fn, bound=bound, runners=runners, arguments=arguments, guards=guards)

    def tags_of(self, arguments: Mapping[str, ast.expr]) -> tuple[dict[str, _Tag], dict[str, _Tag]]:
        """(parameters bound to a model, parameters bound to a runner) -> the role its name tells."""
        bound = {n: t for n, v in arguments.items() if (t := _model_tag(v, self.scope)) is not None}
        runners = {n: t for n, v in arguments.items() if n not in bound and (t := _runner_tag(v, self.scope))}
        return bound, runners

    def follow_into(
        self,
        path: Path,
        fn: _Fn,
        *,
        bound: Mapping[str, _Tag],
        runners: Mapping[str, _Tag],
        arguments: Mapping[str, ast.expr],
        guards: list[Guard],
    ) -> None:
        """Walk helper `fn` (in `path`) one level deeper, and keep the uses and flags it finds."""
        scope = Scope(file=path, worker_module=self.scope.worker_module, speculative=self.scope.speculative)
        child = UseCollector(
            self.tree, scope, self.knowledge, self.tree.lines(path), depth=self.depth + 1, seen=self.seen
        )
        child.fallback = self.fallback
        child.scope.local_runners = dict(runners)
        child.follow(fn, bound, arguments, guards)
        self.uses.extend(child.uses)
        self.flags_used |= child.flags_used

    def _function_of(self, func: ast.expr) -> tuple[Path, _Fn, bool] | None:
        """(file, def, is a method) of a called function of the tree: a module function (imported, maybe
        inside the calling function) or a method of the current class called on self."""
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
            and func.attr in self.methods
        ):
            return self.scope.file, self.methods[func.attr], True
        if not isinstance(func, ast.Name):
            return None
        module = self.tree.module_of(self.scope.file)
        if func.id in self.local_imports:
            module, name = self.local_imports[func.id]
        else:
            name = func.id
        return _module_function(self.tree, module, name)

    def record(
        self,
        tag: _Tag,
        name: str,
        kind: UseKind,
        *,
        node: ast.expr,
        receiver: ast.expr,
        guards: list[Guard],
        optional: bool = False,
        call: ast.Call | None = None,
    ) -> None:
        if tag == "runner":
            # In speculative/ every runner but the target's is the draft's (EAGLE workers are draft workers).
            roles: tuple[Role, ...] = ("draft",) if self.scope.speculative else ROLES
        else:
            roles = (tag,)
        positional, keywords = _arity(call)
        for role in roles:
            if not self.on_eagle3_path(guards, role):
                continue
            self.note_flags(guards)
            self.uses.append(
                Use(
                    role=role,
                    name=name,
                    kind=kind,
                    site=self.tree.site(self.scope.file, node.lineno),
                    receiver=_text(receiver),
                    positional=positional,
                    keywords=keywords,
                    optional=optional or self.fallback > 0 or self.probed(name, guards),
                    guard=_guard_text(guards),
                )
            )

    def on_eagle3_path(self, guards: Sequence[Guard], role: Role) -> bool:
        """Whether a use under `guards` runs for `role` with EAGLE-3, and only (or because of) speculation."""
        if not self.knowledge.reachable(guards, role):
            return False
        return (
            self.scope.worker_module
            or self.knowledge.specific(guards, role)
            or self.knowledge.enabled_by_eagle3(guards, role)
        )

    def note_flags(self, guards: Sequence[Guard]) -> None:
        """Remember the EAGLE-3 flags `guards` read: they decided that a use is on the path."""
        known = {*self.knowledge.flags, *self.knowledge.shared}
        for test, _ in guards:
            names = {last_name(n) for n in ast.walk(test)}
            self.flags_used |= {n for n in names if n is not None and n in known}

    def probed(self, name: str, guards: Sequence[Guard]) -> bool:
        """Whether a positive enclosing condition is `hasattr(<model>, name)`: then the use is optional."""
        for test, positive in guards:
            if not positive:
                continue
            parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
            for part in parts:
                found = named_call(part, "hasattr", 2)
                if found is not None and found[1] == name and _model_tag(found[0][0], self.scope) is not None:
                    return True
        return False


def _arity(call: ast.Call | None) -> tuple[int | None, tuple[str, ...]]:
    """(positional count, keyword names) of a call; the count is None past a ``*args`` or ``**kwargs``."""
    if call is None:
        return None, ()
    starred = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
    return None if starred else len(call.args), tuple(k.arg for k in call.keywords if k.arg is not None)


def _given(call: ast.Call) -> list[tuple[int | str, ast.expr]]:
    """A call's arguments as (position or keyword, value); ``**kwargs`` left out."""
    given: list[tuple[int | str, ast.expr]] = [(i, a) for i, a in enumerate(call.args)]
    return given + [(k.arg, k.value) for k in call.keywords if k.arg]


def _bind_arguments(
    fn: _Fn, given: Sequence[tuple[int | str, ast.expr]], *, is_method: bool
) -> dict[str, ast.expr]:
    """The parameters of `fn` that the given (position or keyword, value) arguments bind; ``*x`` is skipped."""
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)][1 if is_method else 0 :]
    names = {*params, *(a.arg for a in fn.args.kwonlyargs)}
    arguments: dict[str, ast.expr] = {}
    for key, value in given:
        if isinstance(value, ast.Starred):
            continue
        name = params[key] if isinstance(key, int) and key < len(params) else key
        if isinstance(name, str) and name in names:
            arguments[name] = value
    return arguments


def _local_imports(fn: _Fn) -> dict[str, tuple[str, str]]:
    """``from x import y`` inside a function: local name -> (module, name) (absolute imports only)."""
    out: dict[str, tuple[str, str]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                out[alias.asname or alias.name] = (node.module, alias.name)
    return out


def _module_function(
    tree: SourceTree, module: str, name: str, depth: int = 0
) -> tuple[Path, _Fn, bool] | None:
    """A top-level function `name` of `module`, following ``from x import name`` across the tree."""
    path = tree.path_of(module)
    if path is None or depth > 8 or not path.is_relative_to(tree.root):
        return None
    entries = tree.bindings(module).get(name)
    if not entries:
        return None
    stmt = entries[-1][1]
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        return path, stmt, False
    if isinstance(stmt, ast.ImportFrom):
        alias = next(a for a in stmt.names if (a.asname or a.name) == name)
        source = resolve_relative(module, tree.is_package(module), stmt.level, stmt.module)
        return _module_function(tree, source, alias.name, depth + 1)
    return None


__all__ = [
    "EAGLE3",
    "NO_SPEC",
    "Guard",
    "Knowledge",
    "Scope",
    "Tri",
    "UseCollector",
    "World",
    "all3",
    "any3",
    "not3",
]
