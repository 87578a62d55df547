"""The verdict of a cell, owned once: its typed result and each suite's, the one rule that turns suite results
into a cell verdict, the exit code a run returns, and the one store (``reports/<cell>/verdict.json``) that writes
and reads it. Every reader (runner, summaries, HTML report, history, qualification, CI annotations) goes
through this module.

The rule (also in the README):

- a **suite** passes when it ran, at least one testcase ran, none failed or errored, and every skipped testcase
  was marked "does not apply" (``suitekit.not_applicable``). A suite with other skips is *incomplete*
  (*skipped* when nothing else ran); a suite whose every testcase does not apply is *not_applicable*;
- a **cell** passes only when every enabled suite ran and passed (or did not apply); a failed or errored suite
  makes it *failed*; zero suites run is *incomplete*, never passed; a skipped required testcase (no GPU, a gate,
  an undecidable question) makes it *incomplete*. A cell that never ran is *conflict*, *excluded* or *error*
  (with its cause: the environment, or stackfarm itself).
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .errors import ExitCode
from .files import write_atomic
from .provenance import LoadedLibrary

if TYPE_CHECKING:  # junitparser is imported where a JUnit file is read: planning needs only packaging
    from . import junit

Outcome = Literal["passed", "failed", "error", "skipped", "incomplete", "not_applicable"]
#: The name of a cell's stored verdict inside its reports folder.
VERDICT = "verdict.json"
#: The store's format: 1 was a flat bag of properties with status "ran"/"reused"; 2 is this module's record;
#: 3 adds a conflict's typed contradictions and the matrix line of a cell that never ran (a format 2 record
#: loads with none) and stores the backend's facts as `BackendFacts` fields (a format 2 record's bag of
#: "docker.image"-style properties loads into them).
FORMAT = 3


class Status(str, enum.Enum):
    """A cell's verdict."""

    PASSED = "passed"
    FAILED = "failed"
    INCOMPLETE = "incomplete"
    CONFLICT = "conflict"
    EXCLUDED = "excluded"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


class Cause(str, enum.Enum):
    """Why a cell has the status `error`: the exit code differs."""

    NONE = ""
    #: The environment stood in the way: an index unreachable, the engine down, the cache unusable.
    ENVIRONMENT = "environment"
    #: stackfarm or the cell's own inputs failed (a bug, a patch series that cannot be read, ...).
    INTERNAL = "internal"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, kw_only=True)
class SuiteResult:
    """One suite of one cell, as its JUnit file says and the rule judges it."""

    cell: str
    suite: str  # e.g. "00-stack"
    outcome: Outcome
    tests: int
    failures: int
    errors: int
    #: Skipped testcases that owed an answer (they keep the cell from passing).
    skipped: int
    time: float
    #: "testname: first line" of the first failure (or, for incomplete suites, the first skip), or None.
    first_failure: str | None
    xml: Path | None  # the per-suite JUnit file, if one exists
    #: Skipped testcases that do not apply to this cell (they do not count against it).
    not_applicable: int = 0
    #: sha256 of the JUnit file this result summarises.
    sha256: str | None = None
    #: sha256 of the suite's record (``<suite>.json``, stackfarm.family) when it wrote one: the report renders
    #: only a record with these bytes.
    record_sha256: str | None = None

    @property
    def passed(self) -> int:
        return max(self.tests - self.failures - self.errors - self.skipped - self.not_applicable, 0)


@dataclass(frozen=True, kw_only=True)
class Wheel:
    """One artifact a cell was computed from."""

    distribution: str
    version: str
    sha256: str
    source: str


