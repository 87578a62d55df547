"""30-numerics: after the upgrade, does the model still compute the same thing? Every divergence explained.

Testcases (JUnit properties on each: max_abs_err, tolerance, match_rate, first_divergence, near_ties; "n/a" where
one does not apply):

- test_settings / test_model_inputs: [suites.30-numerics.settings] and the model folders it names, checked on
  every machine, so bad input is reported as a failing testcase with the key and the fix, never as a crash.
- test_e2e_cpu[assisted-<dtype>]: HF transformers on CPU, a tiny random Llama written here, plain greedy vs
  assisted generation with a layer-skipping draft; the comparison below runs end to end without a GPU.
- test_e2e_cpu_planted[...]: the same with a planted divergence (the speculative path emits its least likely
  token once): it passes when the comparison reports that divergence as real (pytest.raises), and fails if the
  comparison stops catching it. (Not an xfail: an xfail is a known defect, which the verdict rule counts as
  an unanswered skip; this is a check that works.)
- test_kernel[<op>-<dtype>] (GPU): the cell's sgl-kernel ops (rmsnorm, fused_add_rmsnorm, silu_and_mul, rotary
  embedding, top-k / top-p renorm; the norms and renorms run flashinfer's kernels when sgl_kernel finds it)
  against float32 references, within the per-dtype tolerance.
- test_sampling[top_k_top_p_sampling_from_probs-float32] (GPU): flashinfer's fused sampling with a fixed seed,
  judged statistically (chi-square against the renormalised distribution).
- test_tree_kernel[<kernel>-<dtype>] (GPU): build_tree_kernel_efficient, verify_tree_greedy and
  tree_speculative_sampling_target_only against the reference tree acceptance, on hypothesis-generated trees.
- test_e2e_gpu[<config>-<dtype>] (GPU): SGLang's offline Engine, one child process per configuration, greedy on
  a tiny peaked Llama (or settings.model_path): baseline vs EAGLE-3 (chain and tree drafting), and flashinfer
  allreduce fusion / torch symmetric memory on vs off (those need 2+ GPUs: tensor parallelism; skipped below).

A divergence is judged where it first happens: a near-tie (the baseline's top-1/top-2 logprob gap within the tie
tolerance, max(near_tie_tol, drift_factor x the drift the two runs show where they agree), and the candidate took
the runner-up) is tolerated up to max_near_tie_rate of the prompts; anything else fails, and so does a drift over
max_drift. max_abs_err on an end-to-end testcase is that drift (nats).
See stackfarm.numerics.settings for every setting and the tolerances' reasoning. Every end-to-end comparison
(with the divergent prompts' tokens) also goes to $STACKFARM_SUITE_OUT/numerics.json, and the SGLang engines'
logs to $STACKFARM_SUITE_OUT/numerics-logs/.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numerics_cases
import pytest
from numerics_cases import ELEMENTWISE

from stackfarm.cellspec import CellSpec, load
from stackfarm.junit import NA
from stackfarm.numerics.compare import Comparison, Generation, compare, judge
from stackfarm.numerics.engines import (
    EAGLE3_CHAIN,
    EAGLE3_TREE,
    Engine,
    EngineError,
    EngineOutOfMemory,
    HFEngine,
    Plant,
    SGLangEngine,
    cuda_toolchain_env,
    make_prompts,
)
from stackfarm.numerics.pathmodel import (
    BUGS,
    CPU_PATH,
    PATH_TARGET,
    path_sequence,
    write_draft_path,
    write_target_path,
)
from stackfarm.numerics.planted import (
    expected_accept_length,
    planted_sequence,
    write_draft_planted,
    write_target_planted,
)
from stackfarm.numerics.settings import SUITE, Settings, SettingsError
from stackfarm.numerics.tinymodels import (
    CPU_TARGET,
    GPU_TARGET,
    ModelInputError,
    check_draft,
    read_config,
    write_assistant,
    write_eagle3_draft,
    write_target,
)
from stackfarm.suitekit import check_installed, need_gpu, need_gpus, not_applicable, stack_module

# pytest's default junit_family (xunit2) warns about record_property, yet writes the properties the reports read.
pytestmark = pytest.mark.filterwarnings("ignore:record_property is incompatible:pytest.PytestWarning")

#: The type of pytest's record_property fixture.
RecordProperty = Callable[[str, object], None]
#: Every testcase carries these, "n/a" when one does not apply.
STANDARD = ("max_abs_err", "tolerance", "match_rate", "first_divergence", "near_ties")


def _record(record_property: RecordProperty, **values: object) -> None:
    for key in STANDARD:
        record_property(key, str(values.pop(key, "n/a")))
    for key, value in values.items():
        record_property(key, str(value))


@functools.cache
def _parsed(cell_path: str) -> Settings | SettingsError:
    try:
        return Settings.from_mapping(load(cell_path).settings.get(SUITE) or {})
    except SettingsError as exc:
        return exc


def _collection_settings() -> Settings:
    """Settings for parametrising at collection: the defaults when the cell or its settings are unusable
    (test_settings then reports why)."""
    path = os.environ.get("STACKFARM_CELL")
    found = _parsed(path) if path else None
    return found if isinstance(found, Settings) else Settings()


@pytest.fixture(scope="session")
def settings(cell: CellSpec) -> Settings:
    try:
        return Settings.from_mapping(cell.settings.get(SUITE) or {})
    except SettingsError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("numerics")


#: Every end-to-end comparison of the session, for $STACKFARM_SUITE_OUT/numerics.json.
_REPORT: list[dict[str, Any]] = []


@pytest.fixture(scope="session", autouse=True)
def _suite_out(workdir: Path) -> Iterator[None]:
    """After the session: numerics.json (every comparison, with the divergent prompts' tokens) and the SGLang
    engines' logs, into $STACKFARM_SUITE_OUT (the cell's reports folder) when the runner sets it."""
    yield
    out = os.environ.get("STACKFARM_SUITE_OUT")
    if not out:
        return
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "numerics.json").write_text(json.dumps(_REPORT, indent=2), encoding="utf-8")
    for log in sorted((workdir / "runs").glob("*/child.log")):
        (folder / "numerics-logs").mkdir(exist_ok=True)
        shutil.copyfile(log, folder / "numerics-logs" / f"{log.parent.name}.log")


@pytest.fixture(scope="session", autouse=True)
def _cuda_toolchain(cell: CellSpec, workdir: Path, record_testsuite_property: RecordProperty) -> None:
    """On a GPU, before anything JIT-compiles: CUDA_HOME for flashinfer's and SGLang's JIT (nvcc may be a
    wrapper script, whose dirname(dirname()) is no toolkit), unless the environment already sets one."""
    if cell.no_gpu_reason is not None:
        return
    env, note = _toolchain(workdir)
    if "CUDA_HOME" not in os.environ:
        os.environ.update(dict(env))
    record_testsuite_property("numerics.toolchain", f"CUDA_HOME={os.environ.get('CUDA_HOME')} ({note})")


def test_settings(cell: CellSpec, record_property: RecordProperty) -> None:
    """The settings parse; the effective values (defaults filled in) are recorded."""
    try:
        found = Settings.from_mapping(cell.settings.get(SUITE) or {})
    except SettingsError as exc:
        _record(record_property, detail=str(exc))
        pytest.fail(str(exc), pytrace=False)
    tolerances = "; ".join(f"{dtype}: {tol.describe()}" for dtype, tol in found.tolerances.items())
    _record(
        record_property,
        tolerance=tolerances,
        near_tie_tol=found.near_tie_tol,
        drift_factor=found.drift_factor,
        max_drift=found.max_drift,
        max_near_tie_rate=found.max_near_tie_rate,
        prompts=found.prompts,
        prompt_len=found.prompt_len,
        max_new_tokens=found.max_new_tokens,
        model_path=found.model_path or f"tiny {found.model} model (written by the suite)",
        model=found.model,
        logit_std=found.logit_std,
        fp32_lm_head=found.fp32_lm_head,
    )


def test_model_inputs(settings: Settings, record_property: RecordProperty) -> None:
    """A configured model_path / draft_path exists, has a config, and the draft fits the target."""
    if settings.model_path is None:
        _record(record_property, model=f"tiny {settings.model} Llama written by the suite")
        return
    try:
        target = read_config(settings.model_path)
        _record(
            record_property,
            model=settings.model_path,
            hidden_size=target["hidden_size"],
            vocab_size=target["vocab_size"],
        )
        if settings.draft_path is not None:
            check_draft(target, read_config(settings.draft_path), role="eagle3")
            record_property("draft", settings.draft_path)
    except ModelInputError as exc:
        pytest.fail(f"[suites.{SUITE}.settings]: {exc}", pytrace=False)


# --------------------------------------------------------------------------- end to end, shared


class RealDivergence(AssertionError):
    """A divergence no near-tie explains: what the planted test must produce (and nothing else may)."""


def _generate(
    engine: Engine, prompts: tuple[tuple[int, ...], ...], max_new_tokens: int
) -> tuple[Generation, ...]:
    """Generations, or a skip (GPU out of memory, with the size asked for) or a failure with the engine's log."""
    try:
        return engine.generate(prompts, max_new_tokens)
    except EngineOutOfMemory as exc:
        pytest.skip(f"{engine.label}: {exc}")
    except EngineError as exc:
        pytest.fail(f"{exc}\n--- end of the engine's output ---\n{exc.log_tail[-2500:]}", pytrace=False)


