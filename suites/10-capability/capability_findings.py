"""Turn one cell into findings: does each part of the stack know each target GPU?

A finding is one (arch, component, place) judgement with a verdict and, when it fails, the change to make.
`analyse(cell)` never raises: a part that cannot be analysed (a truncated .so, a bad arch name in matrix.toml, a
gate that is not in this SGLang) becomes a failing finding that says so.

Verdicts: ok, missing-crash, missing-graceful, gated-off, ptx-jit, no-code, auto-on-gated-off, auto-off-gate-on,
absent (a configured gate the release lacks), unknown. Policy:

- binaries: ``no-code`` fails (the kernels in those units cannot launch), unless a feature that needs the
  library is declared off on that arch; ``ptx-jit`` passes (the driver JITs the PTX on first launch);
  a flashinfer-cubin family without code for an arch does not apply there (outcome ``n/a``), since
  flashinfer picks cubins per GPU;
- sgl-kernel: only the ops library its loader picks for the arch is judged (the other one is never loaded);
- tables: ``missing-crash`` and ``missing-graceful`` fail; a table with computed keys is skipped as undecidable
  (outcome ``skip``: a question left unanswered, so the cell is incomplete);
- gates: ``gated-off`` (or a crash) fails unless [features.X] off declares the arch;
- gates and flag conditions are three-valued: on, off, or ``unknown`` when what decides them is a value the
  evaluator could not resolve (a ``__getattr__`` answering a platform probe, say). Unknown is never ok: it is a
  plain skip whose message starts "undecidable: unknown: `<expression>` at file:line could not be resolved",
  so the cell is incomplete rather than green;
- a configured gate that the release does not have is reported (``n/a`` when another of the feature's gates
  decides it there, a failure when none does); a gate off on every target arch, the reference arch included,
  is one failure saying so (the release turns the feature off everywhere: no capability question);
- an ``off`` declaration whose feature turns out to be available on that arch fails as stale;
- a feature's use-gates are found by following its flags: besides the configured gates, every condition that
  reads a flag (``args.<flag>``, ``global_server_args_dict["<flag>"]``, ``.get("<flag>")``), wherever the module
  moved; a configured gate the release lacks is n/a when those decide it there. A flag passed as a call
  argument is followed into the callee (`stackfarm.analysis.capflags`: its parameter, and the locals, globals
  and ``self`` attributes it is stored in, carry the flag, two calls deep): the callee's conditions that read it
  are flag sites naming the call sites too, and a class of the tree constructed under such a test is a gate of
  the feature (judged like a configured one, unless it is one); a feature with flags only that nothing reads is
  one failure (``absent``), an undecidable skip where a flag is passed to a call that could not be resolved;
- auto-enable code (kind ``auto``: server arguments switching a flag on by themselves, per GPU; see
  `stackfarm.analysis.capauto`) is compared with the use-gate on the same arch: ``auto-on-gated-off`` (switched
  on where a use-gate keeps the feature off) fails, naming both sites; ``auto-off-gate-on`` (not switched on
  where the reference switches it on and no use-gate is off) passes as a note: a default, not a capability
  failure; an auto-enable condition or a use-gate that cannot be resolved is an undecidable skip.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from stackfarm import families, stack
from stackfarm.analysis.arch import Arch, ArchError, parse_target
from stackfarm.analysis.cache import JsonCache, default_root
from stackfarm.analysis.capauto import AutoResult, auto_sites, decided_by_gpu, evaluate_auto
from stackfarm.analysis.capflags import follow_flags
from stackfarm.analysis.capgates import unparsable_naming
from stackfarm.analysis.captables import (
    FACTS_VERSION,
    CapLookup,
    Feature,
    FeatureError,
    FlagSite,
    GateResult,
    evaluate_gate,
    evaluate_site,
    flag_sites,
    judge_site,
    parse_features,
    scan_tables,
)
from stackfarm.analysis.kernels import Library, LoaderChoice, inventory, sgl_kernel_loader
from stackfarm.analysis.pysource import Evaluator, SourceError, SourceTree
from stackfarm.cellspec import CellSpec, InstalledComponent, component_files

SUITE = "10-capability"
#: This folder's family (family.py): its settings class.
FAMILY = families.load_one(Path(__file__).with_name(families.FAMILY_FILE))
Kind = Literal["binary", "loader", "table", "gate", "flag", "auto", "expectation", "error"]
#: skip: undecidable (an unanswered question); n/a: the question does not arise for this arch.
Outcome = Literal["pass", "fail", "skip", "n/a"]

#: sgl-kernel's distribution names (it was renamed sglang-kernel at 0.4), from the stack table.
_KERNELS = stack.BY_AXIS["sgl_kernel"].names
#: The components whose binaries are scanned: the stack table's ``scanned`` flag (stackfarm.stack, its one owner).
_BINARY_COMPONENTS = stack.with_property("scanned")
_COMMON_OPS = "common_ops"


@dataclass(frozen=True)
class Finding:
    kind: Kind
    arch: str
    component: str
    file: str
    line: int
    symbol: str
    #: One of ok / missing-crash / missing-graceful / gated-off / ptx-jit / no-code; "" when undecidable.
    verdict: str
    outcome: Outcome
    message: str
    #: The feature this finding belongs to, if any.
    feature: str = ""

    @property
    def id(self) -> str:
        where = f"{Path(self.file).name}:{self.line}" if self.line else Path(self.file).name or self.symbol
        return f"{self.arch}-{self.component}-{where}-{self.symbol}".replace(" ", "_")


@dataclass
class Analysis:
    findings: list[Finding] = field(default_factory=list)
    #: Seconds per step, for the benchmark note.
    timings: dict[str, float] = field(default_factory=dict)
    #: Host-only libraries and other facts worth a line in the summary.
    notes: list[str] = field(default_factory=list)

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)

    def timed(self, name: str, fn: Callable[[], None]) -> None:
        start = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # a bug or an input nobody foresaw: one failing finding, never a dead suite
            self.add(Finding("error", "all", "-", "", 0, name, "", "fail",
                             f"analysis step {name!r} failed: {type(exc).__name__}: {exc}"))  # fmt: skip
        self.timings[name] = round(time.perf_counter() - start, 3)


def _component(cell: CellSpec, names: Iterable[str]) -> InstalledComponent | None:
    for comp in cell.components:
        if comp.distribution in names:
            return comp
    return None


def _targets(cell: CellSpec, out: Analysis) -> list[Arch]:
    archs: list[Arch] = []
    for raw in cell.archs:
        try:
            arch = parse_target(raw)
        except ArchError as exc:
            out.add(Finding("error", str(raw), "matrix.toml", "matrix.toml", 0, "targets.archs", "", "fail",
                            f"[targets] archs: {exc}"))  # fmt: skip
            continue
        if arch not in archs:
            archs.append(arch)
    return archs


def _reference(cell: CellSpec) -> Arch | None:
    try:
        return parse_target(cell.reference_arch) if cell.reference_arch else None
    except ArchError:
        return None


# --------------------------------------------------------------------------- binaries


def _off_for(features: Iterable[Feature], relpath: str, arch: Arch) -> tuple[Feature, str] | None:
    for feature in features:
        if arch in feature.off and any(fnmatch.fnmatch(relpath, pattern) for pattern in feature.libs):
            return feature, feature.off[arch]
    return None


def _rebuild_hint(comp: InstalledComponent, lib: Library, arch: Arch) -> str:
    return (
        f"rebuild {comp.distribution} {comp.version} with SASS for {arch} "
        f"(nvcc -gencode arch=compute_{arch.sm}a,code=sm_{arch.sm}a; TORCH_CUDA_ARCH_LIST / "
        f"CMAKE_CUDA_ARCHITECTURES += {arch.sm}a), or, if the deployment does without {lib.name} on {arch}, "
        f'list it in a matrix.toml feature: libs = ["{lib.relpath}"], off = {{ {arch} = "why" }}'
    )


def _binary_finding(
    comp: InstalledComponent,
    lib: Library,
    arch: Arch,
    features: tuple[Feature, ...],
    *,
    kind: Kind = "binary",
) -> Finding:
    cov = lib.coverage(arch)
    assert lib.binary is not None
    assert cov is not None
    explain = cov.explain(lib.binary)
    if lib.spread == "any-unit":
        usable = "usable" if cov.verdict == "ok" else "none runs here"
        explain = f"{lib.relpath} on {arch}: {lib.binary.describe().replace('units', 'cubins')}; {usable}"
    base = Finding(kind, str(arch), comp.distribution, lib.relpath, 0, lib.name, cov.verdict, "pass", explain)
    if cov.verdict in ("ok", "ptx-jit"):
        return base
    if lib.spread == "any-unit":
        why = f"{explain}: flashinfer loads a cubin family only on the GPUs it was built for"
        return replace(base, outcome="n/a", message=why)
    expected = _off_for(features, lib.relpath, arch)
    if expected:
        feature, reason = expected
        why = f"{explain}; expected: [features.{feature.name}] off.{arch} = {reason!r}"
        return replace(base, feature=feature.name, message=why)
    return replace(base, outcome="fail", message=f"{explain}. Fix: {_rebuild_hint(comp, lib, arch)}")


def _binaries(cell: CellSpec, archs: list[Arch], features: tuple[Feature, ...], out: Analysis) -> None:
    cuda = cell.values.get("cuda", "")
    for comp in cell.components:
        if comp.distribution not in _BINARY_COMPONENTS:
            continue
        if not comp.root:  # not installed on this host: 00-stack reports it; there is nothing to read
            out.notes.append(
                f"{comp.distribution}: not installed ({comp.source}); its binaries were not read"
            )
            continue
        libraries = inventory(comp.root, comp.distribution, component_files(comp) or None)
        choices: dict[Arch, LoaderChoice] = {}
        if comp.distribution in _KERNELS:
            choices = {arch: sgl_kernel_loader(comp.root, arch, cuda) for arch in archs}
        host = [lib.relpath for lib in libraries if lib.binary is None and lib.error is None]
        if host:
            out.notes.append(f"{comp.distribution}: host-only libraries (no device code): {', '.join(host)}")
        for lib in libraries:
            if lib.error is not None:
                out.add(Finding("binary", "all", comp.distribution, lib.relpath, 0, lib.name, "", "fail",
                                f"cannot read {lib.relpath}: {lib.error}"))  # fmt: skip
                continue
            if lib.binary is None:
                continue
            for arch in archs:
                if _COMMON_OPS in lib.name and arch in choices and choices[arch].chosen != lib.relpath:
                    continue  # the loader never opens it on this GPU (see the loader finding)
                out.add(_binary_finding(comp, lib, arch, features))
        for choice in choices.values():
            out.add(_loader_finding(comp, libraries, choice, features, declared_missing(cell, comp)))


def declared_missing(cell: CellSpec, comp: InstalledComponent) -> dict[str, str]:
    """The file globs this host declared missing from `comp` ([[deviation]] missing = [...]) -> the reason."""
    return {
        str(glob): str(d.get("reason", ""))
        for d in cell.deviations
        if d.get("component") == comp.distribution
        for glob in d.get("missing", ())
    }


def _loader_finding(
    comp: InstalledComponent,
    libraries: tuple[Library, ...],
    choice: LoaderChoice,
    features: tuple[Feature, ...],
    missing: dict[str, str] | None = None,
) -> Finding:
    arch = choice.gpu
    tried = " then ".join(choice.patterns) or "nothing"
    stripped = [(p, g) for p in choice.patterns for g in (missing or {}) if fnmatch.fnmatchcase(p, g)]
    if choice.chosen is None and stripped:
        # The host deliberately lacks what the loader would open here: this tree cannot answer for that GPU.
        pattern, glob = stripped[0]
        return Finding("loader", str(arch), comp.distribution, "sgl_kernel/load_utils.py", 0, "loader", "",
                       "skip", f"undecidable: sgl_kernel's loader on {arch} tries {pattern}, which this host "
                       f"declared missing ([[deviation]] {glob!r}: {missing[glob] if missing else ''})")  # fmt: skip
    if choice.chosen is None:
        return Finding("loader", str(arch), comp.distribution, "sgl_kernel/load_utils.py", 0, "loader", "no-code",
                       "fail", f"sgl_kernel's loader on {arch} tries {tried} and finds no library: "
                       f"import sgl_kernel fails there ({choice.how}). Fix: ship that library in the wheel")  # fmt: skip
    lib = next((x for x in libraries if choice.chosen in (x.relpath, *x.aliases)), None)
    if lib is None or lib.binary is None:
        why = lib.error if lib else "not in the inventory"
        return Finding("loader", str(arch), comp.distribution, choice.chosen, 0, "loader", "", "fail",
                       f"sgl_kernel's loader on {arch} loads {choice.chosen}, which cannot be read: {why}")  # fmt: skip
    judged = _binary_finding(comp, lib, arch, features, kind="loader")
    head = f"sgl_kernel's loader on {arch} loads {choice.chosen} (tries {tried}; {choice.how}): "
    return Finding("loader", judged.arch, judged.component, judged.file, 0, "loader", judged.verdict,
                   judged.outcome, head + judged.message, judged.feature)  # fmt: skip


# --------------------------------------------------------------------------- tables


def _table_finding(comp: InstalledComponent, cap: CapLookup, arch: Arch) -> Finding:
    lookup, table = cap.lookup, cap.table
    base = Finding("table", str(arch), comp.distribution, cap.path, lookup.line, table.name, "", "pass", "")
    where = f"{cap.path}:{lookup.line} in {lookup.symbol}"
    defined = f"{table.name} ({cap.table_path}:{table.line})"
    verdict = cap.verdict(arch)
    if verdict is None:
        why = (
            f"{where}: `{lookup.text}` looks up {defined} by {cap.kind}, but its keys are computed "
            f"(`{table.computed}`): cannot decide statically; make the keys literals"
        )
        return replace(base, outcome="skip", message=why)
    key = cap.target_key(arch)
    if verdict == "ok":
        return replace(
            base, verdict="ok", message=f"{where}: `{lookup.text}` finds {arch}'s key {key!r} in {defined}"
        )
    keys = ", ".join(repr(k) for k in table.keys or ())
    if verdict == "missing-crash":
        text = (
            f"{where}: `{lookup.text}` raises KeyError: {key!r} on {arch}: {defined} has keys {keys}. "
            f"Fix: patch {cap.table_path} to add {key!r}: <the {arch} entry> to {table.name} "
            f"(or look it up with .get() and a fallback at {cap.path}:{lookup.line})"
        )
    else:
        how = lookup.guard or f"`{lookup.style}`"
        text = (
            f"{where}: `{lookup.text}` misses {arch}'s key {key!r} ({how}): the feature is silently off on "
            f"{arch}; {defined} has keys {keys}. Fix: patch {cap.table_path} to add {key!r} to {table.name}"
        )
    return replace(base, verdict=verdict, outcome="fail", message=text)


def _tables(cell: CellSpec, archs: list[Arch], out: Analysis) -> None:
    comp = _component(cell, ("sglang",))
    if comp is None:
        out.notes.append("no sglang component in this cell: no capability tables to scan")
        return
    packages = FAMILY.settings_of(cell.settings.get(SUITE, {})).table_packages
    scan = scan_tables(
        SourceTree([comp.root], packages=_top_packages(cell)),
        packages,
        JsonCache(default_root(), FACTS_VERSION),
    )
    out.notes.append(
        f"tables: {len(scan.lookups)} capability lookups in {scan.files_total} files of {', '.join(packages)}; "
        f"{scan.files_parsed} parsed, {scan.cache_hits} from the by-hash cache"
    )
    out.notes.extend(scan.problems)
    for cap in scan.lookups:
        for arch in archs:
            out.add(_table_finding(comp, cap, arch))


# --------------------------------------------------------------------------- gates


def _gate_finding(comp: InstalledComponent, feature: Feature, result: GateResult, arch: Arch) -> Finding:
    symbol = result.symbol.partition(":")[2]
    base = Finding("gate", str(arch), comp.distribution, result.path, result.line, symbol, "ok", "pass", "",
                   feature.name)  # fmt: skip
    head = f"feature {feature.name}: gate {result.symbol} on {arch}"
    if result.state == "on":
        return replace(base, message=f"{head} lets it on ({result.reason})")
    if result.state == "unknown":
        why = f"undecidable: {head} cannot be decided statically: {result.reason}"
        return replace(base, verdict="unknown", outcome="skip", message=why)
    verdict = "missing-crash" if result.state == "crash" else "gated-off"
    if arch in feature.off:
        why = f"{head} is off as declared ({feature.off[arch]!r}): {result.reason}"
        return replace(base, verdict=verdict, message=why)
    how = (
        "a patch set in patches/ (they do this for known SGLang releases)"
        if comp.distribution == "sglang"
        else f"a {comp.distribution} release (or a patched build) whose check admits {arch}"
    )
    fix = (
        f"Fix: make the check at {result.path}:{result.line} pass on {arch} with {how}, or declare "
        f'[features.{feature.name}] off = {{ {arch} = "why" }} if the deployment does without it'
    )
    what = "crashes" if result.state == "crash" else "turns it off"
    return replace(base, verdict=verdict, outcome="fail", message=f"{head} {what}: {result.reason}. {fix}")


@dataclass
class _GateRun:
    """What every feature of one cell is judged with: the tree, the CUDA, the archs, the settings."""

    cell: CellSpec
    comp: InstalledComponent
    tree: SourceTree
    archs: list[Arch]
    reference: Arch | None
    packages: tuple[str, ...]
    environ: dict[str, str]
    out: Analysis

    @property
    def cuda(self) -> str:
        return self.cell.values.get("cuda", "")


def _gates(cell: CellSpec, archs: list[Arch], features: tuple[Feature, ...], out: Analysis) -> None:
    comp = _component(cell, ("sglang",))
    if comp is None:
        return
    roots = [comp.root] + [c.root for c in cell.components if c is not comp and c.root]
    settings = FAMILY.settings_of(cell.settings.get(SUITE, {}))
    run = _GateRun(
        cell=cell, comp=comp, tree=SourceTree(roots, packages=_top_packages(cell)), archs=archs,
        reference=_reference(cell), packages=settings.flag_packages, environ=dict(settings.environ), out=out,
    )  # fmt: skip
    for feature in features:
        present = [g for g in feature.gates if _exists(run.tree, g)]
        followed = follow_flags(run.tree, run.packages, feature.flags)
        found = [
            g for g in followed.gates if g.gate not in feature.gates
        ]  # a configured one is judged as such
        gate_symbols = {g.partition(":")[2] for g in [*present, *(f.gate for f in found)]}
        direct = flag_sites(run.tree, run.packages, feature.flags)
        sites = [s for s in (*direct, *followed.sites) if s.symbol not in gate_symbols]
        _absent_gates(run, feature, present + [f.gate for f in found], sites, followed.unresolved)
        for path, why in unparsable_naming(run.tree, run.packages, feature.flags):
            run.out.add(Finding("gate", "all", comp.distribution, path, 0, feature.name, "unknown", "skip",
                                f"undecidable: feature {feature.name}: {path} names its flags but does not parse "
                                f"here ({why}): what it decides is unknown", feature.name))  # fmt: skip
        results: dict[Arch, list[Finding]] = {arch: [] for arch in archs}
        for gate in present:
            _gate(run, feature, gate, results)
        for extra in found:  # a deciding class the flag leads to (its configured gate moved, or none is set)
            _gate(run, feature, extra.gate, results, via=extra.via)
        for site in sites:  # a declared gate was judged above
            _site(run, feature, site, results)
        _autos(run, feature, results)
        for arch in archs:
            if arch in feature.off:
                out.add(_expectation(comp, feature, arch, results[arch], out))


def _absent_gates(
    run: _GateRun,
    feature: Feature,
    present: list[str],
    sites: list[FlagSite],
    unresolved: tuple[str, ...] = (),
) -> None:
    """Each configured gate the release lacks is said, never dropped: n/a where another gate or the conditions
    that read the feature's flags (found wherever they are) decide it, a failure where nothing does."""
    comp = run.comp
    deciders = list(present) or [f"{s.path}:{s.line}" for s in sites]
    passed = ""
    if unresolved:  # the flag goes where the evaluator cannot follow: maybe decided there
        more = f" (+{len(unresolved) - 3} more)" if len(unresolved) > 3 else ""
        passed = f"; it is passed to calls that could not be resolved: {', '.join(unresolved[:3])}{more}"
    if not feature.gates and feature.flags and not deciders and unresolved:
        run.out.add(Finding("gate", "all", comp.distribution, "", 0, feature.name, "unknown", "skip",
                            f"undecidable: feature {feature.name}: no condition in {comp.distribution} "
                            f"{comp.version} reads its flags {list(feature.flags)}{passed}", feature.name))  # fmt: skip
        return
    if not feature.gates and feature.flags and not deciders:  # flags only, and the release never reads them
        run.out.add(Finding("gate", "all", comp.distribution, "", 0, feature.name, "absent", "fail",
                            f"feature {feature.name}: no condition in {comp.distribution} {comp.version} reads "
                            f"its flags {list(feature.flags)}, directly or through the calls they are passed "
                            "to, and it has no gate: nothing decides it here; set [features."
                            f"{feature.name}] gate (or flags) in matrix.toml to where this release decides it",
                            feature.name))  # fmt: skip
        return
    if feature.gates and not deciders:
        run.out.add(Finding("gate", "all", comp.distribution, "", 0, feature.name, "absent", "fail",
                            f"feature {feature.name}: none of its gates {list(feature.gates)} is in "
                            f"{comp.distribution} {comp.version}, and no condition there reads its flags "
                            f"{list(feature.flags)}{passed}: update [features.{feature.name}] gate in matrix.toml to "
                            "where this release decides it", feature.name))  # fmt: skip
        return
    for gate in feature.gates:
        if gate in present:
            continue
        by = (
            ", ".join(present)
            if present
            else "the conditions that read its flags: " + ", ".join(deciders[:6])
        )
        more = f" (+{len(deciders) - 6} more)" if not present and len(deciders) > 6 else ""
        if not present and unresolved:  # the moved gate may sit where the flag went and could not be followed
            run.out.add(Finding("gate", "all", comp.distribution, "", 0, gate.partition(":")[2], "unknown", "skip",
                                f"undecidable: feature {feature.name}: gate {gate} is not in this cell's trees "
                                f"({comp.distribution} {comp.version}); the conditions that read its flags "
                                f"({', '.join(deciders[:6])}{more}) may not be all that decide it{passed}",
                                feature.name))  # fmt: skip
            continue
        run.out.add(Finding("gate", "all", comp.distribution, "", 0, gate.partition(":")[2], "absent", "n/a",
                            f"feature {feature.name}: gate {gate} is not in this cell's trees "
                            f"({comp.distribution} {comp.version}); decided here by {by}{more}",
                            feature.name))  # fmt: skip


