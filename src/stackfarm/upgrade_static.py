"""The static verdicts of one candidate stack of the upgrade planner (stackfarm.upgrade), as one cached row.

For one SGLang release, on its unpacked wheel (and flashinfer-python's sources, whose JIT gates decide features
too), a row holds:

- every patch of every set on the pristine tree (`stackfarm.upgrade_patches.statuses`), and the sets chosen
  for the release (`upgrade_patches.choose`), applied to a hard-linked copy (`stackfarm.patches.patched_copy`);
- 10-capability's static findings (`capability_findings.analyse`, the suite's own code) on the planner's arch
  and the reference arch, with the matrix's [features], on the pristine tree and on the patched one;
- the EAGLE-3 contract the release's own workers define (`eagle3.derive_contract`) and the verdicts of the
  model's target and draft classes (`eagle3.check_class`), on both trees.

Only what does not pass is kept (a failure, or a question the analysis could not decide), each as a
`StaticFinding` with its ``file:line`` and a key that stays the same from one release to the next (no line
numbers), so the planner can tell where a blocker appears and where it goes away.

A row is a pure function of its inputs: the wheels' sha256, the patch sets' hashes and ranges, the start
release, [features], the archs, the model classes and the code of every analysis. It is cached in
$STACKFARM_CACHE/analysis/upgrade under the hash of all of them (`row_key`), the corpus's content-addressed
cache (stackfarm.analysis.cache), so a second planner run computes nothing.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import re
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .analysis.eagle3 import (
    ContractError,
    Finding,
    Role,
    SourceTree,
    check_class,
    derive_contract,
    locate_class,
)
from .cellspec import CellSpec, InstalledComponent
from .errors import StackfarmError
from .patches import patched_copy, set_hash
from .patchset import PatchSet
from .upgrade_patches import LineageChoice, PatchStatus, choose, statuses, trimmed

REPO = Path(__file__).resolve().parents[2]
_FINDINGS = REPO / "suites" / "10-capability"
#: Bump when a row changes shape.
ROW_VERSION = "upgrade-row-1"
NAMESPACE = "upgrade"
_PATH = re.compile(r"\b((?:sglang|flashinfer)/[\w/.-]+\.py)\b")


@dataclass(frozen=True, kw_only=True)
class StaticFinding:
    """One static judgement that did not pass, on one tree."""

    #: The same from release to release: "capability:table:sm_120:sglang:<file>:<symbol>:missing-crash".
    key: str
    source: str  # capability | eagle3
    #: fail, or skip: the analysis could not decide (never a pass).
    outcome: str
    verdict: str
    arch: str
    #: "sglang/srt/.../torch_symm_mem.py:83"; for EAGLE-3 the class and its consumers.
    sites: tuple[str, ...]
    title: str
    message: str
    #: Every tree path the finding names (where a patch would go).
    files: tuple[str, ...]
    feature: str = ""


@dataclass(frozen=True, kw_only=True)
class Job:
    """One release's row to compute (picklable: it crosses into a worker process)."""

    version: str
    start: str
    #: The candidate's CUDA: gates read it (is_sm120_supported() wants CUDA >= 12.8).
    cuda: str
    sglang_tree: str
    flashinfer: tuple[str, str] | None  # (version, unpacked tree)
    sets: tuple[PatchSet, ...]
    features: Mapping[str, Any]
    archs: tuple[str, ...]
    reference: str | None
    classes: tuple[tuple[Role, str], ...]
    key: str = ""


@dataclass(frozen=True, kw_only=True)
class Row:
    """What one release's static analysis found (the cached part of a candidate)."""

    version: str
    statuses: tuple[PatchStatus, ...]
    choices: tuple[LineageChoice, ...]
    #: The results of applying the chosen sets together: "set/patch" -> status.
    applied: Mapping[str, str]
    pristine: tuple[StaticFinding, ...]
    patched: tuple[StaticFinding, ...]
    seconds: float
    errors: tuple[str, ...] = field(default=())


