"""Backend auto-selection per target arch: which backends a release's selector can pick on an arch, and whether
each picked backend's own gate admits that arch (issue 29 M: SGLang routing sm_120 to an sm100-only kernel).

A selector is a function that returns a backend name (``ServerArgs._get_default_attn_backend``); it is run with
the 10-capability evaluator (`pysource.Evaluator`: the arch's compute capability fixed, every other run-time
value unknown, so every path a model family or flag could take is followed). Each string it can return on the
arch is a chosen backend; `admits` maps a backend to the gate that decides whether it runs on a GPU (flashinfer's
JIT generator with its supported majors, SGLang's own creator), judged with `capgates.evaluate_gate`.

Outcomes per (selector, arch, backend): pass (the gate is on), fail (the gate is off or crashes on the arch:
the finding names the selector's return site and the gate's deciding site, file:line), skip (a return value or
the gate cannot be resolved: undecidable), n/a (no gate declared for that backend: the matrix does not ask).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stackfarm.analysis.arch import Arch, ArchError, parse_target
from stackfarm.analysis.capgates import evaluate_gate
from stackfarm.analysis.jitfindings import Outcome, ToolFinding
from stackfarm.analysis.pysource import UNKNOWN, Evaluator
from stackfarm.analysis.sourcetree import SourceError, SourceTree
from stackfarm.cellspec import CellSpec


@dataclass(frozen=True)
class Selector:
    """One entry of [suites.15-toolchain.settings.selectors]: the function and each backend's gate."""

    name: str
    function: str  # "module:qualname"
    admits: Mapping[str, str]


def parse_selectors(raw: Mapping[str, Any]) -> tuple[Selector, ...]:
    """The selectors of the suite's settings (matrix.load has checked their shape: suite_settings)."""
    return tuple(
        Selector(
            name, str(entry["selector"]), {str(k): str(v) for k, v in dict(entry.get("admits", {})).items()}
        )
        for name, entry in raw.items()
    )


def _choice(name: str, arch: Arch, site: tuple[str, str, int], outcome: Outcome, message: str) -> ToolFinding:
    """A selection finding (id ``selection-<selector>-<backend>-<arch>``; the backend is its target)."""
    backend, file, line = site
    return ToolFinding("selection", str(arch), "", "", backend, file, line, outcome, message, name=name)


def _where(tree: SourceTree, module: str, line: int) -> str:
    path = tree.path_of(module)
    return f"{tree.relative(path) if path else module}:{line}"


def choices(tree: SourceTree, selector: Selector, arch: Arch, cuda: str) -> list[ToolFinding]:
    """Every backend `selector` can return on `arch`, each judged by its declared gate."""
    module, _, qualname = selector.function.partition(":")
    try:
        ends = Evaluator(tree, arch, cuda).run(f"{module}.{qualname}")
    except SourceError as exc:
        return [
            _choice(selector.name, arch, ("", "", 0), "skip", f"cannot evaluate {selector.function}: {exc}")
        ]
    returns: dict[str, tuple[str, int]] = {}
    unknown: list[str] = []
    for end in ends:
        if end.kind != "return":
            continue
        if isinstance(end.value, str):
            returns.setdefault(end.value, (end.module, end.line))
        elif end.value is UNKNOWN or not isinstance(end.value, str | type(None)):
            literals = returned_literals(tree, end.module, end.line)
            if literals is None:
                unknown.append(_where(tree, end.module, end.line))
            for name in literals or ():
                returns.setdefault(name, (end.module, end.line))
    out = [_judge(tree, selector, arch, cuda, (b, *site)) for b, site in sorted(returns.items())]
    if unknown:
        out.append(_choice(f"{selector.name}-unresolved", arch, ("", "", 0), "skip",
                          f"{selector.function} on {arch} can return a value known only at run time at "
                          f"{', '.join(unknown)}: that choice is undecidable here"))  # fmt: skip
    if not ends:
        out.append(_choice(selector.name, arch, ("", "", 0), "skip",
                          f"no path through {selector.function} could be followed on {arch}"))  # fmt: skip
    return out


def _literals(node: ast.expr) -> set[str] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        body, orelse = _literals(node.body), _literals(node.orelse)
        return None if body is None or orelse is None else body | orelse
    return None


def returned_literals(tree: SourceTree, module: str, line: int) -> set[str] | None:
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


def _judge(
    tree: SourceTree, selector: Selector, arch: Arch, cuda: str, picked: tuple[str, str, int]
) -> ToolFinding:
    backend, module, at = picked
    where = _where(tree, module, at)
    file, _, line = where.rpartition(":")
    name = f"{selector.name}-{backend}"
    picks = f"{selector.function} can pick {backend!r} on {arch} ({where})"
    gate = selector.admits.get(backend)
    if gate is None:
        return _choice(name, arch, (backend, file, int(line)), "n/a",
                      f"{picks}; no gate is declared for {backend!r} in [suites.15-toolchain.settings.selectors."
                      f"{selector.name}.admits]: not checked")  # fmt: skip
    result = evaluate_gate(tree, gate, arch, cuda)
    if result.state == "on":
        msg = f"{picks}, and {gate} admits {arch}: {result.reason}"
        return _choice(name, arch, (backend, file, int(line)), "pass", msg)
    if result.state == "unknown":
        msg = f"{picks}; whether {gate} admits {arch} is undecidable: {result.unresolved or result.reason}"
        return _choice(name, arch, (backend, file, int(line)), "skip", msg)
    gate_site = f"{result.path}:{result.line}" if result.path else gate
    msg = f"{picks}, but its gate {gate} does not admit {arch} ({gate_site}: {result.state}): {result.reason}"
    return _choice(name, arch, (backend, file, int(line)), "fail", msg)


def cell_choices(cell: CellSpec, raw: Mapping[str, Any]) -> list[ToolFinding]:
    """Every selection finding of the cell: each configured selector on each target arch, over the tree of the
    cell's Python components (sglang as patched, flashinfer...)."""
    selectors = parse_selectors(raw)
    if not selectors:
        return []
    roots = [c.root for c in cell.components if c.root and c.distribution in _PYTHON_COMPONENTS]
    if not roots:
        return [_choice(s.name, parse_target(a), ("", "", 0), "n/a", "the cell has no sglang or flashinfer tree")
                for s in selectors for a in cell.archs]  # fmt: skip
    tree = SourceTree(roots)
    cuda = cell.values.get("cuda", "")
    out = []
    for name in cell.archs:
        try:
            arch = parse_target(name)
        except ArchError:
            continue  # jitfindings reports a bad [targets] arch once
        for selector in selectors:
            out += choices(tree, selector, arch, cuda)
    return out


_PYTHON_COMPONENTS = ("sglang", "flashinfer-python")

__all__ = ["Selector", "cell_choices", "choices", "parse_selectors", "returned_literals"]
