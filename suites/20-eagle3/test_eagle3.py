"""20-eagle3: the EAGLE-3 interface contract of the SGLang under test, checked on every configured model.

SGLang duck-types its models: the EAGLE-3 workers call `get_embed_and_head()` on the target, the model runner
calls `set_eagle3_layers_to_capture()`, the draft gets `set_embed()`... and a model without one of them fails
only at server start (Kimi K2.5 on 0.5.9). Here the contract is derived from the cell's own (patched) SGLang
tree by `stackfarm.analysis.eagle3`, then:

- test_contract: the derived contract, as the `contract` / `contract_json` properties (and
  eagle3-contract.json next to the JUnit file when pytest writes one);
- test_contract_diff: the diff against the nearest older SGLang in `compare_with` (its wheel resolved by the
  runner, which family.py's Needs.wheels asks for, and handed over unpacked in CellSpec.extras), plus how the
  configured classes' verdicts change, so an upgrade's interface changes are visible;
- test_provider[role:Class.name]: one testcase per (class, required name), with the properties model_class,
  method, verdict, provider_file, consumer_site (and role, provider_class, detail);
- test_runtime[Target+Draft]: on a GPU, the pair built from tiny configs in a child process (eagle3_probe.py).

Settings ([suites.20-eagle3.settings], family.py's Eagle3Settings, the `settings` fixture):
    extra_targets / extra_drafts   classes checked statically besides [[models]]
    compare_with                   SGLang versions to diff against (the nearest older one is used)
    runtime_pairs                  [[target, draft], ...] built on a GPU (default: Llama, [[models]] pairs)
    runtime_timeout                seconds per pair (default 900: the first run JIT-compiles kernels)
    attention_backend              for the runtime build (default "triton")

What the report shows (the contract texts, each class against the contract) goes into the suite's record
(family.py's Eagle3Record, the `results` fixture); the same facts stay testcase properties for JUnit readers.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from stackfarm import families
from stackfarm.analysis.eagle3 import (
    ROLES,
    Contract,
    Finding,
    Role,
    SourceTree,
    check_class,
    contract_key,
    derive_contract,
    diff_contracts,
    format_contract,
    format_diff,
    locate_class,
)
from stackfarm.artifacts import Cache
from stackfarm.cellspec import CellSpec, RecordProperty, load, visible
from stackfarm.family import Results
from stackfarm.proc import call
from stackfarm.suitekit import NA, need_gpu, not_applicable

SUITE = "20-eagle3"
#: The type of pytest's `record_property` fixture.
HERE = Path(__file__).resolve().parent
PROBE = HERE / "eagle3_probe.py"
#: This folder's family.py (its settings and record classes).
FAMILY = families.module(HERE / families.FAMILY_FILE)
_DEFAULT_RUNTIME_PAIRS = (("LlamaForCausalLM", "LlamaForCausalLMEagle3"),)
#: The seeds' pair, checked when matrix.toml has no [[models]].
_DEFAULT_MODELS = (
    {"name": "kimi-k2.5", "target": "KimiK25ForConditionalGeneration", "draft": "LlamaForCausalLMEagle3"},
)

# pytest's default junit_family (xunit2) warns about record_property, yet writes the properties the reports read.
pytestmark = pytest.mark.filterwarnings("ignore:record_property is incompatible:pytest.PytestWarning")

sys.path.insert(0, str(HERE))  # eagle3_probe: stdlib-only at import, safe on any machine
import eagle3_probe  # noqa: E402


def _spec() -> CellSpec | None:
    path = os.environ.get("STACKFARM_CELL")
    return load(path) if path else None


def _settings(cell: CellSpec) -> Any:
    """The suite's settings (family.py's Eagle3Settings), also at collection, where no fixture runs."""
    return FAMILY.FAMILY.settings_of(cell.settings.get(SUITE, {}))


@functools.cache
def _contract(root: str) -> Contract:
    """The tree's contract, kept on disk by a digest of what the derivation reads (and of its own code)."""
    memo = Cache().root / "eagle3" / f"contract-{contract_key(Path(root))[:40]}.json"
    if memo.is_file():
        return Contract.from_json(json.loads(memo.read_text(encoding="utf-8")))
    contract = derive_contract(Path(root))
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(contract.to_json()), encoding="utf-8")
    tmp.replace(memo)
    return contract


@functools.cache
def _check(root: str, name: str, role: Role) -> tuple[Finding, ...]:
    return check_class(SourceTree([Path(root)]), name, role, _contract(root), include_optional=True)


def _sglang_root(cell: CellSpec) -> Path:
    """The cell's (patched) SGLang tree; a cell without SGLang has no EAGLE-3 contract to check."""
    if not any(c.distribution == "sglang" for c in cell.components):
        not_applicable(
            NA.COMPONENT_ABSENT,
            f"the cell has no sglang component ({', '.join(c.distribution for c in cell.components)})",
        )
    return Path(cell.component("sglang").root)