@dataclass(frozen=True, kw_only=True)
class BackendFacts:
    """What the backend says of the stack it realised, each None where it says nothing. Written as JUnit
    properties named ``<backend>.<fact>`` ("docker.image_digest": the field's first "_" becomes a ".")."""

    #: docker: the image's tag, its content id ("sha256:..."), and its digest in a registry when pushed.
    docker_image: str | None = None
    docker_image_digest: str | None = None
    docker_repo_digest: str | None = None
    #: host: the interpreter the suites ran under (its version, its path).
    host_python: str | None = None
    host_python_path: str | None = None
    #: local: the interpreter of the cell's python value (version, path, where it was found).
    local_python: str | None = None
    local_python_path: str | None = None
    local_python_source: str | None = None
    #: --profile: the host profile layered over the matrix at the run (stackfarm.profile).
    profile_name: str | None = None
    profile_sha256: str | None = None
    profile_path: str | None = None

    def as_properties(self) -> dict[str, str]:
        """The facts given, as JUnit properties ("docker.image" -> tag), in field order."""
        return {
            f.name.replace("_", ".", 1): value
            for f in fields(self)
            if (value := getattr(self, f.name)) is not None
        }

    @classmethod
    def from_properties(cls, props: Mapping[str, str], *, lenient: bool = False) -> BackendFacts:
        """The facts of a backend's properties (`Backend.properties`, a profile's `as_facts`). A key with no
        field raises ValueError: a new fact needs its field. `lenient` (old records) leaves such keys out."""
        names = {f.name.replace("_", ".", 1): f.name for f in fields(cls)}
        unknown = sorted(k for k in props if k not in names)
        if unknown and not lenient:
            raise ValueError(f"backend facts without a BackendFacts field: {', '.join(unknown)}")
        return cls(**{names[k]: str(v) for k, v in props.items() if k in names})


@dataclass(frozen=True, kw_only=True)
class Contradiction:
    """One of sglang's own pins that a cell's components contradict (what makes a cell a *conflict*)."""

    #: The axis whose value contradicts the pin ("torch").
    axis: str
    #: sglang's requirement as its wheel declares it ("torch==2.9.1").
    requirement: str
    #: The problem as people read it ("sglang 0.5.9 requires torch==2.9.1; the cell has torch 2.8.0").
    text: str


@dataclass(frozen=True, kw_only=True)
class SourceLine:
    """A place in a config file: where the matrix declares a cell that never ran."""

    path: str
    #: 1-based; None when only the file is known.
    line: int | None = None


@dataclass(frozen=True, kw_only=True)
class CellReport:
    """The verdict of one cell and everything it was computed from."""

    cell: str
    status: Status
    #: Why, when the cell did not pass ("" when it passed).
    reason: str = ""
    cause: Cause = Cause.NONE
    #: True when this verdict was stored by an earlier run with the same inputs.
    reused: bool = False
    values: Mapping[str, str] = field(default_factory=dict)
    wheels: tuple[Wheel, ...] = ()
    #: Patch set -> sha256 of its folder; "set/patch" -> the status the patch step gave.
    patch_sets: Mapping[str, str] = field(default_factory=dict)
    patches: Mapping[str, str] = field(default_factory=dict)
    backend: str = ""
    #: What the backend says of the realised stack (the docker image, the host's python, the profile, ...).
    backend_facts: BackendFacts = field(default_factory=BackendFacts)
    overridden: tuple[str, ...] = ()
    input_hash: str = ""
    #: The run that computed this verdict (a reused verdict keeps the run it came from).
    run_id: str = ""
    #: Why no GPU was usable (None when one was).
    no_gpu_reason: str | None = None
    suites: tuple[SuiteResult, ...] = ()
    #: The shared libraries a real process of the cell loaded (SONAME, path, build-id; stackfarm.provenance),
    #: recorded on GPU runs; empty where none ran.
    loaded_libraries: tuple[LoadedLibrary, ...] = ()
    #: The `--suites` selection the run was narrowed to ("" = every suite of the matrix): a verdict of the
    #: selected suites only, shown as such ("passed (only 00-*)") and never one a qualification accepts.
    selection: str = ""
    #: A conflict's contradicted pins (empty for every other status).
    contradictions: tuple[Contradiction, ...] = ()
    #: Where the matrix declares a cell that never ran: a conflict's [[include]] or [axes] line, a config
    #: error's file and line (None when not known).
    declared_at: SourceLine | None = None

    @property
    def ran(self) -> bool:
        """The cell was realised and its suites judged (whatever the outcome)."""
        return self.status in (Status.PASSED, Status.FAILED, Status.INCOMPLETE)

    @property
    def image_digest(self) -> str | None:
        return self.backend_facts.docker_image_digest

    @property
    def properties(self) -> dict[str, str]:
        """The flat view written as JUnit testsuite properties (for JUnit consumers; readers use the fields)."""
        props = {f"axis.{k}": v for k, v in self.values.items()}
        for w in self.wheels:
            props |= {f"{w.distribution}.version": w.version, f"{w.distribution}.sha256": w.sha256}
            props[f"{w.distribution}.source"] = w.source
        props |= {f"patches.{name}.sha256": sha for name, sha in self.patch_sets.items()}
        props |= {f"patch.{name}.status": status for name, status in self.patches.items()}
        props |= self.backend_facts.as_properties()
        return props | {key: value for key, value in self._run_properties().items() if value}

    def _run_properties(self) -> dict[str, str]:
        """The run's own properties, written only when set ("" leaves one out)."""
        return {
            "overridden": "; ".join(self.overridden),
            "stackfarm.backend": self.backend,
            "stackfarm.input_hash": self.input_hash,
            "stackfarm.run_id": self.run_id,
            "provenance.loaded_libraries": str(len(self.loaded_libraries)) if self.loaded_libraries else "",
            "stackfarm.suites": self.selection,
        }

    def status_text(self) -> str:
        """The status as people read it: "passed", or "passed (only 00-*)" for a narrowed run."""
        return f"{self.status} (only {self.selection})" if self.selection else str(self.status)

    def first_problem(self) -> str:
        """The one line that says why the cell is not green ("" when it is)."""
        if self.reason or not self.ran:
            return self.reason
        for s in self.suites:
            if s.outcome not in ("passed", "not_applicable"):
                return f"{s.suite}: {s.first_failure or s.outcome}"
        return ""


