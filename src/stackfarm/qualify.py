"""Release qualification: a signed sign-off bound to the hashes of what was tested, and its verification.

    stackfarm qualify --cell ID --release NAME --approver NAME [--key PEM] [--reports DIR] [--matrix PATH]
    stackfarm qualify --verify reports/qualifications/NAME.json [--release NAME] [--public-key PEM ...] [--matrix PATH]
    stackfarm qualify --keygen DIR

Qualifying refuses unless the cell's latest run (``reports/<cell>/verdict.json``) passed every suite the matrix
requires and every step the runner reported, and was made from the inputs the matrix gives now. Its status is
re-judged from the JUnit files beside verdict.json (``verdict.cell_status``): it must be passed, and be what
verdict.json says; and the run must have asked the cell something (zero suites, only the runner's own
``00-patches`` step, or only suites that did not apply is no sign-off). A skip is not a
pass, down to single testcases: a skipped testcase refuses too, unless the approver accepts it by name with
``--allow-skip 'SUITE::TESTCASE-GLOB'`` — and then the record lists it, with its reason, as not verified. It
refuses a run that cannot be genuine as well: a JUnit file that is not the one the verdict summarised, a verdict
that says otherwise than its JUnit file, a needs-GPU suite recorded as passed on a run that had no GPU.

The record (``reports/qualifications/<release>.json``) is a DSSE envelope (stackfarm.attest) signed with the
approver's Ed25519 key, holding an in-toto Statement v1: its subjects are the cell's wheels and the run's
verdict.json and JUnit files, each by sha256; its predicate (PREDICATE_TYPE) is the record — the cell and its
versions, the wheel sha256s, the patch-set and patch-file hashes, the backend and what it reported (image digest
included), the GPU facts, the run id, the suite verdicts with their testcases' properties (values over 200
characters kept as their sha256), the approver, the time, the git commit of matrix.toml, and the inputs dict
whose hash is the cell's input hash. ``.md`` beside it renders the predicate for people.

``--verify`` checks the signature against the trusted public keys, that the signed release is the record's file
name (``<release>.json``) and ``--release`` when given, that the file holds nothing beside the envelope's own
keys (nothing else is signed), refuses a needs-GPU suite passed without a GPU, re-hashes the reports on disk that the subject names, then plans the cell afresh and compares its inputs
with the recorded ones key by key, naming every input (and every patch file) that changed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import __version__, attest, verdict
from .artifacts import Artifact, Cache
from .attest import SignatureProblem, SigningKey, TrustedKey
from .cellinputs import cell_inputs
from .errors import ConfigError, StackfarmError, did_you_mean
from .files import write_atomic
from .history import CellRun, Difference, cell_run, diff_inputs
from .junit import NOT_APPLICABLE
from .matrix import Matrix, load
from .plan import Cell, Component, input_hash
from .qualrecord import (
    ENVELOPE_KEYS,
    PREDICATE_TYPE,
    SCHEMA,
    changed_reports,
    file_sha256,
    matrix_provenance,
    read_json,
    record_markdown,
    release_refusals,
    report_files,
    statement_predicate,
    suite_records,
    unsigned_fields,
    unverified_predicate,
    verified_predicate,
)
from .resolve import Resolver, plan_matrix
from .runner import PATCH_STEP, gpu_unavailable_reason
from .verdict import SuiteResult

_RELEASE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")
#: Suite outcomes that count as a pass.
_PASSING = ("passed", "not_applicable")


def check_release(release: str) -> None:
    """ConfigError (exit 2) unless `release` is a release name (a record's file name stem)."""
    if not _RELEASE.match(release):
        raise ConfigError(
            "--release", f"{release!r} is not a release name", fix="letters, digits and ._+- only"
        )


# --------------------------------------------------------------------------- the latest run, judged


@dataclass(frozen=True, kw_only=True)
class Judgement:
    #: What keeps the cell from qualifying, one line each ("20-eagle3: skipped (needs GPU: ...)").
    missing: tuple[str, ...]
    #: Skipped testcases the approver accepted: {"case": "suite::name", "reason": ...}.
    accepted_skips: tuple[dict[str, str], ...]


def judge(cell: CellRun, required: Sequence[str], allow_skips: Sequence[str] = ()) -> Judgement:
    """Every required suite, and every step the run reported, passed; every skipped testcase is accepted."""
    missing: list[str] = []
    accepted: list[dict[str, str]] = []
    if not cell.report.ran:
        missing.append(f"the cell did not run: {cell.report.status} ({cell.report.reason})")
    ran = {s.result.suite: s for s in cell.suites}
    for name in [*required, *(s for s in ran if s not in required)]:
        suite = ran.get(name)
        if suite is None:
            missing.append(f"{name}: not in the latest run")
            continue
        res = suite.result
        if res.outcome not in ("passed", "not_applicable"):
            why = res.first_failure or next((c.message for c in suite.cases if c.outcome != "passed"), "")
            missing.append(f"{name}: {res.outcome}" + (f" ({why})" if why else ""))
            continue
        for case in suite.cases:
            if case.outcome != "skipped" or case.message.startswith(NOT_APPLICABLE.strip()):
                continue
            key = f"{name}::{case.name}"
            if any(fnmatch.fnmatchcase(key, glob) for glob in allow_skips):
                accepted.append({"case": key, "reason": case.message})
            else:
                missing.append(f"{key}: skipped ({case.message})")
    return Judgement(missing=tuple(missing), accepted_skips=tuple(accepted))


# --------------------------------------------------------------------------- inputs of a fresh plan


@dataclass(frozen=True, kw_only=True)
class Planned:
    matrix: Matrix
    cell: Cell
    artifacts: dict[Component, Artifact]
    #: JSON-native (a round trip through json), so it compares equal to a recorded one.
    inputs: dict[str, Any]
    input_hash: str
    #: "<set>/<file>" -> sha256 of every file of the cell's patch sets.
    patch_files: dict[str, str]


def plan_cell(matrix_path: Path, cell_id: str, *, backend: str, gpu: bool) -> Planned:
    """Load the matrix, plan it (sglang's pins from the index), and compute this cell's inputs as the
    runner does. Raises StackfarmError naming the cell when the plan has no such cell to run."""
    matrix = load(matrix_path)
    resolver = Resolver(matrix, Cache())
    plan, unreachable = plan_matrix(matrix, resolver, None)
    cell = next((c for c in plan.cells if c.id == cell_id), None)
    if cell is None:
        conflict = next((c for c in plan.conflicts if c.cell.id == cell_id), None)
        excluded = next((x for x in plan.excluded if x.cell.id == cell_id), None)
        if conflict is not None:
            why = f"it is a conflict: {'; '.join(conflict.problems)}"
        elif excluded is not None:
            why = f"it is excluded: {excluded.reason}"
        else:
            hint = did_you_mean(cell_id, [c.id for c in plan.cells])
            why = "no such cell" + (f"; {hint}" if hint else "")
        raise StackfarmError(f"cell {cell_id} is not a cell {matrix_path} runs: {why}")
    artifacts: dict[Component, Artifact] = {}
    if backend != "host":
        for comp in cell.components:
            if (comp.distribution, comp.version) in unreachable:
                raise StackfarmError(unreachable[(comp.distribution, comp.version)])
            artifacts[comp] = resolver.artifact(comp, cell["python"])
    raw = cell_inputs(matrix, cell, artifacts, backend=backend, gpu=gpu)
    inputs = json.loads(json.dumps(raw, default=str))
    patch_files = {
        f"{ps.name}/{path.name}": hashlib.sha256(path.read_bytes()).hexdigest()
        for ps in matrix.patch_sets
        if ps.name in cell.patch_sets
        for path in sorted(ps.path.iterdir())
        if path.is_file()
    }
    return Planned(
        matrix=matrix,
        cell=cell,
        artifacts=artifacts,
        inputs=inputs,
        input_hash=input_hash(raw),
        patch_files=patch_files,
    )


# --------------------------------------------------------------------------- what cannot be genuine


def needs_gpu_suites(matrix: Matrix | None, inputs: Mapping[str, Any] | None) -> set[str]:
    """The suites that need a GPU, as the matrix says and as a run's inputs say (their suite_settings)."""
    names = {s.name for s in matrix.suites if s.needs_gpu} if matrix is not None else set()
    for entry in (inputs or {}).get("suite_settings") or ():
        if isinstance(entry, Mapping) and entry.get("needs_gpu"):
            names.add(str(entry.get("name")))
    return names


def gpu_forgeries(
    outcomes: Iterable[tuple[str, str]], needs_gpu: set[str], no_gpu_reason: str | None
) -> list[str]:
    """A needs-GPU suite recorded as passed by a run without a GPU. The runner skips such a suite there
    ("needs GPU: ..."), so that verdict was written by hand."""
    if no_gpu_reason is None:
        return []
    return [
        f"{name}: needs a GPU, yet it is recorded {outcome} by a run that had none ({no_gpu_reason}): "
        "a forged verdict; run the cell on a GPU runner"
        for name, outcome in outcomes
        if name in needs_gpu and outcome in _PASSING
    ]


def _no_gpu(reason: str | None, gpu_input: object) -> str | None:
    if reason:
        return reason
    return None if gpu_input is True else "its inputs say no GPU"


def run_forgeries(cell: CellRun, needs_gpu: set[str], gpu_input: object) -> list[str]:
    """What makes a run's verdict not genuine: a JUnit file that is not the one the verdict summarised, a
    verdict that says otherwise than its JUnit files, a needs-GPU suite passed without a GPU."""
    found: list[str] = []
    for suite in cell.suites:
        res = suite.result
        actual = file_sha256(res.xml)
        if res.xml is None or actual is None:
            if res.outcome in _PASSING:  # else judge() says what it is
                found.append(f"{res.suite}: recorded {res.outcome}, but its JUnit file {res.xml} is missing")
            continue
        if res.sha256 is None:
            found.append(f"{res.suite}: the verdict binds no JUnit sha256 (an older format); re-run the cell")
        elif res.sha256 != actual:
            found.append(
                f"{res.suite}: {res.xml} is not the JUnit file the verdict summarised "
                f"(sha256 {res.sha256[:12]}… in verdict.json, {actual[:12]}… on disk)"
            )
        rejudged = verdict.read_suite(res.xml, cell=cell.cell, suite=res.suite).outcome
        if rejudged != res.outcome:
            found.append(f"{res.suite}: verdict.json says {res.outcome}, its JUnit file says {rejudged}")
    status, _ = verdict.cell_status([s.result for s in cell.suites])
    if cell.report.ran and status is not cell.report.status:
        found.append(f"verdict.json says the cell {cell.report.status}, its suites make it {status}")
    outcomes = ((s.result.suite, s.result.outcome) for s in cell.suites)
    found += gpu_forgeries(outcomes, needs_gpu, _no_gpu(cell.report.no_gpu_reason, gpu_input))
    return found


def stored_run(reports: Path, cell_id: str) -> CellRun:
    """The cell's latest run as its verdict.json records it (`verdict.parse`), NOT re-judged: qualify judges it
    itself (`rejudge`, `run_forgeries`), to name every way it cannot be genuine. Raises StackfarmError when
    verdict.json is unreadable or another cell's."""
    path = verdict.path_of(reports, cell_id)
    try:
        stored = verdict.parse(path.read_bytes(), path)
    except (OSError, ValueError) as exc:
        raise StackfarmError(f"refused: {path} is unreadable: {type(exc).__name__}: {exc}") from None
    if stored.report.cell != cell_id:
        raise StackfarmError(f"refused: {path} is the verdict of cell {stored.report.cell}, not of {cell_id}")
    return cell_run(reports, stored.report, stored.inputs or None)


@dataclass(frozen=True, kw_only=True)
class Rejudged:
    """A cell's status as the rule gives it for the JUnit files beside its verdict.json (not the stored one)."""

    status: verdict.Status
    reason: str
    #: Every suite of the stored verdict, re-read from ``<verdict's folder>/<suite>.xml``.
    suites: tuple[SuiteResult, ...]
    #: suite -> the line naming its JUnit file, where the stored outcome is not what that file says.
    suite_disagreements: Mapping[str, str]
    #: The line naming verdict.json, where its stored status is not the re-judged one (None when it is).
    status_disagreement: str | None

    @property
    def disagreements(self) -> tuple[str, ...]:
        """Every way the stored verdict says otherwise than the JUnit files beside it: suites, then the cell."""
        status = (self.status_disagreement,) if self.status_disagreement else ()
        return (*self.suite_disagreements.values(), *status)


def rejudge(verdict_path: Path, cell: CellRun) -> Rejudged:
    """Re-read every suite of `cell` from its JUnit file beside `verdict_path` (whatever path the verdict
    records) and apply the rule (`verdict.cell_status`); name each stored outcome and the stored status
    that disagree with it."""
    folder = verdict_path.parent
    stored = verdict.Stored(
        report=cell.report, inputs=cell.inputs or {}, input_hash=cell.report.input_hash, path=verdict_path
    )
    # The verdict store's own re-reading, through the one rule; a cell that never ran keeps its (unpassed)
    # status, whatever suites its record claims.
    fresh = verdict.rejudged(stored)
    suites = fresh.suites
    differ = {
        new.suite: f"{folder / f'{new.suite}.xml'}: verdict.json says {new.suite} {old.result.outcome}, "
        f"its JUnit file says {new.outcome}" + (f" ({new.first_failure})" if new.first_failure else "")
        for old, new in zip(cell.suites, suites, strict=True)
        if old.result.outcome != new.outcome
    }
    status, reason = fresh.status, fresh.reason
    moved = None
    if cell.report.ran and status is not cell.report.status:
        moved = (
            f"{verdict_path}: verdict.json says the cell {cell.report.status}, re-judged from its JUnit files "
            f"it is {status}" + (f" ({reason})" if reason else "")
        )
    return Rejudged(
        status=status, reason=reason, suites=suites, suite_disagreements=differ, status_disagreement=moved
    )


def coverage_problem(suites: Sequence[SuiteResult]) -> str | None:
    """Why these suites test nothing a release could rest on (None when some suite other than the runner's
    own patch step ran and answered): zero suites, only the patch step, or every suite not applicable."""
    ran = [s for s in suites if s.suite != PATCH_STEP]
    if not suites:
        return "it ran zero suites"
    if not ran:
        return f"only the runner's own {PATCH_STEP} step ran, no suite of the matrix"
    if all(s.outcome == "not_applicable" for s in ran):
        names = ", ".join(s.suite for s in ran)
        return f"every suite it ran is not_applicable ({names}): none asked the cell anything"
    return None


def status_refusals(cell_id: str, rejudged: Rejudged) -> list[str]:
    """What keeps a cell whose stored verdict is genuine from qualifying, by its re-judged suites: a status
    other than passed, and no required suite run."""
    found = []
    if rejudged.status is not verdict.Status.PASSED:
        found.append(
            f"cell {cell_id} is {rejudged.status}, re-judged from its JUnit files"
            + (f" ({rejudged.reason})" if rejudged.reason else "")
        )
    coverage = coverage_problem(rejudged.suites)
    if coverage is not None:
        found.append(f"cell {cell_id} ran no required suite: {coverage}")
    return found


# --------------------------------------------------------------------------- the record


def build_predicate(
    *,
    release: str,
    approver: str,
    cell: CellRun,
    planned: Planned,
    accepted_skips: Sequence[Mapping[str, str]],
    matrix: Mapping[str, Any],
    now: datetime,
    files: Mapping[str, Any],
    needs_gpu: set[str],
) -> dict[str, Any]:
    report = cell.report
    wheels = {w.distribution: w for w in report.wheels}
    return {
        "schema": SCHEMA,
        "release": release,
        "cell": cell.cell,
        "values": planned.cell.as_dict(),
        "components": [
            {
                "distribution": c.distribution,
                "version": wheels[c.distribution].version if c.distribution in wheels else c.version,
                "sha256": wheels[c.distribution].sha256 if c.distribution in wheels else None,
                "source": wheels[c.distribution].source if c.distribution in wheels else None,
                "index": c.index,
            }
            for c in planned.cell.components
        ],
        "patch_sets": {n: report.patch_sets.get(n) for n in planned.cell.patch_sets},
        "patch_files": planned.patch_files,
        "patch_statuses": dict(sorted(report.patches.items())),
        "backend": planned.inputs.get("backend"),
        # What the backend says of the stack it realised (docker.image_digest, host.python, ...).
        "backend_facts": dict(sorted(report.backend_facts.as_properties().items())),
        "image_digest": report.image_digest,
        "image_tag": report.backend_facts.docker_image,
        "gpu": {
            "present": planned.inputs.get("gpu") is True and report.no_gpu_reason is None,
            "no_gpu_reason": report.no_gpu_reason,
        },
        "run_id": report.run_id,
        "reports": dict(files),
        "suites": suite_records(cell, needs_gpu),
        "accepted_skips": list(accepted_skips),
        "approver": approver,
        "approved_at": now.astimezone(timezone.utc).isoformat(timespec="seconds"),
        "matrix": dict(matrix),
        "stackfarm": __version__,
        "input_hash": planned.input_hash,
        "inputs": planned.inputs,
    }


def build_statement(predicate: Mapping[str, Any], cell: CellRun, planned: Planned) -> dict[str, Any]:
    """The in-toto statement: the wheels (by file name where the plan has it) and the run's files, by sha256."""
    filenames = {c.distribution: a.filename for c, a in planned.artifacts.items()}
    subjects = [
        {
            "name": filenames.get(w.distribution) or f"{w.distribution}=={w.version}",
            "digest": {"sha256": w.sha256},
        }
        for w in cell.report.wheels
        if w.sha256
    ]
    files = [predicate["reports"]["verdict"], *predicate["reports"]["junit"]]
    subjects += [{"name": f["name"], "digest": {"sha256": f["sha256"]}} for f in files]
    return attest.statement(subjects, PREDICATE_TYPE, dict(predicate))


@dataclass(frozen=True, kw_only=True)
class Qualified:
    path: Path
    predicate: dict[str, Any]
    key_id: str


def qualify(
    *,
    cell_id: str,
    release: str,
    approver: str,
    reports: Path,
    matrix_path: Path,
    key: SigningKey | None = None,
    backend: str = "local",
    allow_skips: Sequence[str] = (),
    replace: bool = False,
    now: datetime | None = None,
    gpu: bool | None = None,
) -> Qualified:
    """Write the signed record of `cell_id` as `release`; raise StackfarmError listing everything that
    refuses it. Without `key`, the key $STACKFARM_SIGNING_KEY names (ConfigError when none is set)."""
    check_release(release)
    if not approver.strip():
        raise ConfigError("--approver", "the approver is empty", fix="name the person who signs off")
    key = key or attest.load_signing_key()
    target = reports / "qualifications" / f"{release}.json"
    if target.exists() and not replace:
        try:
            old: Mapping[str, Any] = unverified_predicate(target)
        except StackfarmError:  # an unsigned record of an older stackfarm, or no record at all
            doc = read_json(target) if target.is_file() else None
            old = doc if isinstance(doc, dict) else {}
        raise StackfarmError(
            f"{target} exists (cell {old.get('cell')}, approved by {old.get('approver')} at "
            f"{old.get('approved_at')}): choose another release name, or pass --replace"
        )
    verdict_path = verdict.path_of(reports, cell_id)
    if not verdict_path.is_file():
        # A conflict, an excluded or unknown cell, or an unreachable index: say that, not "run it first".
        plan_cell(matrix_path, cell_id, backend=backend, gpu=True)
        raise StackfarmError(
            f"refused: cell {cell_id} has no run in {reports}/ ({verdict_path} is missing); "
            f"run `stackfarm run --cells {cell_id}` first"
        )
    cell = stored_run(reports, cell_id)
    planned = plan_cell(
        matrix_path, cell_id, backend=backend, gpu=gpu_unavailable_reason() is None if gpu is None else gpu
    )
    needs_gpu = needs_gpu_suites(planned.matrix, cell.inputs)
    forged = run_forgeries(cell, needs_gpu, (cell.inputs or planned.inputs).get("gpu"))
    rejudged = rejudge(verdict_path, cell)
    # run_forgeries re-read the suites from the files the run names; say a suite again only where that is
    # not the file beside verdict.json (the one that counts).
    beside = {
        s.result.suite for s in cell.suites if s.result.xml == verdict_path.parent / f"{s.result.suite}.xml"
    }
    forged += [line for name, line in rejudged.suite_disagreements.items() if name not in beside]
    forged += [rejudged.status_disagreement] if rejudged.status_disagreement else []
    if forged:
        listing = "\n".join(f"  - {m}" for m in forged)
        raise StackfarmError(f"refused: the latest run of {cell_id} cannot be genuine:\n{listing}")
    judgement = judge(cell, [s.name for s in planned.matrix.suites], allow_skips)
    missing = [*judgement.missing, *status_refusals(cell_id, rejudged)]
    if cell.input_hash != planned.input_hash:
        why = ""
        if cell.inputs is not None:
            why = ": " + ", ".join(str(d) for d in diff_inputs(cell.inputs, planned.inputs))
        missing.append(
            f"the latest run was made from other inputs than {matrix_path} gives now "
            f"(input hash {str(cell.input_hash)[:12]}… ≠ {planned.input_hash[:12]}…){why}; "
            f"re-run `stackfarm run --cells {cell_id}`"
        )
    if missing:
        listing = "\n".join(f"  - {m}" for m in missing)
        raise StackfarmError(f"refused: {cell_id} cannot be qualified as {release}; not passed:\n{listing}")
    predicate = build_predicate(
        release=release,
        approver=approver.strip(),
        cell=cell,
        planned=planned,
        accepted_skips=judgement.accepted_skips,
        matrix=matrix_provenance(matrix_path),
        now=now or datetime.now(timezone.utc),
        files=report_files(reports, cell),
        needs_gpu=needs_gpu,
    )
    envelope = attest.sign(attest.canonical_json(build_statement(predicate, cell, planned)), key)
    write_atomic(target, json.dumps(envelope, indent=1) + "\n")
    write_atomic(target.with_suffix(".md"), record_markdown(predicate, str(target), key.key_id))
    return Qualified(path=target, predicate=predicate, key_id=key.key_id)


# --------------------------------------------------------------------------- verify


@dataclass(frozen=True, kw_only=True)
class Verification:
    holds: bool
    #: One line per finding: the signature, refusals, changed reports, then every changed input and patch file.
    lines: tuple[str, ...]
    changed: tuple[Difference, ...] = ()
    #: The signed report files (names under the reports folder) whose bytes on disk differ.
    changed_files: tuple[str, ...] = ()
    #: The trusted key whose signature holds (None when none does).
    key: TrustedKey | None = None


def record_refusals(predicate: Mapping[str, Any], needs_gpu: set[str]) -> list[str]:
    """What no signature makes true: a needs-GPU suite passed without a GPU, inputs that are not the hash."""
    found = []
    gpu = predicate.get("gpu")
    if not isinstance(gpu, Mapping):
        found.append("the record states no GPU facts")
    else:
        reason = gpu.get("no_gpu_reason") or (
            None if gpu.get("present") is True else "the record says no GPU"
        )
        outcomes = [(str(s.get("suite")), str(s.get("outcome"))) for s in predicate.get("suites", ())]
        found += gpu_forgeries(outcomes, needs_gpu, reason)
    inputs = predicate.get("inputs")
    if not isinstance(inputs, Mapping) or input_hash(inputs) != predicate.get("input_hash"):
        found.append("the record's inputs do not hash to its input_hash")
    return found


def identity_refusals(
    record: Mapping[str, Any], doc: Mapping[str, Any], record_path: Path, release: str | None
) -> tuple[list[str], list[str]]:
    """Whether the record file is the record of its release, and only that: the signed release is its file's
    name (and `release`, when given), and nothing unsigned lies beside the envelope. (REFUSED lines, the
    short reasons the record no longer holds.)"""
    signed = record.get("release")
    lines = release_refusals(signed, record_path, release)
    reasons = []
    if lines:
        names = dict.fromkeys(n for n in (record_path.stem, release) if n is not None and n != signed)
        reasons.append(f"it is not the record of release {' or '.join(names)}")
    unsigned = unsigned_fields(doc)
    if unsigned:
        lines.append(
            f"unsigned field(s) beside the signed envelope: {', '.join(unsigned)} (a record holds only "
            f"{', '.join(ENVELOPE_KEYS[:-1])} and {ENVELOPE_KEYS[-1]}; nothing else is vouched for)"
        )
        reasons.append(f"it carries unsigned fields ({', '.join(unsigned)})")
    return lines, reasons


def verify(
    record_path: Path,
    trusted: Sequence[TrustedKey],
    matrix_path: Path | None = None,
    reports: Path | None = None,
    release: str | None = None,
) -> Verification:
    """Check a record: its signature under `trusted`, that it is the record of its release (its file's
    name, and `release` when given) with nothing unsigned beside the envelope, what no signature makes
    true, the signed reports still on disk under `reports` (default: the folder above the record's
    qualifications/), and the inputs of a fresh plan."""
    if release is not None:
        check_release(release)
    doc = read_json(record_path)
    if not attest.is_envelope(doc):
        if isinstance(doc, dict) and "record_sha256" in doc:
            return Verification(
                holds=False,
                lines=(
                    f"UNSIGNED: {record_path} is a schema-{doc.get('schema')} record, sealed by an unkeyed sha256 "
                    "that anyone can recompute; qualify the cell again to get a signed record",
                ),
            )
        raise StackfarmError(f"{record_path}: not a qualification record (a DSSE envelope)")
    try:
        opened = attest.open_envelope(doc, trusted)
    except SignatureProblem as exc:
        return Verification(holds=False, lines=(f"TAMPERED: {exc}",))
    record = statement_predicate(opened.statement, record_path)
    lines = [
        f"signature ok: key {opened.key.key_id[:16]}… ({opened.key.path}); {record['release']} = cell "
        f"{record['cell']}, approved by {record['approver']} at {record['approved_at']}"
    ]
    not_this, named = identity_refusals(record, doc, record_path, release)
    lines += [f"REFUSED: {r}" for r in not_this]
    recorded = record.get("inputs")
    if not isinstance(recorded, dict):
        lines += [
            "REFUSED: the record holds no inputs",
            "the record no longer holds: it has nothing to check",
        ]
        return Verification(holds=False, lines=tuple(lines), key=opened.key)
    needs_gpu = needs_gpu_suites(None, recorded) | {
        s["suite"] for s in record["suites"] if s.get("needs_gpu")
    }
    refused = record_refusals(record, needs_gpu)
    lines += [f"REFUSED: {r}" for r in refused]

    folder = reports or record_path.resolve().parent.parent
    changed_files, absent, hashed = changed_reports(record, folder)
    if not hashed:
        lines.append(f"reports: not on disk under {folder}/ (not re-checked)")
    else:
        lines.append(
            f"reports: {hashed} signed file(s) re-hashed under {folder}/, {len(changed_files)} changed"
        )
        lines += [f"  changed since the sign-off: {c}" for c in changed_files]
        lines += [f"  not on disk (not re-checked): {a}" for a in absent]

    path = matrix_path or Path(record["matrix"]["path"])
    planned = plan_cell(
        path, record["cell"], backend=str(recorded.get("backend")), gpu=bool(recorded.get("gpu"))
    )
    more = needs_gpu_suites(planned.matrix, None) - needs_gpu
    extra = [f"REFUSED: {r}" for r in record_refusals(record, more) if "needs a GPU" in r]
    lines += extra
    changed = tuple(diff_inputs(recorded, planned.inputs))
    files = record.get("patch_files", {})
    moved = [
        f"patch file {name}: "
        + ("removed" if name not in planned.patch_files else "added" if name not in files else "changed")
        for name in sorted(set(files) | set(planned.patch_files))
        if files.get(name) != planned.patch_files.get(name)
    ]
    problems = list(named)
    if refused or extra:
        problems.append("it records a verdict that cannot be genuine")
    if changed_files:
        problems.append(f"{len(changed_files)} signed report file(s) changed")
    if changed or moved:
        problems.append(f"{len(changed)} input(s) changed since it was made")
    if not problems:
        lines.append(f"the record holds: the inputs of a fresh plan hash to {planned.input_hash}")
    else:
        lines.append(f"the record no longer holds: {'; '.join(problems)}")
    lines += [f"  changed: {d}" for d in changed]
    lines += [f"  changed: {m}" for m in moved]
    return Verification(
        holds=not problems,
        lines=tuple(lines),
        changed=changed,
        changed_files=tuple(changed_files),
        key=opened.key,
    )


__all__ = [
    "PREDICATE_TYPE",
    "SCHEMA",
    "Judgement",
    "Planned",
    "Qualified",
    "Rejudged",
    "Verification",
    "build_predicate",
    "build_statement",
    "changed_reports",
    "check_release",
    "coverage_problem",
    "gpu_forgeries",
    "identity_refusals",
    "judge",
    "matrix_provenance",
    "needs_gpu_suites",
    "plan_cell",
    "qualify",
    "record_markdown",
    "record_refusals",
    "rejudge",
    "release_refusals",
    "report_files",
    "run_forgeries",
    "status_refusals",
    "stored_run",
    "unsigned_fields",
    "unverified_predicate",
    "verified_predicate",
    "verify",
]