def _classes(cell: CellSpec) -> list[tuple[Role, str]]:
    """(role, class) to check: every [[models]] target and draft, then the extra ones from the settings."""
    settings = _settings(cell)
    wanted: list[tuple[Role, str]] = []
    for model in cell.models or _DEFAULT_MODELS:
        wanted += [("target", model["target"]), ("draft", model["draft"])]
    wanted += [("target", name) for name in settings.extra_targets]
    wanted += [("draft", name) for name in settings.extra_drafts]
    return list(dict.fromkeys(wanted))


@functools.cache
def _findings(cell_path: str) -> tuple[Finding, ...]:
    cell = load(cell_path)
    root = str(_sglang_root(cell))
    return tuple(f for role, name in _classes(cell) for f in _check(root, name, role))


def _runtime_pairs(cell: CellSpec) -> list[tuple[str, str]]:
    configured = _settings(cell).runtime_pairs
    if configured is not None:
        return list(configured)
    pairs = [*_DEFAULT_RUNTIME_PAIRS, *((m["target"], m["draft"]) for m in cell.models or _DEFAULT_MODELS)]
    return list(dict.fromkeys(pairs))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    cell = _spec()
    if "finding" in metafunc.fixturenames:
        findings: tuple[Finding, ...] = ()
        if cell is not None:
            try:
                findings = _findings(os.environ["STACKFARM_CELL"])
            except Exception:  # test_contract reports the derivation error itself
                findings = ()
        metafunc.parametrize(
            "finding", findings, ids=[f"{f.role}:{f.model_class}.{f.method}" for f in findings]
        )
    if "pair" in metafunc.fixturenames:
        pairs = _runtime_pairs(cell) if cell is not None else []
        metafunc.parametrize("pair", pairs, ids=[f"{t}+{d}" for t, d in pairs])


def _report_dir(config: pytest.Config) -> Path | None:
    """The folder pytest writes the JUnit file into (the cell's report folder when the runner runs us)."""
    xmlpath = getattr(config.option, "xmlpath", None)
    return Path(xmlpath).resolve().parent if xmlpath else None


def _write_report(config: pytest.Config, key: str, value: object, *, fresh: bool = False) -> None:
    folder = _report_dir(config)
    if folder is None:
        return
    folder.mkdir(
        parents=True, exist_ok=True
    )  # pytest creates it only when it writes the JUnit file, at the end
    path = folder / "eagle3-contract.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() and not fresh else {}
    data[key] = value
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(path)


# --------------------------------------------------------------------------------------------- the contract


def test_contract(
    cell: CellSpec, record_property: RecordProperty, results: Results[Any], request: pytest.FixtureRequest
) -> None:
    contract = _contract(str(_sglang_root(cell)))
    record_property("sglang", contract.version)
    record_property("contract", format_contract(contract))
    results.add(
        "texts",
        FAMILY.ContractText(
            testcase=request.node.name,
            key="contract",
            text=format_contract(contract),
            version=contract.version,
        ),
    )
    record_property("contract_json", json.dumps(contract.to_json(), sort_keys=True))
    _write_report(request.config, "contract", contract.to_json(), fresh=True)
    print(format_contract(contract))
    for role in ROLES:
        # A derivation that reads nothing would let every class pass: that is a failure of the derivation.
        assert contract.for_role(role), (
            f"no required {role} attribute found on any EAGLE-3 path: derivation broken?"
        )


class _CannotFetch(Exception):
    """The older SGLang cannot be fetched here: the diff is left unanswered (a plain skip)."""


def _baseline_root(cell: CellSpec, version: str) -> Path:
    """The unpacked sglang wheel of `version`: the runner resolved it (family.py declares each compare_with
    version in Needs.wheels) with the matrix's [indexes] and [[route]], and hands it in CellSpec.extras."""
    wanted = FAMILY.requirement(version)
    extra = cell.extras.get(wanted)
    if extra is None:
        raise _CannotFetch(
            f"the runner handed no {wanted} in the cell's extras (a cell.json written by hand?)"
        )
    if not visible(extra.root):  # e.g. a container that does not see the runner's cache
        raise _CannotFetch(f"its tree {extra.root} is not visible where the suite runs")
    return Path(extra.root)


