"""Feature gates and flag conditions of a Python tree, judged for a target GPU with `pysource.Evaluator`.

A feature is one entry of matrix.toml's [features] (`parse_features`). `evaluate_gate` runs its deciding
function for one GPU and says whether the GPU alone turns it off (and where), or crashes it; `flag_sites` finds
every condition that reads one of its server arguments, and `evaluate_site` judges one such condition.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stackfarm.analysis.arch import Arch, ArchError, parse_target
from stackfarm.analysis.pysource import UNKNOWN, Crash, End, Evaluator, Instance, function_locals, truth
from stackfarm.analysis.pyvalues import Unresolved
from stackfarm.analysis.sourcetree import SourceError, SourceTree, source_text

GateState = Literal["on", "off", "crash", "unknown"]


class FeatureError(ValueError):
    """matrix.toml's [features] table is malformed; the message names the key and the fix."""


@dataclass(frozen=True)
class Feature:
    """One entry of matrix.toml's [features]: a capability the deployment wants."""

    name: str
    #: Candidate deciding functions, "module:qualname"; every one present in the tree is evaluated.
    gates: tuple[str, ...] = ()
    #: Server arguments that switch the feature on; every condition reading one is evaluated too.
    flags: tuple[str, ...] = ()
    #: Globs (relative to a component's tree) of the binaries the feature needs.
    libs: tuple[str, ...] = ()
    #: Target archs where the feature is expected off, with the reason.
    off: Mapping[Arch, str] = field(default_factory=dict)


_FEATURE_KEYS = ("gate", "flags", "libs", "off", "description")


def _strings(name: str, key: str, value: object) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
        raise FeatureError(f"[features.{name}] {key} must be a string or a list of strings, got {value!r}")
    return tuple(items)


def parse_features(raw: Mapping[str, Any]) -> tuple[Feature, ...]:
    """Read matrix.toml's [features] (as `CellSpec.features` carries it); raises `FeatureError` naming the key."""
    features = []
    for name, entry in raw.items():
        if not isinstance(entry, Mapping):
            raise FeatureError(f"[features] {name} must be a table ([features.{name}]), got {entry!r}")
        unknown = sorted(set(entry) - set(_FEATURE_KEYS))
        if unknown:
            raise FeatureError(f"[features.{name}] unknown key(s) {unknown}; known: {list(_FEATURE_KEYS)}")
        gates = _strings(name, "gate", entry.get("gate", []))
        for gate in gates:
            if ":" not in gate:
                raise FeatureError(
                    f"[features.{name}] gate {gate!r} must be 'module:qualname', "
                    "e.g. 'sglang.srt.layers.communicator:apply_flashinfer_allreduce_fusion'"
                )
        off_raw = entry.get("off", {})
        if not isinstance(off_raw, Mapping):
            raise FeatureError(f"[features.{name}] off must be a table of arch = reason, got {off_raw!r}")
        off: dict[Arch, str] = {}
        for arch, reason in off_raw.items():
            try:
                off[parse_target(arch)] = str(reason)
            except ArchError as exc:
                raise FeatureError(f"[features.{name}] off: {exc}") from exc
        features.append(
            Feature(
                name=name,
                gates=gates,
                flags=_strings(name, "flags", entry.get("flags", [])),
                libs=_strings(name, "libs", entry.get("libs", [])),
                off=off,
            )
        )
    return tuple(features)


@dataclass(frozen=True)
class GateResult:
    """What one gate decides for one GPU."""

    symbol: str
    gpu: Arch
    #: on: some path enables it (maybe depending on run-time settings); off: every path disables it on this GPU;
    #: crash: every path raises, at least one with an error (KeyError ...) rather than a deliberate refusal;
    #: unknown: the gate could not be evaluated, or every enabling path depends on a value the evaluator could
    #: not resolve (`unresolved` says which): never "on", since that would be a guess.
    state: GateState
    path: str = ""
    line: int = 0
    reason: str = ""
    #: "unknown: `<expression>` at file:line could not be resolved (why)" when that decided the state.
    unresolved: str = ""


def describe_unresolved(tree: SourceTree, event: Unresolved) -> str:
    """The one line every undecidable verdict carries: what could not be resolved, and where."""
    return f"unknown: `{event.text}` at {_where(tree, event.module, event.line)} could not be resolved ({event.why})"


def _end_reason(end: End, tree: SourceTree) -> str:
    where = _where(tree, end.module, end.line)
    if end.kind == "crash":
        text = f"raises {end.detail} at {where}"
    elif end.kind == "raise":
        text = f"raises at {where} ({end.detail})"
    elif end.kind == "return":
        text = f"returns {_short(end.value)} at {where}"
    else:
        text = f"reaches the end at {where}"
    if end.via:
        text += " (reached through " + " <- ".join(_where(tree, m, ln) for m, ln in end.via) + ")"
    if end.decision is not None:
        d = end.decision
        text += f", because `{d.text}` is {d.value} at {_where(tree, d.module, d.line)}"
    return text


