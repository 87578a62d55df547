"""Python source trees as data: find modules, parse them once, and evaluate small pieces for a given GPU.

`SourceTree` maps dotted module names to files under one or more roots (unpacked wheels) and parses each file
at most once per process.

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
import builtins
import operator
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from stackfarm.analysis.arch import Arch

# --------------------------------------------------------------------------- the tree


class SourceError(Exception):
    """A module or symbol that is not in the tree, or a file that does not parse."""


class SourceTree:
    """Dotted module names -> files under `roots`; each file read and parsed at most once."""

    def __init__(self, roots: Sequence[Path | str], *, packages: Collection[str] | None = None) -> None:
        self.roots = tuple(Path(r) for r in roots)
        #: The top-level packages that may be resolved (None: all). Where a root is a whole site-packages (host,
        #: docker), following imports into every other installed project would parse the world.
        self.packages = frozenset(packages) if packages is not None else None
        self._paths: dict[str, Path | None] = {}
        self._trees: dict[Path, ast.Module] = {}
        self._bytes: dict[Path, bytes] = {}

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

    def read(self, path: Path) -> bytes:
        if path not in self._bytes:
            self._bytes[path] = path.read_bytes()
        return self._bytes[path]

    def parse(self, path: Path) -> ast.Module:
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse(self.read(path), filename=str(path))
            except (SyntaxError, ValueError) as exc:
                raise SourceError(f"{path}: does not parse: {exc}") from exc
        return self._trees[path]

    def module(self, name: str) -> ast.Module | None:
        path = self.path_of(name)
        return self.parse(path) if path else None

    def files(self, package: str) -> Iterator[Path]:
        """Every ``.py`` file of a top-level package, in a stable order."""
        for root in self.roots:
            base = root / package
            if base.is_dir():
                yield from sorted(base.rglob("*.py"))

    def split(self, qualname: str) -> tuple[str, tuple[str, ...]]:
        """``a.b.C.f`` -> (``a.b``, (``C``, ``f``)): the longest prefix that is a module in the tree."""
        parts = qualname.split(".")
        for cut in range(len(parts), 0, -1):
            if self.path_of(".".join(parts[:cut])):
                return ".".join(parts[:cut]), tuple(parts[cut:])
        raise SourceError(f"no module of {qualname!r} under {[str(r) for r in self.roots]}")

    def relative(self, path: Path) -> str:
        for root in self.roots:
            try:
                return str(PurePosixPath(path.relative_to(root)))
            except ValueError:
                continue
        return str(path)


def resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in `module`."""
    if level == 0:
        return target or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, target] if target else base)


# --------------------------------------------------------------------------- values


class _Unknown:
    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


#: A value the evaluator cannot know statically (a runtime argument, an environment variable, ...).
UNKNOWN = _Unknown()


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
class _BoundMethod:
    """A pure method of a known str / tuple / dict value (``"12.8".split``)."""

    obj: object
    name: str


@dataclass(frozen=True)
class _Identity:
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


class _Budget(Exception):
    """The evaluation ran out of steps: its result is unknown."""


def truth(value: object) -> bool | _Unknown:
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


@dataclass
class _Frame:
    module: str
    env: dict[str, object]
    decision: Decision | None = None
    self_obj: Instance | None = None