def _tie_rate(settings: Settings) -> float:
    """The tolerated near-tie rate: the suite's random model is near-uniform, its ties a measurement (reported in
    near_ties, never judged); every other model is judged by max_near_tie_rate."""
    return 1.0 if settings.model == "random" and settings.model_path is None else settings.max_near_tie_rate


def _judge_runs(
    settings: Settings,
    baseline: tuple[Generation, ...],
    candidate: tuple[Generation, ...],
    record_property: RecordProperty,
    **extra: object,
) -> Comparison:
    comparison = compare(
        baseline, candidate, near_tie_tol=settings.near_tie_tol, drift_factor=settings.drift_factor
    )
    verdict = judge(comparison, max_near_tie_rate=_tie_rate(settings), max_drift=settings.max_drift)
    props = comparison.properties()
    props["tolerance"] = (
        f"tie gap <= max(near_tie_tol {settings.near_tie_tol:g}, {settings.drift_factor:g} x drift) = "
        f"{comparison.tie_tol:.4g}; near-ties on <= {settings.max_near_tie_rate:g} of prompts; "
        f"drift <= {settings.max_drift:g}"
    )
    _record(record_property, **props, verdict=verdict.message, **extra)
    _REPORT.append(
        {
            "test": os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0],
            "ok": verdict.ok,
            "verdict": verdict.message,
            "properties": props,
            "extra": {k: str(v) for k, v in extra.items()},
            "divergences": [
                {
                    **dataclasses.asdict(d),
                    "baseline_tokens": list(baseline[d.prompt_index].tokens),
                    "candidate_tokens": list(candidate[d.prompt_index].tokens),
                }
                for d in comparison.divergences
            ],
        }
    )
    if comparison.real:
        raise RealDivergence(verdict.message)
    assert verdict.ok, verdict.message
    return comparison