def test_contract_diff(
    cell: CellSpec,
    settings: Any,
    record_property: RecordProperty,
    results: Results[Any],
    request: pytest.FixtureRequest,
) -> None:
    current = Version(cell.component("sglang").version)
    versions = list(settings.compare_with)
    previous = FAMILY.baseline(settings, str(current))
    if previous is None:  # nothing configured to compare with: no question to answer
        not_applicable(
            NA.NOT_CONFIGURED,
            f"no SGLang older than {current} in [suites.{SUITE}.settings] compare_with = {versions}",
        )
    try:
        old_root = _baseline_root(cell, previous)
    except _CannotFetch as exc:  # the question stands, unanswered here
        pytest.skip(f"cannot fetch sglang {previous} to diff against: {exc}")
    old, new = _contract(str(old_root)), _contract(str(_sglang_root(cell)))
    changes = diff_contracts(old, new)
    text = format_diff(old, new, changes)
    # What the upgrade means for the configured classes (the old tree unpatched, the new one as in the cell).
    moved = []
    for role, name in _classes(cell):
        before = {f.method: f.verdict for f in _check(str(old_root), name, role)}
        after = {f.method: f.verdict for f in _check(str(_sglang_root(cell)), name, role)}
        for method in sorted(before.keys() | after.keys()):
            if before.get(method) != after.get(method):
                was, now = before.get(method, "not required"), after.get(method, "not required")
                moved.append(f"  {role} {name}.{method}: {was} ({previous}) -> {now} ({current})")
    verdicts = "verdict changes:\n" + "\n".join(moved) if moved else "verdict changes: none"
    record_property("compared_with", previous)
    record_property("contract_diff", text)
    record_property("verdict_diff", verdicts)
    for key, shown in (("contract_diff", text), ("verdict_diff", verdicts)):
        results.add(
            "texts", FAMILY.ContractText(testcase=request.node.name, key=key, text=shown, version=previous)
        )
    _write_report(
        request.config, "diff", {"from": previous, "to": str(current), "contract": text, "verdicts": moved}
    )
    print(text, verdicts, sep="\n")
    assert old.requirements, f"the contract of sglang {previous} came out empty: nothing to diff against"


# --------------------------------------------------------------------------------------------- providers


_CHECKED = ("model_class", "method", "verdict", "provider_file", "consumer_site", "role", "provider_class")


def test_provider(
    finding: Finding, record_property: RecordProperty, results: Results[Any], request: pytest.FixtureRequest
) -> None:
    for key in _CHECKED:
        record_property(key, getattr(finding, key))
    record_property("detail", finding.detail)
    facts = {key: str(getattr(finding, key)) for key in _CHECKED}
    results.add("classes", FAMILY.ClassCheck(testcase=request.node.name, detail=finding.detail, **facts))
    assert finding.ok, (
        f"{finding.role} {finding.model_class}: {finding.verdict} {finding.method}: {finding.detail}"
    )


# --------------------------------------------------------------------------------------------- on a GPU


def test_runtime(
    cell: CellSpec, pair: tuple[str, str], record_property: RecordProperty, tmp_path: Path
) -> None:
    target, draft = pair
    need_gpu(cell)
    missing = [
        n
        for n, known in ((target, eagle3_probe.TINY_TARGETS), (draft, eagle3_probe.TINY_DRAFTS))
        if n not in known
    ]
    if missing:  # the pair is configured, but this probe cannot build it: unanswered, not inapplicable
        pytest.skip(f"no tiny config for {', '.join(missing)} in eagle3_probe.py: built only statically")
    settings = _settings(cell)
    root = _sglang_root(cell)
    contract = _contract(str(root))
    needs = {role: ",".join(r.name for r in contract.for_role(role)) for role in ROLES}
    modules = {}
    for role, name in (("target", target), ("draft", draft)):
        found = locate_class(SourceTree([root]), name)
        assert found is not None, f"no class {name} in the cell's SGLang tree: nothing to build"
        modules[role] = found[0]
    out = tmp_path / "result.json"
    argv = [
        sys.executable,
        str(PROBE),
        "--target",
        target,
        "--draft",
        draft,
        "--workdir",
        str(tmp_path / "models"),
        "--out",
        str(out),
        "--target-needs",
        needs["target"],
        "--draft-needs",
        needs["draft"],
        "--target-module",
        modules["target"],
        "--draft-module",
        modules["draft"],
        "--attention-backend",
        settings.attention_backend,
    ]
    # The cell's (patched) SGLang tree first, so the code under test is what the child imports.
    pythonpath = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    timeout = settings.runtime_timeout
    outcome = call(argv, env={"PYTHONPATH": pythonpath}, timeout=timeout, log=tmp_path / "probe.log")
    record_property("probe_log_tail", outcome.output[-3000:])
    assert out.is_file(), (
        f"the probe wrote no result (exit {outcome.returncode}, timed out: {outcome.timed_out}); "
        f"last output: {outcome.output[-1500:]}"
    )
    result = json.loads(out.read_text(encoding="utf-8"))
    record_property("probe_sglang", result.get("sglang", "?"))
    for check in result["checks"]:
        record_property(
            f"{check['role']}.{check['name']}", f"{'ok' if check['ok'] else 'FAILED'}: {check['detail']}"
        )
    failed = [f"{c['role']}.{c['name']}: {c['detail']}" for c in result["checks"] if not c["ok"]]
    assert "error" not in result, (
        f"{result['error']} after {len(result['checks'])} check(s): {result['traceback']}"
    )
    assert not failed, "; ".join(failed)
    exercised = {(c["role"], c["name"]) for c in result["checks"]}
    not_run = [
        f"{role}.{n}" for role in ROLES for n in needs[role].split(",") if n and (role, n) not in exercised
    ]
    assert not not_run, f"the probe did not exercise {not_run}"