def _gate(
    run: _GateRun, feature: Feature, gate: str, results: dict[Arch, list[Finding]], via: tuple[str, ...] = ()
) -> None:
    """A gate configured in [features], or found by following the feature's flags (`via`: the way there)."""
    assume = dict.fromkeys(feature.flags, True)
    owner = _owner(run.cell, run.tree, gate, run.comp)
    states: dict[Arch, str] = {}
    reached = f" (found by following {'/'.join(feature.flags)}: {' -> '.join(via)})" if via else ""
    for arch in run.archs:
        result = evaluate_gate(run.tree, gate, arch, run.cuda, assume=assume, environ=run.environ)
        finding = _gate_finding(owner, feature, result, arch)
        finding = replace(finding, message=finding.message + reached) if via else finding
        states[arch] = result.state
        results[arch].append(finding)
        run.out.add(finding)
    reference = run.reference
    if reference is not None and reference not in states:
        states[reference] = evaluate_gate(run.tree, gate, reference, run.cuda, assume=assume,
                                          environ=run.environ).state  # fmt: skip
    if states and all(st in ("off", "crash") for st in states.values()):
        ref = f", the reference {reference} included" if reference is not None else ""
        run.out.add(Finding("gate", "all", owner.distribution, "", 0, gate.partition(":")[2], "gated-off",
                            "fail", f"feature {feature.name}: gate {gate} is off on every target arch{ref} "
                            f"({', '.join(map(str, states))}): {owner.distribution} {owner.version} turns it "
                            "off everywhere with these flags, so it is no per-GPU capability: check the "
                            f"gate and flags of [features.{feature.name}] for this release", feature.name))  # fmt: skip