# --------------------------------------------------------------------------- end to end, CPU (HF transformers)


#: The planted variant's changed pair (stackfarm.numerics.planted): the reference target, wrong on one pair.
PLANTED_PAIR = (100, 102)


@dataclass(frozen=True)
class CpuModels:
    target: Path
    assistant: Path
    vocab: int
    #: model = "planted": the target that alternates on PLANTED_PAIR (a planted real divergence).
    variant: Path | None = None
    #: model = "path": the target with each planted kernel-like defect (pathmodel.BUGS), by name.
    bugs: Mapping[str, Path] = dataclasses.field(default_factory=dict)


@pytest.fixture(scope="session")
def cpu_models(settings: Settings, workdir: Path) -> CpuModels:
    pytest.importorskip("torch", reason="the CPU engine needs torch (CPU build) in the suite's Python")
    pytest.importorskip("transformers", reason="the CPU engine needs transformers in the suite's Python")
    pytest.importorskip("safetensors", reason="the tiny models are written as safetensors")
    if settings.model == "path":
        target = write_target_path(workdir / "cpu-target", CPU_PATH, seed=settings.seed)
        bugs: dict[str, Path] = {
            bug: write_target_path(workdir / f"cpu-{bug}-bug", CPU_PATH, seed=settings.seed, bug=bug)
            for bug in BUGS
        }
        assistant = write_assistant(workdir / "cpu-assistant", target, layers=2)
        return CpuModels(target=target, assistant=assistant, vocab=CPU_PATH.vocab, bugs=bugs)
    if settings.model == "planted":
        # The GPU shape (hidden 256): its margin is ~hidden - 3.3 sqrt(hidden) ~ 160 nats; CPU_TARGET's is ~40.
        target = write_target_planted(workdir / "cpu-target", GPU_TARGET, seed=settings.seed)
        variant = write_target_planted(
            workdir / "cpu-variant", GPU_TARGET, swap=PLANTED_PAIR, seed=settings.seed
        )
        assistant = write_assistant(workdir / "cpu-assistant", target)
        return CpuModels(target=target, assistant=assistant, vocab=GPU_TARGET.vocab, variant=variant)
    target = write_target(
        workdir / "cpu-target",
        CPU_TARGET,
        seed=settings.seed + 1234,
        logit_std=settings.logit_std,
        dtype="float32",
    )
    assistant = write_assistant(workdir / "cpu-assistant", target)
    return CpuModels(target=target, assistant=assistant, vocab=CPU_TARGET.vocab)