# --------------------------------------------------------------------------- the rule


def suite_outcome(counts: junit.Counts) -> tuple[Outcome, str | None]:
    """A suite's outcome from its JUnit counts, and the line that explains it (None when it passed)."""
    if counts.errors:
        return "error", counts.first_failure
    if counts.failures:
        return "failed", counts.first_failure
    if counts.tests == 0:
        return "error", "no tests ran"
    if counts.skipped:
        nothing_else = counts.skipped + counts.not_applicable >= counts.tests
        return ("skipped" if nothing_else else "incomplete"), counts.first_skip
    if counts.not_applicable >= counts.tests:
        return "not_applicable", None
    return "passed", None


def read_suite(path: Path, *, cell: str, suite: str) -> SuiteResult:
    """Judge one per-suite JUnit file. A missing or unreadable file is an "error" with zero tests."""
    from . import junit

    try:
        counts = junit.count(path)
    except junit.UNREADABLE as exc:
        why = "no JUnit report" if not path.exists() else f"unreadable JUnit report ({exc})"
        return SuiteResult(
            cell=cell,
            suite=suite,
            outcome="error",
            tests=0,
            failures=0,
            errors=0,
            skipped=0,
            time=0.0,
            first_failure=f"{suite}: {why}",
            xml=path if path.exists() else None,
        )
    outcome, explained = suite_outcome(counts)
    return SuiteResult(
        cell=cell,
        suite=suite,
        outcome=outcome,
        tests=counts.tests,
        failures=counts.failures,
        errors=counts.errors,
        skipped=counts.skipped,
        not_applicable=counts.not_applicable,
        time=counts.time,
        first_failure=explained,
        xml=path,
        sha256=counts.sha256,
    )


def cell_status(suites: Sequence[SuiteResult]) -> tuple[Status, str]:
    """The one rule: passed only when every enabled suite ran and passed (or did not apply)."""
    for s in suites:
        if s.outcome in ("failed", "error"):
            return Status.FAILED, f"{s.suite}: {s.first_failure or s.outcome}"
    if not any(s.outcome != "not_applicable" for s in suites):
        return Status.INCOMPLETE, "no suite ran: a cell with zero suites is not a pass"
    for s in suites:
        if s.outcome in ("skipped", "incomplete"):
            return Status.INCOMPLETE, f"{s.suite}: {s.first_failure or s.outcome}"
    return Status.PASSED, ""


def judged(report: CellReport) -> CellReport:
    """`report` with its status and reason set from its suites by the rule (cells that ran only)."""
    status, reason = cell_status(report.suites)
    return replace(report, status=status, reason=reason)