# --------------------------------------------------------------------------- the key


def _module_file(package: Path, name: str) -> Path | None:
    """The file of module `name` (dotted, under the ``stackfarm`` package at `package`), or None."""
    parts = name.split(".")
    if parts[0] != "stackfarm":
        return None
    base = package.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _dotted(path: Path, package: Path) -> str:
    rel = path.relative_to(package).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(("stackfarm", *parts))


def _absolute(node: ast.ImportFrom, path: Path, package: Path) -> str:
    if not node.level:
        return node.module or ""
    here = _dotted(path, package).split(".") if path.is_relative_to(package) else []
    if path.name != "__init__.py":
        here = here[:-1]
    base = here[: len(here) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _provider(package: Path, module: str, name: str, depth: int = 0) -> set[Path]:
    """The files behind `from module import name`: the submodule `name`, or, through a package's
    ``__init__`` (hashed, not followed), the module it re-exports `name` from."""
    found = _module_file(package, module)
    if found is None:
        return set()
    if found.name != "__init__.py" or depth > 8:
        return {found}
    sub = _module_file(package, f"{module}.{name}")
    if sub is not None:
        return {found, sub}
    reexport = _reexport(found, name)
    if reexport is None:
        return {found}
    node, alias = reexport
    return {found} | _provider(package, _absolute(node, found, package), alias.name, depth + 1)


def _reexport(init: Path, name: str) -> tuple[ast.ImportFrom, ast.alias] | None:
    """The first ``from ... import`` of a package's ``__init__`` that binds `name`, and its alias."""
    for node in ast.walk(ast.parse(init.read_bytes())):
        if not isinstance(node, ast.ImportFrom):
            continue
        alias = next((a for a in node.names if (a.asname or a.name) == name), None)
        if alias is not None:
            return node, alias
    return None


def _imports(path: Path, package: Path) -> set[Path]:
    """The stackfarm module files `path` imports."""
    out: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            out.update(f for a in node.names if (f := _module_file(package, a.name)) is not None)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, path, package)
            for alias in node.names:
                out |= _provider(package, base, alias.name)
    return out


#: Where the judging code lives: the row's verdicts change only with these. The rest of stackfarm reads the
#: inputs (wheels, matrix.toml, patch files), whose bytes are in the key themselves.
_JUDGES = ("analysis", "patches", "upgrade_patches.py", "upgrade_static.py", "cellspec.py")


def code_files() -> list[Path]:
    """Every source file a row's verdicts come from: this module, 10-capability's findings, and the judging
    modules (`_JUDGES`) they import, transitively (a package's ``__init__`` is hashed, and only the module it
    re-exports an imported name from is followed): a change to an unrelated module recomputes nothing."""
    package = Path(__file__).parent
    judges = [package / j for j in _JUDGES]

    def judging(path: Path) -> bool:
        return any(path == j or path.is_relative_to(j) for j in judges)

    todo = [Path(__file__), _FINDINGS / "capability_findings.py"]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if path.name != "__init__.py":
            todo.extend(f for f in _imports(path, package) - seen if judging(f))
    return sorted(seen)


def code_digest() -> str:
    """The hash of `code_files`: a change to any of them recomputes the rows."""
    digest = hashlib.sha256(ROW_VERSION.encode())
    for path in code_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def row_key(job: Job, wheels: Sequence[str], code: str) -> str:
    """The hash of everything the row of `job` depends on; `wheels` are the sha256s of its wheels."""
    sets = [(ps.name, str(ps.applies_to), ps.optional, set_hash(ps)) for ps in job.sets]
    parts = [
        code,
        job.version,
        job.start,
        job.cuda,
        list(wheels),
        sets,
        dict(job.features),
        list(job.archs),
        job.reference,
        [list(c) for c in job.classes],
    ]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


# --------------------------------------------------------------------------- the analyses