def _where(tree: SourceTree, module: str, line: int) -> str:
    path = tree.path_of(module)
    return f"{tree.relative(path) if path else module}:{line}"


def _short(value: object) -> str:
    if value is UNKNOWN:
        return "a value known only at run time"
    if isinstance(value, Instance):
        return f"a {value.cls.qualname if value.cls else 'new'} object"
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def _is_on(end: End, constructor: bool) -> bool:
    if end.kind == "fall":
        return True
    if end.kind != "return":
        return False
    if constructor:
        return False  # an early return from __init__ leaves the object disabled
    return truth(end.value) is not False


def evaluate_gate(
    tree: SourceTree,
    gate: str,
    gpu: Arch,
    cuda: str,
    *,
    assume: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> GateResult:
    """Run gate ``module:qualname`` for `gpu` and decide on / off / crash (see `GateResult.state`).

    `assume` sets attributes (the feature's server flags), `environ` is the deployment's environment.
    """
    module, _, qualname = gate.partition(":")
    evaluator = Evaluator(tree, gpu, cuda, assume=assume, environ=environ)
    try:
        ends = evaluator.run(f"{module}.{qualname}")
    except SourceError as exc:
        return GateResult(gate, gpu, "unknown", reason=f"cannot evaluate {gate}: {exc}")
    path = tree.path_of(module)
    rel = tree.relative(path) if path else module
    constructor = qualname.endswith("__init__")
    on = [e for e in ends if _is_on(e, constructor)]
    if on:
        return _enabled(tree, gate, gpu, rel, on)
    return _disabled(tree, gate, gpu, rel, ends)


def _enabled(tree: SourceTree, gate: str, gpu: Arch, rel: str, on: Sequence[End]) -> GateResult:
    """The result when some path ends with the feature on: on where one path is sure, else unknown."""
    sure = [e for e in on if e.unresolved is None]
    if sure:
        return GateResult(gate, gpu, "on", rel, sure[0].line, reason=_end_reason(sure[0], tree))
    # every enabling path hangs on a value the evaluator could not resolve: undecidable, not on
    assert on[0].unresolved is not None
    why = describe_unresolved(tree, on[0].unresolved)
    return GateResult(
        gate,
        gpu,
        "unknown",
        rel,
        on[0].unresolved.line,
        reason=f"{why}; it would be on if that allowed it: {_end_reason(on[0], tree)}",
        unresolved=why,
    )


def _disabled(tree: SourceTree, gate: str, gpu: Arch, rel: str, ends: Sequence[End]) -> GateResult:
    """The result when no path ends with the feature on: a crash, off, or unknown when no path was followed."""
    crashes = [e for e in ends if e.kind == "crash"]
    failing = crashes or ends
    if not failing:
        return GateResult(gate, gpu, "unknown", rel, reason="no path through the gate could be followed")
    first = failing[0]
    # "where it is decided": the crash itself, else the last test decided on the way to the first end
    place = first if crashes or first.decision is None else first.decision
    reasons = "; ".join(dict.fromkeys(_end_reason(e, tree) for e in failing))
    where = _where(tree, place.module, place.line)
    return GateResult(gate, gpu, "crash" if crashes else "off", where.rsplit(":", 1)[0], place.line, reasons)


@dataclass(frozen=True)
class FlagSite:
    """A condition in the tree that reads one of a feature's flags."""

    module: str
    path: str
    line: int
    symbol: str
    text: str
    node: ast.expr = field(compare=False, repr=False)
    local_names: tuple[str, ...] = field(compare=False, repr=False, default=())
    #: Where the flag was followed from (`capflags.followed_sites`): each call site on the way, "" for none.
    via: tuple[str, ...] = ()
    #: Names (parameters, locals, globals) and ``self.<attr>``s that carry `flag` in a followed site.
    carriers: tuple[str, ...] = field(compare=False, repr=False, default=())
    carrier_attrs: tuple[str, ...] = field(compare=False, repr=False, default=())
    flag: str = field(compare=False, repr=False, default="")


def flag_sites(tree: SourceTree, packages: Sequence[str], flags: Sequence[str]) -> tuple[FlagSite, ...]:
    """Every if / while / assert condition, and every returned or assigned boolean expression, in `packages` that
    reads a flag (``<something>.<flag>``, ``d["<flag>"]``, ``d.get("<flag>")``; see `reads_flag`)."""
    if not flags:
        return ()
    sites: list[FlagSite] = []
    for path, module_ast in modules_naming(tree, packages, flags):
        sites.extend(_sites_in(module_ast, tree.module_of(path), tree.relative(path), set(flags)))
    return tuple(dict.fromkeys(sites))


def modules_naming(
    tree: SourceTree, packages: Sequence[str], names: Sequence[str]
) -> Iterator[tuple[Path, ast.Module]]:
    """The parsed modules of `packages` whose text names one of `names` (a byte search first: most do not);
    a module that does not parse is left out here and said by `unparsable_naming`."""
    for path in _naming(tree, packages, names):
        try:
            yield path, tree.parse(path)
        except SourceError:
            continue


def unparsable_naming(
    tree: SourceTree, packages: Sequence[str], names: Sequence[str]
) -> list[tuple[str, str]]:
    """(path, why) of each module naming one of `names` that does not parse here (syntax newer than this
    Python): what it decides about those flags is unknown, never nothing."""
    found = []
    for path in _naming(tree, packages, names):
        try:
            tree.parse(path)
        except SourceError as exc:
            found.append((tree.relative(path), str(exc)))
    return found


def _naming(tree: SourceTree, packages: Sequence[str], names: Sequence[str]) -> Iterator[Path]:
    needles = [n.encode() for n in names]
    for package in packages:
        for path in tree.files(package):
            if any(n in tree.read(path) for n in needles):
                yield path


def _sites_in(module_ast: ast.Module, module: str, rel: str, flags: set[str]) -> Iterator[FlagSite]:
    def visit(node: ast.AST, symbol: str, local_names: tuple[str, ...]) -> Iterator[FlagSite]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from visit(child, f"{symbol}.{child.name}".lstrip("."), function_locals(child))
                continue
            if isinstance(child, ast.ClassDef):
                yield from visit(child, f"{symbol}.{child.name}".lstrip("."), local_names)
                continue
            condition = condition_of(child)
            if condition is not None and reads_flag(condition, flags):
                yield FlagSite(
                    module,
                    rel,
                    condition.lineno,
                    symbol or "<module>",
                    source_text(condition, 120),
                    condition,
                    local_names,
                )
            yield from visit(child, symbol, local_names)

    yield from visit(module_ast, "", ())


def reads_flag(node: ast.AST, flags: Collection[str]) -> bool:
    """Whether `node` reads a server argument of `flags`: ``args.<flag>``, ``args_dict["<flag>"]`` or
    ``args_dict.get("<flag>", ...)`` (SGLang <= 0.4.x's ``global_server_args_dict``)."""
    return any(_names_flag(n, flags) for n in ast.walk(node))


def _names_flag(node: ast.AST, flags: Collection[str]) -> bool:
    """Whether `node` itself (not a part of it) is one of `reads_flag`'s three reads."""
    if isinstance(node, ast.Attribute):
        return node.attr in flags
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in flags
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
        return False
    return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value in flags


def condition_of(node: ast.AST) -> ast.expr | None:
    """The condition `node` states, if any: an if / while / assert test, a returned or assigned boolean."""
    if isinstance(node, ast.If | ast.While | ast.Assert):
        return node.test
    if isinstance(node, ast.Return | ast.Assign | ast.AnnAssign) and isinstance(
        node.value, ast.BoolOp | ast.Compare | ast.UnaryOp
    ):
        return node.value  # `use_fusion = <condition>` (0.5.5-0.5.7's static_conditions_met) is a gate too
    return None


def evaluate_site(
    tree: SourceTree,
    site: FlagSite,
    gpu: Arch,
    cuda: str,
    *,
    assume: Mapping[str, object],
    environ: Mapping[str, str] | None = None,
) -> bool | None:
    """The condition's truth on `gpu` (None when unknown), with the feature's flags set as `assume` says."""
    return judge_site(tree, site, gpu, cuda, assume=assume, environ=environ)[0]


def judge_site(
    tree: SourceTree,
    site: FlagSite,
    gpu: Arch,
    cuda: str,
    *,
    assume: Mapping[str, object],
    environ: Mapping[str, str] | None = None,
) -> tuple[bool | None, str]:
    """(truth, why unknown): the truth is None when unknown, and then the reason is "" when it is known only
    at run time (server arguments, batch sizes) and `describe_unresolved`'s line when the evaluator could not
    resolve something it depends on (the site is undecidable)."""
    value_of_flag = assume.get(site.flag, UNKNOWN) if site.flag else UNKNOWN
    if site.carrier_attrs:  # ``self.<attr>`` that carries the flag (a followed site)
        assume = {**assume, **dict.fromkeys(site.carrier_attrs, value_of_flag)}
    evaluator = Evaluator(tree, gpu, cuda, assume=assume, environ=environ)
    bound = dict.fromkeys(site.carriers, value_of_flag)
    try:
        value = evaluator.expression(site.module, site.node, site.local_names, bound=bound)
    except Crash:
        return False, ""
    t = truth(value)
    if t is not UNKNOWN:
        return bool(t), ""
    return None, describe_unresolved(tree, evaluator.unresolved[0]) if evaluator.unresolved else ""


__all__ = [
    "Feature",
    "FeatureError",
    "FlagSite",
    "GateResult",
    "GateState",
    "condition_of",
    "describe_unresolved",
    "evaluate_gate",
    "evaluate_site",
    "flag_sites",
    "judge_site",
    "modules_naming",
    "parse_features",
    "reads_flag",
]
