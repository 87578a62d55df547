"""Run the cells of a plan: realise each stack, run its suites in order with gates, keep verdicts by input hash."""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import patches, proc, provenance, verdict
from .artifacts import Artifact, Cache
from .backends import PATCHED_SGLANG, Backend, groups_file
from .cachekeep import remove_tree
from .cellinputs import cell_inputs
from .cellspec import CellSpec
from .errors import ArtifactError, ConfigError, EnvironmentProblem, IndexUnreachableError, StackfarmError
from .family import record_path, sha256_of, to_json
from .handover import Handed, hand_over
from .junit import Step, write_skipped_suite, write_steps
from .matrix import Matrix, Suite
from .plan import Cell, Component, Plan, input_hash
from .proc import call
from .resolve import Resolver
from .store import BrokenEntry, Store
from .ui import CellProgress
from .verdict import Cause, CellReport, Status, SuiteResult, Wheel, read_suite

#: pytest's exit code when it collected no tests: not a pass (pytest's ExitCode.NO_TESTS_COLLECTED).
NO_TESTS_COLLECTED = 5
#: pytest's exit code for a usage error (ExitCode.USAGE_ERROR): a path or an option the harness gave is wrong.
USAGE_ERROR = 4
#: pytest's exit code after Ctrl-C (ExitCode.INTERRUPTED) — also what a collection error gives, which its
#: output tells apart; a death by SIGINT shows as -2.
PYTEST_INTERRUPTED = 2


#: The outcomes of a gate suite that skip the later suites: it failed, errored, or answered nothing. An
#: incomplete gate (what ran passed, some testcases skipped) lets the later suites run; the cell stays
#: incomplete all the same.
GATE_CLOSED = ("failed", "error", "skipped")

#: The reason of a `run --realise-only` cell's report: realised, no suite run (never saved as a verdict).
REALISED_ONLY = "realised only: no suite ran"

#: The runner's own first step, reported like a suite (it sorts before 00-stack in every table).
PATCH_STEP = "00-patches"


class Interrupted(StackfarmError):
    """The run was interrupted while this cell ran: it keeps no verdict, so a re-run runs it again."""


class HarnessError(StackfarmError):
    """pytest was called wrongly (exit 4) or found nothing to run (exit 5): the harness's error, not the
    suite's result. The cell is an error (never a *failed* verdict, never reused); the suite's JUnit file says
    what happened for JUnit consumers."""


def new_run_id() -> str:
    """A run's id: when it started (UTC) and a random part, e.g. 20261201T103100Z-3f9a1c."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    reports: Path
    jobs: int
    force: bool = False
    #: The shared verdict store (stackfarm.store): reused from before a cell runs, pushed to after.
    store: Store | None = None
    #: `--suites`: the run covers only these suites ("" = all); every verdict says so.
    selection: str = ""
    #: A plan's worker (`run --plan`): cell id -> the runner kind the plan dispatched it to (its inputs name it).
    kinds: Mapping[str, str] = field(default_factory=dict)
    #: A plan's worker: cell id -> the input hash the plan computed; a cell whose inputs hash otherwise here is
    #: refused (an environment error naming both), never run and pushed under a hash no merge of the plan reads.
    planned: Mapping[str, str] = field(default_factory=dict)
    #: `run --realise-only`: patch and realise each cell (a docker image built or pulled, and pushed), run no
    #: suite, keep and push no verdict; each cell's report says what was realised and is never saved.
    realise_only: bool = False


def gpu_unavailable_reason() -> str | None:
    """None when an NVIDIA GPU answers, else why not (the reason a GPU suite is skipped with)."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU on this machine (nvidia-smi not found)"
    outcome = call(["nvidia-smi", "-L"], timeout=30)
    if outcome.returncode != 0 or "GPU" not in outcome.output:
        return f"nvidia-smi lists no GPU ({outcome.output.strip()[:120]})"
    return None