def exit_code(reports: Iterable[CellReport], *, whole: bool = False) -> ExitCode:
    """What a run of these cells returns: failed > environment error > incomplete > ok.

    `whole`: the cells stand for the matrix as a whole (a merged report's gate), so a verdict of a `--suites`
    run covers too little: its pass counts as incomplete. A `run --suites` itself answers what it was asked."""
    statuses = [(_gated(r, whole), r.cause) for r in reports if r.status is not Status.EXCLUDED]
    if any(_cell_failed(s, c) for s, c in statuses):
        return ExitCode.CELLS_FAILED
    if any(s is Status.ERROR for s, _ in statuses):
        return ExitCode.ENVIRONMENT
    if not statuses or any(s is Status.INCOMPLETE for s, _ in statuses):
        return ExitCode.INCOMPLETE
    return ExitCode.OK


def _gated(report: CellReport, whole: bool) -> Status:
    """The status the exit code counts: a narrowed pass is incomplete for the matrix as a whole."""
    return (
        Status.INCOMPLETE if whole and report.selection and report.status is Status.PASSED else report.status
    )


def _cell_failed(status: Status, cause: Cause) -> bool:
    """Failed, a conflict, or an error that is not the environment's."""
    return status in (Status.FAILED, Status.CONFLICT) or (
        status is Status.ERROR and cause is not Cause.ENVIRONMENT
    )


def exit_reasons(reports: Iterable[CellReport], *, whole: bool = False) -> list[str]:
    """Why `exit_code` is not 0: one line per cell that keeps it from passing (its status and first reason),
    worst first, in the order of the exit code's precedence."""
    rank = {ExitCode.CELLS_FAILED: 0, ExitCode.ENVIRONMENT: 1, ExitCode.INCOMPLETE: 2}
    lines: list[tuple[int, str]] = []
    for r in reports:
        if r.status is Status.EXCLUDED:
            continue
        if whole and r.selection and r.status is Status.PASSED:
            lines.append(
                (
                    2,
                    f"{r.cell}: incomplete: it passed only the suites of --suites {r.selection!r}, "
                    "not every suite of the cell",
                )
            )
            continue
        code = exit_code([r])
        if code is not ExitCode.OK:
            why = (r.reason or "no reason recorded").splitlines()[0]
            lines.append((rank[code], f"{r.cell}: {r.status}: {why}"))
    return [line for _, line in sorted(lines, key=lambda x: x[0])]


def counts(reports: Iterable[CellReport]) -> dict[Status, int]:
    """How many cells have each status, in the Status order."""
    found: dict[Status, int] = {}
    for r in reports:
        found[r.status] = found.get(r.status, 0) + 1
    return {s: found[s] for s in Status if s in found}


def totals(reports: Sequence[CellReport]) -> str:
    """ "6 cells: 3 failed, 1 conflict, 2 error" — the one line every summary prints."""
    head = f"{len(reports)} cell{'' if len(reports) == 1 else 's'}"
    parts = [f"{n} {s}" for s, n in counts(reports).items()]
    return f"{head}: {', '.join(parts)}" if parts else head


# --------------------------------------------------------------------------- the store


@dataclass(frozen=True, kw_only=True)
class Stored:
    """A verdict as the store holds it."""

    report: CellReport
    inputs: Mapping[str, Any]
    input_hash: str
    path: Path


def to_json(report: CellReport) -> dict[str, Any]:
    data = asdict(report)
    data["status"], data["cause"] = str(report.status), str(report.cause)
    data["backend_facts"] = {k: v for k, v in data["backend_facts"].items() if v is not None}
    data["suites"] = [{**asdict(s), "xml": str(s.xml) if s.xml else None} for s in report.suites]
    return data


