"""The upgrade planner: from a cell that runs today, every newer SGLang release as a whole stack, judged
statically, and the newest one worth proving on the GPU runner.

    start cell ─▶ newer sglang releases on the index ─▶ each one's own pins (torch, kernel, flashinfer) and
    the CUDA its torch is built for ─▶ installable? driver floor? ─▶ its static row (patches, capability,
    EAGLE-3; stackfarm.upgrade_static, cached) ─▶ blockers per release ─▶ where each appears and goes away ─▶
    the recommendation and the cells that finish the proof

A candidate's stack is the release's own ``Requires-Dist`` for every pinned axis of the start cell (a pin the
start value satisfies keeps it, so a local build such as ``2.9.1+cu130`` stays; a range takes the newest
release on the index in it); its CUDA is the start cell's while torch is unchanged, else the torch wheel's
label (``+cu130``) or the CUDA runtime its METADATA requires. Every wheel of the stack must be on the index
for the matrix's platform and Python, and the release's ``Requires-Python`` must hold the cell's Python.

A **blocker** is something that keeps a candidate from running: a static finding that fails after the
patches (its ``file:line``, and the patch sets that touch it with their status there), a patch the start
cell carries that no longer applies where nothing static shows what it fixed, a driver below the stack's
floor (stackfarm.driver), a wheel the index lacks, a Python the release does not support. One that
the analysis cannot decide is *open*, never a pass. A blocker the start cell has too is *current*: the
cell runs with it today (stock flashinfer has no sm_120 fused allreduce), so by default it does not keep a
candidate from being recommended (``strict`` makes it); it is listed either way.

Each candidate's status: ``pass`` (nothing fails or is open), ``open`` (nothing fails, something is open),
``fail``, ``unavailable`` (the stack cannot be formed). The recommendation is the newest candidate that is
not unavailable and whose failing blockers are all current (with ``strict``: none fails); a static verdict
is not a run, so it comes with the cells that finish the proof: the start cell and the recommended one.
"""

from __future__ import annotations

import email.message
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Protocol

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from . import stack
from .analysis.cache import JsonCache, default_root
from .analysis.eagle3 import Role
from .artifacts import Artifact, Cache, list_versions, requires_dist
from .driver import cell_floor, runs_on
from .errors import ArtifactError, StackfarmError
from .matrix import Matrix
from .plan import Component, components
from .resolve import Resolver
from .sglangtrees import available_versions
from .upgrade_outcome import recommend, timeline
from .upgrade_patches import LineageChoice, touched_files
from .upgrade_plan import Blocker, Candidate, Fixed, Options, Status, UpgradePlan
from .upgrade_static import (
    NAMESPACE,
    Job,
    Row,
    StaticFinding,
    analyse,
    code_digest,
    from_json,
    row_key,
    to_json,
)
from .verdict import path_of
from .verdict import read as read_verdict

_CUDA_LABEL = re.compile(r"^cu(\d+)(\d)$")
_RUNTIMES = (
    "nvidia-cuda-runtime-cu11",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-runtime-cu13",
    "nvidia-cuda-runtime",
    "cuda-toolkit",
)


class Progress(Protocol):
    """What the planner tells the user while it works (stackfarm.ui.CellProgress is one)."""

    def update(self, cell: str, text: str) -> None: ...

    def done(self, cell: str, verdict: str, detail: str = "") -> None: ...

    def note(self, text: str) -> None: ...


class Silent:
    """A Progress that says nothing."""

    def update(self, cell: str, text: str) -> None:
        pass

    def done(self, cell: str, verdict: str, detail: str = "") -> None:
        pass

    def note(self, text: str) -> None:
        pass


# --------------------------------------------------------------------------- forming a candidate's stack


def releases(matrix: Matrix, start: str, to: str | None = None) -> list[str]:
    """The final (and post) sglang releases on the index newer than `start`, up to `to`, oldest first."""
    low = Version(start)
    high = Version(to) if to else None
    out = []
    for text in available_versions(matrix):
        v = Version(text)
        if v <= low or v.is_prerelease or v.is_devrelease or (high is not None and v > high):
            continue
        out.append(text)
    return out


def torch_cuda(torch: str, meta: email.message.Message | None) -> str | None:
    """The CUDA a torch build targets: its local label (``+cu130``), else the CUDA runtime it requires."""
    try:
        local = Version(torch).local or ""
    except InvalidVersion:
        local = ""
    if match := _CUDA_LABEL.match(local):
        return f"{match[1]}.{match[2]}"
    return _runtime_cuda(meta) if meta is not None else None


