"""Run the cells of a plan: realise each stack, run its suites in order with gates, keep verdicts by input hash."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from . import __version__, patches
from .artifacts import Artifact, Cache
from .backends import PATCHED_SGLANG, Backend
from .cellspec import CellSpec
from .errors import StackfarmError
from .matrix import Matrix, Suite
from .plan import Cell, Component, Plan, input_hash
from .proc import call
from .reports import (
    CellReport,
    Step,
    SuiteResult,
    read_suite,
    report_from_json,
    write_atomic,
    write_skipped_suite,
    write_steps,
)
from .resolve import Resolver
from .ui import CellProgress

#: pytest's exit code when it collected no tests: not a pass (pytest's ExitCode.NO_TESTS_COLLECTED).
NO_TESTS_COLLECTED = 5
#: pytest's exit code after Ctrl-C (ExitCode.INTERRUPTED); a signal death shows as -SIGINT.
PYTEST_INTERRUPTED = (2, -2)


#: The runner's own first step, reported like a suite (it sorts before 00-stack in every table).
PATCH_STEP = "00-patches"


class Interrupted(StackfarmError):
    """The run was interrupted while this cell ran: it keeps no verdict, so a re-run runs it again."""


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    reports: Path
    jobs: int
    force: bool = False


def gpu_unavailable_reason() -> str | None:
    """None when an NVIDIA GPU answers, else why not (the reason a GPU suite is skipped with)."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU on this machine (nvidia-smi not found)"
    outcome = call(["nvidia-smi", "-L"], timeout=30)
    if outcome.returncode != 0 or "GPU" not in outcome.output:
        return f"nvidia-smi lists no GPU ({outcome.output.strip()[:120]})"
    return None