def _site(run: _GateRun, feature: Feature, site: FlagSite, results: dict[Arch, list[Finding]]) -> None:
    assume = dict.fromkeys(feature.flags, True)
    judged = {
        arch: judge_site(run.tree, site, arch, run.cuda, assume=assume, environ=run.environ)
        for arch in run.archs
    }
    values = {arch: value for arch, (value, _) in judged.items()}
    reference = run.reference
    if reference is None:
        ref_value: bool | None = None
    elif reference in values:
        ref_value = values[reference]
    else:
        ref_value = evaluate_site(run.tree, site, reference, run.cuda, assume=assume, environ=run.environ)
    undecided = any(v is None and why for v, why in judged.values())
    on_somewhere = [str(arch) for arch, (v, why) in judged.items() if v is not False and not why]
    if ref_value is False and not on_somewhere and not undecided:
        return  # off everywhere, the reference included: no per-GPU question (a ROCm / NPU-only path, say)
    if ref_value is not False and not (undecided or any(v is False for v in values.values())):
        return  # not decided by the GPU: on (or run-time dependent) everywhere
    also_ref = (
        f"; false on the reference {reference} too, not false on {', '.join(on_somewhere)}"
        if ref_value is False and on_somewhere
        else ""
    )
    for arch, (value, unresolved) in judged.items():
        finding = _flag_finding(run.comp, feature, site, arch, value, unresolved, also_ref)
        results[arch].append(finding)
        run.out.add(finding)


