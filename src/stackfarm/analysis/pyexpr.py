"""Expressions for `pysource.Evaluator`: names across modules, attributes, calls and function bodies.

`ExpressionEvaluator` holds the evaluator's state and evaluates one expression at a time, one method per node
type (`_EXPRESSIONS`); running a function's body, a module's top level or a class body is a statement matter,
left to `pysource.Evaluator` (`_exec_block`, `_exec`).
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stackfarm.analysis.arch import Arch
from stackfarm.analysis.pyplatform import Platform
from stackfarm.analysis.pyvalues import (
    BIN_OPS,
    CMP_OPS,
    MAX_DEPTH,
    MAX_STEPS,
    MAX_UNROLL,
    STARS,
    UNKNOWN,
    UNRESOLVED,
    BoundMethod,
    Budget,
    ClassValue,
    Crash,
    Decision,
    End,
    Environ,
    External,
    Frame,
    Function,
    Identity,
    ImportRef,
    Instance,
    ModuleRef,
    PathValue,
    Unresolved,
    apply_op,
    call_pure,
    call_result,
    decorated,
    freeze,
    item_of,
    join,
    memo_key,
    node_text,
    reassigned_attrs,
    truth,
    value_attr,
)
from stackfarm.analysis.sourcetree import SourceTree


class ExpressionEvaluator:
    """The evaluator's state, module namespaces and expressions; see `pysource.Evaluator` for the arguments."""

    def __init__(
        self,
        tree: SourceTree,
        gpu: Arch,
        cuda: str,
        *,
        observe: Callable[[str, tuple[object, ...]], object] | None = None,
        assume: Mapping[str, object] | None = None,
        opaque: Sequence[str] = ("torch",),
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.tree = tree
        self._environ = Environ(environ or {})
        self.assume = dict(assume or {})
        self.opaque = tuple(opaque)
        self.gpu = gpu
        self.cuda = cuda
        self.observe = observe
        self.platform = Platform(gpu, cuda, self._environ, observe)
        self._namespaces: dict[str, dict[str, object]] = {}
        self._loading: set[str] = set()
        self._runtime_globals: dict[str, frozenset[str]] = {}
        self._memo: dict[tuple[object, ...], object] = {}
        self._active: set[int] = set()
        self._depth = 0
        self._steps = 0
        #: Every value met so far that the evaluator could not resolve, in order: an expression whose
        #: evaluation adds to it depends on one (`Unresolved`).
        self.unresolved: list[Unresolved] = []
        self._memo_unresolved: dict[tuple[object, ...], tuple[Unresolved, ...]] = {}
        #: The expression being evaluated, for the place of an `Unresolved`.
        self._where: tuple[str, ast.AST] | None = None

    # ----------------------------------------------------------------------- statements (pysource.Evaluator)

    def _exec_block(self, body: Sequence[ast.stmt], frame: Frame) -> list[End]:
        """Run statements; returns how the paths through them end."""
        raise NotImplementedError

    def _exec(self, stmt: ast.stmt, frame: Frame) -> list[End]:
        raise NotImplementedError

    def _tick(self) -> None:
        self._steps += 1
        if self._steps > MAX_STEPS:
            raise Budget

    # ----------------------------------------------------------------------- modules and names

    def namespace(self, module: str) -> dict[str, object]:
        """The module's globals after its top level ran (lazily, once); a module being loaded sees a partial one."""
        if module in self._namespaces:
            return self._namespaces[module]
        tree = self.tree.module(module)
        path = self.tree.path_of(module)
        env: dict[str, object] = {"__name__": module, "__file__": str(path) if path else UNKNOWN}
        self._namespaces[module] = env
        if tree is None:
            return env
        self._loading.add(module)
        mark, where = len(self.unresolved), self._where
        try:
            frame = Frame(module, env)
            self._exec_block(tree.body, frame)
        except Budget:
            pass
        finally:
            self._loading.discard(module)
            # what the names it bound depend on stays with them (UNRESOLVED); loading itself taints nothing
            del self.unresolved[mark:]
            self._where = where
        for name in self._runtime_set(module, tree):
            env[name] = UNKNOWN
        return env

    def _runtime_set(self, module: str, tree: ast.Module) -> frozenset[str]:
        if module not in self._runtime_globals:
            names = {
                name
                for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                for inner in ast.walk(node)
                if isinstance(inner, ast.Global)
                for name in inner.names
            }
            self._runtime_globals[module] = frozenset(names)
        return self._runtime_globals[module]

    def _global(self, module: str, name: str) -> object:
        env = self.namespace(module)
        if name in env:
            self._taint_of(env, name)
            return env[name]
        stars = env.get(STARS, ())
        for star in stars if isinstance(stars, tuple) else ():
            value = self._from_module(star, name)
            if value is not UNKNOWN:
                return value
        if hasattr(builtins, name):
            return External(f"builtins.{name}")
        hook = env.get("__getattr__")
        if isinstance(hook, Function):  # PEP 562: the module answers it at run time
            self._unresolvable(f"{module}.__getattr__ answers {name!r} at run time", module, name)
        return UNKNOWN

    # ----------------------------------------------------------------------- unresolved values

    def _unresolvable(self, why: str, module: str = "", name: str = "") -> Unresolved:
        """Record that the value being evaluated is one the evaluator cannot resolve (not a run-time input)."""
        if self._where is not None:
            where_module, node = self._where
            event = Unresolved(where_module, getattr(node, "lineno", 0), node_text(node), why)
        else:
            event = Unresolved(module, 0, name, why)
        self.unresolved.append(event)
        return event

    def _taint_of(self, env: Mapping[str, object], name: str) -> None:
        """Reading a name bound to an unresolved value taints the expression that reads it."""
        taints = env.get(UNRESOLVED)
        if isinstance(taints, dict) and name in taints and env.get(name) is UNKNOWN:
            self.unresolved.append(taints[name])

    def _taint_bound(self, target: ast.expr, event: Unresolved | None, frame: Frame) -> None:
        """After `target = <value>`: remember (or forget) that the value bound is unresolved."""
        if isinstance(target, ast.Name):
            taints = frame.env.get(UNRESOLVED)
            if event is not None:
                if not isinstance(taints, dict):
                    taints = {}
                    frame.env[UNRESOLVED] = taints
                taints[target.id] = event
            elif isinstance(taints, dict):
                taints.pop(target.id, None)
        elif isinstance(target, ast.Tuple | ast.List):
            for sub in target.elts:
                self._taint_bound(sub, event, frame)
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            obj = frame.env.get(target.value.id)
            if isinstance(obj, Instance):
                _taint_attr(obj, target.attr, event)

    def _in_tree(self, module: str) -> bool:
        if any(module == o or module.startswith(f"{o}.") for o in self.opaque):
            return False
        return self.tree.path_of(module) is not None

    def _from_module(self, module: str, name: str) -> object:
        if not self._in_tree(module):
            return External(f"{module}.{name}")
        if self.tree.path_of(f"{module}.{name}") and name not in self.namespace(module):
            return ModuleRef(f"{module}.{name}")
        return self._global(module, name)

    def _deref(self, value: object) -> object:
        for _ in range(32):
            if not isinstance(value, ImportRef):
                return value
            value = self._from_module(value.module, value.name)
        return UNKNOWN

    def _bind(self, target: ast.expr, value: object, frame: Frame) -> None:
        if isinstance(target, ast.Name):
            frame.env[target.id] = value
        elif isinstance(target, ast.Tuple | ast.List):
            items: Sequence[object]
            if isinstance(value, tuple | list) and len(value) == len(target.elts):
                items = value
            else:
                items = [UNKNOWN] * len(target.elts)
            for sub, item in zip(target.elts, items, strict=True):
                self._bind(sub, item, frame)
        elif isinstance(target, ast.Attribute):
            obj = self._eval(target.value, frame)
            if isinstance(obj, Instance):
                obj.attrs[target.attr] = value
        elif isinstance(target, ast.Starred):
            self._bind(target.value, UNKNOWN, frame)

    # ----------------------------------------------------------------------- expressions

    def _eval(self, node: ast.expr, frame: Frame) -> object:
        self._tick()
        rule = _EXPRESSIONS.get(type(node))
        return UNKNOWN if rule is None else rule(self, node, frame)

    def _constant(self, node: ast.Constant, frame: Frame) -> object:  # noqa: ARG002  # the rules' signature
        return node.value

    def _name(self, node: ast.Name, frame: Frame) -> object:
        self._where = (frame.module, node)
        if node.id in frame.env:
            self._taint_of(frame.env, node.id)
            return self._deref(frame.env[node.id])
        return self._deref(self._global(frame.module, node.id))

    def _attribute(self, node: ast.Attribute, frame: Frame) -> object:
        obj = self._eval(node.value, frame)
        self._where = (frame.module, node)
        return self._getattr(obj, node.attr)

    def _unaryop(self, node: ast.UnaryOp, frame: Frame) -> object:
        operand = self._eval(node.operand, frame)
        if isinstance(node.op, ast.Not):
            t = truth(operand)
            return UNKNOWN if t is UNKNOWN else not t
        if operand is UNKNOWN or not isinstance(operand, int | float):
            return UNKNOWN
        return -operand if isinstance(node.op, ast.USub) else operand

    def _binop(self, node: ast.BinOp, frame: Frame) -> object:
        left, right = self._eval(node.left, frame), self._eval(node.right, frame)
        if isinstance(node.op, ast.Div) and isinstance(left, PathValue) and isinstance(right, str):
            return PathValue(f"{left.text}/{right}")
        return apply_op(BIN_OPS.get(type(node.op)), left, right)

    def _ifexp(self, node: ast.IfExp, frame: Frame) -> object:
        test = truth(self._eval(node.test, frame))
        if test is UNKNOWN:
            return join(self._eval(node.body, frame), self._eval(node.orelse, frame))
        return self._eval(node.body if test else node.orelse, frame)

    def _sequence(self, node: ast.Tuple | ast.List | ast.Set, frame: Frame) -> object:
        items = [self._eval(e, frame) for e in node.elts]
        if any(isinstance(e, ast.Starred) for e in node.elts):
            return UNKNOWN
        if isinstance(node, ast.Set):
            return freeze(items)
        return tuple(items) if isinstance(node, ast.Tuple) else items

    def _joinedstr(self, node: ast.JoinedStr, frame: Frame) -> object:
        parts = []
        for value in node.values:
            part = self._eval(value.value if isinstance(value, ast.FormattedValue) else value, frame)
            if part is UNKNOWN or isinstance(part, External | Function | Instance | ImportRef | ClassValue):
                return UNKNOWN
            parts.append(str(part))
        return "".join(parts)

    def _lambda(self, node: ast.Lambda, frame: Frame) -> object:
        return Function(frame.module, node, "<lambda>", closure=dict(frame.env))

    def _namedexpr(self, node: ast.NamedExpr, frame: Frame) -> object:
        bound = self._eval(node.value, frame)
        self._bind(node.target, bound, frame)
        return bound

    def _comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp, frame: Frame
    ) -> object:
        """A comprehension over known, short sequences; unknown as soon as an item or a condition is."""
        rows: list[dict[str, object]] = [dict(frame.env)]
        for gen in node.generators:
            if gen.is_async:
                return UNKNOWN
            found = self._generator_rows(gen, rows, frame)
            if found is None:
                return UNKNOWN
            rows = found
        return self._comprehension_value(node, rows, frame)

    def _generator_rows(
        self, gen: ast.comprehension, rows: list[dict[str, object]], frame: Frame
    ) -> list[dict[str, object]] | None:
        """The environments one `for ... in ... if ...` clause yields from each row; None where one is unknown."""
        next_rows: list[dict[str, object]] = []
        for env in rows:
            items = self._eval(gen.iter, Frame(frame.module, env, frame.decision, frame.self_obj))
            if not isinstance(items, list | tuple | set | frozenset | range | str | dict):
                return None
            if len(items) > MAX_UNROLL:
                return None
            for item in list(items):
                inner = Frame(frame.module, dict(env), frame.decision, frame.self_obj)
                self._bind(gen.target, item, inner)
                keep = self._conditions_hold(gen.ifs, inner)
                if keep is UNKNOWN:
                    return None
                if keep:
                    next_rows.append(inner.env)
        return next_rows

    def _conditions_hold(self, conditions: Sequence[ast.expr], frame: Frame) -> object:
        """Whether every `if` of a comprehension clause holds: True, False or UNKNOWN (each is evaluated)."""
        keep = True
        for cond in conditions:
            t = truth(self._eval(cond, frame))
            if t is UNKNOWN:
                return UNKNOWN
            keep = keep and bool(t)
        return keep

    def _comprehension_value(
        self,
        node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp,
        rows: list[dict[str, object]],
        frame: Frame,
    ) -> object:
        """The comprehension's value from the environments its clauses yielded."""
        inners = [Frame(frame.module, env, frame.decision, frame.self_obj) for env in rows]
        if isinstance(node, ast.DictComp):
            return self._dict_comprehension(node, inners)
        values = [self._eval(node.elt, inner) for inner in inners]
        if any(v is UNKNOWN for v in values):
            return UNKNOWN
        if not isinstance(node, ast.SetComp):
            return values
        try:
            return set(values)
        except TypeError:  # an unhashable item
            return UNKNOWN

    def _dict_comprehension(self, node: ast.DictComp, inners: Sequence[Frame]) -> object:
        """``{k: v for ...}``: unknown where a key or a value is, or a key is unhashable."""
        pairs = [(self._eval(node.key, inner), self._eval(node.value, inner)) for inner in inners]
        if any(v is UNKNOWN for pair in pairs for v in pair):
            return UNKNOWN
        try:
            return dict(pairs)
        except TypeError:  # an unhashable key
            return UNKNOWN

    def _boolop(self, node: ast.BoolOp, frame: Frame) -> object:
        # Python's short-circuit, with unknowns: `x and y` is falsy as soon as one operand is known falsy.
        want_and = isinstance(node.op, ast.And)
        unknown = False
        last: object = None
        for operand in node.values:
            last = self._eval(operand, frame)
            t = truth(last)
            if t is UNKNOWN:
                unknown = True
                continue
            if t is not want_and:  # `and` met a falsy operand / `or` met a truthy one: decided
                frame.decision = Decision(frame.module, operand.lineno, node_text(operand), bool(t))
                return last if not unknown else (not want_and)
        return UNKNOWN if unknown else last

    def _compare(self, node: ast.Compare, frame: Frame) -> object:
        left = self._eval(node.left, frame)
        result: object = True
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = self._eval(right_node, frame)
            if isinstance(op, ast.Is | ast.IsNot) and (left is None or right is None):
                if left is UNKNOWN or right is UNKNOWN:
                    return UNKNOWN
                outcome: object = (left is right) == isinstance(op, ast.Is)
            else:
                outcome = apply_op(CMP_OPS[type(op)], left, right)
            if outcome is UNKNOWN:
                result = UNKNOWN
            elif not outcome:
                return False
            left = right
        return result

    def _dict(self, node: ast.Dict, frame: Frame) -> object:
        out: dict[object, object] = {}
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if key_node is None:
                return UNKNOWN
            key = self._eval(key_node, frame)
            if key is UNKNOWN:
                return UNKNOWN
            try:
                out[key] = self._eval(value_node, frame)
            except TypeError:
                return UNKNOWN
        return out

    def _subscript(self, node: ast.Subscript, frame: Frame) -> object:
        container = self._eval(node.value, frame)
        if isinstance(node.slice, ast.Slice):
            return self._slice(container, node.slice, frame)
        key = self._eval(node.slice, frame)
        if self._assumed_key(container, key):
            return self.assume[key]  # type: ignore[index]  # a str, checked by _assumed_key
        if key is UNKNOWN or container is UNKNOWN:
            return UNKNOWN
        return item_of(container, key, frame.module, node)

    def _slice(self, container: object, piece: ast.Slice, frame: Frame) -> object:
        """``container[lo:hi]`` of a known sequence with known (or absent) bounds; the step is not read."""
        lo = self._eval(piece.lower, frame) if piece.lower else None
        hi = self._eval(piece.upper, frame) if piece.upper else None
        if (
            isinstance(container, tuple | list | str)
            and isinstance(lo, int | None)
            and isinstance(hi, int | None)
        ):
            return container[lo:hi]
        return UNKNOWN

    # ----------------------------------------------------------------------- attributes and calls

    def _getattr(self, obj: object, attr: str) -> object:
        obj = self._deref(obj)
        if attr in self.assume and (obj is UNKNOWN or (isinstance(obj, Instance) and attr not in obj.attrs)):
            return self.assume[attr]
        if isinstance(obj, ModuleRef):
            return self._module_attr(obj, attr)
        if isinstance(obj, External):
            return self.platform.attr(obj.dotted, attr)
        if isinstance(obj, Instance):
            return self._instance_attr(obj, attr)
        if isinstance(obj, ClassValue):
            return self._class_attr(obj, attr)
        return value_attr(obj, attr)

    def _module_attr(self, obj: ModuleRef, attr: str) -> object:
        """``package.name``: a submodule where the package's namespace does not bind the name, else a global."""
        if self.tree.path_of(f"{obj.name}.{attr}") and attr not in self.namespace(obj.name):
            return ModuleRef(f"{obj.name}.{attr}")
        return self._deref(self._global(obj.name, attr))

    def _instance_attr(self, obj: Instance, attr: str) -> object:
        if attr in obj.attrs:
            if attr in obj.unresolved and obj.attrs[attr] is UNKNOWN:
                self.unresolved.append(obj.unresolved[attr])
            return obj.attrs[attr]
        value = self._class_attr(obj.cls, attr) if obj.cls else UNKNOWN
        if value is UNKNOWN and obj.cls is not None and attr != "__getattr__":
            value = self._getattr_hook(obj, obj.cls, attr)
        if isinstance(value, Function) and not isinstance(value.node, ast.Lambda):
            return self._method_of(obj, value)
        return value

    def _getattr_hook(self, obj: Instance, cls: ClassValue, attr: str) -> object:
        """An attribute the class does not define: what its ``__getattr__`` answers, unresolved where unknown."""
        where = self._where
        hook = self._class_attr(cls, "__getattr__")
        value: object = UNKNOWN
        if isinstance(hook, Function) and not isinstance(hook.node, ast.Lambda):
            value = self._hooked(obj, hook, attr)
        self._where = where
        if isinstance(hook, Function) and value is UNKNOWN:
            self._unresolvable(f"{cls.qualname}.__getattr__ answers {attr!r} at run time")
        return value

    def _method_of(self, obj: Instance, func: Function) -> object:
        """A function found on the class, read through an instance: static, bound, or a property's value."""
        assert not isinstance(func.node, ast.Lambda)
        if decorated(func.node, "staticmethod"):
            return func
        bound = Function(func.module, func.node, func.qualname, (obj, *func.args), func.kwargs)
        if decorated(func.node, "property"):
            return self._call(bound, (), {})
        return bound

    def _hooked(self, obj: Instance, hook: Function, attr: str) -> object:
        """What the class's ``__getattr__`` answers for `attr` (SGLang 0.5.19+'s PlatformContext maps a fact to
        a probe of utils.common and calls it); unknown where it raises or depends on run-time state."""
        bound = Function(hook.module, hook.node, hook.qualname, (obj, *hook.args), hook.kwargs)
        try:
            return self._call(bound, (attr,), {})
        except Crash:
            return UNKNOWN

    def _object_builtin(self, dotted: str, args: tuple[object, ...]) -> object:
        """getattr / setattr / object.__getattribute__ / object.__setattr__ on values the evaluator holds."""
        if len(args) < 2 or not isinstance(args[1], str):
            return _NOT_OURS
        obj, name = args[0], args[1]
        if dotted in ("builtins.setattr", "builtins.object.__setattr__") and len(args) == 3:
            return _set_attr(obj, name, args[2])
        if dotted == "builtins.object.__getattribute__" and len(args) == 2 and isinstance(obj, Instance):
            return self._own_attr(obj, name)
        if dotted == "builtins.getattr" and len(args) == 2:
            return self._getattr(obj, name)
        return _NOT_OURS

    def _own_attr(self, obj: Instance, name: str) -> object:
        """``object.__getattribute__(obj, name)``: the instance's own attribute or its class's, no hook."""
        if name in obj.attrs:
            return obj.attrs[name]
        return self._class_attr(obj.cls, name) if obj.cls else UNKNOWN

    def _class_namespace(self, cls: ClassValue) -> dict[str, object]:
        """The class body's names (its functions and assignments), run once; other statements are skipped."""
        if cls.namespace is None:
            cls.namespace = {}
            frame = Frame(cls.module, cls.namespace)
            # class bodies see module globals through _global; names bound in the body land in the namespace
            for stmt in cls.node.body:
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                    cls.namespace[stmt.name] = Function(cls.module, stmt, f"{cls.qualname}.{stmt.name}")
                elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                    try:
                        self._exec(stmt, frame)
                    except Crash:
                        continue
        return cls.namespace

    def _class_attr(self, cls: ClassValue, attr: str) -> object:
        namespace = self._class_namespace(cls)
        if attr in namespace:
            return namespace[attr]
        for base in cls.node.bases:
            base_value = self._deref(self._eval(base, Frame(cls.module, {})))
            if isinstance(base_value, ClassValue) and base_value is not cls:
                found = self._class_attr(base_value, attr)
                if found is not UNKNOWN:
                    return found
        return UNKNOWN

    def _assumed_key(self, container: object, key: object) -> bool:
        """``args["flag"]`` / ``args.get("flag")`` of a server-args dict: the flag as `assume` sets it.

        A dict of server arguments (``global_server_args_dict``) is filled at run time; its import-time
        contents are the defaults, not what the deployment sets. The environment is never such a dict."""
        return (
            isinstance(key, str)
            and key in self.assume
            and (container is UNKNOWN or (isinstance(container, dict) and not isinstance(container, Environ)))
        )

    def _assumed_flag(self, node: ast.Call, frame: Frame) -> str | None:
        """The flag of ``args.get("flag", ...)`` on a server-args dict where `assume` sets it (`_assumed_key`)."""
        func_node = node.func
        if not (isinstance(func_node, ast.Attribute) and func_node.attr == "get" and node.args):
            return None
        flag = node.args[0].value if isinstance(node.args[0], ast.Constant) else None
        if (
            isinstance(flag, str)
            and flag in self.assume
            and self._assumed_key(self._eval(func_node.value, frame), flag)
        ):
            return flag
        return None

    def _call_node(self, node: ast.Call, frame: Frame) -> object:
        flag = self._assumed_flag(node, frame)
        if flag is not None:
            return self.assume[flag]
        func = self._deref(self._eval(node.func, frame))
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return UNKNOWN
        args = tuple(self._eval(a, frame) for a in node.args)
        kwargs = {k.arg: self._eval(k.value, frame) for k in node.keywords if k.arg}
        return self._call(func, args, kwargs)

    def _call(self, func: object, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        if isinstance(func, BoundMethod):
            return call_pure(func, args, kwargs)
        if isinstance(func, External):
            return self._call_external(func, args, kwargs)
        if isinstance(func, Identity):
            return args[0] if args else UNKNOWN
        if isinstance(func, Function):
            if isinstance(func.node, ast.Lambda):
                return UNKNOWN
            ends = self._run_function(func, args, kwargs, self_obj=None, at_top=False)
            return call_result(ends)
        if isinstance(func, ClassValue):
            return self._instantiate(func, args, kwargs)
        return UNKNOWN

    def _call_external(self, func: External, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        """A call outside the tree: the attribute builtins on our own values, else the platform's answer."""
        if func.dotted in _OBJECT_BUILTINS and not kwargs:
            answer = self._object_builtin(func.dotted, args)
            if answer is not _NOT_OURS:
                return answer
        return self.platform.call(func.dotted, args, kwargs)

    def _instantiate(self, cls: ClassValue, args: tuple[object, ...], kwargs: dict[str, object]) -> Instance:
        """``cls(...)``: a new instance, with its ``__init__`` run on it."""
        instance = Instance(cls)
        init = self._class_attr(cls, "__init__")
        if isinstance(init, Function) and not isinstance(init.node, ast.Lambda):
            ends = self._run_function(init, args, kwargs, self_obj=instance, at_top=False)
            call_result(ends)  # raises when every path through __init__ fails
            # what another method reassigns is run-time state (a context object's server args): unknown
            for attr in reassigned_attrs(cls.node) & set(instance.attrs):
                instance.attrs[attr] = UNKNOWN
        return instance

    def _run_function(
        self,
        func: Function,
        args: tuple[object, ...],
        kwargs: Mapping[str, object],
        *,
        self_obj: Instance | None,
        at_top: bool,
    ) -> list[End]:
        node = func.node
        assert not isinstance(node, ast.Lambda)
        # the instance a constructor or method runs on is part of the key: its effects on that object count
        key = (id(node), *memo_key((self_obj, *func.args, *args)), *memo_key((*func.kwargs, *kwargs.items())))
        if not at_top and key in self._memo:
            return self._recalled(key)
        if id(node) in self._active or self._depth >= MAX_DEPTH:
            return [End("return", func.module, node.lineno, UNKNOWN)]
        frame = self._function_frame(func, args, kwargs, self_obj)
        self._active.add(id(node))
        self._depth += 1
        mark = len(self.unresolved)
        try:
            ends = self._exec_block(node.body, frame)
        finally:
            self._depth -= 1
            self._active.discard(id(node))
        self._taint_by_paths(ends, mark)
        if not at_top:
            self._memo[key] = ends
            self._memo_unresolved[key] = tuple(self.unresolved[mark : mark + 1])
        return ends

    def _taint_by_paths(self, ends: Sequence[End], mark: int) -> None:
        """A path through a function that depends on an unresolved value taints its result (once)."""
        tainted = [e.unresolved for e in ends if e.unresolved is not None]
        if tainted and len(self.unresolved) == mark:
            self.unresolved.append(tainted[0])  # a path through it depends on one: so does its result

    def _recalled(self, key: tuple[object, ...]) -> list[End]:
        """A memoised call's ends; what its first run depended on taints this one too."""
        cached = self._memo[key]
        self.unresolved.extend(self._memo_unresolved.get(key, ()))  # what the first run depended on
        return cached if isinstance(cached, list) else []

    def _function_frame(
        self,
        func: Function,
        args: tuple[object, ...],
        kwargs: Mapping[str, object],
        self_obj: Instance | None,
    ) -> Frame:
        """The frame a function's body runs in: closure, bound parameters, and the instance its first one is."""
        node = func.node
        assert not isinstance(node, ast.Lambda)
        env: dict[str, object] = dict(func.closure or {})
        all_args = (*func.args, *args)
        if self_obj is not None:
            all_args = (self_obj, *all_args)
        self._bind_params(node, env, all_args, {**dict(func.kwargs), **kwargs}, func.module)
        frame = Frame(func.module, env)
        first = node.args.posonlyargs + node.args.args
        if first and isinstance(env.get(first[0].arg), Instance):
            frame.self_obj = env[first[0].arg]  # type: ignore[assignment]  # checked just above
        return frame

    def _bind_params(
        self,
        node: ast.FunctionDef | ast.AsyncFunctionDef,
        env: dict[str, object],
        args: tuple[object, ...],
        kwargs: Mapping[str, object],
        module: str,
    ) -> None:
        spec = node.args
        positional = spec.posonlyargs + spec.args
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(spec.defaults)) + list(
            spec.defaults
        )
        for i, param in enumerate(positional):
            if i < len(args):
                env[param.arg] = args[i]
            elif param.arg in kwargs:
                env[param.arg] = kwargs[param.arg]
            else:
                default = defaults[i]
                env[param.arg] = self._eval(default, Frame(module, {})) if default is not None else UNKNOWN
        for param, kw_default in zip(spec.kwonlyargs, spec.kw_defaults, strict=True):
            if param.arg in kwargs:
                env[param.arg] = kwargs[param.arg]
            else:
                env[param.arg] = (
                    self._eval(kw_default, Frame(module, {})) if kw_default is not None else UNKNOWN
                )
        if spec.vararg:
            env[spec.vararg.arg] = UNKNOWN
        if spec.kwarg:
            env[spec.kwarg.arg] = UNKNOWN


#: Builtins that read or set attributes of the evaluator's own values (`ExpressionEvaluator._object_builtin`).
_OBJECT_BUILTINS = frozenset(
    {
        "builtins.getattr",
        "builtins.setattr",
        "builtins.object.__getattribute__",
        "builtins.object.__setattr__",
    }
)
_NOT_OURS = object()


def _set_attr(obj: object, name: str, value: object) -> object:
    """``setattr(obj, name, value)`` on an instance the evaluator holds; `_NOT_OURS` for anything else."""
    if isinstance(obj, Instance):
        obj.attrs[name] = value
        return None
    return _NOT_OURS


def _taint_attr(obj: Instance, attr: str, event: Unresolved | None) -> None:
    """After ``obj.attr = <value>``: remember (or forget) that the value bound is unresolved."""
    if event is not None:
        obj.unresolved[attr] = event
    else:
        obj.unresolved.pop(attr, None)


#: One method per expression node type; any other node (await, yield, a slice outside a subscript ...) is unknown.
_EXPRESSIONS: dict[type[ast.AST], Callable[[ExpressionEvaluator, Any, Frame], object]] = {
    ast.Constant: ExpressionEvaluator._constant,
    ast.Name: ExpressionEvaluator._name,
    ast.Attribute: ExpressionEvaluator._attribute,
    ast.BoolOp: ExpressionEvaluator._boolop,
    ast.UnaryOp: ExpressionEvaluator._unaryop,
    ast.Compare: ExpressionEvaluator._compare,
    ast.BinOp: ExpressionEvaluator._binop,
    ast.IfExp: ExpressionEvaluator._ifexp,
    ast.Tuple: ExpressionEvaluator._sequence,
    ast.List: ExpressionEvaluator._sequence,
    ast.Set: ExpressionEvaluator._sequence,
    ast.Dict: ExpressionEvaluator._dict,
    ast.Subscript: ExpressionEvaluator._subscript,
    ast.Call: ExpressionEvaluator._call_node,
    ast.JoinedStr: ExpressionEvaluator._joinedstr,
    ast.ListComp: ExpressionEvaluator._comprehension,
    ast.SetComp: ExpressionEvaluator._comprehension,
    ast.GeneratorExp: ExpressionEvaluator._comprehension,
    ast.DictComp: ExpressionEvaluator._comprehension,
    ast.Lambda: ExpressionEvaluator._lambda,
    ast.NamedExpr: ExpressionEvaluator._namedexpr,
}


__all__ = ["ExpressionEvaluator"]
