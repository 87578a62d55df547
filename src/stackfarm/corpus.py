"""The static analyses over every SGLang release on the index: one table of verdicts per release.

``python -m stackfarm.corpus`` (``nox -s corpus``) takes every sglang release the matrix's index serves from
0.4.10.post2 to the newest, unpatched, and runs what needs no GPU:

- 10-capability's static findings (`capability_findings.analyse`) for sm_80, sm_90, sm_100 and sm_120 (the
  reference sm_90) with the matrix's [features];
- the EAGLE-3 contract (`eagle3.derive_contract`) and every target's verdicts (`eagle3.check_class`, optional
  names included) for Kimi K2.5, DeepSeek V3/V2, Llama, Qwen2, Qwen3, Qwen3-MoE, GPT-OSS, GLM-4-MoE, and the
  Llama EAGLE-3 draft;
- 15-toolchain's backend selection (`corpus_selection`: the matrix's selectors per arch and model family,
  judged against the flashinfer release each SGLang release pins). Its compiler findings are per cell.

It writes ``reports/corpus/corpus.md`` and ``corpus.json``: the counts by verdict per release, then per release
each class's verdict per contract name. A release whose contract cannot be derived is a row with
``derivation-failed``, which is a bug of the derivation (every release on the index has EAGLE-3).

Each release's row is cached under $STACKFARM_CACHE/analysis/corpus by the sha256 of its wheel (the name of its
unpacked tree), the matrix's [features], the archs and targets, and the source of the analyses themselves: a
warm run reads 40-odd JSON files. Cold, the releases are analysed in parallel processes.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from packaging.version import Version

from stackfarm.analysis.cache import JsonCache, default_root
from stackfarm.analysis.eagle3 import (
    VERDICTS,
    Contract,
    ContractError,
    Role,
    SourceTree,
    check_class,
    derive_contract,
)
from stackfarm.cellspec import CellSpec, InstalledComponent
from stackfarm.corpus_selection import flashinfer_trees, selection_part
from stackfarm.matrix import Matrix
from stackfarm.matrix import load as load_matrix
from stackfarm.sglangtrees import available_versions, sglang_trees

FIRST = "0.4.10.post2"
ARCHS = ("sm_80", "sm_90", "sm_100", "sm_120")
REFERENCE = "sm_90"
TARGETS = (
    "KimiK25ForConditionalGeneration",
    "DeepseekV3ForCausalLM",
    "DeepseekV2ForCausalLM",
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "GptOssForCausalLM",
    "Glm4MoeForCausalLM",
)
DRAFTS = ("LlamaForCausalLMEagle3",)
SELECTION_SUITE = "15-toolchain"
REPO = Path(__file__).resolve().parents[2]
_FINDINGS = REPO / "suites" / "10-capability"
#: Bump when a row changes shape.
ROW_VERSION = "corpus-row-2"


def _code_digest() -> str:
    """The source of every analysis a row comes from: a change to any of them recomputes the rows."""
    digest = hashlib.sha256(ROW_VERSION.encode())
    files = [
        *sorted((Path(__file__).parent / "analysis").glob("*.py")),
        _FINDINGS / "capability_findings.py",
        Path(__file__),
        Path(__file__).with_name("corpus_selection.py"),
    ]
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _capability(
    version: str, root: Path, features: Mapping[str, Any], archs: Sequence[str]
) -> dict[str, Any]:
    if str(_FINDINGS) not in sys.path:
        sys.path.insert(0, str(_FINDINGS))
    findings = importlib.import_module("capability_findings")
    comp = InstalledComponent(
        axis="sglang",
        distribution="sglang",
        version=version,
        filename=f"sglang-{version}.whl",
        sha256=root.name,
        source="corpus",
        root=str(root),
    )
    cell = CellSpec(
        id=f"corpus-sgl{version}",
        values={"cuda": "12.8", "sglang": version},
        backend="local",
        components=(comp,),
        archs=tuple(archs),
        reference_arch=REFERENCE,
        features=dict(features),
        settings={"10-capability": {}},
    )
    analysis = findings.analyse(cell)
    counts: Counter[str] = Counter()
    by_arch: dict[str, Counter[str]] = {}
    undecidable: list[str] = []
    for f in analysis.findings:
        label = f"{f.outcome}:{f.verdict or 'error'}"
        counts[label] += 1
        by_arch.setdefault(f.arch, Counter())[label] += 1
        if f.verdict == "unknown" and len(undecidable) < 20:
            undecidable.append(f"{f.arch} {f.file}:{f.line} {f.message[:300]}")
    return {
        "counts": dict(sorted(counts.items())),
        "by_arch": {a: dict(sorted(c.items())) for a, c in sorted(by_arch.items())},
        "undecidable": undecidable,
        "timings": analysis.timings,
    }


def _eagle3(root: Path, targets: Sequence[str], drafts: Sequence[str]) -> dict[str, Any]:
    try:
        contract = derive_contract(root)
    except ContractError as exc:
        return {"error": str(exc), "counts": {"derivation-failed": 1}, "classes": {}}
    tree = SourceTree([root])
    classes: dict[str, dict[str, str]] = {}
    counts: Counter[str] = Counter()
    wanted: list[tuple[Role, str]] = [("target", t) for t in targets] + [("draft", d) for d in drafts]
    for role, name in wanted:
        verdicts: dict[str, str] = {}
        for finding in check_class(tree, name, role, contract, include_optional=True):
            verdicts[finding.method] = finding.verdict
            counts[finding.verdict] += 1
        classes[f"{role}:{name}"] = verdicts
    return {**_contract_names(contract), "counts": dict(sorted(counts.items())), "classes": classes}


def _contract_names(contract: Contract) -> dict[str, Any]:
    """The derived contract as the row keeps it: its workers, and each role's required and optional names."""
    return {
        "workers": list(contract.workers),
        "required": {role: [r.name for r in contract.for_role(role)] for role in ("target", "draft")},
        "optional": {
            role: [r.name for r in contract.for_role(role, required_only=False) if not r.required]
            for role in ("target", "draft")
        },
    }