def _autos(run: _GateRun, feature: Feature, results: dict[Arch, list[Finding]]) -> None:
    """The release's own switching-on of the feature's flags, per arch, against its use-gate on that arch."""
    archs = [*run.archs, *([run.reference] if run.reference and run.reference not in run.archs else [])]
    evaluator = {arch: Evaluator(run.tree, arch, run.cuda, environ=run.environ) for arch in archs}
    for site in auto_sites(run.tree, run.packages, feature.flags):
        judged = {
            arch: evaluate_auto(run.tree, site, arch, run.cuda, evaluator=evaluator[arch]) for arch in archs
        }
        if not decided_by_gpu(judged.values()):
            continue  # the same on every GPU (a user flag translated, a ROCm-only branch): no capability question
        reference = judged.get(run.reference) if run.reference else None
        for arch in run.archs:
            run.out.add(_auto_finding(run.comp, feature, judged[arch], reference, results[arch]))


def _auto_finding(
    comp: InstalledComponent,
    feature: Feature,
    auto: AutoResult,
    reference: AutoResult | None,
    use: list[Finding],
) -> Finding:
    """`auto` (does the release switch the flag on here?) against the use-gate findings of the same arch."""
    site, arch = auto.site, auto.gpu
    base = Finding("auto", str(arch), comp.distribution, site.path, site.line, site.symbol, "ok", "pass", "",
                   feature.name)  # fmt: skip
    head = f"feature {feature.name}: `{site.text}` at {site.path}:{site.line} (switches {site.flag} on)"
    off = [f for f in use if f.verdict in ("gated-off", "missing-crash")]
    unknown = [f for f in use if f.verdict == "unknown"]
    gate = "; ".join(f"{f.file}:{f.line} {f.verdict}" for f in off[:3])
    if auto.state == "unknown":
        why = f"undecidable: {head} on {arch} cannot be decided statically: {auto.reason}"
        return replace(base, verdict="unknown", outcome="skip", message=why)
    if auto.state == "on":
        if off:
            why = (
                f"{head} runs on {arch} (no condition on the way excludes it), but the feature's use-gate keeps "
                f"it off there: {gate}. The release switches on a flag that does nothing (or crashes) on {arch}. "
                f"Fix: exclude {arch} in the condition before {site.path}:{site.line}, or make the use-gate at "
                f"{off[0].file}:{off[0].line} admit it (a patch set in patches/)"
            )
            return replace(base, verdict="auto-on-gated-off", outcome="fail", message=why)
        if unknown:
            why = f"undecidable: {head} runs on {arch}, and its use-gate there is undecidable: {unknown[0].message}"
            return replace(base, verdict="unknown", outcome="skip", message=why)
        return replace(base, message=f"{head} runs on {arch}, and no use-gate of the feature is off there")
    # off on this arch
    if reference is None or reference.state != "on" or off:
        return replace(base, message=f"{head} does not run on {arch} ({auto.reason})" + (
            f", and its use-gate is off there too ({gate})" if off else ""))  # fmt: skip
    if unknown:
        why = (
            f"undecidable: {head} does not run on {arch} ({auto.reason}) while it does on the reference "
            f"{reference.gpu}; whether the use-gate lets it on there is undecidable: {unknown[0].message}"
        )
        return replace(base, verdict="unknown", outcome="skip", message=why)
    why = (
        f"{head} does not run on {arch} ({auto.reason}), though it does on the reference {reference.gpu} and no "
        f"use-gate of the feature is off on {arch}: the release leaves {site.flag} to the user there (pass it "
        "to get the feature); a default, not a capability failure"
    )
    return replace(base, verdict="auto-off-gate-on", message=why)


