"""Derive an SGLang tree's EAGLE-3 contract from its own code (see `eagle3` for the whole story).

`derive_contract(root)` finds which worker classes serve EAGLE3, evaluates the algorithm's `is_*()` predicates
for EAGLE3 from their own bodies, finds the flags set only on EAGLE-3 paths, and walks the workers plus every
module of `speculative/` and `model_executor/` with `eagle3_uses.UseCollector`.

SpeculativeAlgorithm (speculative/spec_info.py) has had three forms, all read here:

- an Enum with ``create_worker()`` (0.5.8 on): the classes it returns (or imports) for EAGLE3;
- a registry (0.5.4.post2 - 0.5.7): ``register_speculative_algorithm("EAGLE3", worker_cls=<factory>,
  flags=("EAGLE", "EAGLE3"))`` at module level, predicates ``self._has_flag("EAGLE3")``; the workers are the
  classes the factory imports;
- a bare Enum (0.4.x - 0.5.4.post1): the scheduler picks the worker, ``if self.spec_algorithm.is_eagle(): from
  sglang.srt.speculative.eagle_worker import EAGLEWorker``; the workers are the classes imported under
  conditions that hold for EAGLE3 and not without speculation, in managers/.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stackfarm.analysis.eagle3_contract import (
    ROLES,
    Contract,
    ContractError,
    Requirement,
    Role,
    Use,
    site_key,
)
from stackfarm.analysis.eagle3_uses import (
    EAGLE3,
    NO_SPEC,
    Guard,
    Knowledge,
    Scope,
    Tri,
    UseCollector,
    World,
    logic3,
)
from stackfarm.analysis.sourcetree import ClassRef, SourceTree, last_name

SPEC_INFO = "sglang/srt/speculative/spec_info.py"
SCANNED = ("sglang/srt/speculative", "sglang/srt/model_executor")
#: Where a bare-Enum SGLang picks its draft worker (the scheduler).
MANAGERS = "sglang/srt/managers"
_WORKER_NAME = re.compile(r"Worker(V\d+)?$")
_REGISTER = ("register_speculative_algorithm", "register")
#: The code the derivation runs: a change to it changes `contract_key`.
_CODE = tuple(
    Path(__file__).with_name(n)
    for n in ("eagle3_derive.py", "eagle3_uses.py", "eagle3_contract.py", "sourcetree.py")
)


def tree_version(root: Path) -> str:
    """The sglang version of an unpacked wheel tree, from its dist-info name ("" when there is none)."""
    for info in sorted(root.glob("sglang-*.dist-info")):
        return info.name.removeprefix("sglang-").removesuffix(".dist-info")
    return ""


# --------------------------------------------------------------------------------------------- the algorithm


def _speculative_algorithm(tree: SourceTree) -> tuple[ast.Module, ast.ClassDef]:
    """spec_info.py and its SpeculativeAlgorithm class; ContractError when the tree has neither."""
    path = tree.root / SPEC_INFO
    if not path.is_file():
        raise ContractError(f"{SPEC_INFO} is missing: this tree is not an SGLang with speculative decoding")
    module = tree.parse(path)
    cls = next(
        (n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm"), None
    )
    if cls is None:
        raise ContractError(f"{SPEC_INFO} defines no class SpeculativeAlgorithm")
    return module, cls


def _one_line_methods(cls: ast.ClassDef) -> dict[str, ast.expr]:
    """Argument-less methods whose body (docstring aside) is one ``return <expression>``."""
    methods: dict[str, ast.expr] = {}
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or len(fn.args.args) != 1 or fn.args.vararg or fn.args.kwarg:
            continue
        returned = _only_return(fn)
        if returned is not None:
            methods[fn.name] = returned
    return methods


def _only_return(fn: ast.FunctionDef) -> ast.expr | None:
    """The expression of ``return <expression>`` when it is the whole body (a docstring aside)."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Return):
        return body[0].value
    return None


@dataclass(frozen=True)
class _Registration:
    """One module-level ``register_speculative_algorithm(name, worker_cls=..., flags=(...))`` (or
    ``SpeculativeAlgorithm.register(name)``) of the registry form."""

    name: str
    flags: frozenset[str]
    worker: ast.expr | None