def analyse_release(
    version: str,
    root: Path,
    features: Mapping[str, Any],
    *,
    archs: Sequence[str] = ARCHS,
    targets: Sequence[str] = TARGETS,
    drafts: Sequence[str] = DRAFTS,
    selection: Mapping[str, Any] | None = None,
    flashinfer: tuple[str, Path] | None = None,
) -> dict[str, Any]:
    """One release's row: its capability counts, its EAGLE-3 verdicts and (with `selection`, the matrix's
    15-toolchain settings) its backend-selection counts (pure: the trees and the settings)."""
    start = time.perf_counter()
    row: dict[str, Any] = {
        "sglang": version,
        "tree": root.name,
        "capability": _capability(version, root, features, archs),
        "eagle3": _eagle3(root, targets, drafts),
    }
    if selection is not None:
        models = [{"target": t} for t in targets[:1]]  # Kimi K2.5, the default matrix's [[models]] target
        row["selection"] = selection_part(
            version, root, selection, archs, flashinfer=flashinfer, models=models
        )
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def _row_key(
    root: Path, features: Mapping[str, Any], archs: Sequence[str], code: str, extra: Sequence[object] = ()
) -> str:
    settings = json.dumps([dict(features), list(archs), list(TARGETS), list(DRAFTS), *extra], sort_keys=True)
    return hashlib.sha256(f"{code}\0{root.name}\0{settings}".encode()).hexdigest()


Job = tuple[str, str, dict[str, Any], tuple[str, ...], dict[str, Any], tuple[str, str] | None]


def _analyse_job(job: Job) -> dict[str, Any]:
    version, root, features, archs, selection, fi = job
    flashinfer = (fi[0], Path(fi[1])) if fi else None
    return analyse_release(
        version, Path(root), features, archs=archs, selection=selection, flashinfer=flashinfer
    )


def _fetcher(matrix: Matrix, echo: Any) -> Any:
    """flashinfer-python version -> its unpacked wheel from the matrix's index (the shared cache), or None."""
    from stackfarm.artifacts import Cache
    from stackfarm.errors import StackfarmError
    from stackfarm.plan import Component
    from stackfarm.resolve import Resolver

    resolver = Resolver(matrix, Cache())

    def fetch(version: str) -> Path | None:
        comp = Component(
            axis="flashinfer",
            distribution="flashinfer-python",
            version=version,
            index=matrix.index_for("flashinfer-python", version),
        )
        try:
            return resolver.cache.unpack(resolver.artifact(comp, "3.11"))
        except StackfarmError as exc:
            echo(f"flashinfer-python {version}: {exc}")
            return None

    return fetch


def releases(matrix: Matrix, first: str = FIRST) -> list[str]:
    """Every final sglang release on the matrix's index from `first` on, oldest first."""
    return [
        v for v in available_versions(matrix) if Version(v) >= Version(first) and not Version(v).is_prerelease
    ]