def _flag_finding(
    comp: InstalledComponent,
    feature: Feature,
    site: FlagSite,
    arch: Arch,
    value: bool | None,
    unresolved: str = "",
    also_ref: str = "",
) -> Finding:
    """`also_ref` says that the reference arch is off too (the site is on only on other targets)."""
    base = Finding("flag", str(arch), comp.distribution, site.path, site.line, site.symbol, "ok", "pass", "",
                   feature.name)  # fmt: skip
    reads = "/".join(feature.flags)
    if site.via:  # followed into a callee: name the call sites too
        reads = (
            f"reads {', '.join(site.carriers + site.carrier_attrs) or reads}, which carries {site.flag}: "
            + (" -> ".join(site.via))
        )
    else:
        reads = f"reads {reads}"
    head = f"feature {feature.name}: `{site.text}` at {site.path}:{site.line} ({reads})"
    if value is None and unresolved:
        why = f"undecidable: {head} on {arch} cannot be decided statically: {unresolved}"
        return replace(base, verdict="unknown", outcome="skip", message=why)
    if value is not False:
        state = "true" if value else "not decided by the GPU"
        return replace(base, message=f"{head} is {state} on {arch}")
    if arch in feature.off:
        why = f"{head} is false on {arch}, as declared ({feature.off[arch]!r})"
        return replace(base, verdict="gated-off", message=why)
    versus = also_ref or ", but not on the reference arch"
    why = (
        f"{head} is false on {arch} with the flag set{versus}. Fix: patch the condition "
        f'at {site.path}:{site.line} to accept {arch}, or declare [features.{feature.name}] off = {{ {arch} = "why" }}'
    )
    return replace(base, verdict="gated-off", outcome="fail", message=why)