def _capability_module() -> Any:
    if str(_FINDINGS) not in sys.path:
        sys.path.insert(0, str(_FINDINGS))
    return importlib.import_module("capability_findings")


def _component(axis: str, dist: str, version: str, root: Path) -> InstalledComponent:
    return InstalledComponent(
        axis=axis,
        distribution=dist,
        version=version,
        filename=f"{dist}-{version}.whl",
        sha256=root.name,
        source="upgrade",
        root=str(root),
    )


def capability(job: Job, sglang: Path) -> list[StaticFinding]:
    """10-capability's findings on the tree that did not pass, on the planner's arch (or every arch)."""
    comps = [_component("sglang", "sglang", job.version, sglang)]
    if job.flashinfer is not None:
        comps.append(
            _component("flashinfer", "flashinfer-python", job.flashinfer[0], Path(job.flashinfer[1]))
        )
    cell = CellSpec(
        id=f"upgrade-sgl{job.version}",
        values={"cuda": job.cuda, "sglang": job.version},
        backend="local",
        components=tuple(comps),
        archs=job.archs,
        reference_arch=job.reference,
        features=dict(job.features),
        settings={"10-capability": {}},
    )
    analysis = _capability_module().analyse(cell)
    wanted = {job.archs[0], "all"}
    return [
        _capability_finding(f)
        for f in analysis.findings
        if f.outcome in ("fail", "skip") and f.arch in wanted
    ]


def _capability_finding(f: Any) -> StaticFinding:
    """One 10-capability finding (its own record type, from the suite's library) as the planner's."""
    name = Path(f.file).name if f.file else ""
    verdict = f.verdict or ("unknown" if f.outcome == "skip" else "error")
    key = f"capability:{f.kind}:{f.arch}:{f.component}:{f.file}:{f.symbol}:{verdict}"
    what = {"table": "table", "gate": "gate", "flag": "flag", "auto": "auto-enable"}.get(f.kind, f.kind)
    title = f"{f.component} {what} {f.symbol} {verdict} on {f.arch}" + (f" ({name})" if name else "")
    site = f"{f.file}:{f.line}" if f.line else f.file
    files = tuple(dict.fromkeys([*([f.file] if f.file else []), *_PATH.findall(f.message)]))
    return StaticFinding(
        key=key,
        source="capability",
        outcome=f.outcome,
        verdict=verdict,
        arch=f.arch,
        sites=(site,) if site else (),
        title=title,
        message=f.message,
        files=files,
        feature=f.feature,
    )


def eagle3(job: Job, sglang: Path) -> list[StaticFinding]:
    """The model classes' EAGLE-3 verdicts on the tree that are not ok (every arch: no GPU question)."""
    try:
        contract = derive_contract(sglang)
    except ContractError as exc:
        return [
            StaticFinding(
                key="eagle3:derivation-failed",
                source="eagle3",
                outcome="skip",
                verdict="derivation-failed",
                arch="all",
                sites=(),
                title="EAGLE-3 contract not derivable",
                message=f"undecidable: {exc}",
                files=(),
            )
        ]
    tree = SourceTree([sglang])
    out: list[StaticFinding] = []
    for role, name in job.classes:
        where = locate_class(tree, name)
        out += [
            _eagle3_finding(f, role, name, where) for f in check_class(tree, name, role, contract) if not f.ok
        ]
    return out


def _eagle3_finding(f: Finding, role: Role, name: str, where: tuple[str, str] | None) -> StaticFinding:
    """One failing EAGLE-3 method of a model class, its sites the class, the provider and the consumers."""
    consumers = tuple(s.strip() for s in f.consumer_site.split(";") if s.strip())
    sites = tuple(
        dict.fromkeys(
            [*([where[1]] if where else []), *([f.provider_file] if f.provider_file else []), *consumers]
        )
    )
    files = tuple(dict.fromkeys(s.rpartition(":")[0] or s for s in sites))
    title = f"EAGLE-3 {role} {name}: {f.method} {f.verdict}"
    return StaticFinding(
        key=f"eagle3:{role}:{name}:{f.method}:{f.verdict}",
        source="eagle3",
        outcome="fail",
        verdict=f.verdict,
        arch="all",
        sites=sites,
        title=title,
        message=f.detail,
        files=files,
    )


