"""Who provides the EAGLE-3 contract: model classes found by name, their bases across modules, their members.

`check_class(tree, name, role, contract)` finds a model class the way SGLang's registry does (a top-level class
or alias, `EntryClass` first), linearises its bases across modules (`SourceTree.mro`) and gives, per required
name (and, with ``include_optional``, per probed one), a `Finding`: implemented, inherited, delegated, missing,
optional-missing or signature-mismatch; one class-not-in-release finding when the release has no such class.
Members torch.nn.Module defines itself (``modules()``, ``named_modules()``, ...) and object's attributes
(``__class__``) are inherited from those bases, which are outside the tree: never missing.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from stackfarm.analysis.eagle3_contract import OK_VERDICTS, Contract, Requirement, Role, Verdict
from stackfarm.analysis.sourcetree import ClassRef, SourceTree, last_name, named_call, source_text, top_level

MODELS = "sglang/srt/models"
#: torch.nn.Module's own members (torch/nn/modules/module.py), which every model class inherits. `forward` is
#: not among them: Module's placeholder raises NotImplementedError, so a model must define its own.
NN_MODULE_MEMBERS = frozenset(
    {
        "add_module",
        "apply",
        "bfloat16",
        "buffers",
        "children",
        "compile",
        "cpu",
        "cuda",
        "double",
        "eval",
        "extra_repr",
        "float",
        "get_buffer",
        "get_extra_state",
        "get_parameter",
        "get_submodule",
        "half",
        "ipu",
        "load_state_dict",
        "modules",
        "mtia",
        "named_buffers",
        "named_children",
        "named_modules",
        "named_parameters",
        "parameters",
        "register_backward_hook",
        "register_buffer",
        "register_forward_hook",
        "register_forward_pre_hook",
        "register_full_backward_hook",
        "register_full_backward_pre_hook",
        "register_load_state_dict_post_hook",
        "register_module",
        "register_parameter",
        "register_state_dict_pre_hook",
        "requires_grad_",
        "set_extra_state",
        "set_submodule",
        "share_memory",
        "state_dict",
        "to",
        "to_empty",
        "train",
        "training",
        "type",
        "xpu",
        "zero_grad",
        "__call__",
        "_modules",
        "_parameters",
        "_buffers",
    }
)
_NN_MODULE = ("torch.nn.Module", "torch.nn.modules.module.Module")
#: What every Python object has.
OBJECT_MEMBERS = frozenset({"__class__", "__dict__", "__module__", "__doc__", "__init__", "__repr__"})


@dataclass(frozen=True)
class _Member:
    kind: Literal["method", "property", "class-attribute", "instance-attribute"]
    line: int
    node: ast.FunctionDef | ast.AsyncFunctionDef | None = field(default=None, compare=False, repr=False)
    value: ast.expr | None = field(default=None, compare=False, repr=False)


class _Models:
    """A tree's model classes by registry name, and what each class defines itself (computed once per tree)."""

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self._members: dict[int, tuple[dict[str, _Member], _Member | None]] = {}

    def find_class(self, name: str) -> ClassRef | None:
        """A class by the name SGLang's model registry uses: a top-level class or alias, EntryClass first."""
        candidates: list[tuple[bool, ClassRef]] = []
        # Only files that define the name at top level are parsed: most model files merely import Llama & co.
        needle = re.compile(
            rb"^(class\s+" + re.escape(name.encode()) + rb"\b|" + re.escape(name.encode()) + rb"\s*=)", re.M
        )
        for folder in (MODELS, "sglang"):
            for path in self.tree.files(folder):
                if not path.is_relative_to(self.tree.root) or not needle.search(path.read_bytes()):
                    continue
                ref = self.tree.resolve_name(self.tree.module_of(path), name)
                if isinstance(ref, ClassRef):  # the class itself, or a module-level alias of one
                    candidates.append((name in _entry_classes(self.tree.parse(path)), ref))
            if candidates:
                break
        candidates.sort(key=lambda c: not c[0])  # stable: EntryClass-listed definitions first
        return candidates[0][1] if candidates else None

    def members(self, cls: ClassRef) -> tuple[dict[str, _Member], _Member | None]:
        """Names a class defines itself (methods, class and instance attributes), and its forwarding
        __getattr__ if it has one."""
        key = id(cls.node)
        if key in self._members:
            return self._members[key]
        found, forward = _class_members(cls.node)
        for stmt in cls.node.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.args.args:
                this = stmt.args.args[0].arg
                for name, line, value in _self_assignments(stmt, this):
                    found.setdefault(name, _Member("instance-attribute", line, value=value))
        self._members[key] = (found, forward)
        return found, forward