def _runtime_cuda(meta: email.message.Message) -> str | None:
    """The CUDA of the first CUDA runtime that METADATA pins exactly (``nvidia-cuda-runtime-cu12==12.8.*``)."""
    for raw in meta.get_all("Requires-Dist") or []:
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) not in _RUNTIMES:
            continue
        for clause in req.specifier:
            if clause.operator in ("==", "==="):
                with_cuda = Version(clause.version)
                return f"{with_cuda.major}.{with_cuda.minor}"
    return None


def _listed(matrix: Matrix, distribution: str) -> list[Version]:
    names = [matrix.default_index] + [
        r.index for r in matrix.routes if canonicalize_name(r.requirement.name) == distribution
    ]
    found: set[Version] = set()
    for name in dict.fromkeys(names):
        for text in list_versions(matrix.indexes[name], distribution):
            if matrix.index_for(distribution, text) == name:
                found.add(Version(text))
    return sorted(found)


def _exact_pin(reqs: Sequence[Requirement]) -> str | None:
    """The one version the requirements pin with ``==`` (no wildcard), if they agree on exactly one."""
    exact = [c.version for r in reqs for c in r.specifier if c.operator == "==" and "*" not in c.version]
    return exact[0] if len(set(exact)) == 1 else None


def _newest_fitting(matrix: Matrix, reqs: Sequence[Requirement]) -> Version | None:
    """The newest final release on the index that satisfies every requirement."""
    listed = [v for v in _listed(matrix, canonicalize_name(reqs[0].name)) if not v.is_prerelease]
    fits = [v for v in listed if all(r.specifier.contains(v) for r in reqs)]
    return fits[-1] if fits else None


def _pinned(matrix: Matrix, axis: str, current: str, reqs: Sequence[Requirement]) -> tuple[str | None, str]:
    """The axis value the pins want (the current one when it satisfies them), and how it was chosen."""
    if not reqs:
        return current, f"{axis} {current} (not pinned)"
    text = ", ".join(str(r) for r in reqs)
    if all(r.specifier.contains(current, prereleases=True) for r in reqs):
        return current, f"{axis} {current} ({text})"
    if (exact := _exact_pin(reqs)) is not None:
        return exact, f"{axis} {exact} ({text})"
    newest = _newest_fitting(matrix, reqs)
    if newest is None:
        return None, f"{axis}: nothing on the index satisfies {text}"
    return str(newest), f"{axis} {newest} (the newest on the index for {text})"


def _axis_pins(pins: Sequence[Requirement], axis: str) -> list[Requirement]:
    """The release's requirements on one axis; flashinfer-cubin only when nothing else pins the axis."""
    reqs = [r for r in pins if stack.DISTRIBUTION_AXIS.get(canonicalize_name(r.name)) == axis]
    return [r for r in reqs if canonicalize_name(r.name) != "flashinfer-cubin"] or reqs


@dataclass
class _Formed:
    values: dict[str, str]
    notes: list[str] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    floor: str = ""
    #: The distributions the release's own METADATA requires (canonical names).
    required: frozenset[str] = frozenset()


