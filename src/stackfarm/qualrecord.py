"""The qualification record's format (stackfarm.qualify writes and checks it): the predicate's parts, its
Markdown view, reading a record back (signature checked or not), and re-hashing the report files it binds.

The record file (``reports/qualifications/<release>.json``) is a DSSE envelope (stackfarm.attest) of an in-toto
Statement v1 whose predicateType is PREDICATE_TYPE and whose predicate is the record (schema SCHEMA).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import attest, verdict
from .attest import SignatureProblem, TrustedKey
from .errors import StackfarmError
from .history import CellRun
from .proc import call
from .throughput import record as throughput_record

#: Bumped when the record's layout changes; --verify reads the versions it knows. 1 was an unsigned record
#: sealed by an unkeyed sha256 (anyone could recompute it); 2 is the signed statement.
SCHEMA = 2
#: The statement's predicateType: an identifier (RFC 2606's .invalid never resolves), not a document.
PREDICATE_TYPE = "https://stackfarm.invalid/qualification/v1"
#: The keys of a DSSE envelope: a record file holds these and nothing else (nothing else is signed).
ENVELOPE_KEYS = ("payloadType", "payload", "signatures")
#: Property values longer than this are recorded as their sha256: contracts and logs would swamp the record.
MAX_VALUE = 200


def file_sha256(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _value(text: str) -> str:
    if len(text) <= MAX_VALUE:
        return text
    return f"sha256:{hashlib.sha256(text.encode()).hexdigest()} ({len(text)} chars)"


def suite_records(cell: CellRun, needs_gpu: set[str]) -> list[dict[str, Any]]:
    out = []
    for suite in cell.suites:
        r = suite.result
        out.append(
            {
                "suite": r.suite,
                "outcome": r.outcome,
                "needs_gpu": r.suite in needs_gpu,
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


def report_files(reports: Path, cell: CellRun) -> dict[str, Any]:
    """The run's files as the record binds them: names relative to the reports folder, with their sha256."""
    return {
        "verdict": {
            "name": f"{cell.cell}/{verdict.VERDICT}",
            "sha256": file_sha256(verdict.path_of(reports, cell.cell)),
        },
        "junit": [
            {
                "suite": s.result.suite,
                "name": f"{cell.cell}/{s.result.suite}.xml",
                "sha256": file_sha256(s.result.xml),
            }
            for s in cell.suites
        ],
    }


