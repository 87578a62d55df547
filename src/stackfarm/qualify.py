"""Release qualification: a sign-off record bound to the hashes of what was tested, and its verification.

    stackfarm qualify --cell ID --release NAME --approver NAME [--reports DIR] [--matrix PATH]
    stackfarm qualify --verify reports/qualifications/NAME.json [--matrix PATH]

Qualifying refuses unless the cell's latest run (``reports/<cell>/verdict.json``) passed every suite the matrix
requires and every step the runner reported, and was made from the inputs the matrix gives now. A skip is not a
pass, down to single testcases: a skipped testcase refuses too, unless the approver accepts it by name with
``--allow-skip 'SUITE::TESTCASE-GLOB'`` — and then the record lists it, with its reason, as not verified.

The record (``reports/qualifications/<release>.json`` and ``.md``) holds the cell and its versions, the wheel
sha256s, the patch-set and patch-file hashes, the image digest when the docker backend ran (null otherwise), the
suite verdicts with their testcases' properties (values over 200 characters kept as their sha256), the approver,
the time, the git commit of matrix.toml, the inputs dict whose hash is the cell's input hash, and the sha256 of
the record itself. ``--verify`` checks that seal, then plans the cell afresh and compares its inputs with the
recorded ones key by key, naming every input (and every patch file) that changed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import __version__
from .artifacts import Artifact, Cache
from .errors import ConfigError, StackfarmError, did_you_mean
from .files import write_atomic
from .history import CellRun, Difference, diff_inputs, read_run
from .junit import NOT_APPLICABLE
from .matrix import Matrix, load
from .plan import Cell, Component, input_hash
from .proc import call
from .resolve import Resolver, plan_matrix
from .runner import cell_inputs, gpu_unavailable_reason

#: Bumped when the record's layout changes; --verify reads the versions it knows.
SCHEMA = 1
#: Property values longer than this are recorded as their sha256: contracts and logs would swamp the record.
MAX_VALUE = 200
_RELEASE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")
SEAL = "record_sha256"


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


# --------------------------------------------------------------------------- the record


def _canonical(record: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in record.items() if k != SEAL}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def seal(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its own sha256 (over its canonical JSON, the seal left out) as the last key."""
    return {
        **{k: v for k, v in record.items() if k != SEAL},
        SEAL: hashlib.sha256(_canonical(record)).hexdigest(),
    }


def seal_problem(record: Mapping[str, Any]) -> str | None:
    """None when the record is as sealed; else what is wrong with it."""
    stored = record.get(SEAL)
    actual = hashlib.sha256(_canonical(record)).hexdigest()
    if not isinstance(stored, str):
        return "the record has no record_sha256: it was not written by stackfarm.qualify"
    if stored != actual:
        return f"the record was changed after it was sealed: record_sha256 {stored[:16]}…, its contents hash to {actual[:16]}…"
    if record.get("inputs") is not None and input_hash(record["inputs"]) != record.get("input_hash"):
        return "the record's inputs do not hash to its input_hash"
    return None


def _value(text: str) -> str:
    if len(text) <= MAX_VALUE:
        return text
    return f"sha256:{hashlib.sha256(text.encode()).hexdigest()} ({len(text)} chars)"


def _suites(cell: CellRun) -> list[dict[str, Any]]:
    out = []
    for suite in cell.suites:
        r = suite.result
        out.append(
            {
                "suite": r.suite,
                "outcome": r.outcome,
                "tests": r.tests,
                "passed": r.passed,
                "failures": r.failures,
                "errors": r.errors,
                "skipped": r.skipped,
                "seconds": r.time,
                "properties": {k: _value(v) for k, v in sorted(suite.properties.items())},
                "cases": [
                    {"name": c.name, "outcome": c.outcome}
                    | (
                        {"properties": {k: _value(v) for k, v in c.properties.items()}}
                        if c.properties
                        else {}
                    )
                    for c in suite.cases
                ],
            }
        )
    return out


def _git(args: Sequence[str], cwd: Path) -> str | None:
    try:
        out = call(["git", *args], cwd=cwd, timeout=30)
    except StackfarmError:  # no git on this machine
        return None
    return out.output.strip() if out.returncode == 0 else None