class Planner:
    """Walks the releases after a start cell (see the module docstring)."""

    def __init__(
        self, matrix: Matrix, resolver: Resolver, options: Options, *, progress: Progress | None = None
    ) -> None:
        self.matrix = matrix
        self.resolver = resolver
        self.cache: Cache = resolver.cache
        self.options = options
        self.ui: Progress = progress or Silent()
        self.store = JsonCache(default_root(), NAMESPACE)
        self._code = ""
        self.computed = 0
        self.reused = 0

    # -- one stack ------------------------------------------------------------------------------------

    def _blocker(
        self, formed: _Formed, kind: str, title: str, message: str, *, outcome: str = "fail", key: str = ""
    ) -> None:
        """`key` stays the same from release to release (default: the kind and the title)."""
        formed.blockers.append(
            Blocker(
                key=key or f"{kind}:{title}",
                kind=kind,
                outcome=outcome,
                title=title,
                sites=(),
                message=message,
            )
        )

    def form(self, version: str, start: Mapping[str, str], *, keep: bool = False) -> _Formed:
        """The stack of sglang `version` from its own pins (`keep`: the start cell's values as they are)."""
        python = start.get("python", self.matrix.axes["python"][0])
        formed = _Formed(values={**start, "sglang": version})
        sglang = Component(
            axis="sglang",
            distribution="sglang",
            version=version,
            index=self.matrix.index_for("sglang", version),
        )
        try:
            meta = self.resolver.metadata(sglang, python)
        except ArtifactError as exc:
            self._blocker(formed, "unavailable", f"sglang {version}", f"its wheel cannot be read: {exc}")
            return formed
        self._python(formed, version, meta, python)
        if not keep:
            self._pins(formed, version, meta, start)
        if not any(b.kind == "unavailable" for b in formed.blockers):
            self._installable(formed, python)
        return formed

    def _python(self, formed: _Formed, version: str, meta: email.message.Message, python: str) -> None:
        needs = str(meta.get("Requires-Python") or "")
        try:
            fits = SpecifierSet(needs).contains(f"{python}.0") if needs else True
        except InvalidSpecifier:
            fits = True
        if not fits:
            why = f"the cell's python is {python}: add a python the release supports to [axes] python"
            self._blocker(
                formed, "python", f"sglang {version} requires Python {needs}", why, key=f"python:{python}"
            )

    def _pins(
        self, formed: _Formed, version: str, meta: email.message.Message, start: Mapping[str, str]
    ) -> None:
        python = formed.values.get("python", self.matrix.axes["python"][0])
        pins = requires_dist(meta, python=python)
        formed.required = frozenset(canonicalize_name(r.name) for r in pins)
        for axis in stack.PINNED_AXES:
            if axis not in start:
                continue
            value, how = _pinned(self.matrix, axis, start[axis], _axis_pins(pins, axis))
            formed.notes.append(how)
            if value is None:
                self._blocker(formed, "unavailable", f"{axis} for sglang {version}", how, key=f"pin:{axis}")
                continue
            formed.values[axis] = value
        torch = formed.values.get("torch", "")
        if torch == start.get("torch"):
            formed.values["cuda"] = start.get("cuda", "")
            return
        self._cuda(formed, torch, python, start)

    def _cuda(self, formed: _Formed, torch: str, python: str, start: Mapping[str, str]) -> None:
        meta = None
        comp = Component(
            axis="torch", distribution="torch", version=torch, index=self.matrix.index_for("torch", torch)
        )
        try:
            meta = self.resolver.metadata(comp, python)
        except ArtifactError as exc:
            formed.notes.append(f"torch {torch}: METADATA unreadable ({str(exc).splitlines()[0]})")
        cuda = torch_cuda(torch, meta)
        if cuda is None:
            formed.values["cuda"] = start.get("cuda", "")
            self._blocker(
                formed,
                "cuda",
                f"CUDA of torch {torch}",
                f"neither torch {torch}'s label nor its "
                "METADATA names a CUDA runtime: the driver floor is unknown",
                outcome="open",
            )
            return
        formed.values["cuda"] = cuda
        formed.notes.append(f"CUDA {cuda} (what torch {torch} is built for)")

    def _installable(self, formed: _Formed, python: str) -> None:
        for comp in components(self.matrix, formed.values):
            try:
                formed.artifacts[comp.distribution] = self.resolver.artifact(comp, python)
            except ArtifactError as exc:
                first = str(exc).splitlines()[0]
                why = f"{comp.distribution} {comp.version} is not installable here: {first}"
                if formed.required and comp.distribution not in formed.required:
                    why += (
                        f"; sglang {formed.values['sglang']} does not require it itself, but stackfarm's "
                        f"{comp.axis} axis installs it, so the farm cannot build this cell"
                    )
                formed.blockers.append(
                    Blocker(
                        key=f"unavailable:{comp.distribution}",
                        kind="unavailable",
                        outcome="fail",
                        title=f"no {comp.distribution} {comp.version}",
                        sites=(),
                        message=why,
                    )
                )

    def _driver(self, formed: _Formed) -> None:
        cuda = formed.values.get("cuda", "")
        floor = cell_floor(cuda)
        if floor is None:
            formed.notes.append(f"driver floor unknown (CUDA {cuda or '?'})")
            return
        formed.floor = floor.driver
        formed.notes.append(f"driver >= {floor.driver}: {floor.reason}")
        driver = self.options.driver
        if driver is not None and (
            why := runs_on(driver, floor, cuda, forward_compat=self.options.forward_compat)
        ):
            formed.blockers.append(
                Blocker(
                    key=f"driver:{floor.driver}",
                    kind="driver",
                    outcome="fail",
                    title=f"driver {driver} < {floor.driver}",
                    sites=(),
                    message=why + ": upgrade the driver, or set forward_compat on a data-center runner",
                )
            )

    # -- static rows ----------------------------------------------------------------------------------

    def _classes(self) -> tuple[tuple[Role, str], ...]:
        out: list[tuple[Role, str]] = []
        for model in self.options.models:
            out += [("target", model.target), ("draft", model.draft)]
        return tuple(dict.fromkeys(out))

    def _job(self, version: str, start: str, formed: _Formed) -> tuple[Job, str]:
        arch = self.options.arch
        ref = self.options.reference
        archs = (arch,) if ref in (None, arch) else (arch, ref)
        fi = formed.artifacts.get("flashinfer-python") if self.options.flashinfer_sources else None
        job = Job(
            version=version,
            start=start,
            cuda=formed.values.get("cuda", ""),
            sglang_tree="",
            flashinfer=(formed.values["flashinfer"], "") if fi is not None else None,
            sets=self.options.sets,
            features=dict(self.matrix.features),
            archs=archs,
            reference=ref,
            classes=self._classes(),
        )
        wheels = [formed.artifacts["sglang"].sha256, fi.sha256 if fi is not None else ""]
        return job, row_key(job, wheels, self._code)

    def _trees(self, formed: _Formed, job: Job) -> Job:
        def tree(dist: str) -> str:
            art = formed.artifacts[dist]
            done = self.cache.unpacked(art)
            if done is not None:
                return str(done)
            size = f" ({art.size / 2**20:.0f} MB)" if art.size else ""
            self.ui.update(f"sglang {job.version}", f"fetch and unpack {art.filename}{size}")
            return str(self.cache.unpack(art))

        fi = job.flashinfer
        return replace(
            job,
            sglang_tree=tree("sglang"),
            flashinfer=(fi[0], tree("flashinfer-python")) if fi is not None else None,
        )

    def rows(self, stacks: Mapping[str, tuple[str, _Formed]]) -> dict[str, tuple[Row, bool]]:
        """version -> (its static row, from the cache); computed in parallel where the cache lacks one."""
        self._code = code_digest()
        out: dict[str, tuple[Row, bool]] = {}
        todo: list[Job] = []
        for version, (start, formed) in stacks.items():
            job, key = self._job(version, start, formed)
            cached = self.store.get(key)
            if cached is not None:
                try:
                    out[version] = (from_json(cached), True)
                    self.reused += 1
                    continue
                except (KeyError, TypeError, ValueError):
                    pass  # another shape: computed again
            todo.append(replace(self._trees(formed, job), key=key))
            self.ui.update(f"sglang {version}", "queued for analysis")
        for job, row in zip(todo, self._analyse(todo), strict=True):
            self.store.put(job.key, to_json(row))
            self.computed += 1
            out[job.version] = (row, False)
        return out

    def _analyse(self, jobs: Sequence[Job]) -> Iterable[Row]:
        if not jobs:
            return []
        workers = self.options.jobs or max(1, min(len(jobs), os.cpu_count() or 1))
        if workers == 1:
            return (self._one(j, analyse(j)) for j in jobs)
        pool = ProcessPoolExecutor(max_workers=workers)
        try:
            return [self._one(j, r) for j, r in zip(jobs, pool.map(analyse, jobs), strict=True)]
        finally:
            pool.shutdown()

    def _one(self, job: Job, row: Row) -> Row:
        self.ui.update(f"sglang {job.version}", f"analysed in {row.seconds:.1f}s")
        return row

    # -- the walk -------------------------------------------------------------------------------------

    def plan(self, start: Mapping[str, str]) -> UpgradePlan:
        began = time.perf_counter()
        first = start["sglang"]
        versions = releases(self.matrix, first, self.options.to)
        stacks: dict[str, tuple[str, _Formed]] = {}
        for version in [first, *versions]:
            label = f"sglang {version}"
            self.ui.update(label, "reading its pins")
            formed = self.form(version, start, keep=version == first)
            self._driver(formed)
            stacks[version] = (first, formed)
        # What cannot be installed still has sources to judge: its row is computed all the same.
        analysable = {v: s for v, s in stacks.items() if "sglang" in s[1].artifacts}
        rows = self.rows(analysable)
        judged: list[Candidate] = []
        base: Candidate | None = None
        for version, (_, formed) in stacks.items():
            row, cached = rows.get(version, (None, False))
            cand = self._judge(version, formed, row, cached, base)
            base = base or cand
            judged.append(cand)
            self.ui.done(f"sglang {version}", _UI.get(cand.status, cand.status), _brief(cand))
        start_c, cands = judged[0], tuple(judged[1:])
        spans = timeline([start_c, *cands])
        return UpgradePlan(
            start=start_c,
            options=self.options,
            candidates=cands,
            spans=spans,
            recommendation=recommend(start_c, cands, strict=self.options.strict),
            computed=self.computed,
            reused=self.reused,
            seconds=round(time.perf_counter() - began, 2),
        )

    def _judge(
        self, version: str, formed: _Formed, row: Row | None, cached: bool, base: Candidate | None
    ) -> Candidate:
        blockers = list(formed.blockers)
        fixed: tuple[Fixed, ...] = ()
        choices: tuple[LineageChoice, ...] = ()
        if row is not None:
            found, fixed, choices = self._static(row, base)
            blockers += found
        current = {b.key for b in base.blockers} if base is not None else None
        if current is not None:
            blockers = [replace(b, current=b.key in current) for b in blockers]
        else:
            blockers = [replace(b, current=True) for b in blockers]
        cell = stack.cell_id(formed.values, with_python=len(self.matrix.axes["python"]) > 1)
        return Candidate(
            sglang=version,
            values=dict(formed.values),
            cell=cell,
            notes=tuple(formed.notes),
            floor=formed.floor,
            status=_status(blockers),
            blockers=tuple(blockers),
            fixed=fixed,
            patches=choices,
            stored=self._stored(cell),
            cached=cached,
            seconds=row.seconds if row is not None else 0.0,
        )

    def _stored(self, cell: str) -> str:
        if self.options.reports is None:
            return ""
        where = path_of(self.options.reports, cell)
        if not where.is_file():
            return ""
        try:
            return str(read_verdict(where).report.status)
        except ValueError as exc:
            return f"unusable ({str(exc).splitlines()[0]})"

    def _static(
        self, row: Row, base: Candidate | None
    ) -> tuple[list[Blocker], tuple[Fixed, ...], tuple[LineageChoice, ...]]:
        sets = {ps.name: ps for ps in self.options.sets}
        touched = {name: touched_files(ps) for name, ps in sets.items()}
        by_set: dict[str, list[str]] = {}
        for s in row.statuses:
            by_set.setdefault(s.set, []).append(f"{s.patch} {s.status}")
        chosen = [c.chosen or c.member for c in row.choices if c.chosen or c.verdict == "partial"]
        blockers = [_finding_blocker(group, touched, by_set, chosen) for group in _grouped(row.patched)]
        choices, unported = _port_checks(row, base)
        blockers += unported
        blockers += _row_failures(row)
        return blockers, _fixed(row, touched, chosen), choices