_CMP: dict[type[ast.cmpop], Callable[[Any, Any], object]] = {
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
_BIN: dict[type[ast.operator], Callable[[object, object], object]] = {
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
#: Builtins that are pure on known arguments.
_PURE_BUILTINS: dict[str, Callable[..., object]] = {
    name: getattr(builtins, name)
    for name in (
        "int",
        "str",
        "bool",
        "range",
        "frozenset",
        "dict",
        "reversed",
        "enumerate",
        "zip",
        "tuple",
        "list",
        "len",
        "min",
        "max",
        "any",
        "all",
        "abs",
        "sorted",
        "set",
    )
}
#: Methods of known str / tuple / list / dict values that are pure.
_PURE_METHODS = frozenset(
    {"split", "startswith", "endswith", "lower", "upper", "strip", "get", "keys", "values", "items", "join",
     "replace", "count", "index", "format"}
)  # fmt: skip
_CAUGHT_BY = {
    "KeyError": {"KeyError", "LookupError", "Exception", "BaseException"},
    "AssertionError": {"AssertionError", "Exception", "BaseException"},
    "raise": {"Exception", "BaseException"},
}
_MAX_DEPTH = 12
#: Longest known sequence a for loop or comprehension is unrolled over.
_MAX_UNROLL = 256
#: Methods that change a list / set / dict in place.
_MUTATORS = frozenset(
    {"add", "append", "extend", "update", "insert", "discard", "remove", "pop", "clear", "setdefault"}
)
#: The namespace key holding the modules a module star-imports (a tuple of names), looked up after its own names.
_STARS = "__stackfarm_star_imports__"
_MAX_STEPS = 400_000


class Evaluator:
    """Evaluate functions and expressions of a `SourceTree` for one GPU and one CUDA version.

    `observe` is called with ``(dotted_name, args)`` whenever evaluated code calls something outside the tree with
    known arguments (a loader's ``glob.glob(pattern)``, say); its return value is used as the call's result.
    `assume` gives values to attributes of otherwise unknown objects (``{"enable_torch_symm_mem": True}``: the
    deployment sets that server argument). Packages in `opaque` are modelled, never read, even when the tree
    holds their source: torch's real ``get_device_capability`` would only ask the (absent) driver.
    `environ` is the environment the deployment runs with; a variable not in it is unset (so
    ``os.environ.get("X", "1")`` is "1"), but ``os.environ["X"]`` of an unset one is unknown rather than a crash.
    """

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
        self._environ = _Environ(environ or {})
        self.assume = dict(assume or {})
        self.opaque = tuple(opaque)
        self.gpu = gpu
        self.cuda = cuda
        self.observe = observe
        self._namespaces: dict[str, dict[str, object]] = {}
        self._loading: set[str] = set()
        self._runtime_globals: dict[str, frozenset[str]] = {}
        self._memo: dict[tuple[object, ...], object] = {}
        self._active: set[int] = set()
        self._depth = 0
        self._steps = 0

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

    def expression(self, module: str, node: ast.expr, local_names: Sequence[str] = ()) -> object:
        """Evaluate `node` as written in `module`, with `local_names` (a function's locals) unknown."""
        env: dict[str, object] = dict.fromkeys(local_names, UNKNOWN)
        frame = _Frame(module, env, self_obj=Instance(None) if "self" in env else None)
        if frame.self_obj is not None:
            env["self"] = frame.self_obj
        try:
            return self._eval(node, frame)
        except _Budget:
            return UNKNOWN

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
        try:
            frame = _Frame(module, env)
            self._exec_block(tree.body, frame)
        except _Budget:
            pass
        finally:
            self._loading.discard(module)
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
            return env[name]
        stars = env.get(_STARS, ())
        for star in stars if isinstance(stars, tuple) else ():
            value = self._from_module(star, name)
            if value is not UNKNOWN:
                return value
        if hasattr(builtins, name):
            return External(f"builtins.{name}")
        return UNKNOWN

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

    # ----------------------------------------------------------------------- statements

    def _tick(self) -> None:
        self._steps += 1
        if self._steps > _MAX_STEPS:
            raise _Budget

    def _exec_block(self, body: Sequence[ast.stmt], frame: _Frame) -> list[End]:
        """Run statements; returns the non-falling ends, plus one ``fall`` end if some path falls through."""
        ends: list[End] = []
        for stmt in body:
            self._tick()
            try:
                new_ends = self._exec(stmt, frame)
            except Crash as crash:
                kind: EndKind = "raise" if crash.deliberate else "crash"
                decision = crash.decision or frame.decision
                via = crash.via
                inside = crash.module == frame.module and stmt.lineno <= crash.line <= (stmt.end_lineno or 0)
                if not inside:  # raised in a called function: remember where we called it
                    via = (*via, (frame.module, stmt.lineno))
                ends.append(
                    End(kind, crash.module, crash.line, detail=str(crash), decision=decision, via=via)
                )
                return ends
            falls = [e for e in new_ends if e.kind == "fall"]
            ends.extend(e for e in new_ends if e.kind != "fall")
            if not falls:
                return ends
        ends.append(
            End("fall", frame.module, body[-1].end_lineno or 0 if body else 0, decision=frame.decision)
        )
        return ends

    def _branch(self, body: Sequence[ast.stmt], frame: _Frame) -> tuple[list[End], _Frame]:
        # each branch gets its own copies of lists / sets / dicts, since statements like `x.add(v)` change them
        sub = _Frame(
            frame.module, {k: _copy(v) for k, v in frame.env.items()}, frame.decision, frame.self_obj
        )
        if frame.self_obj is not None:
            # branches may set different attributes on self: give each its own copy, merged afterwards
            sub.self_obj = Instance(
                frame.self_obj.cls, {k: _copy(v) for k, v in frame.self_obj.attrs.items()}
            )
            sub.env = {k: (sub.self_obj if v is frame.self_obj else v) for k, v in sub.env.items()}
        return (self._exec_block(body, sub) if body else [End("fall", frame.module, 0)]), sub

    def _merge_into(self, frame: _Frame, subs: Sequence[_Frame]) -> None:
        keys = set().union(*(s.env for s in subs))
        for key in keys:
            values = [s.env.get(key, UNKNOWN) for s in subs]
            if frame.self_obj is not None and all(v is s.self_obj for v, s in zip(values, subs, strict=True)):
                frame.env[key] = frame.self_obj  # each branch's own copy of self: merged below
                continue
            if key == _STARS:  # `from m import *` in either branch: look names up in all of them
                frame.env[key] = tuple(dict.fromkeys(m for v in values if isinstance(v, tuple) for m in v))
                continue
            frame.env[key] = _join_all(values)
        if frame.self_obj is not None:
            attrs = set().union(*(s.self_obj.attrs for s in subs if s.self_obj))
            for attr in attrs:
                vals = [s.self_obj.attrs.get(attr, UNKNOWN) if s.self_obj else UNKNOWN for s in subs]
                frame.self_obj.attrs[attr] = _join_all(vals)

    def _decide(self, frame: _Frame, node: ast.expr) -> bool | _Unknown:
        value = truth(self._eval(node, frame))
        if value is not UNKNOWN:
            frame.decision = Decision(frame.module, node.lineno, _text(node), bool(value))
        return value

    def _exec(self, stmt: ast.stmt, frame: _Frame) -> list[End]:  # one branch per statement kind
        fall = [End("fall", frame.module, stmt.lineno)]
        if isinstance(stmt, ast.If):
            test = self._decide(frame, stmt.test)
            if test is True:
                return self._exec_block(stmt.body, frame) if stmt.body else fall
            if test is False:
                return self._exec_block(stmt.orelse, frame) if stmt.orelse else fall
            ends_a, sub_a = self._branch(stmt.body, frame)
            ends_b, sub_b = self._branch(stmt.orelse, frame)
            live = [s for s, e in ((sub_a, ends_a), (sub_b, ends_b)) if any(x.kind == "fall" for x in e)]
            if live:
                self._merge_into(frame, live)
            return [e for e in ends_a + ends_b if e.kind != "fall"] + (fall if live else [])
        if isinstance(stmt, ast.Return):
            value = self._eval(stmt.value, frame) if stmt.value is not None else None
            return [End("return", frame.module, stmt.lineno, value, decision=frame.decision)]
        if isinstance(stmt, ast.Raise):
            text = _text(stmt.exc) if stmt.exc is not None else "re-raise"
            return [End("raise", frame.module, stmt.lineno, detail=text, decision=frame.decision)]
        if isinstance(stmt, ast.Assert):
            test = self._decide(frame, stmt.test)
            if test is False:
                detail = f"AssertionError: {_text(stmt.test)}"
                return [End("raise", frame.module, stmt.lineno, detail=detail, decision=frame.decision)]
            return fall
        if isinstance(stmt, ast.Assign):
            value = self._eval(stmt.value, frame)
            for target in stmt.targets:
                self._bind(target, value, frame)
            return fall
        if isinstance(stmt, ast.AnnAssign):
            if stmt.value is not None:
                self._bind(stmt.target, self._eval(stmt.value, frame), frame)
            return fall
        if isinstance(stmt, ast.AugAssign):
            self._bind(stmt.target, UNKNOWN, frame)
            return fall
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            # a nested function sees its parent's locals as they are now (good enough for helpers and closures)
            closure = None if frame.env is self._namespaces.get(frame.module) else dict(frame.env)
            frame.env[stmt.name] = Function(frame.module, stmt, stmt.name, closure=closure)
            return fall
        if isinstance(stmt, ast.ClassDef):
            frame.env[stmt.name] = ClassValue(frame.module, stmt, stmt.name)
            return fall
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            self._import(stmt, frame)
            return fall
        if isinstance(stmt, ast.Try):
            return self._try(stmt, frame)
        if isinstance(stmt, ast.With | ast.AsyncWith):
            for item in stmt.items:
                if item.optional_vars is not None:
                    self._bind(item.optional_vars, UNKNOWN, frame)
            return self._exec_block(stmt.body, frame)
        if isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
            return self._loop(stmt, frame)
        if isinstance(stmt, ast.Expr):
            self._mutation(stmt.value, frame)
            return fall
        if isinstance(stmt, ast.Pass | ast.Global | ast.Nonlocal | ast.Break | ast.Continue | ast.Delete):
            return fall
        # match statements and anything newer: whatever they bind is unknown
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                frame.env[node.id] = UNKNOWN
        return fall

    def _mutation(self, node: ast.expr, frame: _Frame) -> None:
        """``x.add(v)`` / ``x.append(v)`` ... on a known container changes it; with an unknown argument the
        container becomes unknown. Other expression statements have no effect the evaluator tracks."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            return
        if node.func.attr not in _MUTATORS or node.keywords:
            return
        receiver = self._eval(node.func.value, frame)
        if not isinstance(receiver, list | set | dict) or isinstance(receiver, _Environ):
            return
        args = [self._eval(a, frame) for a in node.args]
        if all(_known(a) for a in args) and not any(isinstance(a, ast.Starred) for a in node.args):
            try:
                getattr(receiver, node.func.attr)(*args)
            except Exception:  # e.g. list.remove of a missing item: leave the container unknown
                self._bind(node.func.value, UNKNOWN, frame)
            return
        self._bind(node.func.value, UNKNOWN, frame)

    def _loop(self, stmt: ast.For | ast.AsyncFor | ast.While, frame: _Frame) -> list[End]:
        # A for loop over a short known sequence, without break / continue / return inside, is unrolled;
        # any other loop is not: what it binds becomes unknown, and a return inside is a possible end.
        if isinstance(stmt, ast.For) and not stmt.orelse and not _jumps(stmt.body):
            items = self._eval(stmt.iter, frame)
            if (
                isinstance(items, list | tuple | set | frozenset | range | str | dict)
                and len(items) <= _MAX_UNROLL
            ):
                failing: list[End] = []
                for item in list(items):
                    self._bind(stmt.target, item, frame)
                    step = self._exec_block(stmt.body, frame)
                    failing += [e for e in step if e.kind != "fall"]
                    if not any(e.kind == "fall" for e in step):
                        return failing
                return [*failing, End("fall", frame.module, stmt.lineno)]
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
                ends.append(End("return", frame.module, node.lineno, UNKNOWN, decision=frame.decision))
        for node in ast.walk(stmt):  # containers changed in the loop are unknown after it
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _MUTATORS
            ):
                self._bind(node.func.value, UNKNOWN, frame)
        return [*ends, End("fall", frame.module, stmt.lineno)]

    def _try(self, stmt: ast.Try, frame: _Frame) -> list[End]:
        before = dict(frame.env)
        ends = self._exec_block(stmt.body, frame)
        out: list[End] = []
        for end in ends:
            kind = _exception_name(end.detail) if end.kind in ("crash", "raise") else None
            handler = self._handler(stmt, kind) if kind else None
            if handler is None:
                out.append(end)
                continue
            sub = _Frame(frame.module, {**before, **{k: UNKNOWN for k in frame.env if k not in before}})
            sub.self_obj = frame.self_obj
            if handler.name:
                sub.env[handler.name] = UNKNOWN
            out.extend(self._exec_block(handler.body, sub))
            if any(e.kind == "fall" for e in out):
                for key, value in sub.env.items():
                    frame.env[key] = join(frame.env.get(key, UNKNOWN), value)
        if any(e.kind == "fall" for e in out) and stmt.orelse:
            out = [e for e in out if e.kind != "fall"] + self._exec_block(stmt.orelse, frame)
        if stmt.finalbody:
            self._exec_block(stmt.finalbody, frame)
        return out

    @staticmethod
    def _handler(stmt: ast.Try, kind: str) -> ast.ExceptHandler | None:
        caught = _CAUGHT_BY.get(kind, {kind, "Exception", "BaseException"})
        for handler in stmt.handlers:
            if handler.type is None:
                return handler
            names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            for name in names:
                last = (
                    name.attr
                    if isinstance(name, ast.Attribute)
                    else name.id
                    if isinstance(name, ast.Name)
                    else ""
                )
                if last in caught:
                    return handler
        return None

    def _import(self, stmt: ast.Import | ast.ImportFrom, frame: _Frame) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    frame.env[alias.asname] = self._module_value(alias.name)
                else:
                    top = alias.name.split(".")[0]
                    frame.env[top] = self._module_value(top)
            return
        target = resolve_relative(frame.module, self.tree.is_package(frame.module), stmt.level, stmt.module)
        for alias in stmt.names:
            if alias.name == "*":
                if self._in_tree(target):
                    stars = frame.env.get(_STARS, ())
                    frame.env[_STARS] = (*(stars if isinstance(stars, tuple) else ()), target)
                continue
            if not self._in_tree(target):
                frame.env[alias.asname or alias.name] = External(f"{target}.{alias.name}")
            else:
                frame.env[alias.asname or alias.name] = ImportRef(target, alias.name)

    def _module_value(self, name: str) -> object:
        return ModuleRef(name) if self._in_tree(name) else External(name)

    def _bind(self, target: ast.expr, value: object, frame: _Frame) -> None:
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

    def _eval(self, node: ast.expr, frame: _Frame) -> object:  # one branch per node kind
        self._tick()
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in frame.env:
                return self._deref(frame.env[node.id])
            return self._deref(self._global(frame.module, node.id))
        if isinstance(node, ast.Attribute):
            return self._getattr(self._eval(node.value, frame), node.attr)
        if isinstance(node, ast.BoolOp):
            return self._boolop(node, frame)
        if isinstance(node, ast.UnaryOp):
            operand = self._eval(node.operand, frame)
            if isinstance(node.op, ast.Not):
                t = truth(operand)
                return UNKNOWN if t is UNKNOWN else not t
            if operand is UNKNOWN or not isinstance(operand, int | float):
                return UNKNOWN
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.Compare):
            return self._compare(node, frame)
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, frame), self._eval(node.right, frame)
            if isinstance(node.op, ast.Div) and isinstance(left, PathValue) and isinstance(right, str):
                return PathValue(f"{left.text}/{right}")
            return _apply(_BIN.get(type(node.op)), left, right)
        if isinstance(node, ast.IfExp):
            test = truth(self._eval(node.test, frame))
            if test is UNKNOWN:
                return join(self._eval(node.body, frame), self._eval(node.orelse, frame))
            return self._eval(node.body if test else node.orelse, frame)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = [self._eval(e, frame) for e in node.elts]
            if any(isinstance(e, ast.Starred) for e in node.elts):
                return UNKNOWN
            if isinstance(node, ast.Set):
                return _freeze(items)
            return tuple(items) if isinstance(node, ast.Tuple) else items
        if isinstance(node, ast.Dict):
            return self._dict(node, frame)
        if isinstance(node, ast.Subscript):
            return self._subscript(node, frame)
        if isinstance(node, ast.Call):
            return self._call_node(node, frame)
        if isinstance(node, ast.JoinedStr):
            parts = []
            for value in node.values:
                part = self._eval(value.value if isinstance(value, ast.FormattedValue) else value, frame)
                if part is UNKNOWN or isinstance(
                    part, External | Function | Instance | ImportRef | ClassValue
                ):
                    return UNKNOWN
                parts.append(str(part))
            return "".join(parts)
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            return self._comprehension(node, frame)
        if isinstance(node, ast.Lambda):
            return Function(frame.module, node, "<lambda>", closure=dict(frame.env))
        if isinstance(node, ast.NamedExpr):
            bound = self._eval(node.value, frame)
            self._bind(node.target, bound, frame)
            return bound
        return UNKNOWN

    def _comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp, frame: _Frame
    ) -> object:
        """A comprehension over known, short sequences; unknown as soon as an item or a condition is."""
        rows: list[dict[str, object]] = [dict(frame.env)]
        for gen in node.generators:
            if gen.is_async:
                return UNKNOWN
            next_rows: list[dict[str, object]] = []
            for env in rows:
                items = self._eval(gen.iter, _Frame(frame.module, env, frame.decision, frame.self_obj))
                if not isinstance(items, list | tuple | set | frozenset | range | str | dict):
                    return UNKNOWN
                if len(items) > _MAX_UNROLL:
                    return UNKNOWN
                for item in list(items):
                    inner = _Frame(frame.module, dict(env), frame.decision, frame.self_obj)
                    self._bind(gen.target, item, inner)
                    keep = True
                    for cond in gen.ifs:
                        t = truth(self._eval(cond, inner))
                        if t is UNKNOWN:
                            return UNKNOWN
                        keep = keep and bool(t)
                    if keep:
                        next_rows.append(inner.env)
            rows = next_rows
        values: list[object] = []
        pairs: list[tuple[object, object]] = []
        for env in rows:
            inner = _Frame(frame.module, env, frame.decision, frame.self_obj)
            if isinstance(node, ast.DictComp):
                pairs.append((self._eval(node.key, inner), self._eval(node.value, inner)))
            else:
                values.append(self._eval(node.elt, inner))
        if any(v is UNKNOWN for pair in pairs for v in pair) or any(v is UNKNOWN for v in values):
            return UNKNOWN
        try:
            if isinstance(node, ast.DictComp):
                return dict(pairs)  # unhashable keys raise TypeError, handled below
            return set(values) if isinstance(node, ast.SetComp) else values
        except TypeError:
            return UNKNOWN

    def _boolop(self, node: ast.BoolOp, frame: _Frame) -> object:
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
                frame.decision = Decision(frame.module, operand.lineno, _text(operand), bool(t))
                return last if not unknown else (not want_and)
        return UNKNOWN if unknown else last

    def _compare(self, node: ast.Compare, frame: _Frame) -> object:
        left = self._eval(node.left, frame)
        result: object = True
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = self._eval(right_node, frame)
            if isinstance(op, ast.Is | ast.IsNot) and (left is None or right is None):
                if left is UNKNOWN or right is UNKNOWN:
                    return UNKNOWN
                outcome: object = (left is right) == isinstance(op, ast.Is)
            else:
                outcome = _apply(_CMP[type(op)], left, right)
            if outcome is UNKNOWN:
                result = UNKNOWN
            elif not outcome:
                return False
            left = right
        return result

    def _dict(self, node: ast.Dict, frame: _Frame) -> object:
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

    def _subscript(self, node: ast.Subscript, frame: _Frame) -> object:
        container = self._eval(node.value, frame)
        if isinstance(node.slice, ast.Slice):
            lo = self._eval(node.slice.lower, frame) if node.slice.lower else None
            hi = self._eval(node.slice.upper, frame) if node.slice.upper else None
            if (
                isinstance(container, tuple | list | str)
                and isinstance(lo, int | None)
                and isinstance(hi, int | None)
            ):
                return container[lo:hi]
            return UNKNOWN
        key = self._eval(node.slice, frame)
        if key is UNKNOWN or container is UNKNOWN:
            return UNKNOWN
        if isinstance(container, dict):
            try:
                if key in container:
                    return container[key]
            except TypeError:
                return UNKNOWN
            if isinstance(container, _Environ):
                return UNKNOWN  # the deployment may set it: only .get() and `in` read "unset"
            raise Crash("KeyError", repr(key), frame.module, node.lineno, _text(node))
        if isinstance(container, tuple | list | str) and isinstance(key, int):
            try:
                return container[key]
            except IndexError:
                raise Crash("IndexError", repr(key), frame.module, node.lineno, _text(node)) from None
        return UNKNOWN

    # ----------------------------------------------------------------------- attributes and calls

    def _getattr(self, obj: object, attr: str) -> object:
        obj = self._deref(obj)
        if attr in self.assume and (obj is UNKNOWN or (isinstance(obj, Instance) and attr not in obj.attrs)):
            return self.assume[attr]
        if isinstance(obj, ModuleRef):
            if self.tree.path_of(f"{obj.name}.{attr}") and attr not in self.namespace(obj.name):
                return ModuleRef(f"{obj.name}.{attr}")
            return self._deref(self._global(obj.name, attr))
        if isinstance(obj, External):
            return self._external_attr(obj.dotted, attr)
        if isinstance(obj, Instance):
            if attr in obj.attrs:
                return obj.attrs[attr]
            value = self._class_attr(obj.cls, attr) if obj.cls else UNKNOWN
            if isinstance(value, Function) and not isinstance(value.node, ast.Lambda):
                if _decorated(value.node, "staticmethod"):
                    return value
                bound = Function(value.module, value.node, value.qualname, (obj, *value.args), value.kwargs)
                if _decorated(value.node, "property"):
                    return self._call(bound, (), {})
                return bound
            return value
        if isinstance(obj, ClassValue):
            return self._class_attr(obj, attr)
        if isinstance(obj, DeviceProperties) and attr in ("major", "minor"):
            return getattr(obj, attr)
        if isinstance(obj, PathValue):
            if attr == "parent":
                return PathValue(str(PurePosixPath(obj.text).parent))
            if attr == "name":
                return PurePosixPath(obj.text).name
            return UNKNOWN
        if isinstance(obj, str | tuple | list | dict) and attr in _PURE_METHODS:
            return _BoundMethod(obj, attr)
        return UNKNOWN

    def _class_attr(self, cls: ClassValue, attr: str) -> object:
        if cls.namespace is None:
            cls.namespace = {}
            frame = _Frame(cls.module, cls.namespace)
            # class bodies see module globals through _global; names bound in the body land in the namespace
            for stmt in cls.node.body:
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                    cls.namespace[stmt.name] = Function(cls.module, stmt, f"{cls.qualname}.{stmt.name}")
                elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                    try:
                        self._exec(stmt, frame)
                    except Crash:
                        continue
        if attr in cls.namespace:
            return cls.namespace[attr]
        for base in cls.node.bases:
            base_value = self._deref(self._eval(base, _Frame(cls.module, {})))
            if isinstance(base_value, ClassValue) and base_value is not cls:
                found = self._class_attr(base_value, attr)
                if found is not UNKNOWN:
                    return found
        return UNKNOWN

    def _external_attr(self, dotted: str, attr: str) -> object:
        name = f"{dotted}.{attr}"
        if name == "os.environ":
            return self._environ
        if name == "torch.version.cuda":
            return self.cuda
        if name in ("torch.version.hip", "torch.version.xpu"):
            return None
        return External(name)

    def _call_node(self, node: ast.Call, frame: _Frame) -> object:
        func = self._deref(self._eval(node.func, frame))
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return UNKNOWN
        args = tuple(self._eval(a, frame) for a in node.args)
        kwargs = {k.arg: self._eval(k.value, frame) for k in node.keywords if k.arg}
        return self._call(func, args, kwargs)

    def _call(self, func: object, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        if isinstance(func, _BoundMethod):
            if any(a is UNKNOWN for a in args):
                return UNKNOWN
            try:
                return getattr(func.obj, func.name)(*args, **kwargs)
            except Exception:
                return UNKNOWN
        if isinstance(func, External):
            return self._call_external(func.dotted, args, kwargs)
        if isinstance(func, _Identity):
            return args[0] if args else UNKNOWN
        if isinstance(func, Function):
            if isinstance(func.node, ast.Lambda):
                return UNKNOWN
            ends = self._run_function(func, args, kwargs, self_obj=None, at_top=False)
            return self._call_result(ends)
        if isinstance(func, ClassValue):
            instance = Instance(func)
            init = self._class_attr(func, "__init__")
            if isinstance(init, Function) and not isinstance(init.node, ast.Lambda):
                ends = self._run_function(init, args, kwargs, self_obj=instance, at_top=False)
                self._call_result(ends)  # raises when every path through __init__ fails
                # what another method reassigns is run-time state (a context object's server args): unknown
                for attr in _reassigned(func.node) & set(instance.attrs):
                    instance.attrs[attr] = UNKNOWN
            return instance
        return UNKNOWN

    def _call_external(self, dotted: str, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        tail = dotted.rsplit(".", 1)[-1]
        if (tail == "get_device_capability" and "cuda" in dotted) or dotted.endswith(
            "platform.get_device_capability"
        ):
            return (self.gpu.major, self.gpu.minor)
        if tail == "get_device_properties" and "cuda" in dotted:
            return DeviceProperties(self.gpu.major, self.gpu.minor)
        if dotted == "torch.cuda.is_available":
            return True
        if tail == "is_available" and dotted.split(".")[:1] == ["torch"] and dotted.count(".") == 2:
            return False  # torch.xpu / torch.hpu / torch.npu ...: the platform is CUDA
        if dotted == "builtins.hasattr" and len(args) == 2 and isinstance(args[1], str):
            return _platform_hasattr(args[0], args[1])
        if dotted in ("torch.cuda.current_device", "torch.cuda.device_count"):
            # one GPU of the target arch (a node of several identical GPUs decides the same way)
            return 0 if tail == "current_device" else 1
        if dotted == "os.getenv" and args and isinstance(args[0], str):
            return self._environ.get(args[0], args[1] if len(args) > 1 else kwargs.get("default"))
        if dotted in ("functools.lru_cache", "functools.cache", "functools.wraps"):
            if args and isinstance(args[0], Function):
                return args[0]
            return _Identity()
        if dotted == "functools.partial" and args and isinstance(args[0], Function):
            fn = args[0]
            return Function(
                fn.module, fn.node, fn.qualname, (*fn.args, *args[1:]), (*fn.kwargs, *kwargs.items())
            )
        if (
            dotted in ("pathlib.Path", "os.path.dirname")
            and len(args) == 1
            and isinstance(args[0], str | PathValue)
        ):
            text = args[0].text if isinstance(args[0], PathValue) else args[0]
            return PathValue(text) if tail == "Path" else str(PurePosixPath(text).parent)
        if dotted == "builtins.str" and len(args) == 1 and isinstance(args[0], PathValue):
            return args[0].text
        if dotted == "builtins.isinstance":
            return UNKNOWN
        if dotted == "builtins.map" and len(args) == 2:
            mapper, items = args
            if (
                isinstance(mapper, External)
                and mapper.dotted.startswith("builtins.")
                and isinstance(items, list | tuple)
            ):
                return [self._call_external(mapper.dotted, (i,), {}) for i in items]
            return UNKNOWN
        if dotted.startswith("builtins.") and tail in _PURE_BUILTINS:
            if any(a is UNKNOWN for a in args) or kwargs:
                return UNKNOWN
            if any(isinstance(a, list) and UNKNOWN in a for a in args):
                return UNKNOWN
            try:
                return _PURE_BUILTINS[tail](*args)
            except Exception:
                return UNKNOWN
        if self.observe is not None and args and all(_known(a) for a in args):
            return self.observe(dotted, args)
        return UNKNOWN

    @staticmethod
    def _call_result(ends: Sequence[End]) -> object:
        values = [e.value if e.kind == "return" else None for e in ends if e.kind in ("return", "fall")]
        if not values:
            failing = [e for e in ends if e.kind in ("crash", "raise")]
            if failing:
                first = failing[0]
                kind, _, detail = first.detail.partition(": ")
                crash = (
                    Crash(_exception_name(first.detail), first.detail, first.module, first.line, first.detail,
                          deliberate=True)
                    if first.kind == "raise"
                    else Crash(kind, detail, first.module, first.line, first.detail)
                )  # fmt: skip
                crash.decision = first.decision
                crash.via = first.via
                raise crash
            return UNKNOWN
        merged = values[0]
        for v in values[1:]:
            merged = join(merged, v)
        return merged

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
        key = (id(node), *_key(func.args + args), *_key(tuple(func.kwargs) + tuple(kwargs.items())))
        if not at_top and key in self._memo:
            cached = self._memo[key]
            return cached if isinstance(cached, list) else []
        if id(node) in self._active or self._depth >= _MAX_DEPTH:
            return [End("return", func.module, node.lineno, UNKNOWN)]
        env: dict[str, object] = dict(func.closure or {})
        all_args = (*func.args, *args)
        if self_obj is not None:
            all_args = (self_obj, *all_args)
        self._bind_params(node, env, all_args, {**dict(func.kwargs), **kwargs}, func.module)
        frame = _Frame(func.module, env)
        first = node.args.posonlyargs + node.args.args
        if first and isinstance(env.get(first[0].arg), Instance):
            frame.self_obj = env[first[0].arg]  # type: ignore[assignment]  # checked just above
        self._active.add(id(node))
        self._depth += 1
        try:
            ends = self._exec_block(node.body, frame)
        finally:
            self._depth -= 1
            self._active.discard(id(node))
        if not at_top:
            self._memo[key] = ends
        return ends

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
                env[param.arg] = self._eval(default, _Frame(module, {})) if default is not None else UNKNOWN
        for param, kw_default in zip(spec.kwonlyargs, spec.kw_defaults, strict=True):
            if param.arg in kwargs:
                env[param.arg] = kwargs[param.arg]
            else:
                env[param.arg] = (
                    self._eval(kw_default, _Frame(module, {})) if kw_default is not None else UNKNOWN
                )
        if spec.vararg:
            env[spec.vararg.arg] = UNKNOWN
        if spec.kwarg:
            env[spec.kwarg.arg] = UNKNOWN


#: What a CUDA build of torch has, for ``hasattr(torch, ...)`` / ``hasattr(torch.version, ...)`` checks.
_TORCH_HAS = {"torch": frozenset({"cuda", "version", "ops", "distributed"}),
              "torch.version": frozenset({"cuda", "hip", "git_version", "debug", "__version__"})}  # fmt: skip


def _platform_hasattr(obj: object, name: str) -> object:
    if isinstance(obj, External) and obj.dotted in _TORCH_HAS:
        has = _TORCH_HAS[obj.dotted]
        # torch.version is a plain module with a fixed set of names; torch itself has many more than listed
        return name in has if obj.dotted == "torch.version" or name in has else UNKNOWN
    return UNKNOWN


class _Environ(dict[str, str]):
    """``os.environ`` as the evaluator sees it: never copied per branch, never changed."""


def _copy(value: object) -> object:
    if isinstance(value, list | set | dict) and not isinstance(value, _Environ):
        return value.copy()
    return value


def _exception_name(detail: str) -> str:
    """``KeyError: 12`` -> KeyError; ``RuntimeError(f'...')`` -> RuntimeError; anything else -> raise."""
    match = re.match(r"^(?:\w+\.)*(\w+)(?:[:(]|$)", detail)
    return match.group(1) if match else "raise"


def _reassigned(cls: ast.ClassDef) -> set[str]:
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


def _jumps(body: Sequence[ast.stmt]) -> bool:
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


def _join_all(values: Sequence[object]) -> object:
    merged = values[0]
    for value in values[1:]:
        merged = join(merged, value)
    return merged


def _known(value: object) -> bool:
    if value is UNKNOWN:
        return False
    if isinstance(value, tuple | list):
        return all(_known(v) for v in value)
    return isinstance(value, str | int | float | bool | bytes | PathValue) or value is None


def _key(values: Sequence[object]) -> tuple[object, ...]:
    out: list[object] = []
    for v in values:
        try:
            hash(v)
            out.append(v)
        except TypeError:
            out.append(id(v))
    return tuple(out)


def _freeze(items: list[object]) -> object:
    try:
        return frozenset(items) if UNKNOWN not in items else UNKNOWN
    except TypeError:
        return UNKNOWN


def _apply(op: Callable[[object, object], object] | None, left: object, right: object) -> object:
    if op is None or left is UNKNOWN or right is UNKNOWN:
        return UNKNOWN
    if isinstance(right, list | tuple | frozenset | set) and UNKNOWN in right:
        try:
            if op(left, right):  # `x in [9, UNKNOWN]` is True when 9 matches, unknown otherwise
                return True
        except Exception:
            return UNKNOWN
        return UNKNOWN
    if not all(isinstance(v, int | float | str | tuple | list | dict | frozenset | set | bytes) or v is None
               for v in (left, right)):  # fmt: skip
        if op in (operator.is_, operator.is_not):
            return op(left, right)
        return UNKNOWN
    try:
        return op(left, right)
    except Exception:
        return UNKNOWN


def _decorated(node: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    return any(isinstance(d, ast.Name) and d.id == name for d in node.decorator_list)


def _text(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 160 else text[:157] + "..."


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
