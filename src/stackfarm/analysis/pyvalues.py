"""The values of `pysource.Evaluator`: what a piece of evaluated Python can be, how paths end, and the pure
helpers on them.

A value is a plain Python value when it is known (``12``, ``(12, 0)``, ``"12.8"``, a dict), `UNKNOWN` when it
is not, or one of the small records below for what the evaluator models itself: an `External` name outside the
tree, a `Function` / `ClassValue` / `Instance` of the tree, a `ModuleRef`, a lazy `ImportRef`, torch's
`DeviceProperties`, a `PathValue`. `End` is how one path through a function ends; `Crash` is an error the
evaluated code raises for the GPU.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

from stackfarm.analysis.sourcetree import source_text

# --------------------------------------------------------------------------- values


class Unknown:
    _instance: Unknown | None = None

    def __new__(cls) -> Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


#: A value the evaluator cannot know statically (a runtime argument, an environment variable, ...).
UNKNOWN = Unknown()


@dataclass(frozen=True)
class External:
    """Something outside the tree (``torch.cuda.get_device_capability``), named by its dotted path."""

    dotted: str


@dataclass(frozen=True)
class ModuleRef:
    name: str


@dataclass(frozen=True)
class ImportRef:
    """``from module import name``, resolved only when used (importing does not evaluate the module)."""

    module: str
    name: str


@dataclass(frozen=True, eq=False)
class Function:
    module: str
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
    qualname: str
    #: Bound by functools.partial or by attribute access on an instance.
    args: tuple[object, ...] = ()
    kwargs: tuple[tuple[str, object], ...] = ()
    closure: Mapping[str, object] | None = None


@dataclass(eq=False)
class ClassValue:
    module: str
    node: ast.ClassDef
    qualname: str
    namespace: dict[str, object] | None = None


@dataclass(eq=False)
class Instance:
    cls: ClassValue | None
    attrs: dict[str, object] = field(default_factory=dict)
    #: Attributes whose unknown value comes from something the evaluator could not resolve (see `Unresolved`).
    unresolved: dict[str, Unresolved] = field(default_factory=dict)


@dataclass(frozen=True)
class Unresolved:
    """A value the evaluator could not resolve, as opposed to one known only at run time (an argument, a
    server flag, the environment): an attribute answered by a ``__getattr__`` (PEP 562 module hooks, platform
    objects), which the evaluator does not run. A test or a result that depends on one is undecidable."""

    module: str
    line: int
    text: str
    why: str


@dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.cuda.get_device_properties()`` returns, as far as capability checks read it."""

    major: int
    minor: int


@dataclass(frozen=True)
class PathValue:
    """A ``pathlib.Path`` built from known strings (loaders glob for libraries relative to ``__file__``)."""

    text: str


@dataclass(frozen=True)
class BoundMethod:
    """A pure method of a known str / tuple / dict value (``"12.8".split``)."""

    obj: object
    name: str


@dataclass(frozen=True)
class Identity:
    """A decorator factory's result that returns the function unchanged (``functools.lru_cache(maxsize=1)``)."""


class Crash(Exception):
    """The evaluated code raises here for the given GPU: ``KeyError: 12`` at module:line."""

    def __init__(
        self, kind: str, detail: str, module: str, line: int, text: str, *, deliberate: bool = False
    ) -> None:
        super().__init__(detail if deliberate else f"{kind}: {detail}")
        self.kind, self.detail, self.module, self.line, self.text = kind, detail, module, line, text
        #: Raised by a `raise` / failed `assert` in the code (a refusal), not by an error such as a KeyError.
        self.deliberate = deliberate
        #: The last test decided on the way (inside the called function), for "because ..." in messages.
        self.decision: Decision | None = None
        #: The calls it came through so far, innermost first.
        self.via: tuple[tuple[str, int], ...] = ()


class Budget(Exception):
    """The evaluation ran out of steps: its result is unknown."""


def truth(value: object) -> bool | Unknown:
    if value is UNKNOWN:
        return UNKNOWN
    if isinstance(
        value, External | Function | ClassValue | Instance | ModuleRef | DeviceProperties | PathValue
    ):
        return True
    if isinstance(value, ImportRef):
        return UNKNOWN
    try:
        return bool(value)
    except Exception:  # an exotic object whose truth we cannot take
        return UNKNOWN


def join(a: object, b: object) -> object:
    """The value after two branches bound `a` and `b`: it is known only where they agree."""
    if a is b:
        return a
    try:
        same = type(a) is type(b) and bool(a == b)
    except Exception:
        same = False
    return a if same else UNKNOWN


# --------------------------------------------------------------------------- path ends


EndKind = Literal["return", "raise", "crash", "fall"]


@dataclass(frozen=True)
class Decision:
    """A test the evaluator could decide for this GPU: where, what, and which way it went."""

    module: str
    line: int
    text: str
    value: bool


