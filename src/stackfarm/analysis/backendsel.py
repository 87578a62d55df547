"""Backend auto-selection per target arch: which backends a release's selection can choose on an arch, and
whether each chosen backend's own gate admits that arch (issue 29 M: SGLang routing sm_120 to an sm100-only
kernel, sglang#24633; a selector written ``device_sm_major >= 10`` that "treats all Blackwell alike", #37105).

A selector (`Selector`) is one or more functions of the release, run in order on one instance
(`selrun.SelectionRun`: the 10-capability evaluator, the arch's compute capability fixed, everything else
unknown, so every path a flag, config field or model name could take is followed). What they choose is what
they return, what they assign to a watched setting (`sets`) and which watched kernel entry they call
(`calls`). A selector that reads the model's architecture is run once per model family (`families`: the
[[models]] targets and the settings' extra ``families``, each given as ``hf_config.architectures``); a choice
names the families that make it. A release that has none of a selector's functions leaves it unanswered.

`admits` maps a backend to what decides whether it runs on a GPU: a Python gate ``module:qualname`` (judged
with `capgates.evaluate_gate`) or a kernel library's C++ arch check ``<distribution>:<path in its wheel>:<symbol>``
(`cxxgate.check`: flashinfer's ``TllmGenFmhaRunner`` constructor refuses everything but SM 100/103).

Outcomes per (selector, backend, arch): pass (the gate admits the arch), fail (it refuses it: the finding names
the selection site and the gate's deciding site, file:line), skip (a choice or the gate is undecidable, or no
selector function exists in the release), n/a (no gate declared for that backend: the matrix does not ask).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stackfarm.analysis import cxxgate, fatbin
from stackfarm.analysis.arch import Arch, ArchError, parse_target
from stackfarm.analysis.capgates import evaluate_gate
from stackfarm.analysis.jitfindings import Outcome, ToolFinding
from stackfarm.analysis.pyvalues import End
from stackfarm.analysis.selrun import Pick, SelectionRun, literals_at
from stackfarm.analysis.sourcetree import SourceError, SourceTree
from stackfarm.cellspec import CellSpec, InstalledComponent


@dataclass(frozen=True)
class Selector:
    """One entry of [suites.15-toolchain.settings.selectors]: its functions, what they choose, each backend's gate."""

    name: str
    functions: tuple[str, ...]  # "module:qualname", run in order; those the release lacks are skipped
    admits: Mapping[str, str]
    sets: tuple[str, ...] = ()
    calls: Mapping[str, str] = field(default_factory=dict)  # dotted kernel entry -> backend
    bind: Mapping[str, str] = field(default_factory=dict)  # parameter -> "arch.major" | "self.<attr>"
    init: bool = False  # run the class's __init__ first (its arch-derived attributes)
    per_family: bool = False  # run once per model family (it reads hf_config.architectures)

    @property
    def function(self) -> str:
        return " -> ".join(self.functions)


def parse_selectors(raw: Mapping[str, Any]) -> tuple[Selector, ...]:
    """The selectors of the suite's settings (matrix.load has checked their shape: suites/15-toolchain/family.py)."""
    out = []
    for name, entry in raw.items():
        functions = entry["selector"]
        out.append(
            Selector(
                name,
                tuple([functions] if isinstance(functions, str) else functions),
                {str(k): str(v) for k, v in dict(entry.get("admits", {})).items()},
                tuple(entry.get("sets", ())),
                {str(v): str(k) for k, v in dict(entry.get("calls", {})).items()},
                {str(k): str(v) for k, v in dict(entry.get("bind", {})).items()},
                bool(entry.get("init", False)),
                bool(entry.get("per_family", False)),
            )
        )
    return tuple(out)


def _choice(name: str, arch: Arch, site: tuple[str, str, int], outcome: Outcome, message: str) -> ToolFinding:
    """A selection finding (id ``selection-<selector>-<backend>-<arch>``; the backend is its target)."""
    backend, file, line = site
    return ToolFinding("selection", str(arch), "", "", backend, file, line, outcome, message, name=name)