def from_json(data: Mapping[str, Any]) -> CellReport:
    """A CellReport from its JSON form (format 2, or the flat format 1 of earlier runs)."""
    suites = tuple(
        SuiteResult(**{**s, "xml": Path(s["xml"]) if s.get("xml") else None}) for s in data.get("suites", ())
    )
    if "properties" in data:  # format 1
        return _from_format_1(data, suites)
    return CellReport(
        **{
            **data,
            "status": Status(data["status"]),
            "cause": Cause(data.get("cause", "")),
            "wheels": tuple(Wheel(**w) for w in data.get("wheels", ())),
            "backend_facts": _facts(data.get("backend_facts") or {}),
            "overridden": tuple(data.get("overridden", ())),
            "suites": suites,
            "loaded_libraries": tuple(LoadedLibrary(**x) for x in data.get("loaded_libraries", ())),
            # format 3 (a format 2 record has neither)
            "contradictions": tuple(Contradiction(**c) for c in data.get("contradictions", ())),
            "declared_at": SourceLine(**data["declared_at"]) if data.get("declared_at") else None,
        }
    )


def _facts(data: Mapping[str, str]) -> BackendFacts:
    """Format 3 stores the fields; format 2 stored the properties' bag ("docker.image": ...)."""
    if any("." in key for key in data):
        return BackendFacts.from_properties(data, lenient=True)
    return BackendFacts(**data)


def _named(props: Mapping[str, str], prefix: str, suffix: str = "") -> dict[str, str]:
    """The properties called ``<prefix><name><suffix>``, by name."""
    return {
        k.removeprefix(prefix).removesuffix(suffix): v
        for k, v in props.items()
        if k.startswith(prefix) and k.endswith(suffix)
    }


def _format_1_wheels(props: Mapping[str, str]) -> tuple[Wheel, ...]:
    """Format 1's wheels: every ``<distribution>.sha256`` property that is not a patch's or stackfarm's."""
    dists = sorted(
        k.removesuffix(".sha256")
        for k in props
        if k.endswith(".sha256") and not k.startswith(("patch", "stackfarm."))
    )
    return tuple(
        Wheel(
            distribution=d,
            version=props.get(f"{d}.version", ""),
            sha256=props[f"{d}.sha256"],
            source=props.get(f"{d}.source", ""),
        )
        for d in dists
    )


def _from_format_1(data: Mapping[str, Any], suites: tuple[SuiteResult, ...]) -> CellReport:
    props: Mapping[str, str] = data["properties"]
    facts = {k: v for k, v in props.items() if k.split(".")[0] in ("docker", "image", "host")}
    report = CellReport(
        cell=data["cell"],
        status=Status.ERROR if data["status"] not in ("ran", "reused") else Status.PASSED,
        reason=data.get("reason", ""),
        reused=data["status"] == "reused",
        values=_named(props, "axis."),
        wheels=_format_1_wheels(props),
        patch_sets=_named(props, "patches.", ".sha256"),
        patches=_named(props, "patch.", ".status"),
        backend_facts=BackendFacts.from_properties(facts, lenient=True),
        input_hash=props.get("stackfarm.input_hash", ""),
        suites=suites,
    )
    if data["status"] in ("conflict", "excluded", "error"):
        return replace(report, status=Status(data["status"]))
    return judged(report)


def input_hash(parts: Mapping[str, object]) -> str:
    """The key of a verdict: a stable hash of everything it depends on (the inputs it records)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def path_of(reports_dir: Path, cell: str) -> Path:
    return reports_dir / cell / VERDICT


def save(reports_dir: Path, report: CellReport, inputs: Mapping[str, Any] | None = None) -> Path:
    """Store a cell's verdict, atomically, last of everything its run writes."""
    path = path_of(reports_dir, report.cell)
    record = {
        "format": FORMAT,
        "input_hash": report.input_hash,
        "run_id": report.run_id,
        "inputs": dict(inputs or {}),
        "report": to_json(report),
    }
    write_atomic(path, json.dumps(record, default=str, indent=1))
    return path


def parse(raw: bytes | str, where: Path) -> Stored:
    """A stored verdict's record as written, NOT re-judged (the store reads it so to learn which JUnit files
    to fetch); raises ValueError naming `where`. Everything else reads through `read`."""
    try:
        data = json.loads(raw)
        report = from_json(data["report"])
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: cannot read the verdict ({exc})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{where}: not a verdict ({type(exc).__name__}: {exc})") from None
    inputs = data.get("inputs")
    return Stored(
        report=report,
        inputs=inputs if isinstance(inputs, Mapping) else {},
        input_hash=str(data.get("input_hash") or report.input_hash),
        path=where,
    )