#: One per tree and process (trees over the same roots are equal): members and classes are found once.
_MODELS_OF: dict[SourceTree, _Models] = {}


def _models(tree: SourceTree) -> _Models:
    if tree not in _MODELS_OF:
        _MODELS_OF[tree] = _Models(tree)
    return _MODELS_OF[tree]


def _class_members(node: ast.ClassDef) -> tuple[dict[str, _Member], _Member | None]:
    """What a class body defines at its own level (methods, properties, class attributes), and its forwarding
    __getattr__ if it has one; the first definition of a name wins."""
    found: dict[str, _Member] = {}
    forward: _Member | None = None
    for stmt in top_level(node.body):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == "__getattr__":
            forward = _forwarding(stmt)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            kind: Literal["method", "property"] = "property" if _is_property(stmt) else "method"
            found.setdefault(stmt.name, _Member(kind, stmt.lineno, node=stmt))
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, _Member("class-attribute", stmt.lineno, value=stmt.value))
    return found, forward


def _entry_classes(module: ast.Module) -> set[str]:
    names: set[str] = set()
    for stmt in top_level(module.body):
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "EntryClass" for t in stmt.targets
        ):
            values = stmt.value.elts if isinstance(stmt.value, ast.List | ast.Tuple) else [stmt.value]
            names |= {v.id for v in values if isinstance(v, ast.Name)}
    return names


def _is_property(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for deco in fn.decorator_list:
        if last_name(deco) in ("property", "cached_property", "setter", "getter"):
            return True
    return False


def _self_assignments(
    fn: ast.FunctionDef | ast.AsyncFunctionDef, this: str
) -> Iterator[tuple[str, int, ast.expr]]:
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            yield from ((attr, node.lineno, node.value) for attr in _attributes_of(targets, this))
        elif isinstance(node, ast.Call):
            yield from _setattr_on(node, this)


def _setattr_on(call: ast.Call, this: str) -> Iterator[tuple[str, int, ast.expr]]:
    """``setattr(<this>, "name", value)``."""
    found = named_call(call, "setattr", 3)
    if found is None:
        return
    (obj, _, value), name = found
    if isinstance(obj, ast.Name) and obj.id == this and name is not None:
        yield name, call.lineno, value


def _attributes_of(targets: Sequence[ast.expr], this: str) -> Iterator[str]:
    """The ``<this>.<attr>`` names among assignment targets, tuple and list targets unpacked one level."""
    flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple | ast.List) else [t])]
    for target in flat:
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == this
        ):
            yield target.attr


