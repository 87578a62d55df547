"""Evaluate small pieces of a Python source tree for a given GPU: the partial evaluator.

The tree itself (modules -> files, parsed once) is `sourcetree.SourceTree`, re-exported here; the values are in
`pyvalues`, the model of torch / os / functools / builtins in `pyplatform`, expressions in `pyexpr`; this module
runs statements and is the entry point.

`Evaluator` is a partial evaluator for the part of Python that capability checks are written in. It runs a
function or an expression of the *real* source with the GPU fixed (``torch.cuda.get_device_capability()`` is
``(12, 0)`` for sm_120, ``torch.version.cuda`` is the cell's CUDA) and everything else unknown. Unknown values
propagate (``UNKNOWN and False`` is False, ``UNKNOWN or False`` is unknown); an ``if`` on an unknown test runs both
branches and merges what they bind. A subscript of a known dict with a known missing key is a crash
(``KeyError: 12``), exactly as at run time. Module globals that some function rebinds with ``global`` are unknown,
since they are state set at run time, not at import.

It never imports the code under analysis, so it works on any machine, for any target arch.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stackfarm.analysis.pyexpr import ExpressionEvaluator
from stackfarm.analysis.pyvalues import (
    CAUGHT_BY,
    MAX_UNROLL,
    MUTATORS,
    STARS,
    UNKNOWN,
    UNRESOLVED,
    Budget,
    ClassValue,
    Crash,
    Decision,
    DeviceProperties,
    End,
    EndKind,
    Environ,
    External,
    Frame,
    Function,
    ImportRef,
    Instance,
    ModuleRef,
    PathValue,
    Unknown,
    Unresolved,
    copy_value,
    exception_name,
    function_locals,
    join,
    join_all,
    jumps,
    known,
    node_text,
    truth,
)
from stackfarm.analysis.sourcetree import SourceError, SourceTree, caught_names, resolve_relative


class Evaluator(ExpressionEvaluator):
    """Evaluate functions and expressions of a `SourceTree` for one GPU and one CUDA version.

    `observe` is called with ``(dotted_name, args)`` whenever evaluated code calls something outside the tree with
    known arguments (a loader's ``glob.glob(pattern)``, say); its return value is used as the call's result.
    `assume` gives values to attributes of otherwise unknown objects (``{"enable_torch_symm_mem": True}``: the
    deployment sets that server argument). Packages in `opaque` are modelled, never read, even when the tree
    holds their source: torch's real ``get_device_capability`` would only ask the (absent) driver.
    `environ` is the environment the deployment runs with; a variable not in it is unset (so
    ``os.environ.get("X", "1")`` is "1"), but ``os.environ["X"]`` of an unset one is unknown rather than a crash.
    """

    # ----------------------------------------------------------------------- entry points

    def lookup(self, qualname: str) -> object:
        """The value of ``module.Symbol.attr`` (a function, class, constant ...)."""
        module, attrs = self.tree.split(qualname)
        value: object = ModuleRef(module)
        for attr in attrs:
            value = self._getattr(value, attr)
            if value is UNKNOWN:
                raise SourceError(f"{qualname}: {attr!r} not found in {module}")
        return value

    def run(self, qualname: str) -> list[End]:
        """Run the body of function `qualname` with unknown arguments; methods get a fresh `self` of their class.

        Returns how each path ends (merged where branches join). Raises `SourceError` when it is not a function.
        """
        module, attrs = self.tree.split(qualname)
        owner: object = ModuleRef(module)
        value: object = owner
        for attr in attrs:
            owner, value = value, self._getattr(value, attr)
        if not isinstance(value, Function) or isinstance(value.node, ast.Lambda):
            raise SourceError(f"{qualname} is not a function in {module} (found {type(value).__name__})")
        self_obj = Instance(owner) if isinstance(owner, ClassValue) else None
        return self._run_function(value, (), {}, self_obj=self_obj, at_top=True)

    def expression(
        self,
        module: str,
        node: ast.expr,
        local_names: Sequence[str] = (),
        *,
        bound: Mapping[str, object] | None = None,
    ) -> object:
        """Evaluate `node` as written in `module`, with `local_names` (a function's locals) unknown and the
        names of `bound` (parameters that carry a flag, say) given those values."""
        env: dict[str, object] = dict.fromkeys(local_names, UNKNOWN)
        env.update(bound or {})
        frame = Frame(module, env, self_obj=Instance(None) if "self" in env else None)
        if frame.self_obj is not None:
            env["self"] = frame.self_obj
        try:
            return self._eval(node, frame)
        except Budget:
            return UNKNOWN

    # ----------------------------------------------------------------------- statements

    def _exec_block(self, body: Sequence[ast.stmt], frame: Frame) -> list[End]:
        """Run statements; returns the non-falling ends, plus one ``fall`` end if some path falls through."""
        ends: list[End] = []
        for stmt in body:
            self._tick()
            try:
                new_ends = self._exec(stmt, frame)
            except Crash as crash:
                ends.append(_crash_end(crash, stmt, frame))
                return ends
            falls = [e for e in new_ends if e.kind == "fall"]
            ends.extend(e for e in new_ends if e.kind != "fall")
            if not falls:
                return ends
        ends.append(
            End(
                "fall",
                frame.module,
                body[-1].end_lineno or 0 if body else 0,
                decision=frame.decision,
                unresolved=frame.unresolved,
            )
        )
        return ends

    def _branch(
        self, body: Sequence[ast.stmt], frame: Frame, unresolved: Unresolved | None = None
    ) -> tuple[list[End], Frame]:
        # each branch gets its own copies of lists / sets / dicts, since statements like `x.add(v)` change them
        sub = Frame(
            frame.module,
            {k: copy_value(v) for k, v in frame.env.items()},
            frame.decision,
            frame.self_obj,
            frame.unresolved or unresolved,
        )
        if frame.self_obj is not None:
            # branches may set different attributes on self: give each its own copy, merged afterwards
            sub.self_obj = Instance(
                frame.self_obj.cls,
                {k: copy_value(v) for k, v in frame.self_obj.attrs.items()},
                dict(frame.self_obj.unresolved),
            )
            sub.env = {k: (sub.self_obj if v is frame.self_obj else v) for k, v in sub.env.items()}
        return (self._exec_block(body, sub) if body else [End("fall", frame.module, 0)]), sub

    def _merge_into(self, frame: Frame, subs: Sequence[Frame], unresolved: Unresolved | None = None) -> None:
        """Join what the branches bound; with `unresolved` (the test that chose between them), a name whose
        value the branches disagree on depends on it."""
        keys = set().union(*(s.env for s in subs))
        taints: dict[str, Unresolved] = {}
        for sub in subs:
            found = sub.env.get(UNRESOLVED)
            taints.update(found if isinstance(found, dict) else {})
        for key in keys:
            if key == UNRESOLVED:
                continue
            joined = _merged_name(frame, key, subs)
            frame.env[key] = joined.value
            if unresolved is not None and joined.disagree:
                taints.setdefault(key, unresolved)
        if taints:
            frame.env[UNRESOLVED] = taints
        if frame.self_obj is not None:
            _merge_self(frame.self_obj, subs, unresolved)

    def _decide(self, frame: Frame, node: ast.expr) -> bool | Unknown:
        value = truth(self._eval(node, frame))
        if value is not UNKNOWN:
            frame.decision = Decision(frame.module, node.lineno, node_text(node), bool(value))
        return value

    def _exec(self, stmt: ast.stmt, frame: Frame) -> list[End]:
        rule = _STATEMENTS.get(type(stmt), Evaluator._exec_other)
        return rule(self, stmt, frame)

    @staticmethod
    def _fall(stmt: ast.stmt, frame: Frame) -> list[End]:
        return [End("fall", frame.module, stmt.lineno)]

    def _exec_if(self, stmt: ast.If, frame: Frame) -> list[End]:
        mark = len(self.unresolved)
        test = self._decide(frame, stmt.test)
        if test is True:
            return self._exec_block(stmt.body, frame) if stmt.body else self._fall(stmt, frame)
        if test is False:
            return self._exec_block(stmt.orelse, frame) if stmt.orelse else self._fall(stmt, frame)
        # an unknown test: both branches run; if it is unknown because of an unresolved value, so are they
        cause = self.unresolved[mark] if len(self.unresolved) > mark else None
        return self._both_branches(stmt, frame, cause)

    def _both_branches(self, stmt: ast.If, frame: Frame, cause: Unresolved | None) -> list[End]:
        """An ``if`` on an unknown test: run each branch on its own copy, then join the ones that fall through."""
        ends_a, sub_a = self._branch(stmt.body, frame, cause)
        ends_b, sub_b = self._branch(stmt.orelse, frame, cause)
        live = [s for s, e in ((sub_a, ends_a), (sub_b, ends_b)) if any(x.kind == "fall" for x in e)]
        if live:
            self._merge_into(frame, live, cause)
        return [e for e in ends_a + ends_b if e.kind != "fall"] + (self._fall(stmt, frame) if live else [])

    def _exec_return(self, stmt: ast.Return, frame: Frame) -> list[End]:
        mark = len(self.unresolved)
        value = self._eval(stmt.value, frame) if stmt.value is not None else None
        cause = frame.unresolved
        if cause is None and value is UNKNOWN and len(self.unresolved) > mark:
            cause = self.unresolved[mark]
        return [End("return", frame.module, stmt.lineno, value, decision=frame.decision, unresolved=cause)]

    def _exec_raise(self, stmt: ast.Raise, frame: Frame) -> list[End]:
        text = node_text(stmt.exc) if stmt.exc is not None else "re-raise"
        return [
            End(
                "raise",
                frame.module,
                stmt.lineno,
                detail=text,
                decision=frame.decision,
                unresolved=frame.unresolved,
            )
        ]

    def _exec_assert(self, stmt: ast.Assert, frame: Frame) -> list[End]:
        mark = len(self.unresolved)
        test = self._decide(frame, stmt.test)
        if test is False:
            detail = f"AssertionError: {node_text(stmt.test)}"
            return [
                End(
                    "raise",
                    frame.module,
                    stmt.lineno,
                    detail=detail,
                    decision=frame.decision,
                    unresolved=frame.unresolved,
                )
            ]
        if test is UNKNOWN and len(self.unresolved) > mark and frame.unresolved is None:
            frame.unresolved = self.unresolved[mark]  # getting past it depends on an unresolved value
        return self._fall(stmt, frame)

    def _assigned(self, value_node: ast.expr, frame: Frame) -> tuple[object, Unresolved | None]:
        mark = len(self.unresolved)
        value = self._eval(value_node, frame)
        cause = self.unresolved[mark] if value is UNKNOWN and len(self.unresolved) > mark else None
        return value, cause

    def _exec_assign(self, stmt: ast.Assign, frame: Frame) -> list[End]:
        value, cause = self._assigned(stmt.value, frame)
        for target in stmt.targets:
            self._bind(target, value, frame)
            self._taint_bound(target, cause, frame)
        return self._fall(stmt, frame)

    def _exec_annassign(self, stmt: ast.AnnAssign, frame: Frame) -> list[End]:
        if stmt.value is not None:
            value, cause = self._assigned(stmt.value, frame)
            self._bind(stmt.target, value, frame)
            self._taint_bound(stmt.target, cause, frame)
        return self._fall(stmt, frame)

    def _exec_augassign(self, stmt: ast.AugAssign, frame: Frame) -> list[End]:
        self._bind(stmt.target, UNKNOWN, frame)
        return self._fall(stmt, frame)

    def _exec_def(self, stmt: ast.FunctionDef | ast.AsyncFunctionDef, frame: Frame) -> list[End]:
        # a nested function sees its parent's locals as they are now (good enough for helpers and closures)
        closure = None if frame.env is self._namespaces.get(frame.module) else dict(frame.env)
        frame.env[stmt.name] = Function(frame.module, stmt, stmt.name, closure=closure)
        return self._fall(stmt, frame)

    def _exec_class(self, stmt: ast.ClassDef, frame: Frame) -> list[End]:
        frame.env[stmt.name] = ClassValue(frame.module, stmt, stmt.name)
        return self._fall(stmt, frame)

    def _exec_import(self, stmt: ast.Import | ast.ImportFrom, frame: Frame) -> list[End]:
        self._import(stmt, frame)
        return self._fall(stmt, frame)

    def _exec_with(self, stmt: ast.With | ast.AsyncWith, frame: Frame) -> list[End]:
        for item in stmt.items:
            if item.optional_vars is not None:
                self._bind(item.optional_vars, UNKNOWN, frame)
        return self._exec_block(stmt.body, frame)

    def _exec_expr(self, stmt: ast.Expr, frame: Frame) -> list[End]:
        self._mutation(stmt.value, frame)
        return self._fall(stmt, frame)

    def _exec_nothing(self, stmt: ast.stmt, frame: Frame) -> list[End]:
        """pass, global, nonlocal, break, continue, del: nothing the evaluator tracks."""
        return self._fall(stmt, frame)

    def _exec_other(self, stmt: ast.stmt, frame: Frame) -> list[End]:
        """match statements and anything newer: whatever they bind is unknown."""
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                frame.env[node.id] = UNKNOWN
        return self._fall(stmt, frame)

    def _mutation(self, node: ast.expr, frame: Frame) -> None:
        """``x.add(v)`` / ``x.append(v)`` ... on a known container changes it; with an unknown argument the
        container becomes unknown. Other expression statements have no effect the evaluator tracks."""
        if isinstance(node, ast.Call) and _sets_attribute(node.func):
            self._eval(node, frame)  # setattr(obj, "x", v) / object.__setattr__(self, "x", v): sets obj.x
            return
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            return
        if node.func.attr not in MUTATORS or node.keywords:
            return
        receiver = self._eval(node.func.value, frame)
        if not isinstance(receiver, list | set | dict) or isinstance(receiver, Environ):
            return
        self._mutate(receiver, node, node.func, frame)

    def _mutate(self, receiver: object, node: ast.Call, method: ast.Attribute, frame: Frame) -> None:
        """Run ``receiver.method(*args)`` for real on known arguments; otherwise the receiver becomes unknown."""
        args = [self._eval(a, frame) for a in node.args]
        if all(known(a) for a in args) and not any(isinstance(a, ast.Starred) for a in node.args):
            try:
                getattr(receiver, method.attr)(*args)
            except Exception:  # e.g. list.remove of a missing item: leave the container unknown
                self._bind(method.value, UNKNOWN, frame)
            return
        self._bind(method.value, UNKNOWN, frame)

    def _loop(self, stmt: ast.For | ast.AsyncFor | ast.While, frame: Frame) -> list[End]:
        # A for loop over a short known sequence, without break / continue / return inside, is unrolled;
        # any other loop is not: what it binds becomes unknown, and a return inside is a possible end.
        if isinstance(stmt, ast.For) and not stmt.orelse and not jumps(stmt.body):
            items = self._eval(stmt.iter, frame)
            if (
                isinstance(items, list | tuple | set | frozenset | range | str | dict)
                and len(items) <= MAX_UNROLL
            ):
                return self._unroll(stmt, list(items), frame)
        return self._forget_loop(stmt, frame)

    def _unroll(self, stmt: ast.For, items: list[object], frame: Frame) -> list[End]:
        """Run the loop's body once per item; stop at the first pass on which no path falls through."""
        failing: list[End] = []
        for item in items:
            self._bind(stmt.target, item, frame)
            step = self._exec_block(stmt.body, frame)
            failing += [e for e in step if e.kind != "fall"]
            if not any(e.kind == "fall" for e in step):
                return failing
        return [*failing, End("fall", frame.module, stmt.lineno)]

    def _forget_loop(self, stmt: ast.For | ast.AsyncFor | ast.While, frame: Frame) -> list[End]:
        """A loop not unrolled: what it binds or changes is unknown after it, and each return is a possible end."""
        ends: list[End] = []
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                frame.env[node.id] = UNKNOWN
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and frame.self_obj is not None
            ):
                frame.self_obj.attrs[node.attr] = UNKNOWN
            elif isinstance(node, ast.Return):
                ends.append(
                    End(
                        "return",
                        frame.module,
                        node.lineno,
                        UNKNOWN,
                        decision=frame.decision,
                        unresolved=frame.unresolved,
                    )
                )
        for changed in _mutated(stmt):  # containers changed in the loop are unknown after it
            self._bind(changed, UNKNOWN, frame)
        return [*ends, End("fall", frame.module, stmt.lineno)]

    def _try(self, stmt: ast.Try, frame: Frame) -> list[End]:
        before = dict(frame.env)
        ends = self._exec_block(stmt.body, frame)
        out: list[End] = []
        for end in ends:
            handler = self._catcher(stmt, end)
            if handler is None:
                out.append(end)
            else:
                self._run_handler(handler, before, frame, out)
        if any(e.kind == "fall" for e in out) and stmt.orelse:
            out = [e for e in out if e.kind != "fall"] + self._exec_block(stmt.orelse, frame)
        if stmt.finalbody:
            self._exec_block(stmt.finalbody, frame)
        return out

    def _run_handler(
        self, handler: ast.ExceptHandler, before: Mapping[str, object], frame: Frame, out: list[End]
    ) -> None:
        """Run an ``except`` body from the names as they were before the ``try`` (what the body bound since is
        unknown); its ends join `out`, and while some path falls through, what it binds joins the frame."""
        sub = Frame(frame.module, {**before, **{k: UNKNOWN for k in frame.env if k not in before}})
        sub.self_obj = frame.self_obj
        sub.unresolved = frame.unresolved
        if handler.name:
            sub.env[handler.name] = UNKNOWN
        out.extend(self._exec_block(handler.body, sub))
        if any(e.kind == "fall" for e in out):
            for key, value in sub.env.items():
                frame.env[key] = join(frame.env.get(key, UNKNOWN), value)

    @classmethod
    def _catcher(cls, stmt: ast.Try, end: End) -> ast.ExceptHandler | None:
        """The ``except`` clause that catches the error a path ends on; None for a path that ends otherwise."""
        kind = exception_name(end.detail) if end.kind in ("crash", "raise") else None
        return cls._handler(stmt, kind) if kind else None

    @staticmethod
    def _handler(stmt: ast.Try, kind: str) -> ast.ExceptHandler | None:
        caught = CAUGHT_BY.get(kind, {kind, "Exception", "BaseException"})
        for handler in stmt.handlers:
            names = caught_names(handler)
            if names is None or any(name in caught for name in names):
                return handler
        return None

    def _import(self, stmt: ast.Import | ast.ImportFrom, frame: Frame) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    frame.env[alias.asname] = self._module_value(alias.name)
                else:
                    top = alias.name.split(".")[0]
                    frame.env[top] = self._module_value(top)
            return
        self._import_from(stmt, frame)

    def _import_from(self, stmt: ast.ImportFrom, frame: Frame) -> None:
        """``from m import a, *``: lazy references into the tree, external names outside it."""
        target = resolve_relative(frame.module, self.tree.is_package(frame.module), stmt.level, stmt.module)
        for alias in stmt.names:
            if alias.name == "*":
                if self._in_tree(target):
                    stars = frame.env.get(STARS, ())
                    frame.env[STARS] = (*(stars if isinstance(stars, tuple) else ()), target)
                continue
            if not self._in_tree(target):
                frame.env[alias.asname or alias.name] = External(f"{target}.{alias.name}")
            else:
                frame.env[alias.asname or alias.name] = ImportRef(target, alias.name)

    def _module_value(self, name: str) -> object:
        return ModuleRef(name) if self._in_tree(name) else External(name)


#: One method per statement type; any other statement runs as `Evaluator._exec_other`.
_STATEMENTS: dict[type[ast.stmt], Callable[[Evaluator, Any, Frame], list[End]]] = {
    ast.If: Evaluator._exec_if,
    ast.Return: Evaluator._exec_return,
    ast.Raise: Evaluator._exec_raise,
    ast.Assert: Evaluator._exec_assert,
    ast.Assign: Evaluator._exec_assign,
    ast.AnnAssign: Evaluator._exec_annassign,
    ast.AugAssign: Evaluator._exec_augassign,
    ast.FunctionDef: Evaluator._exec_def,
    ast.AsyncFunctionDef: Evaluator._exec_def,
    ast.ClassDef: Evaluator._exec_class,
    ast.Import: Evaluator._exec_import,
    ast.ImportFrom: Evaluator._exec_import,
    ast.Try: Evaluator._try,
    ast.With: Evaluator._exec_with,
    ast.AsyncWith: Evaluator._exec_with,
    ast.For: Evaluator._loop,
    ast.AsyncFor: Evaluator._loop,
    ast.While: Evaluator._loop,
    ast.Expr: Evaluator._exec_expr,
    **dict.fromkeys(
        (ast.Pass, ast.Global, ast.Nonlocal, ast.Break, ast.Continue, ast.Delete), Evaluator._exec_nothing
    ),
}


def _crash_end(crash: Crash, stmt: ast.stmt, frame: Frame) -> End:
    """How a path ends on an error raised while running `stmt`: where it was raised, and by which calls."""
    kind: EndKind = "raise" if crash.deliberate else "crash"
    decision = crash.decision or frame.decision
    via = crash.via
    inside = crash.module == frame.module and stmt.lineno <= crash.line <= (stmt.end_lineno or 0)
    if not inside:  # raised in a called function: remember where we called it
        via = (*via, (frame.module, stmt.lineno))
    return End(
        kind,
        crash.module,
        crash.line,
        detail=str(crash),
        decision=decision,
        via=via,
        unresolved=frame.unresolved,
    )


@dataclass(frozen=True)
class _Joined:
    """A name's value after the branches join, and whether it is unknown only because they disagree."""

    value: object
    disagree: bool


def _merged_name(frame: Frame, key: str, subs: Sequence[Frame]) -> _Joined:
    """The value of `key` after the branches `subs` join into `frame`."""
    values = [s.env.get(key, UNKNOWN) for s in subs]
    if frame.self_obj is not None and all(v is s.self_obj for v, s in zip(values, subs, strict=True)):
        return _Joined(frame.self_obj, False)  # each branch's own copy of self: merged by _merge_self
    if key == STARS:  # `from m import *` in either branch: look names up in all of them
        return _Joined(_star_union(values), False)
    value = join_all(values)
    return _Joined(value, value is UNKNOWN and any(v is not UNKNOWN for v in values))


def _merge_self(self_obj: Instance, subs: Sequence[Frame], unresolved: Unresolved | None) -> None:
    """Join the attributes each branch's copy of ``self`` holds; an unknown one depends on `unresolved`."""
    attrs = set().union(*(s.self_obj.attrs for s in subs if s.self_obj))
    for attr in attrs:
        vals = [s.self_obj.attrs.get(attr, UNKNOWN) if s.self_obj else UNKNOWN for s in subs]
        self_obj.attrs[attr] = join_all(vals)
        _inherit_taint(self_obj, attr, subs)
        if unresolved is not None and self_obj.attrs[attr] is UNKNOWN:
            self_obj.unresolved.setdefault(attr, unresolved)


def _star_union(values: Sequence[object]) -> tuple[object, ...]:
    """The modules any branch's ``from m import *`` named, each once, in order."""
    return tuple(dict.fromkeys(m for v in values if isinstance(v, tuple) for m in v))


def _inherit_taint(self_obj: Instance, attr: str, subs: Sequence[Frame]) -> None:
    """``self.attr`` after the join depends on what it depended on in any branch (the first such wins)."""
    for sub in subs:
        if sub.self_obj is not None and attr in sub.self_obj.unresolved:
            self_obj.unresolved.setdefault(attr, sub.self_obj.unresolved[attr])


def _mutated(stmt: ast.stmt) -> list[ast.expr]:
    """The receivers of ``x.append(v)`` / ``x.add(v)`` ... calls inside `stmt`, in walk order."""
    return [
        node.func.value
        for node in ast.walk(stmt)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
    ]


def _sets_attribute(func: ast.expr) -> bool:
    """``setattr`` or ``object.__setattr__``: an expression statement the evaluator runs for its effect."""
    if isinstance(func, ast.Name):
        return func.id == "setattr"
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "__setattr__"
        and isinstance(func.value, ast.Name)
        and func.value.id == "object"
    )


__all__ = [
    "UNKNOWN",
    "ClassValue",
    "Crash",
    "Decision",
    "DeviceProperties",
    "End",
    "Evaluator",
    "External",
    "Function",
    "ImportRef",
    "Instance",
    "ModuleRef",
    "PathValue",
    "SourceError",
    "SourceTree",
    "function_locals",
    "join",
    "resolve_relative",
    "truth",
]