def _where(tree: SourceTree, module: str, line: int) -> str:
    path = tree.path_of(module)
    return f"{tree.relative(path) if path else module}:{line}"


@dataclass
class _Picked:
    site: Pick
    families: list[str]


def _run(
    tree: SourceTree,
    selector: Selector,
    arch: Arch,
    cuda: str,
    *,
    family: str | None,
    instances: Mapping[tuple[str, str], str],
) -> tuple[list[Pick], list[str], list[str], bool]:
    """One run of the selector: its picks, the sites of returns known only at run time, the missing steps, and
    whether some path through it ended (was followed to its end)."""
    assume = {"architectures": [family]} if family else None
    run = SelectionRun(
        tree, arch, cuda, sets=selector.sets, calls=selector.calls, assume=assume, instances=instances
    )
    steps = [f.replace(":", ".", 1) for f in selector.functions]
    ends, missing = run.run_steps(steps, selector.bind, selector.init)
    picks = list(run.picks)
    unknown: list[str] = [
        f"{step} was not evaluated to its end (the evaluator's budget)" for step in run.exhausted
    ]
    if not (selector.calls or selector.sets):
        # a selector that chooses by assignment or by call returns something else (a dict, a tensor)
        for end in ends:
            returned, undecided = _returned(tree, end)
            picks += returned
            unknown += undecided
    return picks, unknown, missing, bool(ends) and not run.exhausted


def _returned(tree: SourceTree, end: End) -> tuple[list[Pick], list[str]]:
    """The backends one end of a run returns (a string, else the literals the returning line can give), and
    the site when what it returns is known only at run time."""
    if end.kind != "return" or end.value is None:
        return [], []
    if isinstance(end.value, str):
        return [Pick(end.value, end.module, end.line, "returns")], []
    names = literals_at(tree, end.module, end.line)
    unknown = []
    if names is None:
        unknown.append(f"a value known only at run time is returned at {_where(tree, end.module, end.line)}")
    return [Pick(n, end.module, end.line, "returns") for n in sorted(names or ())], unknown


def choices(
    tree: SourceTree,
    selector: Selector,
    arch: Arch,
    cuda: str,
    *,
    families: Sequence[str] = (),
    roots: Mapping[str, Path] | None = None,
    instances: Mapping[tuple[str, str], str] | None = None,
) -> list[ToolFinding]:
    """Every backend `selector` can choose on `arch` (for each of `families` when it is per-family), each
    judged by its declared gate; `roots` maps a distribution to its unpacked wheel (for C++ gates);
    `instances` pins run-time globals to a class (`platform_instances`)."""
    runs = families if selector.per_family and families else [None]
    try:
        found = _run_all(tree, selector, arch, cuda, runs, instances=instances or {})
    except SourceError as exc:
        return [
            _choice(selector.name, arch, ("", "", 0), "skip", f"cannot evaluate {selector.function}: {exc}")
        ]
    if len(found.missing) == len(selector.functions):
        return [
            _choice(
                selector.name,
                arch,
                ("", "", 0),
                "skip",
                f"the release has none of {', '.join(selector.functions)}: its selection is not where "
                "this selector looks (unanswered, never a pass)",
            )
        ]
    present = [f for f in selector.functions if f not in found.missing]
    selector = replace(selector, functions=tuple(present))
    judged = _judged(tree, selector, arch, cuda, found, families=families, runs=len(runs), roots=roots or {})
    return judged + _unpicked(selector, arch, found)