def hash_tree(path: Path) -> str:
    """sha256 over the relative names and contents of every file under `path` (caches and bytecode excluded)."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if "__pycache__" in file.parts or file.suffix == ".pyc":
            continue
        digest.update(str(file.relative_to(path.parent)).encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


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
        self.finished: dict[str, CellReport] = {}
        self._patched_files: dict[str, tuple[str, ...]] = {}

    # -- the whole plan ---------------------------------------------------------------------------------------

    def run(self, plan: Plan) -> list[CellReport]:
        """Every cell's report, sorted by id. On Ctrl-C, `self.finished` keeps the cells that completed."""
        reports = self.finished
        for conflict in plan.conflicts:
            reports[conflict.cell.id] = CellReport(
                cell=conflict.cell.id,
                status="conflict",
                reason="; ".join(conflict.problems),
                properties=_values(conflict.cell),
                suites=(),
            )
            self.ui.done(conflict.cell.id, "conflict", conflict.problems[0])
        for excluded in plan.excluded:
            reports[excluded.cell.id] = CellReport(
                cell=excluded.cell.id,
                status="excluded",
                reason=excluded.reason,
                properties=_values(excluded.cell),
                suites=(),
            )
        pool = ThreadPoolExecutor(max_workers=max(1, self.options.jobs), thread_name_prefix="cell")
        futures: dict[str, Future[CellReport]] = {c.id: pool.submit(self._guarded, c) for c in plan.cells}
        try:
            for cell_id, future in futures.items():
                reports[cell_id] = future.result()
        except KeyboardInterrupt:
            # Stop starting cells; running suites got the same SIGINT from the terminal. Keep what finished.
            self.cancel.set()
            pool.shutdown(wait=True, cancel_futures=True)
            for cell_id, future in futures.items():
                if future.done() and not future.cancelled() and future.exception() is None:
                    reports[cell_id] = future.result()
            raise
        pool.shutdown()
        return [reports[k] for k in sorted(reports)]

    def _guarded(self, cell: Cell) -> CellReport:
        """One broken cell never stops the others: any failure becomes that cell's error verdict."""
        if self.cancel.is_set():
            return self._error(cell, "interrupted before it started")
        try:
            report = self.run_cell(cell)
        except StackfarmError as exc:
            report = self._error(cell, str(exc))
        except Exception as exc:
            report = self._error(cell, f"{type(exc).__name__}: {exc}")
        return report

    def _error(self, cell: Cell, reason: str) -> CellReport:
        self.ui.done(cell.id, "error", reason.splitlines()[0])
        return CellReport(cell=cell.id, status="error", reason=reason, properties=_values(cell), suites=())

    # -- one cell ---------------------------------------------------------------------------------------------

    def _artifacts(self, cell: Cell) -> dict[Component, Artifact]:
        found: dict[Component, Artifact] = {}
        if not self.backend.needs_artifacts:
            return found
        for comp in cell.components:
            key = (comp.distribution, comp.version)
            if key in self.unreachable:
                raise StackfarmError(self.unreachable[key])
            found[comp] = self.resolver.artifact(comp, cell["python"])
        return found

    def inputs(self, cell: Cell, artifacts: dict[Component, Artifact]) -> dict[str, object]:
        return cell_inputs(
            self.matrix, cell, artifacts, backend=self.backend.name, gpu=self.no_gpu_reason is None
        )

    def run_cell(self, cell: Cell) -> CellReport:
        cell_reports = self.options.reports / cell.id
        verdict_file = cell_reports / "verdict.json"
        self.ui.update(cell.id, "resolve")
        artifacts = self._artifacts(cell)
        inputs = self.inputs(cell, artifacts)
        digest = input_hash(inputs)
        properties = {**_values(cell), **_artifact_properties(artifacts), "stackfarm.input_hash": digest}
        patch_hashes = inputs["patch_sets"]
        assert isinstance(patch_hashes, dict)  # cell_inputs' own shape; narrows the type for mypy
        properties.update({f"patches.{name}.sha256": str(sha) for name, sha in patch_hashes.items()})
        # A host's installation can change without any input we could hash cheaply: it always runs.
        reusable = self.backend.needs_artifacts and not self.options.force
        if reusable and verdict_file.is_file():
            stored = json.loads(verdict_file.read_text(encoding="utf-8"))
            if stored.get("input_hash") == digest:
                report = report_from_json(stored["report"])
                self.ui.done(cell.id, "reused", "inputs unchanged since the last run")
                return CellReport(
                    cell=cell.id,
                    status="reused",
                    reason="",
                    properties=report.properties,
                    suites=report.suites,
                )
        workdir = cell_workdir(self.cache.root, cell.id, digest)
        workdir.mkdir(parents=True, exist_ok=True)
        patch_step = self._patch(cell, artifacts, workdir, cell_reports)
        if patch_step is not None:
            properties.update(patch_step[1])
        installed = self.backend.realise(cell, artifacts, workdir, lambda text: self.ui.update(cell.id, text))
        properties.update(self.backend.properties(cell))
        spec = CellSpec(
            id=cell.id,
            values=cell.as_dict(),
            backend=self.backend.name,
            components=installed,
            archs=self.matrix.archs,
            reference_arch=self.matrix.reference_arch,
            models=tuple(asdict(m) for m in self.matrix.models),
            patch_sets=tuple(
                {"name": n, "sha256": properties[f"patches.{n}.sha256"]} for n in cell.patch_sets
            ),
            features=dict(self.matrix.features),
            thresholds=dict(self.matrix.thresholds),
            settings={s.name: dict(s.settings) for s in self.matrix.suites},
            no_gpu_reason=self.no_gpu_reason,
            patched_files=self._patched_files.get(cell.id, ()),
        )
        spec_path = workdir / "cell.json"
        spec.dump(spec_path)
        suites = self._run_suites(cell, spec_path, cell_reports, first=patch_step[0] if patch_step else None)
        report = CellReport(
            cell=cell.id, status="ran", reason="", properties=properties, suites=tuple(suites)
        )
        write_atomic(
            verdict_file,
            json.dumps(
                {"input_hash": digest, "inputs": inputs, "report": asdict(report)}, default=str, indent=1
            ),
        )
        verdict = "passed" if cell_passed(report) else "failed"
        first = next(
            (f"{s.suite}: {s.first_failure or s.outcome}" for s in suites if s.outcome != "passed"), ""
        )
        self.ui.done(cell.id, verdict, first)
        return report

    def _patch(
        self, cell: Cell, artifacts: dict[Component, Artifact], workdir: Path, out: Path
    ) -> tuple[SuiteResult, dict[str, str]] | None:
        """Apply the cell's patch sets to a copy of its sglang tree (the `patches` step, reported as JUnit)."""
        shutil.rmtree(
            workdir / PATCHED_SGLANG, ignore_errors=True
        )  # never a stale tree from earlier patch sets
        if not cell.patch_sets or not self.backend.needs_artifacts:
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
        return read_suite(junit, cell=cell.id, suite=PATCH_STEP), patches.junit_properties(results)

    def _run_suites(
        self, cell: Cell, spec_path: Path, out: Path, *, first: SuiteResult | None = None
    ) -> list[SuiteResult]:
        results: list[SuiteResult] = [first] if first else []
        blocked: str | None = None
        if first is not None and first.outcome != "passed":
            blocked = f"gated: {first.suite} did not pass ({first.first_failure or first.outcome})"
        for suite in self.matrix.suites:
            junit = out / f"{suite.name}.xml"
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
            result = read_suite(junit, cell=cell.id, suite=suite.name)
            results.append(result)
            if suite.gate and result.outcome != "passed" and blocked is None:
                blocked = f"gated: {suite.name} did not pass ({result.outcome})"
        return results

    def _run_one(self, suite: Suite, spec_path: Path, junit: Path) -> None:
        # pytest writes its XML in place; write to a temp name and rename so a report is never half-written.
        tmp = junit.with_name(f".{junit.name}.running")
        tmp.unlink(missing_ok=True)
        log = junit.with_suffix(".log")
        outcome = self.backend.run_suite(suite.path, spec_path, tmp, suite.timeout, log)
        problem = None
        if outcome.returncode in PYTEST_INTERRUPTED or self.cancel.is_set():
            tmp.unlink(missing_ok=True)
            raise Interrupted(f"interrupted during suite {suite.name}")
        if outcome.timed_out:
            problem = f"suite timed out after {suite.timeout}s (see {log.name})"
        elif outcome.returncode == NO_TESTS_COLLECTED:
            problem = "pytest collected no tests (exit 5): a suite that tests nothing is an error"
        elif outcome.returncode not in (0, 1) or not tmp.is_file():
            tail = outcome.output.strip().splitlines()[-1:] or [""]
            problem = f"pytest exited {outcome.returncode}: {tail[0][:200]} (see {log.name})"
        if problem is not None:
            tmp.unlink(missing_ok=True)
            write_skipped_suite(junit, cell=junit.parent.name, suite=suite.name, reason=problem, kind="error")
        else:
            tmp.replace(junit)