@functools.cache
def _cpu_baseline(
    target: Path, dtype: str, prompts: tuple[tuple[int, ...], ...], max_new: int
) -> tuple[Generation, ...]:
    return _generate(HFEngine(model=target, dtype=dtype), prompts, max_new)


def _cpu_prompts(settings: Settings, vocab: int) -> tuple[tuple[int, ...], ...]:
    return make_prompts(settings.prompts, settings.prompt_len, vocab, seed=settings.seed)


def _check_planted(
    settings: Settings, runs: tuple[Generation, ...], vocab: int, record_property: RecordProperty
) -> None:
    """model = "planted" / "path": the target computes what was planted (repeat the last token / each token a
    permutation of the token two back), token for token: a kernel bug both runs share is caught here."""
    if settings.model_path is not None or settings.model not in ("planted", "path"):
        return

    def want(prompt: tuple[int, ...], count: int) -> list[int]:
        if settings.model == "planted":
            return planted_sequence(prompt, count)
        return path_sequence(prompt, count, vocab, settings.seed)

    function = "repeat the last token" if settings.model == "planted" else "perm[the token two back]"
    wrong = [i for i, g in enumerate(runs) if list(g.tokens) != want(g.prompt, len(g.steps))]
    record_property("planted_function", function)
    record_property("planted_mismatches", str(wrong) if wrong else "none")
    assert not wrong, f"the {settings.model} target did not compute {function} on prompts {wrong}"