def _fixed(row: Row, touched: Mapping[str, frozenset[str]], chosen: Sequence[str]) -> tuple[Fixed, ...]:
    """What fails on the pristine tree and no longer after the patches, and the chosen sets that fix it
    (those touching its files, else all of them)."""
    failing = {f.key for f in row.patched}
    return tuple(
        Fixed(
            key=g[0].key,
            title=g[0].title,
            sites=_sites(g),
            feature=g[0].feature,
            by=tuple(n for n in chosen if touched.get(n, frozenset()) & set(_files(g))) or tuple(chosen),
        )
        for g in _grouped(row.pristine)
        if g[0].key not in failing and g[0].outcome == "fail"
    )


def _port_checks(row: Row, base: Candidate | None) -> tuple[tuple[LineageChoice, ...], list[Blocker]]:
    """Every lineage choice of the row after `port_check`, and the blockers those checks raise."""
    pristine = {f.key for f in row.pristine} | {f"feature:{f.feature}" for f in row.pristine if f.feature}
    choices = []
    blockers = []
    for raw in row.choices:
        choice, blocker = port_check(raw, base, pristine)
        choices.append(choice)
        if blocker is not None:
            blockers.append(blocker)
    return tuple(choices), blockers


def _row_failures(row: Row) -> list[Blocker]:
    """The row's analysis errors, and the patches that do not apply when the chosen sets go on together."""
    blockers = [
        Blocker(
            key=f"error:{e[:60]}", kind="error", outcome="fail", title="analysis error", sites=(), message=e
        )
        for e in row.errors
    ]
    for name, status in row.applied.items():
        if status != "applied":
            blockers.append(
                Blocker(
                    key=f"patch:{name}:{status}",
                    kind="patch",
                    outcome="fail",
                    title=f"{name} {status} when the chosen sets are applied together",
                    sites=(),
                    message=f"{name}: {status}",
                )
            )
    return blockers