def _forwarding(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> _Member | None:
    """A __getattr__ counts only if it really forwards the name: `return getattr(self.inner, name)`.

    torch.nn.Module's __getattr__ (parameters, buffers, submodules) forwards nothing and does not count.
    """
    if len(fn.args.args) < 2:
        return None
    param = fn.args.args[1].arg
    for node in ast.walk(fn):
        lookup = _attribute_lookup(node)
        if lookup is None:
            continue
        target, name = lookup
        if isinstance(name, ast.Name) and name.id == param:
            return _Member("method", fn.lineno, node=fn, value=target)
    return None


def _attribute_lookup(node: ast.AST) -> tuple[ast.expr, ast.expr] | None:
    """(object, name) of ``getattr(object, name, ...)`` or ``object.__getattr__(name)`` / ``__getattribute__``."""
    if not isinstance(node, ast.Call):
        return None
    args = node.args
    if isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(args) >= 2:
        return args[0], args[1]
    if (
        isinstance(node.func, ast.Attribute)
        and node.func.attr in ("__getattr__", "__getattribute__")
        and args
    ):
        return node.func.value, args[0]
    return None


# --------------------------------------------------------------------------------------------- signatures


def _accepts(
    fn: ast.FunctionDef | ast.AsyncFunctionDef, positional: int, keywords: Sequence[str]
) -> str | None:
    """None when a call with this many positional arguments and these keywords binds, else why not."""
    args = fn.args
    params, n_posonly = _call_parameters(fn)
    if positional > len(params) and args.vararg is None:
        return f"takes at most {len(params)} positional argument(s), called with {positional}"
    bound = {p.arg for p in params[:positional]}
    why = _keyword_problem(args, params[n_posonly:], bound, keywords)
    if why is not None:
        return why
    missing = _unbound_required(args, params, bound, keywords)
    if missing:
        return f"needs {', '.join(missing)}, called with {positional} positional argument(s)"
    return None


def _keyword_problem(
    args: ast.arguments, by_name: Sequence[ast.arg], bound: set[str], keywords: Sequence[str]
) -> str | None:
    """Why a keyword does not bind: its parameter is bound by position already, or there is none of that name
    (and no ``**kwargs``); `by_name` are the positional parameters that can also be passed by keyword."""
    by_keyword = {p.arg for p in by_name} | {p.arg for p in args.kwonlyargs}
    for kw in keywords:
        if kw in bound:
            return f"gets {kw} twice"
        if kw not in by_keyword and args.kwarg is None:
            return f"has no parameter {kw}"
    return None


def _call_parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[ast.arg], int]:
    """The positional parameters a caller fills (``self`` / ``cls`` dropped unless a staticmethod), and how
    many of them are positional-only."""
    args = fn.args
    static = "staticmethod" in {d.id for d in fn.decorator_list if isinstance(d, ast.Name)}
    params = [*args.posonlyargs, *args.args]
    if not static and params:
        params = params[1:]  # self / cls
    return params, max(0, len(args.posonlyargs) - (0 if static else 1))