def _expectation(
    comp: InstalledComponent, feature: Feature, arch: Arch, judged: list[Finding], out: Analysis
) -> Finding:
    libs = [
        f
        for f in out.findings
        if f.kind in ("binary", "loader")
        and f.arch == str(arch)
        and any(fnmatch.fnmatch(f.file, p) for p in feature.libs)
    ]
    evidence = judged + libs
    base = Finding("expectation", str(arch), comp.distribution, "matrix.toml", 0, f"features.{feature.name}.off",
                   "gated-off", "pass", "", feature.name)  # fmt: skip
    reason = feature.off[arch]
    if evidence and all(f.verdict in ("ok", "ptx-jit") for f in evidence):
        why = (
            f"[features.{feature.name}] declares it off on {arch} ({reason!r}), but every gate lets it on and "
            f"every library it needs has {arch} code: the expectation is stale, remove off.{arch} from matrix.toml"
        )
        return replace(base, verdict="ok", outcome="fail", message=why)
    off = [f for f in evidence if f.verdict not in ("ok", "ptx-jit", "unknown")]
    if not off and any(f.verdict == "unknown" for f in evidence):
        first = next(f for f in evidence if f.verdict == "unknown")
        why = (
            f"undecidable: [features.{feature.name}] is declared off on {arch} ({reason!r}); {first.message}"
        )
        return replace(base, verdict="unknown", outcome="skip", message=why)
    detail = "; ".join(
        f"{f.file}:{f.line} {f.verdict}" if f.line else f"{f.file} {f.verdict}" for f in off[:4]
    )
    why = f"[features.{feature.name}] is off on {arch} as declared ({reason!r}): {detail or 'no gate or library to check'}"
    return replace(base, message=why)