def _judged(
    tree: SourceTree,
    selector: Selector,
    arch: Arch,
    cuda: str,
    found: _Found,
    *,
    families: Sequence[str],
    runs: int,
    roots: Mapping[str, Path],
) -> list[ToolFinding]:
    """Each pick judged by its gate; one picked in only some of the `runs` (one per family) says for which."""
    for_all = not selector.per_family or not families
    return [
        _judge(
            tree,
            selector,
            arch,
            cuda,
            p,
            families="" if for_all or len(p.families) == runs else f" for {', '.join(p.families)}",
            roots=roots,
        )
        for _, p in sorted(found.picked.items())
    ]


@dataclass
class _Found:
    """What the runs of one selector (one per family, or one) found together."""

    missing: list[str]
    picked: dict[str, _Picked] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)
    #: Some run was followed to its end.
    reached: bool = False

    def add(self, family: str | None, picks: Sequence[Pick]) -> None:
        """Each pick by its backend, with the families it was picked for."""
        for pick in picks:
            entry = self.picked.setdefault(pick.backend, _Picked(pick, []))
            if family and family not in entry.families:
                entry.families.append(family)


def _run_all(
    tree: SourceTree,
    selector: Selector,
    arch: Arch,
    cuda: str,
    runs: Sequence[str | None],
    *,
    instances: Mapping[tuple[str, str], str],
) -> _Found:
    """`_run` for each family (or once), merged; a step counts as missing when no run found it."""
    found = _Found(missing=list(selector.functions))
    for family in runs:
        picks, unresolved, absent, ended = _run(
            tree, selector, arch, cuda, family=family, instances=instances
        )
        found.missing = [m for m in found.missing if m.replace(":", ".", 1) in absent]
        found.reached = found.reached or ended
        found.unknown += [u for u in unresolved if u not in found.unknown]
        found.add(family, picks)
    return found


def _unpicked(selector: Selector, arch: Arch, found: _Found) -> list[ToolFinding]:
    """What the picks leave to say: the undecidable choices, the call routes no path takes, or that nothing
    could be followed."""
    out = []
    if found.unknown:
        out.append(
            _choice(
                f"{selector.name}-unresolved",
                arch,
                ("", "", 0),
                "skip",
                f"{selector.function} on {arch}: {'; '.join(found.unknown)}: that choice is undecidable "
                "here (unanswered, never a pass)",
            )
        )
    if found.picked or found.unknown:
        return out
    if selector.calls and found.reached:
        return [
            _choice(
                f"{selector.name}-{backend}",
                arch,
                (backend, "", 0),
                "pass",
                f"{selector.function} on {arch}: no path the arch allows calls {dotted} (the "
                f"route to {backend!r} is not taken there)",
            )
            for dotted, backend in sorted(selector.calls.items())
        ]
    return [
        _choice(
            selector.name,
            arch,
            ("", "", 0),
            "skip",
            f"no choice of {selector.function} could be followed on {arch}",
        )
    ]


def _gate(
    tree: SourceTree, gate: str, arch: Arch, cuda: str, roots: Mapping[str, Path]
) -> tuple[str, str, str]:
    """(state on/off/crash/unknown, deciding site, reason) of a Python gate, a C++ arch check or a library."""
    if gate.startswith("lib:"):
        return _library(gate, arch, roots)
    parts = gate.split(":")
    if len(parts) == 3 and parts[1].endswith((".h", ".cuh", ".hpp", ".cu")):
        return _cxx_gate(gate, parts, arch, roots)
    result = evaluate_gate(tree, gate, arch, cuda)
    site = f"{result.path}:{result.line}" if result.path else gate
    reason = str(result.unresolved or result.reason) if result.state == "unknown" else result.reason
    return result.state, site, reason


def _cxx_gate(gate: str, parts: Sequence[str], arch: Arch, roots: Mapping[str, Path]) -> tuple[str, str, str]:
    """``<distribution>:<header>:<symbol>``: a C++ arch check in a header of an unpacked wheel."""
    dist, rel, symbol = parts
    root = roots.get(dist)
    if root is None:
        return "unknown", gate, f"the cell has no {dist} wheel to read {rel} from"
    header = root / rel
    include = next((p for p in header.parents if p.name == "include"), header.parent)
    cxx = cxxgate.check(header, symbol, arch, include)
    return cxx.state, f"{rel}:{cxx.line}" if cxx.line else rel, cxx.reason