_UI = {"pass": "passed", "open": "incomplete", "fail": "failed", "unavailable": "error"}


def _brief(cand: Candidate) -> str:
    new = cand.new_failures
    parts = [cand.cell]
    if new:
        parts.append(f"{len(new)} new blocker(s): " + "; ".join(b.title for b in new[:2]))
    elif cand.blockers:
        parts.append(f"{len(cand.blockers)} blocker(s), none new")
    parts.append("static row from the cache" if cand.cached else f"analysed in {cand.seconds:.1f}s")
    return ", ".join(parts)


def _status(blockers: Sequence[Blocker]) -> Status:
    if any(b.kind == "unavailable" for b in blockers):
        return "unavailable"
    if any(b.outcome == "fail" for b in blockers):
        return "fail"
    return "open" if blockers else "pass"


def _grouped(findings: Sequence[StaticFinding]) -> list[list[StaticFinding]]:
    groups: dict[str, list[StaticFinding]] = {}
    for f in findings:
        groups.setdefault(f.key, []).append(f)
    return list(groups.values())


def _sites(group: Sequence[StaticFinding]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s for f in group for s in f.sites))


def _files(group: Sequence[StaticFinding]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p for f in group for p in f.files))


def _finding_blocker(
    group: Sequence[StaticFinding],
    touched: Mapping[str, frozenset[str]],
    by_set: Mapping[str, Sequence[str]],
    chosen: Sequence[str],
) -> Blocker:
    first = group[0]
    files = set(_files(group))
    fixes = []
    for name, paths in touched.items():
        if not paths & files:
            continue
        state = ", ".join(by_set.get(name, ())) or "not checked"
        fixes.append(f"{name}: applied here, and it still fails" if name in chosen else f"{name}: {state}")
    return Blocker(
        key=first.key,
        kind=first.source,
        outcome="fail" if first.outcome == "fail" else "open",
        title=first.title,
        sites=_sites(group),
        message=first.message,
        fixes=tuple(fixes),
    )