def _top_packages(cell: CellSpec) -> frozenset[str] | None:
    """The cell's own top-level packages (from its wheels' RECORDs); None where a RECORD is missing."""
    names: set[str] = set()
    for comp in cell.components:
        if not comp.root:
            continue
        files = component_files(comp)
        if not files:
            return None
        names.update(f.split("/", 1)[0].removesuffix(".py") for f in files if "/" in f or f.endswith(".py"))
    return frozenset(n for n in names if not n.endswith((".dist-info", ".data")) and n != "..")


def _owner(cell: CellSpec, tree: SourceTree, gate: str, default: InstalledComponent) -> InstalledComponent:
    """The component whose tree holds the gate's module (flashinfer's JIT gate belongs to flashinfer-python)."""
    path = tree.path_of(gate.partition(":")[0])
    for comp in cell.components:
        if path is None or not comp.root or not path.is_relative_to(comp.root):
            continue
        files = component_files(comp)  # one site-packages may hold every component: ask each wheel's RECORD
        if not files or path.relative_to(comp.root).as_posix() in files:
            return comp
    return default


def _exists(tree: SourceTree, gate: str) -> bool:
    module, _, qualname = gate.partition(":")
    if tree.path_of(module) is None:
        return False
    try:
        Evaluator(tree, Arch(9, 0), "").lookup(f"{module}.{qualname}")
    except SourceError:
        return False
    return True