def findings(job: Job, sglang: Path) -> tuple[StaticFinding, ...]:
    return (*capability(job, sglang), *eagle3(job, sglang))


def _apply(
    job: Job, choices: Sequence[LineageChoice], tree: Path, scratch: Path
) -> tuple[Path, dict[str, str]]:
    """The chosen sets (partial ones trimmed to the patches that apply) applied to a copy of `tree`."""
    by_name = {ps.name: ps for ps in job.sets}
    sets = []
    for choice in choices:
        if choice.chosen:
            sets.append(by_name[choice.chosen])
        elif choice.verdict == "partial":
            sets.append(trimmed(by_name[choice.member], choice.keep, scratch / "trimmed"))
    if not sets:
        return tree, {}
    results = patched_copy(sets, tree, scratch / "sglang")
    return scratch / "sglang", {f"{r.set}/{r.patch}": r.status for r in results}


def analyse(job: Job) -> Row:
    """The row of one release (see the module docstring); a set that cannot be read is an error of the row."""
    start = time.perf_counter()
    tree = Path(job.sglang_tree)
    errors: list[str] = []
    found: dict[str, tuple[PatchStatus, ...]] = {}
    for ps in job.sets:
        try:
            found[ps.name] = statuses(ps, tree)
        except StackfarmError as exc:
            errors.append(f"patch set {ps.name}: {exc}")
            found[ps.name] = ()
    choices = choose(job.sets, job.version, job.start, found)
    pristine = findings(job, tree)
    with tempfile.TemporaryDirectory(prefix="stackfarm-upgrade-") as tmp:
        try:
            patched_tree, applied = _apply(job, choices, tree, Path(tmp))
        except StackfarmError as exc:
            errors.append(f"applying {', '.join(c.chosen or c.member for c in choices)}: {exc}")
            patched_tree, applied = tree, {}
        patched = findings(job, patched_tree) if patched_tree != tree else pristine
    every = tuple(s for ps in job.sets for s in found[ps.name])
    return Row(
        version=job.version,
        statuses=every,
        choices=choices,
        applied=applied,
        pristine=pristine,
        patched=patched,
        seconds=round(time.perf_counter() - start, 2),
        errors=tuple(errors),
    )


# --------------------------------------------------------------------------- JSON


def to_json(row: Row) -> dict[str, Any]:
    return asdict(row)


def from_json(data: Mapping[str, Any]) -> Row:
    """A row read back from the cache; raises KeyError/TypeError for one of another shape."""

    def finding(d: Mapping[str, Any]) -> StaticFinding:
        return StaticFinding(**{**d, "sites": tuple(d["sites"]), "files": tuple(d["files"])})

    def choice(d: Mapping[str, Any]) -> LineageChoice:
        return LineageChoice(
            **{**d, "statuses": tuple(PatchStatus(**s) for s in d["statuses"]), "keep": tuple(d["keep"])}
        )

    return Row(
        version=data["version"],
        statuses=tuple(PatchStatus(**s) for s in data["statuses"]),
        choices=tuple(choice(c) for c in data["choices"]),
        applied=dict(data["applied"]),
        pristine=tuple(finding(f) for f in data["pristine"]),
        patched=tuple(finding(f) for f in data["patched"]),
        seconds=float(data["seconds"]),
        errors=tuple(data["errors"]),
    )


__all__ = [
    "NAMESPACE",
    "ROW_VERSION",
    "Job",
    "Row",
    "StaticFinding",
    "analyse",
    "capability",
    "code_digest",
    "eagle3",
    "findings",
    "from_json",
    "row_key",
    "to_json",
]