def _md(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def record_markdown(record: Mapping[str, Any], json_name: str, key_id: str) -> str:
    """The predicate for people; `key_id` is the signer's."""
    m = record["matrix"]
    commit = m["commit"] or "none (not in a git checkout)"
    if m.get("modified_since_commit"):
        commit += " — matrix.toml had uncommitted changes; its sha256 is below"
    gpu = record["gpu"]
    lines = [
        f"# Qualification: {record['release']}",
        "",
        f"- cell: `{record['cell']}`",
        f"- approved by **{_md(record['approver'])}** at {record['approved_at']}",
        f"- signed by key `{key_id}` (Ed25519; a DSSE envelope of an in-toto Statement, `{PREDICATE_TYPE}`)",
        f"- matrix: `{m['path']}` sha256 `{m['sha256']}`, commit {commit}",
        f"- backend: {record['backend']}, GPU: "
        + ("yes" if gpu["present"] else f"no ({_md(gpu['no_gpu_reason'] or 'none used')})")
        + f", image digest: {record['image_digest'] or 'none (no docker image)'}",
        f"- run: `{record['run_id'] or 'unknown'}`, input hash: `{record['input_hash']}`",
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
    files = [record["reports"]["verdict"], *record["reports"]["junit"]]
    lines += ["", "## Signed reports", "", *(f"- `{f['name']}`: `{f['sha256']}`" for f in files)]
    lines += [
        "",
        f"Check it still holds: `stackfarm qualify --verify {json_name} --public-key KEY.pub.pem`",
        "",
    ]
    return "\n".join(lines)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StackfarmError(f"{path}: not a readable qualification record ({exc})") from None


def statement_predicate(statement: Mapping[str, Any], path: Path) -> dict[str, Any]:
    if statement.get("predicateType") != PREDICATE_TYPE:
        raise StackfarmError(
            f"{path}: a statement of {statement.get('predicateType')!r}, not a qualification ({PREDICATE_TYPE})"
        )
    predicate: dict[str, Any] = statement["predicate"]
    if predicate.get("schema") != SCHEMA:
        raise StackfarmError(
            f"{path}: record schema {predicate.get('schema')!r}; this stackfarm reads {SCHEMA}"
        )
    return predicate


def unverified_predicate(path: Path) -> dict[str, Any]:
    """A record's predicate with its signature NOT checked (what a refused or old record claims);
    `verified_predicate` is the one to trust."""
    doc = read_json(path)
    if not attest.is_envelope(doc):
        raise StackfarmError(f"{path}: not a signed qualification record (a DSSE envelope)")
    try:
        statement = json.loads(attest.unverified_payload(doc))
    except (SignatureProblem, ValueError) as exc:
        raise StackfarmError(f"{path}: the envelope's payload is unreadable ({exc})") from None
    if not isinstance(statement, dict) or not isinstance(statement.get("predicate"), dict):
        raise StackfarmError(f"{path}: the envelope holds no statement with a predicate")
    return statement_predicate(statement, path)


def verified_predicate(path: Path, trusted: Sequence[TrustedKey]) -> dict[str, Any]:
    """A record's predicate once its signature verifies under a trusted key (SignatureProblem otherwise)."""
    return statement_predicate(attest.open_envelope(read_json(path), trusted).statement, path)


def release_refusals(signed: object, record_path: Path, release: str | None = None) -> list[str]:
    """The signed release must be the record's name: its file's (``<release>.json``) and `release`, the
    one the verifier expects, when given. A valid record copied under another name vouches for nothing."""
    found = []
    if signed != record_path.stem:
        found.append(
            f"the record signs release {signed}, but its file {record_path} names release {record_path.stem}: "
            "a record copied or renamed under another release name"
        )
    if release is not None and signed != release:
        found.append(f"the record signs release {signed}, but --release names {release}")
    return found


def unsigned_fields(doc: Mapping[str, Any]) -> list[str]:
    """The record file's top-level keys that are not the envelope's own: nothing signs them."""
    return sorted(str(k) for k in doc if k not in ENVELOPE_KEYS)


def changed_reports(predicate: Mapping[str, Any], reports: Path) -> tuple[list[str], list[str], int]:
    """(lines naming each signed report file whose bytes changed, names not on disk, files re-hashed)."""
    files = [predicate["reports"]["verdict"], *predicate["reports"]["junit"]]
    changed: list[str] = []
    absent: list[str] = []
    for entry in files:
        path = reports / entry["name"]
        actual = file_sha256(path)
        if actual is None:
            absent.append(entry["name"])
        elif actual != entry["sha256"]:
            changed.append(f"{path}: sha256 {str(entry['sha256'])[:12]}… signed, {actual[:12]}… on disk")
    return changed, absent, len(files) - len(absent)


def load_baseline(path: Path) -> throughput_record.Baseline:
    """The last qualified figures (40-throughput's max_regression_pct judges against them) from a throughput.json,
    a qualification record, or a signed one: a signed sign-off's figures count only once its signature verifies
    under a trusted key. Here, not in stackfarm.throughput.record: the sign-off side imports the suite library's
    record, never the reverse."""
    doc = throughput_record.read_baseline_doc(path)
    if attest.is_envelope(doc):
        try:
            predicate = verified_predicate(path, attest.load_trusted_keys())
        except StackfarmError as exc:  # a bad signature, an untrusted key, no trusted key
            raise throughput_record.RecordError(f"{path}: not a baseline this run can trust: {exc}") from None
        return throughput_record.qualified_figures(predicate, path)
    return throughput_record.baseline_of(doc, path)


__all__ = [
    "ENVELOPE_KEYS",
    "MAX_VALUE",
    "PREDICATE_TYPE",
    "SCHEMA",
    "changed_reports",
    "file_sha256",
    "load_baseline",
    "matrix_provenance",
    "read_json",
    "record_markdown",
    "release_refusals",
    "report_files",
    "statement_predicate",
    "suite_records",
    "unsigned_fields",
    "unverified_predicate",
    "verified_predicate",
]