# --------------------------------------------------------------------------- entry point


def analyse(cell: CellSpec) -> Analysis:
    """Every static finding for the cell, per target arch. Never raises."""
    out = Analysis()
    archs = _targets(cell, out)
    features: tuple[Feature, ...] = ()
    try:
        features = parse_features(cell.features)
    except FeatureError as exc:
        out.add(Finding("error", "all", "matrix.toml", "matrix.toml", 0, "features", "", "fail", str(exc)))
    if not archs:
        out.add(Finding("error", "all", "matrix.toml", "matrix.toml", 0, "targets.archs", "", "fail",
                        "no usable target arch in matrix.toml [targets] archs: nothing to check"))  # fmt: skip
        return out
    out.timed("binaries", lambda: _binaries(cell, archs, features, out))
    out.timed("tables", lambda: _tables(cell, archs, out))
    out.timed("gates", lambda: _gates(cell, archs, features, out))
    return out


def grid(analysis: Analysis) -> dict[tuple[str, str], str]:
    """(arch, component) -> "verdict xN, ..." over the findings that did not pass, or "ok"."""
    cells: dict[tuple[str, str], dict[str, int]] = {}
    for f in analysis.findings:
        counts = cells.setdefault((f.arch, f.component), {})
        label = {"fail": f.verdict, "pass": "ok", "skip": "skipped"}.get(f.outcome, f.outcome)
        counts[label] = counts.get(label, 0) + 1
    out: dict[tuple[str, str], str] = {}
    for key, counts in cells.items():
        bad = {k: v for k, v in counts.items() if k not in ("ok", "skipped", "n/a")}
        out[key] = ", ".join(f"{k or 'error'} x{v}" for k, v in sorted(bad.items())) or "ok"
    return out


def grid_markdown(analysis: Analysis, title: str) -> str:
    table = grid(analysis)
    archs = sorted({a for a, _ in table})
    comps = sorted({c for _, c in table})
    lines = [f"### {title}", "", "| arch | " + " | ".join(comps) + " |", "|---" * (len(comps) + 1) + "|"]
    for arch in archs:
        lines.append(f"| {arch} | " + " | ".join(table.get((arch, c), "—") for c in comps) + " |")
    lines.append("")
    failing = [f for f in analysis.findings if f.outcome == "fail"]
    if failing:
        lines += ["**Failing findings**", ""]
        lines += [f"- `{f.arch}` {f.component} `{f.file}:{f.line}` {f.verdict or 'error'}: {f.message}"
                  for f in failing]  # fmt: skip
        lines.append("")
    if analysis.notes:
        lines += ["**Notes**", "", *(f"- {n}" for n in analysis.notes), ""]
    timing = ", ".join(f"{k} {v:.2f}s" for k, v in analysis.timings.items())
    lines.append(f"static analysis: {timing}")
    return "\n".join(lines) + "\n"


__all__ = ["Analysis", "Finding", "analyse", "grid", "grid_markdown"]