def _registrations(module: ast.Module) -> list[_Registration]:
    found = []
    for stmt in module.body:
        call = stmt.value if isinstance(stmt, ast.Expr | ast.Assign) else None
        if not isinstance(call, ast.Call) or last_name(call.func) not in _REGISTER or not call.args:
            continue
        first = call.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            found.append(_registration(first.value, call))
    return found


def _registration(name: str, call: ast.Call) -> _Registration:
    """What one registering call says: the worker (``worker_cls=`` or the second argument) and the flags."""
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    worker = keywords.get("worker_cls") or (call.args[1] if len(call.args) > 1 else None)
    flags_node = keywords.get("flags")
    flags = frozenset(
        e.value.upper()
        for e in (flags_node.elts if isinstance(flags_node, ast.Tuple | ast.List) else [])
        if isinstance(e, ast.Constant) and isinstance(e.value, str)
    )
    return _Registration(name.upper(), flags, worker)


@dataclass(frozen=True)
class _Predicates:
    """SpeculativeAlgorithm's predicates, judged from their bodies for one algorithm (an enum member name)."""

    members: frozenset[str]
    methods: Mapping[str, ast.expr]
    #: The registry form's flags per algorithm (``self._has_flag("EAGLE3")``); empty for the Enum forms.
    flags: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def value(self, node: ast.expr, algorithm: str, seen: frozenset[str]) -> Tri:
        connective, result = logic3(node, lambda operand: self.value(operand, algorithm, seen))
        if connective:
            return result
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            return self._call(node.func.attr, node.args, algorithm, seen)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.left, ast.Name):
            return self._compare(node.ops[0], node.comparators[0], algorithm)
        return None

    def _call(self, name: str, args: Sequence[ast.expr], algorithm: str, seen: frozenset[str]) -> Tri:
        """``self.is_x()`` (another predicate, judged from its body) or ``self._has_flag("X")`` (the registry)."""
        if not args:
            return self._predicate(name, algorithm, seen)
        if name != "_has_flag" or len(args) != 1 or algorithm not in self.flags:
            return None
        flag = args[0]
        if isinstance(flag, ast.Constant) and isinstance(flag.value, str):
            return flag.value.upper() in self.flags[algorithm]
        return None

    def _predicate(self, name: str, algorithm: str, seen: frozenset[str]) -> Tri:
        """Another one-line predicate, unless it is already being judged (then open)."""
        if name in self.methods and name not in seen:
            return self.value(self.methods[name], algorithm, seen | {name})
        return None

    def _compare(self, op: ast.cmpop, right: ast.expr, algorithm: str) -> Tri:
        """``self == SpeculativeAlgorithm.EAGLE3``, ``self in (EAGLE, EAGLE3)`` and their negations."""
        if (
            isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot)
            and (m := last_name(right)) in self.members
        ):
            return (m == algorithm) == isinstance(op, ast.Eq | ast.Is)
        if isinstance(op, ast.In | ast.NotIn) and isinstance(right, ast.Tuple | ast.List | ast.Set):
            names = {last_name(e) for e in right.elts}
            if names <= self.members:
                return (algorithm in names) == isinstance(op, ast.In)
        return None


def _algorithm_predicates(tree: SourceTree) -> dict[str, dict[str, Tri]]:
    """Each argument-less predicate of SpeculativeAlgorithm, evaluated from its body for EAGLE3 and NONE."""
    module, cls = _speculative_algorithm(tree)
    registered = _registrations(module)
    members = _enum_members(cls) | {r.name for r in registered}
    if EAGLE3 not in members:
        raise ContractError(
            f"SpeculativeAlgorithm in {SPEC_INFO} has no EAGLE3 member (it has {sorted(members)}), "
            "neither as an Enum member nor registered with register_speculative_algorithm()"
        )
    flags = {r.name: r.flags for r in registered} if registered else {}
    if flags:
        flags.setdefault(NO_SPEC, frozenset())
    predicates = _Predicates(members, _one_line_methods(cls), flags)
    return {
        name: {alg: predicates.value(expr, alg, frozenset({name})) for alg in (EAGLE3, NO_SPEC)}
        for name, expr in predicates.methods.items()
    }


def _enum_members(cls: ast.ClassDef) -> frozenset[str]:
    """The upper-case names a class body assigns: the members of the Enum forms."""
    return frozenset(
        t.id
        for n in cls.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name) and t.id.isupper()
    )


def _returns_under(
    stmts: Sequence[ast.stmt], guards: list[Guard]
) -> Iterator[tuple[ast.Return, list[Guard]]]:
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