def _unbound_required(
    args: ast.arguments, params: Sequence[ast.arg], bound: set[str], keywords: Sequence[str]
) -> list[str]:
    """The parameters without a default that neither the positional arguments nor the keywords bind."""
    required = [p.arg for p in params[: len(params) - len(args.defaults)] if p.arg not in bound]
    required += [p.arg for p, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    return [name for name in required if name not in keywords]


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
        return self.verdict in OK_VERDICTS


def _delegation_hint(resolver: _Models, classes: Sequence[ClassRef], name: str) -> str:
    """For a missing name: an attribute holding a model that has it (the wrapper case: language_model)."""
    for cls in classes:
        members, _ = resolver.members(cls)
        for attr, member in sorted(members.items()):
            value = member.value
            if member.kind != "instance-attribute" or not isinstance(value, ast.Call):
                continue
            held = resolver.tree.resolve_expr(cls.module, value.func)
            if not isinstance(held, ClassRef):
                continue
            held_classes, _ = resolver.tree.mro(held)
            for owner in held_classes:
                if name in resolver.members(owner)[0]:
                    where = resolver.tree.site(owner.file, resolver.members(owner)[0][name].line)
                    holds = resolver.tree.site(cls.file, member.line)
                    return (
                        f"; it holds self.{attr} = {held.name}(...) ({holds}), "
                        f"which has {name} ({owner.name}, {where}): it does not delegate to it"
                    )
    return ""


def _lookup(
    resolver: _Models, classes: Sequence[ClassRef], name: str
) -> tuple[ClassRef, _Member, bool] | None:
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
    cls = _models(tree).find_class(class_name)
    return None if cls is None else (cls.module, tree.site(cls.file, cls.node.lineno))


def _outside_provider(name: str, external: Sequence[str]) -> str | None:
    """The base outside the tree that provides `name`: torch.nn.Module's own members, object's attributes."""
    if name in NN_MODULE_MEMBERS and any(e in _NN_MODULE or e.endswith(".nn.Module") for e in external):
        return "torch.nn.Module"
    if name in OBJECT_MEMBERS:
        return "object"
    return None


def check_class(
    tree: SourceTree, class_name: str, role: Role, contract: Contract, *, include_optional: bool = False
) -> tuple[Finding, ...]:
    """A verdict for every required name of `role` in `contract` (and every optional one, with
    `include_optional`), on `class_name` as found in `tree`; one class-not-in-release finding without it."""
    resolver = _models(tree)
    cls = resolver.find_class(class_name)
    if cls is None:
        sites = sorted({s for r in contract.for_role(role) for s in r.sites})
        return (
            Finding(
                model_class=class_name,
                role=role,
                method="*",
                verdict="class-not-in-release",
                provider_file="",
                provider_class="",
                consumer_site="; ".join(sites),
                detail=f"sglang {contract.version or '?'} has no class {class_name} (nor EntryClass entry) "
                f"in {MODELS}: it cannot serve as the {role} model in this release",
            ),
        )
    classes, external = tree.mro(cls)
    subject = _Subject(tree, resolver, class_name, role, cls, tuple(classes), tuple(external))
    return tuple(_judge(subject, req) for req in contract.for_role(role, required_only=not include_optional))


@dataclass(frozen=True)
class _Subject:
    """The class `check_class` judges: its registry name and role, as found in the tree, with its MRO inside
    the tree and the names of its bases outside it."""

    tree: SourceTree
    resolver: _Models
    name: str
    role: Role
    cls: ClassRef
    classes: tuple[ClassRef, ...]
    external: tuple[str, ...]


def _judge(subject: _Subject, req: Requirement) -> Finding:
    """The verdict on one required (or optional) name."""
    base = functools.partial(
        Finding,
        model_class=subject.name,
        role=subject.role,
        method=req.name,
        consumer_site="; ".join(req.sites),
    )
    found = _lookup(subject.resolver, subject.classes, req.name)
    if found is None:
        return _not_found(subject, req, base)
    owner, member, forwarded = found
    where = subject.tree.site(owner.file, member.line)
    problems = [] if forwarded else _call_problems(member, req)
    if problems:
        sig = _signature(member.node) if member.node is not None else req.name
        detail = f"{sig} at {where} does not accept every call: " + "; ".join(problems)
        return base(
            verdict="signature-mismatch", provider_file=where, provider_class=owner.name, detail=detail
        )
    verdict: Verdict = "delegated" if forwarded else "implemented" if owner == subject.cls else "inherited"
    detail = _how(subject, owner, member, forwarded=forwarded)
    return base(verdict=verdict, provider_file=where, provider_class=owner.name, detail=detail)


def _not_found(subject: _Subject, req: Requirement, base: Callable[..., Finding]) -> Finding:
    """A name no class of the MRO defines: inherited from a base outside the tree, else (optional-)missing."""
    outside = _outside_provider(req.name, subject.external)
    if outside is not None:
        detail = f"{req.name} of {outside}, a base of {subject.name} outside the tree"
        return base(verdict="inherited", provider_file="", provider_class=outside, detail=detail)
    external = subject.external
    not_inspected = f"; bases outside the tree, not inspected: {', '.join(external)}" if external else ""
    hint = _delegation_hint(subject.resolver, subject.classes, req.name)
    need = "need" if req.required else "probe for (hasattr / getattr with a default)"
    consumer = "; ".join(req.sites)
    detail = (
        f"{subject.name} has no {req.name}, which {req.role} models {need} at {consumer}{hint}{not_inspected}"
    )
    verdict: Verdict = "missing" if req.required else "optional-missing"
    return base(verdict=verdict, provider_file="", provider_class="", detail=detail)


def _call_problems(member: _Member, req: Requirement) -> list[str]:
    """Why the method does not accept the calls the consumers make, one line per call that does not bind."""
    if member.kind != "method" or member.node is None:
        return []
    problems = []
    for use in req.uses:
        if use.kind == "call" and use.positional is not None:
            why = _accepts(member.node, use.positional, use.keywords)
            if why:
                problems.append(f"{use.site} calls {req.name}({use.arity}): {why}")
    return problems


def _how(subject: _Subject, owner: ClassRef, member: _Member, *, forwarded: bool) -> str:
    """How the class provides the name: forwarded by a __getattr__, or a member of itself or of a base."""
    if forwarded and member.value:
        return f"forwarded by {owner.name}.__getattr__ to {source_text(member.value, 100)}"
    inherited = f", inherited by {subject.name}" if owner != subject.cls else ""
    return f"{member.kind} of {owner.name}{inherited}"


__all__ = ["MODELS", "NN_MODULE_MEMBERS", "OBJECT_MEMBERS", "Finding", "check_class", "locate_class"]