def _library(gate: str, arch: Arch, roots: Mapping[str, Path]) -> tuple[str, str, str]:
    """``lib:<distribution>[|<renamed>]:<glob>``: the backend's kernels, judged as 10-capability judges binaries (fatbin
    headers): on when every matching binary has SASS or JIT-able PTX for the arch, off when none has; binaries
    that disagree (per-arch variants a loader picks from) leave it unknown, never on."""
    _, dist, pattern = gate.split(":", 2)
    root = next((roots[d] for d in dist.split("|") if d in roots), None)  # "sgl-kernel|sglang-kernel"
    if root is None:
        return "unknown", gate, f"the cell has no {dist} wheel to read {pattern} from"
    judged: list[tuple[str, str]] = []
    for path in sorted(root.glob(pattern)):
        try:
            binary = fatbin.read_binary(path)
        except fatbin.FatbinError as exc:
            return "unknown", str(path.relative_to(root)), f"cannot read {path.name}: {exc}"
        if binary is not None and binary.units:
            judged.append((str(path.relative_to(root)), fatbin.coverage(binary, arch).verdict))
    if not judged:
        return "unknown", pattern, f"no {dist} binary with device code matches {pattern}"
    return _coverage_state(judged, arch)


def _coverage_state(judged: Sequence[tuple[str, str]], arch: Arch) -> tuple[str, str, str]:
    """`_library`'s state from each binary's coverage verdict: all covered, none, or they disagree."""
    site = ", ".join(rel for rel, _ in judged)
    verdicts = {v for _, v in judged}
    if verdicts <= {"ok", "ptx-jit"}:
        return "on", site, f"{site} carries code for {arch}"
    if verdicts == {"no-code"}:
        return "off", site, f"{site} has no SASS or PTX for {arch}"
    return "unknown", site, f"{site} disagree on {arch} ({', '.join(f'{r}: {v}' for r, v in judged)})"


def _judge(
    tree: SourceTree,
    selector: Selector,
    arch: Arch,
    cuda: str,
    picked: _Picked,
    *,
    families: str,
    roots: Mapping[str, Path],
) -> ToolFinding:
    pick = picked.site
    where = _where(tree, pick.module, pick.line)
    file, _, line = where.rpartition(":")
    name = f"{selector.name}-{pick.backend}"
    site = (pick.backend, file, int(line))
    picks = f"{selector.function} can choose {pick.backend!r} on {arch}{families} ({where}: {pick.how})"
    gate = selector.admits.get(pick.backend)
    if gate is None:
        return _choice(
            name,
            arch,
            site,
            "n/a",
            f"{picks}; no gate is declared for {pick.backend!r} in [suites.15-toolchain.settings."
            f"selectors.{selector.name}.admits]: not checked",
        )
    state, gate_site, reason = _gate(tree, gate, arch, cuda, roots)
    if state == "on":
        return _choice(name, arch, site, "pass", f"{picks}, and {gate} admits {arch} ({gate_site}): {reason}")
    if state == "unknown":
        return _choice(
            name, arch, site, "skip", f"{picks}; whether {gate} admits {arch} is undecidable: {reason}"
        )
    return _choice(
        name,
        arch,
        site,
        "fail",
        f"{picks}, but {gate} does not admit {arch} ({gate_site}: {state}): {reason}",
    )


def families_of(cell: CellSpec, raw: Mapping[str, Any]) -> list[str]:
    """The model families selection is checked for: the [[models]] targets, then the settings' `families`."""
    out: list[str] = []
    for name in [m.get("target", "") for m in cell.models] + [str(f) for f in raw.get("families", ())]:
        if name and name not in out:
            out.append(name)
    return out