@pytest.mark.parametrize("dtype", _collection_settings().cpu_dtypes, ids=lambda d: f"assisted-{d}")
def test_e2e_cpu(
    dtype: str, settings: Settings, cpu_models: CpuModels, record_property: RecordProperty
) -> None:
    """HF greedy vs HF assisted generation (multi-token verify with a draft) on CPU."""
    prompts = _cpu_prompts(settings, cpu_models.vocab)
    baseline = _cpu_baseline(cpu_models.target, dtype, prompts, settings.max_new_tokens)
    _check_planted(settings, baseline, cpu_models.vocab, record_property)
    candidate = _generate(
        HFEngine(model=cpu_models.target, assistant=cpu_models.assistant, dtype=dtype),
        prompts,
        settings.max_new_tokens,
    )
    _judge_runs(settings, baseline, candidate, record_property, engine="hf-transformers (CPU)", dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32"], ids=lambda d: f"assisted-{d}")
def test_e2e_cpu_planted(
    dtype: str, settings: Settings, cpu_models: CpuModels, record_property: RecordProperty
) -> None:
    """The speculative path emits its least likely token at step 3 of prompt 0: a real divergence."""
    prompts = _cpu_prompts(settings, cpu_models.vocab)
    baseline = _cpu_baseline(cpu_models.target, dtype, prompts, settings.max_new_tokens)
    planted = HFEngine(
        model=cpu_models.target,
        assistant=cpu_models.assistant,
        dtype=dtype,
        plant=Plant(position=min(3, settings.max_new_tokens - 1), prompts=(0,)),
    )
    candidate = _generate(planted, prompts, settings.max_new_tokens)
    # The check passes when the comparison reports the planted divergence as real (and nothing else happens).
    with pytest.raises(RealDivergence):
        _judge_runs(
            settings,
            baseline,
            candidate,
            record_property,
            engine="hf-transformers (CPU), planted",
            dtype=dtype,
        )


def test_e2e_cpu_planted_target(
    settings: Settings, cpu_models: CpuModels, record_property: RecordProperty
) -> None:
    """model = "planted": the reference target vs its variant that alternates on one pair, prompt 0 ending in
    the pair: the divergence at its first token has a gap of ~hidden nats, so it is real, never a near-tie."""
    if cpu_models.variant is None:
        not_applicable(NA.NOT_CONFIGURED, 'runs with model = "planted" only')
    first, *rest = _cpu_prompts(settings, cpu_models.vocab)
    prompts = ((*first[:-1], PLANTED_PAIR[0]), *rest)
    baseline = _cpu_baseline(cpu_models.target, "float32", prompts, settings.max_new_tokens)
    candidate = _generate(
        HFEngine(model=cpu_models.variant, name="hf-variant"), prompts, settings.max_new_tokens
    )
    with pytest.raises(RealDivergence):  # it must be reported as real: ~hidden nats, never a near-tie
        _judge_runs(
            settings, baseline, candidate, record_property, engine="hf-transformers (CPU), planted variant"
        )


@pytest.mark.parametrize("bug", BUGS)
def test_e2e_cpu_bug(
    bug: str, settings: Settings, cpu_models: CpuModels, record_property: RecordProperty
) -> None:
    """model = "path": the target vs its variant with a planted kernel-like defect (attention reading the current
    position instead of the previous one; the MLP's output rows off by one): every prompt must diverge, and as
    real (gaps of tens of nats), never as a near-tie. It fails if the comparison, or the model, stops seeing it."""
    if bug not in cpu_models.bugs:
        not_applicable(NA.NOT_CONFIGURED, 'runs with model = "path" only')
    prompts = _cpu_prompts(settings, cpu_models.vocab)
    baseline = _cpu_baseline(cpu_models.target, "float32", prompts, settings.max_new_tokens)
    candidate = _generate(
        HFEngine(model=cpu_models.bugs[bug], name=f"hf-{bug}-bug"), prompts, settings.max_new_tokens
    )
    with pytest.raises(RealDivergence) as caught:
        _judge_runs(
            settings, baseline, candidate, record_property, engine=f"hf-transformers (CPU), {bug} bug"
        )
    assert " 0 near-tie(s)" in str(caught.value), (
        f"a planted {bug} defect is never a near-tie: {caught.value}"
    )


# --------------------------------------------------------------------------- GPU: the cell's stack


def _torch_cuda(cell: CellSpec) -> Any:
    need_gpu(cell)
    torch = stack_module(cell, "torch", ("torch",))
    if not torch.cuda.is_available():
        pytest.fail(
            f"a GPU was reported but torch.cuda.is_available() is False ({torch.__version__})", pytrace=False
        )
    return torch


def _oom_skip(exc: BaseException, asked: str) -> None:
    tried = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", str(exc))
    pytest.skip(
        f"GPU out of memory: asked for {tried.group(1) if tried else asked} ({str(exc).splitlines()[0]})"
    )


# --------------------------------------------------------------------------- GPU: kernels vs references


@pytest.mark.parametrize(
    ("op", "dtype"), [(op, d) for op, (ds, _) in ELEMENTWISE.items() for d in ds], ids=str
)
def test_kernel(
    cell: CellSpec, settings: Settings, op: str, dtype: str, record_property: RecordProperty
) -> None:
    """One sgl-kernel op in one dtype against its float32 reference (several deployment shapes, worst kept)."""
    torch = _torch_cuda(cell)
    sgl = stack_module(cell, "sgl_kernel", ("sglang-kernel", "sgl-kernel"))
    _, case = ELEMENTWISE[op]
    tol = settings.tolerances[dtype]
    try:
        result = case(sgl, torch, getattr(torch, dtype), tol, settings.seed, "cuda")
    except torch.cuda.OutOfMemoryError as exc:
        _oom_skip(exc, "the case's inputs (a few hundred MiB at most)")
    stats = result.stats
    _record(
        record_property,
        max_abs_err=f"{stats.max_abs_err:.4g}",
        tolerance=tol.describe(),
        match_rate=f"{stats.match_rate:.6f}",
        first_divergence="none" if stats.ok else stats.describe(),
        near_ties="n/a",
        impl=result.impl,
        worst_ratio=f"{stats.worst_ratio:.3f}",
        **result.notes,
    )
    assert stats.ok, f"{op} ({result.impl}) vs the float32 reference, {tol.describe()}: {stats.describe()}"


@pytest.mark.parametrize("case", ["top_k_top_p_sampling_from_probs-float32"])
def test_sampling(cell: CellSpec, settings: Settings, case: str, record_property: RecordProperty) -> None:
    """flashinfer's fused top-k/top-p sampling, seeded, judged by a chi-square test (p >= 1e-4)."""
    torch = _torch_cuda(cell)
    flashinfer = stack_module(cell, "flashinfer", ("flashinfer-python",))
    try:
        result = numerics_cases.top_k_top_p_sampling(flashinfer, torch, settings.seed, "cuda")
    except torch.cuda.OutOfMemoryError as exc:
        _oom_skip(exc, "65536 samples of a 64-token distribution")
    notes = result.notes
    _record(
        record_property,
        max_abs_err=f"{result.stats.max_abs_err:.4g}",
        tolerance="chi-square p >= 1e-4, no sample outside the top-k/top-p set",
        match_rate=f"{result.stats.match_rate:.6f}",
        first_divergence="none"
        if result.stats.ok
        else f"p={notes['pvalue']}, outside={notes['outside_kept_set']}",
        near_ties="n/a",
        impl=result.impl,
        **notes,
    )
    assert result.stats.ok, (
        f"{case}: chi2 {notes['chi2']} on {notes['dof']} dof (p {notes['pvalue']}), "
        f"{notes['outside_kept_set']} samples outside the kept set"
    )


TREE_KERNELS = (
    ("build_tree_kernel_efficient", "int64"),
    ("verify_tree_greedy", "int64"),
    ("tree_speculative_sampling_target_only", "float32"),
)


@pytest.mark.parametrize(("kernel", "dtype"), TREE_KERNELS, ids=str)
def test_tree_kernel(
    cell: CellSpec, settings: Settings, kernel: str, dtype: str, record_property: RecordProperty
) -> None:
    """An EAGLE tree kernel against the reference tree acceptance, on hypothesis-generated trees."""
    torch = _torch_cuda(cell)
    sgl = stack_module(cell, "sgl_kernel", ("sglang-kernel", "sgl-kernel"))
    hypothesis = pytest.importorskip(
        "hypothesis", reason="the tree checks are property-based (pip install hypothesis)"
    )
    import numerics_strategies  # hypothesis at import

    stats = {"examples": 0, "failed": 0, "ties": 0}
    first: list[str] = []

    def check(case: Any) -> None:
        stats["examples"] += 1
        if kernel == "build_tree_kernel_efficient":
            problems = [
                f"mode {m}: {p}"
                for m in (0, 1)
                for p in numerics_cases.build_tree(sgl, torch, case, m, "cuda")
            ]
        elif kernel == "verify_tree_greedy":
            problems = numerics_cases.verify_greedy(sgl, torch, case, "cuda")
        else:
            problems, ties = numerics_cases.verify_sampling(sgl, torch, case, "cuda")
            stats["ties"] += ties
        if problems:
            stats["failed"] += 1
            if not first:
                first.append(
                    f"{problems[0]} (topk {case.trees[0].topk}, depth {case.trees[0].depth}, "
                    f"{case.trees[0].num_draft} draft tokens, batch {len(case.trees)})"
                )
        assert not problems, "; ".join(problems[:5])

    run = hypothesis.settings(
        max_examples=settings.tree_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )(hypothesis.given(numerics_strategies.tree_cases(sampling=kernel.startswith("tree_speculative")))(check))
    try:
        run()
    finally:
        examples = max(stats["examples"], 1)
        _record(
            record_property,
            max_abs_err="0" if not stats["failed"] else "n/a",
            tolerance="exact (index outputs); bonus token within 1e-5 of its cumulative interval",
            match_rate=f"{1 - stats['failed'] / examples:.4f}",
            first_divergence=first[0] if first else "none",
            near_ties=stats["ties"],
            examples=stats["examples"],
        )


# --------------------------------------------------------------------------- GPU: SGLang end to end


@dataclass(frozen=True, kw_only=True)
class E2EConfig:
    """A candidate configuration and the reference it must reproduce."""

    name: str
    reference: Mapping[str, Any]
    candidate: Mapping[str, Any]
    needs_draft: bool = False
    #: GPUs needed (tensor parallelism: the allreduce features only act on a cross-GPU sum).
    gpus: int = 1


_TP2 = {"tp_size": 2}
#: SGLang's per-request accept length counts the prefill token (32 tokens / 8 verifies = 4, give or take one).
PLANTED_ACCEPT_TOL = 0.25
#: The path draft's accept length floor on the chain (3 steps, top-1): 3.99 simulated, 4.000 measured on the H200.
PATH_ACCEPT_FLOOR = 3.0
E2E = (
    E2EConfig(name="eagle3", reference={}, candidate=EAGLE3_CHAIN, needs_draft=True),
    E2EConfig(name="eagle3-tree", reference={}, candidate=EAGLE3_TREE, needs_draft=True),
    # Off means off: SGLang >= 0.5.15 may switch the fusion on by itself (options a release lacks are dropped).
    E2EConfig(
        name="allreduce-fusion",
        reference={**_TP2, "enforce_disable_flashinfer_allreduce_fusion": True},
        candidate={**_TP2, "enable_flashinfer_allreduce_fusion": True},
        gpus=2,
    ),
    E2EConfig(
        name="symm-mem",
        reference={**_TP2, "enforce_disable_flashinfer_allreduce_fusion": True},
        candidate={
            **_TP2,
            "enforce_disable_flashinfer_allreduce_fusion": True,
            "enable_torch_symm_mem": True,
        },
        gpus=2,
    ),
)


@dataclass(frozen=True)
class GpuModels:
    target: Path
    draft: Path | None
    vocab: int
    #: model = "path": the target with each planted kernel-like defect (pathmodel.BUGS), by name.
    bugs: Mapping[str, Path] = dataclasses.field(default_factory=dict)


@pytest.fixture(scope="session")
def gpu_models(settings: Settings, workdir: Path) -> GpuModels:
    if settings.model_path is not None:
        try:
            target = read_config(settings.model_path)
            if settings.draft_path is not None:
                check_draft(target, read_config(settings.draft_path), role="eagle3")
        except ModelInputError as exc:
            pytest.fail(f"[suites.{SUITE}.settings]: {exc}", pytrace=False)
        draft = Path(settings.draft_path) if settings.draft_path else None
        return GpuModels(target=Path(settings.model_path), draft=draft, vocab=int(target["vocab_size"]))
    pytest.importorskip("safetensors", reason="the tiny models are written as safetensors")
    if settings.model == "path":
        target_dir = write_target_path(workdir / "gpu-target", PATH_TARGET, seed=settings.seed)
        bugs: dict[str, Path] = {
            bug: write_target_path(workdir / f"gpu-{bug}-bug", PATH_TARGET, seed=settings.seed, bug=bug)
            for bug in BUGS
        }
        draft_dir = write_draft_path(workdir / "gpu-eagle3", PATH_TARGET, seed=settings.seed)
        return GpuModels(target=target_dir, draft=draft_dir, vocab=PATH_TARGET.vocab, bugs=bugs)
    if settings.model == "planted":
        target_dir = write_target_planted(workdir / "gpu-target", GPU_TARGET, seed=settings.seed)
        draft_dir = write_draft_planted(workdir / "gpu-eagle3", GPU_TARGET, seed=settings.seed)
        return GpuModels(target=target_dir, draft=draft_dir, vocab=GPU_TARGET.vocab)
    target_dir = write_target(
        workdir / "gpu-target",
        GPU_TARGET,
        seed=settings.seed + 1234,
        logit_std=settings.logit_std,
        dtype=settings.dtype,
    )
    draft_dir = write_eagle3_draft(
        workdir / "gpu-eagle3",
        GPU_TARGET,
        seed=settings.seed + 4321,
        logit_std=settings.logit_std,
        dtype=settings.dtype,
    )
    return GpuModels(target=target_dir, draft=draft_dir, vocab=GPU_TARGET.vocab)


_RUNS: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Generation, ...]] = {}


