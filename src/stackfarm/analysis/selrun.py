"""Run a release's backend selection for one arch and collect every backend it can choose, and where.

A selection is written three ways in SGLang, and each is a choice here:

- a function that **returns** the backend's name (``ServerArgs._get_default_attn_backend``);
- an **assignment** of a name to a setting (``self.nsa_decode_backend = "trtllm"`` in
  ``_set_default_nsa_backends``, ``overrides["attention_backend"] = "trtllm_mla"`` in 0.5.15's overrides);
- a **call** of a kernel entry on an arch test (``if self.device_sm_major >= 10:
  flashinfer.prefill.trtllm_ragged_attention_deepseek(...)`` in the DSA backend's MLA prefill).

`SelectionRun` is the 10-capability evaluator (`pysource.Evaluator`) with two hooks: it records the assignments
to the watched settings and the calls of the watched kernel entries on every path it follows, which are the
paths the arch does not rule out (model family, flags and config fields unknown: every branch is followed).
`run_steps` runs a selector's functions in order on one instance of their class, so what one step decides
(``__init__``'s ``self.device_sm_major``, a KV dtype default) is what the next one reads.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stackfarm.analysis.arch import Arch
from stackfarm.analysis.pysource import UNKNOWN, Evaluator
from stackfarm.analysis.pyvalues import (
    Budget,
    ClassValue,
    End,
    External,
    Frame,
    Function,
    Instance,
    ModuleRef,
)
from stackfarm.analysis.sourcetree import SourceError, SourceTree


@dataclass(frozen=True)
class Pick:
    """One backend a selection can choose: its name, and the module and line of the return, assignment or call."""

    backend: str
    module: str
    line: int
    how: str  # "returns" | "sets <setting>" | "calls <entry>"


class SelectionRun(Evaluator):
    """The evaluator, recording picks: assignments of a literal to a setting of `sets` (``self.<s> = "x"``,
    ``<dict>["<s>"] = "x"``) and calls of an entry of `calls` (dotted name -> backend), which it does not run."""

    def __init__(
        self,
        tree: SourceTree,
        gpu: Arch,
        cuda: str,
        *,
        sets: Sequence[str] = (),
        calls: Mapping[str, str] | None = None,
        assume: Mapping[str, object] | None = None,
        environ: Mapping[str, str] | None = None,
        instances: Mapping[tuple[str, str], str] | None = None,
    ) -> None:
        super().__init__(tree, gpu, cuda, assume=assume, environ=environ)
        self.sets = frozenset(sets)
        self.calls = dict(calls or {})
        self.picks: list[Pick] = []
        #: (module, global) -> "module.Class": a global a PEP 562 hook resolves at run time (SGLang's
        #: ``current_platform``), taken as a fresh instance of that class (the caller has decided it is).
        self.instances = dict(instances or {})
        self._made: dict[tuple[str, str], object] = {}
        #: The steps whose evaluation ran out of budget: what they choose is undecided.
        self.exhausted: list[str] = []

    def _global(self, module: str, name: str) -> object:
        key = (module, name)
        if key not in self.instances:
            return super()._global(module, name)
        if key not in self._made:
            cls_module, attrs = self.tree.split(self.instances[key])
            cls: object = ModuleRef(cls_module)
            for attr in attrs:
                cls = self._getattr(cls, attr)
            self._made[key] = self._call(cls, (), {}) if isinstance(cls, ClassValue) else UNKNOWN
        return self._made[key]

    def _exec(self, stmt: ast.stmt, frame: Frame) -> list[End]:
        ends = super()._exec(stmt, frame)
        if self.sets and isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                setting = _setting(target)
                if setting in self.sets:
                    value = self._eval(stmt.value, frame)  # known on this arch, else every literal it can be
                    names = {value} if isinstance(value, str) else _literals(stmt.value) or set()
                    for name in sorted(names):
                        self.picks.append(Pick(name, frame.module, stmt.lineno, f"sets {setting}"))
        return ends

    def _eval(self, node: ast.expr, frame: Frame) -> object:
        if self.calls and isinstance(node, ast.Call):
            func = self._deref(self._eval(node.func, frame))
            dotted = (
                f"{func.module}.{func.qualname}"
                if isinstance(func, Function)
                else func.dotted
                if isinstance(func, External)
                else ""
            )
            if dotted in self.calls:
                self.picks.append(Pick(self.calls[dotted], frame.module, node.lineno, f"calls {dotted}"))
                return UNKNOWN  # the kernel entry itself is what the admitting gate judges
        return super()._eval(node, frame)

    def run_steps(
        self, steps: Sequence[str], bind: Mapping[str, str], init: bool
    ) -> tuple[list[End], list[str]]:
        """Run each of `steps` ("module.Class.method" or "module.function"), in order, on one instance of the
        first method's class (its ``__init__`` run first when `init`). A parameter named in `bind` is given
        ``arch.major`` / ``arch.minor`` or ``self.<attr>`` (the instance's value after the steps before).
        Returns every end and the steps the release does not have."""
        ends: list[End] = []
        missing: list[str] = []
        instance: Instance | None = None
        for step in steps:
            owner: object = None
            try:
                module, attrs = self.tree.split(step)
                value: object = self._module(module)
                for attr in attrs:
                    owner, value = value, self._getattr(value, attr)
            except SourceError:
                value = UNKNOWN
            if not isinstance(value, Function) or isinstance(value.node, ast.Lambda):
                if self._written(step):  # defined in its source, yet not reached: undecided, not absent
                    self.exhausted.append(f"{step} (its module could not be evaluated)")
                else:
                    missing.append(step)
                continue
            self_obj = None
            if isinstance(owner, ClassValue):
                if instance is None or instance.cls is not owner:
                    instance = Instance(owner)
                    ctor = self._class_attr(owner, "__init__")
                    if init and isinstance(ctor, Function) and not isinstance(ctor.node, ast.Lambda):
                        try:
                            self._run_function(ctor, (), {}, self_obj=instance, at_top=True)
                        except Budget:
                            self.exhausted.append(f"{step} (its class's __init__)")
                self_obj = instance
            kwargs = {p: self._bound(v, instance) for p, v in bind.items() if _has_param(value, p)}
            try:
                ends += self._run_function(value, (), kwargs, self_obj=self_obj, at_top=True)
            except Budget:
                self.exhausted.append(step)
        return ends, missing

    def _written(self, step: str) -> bool:
        """Whether `step` ("module.Class.method" / "module.function") is defined in its module's source."""
        try:
            module, attrs = self.tree.split(step)
        except SourceError:
            return False
        parsed = self.tree.module(module)
        body: list[ast.stmt] = list(parsed.body) if parsed is not None else []
        for attr in attrs:
            node = next(
                (
                    n
                    for n in body
                    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == attr
                ),
                None,
            )
            if node is None:
                return False
            body = list(node.body) if isinstance(node, ast.ClassDef) else []
        return bool(attrs)

    def _module(self, module: str) -> object:
        return ModuleRef(module) if self.tree.path_of(module) is not None else UNKNOWN

    def _bound(self, spec: str, instance: Instance | None) -> object:
        if spec == "arch.major":
            return self.gpu.major
        if spec == "arch.minor":
            return self.gpu.minor
        if spec.startswith("self.") and instance is not None:
            return self._getattr(instance, spec.removeprefix("self."))
        return UNKNOWN


def _has_param(func: Function, name: str) -> bool:
    node = func.node
    assert not isinstance(node, ast.Lambda)
    return name in {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}


def _setting(target: ast.expr) -> str | None:
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
        key = target.slice.value
        return key if isinstance(key, str) else None
    return None


def _literals(node: ast.expr) -> set[str] | None:
    """The strings an expression can be when it is a literal or a choice of literals (``"a" if c else "b"``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        body, orelse = _literals(node.body), _literals(node.orelse)
        return None if body is None or orelse is None else body | orelse
    return None


def literals_at(tree: SourceTree, module: str, line: int) -> set[str] | None:
    """Every string a ``return`` at `line` can give where its value is a literal or a choice of literals
    (``"flashinfer" if is_flashinfer_available() else "triton"``): each branch counts as possible; None otherwise."""
    path = tree.path_of(module)
    if path is None:
        return None
    try:
        parsed = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in ast.walk(parsed):
        if isinstance(node, ast.Return) and node.lineno == line and node.value is not None:
            return _literals(node.value)
    return None


__all__ = ["Pick", "SelectionRun", "literals_at"]
