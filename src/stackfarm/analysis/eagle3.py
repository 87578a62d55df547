"""The EAGLE-3 interface contract: what an SGLang version's EAGLE-3 code uses on its models, and who has it.

SGLang declares no interface for EAGLE-3 (vLLM has the runtime-checkable `SupportsEagle3` protocol): its
workers duck-type the target and the draft model, so a missing hook shows only when a server fails to start.
The contract is therefore read from the version under test itself, never listed by hand:

1. `derive_contract(tree)` asks `SpeculativeAlgorithm.create_worker` (speculative/spec_info.py) which worker
   classes serve EAGLE3, evaluates the algorithm's `is_*()` predicates for EAGLE3 from their own bodies, and
   reads those workers plus every module of `speculative/` and `model_executor/` with `ast`. Each attribute
   used on the target or the draft model on an EAGLE-3 path becomes a `Requirement` with its call sites and
   arities.
2. `check_class(tree, name, role, contract)` finds a model class by name or `EntryClass`, linearises its bases
   across modules (imports resolved inside the tree) and gives, per requirement, a `Finding`: implemented,
   inherited, missing or signature-mismatch.
3. `diff_contracts(old, new)` shows what an upgrade changes in the contract.

Pure functions over files. ASTs are cached by the sha256 of a file's bytes, so the trees of several cells (or
a patched tree that differs in two files) are parsed once per process.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from stackfarm.errors import StackfarmError

Role = Literal["target", "draft"]
ROLES: tuple[Role, ...] = ("target", "draft")
UseKind = Literal["call", "attribute", "probe"]
Verdict = Literal["implemented", "inherited", "missing", "signature-mismatch"]
#: A model expression's role as its name tells it; "runner" is a ModelRunner's own model, whose role the
#: enclosing conditions decide (the same ModelRunner class loads the target and the draft).
_Tag = Literal["target", "draft", "runner"]
_Tri: TypeAlias = bool | None  # three-valued: None is "depends on something we cannot know statically"
_Guard: TypeAlias = tuple[ast.expr, bool]  # an enclosing condition and whether we are in its true branch

_SPEC_INFO = "sglang/srt/speculative/spec_info.py"
_SCANNED = ("sglang/srt/speculative", "sglang/srt/model_executor")
_MODELS = "sglang/srt/models"
_EAGLE3 = "EAGLE3"
_NO_SPEC = "NONE"
_RUNNER_NAME = re.compile(r"runner(_list)?$")


class ContractError(StackfarmError):
    """The tree does not have the shape the derivation reads (no spec_info.py, no EAGLE3 algorithm, ...)."""


# --------------------------------------------------------------------------------------------- parsing

_PARSED: dict[str, tuple[list[str], ast.Module]] = {}


def _parsed(path: Path) -> tuple[list[str], ast.Module]:
    data = path.read_bytes()
    key = hashlib.sha256(data).hexdigest()
    found = _PARSED.get(key)
    if found is None:
        found = (data.decode("utf-8", errors="replace").splitlines(), ast.parse(data, filename=str(path)))
        _PARSED[key] = found
    return found


def parse_file(path: Path) -> ast.Module:
    """The AST of a Python file, parsed once per distinct content (keyed by sha256, not by path)."""
    return _parsed(path)[1]


def tree_version(root: Path) -> str:
    """The sglang version of an unpacked wheel tree, from its dist-info name ("" when there is none)."""
    for info in sorted(root.glob("sglang-*.dist-info")):
        return info.name.removeprefix("sglang-").removesuffix(".dist-info")
    return ""


def _site(root: Path, path: Path, line: int) -> str:
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        rel = path.as_posix()
    return f"{rel}:{line}"


def _text(node: ast.AST, limit: int = 100) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------- three-valued logic


def _not(value: _Tri) -> _Tri:
    return None if value is None else not value


def _all(values: Iterable[_Tri]) -> _Tri:
    seen = list(values)
    if any(v is False for v in seen):
        return False
    return True if all(v is True for v in seen) else None


def _any(values: Iterable[_Tri]) -> _Tri:
    seen = list(values)
    if any(v is True for v in seen):
        return True
    return False if all(v is False for v in seen) else None


@dataclass(frozen=True)
class _World:
    """One way the code can run: the speculative algorithm and which model the ModelRunner holds."""

    algorithm: str
    role: Role


@dataclass(frozen=True)
class _Knowledge:
    """What conditions mean: `SpeculativeAlgorithm` predicates per algorithm, and EAGLE-3 flags with the
    roles for which they can be true (attributes the runner sets only on EAGLE-3 paths, such as
    eagle_use_aux_hidden_state).
    """

    predicates: Mapping[str, Mapping[str, _Tri]]
    flags: Mapping[str, frozenset[Role]] = field(default_factory=dict)

    def value(self, node: ast.expr, world: _World) -> _Tri:
        if isinstance(node, ast.BoolOp):
            parts = [self.value(v, world) for v in node.values]
            return _all(parts) if isinstance(node.op, ast.And) else _any(parts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return _not(self.value(node.operand, world))
        if (
            isinstance(node, ast.Call)
            and not node.args
            and not node.keywords
            and isinstance(node.func, ast.Attribute)
        ):
            table = self.predicates.get(node.func.attr)
            return None if table is None else table.get(world.algorithm)
        name = (
            node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        )
        if name == "is_draft_worker":
            return world.role == "draft"
        if name is not None and name in self.flags:
            # Flags are set only on EAGLE-3 paths: false without speculation, else open (config-dependent).
            return False if world.algorithm == _NO_SPEC or world.role not in self.flags[name] else None
        if isinstance(node, ast.Constant):
            return bool(node.value)
        return None

    def guard(self, guard: _Guard, world: _World) -> _Tri:
        value = self.value(guard[0], world)
        return value if guard[1] else _not(value)

    def reachable(self, guards: Sequence[_Guard], role: Role) -> bool:
        world = _World(_EAGLE3, role)
        return all(self.guard(g, world) is not False for g in guards)

    def specific(self, guards: Sequence[_Guard], role: Role) -> bool:
        """True when these conditions cannot hold without speculative decoding: an EAGLE-3(-family) path."""
        world = _World(_NO_SPEC, role)
        return any(self.guard(g, world) is False for g in guards)


def _guard_text(guards: Sequence[_Guard]) -> str:
    return " and ".join(_text(g) if positive else f"not ({_text(g)})" for g, positive in guards)


# --------------------------------------------------------------------------------------------- the algorithm


def _class_def(module: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _algorithm_predicates(root: Path) -> dict[str, dict[str, _Tri]]:
    """Each argument-less predicate of SpeculativeAlgorithm, evaluated from its body for EAGLE3 and NONE."""
    path = root / _SPEC_INFO
    if not path.is_file():
        raise ContractError(f"{_SPEC_INFO} is missing: this tree is not an SGLang with speculative decoding")
    cls = _class_def(parse_file(path), "SpeculativeAlgorithm")
    if cls is None:
        raise ContractError(f"{_SPEC_INFO} defines no class SpeculativeAlgorithm")
    members = {
        t.id
        for n in cls.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name) and t.id.isupper()
    }
    if _EAGLE3 not in members:
        raise ContractError(
            f"SpeculativeAlgorithm in {_SPEC_INFO} has no EAGLE3 member (it has {sorted(members)})"
        )
    methods: dict[str, ast.expr] = {}
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or len(fn.args.args) != 1 or fn.args.vararg or fn.args.kwarg:
            continue
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
            methods[fn.name] = body[0].value

    def member(node: ast.expr) -> str | None:
        return (
            node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        )

    def value(node: ast.expr, algorithm: str, seen: frozenset[str]) -> _Tri:
        if isinstance(node, ast.BoolOp):
            parts = [value(v, algorithm, seen) for v in node.values]
            return _all(parts) if isinstance(node.op, ast.And) else _any(parts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return _not(value(node.operand, algorithm, seen))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args:
            name = node.func.attr
            if name in methods and name not in seen:
                return value(methods[name], algorithm, seen | {name})
            return None
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.left, ast.Name):
            op, right = node.ops[0], node.comparators[0]
            if isinstance(op, ast.Eq | ast.NotEq) and (m := member(right)) in members:
                return (m == algorithm) == isinstance(op, ast.Eq)
            if isinstance(op, ast.In | ast.NotIn) and isinstance(right, ast.Tuple | ast.List | ast.Set):
                names = {member(e) for e in right.elts}
                if names <= members:
                    return (algorithm in names) == isinstance(op, ast.In)
        return None

    return {
        name: {alg: value(expr, alg, frozenset({name})) for alg in (_EAGLE3, _NO_SPEC)}
        for name, expr in methods.items()
    }


def _returns_under(
    stmts: Sequence[ast.stmt], guards: list[_Guard]
) -> Iterator[tuple[ast.Return, list[_Guard]]]:
    for stmt in stmts:
        if isinstance(stmt, ast.If):
            yield from _returns_under(stmt.body, [*guards, (stmt.test, True)])
            yield from _returns_under(stmt.orelse, [*guards, (stmt.test, False)])
        elif isinstance(stmt, ast.Return):
            yield stmt, guards
        elif isinstance(stmt, ast.Try | ast.With):
            yield from _returns_under(stmt.body, guards)


def _imported_module(fn: ast.FunctionDef, module: ast.Module, name: str) -> str | None:
    for node in [*ast.walk(fn), *module.body]:
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and any((a.asname or a.name) == name for a in node.names)
        ):
            return node.module
    return None


# --------------------------------------------------------------------------------------------- the contract


@dataclass(frozen=True, kw_only=True)
class Use:
    """One place where SGLang touches a model attribute on an EAGLE-3 path."""

    role: Role
    name: str
    kind: UseKind
    #: "sglang/srt/speculative/eagle_worker.py:157"
    site: str
    #: The source of the model expression, e.g. "self.target_worker.model_runner.model".
    receiver: str
    #: Positional arguments of a call (None: not a call, or *args).
    positional: int | None = None
    keywords: tuple[str, ...] = ()
    #: Guarded by hasattr()/getattr(default): a model may lack it.
    optional: bool = False
    #: The enclosing conditions, as source.
    guard: str = ""

    @property
    def arity(self) -> str:
        if self.kind != "call":
            return ""
        pos = "*" if self.positional is None else str(self.positional)
        return pos + "".join(f",{k}=" for k in self.keywords)


@dataclass(frozen=True, kw_only=True)
class Requirement:
    role: Role
    name: str
    #: "method" when some use calls it, else "attribute".
    kind: Literal["method", "attribute"]
    #: False when every use is guarded by hasattr()/getattr(default).
    required: bool
    uses: tuple[Use, ...]

    @property
    def sites(self) -> tuple[str, ...]:
        return tuple(sorted({u.site for u in self.uses}, key=_site_key))

    @property
    def arities(self) -> tuple[str, ...]:
        return tuple(sorted({u.arity for u in self.uses if u.kind == "call"}))

    @property
    def signature(self) -> str:
        if self.kind == "attribute":
            return self.name
        return f"{self.name}({'|'.join(self.arities)})"


def _site_key(site: str) -> tuple[str, int]:
    path, _, line = site.rpartition(":")
    return path, int(line) if line.isdigit() else 0


@dataclass(frozen=True, kw_only=True)
class Contract:
    version: str
    #: The EAGLE3 workers create_worker returns, "path:Class".
    workers: tuple[str, ...]
    #: Attributes set only where speculation runs that gate a use below: "name (roles they can be true for)".
    flags: tuple[str, ...]
    requirements: tuple[Requirement, ...]

    def for_role(self, role: Role, *, required_only: bool = True) -> tuple[Requirement, ...]:
        return tuple(r for r in self.requirements if r.role == role and (r.required or not required_only))

    def to_json(self) -> dict[str, Any]:
        """Plain data: the report's `contract_json`, and what `from_json` reads back (the on-disk cache)."""
        return {
            "sglang": self.version,
            "workers": list(self.workers),
            "flags": list(self.flags),
            "requirements": [
                {
                    "role": r.role,
                    "name": r.name,
                    "kind": r.kind,
                    "required": r.required,
                    "arities": list(r.arities),
                    "sites": list(r.sites),
                    "uses": [
                        {
                            "site": u.site,
                            "kind": u.kind,
                            "receiver": u.receiver,
                            "positional": u.positional,
                            "keywords": list(u.keywords),
                            "optional": u.optional,
                            "guard": u.guard,
                        }
                        for u in r.uses
                    ],
                }
                for r in self.requirements
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Contract:
        requirements = []
        for r in data["requirements"]:
            uses = tuple(
                Use(role=r["role"], name=r["name"], **{**u, "keywords": tuple(u["keywords"])})
                for u in r["uses"]
            )
            requirements.append(
                Requirement(role=r["role"], name=r["name"], kind=r["kind"], required=r["required"], uses=uses)
            )
        return cls(
            version=data["sglang"],
            workers=tuple(data["workers"]),
            flags=tuple(data["flags"]),
            requirements=tuple(requirements),
        )


def contract_key(root: Path) -> str:
    """A digest of all `derive_contract(root)` reads and of this module: a key to cache a contract by."""
    root = Path(root)
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path in [root / _SPEC_INFO, *_python_files(root, _SCANNED)]:
        if path.is_file():
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@dataclass
class _Scope:
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


def _runner_tag(node: ast.expr, scope: _Scope) -> _Tag | None:
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


def _model_tag(node: ast.expr, scope: _Scope) -> _Tag | None:
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
    scope: _Scope,
    models: dict[str, _Tag],
    runners: dict[str, _Tag],
    *,
    on_self: bool,
) -> None:
    """Record `name = <model or runner expr>` (or `self.name = ...` when on_self), flow-insensitively."""
    for _ in range(2):  # a second pass picks up aliases of aliases
        for node in assigns:
            target = node.targets[0]
            key: str | None = None
            if on_self:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    key = target.attr
            elif isinstance(target, ast.Name):
                key = target.id
            if key is None:
                continue
            if (tag := _model_tag(node.value, scope)) is not None:
                models[key] = tag
            elif (tag := _runner_tag(node.value, scope)) is not None:
                runners[key] = tag


class _UseCollector:
    """Walks one module with the stack of enclosing conditions, recording model uses on EAGLE-3 paths."""

    def __init__(self, root: Path, scope: _Scope, knowledge: _Knowledge, lines: Sequence[str]) -> None:
        self.root = root
        self.scope = scope
        self.lines = lines
        self.knowledge = knowledge
        self.uses: list[Use] = []
        #: The flags that decided whether a recorded use is on an EAGLE-3 path (shown in the report).
        self.flags_used: set[str] = set()

    # -- statements ----------------------------------------------------------------------------------------

    def module(self, module: ast.Module) -> None:
        for node in module.body:
            if isinstance(node, ast.ClassDef):
                self.scope.class_name = node.name
                self.scope.class_models, self.scope.class_runners = {}, {}
                methods = [m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
                assigns = {id(m): _assignments(m) for m in methods}
                everything = [a for m in methods for a in assigns[id(m)]]
                _assigned_aliases(
                    everything, self.scope, self.scope.class_models, self.scope.class_runners, on_self=True
                )
                for method in methods:
                    self.function(method, assigns[id(method)])
                self.scope.class_name = ""
                self.scope.class_models, self.scope.class_runners = {}, {}
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.function(node, _assignments(node))

    def function(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, assigns: Sequence[ast.Assign]) -> None:
        # Every model expression spells `.model` or a class alias of one: skip functions that mention neither.
        text = "\n".join(self.lines[fn.lineno - 1 : fn.end_lineno])
        if "model" not in text and not any(alias in text for alias in self.scope.class_models):
            return
        self.scope.local_models, self.scope.local_runners = {}, {}
        _assigned_aliases(
            assigns, self.scope, self.scope.local_models, self.scope.local_runners, on_self=False
        )
        self.block(fn.body, [])

    def block(self, stmts: Sequence[ast.stmt], guards: list[_Guard]) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                self.expr(stmt.test, guards)
                self.block(stmt.body, [*guards, (stmt.test, True)])
                self.block(stmt.orelse, [*guards, (stmt.test, False)])
            elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                # A closure runs where it is called; the conditions around its definition are the best guess.
                self.block(stmt.body, guards)
            elif not isinstance(stmt, ast.ClassDef):
                self.other(stmt, guards)

    def other(self, node: ast.AST, guards: list[_Guard]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self.block([child], guards)
            elif isinstance(child, ast.expr):
                self.expr(child, guards)
            else:
                self.other(child, guards)

    # -- expressions ---------------------------------------------------------------------------------------

    def expr(self, node: ast.expr, guards: list[_Guard]) -> None:
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

    def call(self, node: ast.Call, guards: list[_Guard]) -> bool:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("hasattr", "getattr") and len(node.args) >= 2:
            receiver, name = node.args[0], node.args[1]
            tag = _model_tag(receiver, self.scope)
            if tag is not None and isinstance(name, ast.Constant) and isinstance(name.value, str):
                probe = func.id == "hasattr"
                kind: UseKind = "probe" if probe else "attribute"
                optional = probe or len(node.args) > 2
                self.record(
                    tag, name.value, kind, node=node, receiver=receiver, guards=guards, optional=optional
                )
                for arg in node.args[2:]:
                    self.expr(arg, guards)
                return True
            return False
        if isinstance(func, ast.Attribute):
            tag = _model_tag(func.value, self.scope)
            if tag is not None:
                self.record(tag, func.attr, "call", node=node, receiver=func.value, guards=guards, call=node)
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    self.expr(arg, guards)
                return True
        return False

    def record(
        self,
        tag: _Tag,
        name: str,
        kind: UseKind,
        *,
        node: ast.expr,
        receiver: ast.expr,
        guards: list[_Guard],
        optional: bool = False,
        call: ast.Call | None = None,
    ) -> None:
        if tag == "runner":
            # In speculative/ every runner but the target's is the draft's (EAGLE workers are draft workers).
            roles: tuple[Role, ...] = ("draft",) if self.scope.speculative else ROLES
        else:
            roles = (tag,)
        positional: int | None = None
        keywords: tuple[str, ...] = ()
        if call is not None:
            starred = any(isinstance(a, ast.Starred) for a in call.args) or any(
                k.arg is None for k in call.keywords
            )
            positional = None if starred else len(call.args)
            keywords = tuple(k.arg for k in call.keywords if k.arg is not None)
        for role in roles:
            if not self.knowledge.reachable(guards, role):
                continue
            if not (self.scope.worker_module or self.knowledge.specific(guards, role)):
                continue
            for test, _ in guards:
                self.flags_used |= {
                    n.attr if isinstance(n, ast.Attribute) else n.id
                    for n in ast.walk(test)
                    if isinstance(n, ast.Attribute | ast.Name)
                    and (n.attr if isinstance(n, ast.Attribute) else n.id) in self.knowledge.flags
                }
            self.uses.append(
                Use(
                    role=role,
                    name=name,
                    kind=kind,
                    site=_site(self.root, self.scope.file, node.lineno),
                    receiver=_text(receiver),
                    positional=positional,
                    keywords=keywords,
                    optional=optional or self.probed(name, guards),
                    guard=_guard_text(guards),
                )
            )

    def probed(self, name: str, guards: Sequence[_Guard]) -> bool:
        """Whether a positive enclosing condition is `hasattr(<model>, name)`: then the use is optional."""
        for test, positive in guards:
            if not positive:
                continue
            parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
            for part in parts:
                if (
                    isinstance(part, ast.Call)
                    and isinstance(part.func, ast.Name)
                    and part.func.id == "hasattr"
                    and len(part.args) == 2
                    and isinstance(part.args[1], ast.Constant)
                    and part.args[1].value == name
                    and _model_tag(part.args[0], self.scope) is not None
                ):
                    return True
        return False


def _eagle3_workers(root: Path, knowledge: _Knowledge) -> list[tuple[Path, str]]:
    """(file, class) of every worker `create_worker` returns for EAGLE3, and their bases in speculative/."""
    spec = parse_file(root / _SPEC_INFO)
    cls = _class_def(spec, "SpeculativeAlgorithm")
    fn = next(
        (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "create_worker"),  # type: ignore[union-attr]
        None,
    )
    if fn is None:
        raise ContractError(f"SpeculativeAlgorithm in {_SPEC_INFO} has no create_worker()")
    found: list[tuple[Path, str]] = []
    resolver = _resolver(SourceTree(root))
    for ret, guards in _returns_under(fn.body, []):
        if not isinstance(ret.value, ast.Name) or not knowledge.reachable(guards, "target"):
            continue
        dotted = _imported_module(fn, spec, ret.value.id)
        cls_ref = resolver.resolve_name(dotted, ret.value.id) if dotted else None
        if not isinstance(cls_ref, _Class):
            continue
        classes, _external = resolver.mro(cls_ref)
        for worker in classes:
            if (worker.file, worker.name) not in found and worker.file.is_relative_to(root / _SCANNED[0]):
                found.append((worker.file, worker.name))
    if not found:
        raise ContractError(
            f"create_worker() in {_SPEC_INFO} returns no worker for EAGLE3 that could be found"
        )
    return found


def _truthy_assignments(module: ast.Module) -> Iterator[tuple[str, ast.expr, list[_Guard]]]:
    """(attribute, value, conditions) of every `x.attr = value` whose value is not a constant false."""

    def walk(stmts: Sequence[ast.stmt], guards: list[_Guard]) -> Iterator[tuple[str, ast.expr, list[_Guard]]]:
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                yield from walk(stmt.body, [*guards, (stmt.test, True)])
                yield from walk(stmt.orelse, [*guards, (stmt.test, False)])
                continue
            if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
                constant_false = isinstance(stmt.value, ast.Constant) and not stmt.value.value
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and not constant_false:
                        yield target.attr, stmt.value, guards
            for name in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(stmt, name, None)
                if isinstance(inner, list):
                    children = [
                        s
                        for item in inner
                        for s in (item.body if isinstance(item, ast.ExceptHandler) else [item])
                    ]
                    yield from walk([s for s in children if isinstance(s, ast.stmt)], guards)

    yield from walk(module.body, [])


def _eagle3_flags(files: Sequence[Path], knowledge: _Knowledge) -> dict[str, frozenset[Role]]:
    """Attributes that are set (truthy) only where EAGLE-3-family speculation runs, and for which roles.

    A fixed point, because flags are copied: `self.eagle_use_aux_hidden_state = model_runner.eagle_...`.
    """
    assignments: dict[str, list[tuple[ast.expr, list[_Guard]]]] = {}
    for path in files:
        for attr, value, guards in _truthy_assignments(parse_file(path)):
            if attr == "is_draft_worker":  # the role itself, which _Knowledge.value reads directly
                continue
            assignments.setdefault(attr, []).append((value, guards))
    flags: dict[str, frozenset[Role]] = {}
    for _ in range(5):
        known = _Knowledge(knowledge.predicates, flags)
        new: dict[str, frozenset[Role]] = {}
        for attr, sites in assignments.items():
            off = _World(_NO_SPEC, "target")
            if not all(known.specific(g, "target") or known.value(v, off) is False for v, g in sites):
                continue
            new[attr] = frozenset(
                role
                for role in ROLES
                if any(
                    known.reachable(g, role) and known.value(v, _World(_EAGLE3, role)) is not False
                    for v, g in sites
                )
            )
        if new == flags:
            break
        flags = new
    return flags


def _python_files(root: Path, folders: Sequence[str]) -> list[Path]:
    return sorted(
        p for folder in folders for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts
    )


def derive_contract(root: Path) -> Contract:
    """What this SGLang tree's EAGLE-3 code uses on the target and the draft model (see the module doc)."""
    root = Path(root)
    knowledge = _Knowledge(_algorithm_predicates(root))
    workers = _eagle3_workers(root, knowledge)
    files = _python_files(root, _SCANNED)
    flags = _eagle3_flags([p for p in files if p.is_relative_to(root / _SCANNED[1])], knowledge)
    knowledge = _Knowledge(knowledge.predicates, flags)
    worker_files = {path for path, _ in workers}
    uses: list[Use] = []
    flags_used: set[str] = set()
    for path in files:
        scope = _Scope(
            file=path, worker_module=path in worker_files, speculative=path.is_relative_to(root / _SCANNED[0])
        )
        lines, module = _parsed(path)
        collector = _UseCollector(root, scope, knowledge, lines)
        collector.module(module)
        uses.extend(collector.uses)
        flags_used |= collector.flags_used
    grouped: dict[tuple[Role, str], list[Use]] = {}
    for use in uses:
        grouped.setdefault((use.role, use.name), []).append(use)
    requirements = tuple(
        Requirement(
            role=role,
            name=name,
            kind="method" if any(u.kind == "call" for u in group) else "attribute",
            required=any(not u.optional for u in group),
            uses=tuple(sorted(group, key=lambda u: _site_key(u.site))),
        )
        for (role, name), group in sorted(grouped.items())
    )
    return Contract(
        version=tree_version(root),
        workers=tuple(f"{_site(root, p, 0).rsplit(':', 1)[0]}:{c}" for p, c in workers),
        flags=tuple(f"{k} ({', '.join(sorted(flags[k])) or 'never'})" for k in sorted(flags_used)),
        requirements=requirements,
    )


def format_contract(contract: Contract) -> str:
    """The contract as a few readable lines per requirement (for the report)."""
    lines = [
        f"EAGLE-3 contract of sglang {contract.version or '?'}",
        f"  workers: {', '.join(contract.workers)}",
    ]
    if contract.flags:
        lines.append(f"  EAGLE-3 flags: {', '.join(contract.flags)}")
    for role in ROLES:
        lines.append(f"  {role}:")
        for req in contract.for_role(role, required_only=False):
            need = "required" if req.required else "optional"
            lines.append(f"    {req.signature:<40} {need:<8} {', '.join(req.sites)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- the diff


@dataclass(frozen=True, kw_only=True)
class ContractChange:
    role: Role
    name: str
    change: Literal["added", "removed", "changed"]
    detail: str


def _files_of(req: Requirement) -> set[str]:
    return {s.rpartition(":")[0] for s in req.sites}


def diff_contracts(old: Contract, new: Contract) -> tuple[ContractChange, ...]:
    """What changed between two versions' contracts. Line numbers are ignored: they move every release."""
    before = {(r.role, r.name): r for r in old.requirements}
    after = {(r.role, r.name): r for r in new.requirements}
    changes: list[ContractChange] = []
    for key in sorted(before.keys() | after.keys()):
        role, name = key
        a, b = before.get(key), after.get(key)
        if a is None and b is not None:
            detail = f"{b.signature} {'required' if b.required else 'optional'}, used at {', '.join(b.sites)}"
            changes.append(ContractChange(role=role, name=name, change="added", detail=detail))
        elif b is None and a is not None:
            changes.append(
                ContractChange(role=role, name=name, change="removed", detail=f"was {a.signature}")
            )
        elif a is not None and b is not None:
            notes = []
            if a.kind != b.kind or a.arities != b.arities:
                notes.append(f"{a.signature} -> {b.signature}")
            if a.required != b.required:
                notes.append("now required" if b.required else "now optional")
            gone, came = _files_of(a) - _files_of(b), _files_of(b) - _files_of(a)
            if came:
                notes.append(f"now also used in {', '.join(sorted(came))}")
            if gone:
                notes.append(f"no longer used in {', '.join(sorted(gone))}")
            if notes:
                changes.append(
                    ContractChange(role=role, name=name, change="changed", detail="; ".join(notes))
                )
    return tuple(changes)


def format_diff(old: Contract, new: Contract, changes: Sequence[ContractChange]) -> str:
    head = f"EAGLE-3 contract diff: sglang {old.version or '?'} -> {new.version or '?'}"
    if not changes:
        return f"{head}: no change"
    mark = {"added": "+", "removed": "-", "changed": "~"}
    return "\n".join([head, *(f"  {mark[c.change]} {c.role}.{c.name}: {c.detail}" for c in changes)])


# ----------------------------------------------------------------------------------------- classes and bases


@dataclass(frozen=True)
class SourceTree:
    """An unpacked tree to resolve imports in, plus more roots for imports that leave it (torch's tree)."""

    root: Path
    search: tuple[Path, ...] = ()

    def module_file(self, dotted: str) -> Path | None:
        parts = dotted.split(".")
        for base in (self.root, *self.search):
            for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
                if candidate.is_file():
                    return candidate
        return None

    def site(self, path: Path, line: int) -> str:
        for base in (self.root, *self.search):
            if path.is_relative_to(base):
                return _site(base, path, line)
        return f"{path}:{line}"

    def module_name(self, path: Path) -> str:
        for base in (self.root, *self.search):
            if path.is_relative_to(base):
                parts = list(path.relative_to(base).with_suffix("").parts)
                return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        return path.stem


@dataclass(frozen=True)
class _Class:
    module: str
    file: Path
    node: ast.ClassDef = field(compare=False, hash=False, repr=False)

    @property
    def name(self) -> str:
        return self.node.name


@dataclass(frozen=True)
class _Mod:
    name: str


_Ref: TypeAlias = _Class | _Mod | str | None  # str: a dotted name outside the searched trees


@dataclass(frozen=True)
class _Member:
    kind: Literal["method", "property", "class-attribute", "instance-attribute"]
    line: int
    node: ast.FunctionDef | ast.AsyncFunctionDef | None = field(default=None, compare=False, repr=False)
    value: ast.expr | None = field(default=None, compare=False, repr=False)


def _top_level(stmts: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, including those inside top-level if/try/with (conditional imports)."""
    for stmt in stmts:
        yield stmt
        if isinstance(stmt, ast.If | ast.Try | ast.With):
            inner = [*stmt.body, *getattr(stmt, "orelse", []), *getattr(stmt, "finalbody", [])]
            for handler in getattr(stmt, "handlers", []):
                inner.extend(handler.body)
            yield from _top_level(inner)


class _Resolver:
    """Name resolution across the modules of a tree, as Python would do it at class-definition time."""

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self._bindings: dict[str, dict[str, list[tuple[int, ast.AST]]]] = {}
        self._members: dict[int, tuple[dict[str, _Member], _Member | None]] = {}

    def _module(self, dotted: str) -> tuple[Path, ast.Module] | None:
        path = self.tree.module_file(dotted)
        return None if path is None else (path, parse_file(path))

    def bindings(self, dotted: str) -> dict[str, list[tuple[int, ast.AST]]]:
        if dotted not in self._bindings:
            table: dict[str, list[tuple[int, ast.AST]]] = {}
            found = self._module(dotted)
            for stmt in _top_level(found[1].body) if found else ():
                names: list[str] = []
                if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    names = [stmt.name]
                elif isinstance(stmt, ast.Import | ast.ImportFrom):
                    names = [(a.asname or a.name).split(".")[0] for a in stmt.names]
                elif isinstance(stmt, ast.Assign):
                    names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
                    names = [stmt.target.id]
                for name in names:
                    table.setdefault(name, []).append((stmt.lineno, stmt))
            self._bindings[dotted] = table
        return self._bindings[dotted]

    def _absolute(self, dotted: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        found = self._module(dotted)
        package = dotted.split(".")
        if found is None or found[0].name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)] if node.level > 1 else package
        return ".".join([*package, *([node.module] if node.module else [])])

    def resolve_name(self, dotted: str, name: str, before: int | None = None, depth: int = 0) -> _Ref:
        if depth > 30:
            return None
        entries = self.bindings(dotted).get(name)
        if not entries:
            return None if self._module(dotted) else f"{dotted}.{name}"
        earlier = [e for e in entries if before is None or e[0] < before]
        _line, stmt = (earlier or entries)[-1]
        if isinstance(stmt, ast.ClassDef):
            found = self._module(dotted)
            return _Class(dotted, found[0], stmt) if found else None
        if isinstance(stmt, ast.Import):
            alias = next(a for a in stmt.names if (a.asname or a.name).split(".")[0] == name)
            return _Mod(alias.name if alias.asname else alias.name.split(".")[0])
        if isinstance(stmt, ast.ImportFrom):
            alias = next(a for a in stmt.names if (a.asname or a.name) == name)
            source = self._absolute(dotted, stmt)
            if self.tree.module_file(f"{source}.{alias.name}"):
                return _Mod(f"{source}.{alias.name}")
            if self.tree.module_file(source):
                return self.resolve_name(source, alias.name, None, depth + 1)
            return f"{source}.{alias.name}"
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            return self.resolve_expr(dotted, stmt.value, stmt.lineno, depth + 1)
        return None

    def resolve_expr(self, dotted: str, node: ast.expr, before: int | None = None, depth: int = 0) -> _Ref:
        if isinstance(node, ast.Name):
            return self.resolve_name(dotted, node.id, before, depth)
        if isinstance(node, ast.Attribute):
            base = self.resolve_expr(dotted, node.value, before, depth + 1)
            if isinstance(base, _Mod):
                if self.tree.module_file(f"{base.name}.{node.attr}"):
                    return _Mod(f"{base.name}.{node.attr}")
                if self.tree.module_file(base.name):
                    return self.resolve_name(base.name, node.attr, None, depth + 1)
                return f"{base.name}.{node.attr}"
            return f"{base}.{node.attr}" if isinstance(base, str) else None
        if isinstance(node, ast.Subscript):  # Generic[T], Protocol[...]
            return self.resolve_expr(dotted, node.value, before, depth + 1)
        return None

    def find_class(self, name: str) -> _Class | None:
        """A class by the name SGLang's model registry uses: a top-level class or alias, EntryClass first."""
        root = self.tree.root
        candidates: list[tuple[bool, _Class]] = []
        # Only files that define the name at top level are parsed: most model files merely import Llama & co.
        needle = re.compile(
            rb"^(class\s+" + re.escape(name.encode()) + rb"\b|" + re.escape(name.encode()) + rb"\s*=)", re.M
        )
        for folder in (_MODELS, "sglang"):
            for path in sorted((root / folder).rglob("*.py")):
                if "__pycache__" in path.parts or not needle.search(path.read_bytes()):
                    continue
                dotted = self.tree.module_name(path)
                ref = self.resolve_name(dotted, name)
                if isinstance(ref, _Class):  # the class itself, or a module-level alias of one
                    candidates.append((name in _entry_classes(parse_file(path)), ref))
            if candidates:
                break
        candidates.sort(key=lambda c: not c[0])  # stable: EntryClass-listed definitions first
        return candidates[0][1] if candidates else None

    def bases(self, cls: _Class) -> list[_Ref]:
        # Bases are evaluated before the class name is bound: `class LlamaModel(LlamaModel)` means the import.
        return [self.resolve_expr(cls.module, b, cls.node.lineno) for b in cls.node.bases]

    def mro(self, cls: _Class) -> tuple[list[_Class], list[str]]:
        """C3 linearisation over the classes found; bases outside the trees are listed as names."""
        external: list[str] = []

        def linearise(c: _Class, seen: frozenset[_Class]) -> list[_Class]:
            parents = []
            for ref in self.bases(c):
                if isinstance(ref, _Class) and ref not in seen:
                    parents.append(ref)
                elif isinstance(ref, str) and ref not in external and ref != "object":
                    external.append(ref)
            seqs = [linearise(p, seen | {c}) for p in parents] + [parents]
            out = [c]
            while any(seqs):
                for seq in seqs:
                    head = seq[0] if seq else None
                    if head is not None and not any(head in s[1:] for s in seqs):
                        break
                else:  # inconsistent hierarchy: Python would refuse it; fall back to depth-first order
                    rest = [x for s in seqs for x in s]
                    return out + [x for i, x in enumerate(rest) if x not in rest[:i] and x not in out]
                out.append(head)
                seqs = [s[1:] if s and s[0] == head else s for s in seqs]
            return out

        return linearise(cls, frozenset()), external

    def members(self, cls: _Class) -> tuple[dict[str, _Member], _Member | None]:
        """Names a class defines itself (methods, class and instance attributes), and its forwarding
        __getattr__ if it has one."""
        key = id(cls.node)
        if key in self._members:
            return self._members[key]
        found: dict[str, _Member] = {}
        forward: _Member | None = None
        for stmt in _top_level(cls.node.body):
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                if stmt.name == "__getattr__":
                    forward = _forwarding(stmt)
                    continue
                kind: Literal["method", "property"] = "property" if _is_property(stmt) else "method"
                found.setdefault(stmt.name, _Member(kind, stmt.lineno, node=stmt))
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, _Member("class-attribute", stmt.lineno, value=stmt.value))
        for stmt in cls.node.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.args.args:
                this = stmt.args.args[0].arg
                for name, line, value in _self_assignments(stmt, this):
                    found.setdefault(name, _Member("instance-attribute", line, value=value))
        self._members[key] = (found, forward)
        return found, forward


_RESOLVERS: dict[SourceTree, _Resolver] = {}


def _resolver(tree: SourceTree) -> _Resolver:
    """One resolver per tree and process: bindings, members and the class index are then computed once."""
    if tree not in _RESOLVERS:
        _RESOLVERS[tree] = _Resolver(tree)
    return _RESOLVERS[tree]


def _entry_classes(module: ast.Module) -> set[str]:
    names: set[str] = set()
    for stmt in _top_level(module.body):
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "EntryClass" for t in stmt.targets
        ):
            values = stmt.value.elts if isinstance(stmt.value, ast.List | ast.Tuple) else [stmt.value]
            names |= {v.id for v in values if isinstance(v, ast.Name)}
    return names


def _is_property(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for deco in fn.decorator_list:
        name = deco.attr if isinstance(deco, ast.Attribute) else deco.id if isinstance(deco, ast.Name) else ""
        if name in ("property", "cached_property", "setter", "getter"):
            return True
    return False


def _self_assignments(
    fn: ast.FunctionDef | ast.AsyncFunctionDef, this: str
) -> Iterator[tuple[str, int, ast.expr]]:
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple | ast.List) else [t])]
            for target in flat:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == this
                ):
                    yield target.attr, node.lineno, node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) == 3
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == this
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            yield node.args[1].value, node.lineno, node.args[2]