def matrix_provenance(path: Path) -> dict[str, Any]:
    """The matrix file's sha256 and the git commit that last changed it (None outside a git checkout)."""
    folder, name = path.resolve().parent, path.name
    commit = _git(["log", "-1", "--format=%H", "--", name], folder) or None
    status = _git(["status", "--porcelain", "--", name], folder) if commit else None
    return {
        "path": str(path),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "commit": commit,
        "modified_since_commit": None if status is None else bool(status),
    }


def build_record(
    *,
    release: str,
    approver: str,
    cell: CellRun,
    planned: Planned,
    accepted_skips: Sequence[Mapping[str, str]],
    matrix: Mapping[str, Any],
    now: datetime,
) -> dict[str, Any]:
    report = cell.report
    wheels = {w.distribution: w for w in report.wheels}
    record = {
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
        # What the docker backend says of the image it ran (a local tree or a host has none).
        "image_digest": report.image_digest,
        "image_tag": report.backend_facts.get("docker.image"),
        "run_id": report.run_id,
        "backend": planned.inputs.get("backend"),
        "gpu": planned.inputs.get("gpu"),
        "suites": _suites(cell),
        "accepted_skips": list(accepted_skips),
        "approver": approver,
        "approved_at": now.astimezone(timezone.utc).isoformat(timespec="seconds"),
        "matrix": dict(matrix),
        "stackfarm": __version__,
        "input_hash": planned.input_hash,
        "inputs": planned.inputs,
    }
    return seal(record)


