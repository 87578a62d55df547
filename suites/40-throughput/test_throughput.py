"""40-throughput: the cell's SGLang measured on this GPU, judged against thresholds per runner kind.

Two servers (``python -m sglang.launch_server``) share the GPU: the baseline and EAGLE-3, started in that
order, each health-checked with a timeout. After a warm-up that lasts until the single-stream rate is stable,
requests alternate A B A B: single-stream decode (the seeds' tok/s figure), TTFT, ITL, batch throughput at
the configured batch sizes, EAGLE-3's accept length (stackfarm.throughput.measure).

Testcases, every figure in their JUnit properties and in the suite's record (``40-throughput.json``, family.py:
what the report renders, filled through conftest.py's `setting`, `check_property` and `figure`):

- test_gpu: name, clocks, driver, power limit of each GPU (nvidia-smi), and the runner kind;
- test_figures: per figure the samples, median, bootstrap interval, CV; the warm-up; the server arguments;
- test_thresholds_resolved: the runner kind has a [thresholds.<runner kind>] table that resolves into checks;
  an unknown runner kind (or a bad table, or a baseline from another runner) fails here, saying what to add;
- test_threshold[<check>]: one per check (absolute, EAGLE-3 relative, regression against the last qualified
  run): pass / fail / inconclusive after up to max_remeasures extra rounds (stackfarm.throughput.stats).
  A failure reads "performance shortfall"; a broken measurement is classified and never re-measured;
- test_bench_tool: SGLang's own bench_one_batch_server and its JSON, when settings.bench_tool is set.

The figures also go to ``$STACKFARM_SUITE_OUT/throughput.json`` (stackfarm.throughput.record), with the
server logs beside it. Settings: ``[suites.40-throughput.settings]``, see stackfarm.throughput.measure.Settings.
The runner kind comes from nvidia-smi (``1x-h200``...) unless ``$STACKFARM_RUNNER_KIND`` names it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stackfarm import qualrecord
from stackfarm.cellspec import CellSpec, load
from stackfarm.errors import StackfarmError
from stackfarm.proc import call
from stackfarm.suitekit import NA, not_applicable
from stackfarm.throughput import benchjson, curve, record
from stackfarm.throughput._tiny import SHAPES, check_models, write_dummy_pair
from stackfarm.throughput.measure import (
    BASELINE,
    EAGLE3,
    GpuInfo,
    Measurement,
    ModelPaths,
    PlantedTokens,
    ServerConfig,
    ServerSpec,
    ServerStartError,
    Settings,
    available_cpus,
    cpu_placement,
    free_ports,
    launch,
    physical_cores,
    pinned,
    query_gpus,
    server_configs,
    server_env,
    sglang_server_argv,
    tail,
)
from stackfarm.throughput.stats import RemeasureFailed, classify, decide
from stackfarm.throughput.thresholds import (
    Check,
    figure_config,
    resolve,
    runner_kind,
)

SUITE = "40-throughput"
HOST = "127.0.0.1"
RUNNER_KIND_ENV = "STACKFARM_RUNNER_KIND"
#: The type of pytest's `record_property` fixture.
RecordProperty = Callable[[str, object], None]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Everything decided before any server starts: the settings, the runner kind and the checks."""

    cell: CellSpec | None
    settings: Settings | None
    runner_kind: str
    gpus: tuple[GpuInfo, ...]
    checks: tuple[Check, ...] = ()
    #: Why checks are missing (an unknown runner kind, a bad table, a record from another runner).
    problems: tuple[str, ...] = ()


def _baseline(settings: Settings, kind: str) -> tuple[dict[str, float] | None, str, str | None]:
    """(medians of the last qualified run or None, where they came from, a problem or None)."""
    path = os.environ.get(record.BASELINE_ENV) or settings.baseline_record
    if not path:
        return None, "", None
    base = qualrecord.load_baseline(Path(path))
    if base.runner_kind != kind:
        problem = f"the baseline {base.origin} is from runner kind {base.runner_kind!r}, not {kind!r}"
        return None, base.origin, problem
    return base.medians, base.origin, None