class Runner:
    def __init__(
        self,
        matrix: Matrix,
        resolver: Resolver,
        backend: Backend,
        options: RunOptions,
        ui: CellProgress,
        *,
        unreachable: dict[tuple[str, str], str] | None = None,
        no_gpu_reason: str | None = None,
    ) -> None:
        self.matrix = matrix
        self.resolver = resolver
        self.cache: Cache = resolver.cache
        self.backend = backend
        self.options = options
        self.ui = ui
        self.unreachable = unreachable or {}
        self.no_gpu_reason = no_gpu_reason
        self.cancel = threading.Event()
        self.run_id = new_run_id()
        self.finished: dict[str, CellReport] = {}
        #: Pushes to the shared store that failed (the run exits 4 when nothing worse happened).
        self.store_problems: list[str] = []
        self._patched_files: dict[str, tuple[str, ...]] = {}

    # -- the whole plan ---------------------------------------------------------------------------------------

    def run(self, plan: Plan) -> list[CellReport]:
        """Every cell's report, sorted by id. On Ctrl-C, `self.finished` keeps the cells that completed."""
        reports = self.finished
        for conflict in () if self.options.realise_only else plan.conflicts:  # nothing to realise: not run
            unrun = self._unrun(conflict.cell, Status.CONFLICT, "; ".join(conflict.problems))
            reports[conflict.cell.id] = self._store(
                replace(unrun, contradictions=conflict.contradictions, declared_at=conflict.declared_at)
            )
            self.ui.done(conflict.cell.id, "conflict", conflict.problems[0])
        for excluded in () if self.options.realise_only else plan.excluded:
            reports[excluded.cell.id] = self._store(
                self._unrun(excluded.cell, Status.EXCLUDED, excluded.reason)
            )
        pool = ThreadPoolExecutor(max_workers=max(1, self.options.jobs), thread_name_prefix="cell")
        futures: dict[str, Future[CellReport]] = {c.id: pool.submit(self._guarded, c) for c in plan.cells}
        try:
            for cell_id, future in futures.items():
                reports[cell_id] = future.result()
        except KeyboardInterrupt:
            # Stop starting cells, stop every command in flight (each suite's whole process group), keep what
            # finished. A cell stopped half-way keeps no verdict.
            self.cancel.set()
            proc.stop(signal.SIGINT)
            pool.shutdown(wait=True, cancel_futures=True)
            for cell_id, future in futures.items():
                if future.done() and not future.cancelled() and future.exception() is None:
                    reports[cell_id] = future.result()
            raise
        pool.shutdown()
        return [reports[k] for k in sorted(reports)]

    def _guarded(self, cell: Cell) -> CellReport:
        """One broken cell never stops the others: any failure becomes that cell's error verdict.

        An error verdict is stored (so merged reports list the cell) but never reused: a re-run tries again."""
        if self.cancel.is_set():
            return self._error(cell, "interrupted before it started", Cause.ENVIRONMENT, store=False)
        store = not self.options.realise_only  # a cell that could not be realised is no verdict either
        try:
            return self.run_cell(cell)
        except (Interrupted, proc.Stopped) as exc:
            return self._error(cell, str(exc), Cause.ENVIRONMENT, store=False)
        except (ArtifactError, EnvironmentProblem) as exc:
            return self._error(cell, str(exc), Cause.ENVIRONMENT, store=store)
        except ConfigError as exc:  # its file and line are typed: the merged report points there
            where = verdict.SourceLine(path=str(exc.path), line=exc.line)
            return self._error(cell, str(exc), Cause.INTERNAL, store=store, declared_at=where)
        except StackfarmError as exc:
            return self._error(cell, str(exc), Cause.INTERNAL, store=store)
        except Exception as exc:
            return self._error(cell, f"{type(exc).__name__}: {exc}", Cause.INTERNAL, store=store)

    def _unrun(self, cell: Cell, status: Status, reason: str, cause: Cause = Cause.NONE) -> CellReport:
        return CellReport(
            cell=cell.id,
            status=status,
            reason=reason,
            cause=cause,
            values=cell.as_dict(),
            overridden=cell.overridden,
            backend=self.backend.name,
            run_id=self.run_id,
            no_gpu_reason=self.no_gpu_reason,
        )

    def _store(self, report: CellReport, inputs: Mapping[str, object] | None = None) -> CellReport:
        verdict.save(self.options.reports, report, inputs)
        return report

    def _error(
        self,
        cell: Cell,
        reason: str,
        cause: Cause,
        *,
        store: bool = True,
        declared_at: verdict.SourceLine | None = None,
    ) -> CellReport:
        self.ui.done(cell.id, "error", reason.splitlines()[0])
        report = replace(self._unrun(cell, Status.ERROR, reason, cause), declared_at=declared_at)
        return self._store(report) if store else report

    # -- one cell ---------------------------------------------------------------------------------------------

    def _artifacts(self, cell: Cell) -> dict[Component, Artifact]:
        found: dict[Component, Artifact] = {}
        if not self.backend.kind.resolves:
            return found
        for comp in cell.components:
            key = (comp.distribution, comp.version)
            if key in self.unreachable:
                raise IndexUnreachableError(self.unreachable[key])
            found[comp] = self.resolver.artifact(comp, cell["python"])
        return found

    def inputs(self, cell: Cell, artifacts: dict[Component, Artifact]) -> dict[str, object]:
        kind = self.matrix.runners.get(self.options.kinds.get(cell.id, ""))
        return cell_inputs(
            self.matrix, cell, artifacts, backend=self.backend.name, gpu=self.no_gpu_reason is None, kind=kind
        )

    def _check_planned(self, cell: Cell, digest: str) -> None:
        """A plan's worker computes the plan's input hash for its cell, or runs nothing of it."""
        want = self.options.planned.get(cell.id)
        # The host backend hashes the installed stack, not wheels: its hash is never a plan's (nor pushed).
        if want and want != digest and self.backend.kind.planned:
            gpu = "with" if self.no_gpu_reason is None else "without"
            raise EnvironmentProblem(
                f"{cell.id}: its input hash here is {digest}, the plan's is {want} (backend {self.backend.name}, "
                f"{gpu} a GPU here): its verdict would be pushed where no merge of the plan looks, so it is "
                "not run",
                fix="run the worker with the plan's stackfarm, suites and wheels (the same commit and index), "
                "or make the plan again where the workers run",
            )

    def run_cell(self, cell: Cell) -> CellReport:
        self.ui.update(cell.id, "resolve")
        artifacts = self._artifacts(cell)
        inputs = self.inputs(cell, artifacts)
        digest = input_hash(inputs)
        self._check_planned(cell, digest)
        patch_hashes = inputs["patch_sets"]
        assert isinstance(patch_hashes, dict)  # cell_inputs' own shape; narrows the type for mypy
        report = replace(
            self._unrun(cell, Status.INCOMPLETE, ""),
            wheels=tuple(
                Wheel(distribution=c.distribution, version=a.version, sha256=a.sha256, source=a.source)
                for c, a in artifacts.items()
            ),
            patch_sets={str(k): str(v) for k, v in patch_hashes.items()},
            input_hash=digest,
            selection=self.options.selection,
        )
        reused = None if self.options.realise_only else self._reuse(cell, digest)
        if reused is not None:
            return reused
        workdir = cell_workdir(self.cache.root, cell.id, digest)
        if artifacts:  # what `stackfarm cache prune --keep-runs N` keeps
            used = [p for a in artifacts.values() for p in (self.cache.blob_path(a), self.cache.tree_path(a))]
            self.cache.record_use(self.run_id, [*used, workdir])
        # One run at a time builds a cell's work dir; another run sharing the cache waits, saying so.
        with self.cache.lock(workdir, notify=self.ui.note):
            if self.options.realise_only:
                return self._realise_only(cell, artifacts, report, workdir)
            fresh = self._run_fresh(cell, artifacts, report, inputs, workdir)
        self._publish(fresh)
        return fresh

    def _realise_only(
        self, cell: Cell, artifacts: dict[Component, Artifact], report: CellReport, workdir: Path
    ) -> CellReport:
        """`run --realise-only`: the cell's stack made to exist as its run would make it (patched, realised:
        for the docker backend its image found, pulled or built, and pushed to the registry), nothing run. The
        report (what the backend realised, in backend_facts) is never saved nor pushed, and reports/<cell>/
        keeps its verdict: a realised image is not a result."""
        workdir.mkdir(parents=True, exist_ok=True)
        self._patch(
            cell, artifacts, workdir, workdir / "realise-only"
        )  # its JUnit file stays out of reports/
        self.backend.realise(cell, artifacts, workdir, lambda text: self.ui.update(cell.id, text))
        facts = self.backend.facts(cell)
        self.ui.done(cell.id, "realised", ", ".join(f"{k} {v}" for k, v in facts.as_properties().items()))
        return replace(report, reason=REALISED_ONLY, backend_facts=facts)

    def _facts(self, cell: Cell) -> verdict.BackendFacts:
        """The backend's facts of the realised cell, with the host profile the run layered over the matrix."""
        facts = self.backend.facts(cell)
        profile = self.matrix.profile
        if profile is None:
            return facts
        return replace(
            facts, profile_name=profile.name, profile_sha256=profile.sha256, profile_path=str(profile.path)
        )

    def _run_fresh(
        self,
        cell: Cell,
        artifacts: dict[Component, Artifact],
        report: CellReport,
        inputs: Mapping[str, object],
        workdir: Path,
    ) -> CellReport:
        cell_reports = self.options.reports / cell.id
        # From here on the old verdict no longer describes what is on disk: it goes first, the new one last.
        verdict.path_of(self.options.reports, cell.id).unlink(missing_ok=True)
        (cell_reports / provenance.RECORD).unlink(missing_ok=True)  # a GPU suite writes it afresh
        workdir.mkdir(parents=True, exist_ok=True)
        patch_step = self._patch(cell, artifacts, workdir, cell_reports)
        if patch_step is not None:
            report = replace(report, patches=patch_step[1])
        installed = self.backend.realise(cell, artifacts, workdir, lambda text: self.ui.update(cell.id, text))
        report = replace(report, backend_facts=self._facts(cell))
        extras = self._extras(cell)
        spec = CellSpec(
            id=cell.id,
            values=cell.as_dict(),
            backend=self.backend.name,
            components=installed,
            archs=self.matrix.archs,
            reference_arch=self.matrix.reference_arch,
            models=tuple(asdict(m) for m in self.matrix.models),
            patch_sets=tuple({"name": n, "sha256": report.patch_sets[n]} for n in cell.patch_sets),
            features=dict(self.matrix.features),
            thresholds=dict(self.matrix.thresholds),
            settings={s.name: _handed_settings(s) for s in self.matrix.suites},
            no_gpu_reason=self.no_gpu_reason,
            patched_files=self._patched_files.get(cell.id, ()),
            matrix=str(self.matrix.path.resolve()),
            deviations=tuple(d.as_dict() for d in self.matrix.deviations),
            profile=str(self.matrix.profile.path) if self.matrix.profile is not None else "",
            runner=str(kind.get("name", "")) if isinstance(kind := inputs.get("runner"), dict) else "",
            runner_kind=dict(kind) if isinstance(kind, dict) else None,
            extras=extras.extras,
            unavailable=extras.unavailable,
            platform=self.matrix.platform,
        )
        spec_path = workdir / "cell.json"
        spec.dump(spec_path)
        suites = self._run_suites(cell, spec_path, cell_reports, first=patch_step[0] if patch_step else None)
        if self.cancel.is_set():
            raise Interrupted(f"interrupted while {cell.id} ran: no verdict kept, a re-run runs it again")
        loaded = provenance.read_libraries(cell_reports)
        report = replace(report, suites=tuple(suites), loaded_libraries=loaded)
        report = self._store(verdict.judged(report), inputs)
        narrowed = f"only {report.selection}" if report.selection else ""
        self.ui.done(cell.id, str(report.status), report.first_problem() or narrowed)
        return report

    def _extras(self, cell: Cell) -> Handed:
        """The wheels the cell's suite families declare, resolved (`hand_over`), kept with the run."""
        stack = {c.distribution: c.version for c in cell.components}
        handed = hand_over(self.matrix.suites, stack, self.resolver, cell["python"], self.unreachable)
        if handed.extras:  # the trees the suites read: what `stackfarm cache prune --keep-runs N` keeps
            self.cache.record_use(self.run_id, [Path(c.root) for c in handed.extras.values()])
        return handed

    def _reuse(self, cell: Cell, digest: str) -> CellReport | None:
        """The stored verdict when it may stand for this run (same inputs, its JUnit files intact), else None.

        A host's installation can change without any input we could hash cheaply: it always runs."""
        path = verdict.path_of(self.options.reports, cell.id)
        if self.options.force or not self.backend.kind.reusable:
            return None
        if not path.is_file():
            return self._reuse_stored(cell, digest)
        try:
            stored = verdict.read(path)
        except ValueError as exc:
            self.ui.note(f"{exc}; running the cell again")
            return self._reuse_stored(cell, digest)
        if verdict.reusable(stored, digest) is not None:
            return self._reuse_stored(cell, digest)
        self.ui.done(
            cell.id, "reused", f"{stored.report.status}: inputs unchanged since run {stored.report.run_id}"
        )
        self._publish(stored.report, missing_only=True)  # computed here before the store had it
        return replace(stored.report, reused=True)

    def _reuse_stored(self, cell: Cell, digest: str) -> CellReport | None:
        """The shared store's verdict for these inputs, downloaded into reports/<cell>/, else None. A store
        that does not answer raises (the cell is an error of the environment, never silently run or not)."""
        store = self.options.store
        if store is None:
            return None
        try:
            fetched = store.fetch(cell.id, digest, self.options.reports)
        except BrokenEntry as exc:
            self.ui.note(f"{exc}; running the cell again (its push replaces the entry)")
            return None
        if fetched is None:
            return None
        self.ui.note(
            f"{cell.id}: verdict reused from {store.where} (input hash {digest[:12]}…), nothing built or run"
        )
        self.ui.done(
            cell.id, "reused", f"{fetched.report.status}: inputs unchanged since run {fetched.report.run_id}"
        )
        return replace(fetched.report, reused=True)

    def _publish(self, report: CellReport, *, missing_only: bool = False) -> None:
        """Push a verdict of a cell that ran to the shared store. A push that fails is said and counted in
        `store_problems` (the run then exits 4); the verdict stands in reports/ all the same."""
        store = self.options.store
        if store is None or not report.ran or not self.backend.kind.reusable:
            return  # a host's verdict is never reused (see _reuse): nobody may take it from the store
        try:
            if missing_only:
                with contextlib.suppress(BrokenEntry):  # a broken entry is pushed again: that repairs it
                    if store.holds(report.cell, report.input_hash):
                        return
            key = store.push(self.options.reports, report)
        except (EnvironmentProblem, ConfigError) as exc:  # unreachable, or no runner key to sign with
            line = f"{report.cell}: verdict not pushed to {store.where}: {str(exc).splitlines()[0]}"
            self.store_problems.append(line)
            self.ui.note(line)
            return
        if key is not None:
            self.ui.note(f"{report.cell}: verdict pushed to {store.where} ({key})")

    def _patch(
        self, cell: Cell, artifacts: dict[Component, Artifact], workdir: Path, out: Path
    ) -> tuple[SuiteResult, dict[str, str]] | None:
        """Apply the cell's patch sets to a copy of its sglang tree (the `patches` step, reported as JUnit):
        its result and {"set/patch": status}, or None when the cell has no patch sets."""
        if (workdir / PATCHED_SGLANG).exists():  # never a stale tree from earlier patch sets
            remove_tree(workdir / PATCHED_SGLANG)
        if not cell.patch_sets or not self.backend.kind.patchable:
            return None  # a host's installation is qualified as it is: nothing is patched there
        self.ui.update(cell.id, "patch sglang")
        sglang = next(c for c in cell.components if c.distribution == "sglang")
        tree = self.cache.unpacked(artifacts[sglang]) or self.cache.unpack(artifacts[sglang])
        sets = [ps for ps in self.matrix.patch_sets if ps.name in cell.patch_sets]
        results = patches.patched_copy(sets, tree, workdir / PATCHED_SGLANG)
        steps = [
            Step(
                name=f"{r.set}/{r.patch}",
                failure=None if r.ok else f"{r.status}: {r.detail}",
                properties={
                    f"patch.{r.set}/{r.patch}.status": r.status,
                    f"patch.{r.set}/{r.patch}.sha256": r.sha256,
                },
            )
            for r in results
        ]
        junit = out / f"{PATCH_STEP}.xml"
        write_steps(junit, cell=cell.id, suite=PATCH_STEP, steps=steps)
        applied = {(r.set, r.patch) for r in results if r.status == "applied"}
        self._patched_files[cell.id] = tuple(
            sorted(
                {
                    path
                    for ps in sets
                    for patch in patches.load_series(ps)
                    if (ps.name, patch.name) in applied
                    for fp in patch.files
                    if (path := fp.new_path or fp.old_path)
                }
            )
        )
        return read_suite(junit, cell=cell.id, suite=PATCH_STEP), {
            f"{r.set}/{r.patch}": r.status for r in results
        }

    def _run_suites(
        self, cell: Cell, spec_path: Path, out: Path, *, first: SuiteResult | None = None
    ) -> list[SuiteResult]:
        results: list[SuiteResult] = [first] if first else []
        blocked: str | None = None
        if first is not None and first.outcome in GATE_CLOSED:
            blocked = f"gated: {first.suite} did not pass ({first.first_failure or first.outcome})"
        for suite in self.matrix.suites:
            junit = out / f"{suite.name}.xml"
            record = record_path(out, suite.name)
            record.unlink(missing_ok=True)  # a record of an earlier run never stands for this one
            if self.cancel.is_set():
                blocked = blocked or "run interrupted"
            if blocked is not None:
                write_skipped_suite(junit, cell=cell.id, suite=suite.name, reason=blocked)
            elif suite.needs_gpu and self.no_gpu_reason is not None:
                write_skipped_suite(
                    junit, cell=cell.id, suite=suite.name, reason=f"needs GPU: {self.no_gpu_reason}"
                )
            else:
                self.ui.update(cell.id, f"suite {suite.name}")
                self._run_one(suite, spec_path, junit)
            # The verdict binds the suite's record (stackfarm.family) as it binds its JUnit file.
            result = replace(
                read_suite(junit, cell=cell.id, suite=suite.name), record_sha256=sha256_of(record)
            )
            results.append(result)
            if suite.gate and result.outcome in GATE_CLOSED and blocked is None:
                blocked = f"gated: {suite.name} did not pass ({result.outcome})"
        return results

    def _run_one(self, suite: Suite, spec_path: Path, junit: Path) -> None:
        # pytest writes its XML in place; write to a temp name and rename so a report is never half-written.
        tmp = junit.with_name(f".{junit.name}.running")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        log = junit.with_suffix(".log")
        try:
            outcome = self.backend.run_suite(suite.path, spec_path, tmp, suite.timeout, log)
        except proc.Stopped as exc:
            raise Interrupted(str(exc)) from None
        finally:
            # Servers and engines the suite started in sessions of their own end with it, however it ended.
            leftover = proc.reap_groups(groups_file(tmp))
        interrupted = outcome.returncode == -2 or (
            outcome.returncode == PYTEST_INTERRUPTED and "KeyboardInterrupt" in outcome.output
        )
        if interrupted or self.cancel.is_set():
            tmp.unlink(missing_ok=True)
            raise Interrupted(f"interrupted during suite {suite.name}")
        if leftover:
            self.ui.note(f"{suite.name}: killed {len(leftover)} process group(s) the suite left running")
        problem = _suite_problem(outcome, suite, ran=tmp.is_file(), log=log.name)
        if problem is not None:
            tmp.unlink(missing_ok=True)
            write_skipped_suite(junit, cell=junit.parent.name, suite=suite.name, reason=problem, kind="error")
            if outcome.returncode in (USAGE_ERROR, NO_TESTS_COLLECTED) and not outcome.timed_out:
                raise HarnessError(f"{suite.name}: {problem}; a harness error, not the suite's result")
        else:
            tmp.replace(junit)