@functools.cache
def _toolchain(workdir: Path) -> tuple[tuple[tuple[str, str], ...], str]:
    env, note = cuda_toolchain_env(workdir)
    return tuple(env.items()), note


def _sglang_run(
    settings: Settings,
    models: GpuModels,
    workdir: Path,
    name: str,
    options: Mapping[str, Any],
    draft: bool,
    required: tuple[str, ...] = (),
    target: Path | None = None,
) -> tuple[Generation, ...]:
    """One engine configuration's generations, each configuration run once per session (baselines are shared);
    `target` runs another target (a planted defect) with the same options."""
    opts = dict(options)
    if settings.fp32_lm_head:
        opts["enable_fp32_lm_head"] = True
    role = name if draft or target is not None else "reference"
    key = (role, tuple(sorted((k, repr(v)) for k, v in opts.items())))
    if key not in _RUNS:
        env, _ = _toolchain(workdir)
        engine = SGLangEngine(
            model=target or models.target,
            draft=models.draft if draft else None,
            workdir=workdir / "runs",
            dtype=settings.dtype,
            options=opts,
            required=required,
            attention_backend=settings.attention_backend,
            mem_fraction_static=settings.mem_fraction_static,
            timeout=settings.engine_timeout,
            name=f"{name}-{len(_RUNS)}",
            env=dict(env),
        )
        prompts = make_prompts(settings.prompts, settings.prompt_len, models.vocab, seed=settings.seed)
        _RUNS[key] = _generate(engine, prompts, settings.max_new_tokens)
    return _RUNS[key]