def port_check(
    choice: LineageChoice, base: Candidate | None, pristine: set[str]
) -> tuple[LineageChoice, Blocker | None]:
    """A lineage that does not apply: retired when nothing it fixed on the start cell fails here without it,
    else a blocker when nothing static shows what it fixes (the findings say it otherwise)."""
    if choice.verdict != "port":
        return choice, None
    purpose = _purpose(choice, base)
    if purpose and not purpose & pristine:
        note = f"superseded: nothing it fixes on sglang {base.sglang if base else '?'} fails here without it"
        return replace(choice, verdict="retire", note=note), None
    if purpose:
        return choice, None
    return choice, Blocker(
        key=f"patch:{choice.lineage}",
        kind="patch",
        outcome="fail",
        title=f"patch set {choice.member} does not apply",
        sites=(),
        message=f"{choice.note}; no static finding shows what it fixes, so whether this "
        "release needs it is not decided here",
    )


def _purpose(choice: LineageChoice, base: Candidate | None) -> set[str]:
    """The keys (and features) of what the lineage fixed on the start cell."""
    mine = [f for f in base.fixed if choice.lineage in _lineage_of(f.by, base)] if base else []
    # A finding of the same feature counts as the same need: the gate may have moved (another key).
    return {f.key for f in mine} | {f"feature:{f.feature}" for f in mine if f.feature}


def _lineage_of(names: Sequence[str], base: Candidate) -> set[str]:
    of = {c.chosen or c.member: c.lineage for c in base.patches}
    return {of.get(n, n) for n in names}


def default_arch(matrix: Matrix, cell: str) -> str:
    """The arch of the runner kind the start cell is routed to, else the matrix's first target arch."""
    from .driver import runner_for

    runner = runner_for(matrix, cell)
    if runner is not None and runner.arch:
        return runner.arch
    if not matrix.archs:
        raise StackfarmError(f"{matrix.path}: no [targets] archs, and no runner arch for {cell}: pass --arch")
    return matrix.archs[0]


__all__ = [
    "Planner",
    "Progress",
    "Silent",
    "default_arch",
    "port_check",
    "recommend",
    "releases",
    "timeline",
    "torch_cuda",
]