def contract_key(root: Path) -> str:
    """A digest of all `derive_contract(root)` reads and of the code that derives it: a key to cache a contract by."""
    tree = SourceTree([root])
    digest = hashlib.sha256(tree_version(tree.root).encode() + b"\0")  # the contract names its version
    for code in _CODE:
        digest.update(code.read_bytes())
    managers = [p for p in tree.files(MANAGERS) if p.is_relative_to(tree.root)]
    for path in [tree.root / SPEC_INFO, *_scanned(tree), *sorted(managers)]:
        if path.is_file():
            digest.update(tree.relative(path).encode() + b"\0")
            digest.update(tree.digest(path).encode())
    return digest.hexdigest()


def _imports_under(
    stmts: Sequence[ast.stmt], guards: list[Guard]
) -> Iterator[tuple[ast.ImportFrom, list[Guard]]]:
    """Every ``from x import y`` in these statements (nested blocks and functions included), with its conditions."""
    for stmt in stmts:
        if isinstance(stmt, ast.If):
            yield from _imports_under(stmt.body, [*guards, (stmt.test, True)])
            yield from _imports_under(stmt.orelse, [*guards, (stmt.test, False)])
        elif isinstance(stmt, ast.ImportFrom):
            yield stmt, guards
        else:
            for name in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(stmt, name, None)
                if isinstance(inner, list):
                    for item in inner:
                        body = item.body if isinstance(item, ast.ExceptHandler) else [item]
                        yield from _imports_under([s for s in body if isinstance(s, ast.stmt)], guards)


def _add_worker(tree: SourceTree, found: list[tuple[Path, str]], cls_ref: object) -> None:
    """A worker class and its bases in speculative/ (a base's uses are the worker's)."""
    if not isinstance(cls_ref, ClassRef):
        return
    classes, _external = tree.mro(cls_ref)
    for worker in classes:
        if (worker.file, worker.name) not in found and worker.file.is_relative_to(tree.root / SCANNED[0]):
            found.append((worker.file, worker.name))


def _imported_workers(
    tree: SourceTree, stmts: Sequence[ast.stmt], knowledge: Knowledge, *, specific: bool
) -> list[tuple[Path, str]]:
    """Worker classes imported from speculative/ under conditions reachable for EAGLE3 (and, with `specific`,
    false without speculation)."""
    found: list[tuple[Path, str]] = []
    for node, guards in _imports_under(stmts, []):
        if not node.module or node.level or not node.module.startswith("sglang.srt.speculative"):
            continue
        if not knowledge.reachable(guards, "target") or (
            specific and not knowledge.specific(guards, "target")
        ):
            continue
        for alias in node.names:
            if _WORKER_NAME.search(alias.name):
                _add_worker(tree, found, tree.resolve_name(node.module, alias.name))
    return found


def _eagle3_workers(tree: SourceTree, knowledge: Knowledge) -> list[tuple[Path, str]]:
    """(file, class) of every worker that serves EAGLE3, and their bases in speculative/ (see the module doc)."""
    spec, cls = _speculative_algorithm(tree)
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "create_worker"), None)
    if fn is not None:
        where = f"create_worker() in {SPEC_INFO}"
        found = _created_workers(tree, spec, fn, knowledge)
    elif (registration := next((r for r in _registrations(spec) if r.name == EAGLE3), None)) is not None:
        where = f'register_speculative_algorithm("EAGLE3", ...) in {SPEC_INFO}'
        found = _registered_workers(tree, spec, registration, knowledge)
    else:
        where = f"{MANAGERS} (SpeculativeAlgorithm has neither create_worker() nor a registry)"
        found = _scheduled_workers(tree, knowledge)
    if not found:
        raise ContractError(f"{where} gives no worker for EAGLE3 that could be found")
    return found


def _created_workers(
    tree: SourceTree, spec: ast.Module, fn: ast.FunctionDef, knowledge: Knowledge
) -> list[tuple[Path, str]]:
    """The Enum form from 0.5.8: the classes ``create_worker()`` returns on paths reachable for EAGLE3."""
    found: list[tuple[Path, str]] = []
    for ret, guards in _returns_under(fn.body, []):
        value = ret.value.func if isinstance(ret.value, ast.Call) else ret.value
        if not isinstance(value, ast.Name) or not knowledge.reachable(guards, "target"):
            continue
        dotted = _imported_module(fn, spec, value.id)
        if dotted:
            _add_worker(tree, found, tree.resolve_name(dotted, value.id))
    return found