@functools.cache
def plan() -> Plan:
    """Decided once per session: collection (the check ids) and the fixtures share it."""
    path = os.environ.get("STACKFARM_CELL")
    if not path:
        why = "STACKFARM_CELL is not set: suites are run by stackfarm, not by hand"
        return Plan(cell=None, settings=None, runner_kind="unknown", gpus=(), problems=(why,))
    cell = load(path)
    if cell.no_gpu_reason is not None:
        return Plan(cell=cell, settings=None, runner_kind="no-gpu", gpus=())  # every testcase skips
    try:
        settings = Settings.from_mapping(cell.settings.get(SUITE, {}))
    except StackfarmError as exc:
        return Plan(cell=cell, settings=None, runner_kind="unknown", gpus=(), problems=(str(exc),))
    gpus: tuple[GpuInfo, ...] = ()
    kind = os.environ.get(RUNNER_KIND_ENV, "")
    try:
        gpus = query_gpus()
        kind = kind or runner_kind([g.name for g in gpus])
        last, origin, problem = _baseline(settings, kind)
        if problem:
            return Plan(cell=cell, settings=settings, runner_kind=kind, gpus=gpus, problems=(problem,))
        measured = settings.figures()
        resolution = resolve(cell.thresholds, kind, measured=measured, last=last, last_origin=origin)
    except StackfarmError as exc:
        return Plan(
            cell=cell, settings=settings, runner_kind=kind or "unknown", gpus=gpus, problems=(str(exc),)
        )
    problems = (resolution.problem,) if resolution.problem else ()
    return Plan(
        cell=cell, settings=settings, runner_kind=kind, gpus=gpus, checks=resolution.checks, problems=problems
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "check" in metafunc.fixturenames:
        checks: list[Check | None] = list(plan().checks) or [None]
        metafunc.parametrize("check", checks, ids=[c.name if c else "none" for c in checks])
    if "rate" in metafunc.fixturenames:
        settings = plan().settings
        rates: list[float | None] = list(settings.acceptance) if settings and settings.acceptance else [None]
        metafunc.parametrize("rate", rates, ids=[curve.label(r) if r is not None else "none" for r in rates])


# ------------------------------------------------------------------------------------------ the run


def _gpu_dicts(gpus: tuple[GpuInfo, ...]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(g) for g in gpus]


class Run:
    """The servers' measurement and everything throughput.json will hold; shared by the testcases."""

    def __init__(
        self, the_plan: Plan, cell: CellSpec, settings: Settings, configs: tuple[ServerConfig, ...]
    ) -> None:
        self.plan = the_plan
        self.cell = cell
        self.settings = settings
        self.configs = configs
        self.measurement: Measurement | None = None
        self.endpoints: dict[str, str] = {}
        self.env: dict[str, str] = {}
        self.logs: dict[str, Path] = {}
        self.checks: list[dict[str, Any]] = []
        self.problems: list[str] = list(the_plan.problems)
        self.gpus_after: tuple[GpuInfo, ...] = ()
        self.bench: dict[str, Any] | None = None
        #: CPU sets by role ("client", then each configuration); empty when nothing is pinned.
        self.cpus: dict[str, list[int]] = {}
        #: The acceptance curve's summary (settings.acceptance), for throughput.json.
        self.curve: dict[str, Any] | None = None

    def sglang_version(self) -> str:
        try:
            return self.cell.component("sglang").version
        except KeyError:
            return "unknown"

    def figures(self) -> dict[str, dict[str, Any]]:
        samples = self.measurement.figures() if self.measurement is not None else {}
        s = self.settings
        return {
            name: record.summarise_figure(
                name, values, confidence=s.confidence, resamples=s.resamples, seed=s.seed
            )
            for name, values in samples.items()
        }

    def write(self) -> Path | None:
        folder = record.out_dir()
        if folder is None:
            return None
        m = self.measurement
        doc = record.document(
            cell=self.cell.id,
            runner_kind=self.plan.runner_kind,
            sglang=self.sglang_version(),
            gpus=_gpu_dicts(self.plan.gpus),
            gpus_after=_gpu_dicts(self.gpus_after),
            settings=self.settings.as_dict(),
            configs={
                c.label: {
                    "args": list(c.args),
                    "cuda_graph": c.cuda_graph,
                    "note": c.note,
                    "cpus": self.cpus.get(c.label),
                }
                for c in self.configs
            },
            warmup={k: dataclasses.asdict(w) for k, w in (m.warmups.items() if m else ())},
            figures=self.figures(),
            checks=self.checks,
            problems=self.problems,
            bench_tool=self.bench,
            curve=self.curve,
        )
        return record.write(folder, doc)


def _planted(settings: Settings, scratch: Path) -> tuple[ModelPaths, PlantedTokens]:
    """settings.acceptance: the planted target (repeats its last token) and an EAGLE-3 draft wrong after the upper
    half of the vocabulary, with real weights (stackfarm.numerics.planted; written shard by shard: the Llama-3-8B
    shape is 16 GB of bf16, so it is written here, on the GPU machine)."""
    from stackfarm.numerics import planted

    shape = SHAPES[settings.model_shape]
    wrong = planted.default_wrong(shape.vocab)
    folder = scratch / "models"
    target = planted.write_target_planted(folder / f"{settings.model_shape}-planted", shape, dtype="bfloat16")
    draft = planted.write_draft_planted(
        folder / f"{settings.model_shape}-planted-eagle3", shape, wrong=wrong, dtype="bfloat16"
    )
    tokens = PlantedTokens(vocab=shape.vocab, wrong_lo=wrong[0], wrong_hi=wrong[1])
    return ModelPaths(target=str(target), draft=str(draft), load_format=None), tokens


def _models(settings: Settings, scratch: Path) -> ModelPaths:
    if settings.model_path:
        draft = settings.draft_model_path if settings.eagle3 else None
        check_models(
            settings.model_path, draft
        )  # a missing folder or a misfit draft, before any server starts
        return ModelPaths(target=settings.model_path, draft=draft, load_format=None)
    tiny_target, tiny_draft = write_dummy_pair(scratch / "models", settings.model_shape)
    return ModelPaths(target=str(tiny_target), draft=str(tiny_draft), load_format="dummy")


@pytest.fixture(scope="session")
def run(cell: CellSpec, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    if cell.no_gpu_reason is not None:
        pytest.skip(f"needs GPU: {cell.no_gpu_reason}")
    the_plan = plan()
    if the_plan.settings is None:
        pytest.fail("; ".join(the_plan.problems) or "no settings", pytrace=False)
    settings = the_plan.settings
    scratch = tmp_path_factory.mktemp("throughput")
    tokens: PlantedTokens | None = None
    try:
        if settings.acceptance:
            models, tokens = _planted(settings, scratch)
        else:
            models = _models(settings, scratch)
        configs = server_configs(settings, models)
    except StackfarmError as exc:
        pytest.fail(str(exc), pytrace=False)
    state = Run(the_plan, cell, settings, configs)
    try:
        sglang_root = cell.component("sglang").root
    except KeyError:
        sglang_root = None
    state.env = server_env(sglang_root, scratch)
    logs = record.out_dir() or scratch
    placement = cpu_placement(physical_cores(available_cpus()), len(configs)) if settings.pin_cpus else None
    state.cpus = {"client": list(placement.client)} if placement else {}
    with contextlib.ExitStack() as servers:
        # The client stays on its core for the whole session: threshold checks re-measure after setup.
        servers.enter_context(pinned(placement.client if placement else None))
        try:
            ports = free_ports(HOST, len(configs), start=settings.port)
            for i, (config, port) in enumerate(zip(configs, ports, strict=True)):
                cpus = placement.servers[i] if placement else None
                if cpus:
                    state.cpus[config.label] = list(cpus)
                spec = ServerSpec(
                    label=config.label,
                    argv=sglang_server_argv(sys.executable, config, HOST, port),
                    host=HOST,
                    port=port,
                    env=state.env,
                    log=logs / f"throughput-{config.label}.log",
                    health_timeout=settings.health_timeout,
                    cpus=cpus,
                )
                state.logs[config.label] = spec.log
                server = launch(spec)
                servers.callback(server.stop)
                state.endpoints[config.label] = server.base_url
            state.measurement = Measurement(state.endpoints, settings, planted=tokens)
            state.measurement.warm_up()
            state.measurement.run_rounds(settings.repeats)
            if settings.acceptance:
                state.measurement.run_curve(settings.repeats)
        except Exception as exc:  # whatever broke, it is recorded, classified, and not retried
            text = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, ServerStartError):  # a start failure shows its log already
                text += "".join(f"\n--- last lines of {p} ---\n{tail(p, 20)}" for p in state.logs.values())
            kind = classify(text)
            state.problems.append(f"[{kind.value}, not retried] {text}")
            state.write()
            pytest.fail(f"[{kind.value}, not retried] {text}", pytrace=False)
        state.write()
        try:
            yield state
        finally:
            with contextlib.suppress(StackfarmError):
                state.gpus_after = query_gpus()
            if settings.acceptance:
                state.curve = _curve_summary(state)
            state.write()


# ------------------------------------------------------------------------------------------ testcases


def test_gpu(cell: CellSpec, setting: RecordProperty) -> None:
    if cell.no_gpu_reason is not None:
        pytest.skip(f"needs GPU: {cell.no_gpu_reason}")
    the_plan = plan()
    gpus = the_plan.gpus or query_gpus()
    setting("runner_kind", the_plan.runner_kind)
    setting("runner_kind.source", RUNNER_KIND_ENV if os.environ.get(RUNNER_KIND_ENV) else "nvidia-smi")
    for gpu in gpus:
        for key, value in dataclasses.asdict(gpu).items():
            setting(f"gpu{gpu.index}.{key}", value)
    assert gpus, "nvidia-smi listed no GPU"


def test_figures(run: Run, setting: RecordProperty, figure: Callable[[str, dict[str, Any]], None]) -> None:
    assert run.measurement is not None
    settings = run.settings
    setting("sglang", run.sglang_version())
    setting("runner_kind", run.plan.runner_kind)
    setting("rounds", run.measurement.rounds)
    for config in run.configs:
        setting(f"config.{config.label}.args", " ".join(config.args))
        setting(f"config.{config.label}.cuda_graph", config.cuda_graph)
        if config.label in run.cpus:
            setting(f"config.{config.label}.cpus", ",".join(map(str, run.cpus[config.label])))
        if config.note:
            setting(f"config.{config.label}.note", config.note)
    for label, warm in run.measurement.warmups.items():
        setting(f"warmup.{label}.stable", warm.stable)
        setting(f"warmup.{label}.rates", json.dumps([round(r, 2) for r in warm.rates]))
    figures = run.figures()
    for name, fig in figures.items():
        figure(name, fig)
    written = run.write()
    setting("throughput_json", str(written) if written else f"not written: ${record.OUT_ENV} is not set")
    expected = settings.figures()
    missing = [f for f in expected if f not in figures]
    assert not missing, f"figures not measured: {missing} (the EAGLE-3 server reports no spec_accept_length?)"
    # break_even_acceptance has a sample per round whose curve crosses 1: there may be fewer (test_break_even).
    short = {n: f["n"] for n, f in figures.items() if f["n"] < settings.repeats and n != curve.BREAK_EVEN}
    assert not short, f"fewer samples than repeats = {settings.repeats}: {short}"
    bad = {n: f["samples"] for n, f in figures.items() if any(x <= 0 for x in f["samples"])}
    assert not bad, f"non-positive samples: {bad}"


def _check_row(check: Check, **extra: Any) -> dict[str, Any]:
    return {
        "name": check.name,
        "figure": check.figure,
        "kind": check.kind,
        "bound": check.bound.describe(),
        "threshold": check.bound.value,
        "at_least": check.bound.at_least,
        "source": check.source,
        "note": check.note,
        **extra,
    }


def test_thresholds_resolved(cell: CellSpec, setting: RecordProperty) -> None:
    """The runner kind has a [thresholds] table that resolves into checks against measured figures."""
    if cell.no_gpu_reason is not None:
        pytest.skip(f"needs GPU: {cell.no_gpu_reason}")
    the_plan = plan()
    setting("runner_kind", the_plan.runner_kind)
    setting("checks", ", ".join(f"{c.name} {c.bound.describe()}" for c in the_plan.checks) or "none")
    if the_plan.problems:
        setting("problem", "; ".join(the_plan.problems))
        pytest.fail("; ".join(the_plan.problems), pytrace=False)


def _configs_of(figure: str) -> tuple[str, ...]:
    """The configurations a figure is measured on (a ratio or the break-even: both)."""
    if figure.startswith("eagle3_over_baseline") or figure == curve.BREAK_EVEN:
        return (BASELINE, EAGLE3)
    if figure.startswith("accept_length@"):
        return (EAGLE3,)
    return (figure_config(figure.partition("@")[0]),)


def _unwarmed(run: Run, figure: str) -> list[str]:
    """The configurations behind `figure` whose warm-up never became stable."""
    assert run.measurement is not None
    warmups = run.measurement.warmups
    return [c for c in _configs_of(figure) if c in warmups and not warmups[c].stable]


def test_threshold(check: Check | None, run: Run, check_property: RecordProperty) -> None:
    if check is None:
        pytest.skip("no threshold checks for this runner: see test_thresholds_resolved")
    assert run.measurement is not None
    for key, value in _check_row(check).items():
        check_property(key, value)
    samples = run.measurement.figures().get(check.figure)
    if not samples:
        run.checks.append(_check_row(check, verdict="error", detail="not measured"))
        pytest.fail(f"{check.figure} was not measured", pytrace=False)
    s = run.settings
    try:
        judgement = decide(
            samples,
            check.bound,
            more=run.measurement.remeasure(check.figure),
            max_remeasures=s.max_remeasures,
            confidence=s.confidence,
            resamples=s.resamples,
            seed=s.seed,
        )
    except RemeasureFailed as exc:
        run.checks.append(_check_row(check, verdict="error", detail=str(exc)))
        run.write()
        logs = "\n".join(f"--- last lines of {path} ---\n{tail(path)}" for path in run.logs.values())
        pytest.fail(f"{exc}\n{logs}", pytrace=False)
    verdict, detail = judgement.verdict, judgement.explain()
    unwarmed = _unwarmed(run, check.figure)
    if unwarmed:
        # Samples taken while the rate still moved prove nothing either way: neither a pass nor a shortfall.
        verdict = "inconclusive"
        detail = (
            f"inconclusive: the warm-up of {', '.join(unwarmed)} never became stable "
            f"(warmup_window {run.settings.warmup_window}, tolerance {run.settings.warmup_tolerance:g}, "
            f"{run.settings.warmup_max_runs} requests at most), so its samples do not decide; measured: {detail}"
        )
        check_property("warmup_stable", "false")
    row = _check_row(
        check,
        verdict=verdict,
        median=judgement.median,
        ci_low=judgement.interval.low,
        ci_high=judgement.interval.high,
        n=len(judgement.samples),
        remeasures=judgement.remeasures,
        detail=detail,
    )
    run.checks.append(row)
    run.write()
    for key in ("verdict", "median", "ci_low", "ci_high", "n", "remeasures"):
        check_property(key, row[key])
    check_property("history", json.dumps([[round(i.low, 4), round(i.high, 4)] for i in judgement.history]))
    check_property("samples", json.dumps([round(x, 4) for x in judgement.samples]))
    assert verdict == "pass", f"{check.figure} {check.bound.describe()} ({check.source}): {detail}"


def _curve_summary(run: Run) -> dict[str, Any]:
    s, figures = run.settings, run.figures()

    def med(name: str) -> float | None:
        fig = figures.get(name)
        return fig["median"] if fig else None

    points = {
        curve.label(r): {
            "eagle3_over_baseline": med(curve.at("eagle3_over_baseline", r)),
            "accept_length": med(curve.at("accept_length", r)),
            "expected_accept_length": curve.expected_accept_length(r, s.speculative_num_steps),
            "decode_tok_s": med(curve.at("decode_tok_s", r)),
            "eagle3_decode_tok_s": med(curve.at("eagle3_decode_tok_s", r)),
        }
        for r in s.acceptance
    }
    ratios = {r: v for r in s.acceptance if (v := med(curve.at("eagle3_over_baseline", r))) is not None}
    found = curve.break_even(ratios)
    return {
        "rates": list(s.acceptance),
        "requests_per_sample": s.acceptance_requests,
        "break_even_acceptance": found.value,
        "break_even": found.describe(),
        "points": points,
    }


def test_accept_length(rate: float | None, run: Run, check_property: RecordProperty) -> None:
    """accept_length@<r>: the planted acceptance happened (1 + steps x r, within the interval and a tolerance)."""
    if rate is None:
        not_applicable(
            NA.NOT_CONFIGURED, "settings.acceptance is not set: no planted acceptance curve is asked for"
        )
    assert run.measurement is not None
    s = run.settings
    name = curve.at("accept_length", rate)
    samples = run.measurement.figures().get(name, [])
    if not samples:
        pytest.fail(
            f"{name} was not measured: the EAGLE-3 server reported no spec_accept_length", pytrace=False
        )
    found = curve.check_accept_length(
        samples,
        rate,
        steps=s.speculative_num_steps,
        tolerance=s.accept_length_tolerance,
        confidence=s.confidence,
        resamples=s.resamples,
        seed=s.seed,
    )
    check_property("figure", name)
    check_property("expected", f"{found.expected:.4g}")
    check_property("tolerance", f"{found.tolerance:g}")
    check_property("median", f"{found.median:.4g}")
    if found.interval is not None:
        check_property("ci_low", f"{found.interval.low:.4g}")
        check_property("ci_high", f"{found.interval.high:.4g}")
    check_property("samples", json.dumps([round(x, 4) for x in samples]))
    check_property("verdict", "pass" if found.ok else "fail")
    run.checks.append(
        {
            "name": name,
            "figure": name,
            "kind": "planted",
            "bound": f"= {found.expected:.4g} +- {found.tolerance:g}",
            "verdict": "pass" if found.ok else "fail",
            "median": found.median,
            "detail": found.explain(),
        }
    )
    run.write()
    assert found.ok, found.explain()


def test_break_even(run: Run, record_property: RecordProperty, setting: RecordProperty) -> None:
    """The curve of eagle3_over_baseline over the planted rates, and where it reaches 1 (break_even_acceptance)."""
    if not run.settings.acceptance:
        not_applicable(
            NA.NOT_CONFIGURED, "settings.acceptance is not set: no planted acceptance curve is asked for"
        )
    summary = _curve_summary(run)
    run.curve = summary
    run.write()
    setting("break_even_acceptance", summary["break_even"])
    setting("curve", json.dumps(summary["points"], sort_keys=True))
    per_round = run.measurement.figures().get(curve.BREAK_EVEN, []) if run.measurement else []
    record_property("break_even_acceptance.samples", json.dumps([round(x, 4) for x in per_round]))
    missing = [r for r, p in summary["points"].items() if p["eagle3_over_baseline"] is None]
    assert not missing, f"eagle3_over_baseline not measured at rates {missing}"


def test_bench_tool(run: Run, setting: RecordProperty, tmp_path: Path) -> None:
    settings = run.settings
    if settings.bench_tool is None:
        not_applicable(
            NA.NOT_CONFIGURED,
            "settings.bench_tool is not set: SGLang's bench tools draw prompts through a tokenizer, which the tiny "
            "random model has none of; the figures above come from the suite's own /generate client",
        )
    result = tmp_path / "one_batch_server.jsonl"
    argv = benchjson.one_batch_server_argv(
        sys.executable,
        run.endpoints[BASELINE],
        batch_sizes=sorted({1, *settings.batch_sizes}),
        input_len=settings.input_tokens,
        output_len=settings.output_tokens,
        result_file=str(result),
        tokenizer=settings.model_path,
    )
    outcome = call(argv, env=run.env, timeout=settings.request_timeout * 4, log=tmp_path / "bench.log")
    setting("command", " ".join(argv))
    assert result.is_file(), (
        f"bench_one_batch_server wrote no {result.name} (exit {outcome.returncode}, "
        f"{classify(outcome.output).value}): {outcome.output[-2000:]}"
    )
    cases = benchjson.parse_one_batch_server(result.read_text(encoding="utf-8"), origin=str(result))
    figures = benchjson.one_batch_figures(cases)
    run.bench = {
        "tool": "one_batch_server",
        "cases": [dataclasses.asdict(c) for c in cases],
        "figures": figures,
    }
    run.write()
    for name, value in figures.items():
        setting(f"bench.{name}", value)