def _md(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def record_markdown(record: Mapping[str, Any], json_name: str) -> str:
    m = record["matrix"]
    commit = m["commit"] or "none (not in a git checkout)"
    if m.get("modified_since_commit"):
        commit += " — matrix.toml had uncommitted changes; its sha256 is below"
    lines = [
        f"# Qualification: {record['release']}",
        "",
        f"- cell: `{record['cell']}`",
        f"- approved by **{_md(record['approver'])}** at {record['approved_at']}",
        f"- matrix: `{m['path']}` sha256 `{m['sha256']}`, commit {commit}",
        f"- backend: {record['backend']}, GPU: {'yes' if record['gpu'] else 'no'}, "
        f"image digest: {record['image_digest'] or 'none (no docker image)'}",
        f"- input hash: `{record['input_hash']}`",
        f"- record sha256: `{record[SEAL]}`",
        "",
        "## Components",
        "",
        "| distribution | version | wheel sha256 | index |",
        "|---|---|---|---|",
        *(
            f"| {c['distribution']} | {c['version']} | `{c['sha256']}` | {c['index']} |"
            for c in record["components"]
        ),
        "",
        "## Patches",
        "",
    ]
    if record["patch_sets"]:
        lines += ["| patch set | sha256 |", "|---|---|"]
        lines += [f"| {n} | `{h}` |" for n, h in record["patch_sets"].items()]
        lines += [""] + [f"- `{p}`: {s}" for p, s in record["patch_statuses"].items()]
    else:
        lines.append("none apply to this cell")
    lines += [
        "",
        "## Suites",
        "",
        "| suite | outcome | tests | passed | skipped | seconds |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {s['suite']} | {s['outcome']} | {s['tests']} | {s['passed']} | {s['skipped']} | {s['seconds']} |"
        for s in record["suites"]
    ]
    if record["accepted_skips"]:
        lines += ["", "## Not verified (skips accepted by the approver)", ""]
        lines += [f"- `{s['case']}`: {_md(s['reason'])}" for s in record["accepted_skips"]]
    figures = [
        (s["suite"], c["name"], k, v)
        for s in record["suites"]
        for c in s["cases"]
        for k, v in c.get("properties", {}).items()
        if _is_number(v)
    ]
    if figures:
        lines += ["", "## Key figures", "", "| suite | testcase | figure | value |", "|---|---|---|---|"]
        lines += [f"| {s} | {_md(c)} | {_md(k)} | {v} |" for s, c, k, v in figures]
    lines += ["", f"Check it still holds: `stackfarm qualify --verify {json_name}`", ""]
    return "\n".join(lines)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def qualify(
    *,
    cell_id: str,
    release: str,
    approver: str,
    reports: Path,
    matrix_path: Path,
    backend: str = "local",
    allow_skips: Sequence[str] = (),
    replace: bool = False,
    now: datetime | None = None,
    gpu: bool | None = None,
) -> Path:
    """Write the record of `cell_id` as `release`; raise StackfarmError listing everything that refuses it."""
    if not _RELEASE.match(release):
        raise ConfigError(
            "--release", f"{release!r} is not a release name", fix="letters, digits and ._+- only"
        )
    if not approver.strip():
        raise ConfigError("--approver", "the approver is empty", fix="name the person who signs off")
    target = reports / "qualifications" / f"{release}.json"
    if target.exists() and not replace:
        old = json.loads(target.read_text(encoding="utf-8"))
        raise StackfarmError(
            f"{target} exists (cell {old.get('cell')}, approved by {old.get('approver')} at "
            f"{old.get('approved_at')}): choose another release name, or pass --replace"
        )
    verdict = reports / cell_id / "verdict.json"
    if not verdict.is_file():
        # A conflict, an excluded or unknown cell, or an unreachable index: say that, not "run it first".
        plan_cell(matrix_path, cell_id, backend=backend, gpu=True)
        raise StackfarmError(
            f"refused: cell {cell_id} has no run in {reports}/ ({verdict} is missing); "
            f"run `stackfarm run --cells {cell_id}` first"
        )
    run = read_run(reports)
    cell = run.cells.get(cell_id)
    if cell is None:
        raise StackfarmError(f"refused: {verdict} is unreadable: {'; '.join(run.problems)}")
    planned = plan_cell(
        matrix_path, cell_id, backend=backend, gpu=gpu_unavailable_reason() is None if gpu is None else gpu
    )
    judgement = judge(cell, [s.name for s in planned.matrix.suites], allow_skips)
    missing = list(judgement.missing)
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
    record = build_record(
        release=release,
        approver=approver.strip(),
        cell=cell,
        planned=planned,
        accepted_skips=judgement.accepted_skips,
        matrix=matrix_provenance(matrix_path),
        now=now or datetime.now(timezone.utc),
    )
    write_atomic(target, json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    write_atomic(target.with_suffix(".md"), record_markdown(record, str(target)))
    return target


# --------------------------------------------------------------------------- verify


@dataclass(frozen=True, kw_only=True)
class Verification:
    holds: bool
    #: One line per finding: the seal, then every changed input and patch file.
    lines: tuple[str, ...]
    changed: tuple[Difference, ...] = ()


def verify(record_path: Path, matrix_path: Path | None = None) -> Verification:
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StackfarmError(f"{record_path}: not a readable qualification record ({exc})") from None
    if not isinstance(record, dict):
        raise StackfarmError(f"{record_path}: not a qualification record (a JSON object)")
    problem = seal_problem(record)
    if problem is not None:
        return Verification(holds=False, lines=(f"TAMPERED: {problem}",))
    if record.get("schema") != SCHEMA:
        raise StackfarmError(
            f"{record_path}: record schema {record.get('schema')!r}; this stackfarm reads {SCHEMA}"
        )
    lines = [
        f"seal ok: {record['release']} = cell {record['cell']}, approved by {record['approver']} "
        f"at {record['approved_at']}"
    ]
    path = matrix_path or Path(record["matrix"]["path"])
    recorded: dict[str, Any] = record["inputs"]
    planned = plan_cell(
        path, record["cell"], backend=str(recorded.get("backend")), gpu=bool(recorded.get("gpu"))
    )
    changed = tuple(diff_inputs(recorded, planned.inputs))
    files = record.get("patch_files", {})
    moved = [
        f"patch file {name}: "
        + ("removed" if name not in planned.patch_files else "added" if name not in files else "changed")
        for name in sorted(set(files) | set(planned.patch_files))
        if files.get(name) != planned.patch_files.get(name)
    ]
    if not changed and not moved:
        lines.append(f"the record holds: the inputs of a fresh plan hash to {planned.input_hash}")
        return Verification(holds=True, lines=tuple(lines))
    lines.append(f"the record no longer holds: {len(changed)} input(s) changed since it was made")
    lines += [f"  changed: {d}" for d in changed]
    lines += [f"  changed: {m}" for m in moved]
    return Verification(holds=False, lines=tuple(lines), changed=changed)


__all__ = [
    "SCHEMA",
    "SEAL",
    "Judgement",
    "Planned",
    "Verification",
    "build_record",
    "judge",
    "matrix_provenance",
    "plan_cell",
    "qualify",
    "record_markdown",
    "seal",
    "seal_problem",
    "verify",
]