@pytest.mark.parametrize("config", E2E, ids=lambda c: f"{c.name}-{_collection_settings().dtype}")
def test_e2e_gpu(
    cell: CellSpec,
    settings: Settings,
    config: E2EConfig,
    gpu_models: GpuModels,
    workdir: Path,
    record_property: RecordProperty,
) -> None:
    """SGLang greedy: the candidate configuration against its reference, token for token, divergences explained."""
    torch = _torch_cuda(cell)
    check_installed(cell, ("sglang",))  # the engines import it, in their own processes
    torch.cuda.empty_cache()  # give the kernel checks' cached blocks back before the engines size their pools
    need_gpus(
        cell,
        config.gpus,
        torch.cuda.device_count(),
        f"{config.name} acts on the tensor-parallel all-reduce, which one GPU does not have",
    )
    if config.needs_draft and gpu_models.draft is None:
        pytest.skip(
            f"{config.name} needs a draft: set draft_path next to model_path in [suites.{SUITE}.settings]"
        )
    reference = _sglang_run(
        settings, gpu_models, workdir, f"{config.name}-reference", config.reference, draft=False
    )
    switches = tuple(
        k for k in config.candidate if k not in config.reference and not k.startswith("enforce_")
    )
    candidate = _sglang_run(
        settings,
        gpu_models,
        workdir,
        config.name,
        config.candidate,
        draft=config.needs_draft,
        required=switches,
    )
    _check_planted(settings, reference, gpu_models.vocab, record_property)
    comparison = _judge_runs(
        settings,
        reference,
        candidate,
        record_property,
        engine=f"sglang {importlib.metadata.version('sglang')}",
        dtype=settings.dtype,
        options=dict(config.candidate),
        fp32_lm_head=settings.fp32_lm_head,
        toolchain=_toolchain(workdir)[1],
    )
    if settings.model == "planted" and settings.model_path is None and config.candidate is EAGLE3_CHAIN:
        # The planted draft is right after every token: each verify accepts all 3 draft tokens.
        want = expected_accept_length(1.0)
        record_property("planted_accept_length", f"{want:g}")
        got = comparison.accept_length
        assert got is not None, "SGLang reported no accept length"
        assert abs(got - want) <= PLANTED_ACCEPT_TOL, (
            f"the planted draft should accept everything (accept length {want:g}), SGLang reports {got}"
        )
    if settings.model == "path" and settings.model_path is None and config.candidate is EAGLE3_CHAIN:
        # The path draft computes the target's function from its own history (pathmodel.path_draft_specs): a
        # CPU simulation of SGLang's draft forward accepts 3.99 of 4; an accept path that rejects right drafts
        # (or a draft forward that differs from that simulation) falls below this.
        record_property("path_accept_length_floor", f"{PATH_ACCEPT_FLOOR:g}")
        got = comparison.accept_length
        assert got is not None, "SGLang reported no accept length"
        assert got >= PATH_ACCEPT_FLOOR, (
            f"the path draft's drafts are right (accept length 3.99 of 4 simulated), SGLang reports {got}"
        )