def cell_workdir(cache_root: Path, cell_id: str, digest: str) -> Path:
    """Where a cell's patched tree and cell.json live. Keyed by the input hash too: runs of one cell id from
    different checkouts (or matrices) never share a tree."""
    return cache_root / "cells" / f"{cell_id}-{digest[:12]}"


def cell_inputs(
    matrix: Matrix, cell: Cell, artifacts: Mapping[Component, Artifact], *, backend: str, gpu: bool
) -> dict[str, object]:
    """Everything a cell's verdict depends on; its hash decides whether a verdict can be reused."""
    conftest = matrix.root / "suites" / "conftest.py"
    return {
        "stackfarm": __version__,
        "backend": backend,
        "values": cell.as_dict(),
        "artifacts": {c.distribution: a.sha256 for c, a in artifacts.items()},
        "patch_sets": {ps.name: hash_tree(ps.path) for ps in matrix.patch_sets if ps.name in cell.patch_sets},
        "suites": {
            **{s.name: hash_tree(s.path) for s in matrix.suites},
            "conftest": hash_tree(conftest) if conftest.exists() else "",
        },
        "suite_settings": [asdict(s) | {"path": s.path.name} for s in matrix.suites],
        "archs": [matrix.archs, matrix.reference_arch],
        "models": [asdict(m) for m in matrix.models],
        "features": matrix.features,
        "thresholds": matrix.thresholds,
        "overridden": cell.overridden,
        "gpu": gpu,
    }


def _values(cell: Cell) -> dict[str, str]:
    props = {f"axis.{k}": v for k, v in cell.values}
    for note in cell.overridden:
        props.setdefault("overridden", "")
        props["overridden"] += note + "; "
    return props


def _artifact_properties(artifacts: dict[Component, Artifact]) -> dict[str, str]:
    props = {}
    for comp, art in artifacts.items():
        props[f"{comp.distribution}.version"] = art.version
        props[f"{comp.distribution}.sha256"] = art.sha256
        props[f"{comp.distribution}.source"] = art.source
    return props


def cell_passed(report: CellReport) -> bool:
    """A cell passes only when it ran (or was reused) and every suite passed: a skip is not a pass."""
    return report.status in ("ran", "reused") and all(s.outcome == "passed" for s in report.suites)


__all__ = [
    "NO_TESTS_COLLECTED",
    "RunOptions",
    "Runner",
    "cell_inputs",
    "cell_passed",
    "cell_workdir",
    "gpu_unavailable_reason",
    "hash_tree",
]