def read(path: Path) -> Stored:
    """One stored verdict, re-judged; raises ValueError (with the file named) when it cannot be used.

    Nothing stored is believed: the status of a cell that ran must be what the rule gives for the JUnit files
    beside it (`rejudge_problem`). Whether it may stand for a new run (its key recomputed from its inputs, its
    JUnit files the ones it summarised) is `reusable`'s question."""
    stored, problem = _read_judged(path)
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    return stored


def _read_judged(path: Path) -> tuple[Stored, str | None]:
    """The verdict re-judged from its JUnit files, and why its stored status cannot stand (None: it can)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the verdict ({exc.strerror or exc})") from None
    stored = parse(raw, path)
    fresh = rejudged(stored)  # each JUnit file read once
    return replace(stored, report=fresh), _disagreement(stored, fresh)


def key_problem(stored: Stored) -> str | None:
    """Why the record's key is not the hash of the inputs it records (None when it is). A verdict of a cell
    that never ran (an error, a conflict) records no inputs and is never reused: its key is not checked."""
    report = stored.report
    if not report.ran:
        return None
    if report.input_hash != stored.input_hash:
        return (
            f"the report's input hash {report.input_hash[:12]}… is not the record's {stored.input_hash[:12]}…"
        )
    if not stored.inputs:
        return "the verdict records no inputs: its key cannot be recomputed"
    actual = input_hash(stored.inputs)
    if actual != stored.input_hash:
        return (
            f"its inputs hash to {actual[:12]}…, not to the key it is stored under ({stored.input_hash[:12]}…): "
            "the record was edited"
        )
    return None


def _junit_of(stored: Stored, suite: SuiteResult) -> Path:
    return stored.path.parent / f"{suite.suite}.xml"


def rejudged(stored: Stored) -> CellReport:
    """The stored report with every suite re-read from its JUnit file beside the verdict and the cell's status
    given by the rule (`cell_status`); a cell that never ran has no suites to judge and is returned as is."""
    report = stored.report
    if not report.ran:
        return report
    suites = tuple(
        _kept_texts(s, read_suite(_junit_of(stored, s), cell=report.cell, suite=s.suite))
        for s in report.suites
    )
    return judged(replace(report, suites=suites))


def _kept_texts(stored: SuiteResult, fresh: SuiteResult) -> SuiteResult:
    """The fresh counts and outcome, with what the record binds kept: the JUnit hash it was computed from (so
    `reusable` still sees a file that changed), its time, and its explanation where both say the same."""
    kept = replace(
        fresh,
        sha256=stored.sha256 if stored.sha256 is not None else fresh.sha256,
        time=stored.time,
        record_sha256=stored.record_sha256,
    )
    if fresh.outcome == stored.outcome and stored.first_failure:
        return replace(kept, first_failure=stored.first_failure)
    return kept


def rejudge_problem(stored: Stored) -> str | None:
    """Why the stored status cannot stand (None when the JUnit files give the same): a status or a suite
    outcome that is not what its JUnit file says, or a suite of the recorded inputs without a result."""
    return _disagreement(stored, rejudged(stored))


def _disagreement(stored: Stored, fresh: CellReport) -> str | None:
    """`rejudge_problem` for a stored verdict and its re-judged report (`rejudged(stored)`)."""
    report = stored.report
    if not report.ran:
        if report.suites:
            return f"a cell stored as {report.status} records suite results: a verdict of a cell that ran was edited"
        return None
    if missing := _suites_without_result(stored):
        return f"the verdict has no result for suite(s) {', '.join(missing)} of its inputs"
    for old, new in zip(report.suites, fresh.suites, strict=True):
        if old.outcome != new.outcome:
            where = _junit_of(stored, old)
            return f"{old.suite}: stored {old.outcome}, its JUnit file {where.name} says {new.outcome}"
    if fresh.status != report.status:
        return f"stored status {report.status}, re-judged from its JUnit files: {fresh.status}" + (
            f" ({fresh.reason})" if fresh.reason else ""
        )
    return None


def _suites_without_result(stored: Stored) -> list[str]:
    """The suites of the recorded inputs (conftest aside) that the verdict has no result for."""
    recorded = stored.inputs.get("suites")
    if not isinstance(recorded, Mapping):
        return []
    have = {s.suite for s in stored.report.suites}
    return sorted(str(name) for name in recorded if name != "conftest" and name not in have)


def _verdict_files(reports_dir: Path) -> tuple[list[Path], list[str]]:
    """Every <cell>/verdict.json under a reports folder, and one line per place that cannot be looked into (a
    cell folder that cannot be listed): a verdict no reader can see is named, never taken for no verdict. A
    link to nothing is listed: reading it says why it is unusable."""
    try:
        folders = sorted(p for p in reports_dir.iterdir() if p.is_dir())
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{reports_dir}: cannot list the reports folder ({exc.strerror or exc})"]
    paths, problems = [], []
    for folder in folders:
        path = folder / VERDICT
        try:
            os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(f"{path}: cannot read the verdict ({exc.strerror or exc})")
            continue
        paths.append(path)
    return paths, problems


def read_all(reports_dir: Path, *, judge: bool = True, shown: bool = False) -> tuple[list[Stored], list[str]]:
    """Every stored verdict under a reports folder, sorted by cell, and one line per file that is unusable.

    Each is re-judged (`read`): one whose stored status is not what its JUnit files give is left out, named.
    `shown=True` (reports and histories people read) keeps it with the re-judged status instead, still named:
    the truth is shown, never the stored claim. `judge=False` gives the records as written, not re-judged:
    only for estimates (a cell's past duration orders a fan-out), never for a verdict, a report or a gate."""
    found: list[Stored] = []
    paths, problems = _verdict_files(reports_dir)
    for path in paths:
        try:
            if not judge:
                found.append(parse(path.read_bytes(), path))
                continue
            stored, problem = _read_judged(path)
        except (ValueError, OSError) as exc:
            problems.append(str(exc))
            continue
        if problem is not None:
            problems.append(f"{path}: {problem}" + ("; shown as re-judged" if shown else "; left out"))
            if not shown:
                continue
        found.append(stored)
    return sorted(found, key=lambda s: s.report.cell), problems


def reusable(stored: Stored, input_hash: str) -> str | None:
    """None when a stored verdict may stand for a new run with these inputs, else why not.

    Only a verdict of a cell that ran (passed, failed, incomplete) is reused, only when its inputs hash to its
    key (`key_problem`), and only while every JUnit file it summarises is on disk with the bytes it was
    computed from."""
    report = stored.report
    if stored.input_hash != input_hash:
        return "inputs changed"
    if not report.ran:
        return f"the last run ended in {report.status}"
    wrong_key = key_problem(stored)
    if wrong_key is not None:
        return wrong_key
    return next((why for s in report.suites if (why := _bound_files_problem(stored.path.parent, s))), None)


def _bound_files_problem(folder: Path, s: SuiteResult) -> str | None:
    """Why the suite's JUnit file (or its record, stackfarm.family) beside the verdict is not the one bound."""
    xml = folder / f"{s.suite}.xml"
    if s.sha256 is None:
        return f"{s.suite}: the verdict binds no JUnit hash (an older format)"
    if not xml.is_file() or hashlib.sha256(xml.read_bytes()).hexdigest() != s.sha256:
        return f"{s.suite}: its JUnit file is not the one the verdict summarised"
    record = xml.with_suffix(".json")
    if s.record_sha256 is not None and (
        not record.is_file() or hashlib.sha256(record.read_bytes()).hexdigest() != s.record_sha256
    ):
        return f"{s.suite}: its record {record.name} is not the one the verdict binds"
    return None


__all__ = [
    "FORMAT",
    "VERDICT",
    "BackendFacts",
    "Cause",
    "CellReport",
    "Contradiction",
    "Outcome",
    "SourceLine",
    "Status",
    "Stored",
    "SuiteResult",
    "Wheel",
    "cell_status",
    "counts",
    "exit_code",
    "exit_reasons",
    "from_json",
    "input_hash",
    "judged",
    "key_problem",
    "parse",
    "path_of",
    "read",
    "read_all",
    "read_suite",
    "rejudge_problem",
    "rejudged",
    "reusable",
    "save",
    "suite_outcome",
    "to_json",
    "totals",
]