def _registered_workers(
    tree: SourceTree, spec: ast.Module, registration: _Registration, knowledge: Knowledge
) -> list[tuple[Path, str]]:
    """The registry form (0.5.4.post2 - 0.5.7): the worker factory's imported classes, or the worker class."""
    factory = registration.worker
    name = factory.id if isinstance(factory, ast.Name) else None
    body = next(
        (n for n in spec.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name),
        None,
    )
    if body is not None:  # a factory function: the worker classes it imports
        return _imported_workers(tree, body.body, knowledge, specific=False)
    found: list[tuple[Path, str]] = []
    if name is not None:  # the worker class itself
        _add_worker(tree, found, tree.resolve_name(tree.module_of(tree.root / SPEC_INFO), name))
    return found


def _scheduled_workers(tree: SourceTree, knowledge: Knowledge) -> list[tuple[Path, str]]:
    """The bare Enum form (0.4.x - 0.5.4.post1): the workers managers/ imports under EAGLE-3-only conditions."""
    found: list[tuple[Path, str]] = []
    for path in sorted(tree.files(MANAGERS)):
        if path.is_relative_to(tree.root) and b"sglang.srt.speculative" in tree.read(path):
            for worker in _imported_workers(tree, tree.parse(path).body, knowledge, specific=True):
                if worker not in found:
                    found.append(worker)
    return found


def _truthy_assignments(module: ast.Module) -> Iterator[tuple[str, ast.expr, list[Guard]]]:
    """(attribute, value, conditions) of every `x.attr = value` whose value is not a constant false."""
    yield from _truthy_under(module.body, [])


def _truthy_under(
    stmts: Sequence[ast.stmt], guards: list[Guard]
) -> Iterator[tuple[str, ast.expr, list[Guard]]]:
    for stmt in stmts:
        if isinstance(stmt, ast.If):
            yield from _truthy_under(stmt.body, [*guards, (stmt.test, True)])
            yield from _truthy_under(stmt.orelse, [*guards, (stmt.test, False)])
            if stmt.body and not stmt.orelse and isinstance(stmt.body[-1], ast.Return | ast.Raise):
                guards = [*guards, (stmt.test, False)]  # `if not (...): return`: the rest runs when false
            continue
        yield from ((attr, value, guards) for attr, value in _truthy_targets(stmt))
        for block in _inner_blocks(stmt):
            yield from _truthy_under(block, guards)


def _truthy_targets(stmt: ast.stmt) -> Iterator[tuple[str, ast.expr]]:
    """(attribute, value) of each ``x.attr`` target of `stmt` when it assigns a value not constant false."""
    if not isinstance(stmt, ast.Assign | ast.AnnAssign) or stmt.value is None:
        return
    if isinstance(stmt.value, ast.Constant) and not stmt.value.value:
        return
    for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
        if isinstance(target, ast.Attribute):
            yield target.attr, stmt.value