@dataclass(frozen=True)
class End:
    """How one path through a function ends, with the last decided test on the way there."""

    kind: EndKind
    module: str
    line: int
    value: object = None
    detail: str = ""
    decision: Decision | None = None
    #: For an error raised in a called function: the calls it came through, innermost first (module, line).
    via: tuple[tuple[str, int], ...] = ()
    #: Set when this path (or its returned value) depends on a value the evaluator could not resolve.
    unresolved: Unresolved | None = None


@dataclass
class Frame:
    module: str
    env: dict[str, object]
    decision: Decision | None = None
    self_obj: Instance | None = None
    #: The unresolved value a test on the way here depended on (the path is undecidable from here on).
    unresolved: Unresolved | None = None


CMP_OPS: dict[type[ast.cmpop], Callable[[Any, Any], object]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: operator.contains(b, a),
    ast.NotIn: lambda a, b: not operator.contains(b, a),
}
BIN_OPS: dict[type[ast.operator], Callable[[object, object], object]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: operator.truediv,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.LShift: operator.lshift,
}

#: Methods of known str / tuple / list / dict values that are pure.
PURE_METHODS = frozenset(
    {
        "split",
        "startswith",
        "endswith",
        "lower",
        "upper",
        "strip",
        "get",
        "keys",
        "values",
        "items",
        "join",
        "replace",
        "count",
        "index",
        "format",
    }
)
CAUGHT_BY = {
    "KeyError": {"KeyError", "LookupError", "Exception", "BaseException"},
    "AssertionError": {"AssertionError", "Exception", "BaseException"},
    "raise": {"Exception", "BaseException"},
}
MAX_DEPTH = 12
#: Longest known sequence a for loop or comprehension is unrolled over.
MAX_UNROLL = 256
#: Methods that change a list / set / dict in place.
MUTATORS = frozenset(
    {"add", "append", "extend", "update", "insert", "discard", "remove", "pop", "clear", "setdefault"}
)
#: The namespace key holding the modules a module star-imports (a tuple of names), looked up after its own names.
STARS = "__stackfarm_star_imports__"
#: The namespace key holding {name: Unresolved} for names bound to a value the evaluator could not resolve.
UNRESOLVED = "__stackfarm_unresolved__"
MAX_STEPS = 400_000


class Environ(dict[str, str]):
    """``os.environ`` as the evaluator sees it: never copied per branch, never changed."""


def copy_value(value: object) -> object:
    if isinstance(value, list | set | dict) and not isinstance(value, Environ):
        return value.copy()
    return value


def exception_name(detail: str) -> str:
    """``KeyError: 12`` -> KeyError; ``RuntimeError(f'...')`` -> RuntimeError; anything else -> raise."""
    match = re.match(r"^(?:\w+\.)*(\w+)(?:[:(]|$)", detail)
    return match.group(1) if match else "raise"


def reassigned_attrs(cls: ast.ClassDef) -> set[str]:
    """Attributes of ``self`` that methods other than ``__init__`` assign."""
    names: set[str] = set()
    for item in cls.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name != "__init__":
            for node in ast.walk(item):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                ):
                    names.add(node.attr)
    return names


def jumps(body: Sequence[ast.stmt]) -> bool:
    """Whether a loop body leaves the loop early (break / continue / return / yield), nested functions aside."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Break | ast.Continue | ast.Return | ast.Yield | ast.YieldFrom):
            return True
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.For | ast.While | ast.AsyncFor):
            # a break inside an inner loop leaves only that loop; a return still leaves ours
            stack.extend(n for n in ast.walk(node) if isinstance(n, ast.Return))
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def join_all(values: Sequence[object]) -> object:
    merged = values[0]
    for value in values[1:]:
        merged = join(merged, value)
    return merged


def known(value: object) -> bool:
    if value is UNKNOWN:
        return False
    if isinstance(value, tuple | list):
        return all(known(v) for v in value)
    return isinstance(value, str | int | float | bool | bytes | PathValue) or value is None


def memo_key(values: Sequence[object]) -> tuple[object, ...]:
    out: list[object] = []
    for v in values:
        try:
            hash(v)
            out.append(v)
        except TypeError:
            out.append(id(v))
    return tuple(out)


def freeze(items: list[object]) -> object:
    try:
        return frozenset(items) if UNKNOWN not in items else UNKNOWN
    except TypeError:
        return UNKNOWN


def apply_op(op: Callable[[object, object], object] | None, left: object, right: object) -> object:
    if op is None or left is UNKNOWN or right is UNKNOWN:
        return UNKNOWN
    if isinstance(right, list | tuple | frozenset | set) and UNKNOWN in right:
        # `x in [9, UNKNOWN]` is True when 9 matches, unknown otherwise
        return True if _holds(op, left, right) else UNKNOWN
    if not (_plain(left) and _plain(right)):
        if op in (operator.is_, operator.is_not):
            return op(left, right)
        return UNKNOWN
    return _attempt(op, left, right)


def _plain(value: object) -> bool:
    """A value Python's operators may run on for real: a builtin scalar or container, or None."""
    return (
        isinstance(value, int | float | str | tuple | list | dict | frozenset | set | bytes) or value is None
    )