def _forwarding(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> _Member | None:
    """A __getattr__ counts only if it really forwards the name: `return getattr(self.inner, name)`.

    torch.nn.Module's __getattr__ (parameters, buffers, submodules) forwards nothing and does not count.
    """
    if len(fn.args.args) < 2:
        return None
    param = fn.args.args[1].arg
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        args = node.args
        if isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(args) >= 2:
            target, name = args[0], args[1]
        elif (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in ("__getattr__", "__getattribute__")
            and args
        ):
            target, name = node.func.value, args[0]
        else:
            continue
        if isinstance(name, ast.Name) and name.id == param:
            return _Member("method", fn.lineno, node=fn, value=target)
    return None


# --------------------------------------------------------------------------------------------- signatures


def _accepts(
    fn: ast.FunctionDef | ast.AsyncFunctionDef, positional: int, keywords: Sequence[str]
) -> str | None:
    """None when a call with this many positional arguments and these keywords binds, else why not."""
    args = fn.args
    decorators = {d.id for d in fn.decorator_list if isinstance(d, ast.Name)}
    params = [*args.posonlyargs, *args.args]
    if "staticmethod" not in decorators and params:
        params = params[1:]  # self / cls
    n_posonly = max(0, len(args.posonlyargs) - (0 if "staticmethod" in decorators else 1))
    n_defaults = len(args.defaults)
    if positional > len(params) and args.vararg is None:
        return f"takes at most {len(params)} positional argument(s), called with {positional}"
    bound = {p.arg for p in params[:positional]}
    by_keyword = {p.arg for p in params[n_posonly:]} | {p.arg for p in args.kwonlyargs}
    for kw in keywords:
        if kw in bound:
            return f"gets {kw} twice"
        if kw not in by_keyword and args.kwarg is None:
            return f"has no parameter {kw}"
    required = [p.arg for p in params[: len(params) - n_defaults] if p.arg not in bound]
    required += [p.arg for p, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    missing = [name for name in required if name not in keywords]
    if missing:
        return f"needs {', '.join(missing)}, called with {positional} positional argument(s)"
    return None


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"def {fn.name}({ast.unparse(fn.args)})"


# --------------------------------------------------------------------------------------------- providers


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One (class, required name) verdict, with everything a report row needs."""

    model_class: str
    role: Role
    method: str
    verdict: Verdict
    #: "sglang/srt/models/llama.py:749" where the provider is, "" when missing.
    provider_file: str
    provider_class: str
    #: The consumer call sites, "; "-joined.
    consumer_site: str
    detail: str

    @property
    def ok(self) -> bool:
        return self.verdict in ("implemented", "inherited")


def _delegation_hint(resolver: _Resolver, classes: Sequence[_Class], name: str) -> str:
    """For a missing name: an attribute holding a model that has it (the wrapper case: language_model)."""
    for cls in classes:
        members, _ = resolver.members(cls)
        for attr, member in sorted(members.items()):
            value = member.value
            if member.kind != "instance-attribute" or not isinstance(value, ast.Call):
                continue
            held = resolver.resolve_expr(cls.module, value.func)
            if not isinstance(held, _Class):
                continue
            held_classes, _ = resolver.mro(held)
            for owner in held_classes:
                if name in resolver.members(owner)[0]:
                    where = resolver.tree.site(owner.file, resolver.members(owner)[0][name].line)
                    holds = resolver.tree.site(cls.file, member.line)
                    return (
                        f"; it holds self.{attr} = {held.name}(...) ({holds}), "
                        f"which has {name} ({owner.name}, {where}): it does not delegate to it"
                    )
    return ""


def _lookup(resolver: _Resolver, classes: Sequence[_Class], name: str) -> tuple[_Class, _Member, bool] | None:
    """(owner, member, via_forwarding), like Python's attribute lookup: the MRO first, then __getattr__."""
    for cls in classes:
        member = resolver.members(cls)[0].get(name)
        if member is not None:
            return cls, member, False
    for cls in classes:
        if any(
            isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == "__getattr__"
            for s in cls.node.body
        ):
            forward = resolver.members(cls)[1]
            return (cls, forward, True) if forward is not None else None
    return None


def locate_class(tree: SourceTree, class_name: str) -> tuple[str, str] | None:
    """(module, "file:line") of the class SGLang's registry would use for this name, or None."""
    cls = _resolver(tree).find_class(class_name)
    return None if cls is None else (cls.module, tree.site(cls.file, cls.node.lineno))


def check_class(tree: SourceTree, class_name: str, role: Role, contract: Contract) -> tuple[Finding, ...]:
    """A verdict for every required name of `role` in `contract`, on `class_name` as found in `tree`."""
    resolver = _resolver(tree)
    cls = resolver.find_class(class_name)
    classes, external = resolver.mro(cls) if cls is not None else ([], [])
    findings = []
    for req in contract.for_role(role):
        consumer = "; ".join(req.sites)
        base = functools.partial(
            Finding, model_class=class_name, role=role, method=req.name, consumer_site=consumer
        )
        if cls is None:
            findings.append(
                base(
                    verdict="missing", provider_file="", provider_class="",
                    detail=f"no class {class_name} (nor EntryClass entry) in {tree.root / _MODELS}",
                )
            )  # fmt: skip
            continue
        found = _lookup(resolver, classes, req.name)
        if found is None:
            outside = f"; bases outside the tree, not inspected: {', '.join(external)}" if external else ""
            hint = _delegation_hint(resolver, classes, req.name)
            detail = (
                f"{class_name} has no {req.name}, which {req.role} models need at {consumer}{hint}{outside}"
            )
            findings.append(base(verdict="missing", provider_file="", provider_class="", detail=detail))
            continue
        owner, member, forwarded = found
        where = tree.site(owner.file, member.line)
        verdict: Verdict = "implemented" if owner == cls and not forwarded else "inherited"
        how = (
            f"forwarded by {owner.name}.__getattr__ to {_text(member.value)}"
            if forwarded and member.value
            else ""
        )
        how = how or (
            f"{member.kind} of {owner.name}" + (f", inherited by {class_name}" if owner != cls else "")
        )
        problems = []
        if member.kind == "method" and member.node is not None and not forwarded:
            for use in req.uses:
                if use.kind == "call" and use.positional is not None:
                    why = _accepts(member.node, use.positional, use.keywords)
                    if why:
                        problems.append(f"{use.site} calls {req.name}({use.arity}): {why}")
        if problems:
            sig = _signature(member.node) if member.node is not None else req.name
            detail = f"{sig} at {where} does not accept every call: " + "; ".join(problems)
            verdict = "signature-mismatch"
        else:
            detail = how
        findings.append(base(verdict=verdict, provider_file=where, provider_class=owner.name, detail=detail))
    return tuple(findings)


__all__ = [
    "ROLES",
    "Contract",
    "ContractChange",
    "ContractError",
    "Finding",
    "Requirement",
    "Role",
    "SourceTree",
    "Use",
    "Verdict",
    "check_class",
    "contract_key",
    "derive_contract",
    "diff_contracts",
    "format_contract",
    "format_diff",
    "locate_class",
    "parse_file",
    "tree_version",
]
