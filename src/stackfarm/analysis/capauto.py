"""Auto-enable code: where a release switches a feature's flag on by itself, judged per GPU.

SGLang's server arguments turn some flags on for some GPUs (``ServerArgs._handle_model_specific_adjustments``
up to 0.5.18: ``self.enable_flashinfer_allreduce_fusion = True`` under ``is_sm90_supported() or
is_sm100_supported()``; from 0.5.19 a registered post-process returns ``{"flashinfer_allreduce_fusion_backend":
backend}``). `auto_sites` finds every statement that switches one of a feature's flags on (an attribute or
dict-key assignment, a returned dict, a keyword argument, ``setattr``) together with the conditions on the way
to it inside its function: the tests of the enclosing ``if``s and the early exits before it. `evaluate_auto`
decides, for one GPU and with the same three-valued evaluator as the use-gates, whether that statement can run:

- ``off``: a condition on the way is false on this GPU (or raises): the release does not switch it on here;
- ``on``: every condition is true or known only at run time (the model, the parallelism): some deployment on
  this GPU gets the flag switched on;
- ``unknown``: no condition is false, but one depends on a value the evaluator could not resolve (a platform
  object's ``__getattr__``, say): undecidable, never "on".

The caller of the function is not followed (the function is assumed to run, as server-args post-processing
does); the flag's own value is a run-time input (unset unless the user sets it).
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from stackfarm.analysis.arch import Arch
from stackfarm.analysis.capgates import describe_unresolved, modules_naming
from stackfarm.analysis.pysource import UNKNOWN, Crash, Evaluator, truth
from stackfarm.analysis.pyvalues import function_locals
from stackfarm.analysis.sourcetree import SourceTree, source_text

AutoState = Literal["on", "off", "unknown"]
_Body = Sequence[ast.stmt]


@dataclass(frozen=True)
class Condition:
    """A test on the way to an assignment: it must be `want` (True inside an ``if``, False past an early exit)."""

    node: ast.expr = field(compare=False, repr=False)
    want: bool
    line: int
    text: str


@dataclass(frozen=True)
class AutoSite:
    """A statement that switches one of a feature's flags on, with the conditions that lead to it."""

    module: str
    path: str
    line: int
    symbol: str
    flag: str
    text: str
    conditions: tuple[Condition, ...] = ()
    local_names: tuple[str, ...] = field(compare=False, repr=False, default=())


@dataclass(frozen=True)
class AutoResult:
    """Whether `site` can switch its flag on, on one GPU (see the module docstring for the states)."""

    site: AutoSite
    gpu: Arch
    state: AutoState
    #: off: the condition that is false (or raises) and where; on: "" ; unknown: `describe_unresolved`'s line.
    reason: str = ""
    #: The line of the deciding condition (off, unknown), else the assignment's.
    line: int = 0


def auto_sites(tree: SourceTree, packages: Sequence[str], flags: Sequence[str]) -> tuple[AutoSite, ...]:
    """Every statement in `packages` that switches a flag of `flags` on (its value is not a false constant)."""
    if not flags:
        return ()
    found: list[AutoSite] = []
    for path, module_ast in modules_naming(tree, packages, flags):
        scan = _Scan(tree.module_of(path), tree.relative(path), frozenset(flags))
        found.extend(scan.scan(module_ast))
    return tuple(dict.fromkeys(found))


@dataclass
class _Scan:
    module: str
    rel: str
    flags: frozenset[str]

    def scan(self, node: ast.Module) -> Iterator[AutoSite]:
        yield from self._block(node.body, (), "", ())

    def _block(
        self, body: _Body, conds: tuple[Condition, ...], symbol: str, local_names: tuple[str, ...]
    ) -> Iterator[AutoSite]:
        guards: list[Condition] = []
        for stmt in body:
            here = conds + tuple(guards)
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = f"{symbol}.{stmt.name}".lstrip(".")
                yield from self._block(stmt.body, (), inner, function_locals(stmt))
                continue
            if isinstance(stmt, ast.ClassDef):
                yield from self._block(stmt.body, (), f"{symbol}.{stmt.name}".lstrip("."), ())
                continue
            for flag, node in self._switches(stmt):
                yield AutoSite(
                    self.module,
                    self.rel,
                    node.lineno,
                    symbol or "<module>",
                    flag,
                    source_text(node, 120),
                    here,
                    local_names,
                )
            yield from self._branches(stmt, here, symbol, local_names)
            guard = _guard_after(stmt)
            if guard is not None:
                guards.append(guard)
            if isinstance(stmt, ast.Return | ast.Raise):
                return  # what follows never runs

    def _branches(
        self, stmt: ast.stmt, here: tuple[Condition, ...], symbol: str, local_names: tuple[str, ...]
    ) -> Iterator[AutoSite]:
        """The sites in `stmt`'s nested blocks: an ``if``'s under its test (true, else false), others as they are."""
        if isinstance(stmt, ast.If):
            yes, no = _tests(stmt)
            yield from self._block(stmt.body, (*here, yes), symbol, local_names)
            yield from self._block(stmt.orelse, (*here, no), symbol, local_names)
        elif not isinstance(stmt, ast.Assert):
            for sub in _sub_blocks(stmt):
                yield from self._block(sub, here, symbol, local_names)

    def _switches(self, stmt: ast.stmt) -> Iterator[tuple[str, ast.stmt | ast.expr]]:
        """(flag, node) for each place in `stmt` itself (not its nested blocks) that sets a flag to a value."""
        yield from ((flag, stmt) for flag in self._assigned(stmt))
        for node in _own_expressions(stmt):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Dict) and isinstance(stmt, ast.Return):
                    yield from ((flag, stmt) for flag in self._returned(sub))
                elif isinstance(sub, ast.Call):
                    yield from ((flag, sub) for flag in self._passed(sub))

    def _assigned(self, stmt: ast.stmt) -> Iterator[str]:
        """``x.<flag> = value`` / ``d["<flag>"] = value``."""
        if not (isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None):
            return
        if not _may_be_on(stmt.value):
            return
        for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
            name = _target_flag(target)
            if name in self.flags:
                yield name

    def _returned(self, returned: ast.Dict) -> Iterator[str]:
        """``return {"<flag>": value}`` (a registered post-process, from 0.5.19)."""
        for key, value in zip(returned.keys, returned.values, strict=True):
            if isinstance(key, ast.Constant) and key.value in self.flags and _may_be_on(value):
                yield str(key.value)

    def _passed(self, call: ast.Call) -> Iterator[str]:
        """``f(<flag>=value)`` and ``setattr(x, "<flag>", value)``."""
        for kw in call.keywords:
            if kw.arg in self.flags and _may_be_on(kw.value):
                yield kw.arg
        if not (isinstance(call.func, ast.Name) and call.func.id == "setattr" and len(call.args) == 3):
            return
        name, value = call.args[1], call.args[2]
        if isinstance(name, ast.Constant) and name.value in self.flags and _may_be_on(value):
            yield str(name.value)