def run_corpus(
    matrix: Matrix,
    versions: Sequence[str],
    *,
    archs: Sequence[str] = ARCHS,
    jobs: int = 0,
    echo: Any = print,
    selection_on: bool = True,
) -> list[dict[str, Any]]:
    """The rows of `versions`, from the cache where the analyses already ran on the same wheel and code."""
    trees = sglang_trees(matrix, versions, echo=echo)
    features = dict(matrix.features)
    selection = _selection_settings(matrix) if selection_on else {}
    pinned = flashinfer_trees(trees, _fetcher(matrix, echo), echo) if selection else {}
    cache = JsonCache(default_root(), "corpus")
    code = _code_digest()
    rows: dict[str, dict[str, Any]] = {}
    todo: list[tuple[Job, str]] = []
    for version in versions:
        if version not in trees:
            continue
        job, key = _job(
            version,
            trees[version],
            pinned.get(version),
            features=features,
            archs=archs,
            selection=selection,
            code=code,
        )
        cached = cache.get(key)
        if cached is not None:
            rows[version] = cached
        else:
            todo.append((job, key))
    if todo:
        echo(f"analysing {len(todo)} release(s) ({len(rows)} from the cache)")
        rows |= _analyse_all(todo, cache, jobs, echo)
    return [rows[v] for v in versions if v in rows]


def _selection_settings(matrix: Matrix) -> dict[str, Any]:
    """15-toolchain's settings in the matrix (its selectors); {} when the matrix has no such suite."""
    suite = next((x for x in matrix.suites if x.name == SELECTION_SUITE), None)
    return dict(suite.settings) if suite is not None else {}


def _job(
    version: str,
    tree: Path,
    fi: tuple[str, Path] | None,
    *,
    features: dict[str, Any],
    archs: Sequence[str],
    selection: dict[str, Any],
    code: str,
) -> tuple[Job, str]:
    """One release's job (`fi`: the flashinfer release and tree it pins, when selection is read) and its
    row's cache key."""
    job: Job = (version, str(tree), features, tuple(archs), selection, (fi[0], str(fi[1])) if fi else None)
    return job, _row_key(tree, features, archs, code, [selection, fi[1].name if fi else None])


def _analyse_all(
    todo: Sequence[tuple[Job, str]], cache: JsonCache, jobs: int, echo: Any
) -> dict[str, dict[str, Any]]:
    """The rows of the jobs, in parallel processes (`jobs`, default one per core), each kept in the cache."""
    rows: dict[str, dict[str, Any]] = {}
    workers = jobs or max(1, min(len(todo), os.cpu_count() or 1))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = pool.map(_analyse_job, [job for job, _ in todo])
        for (job, key), row in zip(todo, results, strict=True):
            cache.put(key, row)
            rows[job[0]] = row
            echo(f"  sglang {job[0]}: {row['seconds']}s")
    return rows


# --------------------------------------------------------------------------------------------- the report


def _columns(rows: Sequence[Mapping[str, Any]], part: str) -> list[str]:
    found = {k for r in rows for k in r[part]["counts"]}
    if part == "eagle3":
        order = [*VERDICTS, "derivation-failed"]
        return [v for v in order if v in found] + sorted(found - set(order))
    return sorted(found)


def markdown(rows: Sequence[Mapping[str, Any]], archs: Sequence[str] = ARCHS) -> str:
    lines = [
        "# SGLang corpus: static verdicts per release",
        "",
        f"{len(rows)} releases, unpatched; capability on {', '.join(archs)} (reference {REFERENCE}); EAGLE-3 "
        f"targets {', '.join(TARGETS)}, draft {', '.join(DRAFTS)}.",
        "",
    ]
    lines += _md_eagle3(rows) + _md_capability(rows) + _md_selection(rows) + ["## Per release", ""]
    for r in rows:
        lines += _md_release(r)
    return "\n".join(lines) + "\n"