def _holds(op: Callable[[object, object], object], left: object, right: object) -> bool:
    """Whether ``op(left, right)`` runs and is truthy."""
    try:
        return bool(op(left, right))
    except Exception:
        return False


def _attempt(op: Callable[[object, object], object], left: object, right: object) -> object:
    """``op(left, right)``, unknown where it raises."""
    try:
        return op(left, right)
    except Exception:
        return UNKNOWN


def call_result(ends: Sequence[End]) -> object:
    """A call's value from how the paths through the function end: their returns joined; raises the first
    failure when no path returns or falls through."""
    values = [e.value if e.kind == "return" else None for e in ends if e.kind in ("return", "fall")]
    if not values:
        failing = [e for e in ends if e.kind in ("crash", "raise")]
        if failing:
            first = failing[0]
            kind, _, detail = first.detail.partition(": ")
            crash = (
                Crash(
                    exception_name(first.detail),
                    first.detail,
                    first.module,
                    first.line,
                    first.detail,
                    deliberate=True,
                )
                if first.kind == "raise"
                else Crash(kind, detail, first.module, first.line, first.detail)
            )
            crash.decision = first.decision
            crash.via = first.via
            raise crash
        return UNKNOWN
    merged = values[0]
    for v in values[1:]:
        merged = join(merged, v)
    return merged


def item_of(container: object, key: object, module: str, node: ast.Subscript) -> object:
    """``container[key]`` of known values: Python's KeyError / IndexError become a `Crash` at `node`."""
    if isinstance(container, dict):
        try:
            if key in container:
                return container[key]
        except TypeError:
            return UNKNOWN
        if isinstance(container, Environ):
            return UNKNOWN  # the deployment may set it: only .get() and `in` read "unset"
        raise Crash("KeyError", repr(key), module, node.lineno, node_text(node))
    if isinstance(container, tuple | list | str) and isinstance(key, int):
        try:
            return container[key]
        except IndexError:
            raise Crash("IndexError", repr(key), module, node.lineno, node_text(node)) from None
    return UNKNOWN


def call_pure(func: BoundMethod, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
    """A pure str / tuple / list / dict method on known arguments, run for real; unknown where it raises."""
    if any(a is UNKNOWN for a in args):
        return UNKNOWN
    try:
        return getattr(func.obj, func.name)(*args, **kwargs)
    except Exception:
        return UNKNOWN


def value_attr(obj: object, attr: str) -> object:
    """An attribute of a known value: device properties, a path's parent / name, a pure str / tuple method."""
    if isinstance(obj, DeviceProperties) and attr in ("major", "minor"):
        return getattr(obj, attr)
    if isinstance(obj, PathValue):
        if attr == "parent":
            return PathValue(str(PurePosixPath(obj.text).parent))
        if attr == "name":
            return PurePosixPath(obj.text).name
        return UNKNOWN
    if isinstance(obj, str | tuple | list | dict) and attr in PURE_METHODS:
        return BoundMethod(obj, attr)
    return UNKNOWN


def decorated(node: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    return any(isinstance(d, ast.Name) and d.id == name for d in node.decorator_list)


def node_text(node: ast.AST) -> str:
    return source_text(node, 160)


def function_locals(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    """Every name a function binds (parameters and assignments): unknown when evaluating one of its expressions."""
    names = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
    names += [a.arg for a in (node.args.vararg, node.args.kwarg) if a]
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            names.append(sub.id)
        elif isinstance(sub, ast.alias):
            names.append((sub.asname or sub.name).split(".")[0])
    return tuple(dict.fromkeys(names))


__all__ = [
    "BIN_OPS",
    "CAUGHT_BY",
    "CMP_OPS",
    "MAX_DEPTH",
    "MAX_STEPS",
    "MAX_UNROLL",
    "MUTATORS",
    "PURE_METHODS",
    "STARS",
    "UNKNOWN",
    "UNRESOLVED",
    "BoundMethod",
    "Budget",
    "ClassValue",
    "Crash",
    "Decision",
    "DeviceProperties",
    "End",
    "EndKind",
    "Environ",
    "External",
    "Frame",
    "Function",
    "Identity",
    "ImportRef",
    "Instance",
    "ModuleRef",
    "PathValue",
    "Unknown",
    "Unresolved",
    "apply_op",
    "call_pure",
    "call_result",
    "copy_value",
    "decorated",
    "exception_name",
    "freeze",
    "function_locals",
    "item_of",
    "join",
    "join_all",
    "jumps",
    "known",
    "memo_key",
    "node_text",
    "reassigned_attrs",
    "truth",
    "value_attr",
]