def _inner_blocks(stmt: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement blocks nested in `stmt`, one per field (every ``except`` handler's body in one)."""
    for name in ("body", "orelse", "finalbody", "handlers"):
        inner = getattr(stmt, name, None)
        if isinstance(inner, list):
            children = [
                s for item in inner for s in (item.body if isinstance(item, ast.ExceptHandler) else [item])
            ]
            yield [s for s in children if isinstance(s, ast.stmt)]


def _shared_flags(
    tree: SourceTree, files: Sequence[Path], knowledge: Knowledge, strict: Mapping[str, frozenset[Role]]
) -> dict[str, frozenset[Role]]:
    """Attributes set truthy on a path specific to speculation (for these roles) but also elsewhere."""
    known = Knowledge(knowledge.predicates, strict)
    shared: dict[str, set[Role]] = {}
    for path in files:
        for attr, value, guards in _truthy_assignments(tree.parse(path)):
            if attr in strict or attr == "is_draft_worker":
                continue
            for role in ROLES:
                if (
                    known.specific(guards, role)
                    and known.reachable(guards, role)
                    and known.value(value, World(EAGLE3, role)) is not False
                ):
                    shared.setdefault(attr, set()).add(role)
    return {k: frozenset(v) for k, v in shared.items()}


def _eagle3_flags(
    tree: SourceTree, files: Sequence[Path], knowledge: Knowledge
) -> dict[str, frozenset[Role]]:
    """Attributes that are set (truthy) only where EAGLE-3-family speculation runs, and for which roles.

    A fixed point, because flags are copied: `self.eagle_use_aux_hidden_state = model_runner.eagle_...`.
    """
    assignments: dict[str, list[tuple[ast.expr, list[Guard]]]] = {}
    for path in files:
        for attr, value, guards in _truthy_assignments(tree.parse(path)):
            if attr == "is_draft_worker":  # the role itself, which Knowledge.value reads directly
                continue
            assignments.setdefault(attr, []).append((value, guards))
    flags: dict[str, frozenset[Role]] = {}
    for _ in range(5):
        known = Knowledge(knowledge.predicates, flags)
        new: dict[str, frozenset[Role]] = {}
        for attr, sites in assignments.items():
            roles = _eagle3_only(known, sites)
            if roles is not None:
                new[attr] = roles
        if new == flags:
            break
        flags = new
    return flags


def _eagle3_only(known: Knowledge, sites: Sequence[tuple[ast.expr, list[Guard]]]) -> frozenset[Role] | None:
    """The roles for which an attribute assigned at `sites` can be set truthy, when every site is specific to
    speculation (or assigns a value false without it); None when some site is not."""
    off = World(NO_SPEC, "target")
    if not all(known.specific(g, "target") or known.value(v, off) is False for v, g in sites):
        return None
    return frozenset(
        role
        for role in ROLES
        if any(
            known.reachable(g, role) and known.value(v, World(EAGLE3, role)) is not False for v, g in sites
        )
    )


def _scanned(tree: SourceTree) -> list[Path]:
    return sorted(p for folder in SCANNED for p in tree.files(folder))


def derive_contract(root: Path) -> Contract:
    """What this SGLang tree's EAGLE-3 code uses on the target and the draft model (see the module doc)."""
    tree = SourceTree([root])
    knowledge = Knowledge(_algorithm_predicates(tree))
    workers = _eagle3_workers(tree, knowledge)
    files = _scanned(tree)
    executor = [p for p in files if p.is_relative_to(tree.root / SCANNED[1])]
    flags = _eagle3_flags(tree, executor, knowledge)
    shared = _shared_flags(tree, executor, knowledge, flags)
    knowledge = Knowledge(knowledge.predicates, flags, shared)
    uses, flags_used = _collect_uses(tree, files, {path for path, _ in workers}, knowledge)
    return Contract(
        version=tree_version(tree.root),
        workers=tuple(f"{tree.relative(p)}:{c}" for p, c in workers),
        flags=tuple(
            f"{k} ({', '.join(sorted({**shared, **flags}[k])) or 'never'}{'; shared' if k in shared else ''})"
            for k in sorted(flags_used)
        ),
        requirements=_requirements(uses),
    )


def _collect_uses(
    tree: SourceTree, files: Sequence[Path], worker_files: set[Path], knowledge: Knowledge
) -> tuple[list[Use], set[str]]:
    """Every model use on an EAGLE-3 path in `files` (each once), and the flags that decided them."""
    uses: list[Use] = []
    flags_used: set[str] = set()
    for path in files:
        speculative = path.is_relative_to(tree.root / SCANNED[0])
        scope = Scope(file=path, worker_module=path in worker_files, speculative=speculative)
        collector = UseCollector(tree, scope, knowledge, tree.lines(path))
        collector.module(tree.parse(path))
        uses.extend(u for u in collector.uses if u not in uses)  # a helper reached from several callers
        flags_used |= collector.flags_used
    return uses, flags_used


def _requirements(uses: Sequence[Use]) -> tuple[Requirement, ...]:
    """The uses grouped by (role, name): a method when some use calls it, required when some use is not optional."""
    grouped: dict[tuple[Role, str], list[Use]] = {}
    for use in uses:
        grouped.setdefault((use.role, use.name), []).append(use)
    return tuple(
        Requirement(
            role=role,
            name=name,
            kind="method" if any(u.kind == "call" for u in group) else "attribute",
            required=any(not u.optional for u in group),
            uses=tuple(sorted(group, key=lambda u: site_key(u.site))),
        )
        for (role, name), group in sorted(grouped.items())
    )


__all__ = ["SCANNED", "SPEC_INFO", "contract_key", "derive_contract", "tree_version"]