def _tests(stmt: ast.If) -> tuple[Condition, Condition]:
    """The conditions inside an ``if``'s body (its test true) and its ``else`` (false)."""
    yes = Condition(stmt.test, True, stmt.test.lineno, source_text(stmt.test, 120))
    return yes, Condition(stmt.test, False, stmt.test.lineno, yes.text)


def _guard_after(stmt: ast.stmt) -> Condition | None:
    """The condition `stmt` leaves on the statements after it: an ``assert``'s test, an early exit's negation."""
    if isinstance(stmt, ast.Assert):
        return Condition(stmt.test, True, stmt.test.lineno, source_text(stmt.test, 120))
    if not isinstance(stmt, ast.If):
        return None
    yes, no = _tests(stmt)
    if _exits(stmt.body) and not _exits(stmt.orelse):
        return no
    if stmt.orelse and _exits(stmt.orelse) and not _exits(stmt.body):
        return yes
    return None


def _target_flag(target: ast.expr) -> str:
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
        return str(target.slice.value)
    return ""


def _may_be_on(value: ast.expr) -> bool:
    """A value that can switch a flag on: anything but a false constant (False, None, 0, "")."""
    return not (isinstance(value, ast.Constant) and not value.value)


def _own_expressions(stmt: ast.stmt) -> Iterator[ast.expr]:
    """The expressions of `stmt` outside its nested statement blocks."""
    for name, value in ast.iter_fields(stmt):
        if name in ("body", "orelse", "finalbody", "handlers", "cases"):
            continue
        items = value if isinstance(value, list) else [value]
        yield from (v for v in items if isinstance(v, ast.expr))


def _sub_blocks(stmt: ast.stmt) -> Iterator[_Body]:
    """The statement blocks of a loop, ``with``, ``try`` or ``match``: entered without a condition of ours."""
    for name in ("body", "orelse", "finalbody"):
        block = getattr(stmt, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
    for handler in getattr(stmt, "handlers", ()):
        yield handler.body
    for case in getattr(stmt, "cases", ()):
        yield case.body


def _exits(body: _Body) -> bool:
    """Whether every path through `body` leaves the enclosing block (return / raise / continue / break)."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, ast.Return | ast.Raise | ast.Continue | ast.Break):
        return True
    if isinstance(last, ast.If):
        return _exits(last.body) and _exits(last.orelse)
    return False


def evaluate_auto(
    tree: SourceTree,
    site: AutoSite,
    gpu: Arch,
    cuda: str,
    *,
    environ: Mapping[str, str] | None = None,
    evaluator: Evaluator | None = None,
) -> AutoResult:
    """Can `site` switch its flag on, on `gpu`? (on / off / unknown, see the module docstring)."""
    ev = evaluator or Evaluator(tree, gpu, cuda, environ=environ)
    unresolved: tuple[str, int] | None = None
    for cond in site.conditions:
        mark = len(ev.unresolved)
        try:
            value = ev.expression(site.module, cond.node, site.local_names)
        except Crash as crash:
            why = f"`{cond.text}` raises {crash.kind} at {site.path}:{cond.line}"
            return AutoResult(site, gpu, "off", why, cond.line)
        t = truth(value)
        if t is UNKNOWN:
            if unresolved is None and len(ev.unresolved) > mark:
                unresolved = (describe_unresolved(tree, ev.unresolved[mark]), cond.line)
            continue
        if bool(t) != cond.want:
            how = "false" if cond.want else "true (an early exit before it)"
            return AutoResult(
                site, gpu, "off", f"`{cond.text}` is {how} at {site.path}:{cond.line}", cond.line
            )
    if unresolved is not None:
        return AutoResult(site, gpu, "unknown", unresolved[0], unresolved[1])
    return AutoResult(site, gpu, "on", "", site.line)


def decided_by_gpu(results: Collection[AutoResult]) -> bool:
    """Whether the GPU decides the site: off on some GPU and not on every one, or undecidable somewhere."""
    states = {r.state for r in results}
    return "unknown" in states or ("off" in states and "on" in states)


__all__ = [
    "AutoResult",
    "AutoSite",
    "AutoState",
    "Condition",
    "auto_sites",
    "decided_by_gpu",
    "evaluate_auto",
]