def _handed_settings(suite: Suite) -> dict[str, Any]:
    """What the suite finds in CellSpec.settings[<name>]: its family's parsed settings as JSON, or the table as
    written for a suite without a family."""
    if suite.parsed_settings is not None:
        handed: dict[str, Any] = to_json(suite.parsed_settings)
        return handed
    return dict(suite.settings)


def _suite_problem(outcome: proc.Outcome, suite: Suite, *, ran: bool, log: str) -> str | None:
    """Why a suite's pytest run cannot be read as its result (None when its JUnit file stands)."""
    if outcome.timed_out:
        return f"suite timed out after {suite.timeout}s; its processes were killed (see {log})"
    if outcome.returncode == NO_TESTS_COLLECTED:
        return f"pytest collected no tests (exit 5): a suite that tests nothing is an error (see {log})"
    if outcome.returncode not in (0, 1, PYTEST_INTERRUPTED) or not ran:
        tail = outcome.output.strip().splitlines()[-1:] or [""]
        return f"pytest exited {outcome.returncode}: {tail[0][:200]} (see {log})"
    return None


def cell_workdir(cache_root: Path, cell_id: str, digest: str) -> Path:
    """Where a cell's patched tree and cell.json live. Keyed by the input hash too: runs of one cell id from
    different checkouts (or matrices) never share a tree."""
    return cache_root / "cells" / f"{cell_id}-{digest[:12]}"


__all__ = [
    "NO_TESTS_COLLECTED",
    "REALISED_ONLY",
    "RunOptions",
    "Runner",
    "cell_workdir",
    "gpu_unavailable_reason",
]