@pytest.mark.parametrize("bug", BUGS)
def test_e2e_gpu_bug(
    cell: CellSpec,
    settings: Settings,
    bug: str,
    gpu_models: GpuModels,
    workdir: Path,
    record_property: RecordProperty,
) -> None:
    """model = "path", on the cell's SGLang: the target vs its variant with a planted kernel-like defect (attention
    reading the current position; the MLP's output rows off by one) must diverge as real, never as a near-tie."""
    torch = _torch_cuda(cell)
    check_installed(cell, ("sglang",))
    torch.cuda.empty_cache()
    if bug not in gpu_models.bugs:
        not_applicable(NA.NOT_CONFIGURED, 'runs with model = "path" only')
    reference = _sglang_run(settings, gpu_models, workdir, "eagle3-reference", {}, draft=False)
    candidate = _sglang_run(
        settings, gpu_models, workdir, f"{bug}-bug", {}, draft=False, target=gpu_models.bugs[bug]
    )
    with pytest.raises(RealDivergence) as caught:
        _judge_runs(
            settings,
            reference,
            candidate,
            record_property,
            engine=f"sglang {importlib.metadata.version('sglang')}, {bug} bug",
            dtype=settings.dtype,
        )
    assert " 0 near-tie(s)" in str(caught.value), (
        f"a planted {bug} defect is never a near-tie: {caught.value}"
    )