def _md_eagle3(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    eagle = _columns(rows, "eagle3")
    lines = [
        "## EAGLE-3 verdicts (one per class and contract name)",
        "",
        "| sglang | target needs | draft needs | " + " | ".join(eagle) + " |",
        "|---" * (len(eagle) + 3) + "|",
    ]
    for r in rows:
        e = r["eagle3"]
        need = e.get("required", {})
        lines.append(
            f"| {r['sglang']} | {len(need.get('target', []))} | {len(need.get('draft', []))} | "
            + " | ".join(str(e["counts"].get(c, 0)) for c in eagle)
            + " |"
        )
    total = _total(rows, "eagle3")
    return [*lines, "| **all** | | | " + " | ".join(f"**{total.get(c, 0)}**" for c in eagle) + " |", ""]


def _md_capability(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    cap = _columns(rows, "capability")
    lines = [
        "## 10-capability findings (outcome:verdict, all archs)",
        "",
        "| sglang | " + " | ".join(cap) + " |",
        "|---" * (len(cap) + 1) + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['sglang']} | " + " | ".join(str(r["capability"]["counts"].get(c, 0)) for c in cap) + " |"
        )
    lines.append("")
    return lines


def _md_selection(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The backend selection table, for the rows that have selection findings (none: no table)."""
    sel_rows = [r for r in rows if "selection" in r]
    if not sel_rows:
        return []
    outcomes = sorted({k for r in sel_rows for k in r["selection"]["counts"]})
    lines = [
        "## Backend selection (15-toolchain selectors, all archs and model families)",
        "",
        "| sglang | flashinfer | " + " | ".join(outcomes) + " |",
        "|---" * (len(outcomes) + 2) + "|",
    ]
    for r in sel_rows:
        sel = r["selection"]
        lines.append(
            f"| {r['sglang']} | {sel['flashinfer'] or '-'} | "
            + " | ".join(str(sel["counts"].get(o, 0)) for o in outcomes)
            + " |"
        )
    every = _total(sel_rows, "selection")
    lines.append("| **all** | | " + " | ".join(f"**{every.get(o, 0)}**" for o in outcomes) + " |")
    return [*lines, "", f"Toolchain: {sel_rows[0]['selection']['toolchain']}.", ""]


def _total(rows: Sequence[Mapping[str, Any]], part: str) -> Counter[str]:
    """The counts of one part of the rows, summed over the rows."""
    total = Counter[str]()
    for r in rows:
        total.update(r[part]["counts"])
    return total


def _md_release(r: Mapping[str, Any]) -> list[str]:
    lines = [f"### sglang {r['sglang']}", "", *_md_contract(r["eagle3"])]
    lines += ["", "| arch | capability findings |", "|---|---|"]
    for arch, counts in r["capability"]["by_arch"].items():
        lines.append(f"| {arch} | {', '.join(f'{k} {v}' for k, v in counts.items())} |")
    for line in r["capability"]["undecidable"][:5]:
        lines.append(f"- undecidable: {line}")
    for line in r.get("selection", {}).get("failures", [])[:8]:
        lines.append(f"- selection fails: {line}")
    lines.append("")
    return lines


def _md_contract(e: Mapping[str, Any]) -> list[str]:
    """A release's EAGLE-3 contract (what each role needs) and every class's verdicts."""
    if "error" in e:
        return [f"**derivation failed**: {e['error']}", ""]
    need = e["required"]
    lines = [f"- target needs: {', '.join(need['target'])}; draft needs: {', '.join(need['draft'])}"]
    opt = e["optional"]
    if opt["target"] or opt["draft"]:
        lines.append(
            f"- optional: target {', '.join(opt['target']) or '-'}; draft {', '.join(opt['draft']) or '-'}"
        )
    lines += ["", "| class | verdicts |", "|---|---|"]
    for cls, verdicts in e["classes"].items():
        text = ", ".join(f"{m}: {v}" for m, v in sorted(verdicts.items()))
        lines.append(f"| {cls} | {text} |")
    return lines


def counts_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The EAGLE-3 counts by verdict per release, as the markdown table of `markdown` (for a summary)."""
    text = markdown(rows)
    start = text.index("| sglang | target needs")
    return text[start : text.index("\n\n", start)]


def write(rows: Sequence[Mapping[str, Any]], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "corpus.md", out / "corpus.json"
    md.write_text(markdown(rows), encoding="utf-8")
    js.write_text(json.dumps(list(rows), indent=1, sort_keys=True), encoding="utf-8")
    return md, js


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stackfarm.corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", default=str(REPO / "matrix.toml"))
    parser.add_argument("--out", default=str(REPO / "reports" / "corpus"))
    parser.add_argument("--from", dest="first", default=FIRST, help=f"the oldest release (default {FIRST})")
    parser.add_argument("--only", nargs="*", default=None, help="just these releases")
    parser.add_argument("--jobs", type=int, default=0, help="parallel processes (default: one per core)")
    parser.add_argument(
        "--no-selection", action="store_true", help="leave out 15-toolchain's backend selection"
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    matrix = load_matrix(args.matrix)
    versions = args.only or releases(matrix, args.first)
    rows = run_corpus(matrix, versions, jobs=args.jobs, selection_on=not args.no_selection)
    md, js = write(rows, Path(args.out))
    failed = [r["sglang"] for r in rows if "error" in r["eagle3"]]
    print(counts_table(rows))
    print(f"\n{len(rows)} releases in {time.perf_counter() - start:.1f}s: {md}, {js}")
    if failed:
        print(f"EAGLE-3 derivation failed for {', '.join(failed)}: a bug of the derivation", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