def registers(root: Path, group: str) -> list[str]:
    """The entry points of `group` that the wheel unpacked at `root` registers (its dist-info's entry_points.txt)."""
    found: list[str] = []
    for path in sorted(root.glob("*.dist-info/entry_points.txt")):
        section = ""
        for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = raw.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1].strip()
            elif section == group and "=" in line:
                found.append(f"{path.parent.name}: {line}")
    return found


def platform_instances(
    cell: CellSpec, platform: Mapping[str, str], environ: Mapping[str, str]
) -> tuple[dict[tuple[str, str], str], str]:
    """SGLang >= 0.5.15 resolves ``current_platform`` at run time from the platform plugins installed
    (entry-point group `platform["plugins"]`), falling back to its CUDA platform on a CUDA GPU. With no component
    of the cell registering a plugin and SGLANG_PLATFORM unset, that is decided: `platform["attribute"]` is an
    instance of `platform["cuda"]`. Returns the pin (empty when undecided) and why."""
    if not platform:
        return {}, ""
    attribute, group = platform["attribute"], platform["plugins"]
    module, _, name = attribute.partition(":")
    if environ.get("SGLANG_PLATFORM"):
        return (
            {},
            f"SGLANG_PLATFORM={environ['SGLANG_PLATFORM']} names an out-of-tree platform: {attribute} undecided",
        )
    plugins = [p for c in cell.components if c.root for p in registers(Path(c.root), group)]
    if plugins:
        return {}, f"the cell registers {group} plugins ({'; '.join(plugins)}): {attribute} undecided"
    cls = platform["cuda"].replace(":", ".", 1)
    return {(module, name): cls}, f"{attribute} is {cls}: no component of the cell registers a {group} plugin"


def cell_choices(
    cell: CellSpec,
    raw: Mapping[str, Any],
    families: Sequence[str] = (),
    *,
    platform: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[ToolFinding]:
    """Every selection finding of the cell: each configured selector on each target arch, over the tree of the
    cell's Python components (sglang as patched, flashinfer...)."""
    selectors = parse_selectors(raw)
    if not selectors:
        return []
    comps = _python_trees(cell)
    if not comps:
        return _without_tree(cell, selectors)
    tree = SourceTree([c.root for c in comps])
    roots = _roots(cell)
    instances, why = platform_instances(cell, platform or {}, environ or {})
    cuda = cell.values.get("cuda", "")
    out = []
    for arch in _target_archs(cell):
        for selector in selectors:
            found = choices(tree, selector, arch, cuda, families=families, roots=roots, instances=instances)
            out += [replace(f, note=why) for f in found] if why else found
    return out


def _without_tree(cell: CellSpec, selectors: Sequence[Selector]) -> list[ToolFinding]:
    return [
        _choice(s.name, parse_target(a), ("", "", 0), "n/a", "the cell has no sglang or flashinfer tree")
        for s in selectors
        for a in cell.archs
    ]


def _roots(cell: CellSpec) -> dict[str, Path]:
    """Each unpacked component of the cell by its distribution (for the C++ and library gates)."""
    return {c.distribution: Path(c.root) for c in cell.components if c.root}


def _python_trees(cell: CellSpec) -> list[InstalledComponent]:
    """The cell's Python components whose sources selection is read from."""
    return [c for c in cell.components if c.root and c.distribution in _PYTHON_COMPONENTS]


def _target_archs(cell: CellSpec) -> list[Arch]:
    """The cell's target archs that parse (jitfindings reports a bad [targets] arch once)."""
    archs = []
    for name in cell.archs:
        try:
            archs.append(parse_target(name))
        except ArchError:
            continue
    return archs


_PYTHON_COMPONENTS = ("sglang", "flashinfer-python")

__all__ = [
    "Selector",
    "cell_choices",
    "choices",
    "families_of",
    "parse_selectors",
    "platform_instances",
    "registers",
]
