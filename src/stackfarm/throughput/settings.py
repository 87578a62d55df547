"""``[suites.40-throughput.settings]``: the `Settings` dataclass (defaults and meaning) and its `SCHEMA`.

`SCHEMA` declares every key's type and bounds (matrix.load checks the table against it, so a bad value stops
the run before any cell starts); `Settings.problems` adds the rules that tie keys together. `from_mapping`
reads the raw table (lists become tuples) and raises `MeasureError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..schema import NOTHING, Bool, Enum, Int, List, Number, Problem, Str, Table, first_problem
from . import curve
from ._tiny import SHAPES
from .errors import MeasureError

SUITE = "40-throughput"
BASELINE = "baseline"
EAGLE3 = "eagle3"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """``[suites.40-throughput.settings]``; every key is optional."""

    #: Interleaved rounds per figure (each round: every batch size, baseline then EAGLE-3).
    repeats: int = 5
    #: Extra rounds of `repeats` a check may take while its interval straddles the threshold.
    max_remeasures: int = 2
    batch_sizes: tuple[int, ...] = (1, 8)
    #: New tokens per request (ignore_eos, so every request decodes exactly this many).
    output_tokens: int = 128
    input_tokens: int = 16
    #: Prompt token ids are drawn from [3, vocab_limit): inside the tiny model's vocabulary of 1024.
    vocab_limit: int = 1000
    confidence: float = 0.95
    resamples: int = 10_000
    seed: int = 0
    warmup_window: int = 3
    warmup_tolerance: float = 0.02
    warmup_max_runs: int = 30
    #: Requests per batch size > 1 before measuring (new shapes may JIT-compile).
    warmup_batches: int = 2
    eagle3: bool = True
    #: Planted acceptance rates, e.g. [0.0, 0.5, 0.9]: serve the planted models of stackfarm.numerics.planted
    #: (weights written per run, in model_shape) and measure EAGLE-3 vs baseline at each rate, a curve with its
    #: break-even rate (stackfarm.throughput.curve). Rate r: a share r of a sample's requests end in a token the
    #: draft gets right (accept length steps + 1), the rest in one it gets wrong (accept length 1), so the mean
    #: accept length is 1 + steps x r. The standard figures are then measured at full acceptance. Empty: no curve,
    #: dummy weights.
    acceptance: tuple[float, ...] = ()
    #: Requests per sample at each rate (run one after another: a batch would run at its slowest request's
    #: pace); rate x acceptance_requests must be whole.
    acceptance_requests: int = 10
    #: accept_length@r passes when 1 + steps x r lies within its interval widened by this (tokens): SGLang's
    #: per-request figure counts the prefill token (128 tokens / 127 verifies = 1.008).
    accept_length_tolerance: float = 0.1
    #: A model to serve; unset: a random Llama (+ EAGLE-3 draft) with dummy weights, written per run.
    model_path: str | None = None
    #: The dummy Llama's dimensions when model_path is unset (throughput._tiny.SHAPES): "llama-3-8b" decodes
    #: GPU-bound (CV 0.1-1.5 % on the H200; 16 GB of weights per server, so it wants >= 48 GB GPUs); "tiny"
    #: fits anywhere but measures the scheduler (CV 12-22 %).
    model_shape: str = "llama-3-8b"
    draft_model_path: str | None = None
    attention_backend: str = "triton"
    sampling_backend: str = "pytorch"
    #: Configurations run with CUDA graphs. EAGLE-3's graph capture imports nvidia-cutlass-dsl (absent on
    #: the H200 reference machine), so EAGLE-3 runs without graphs unless named here.
    cuda_graph: tuple[str, ...] = (BASELINE,)
    #: --mem-fraction-static per configuration, in start order. Both servers share the GPU: SGLang 0.5.9 sizes
    #: the KV pool as free - total x (1 - f), so the second must ask for more than the first one holds; from
    #: 0.5.10 it is a share of the memory free at its start (0.45 of what the baseline left).
    mem_fraction_static: tuple[float, ...] = (0.2, 0.45)
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 4
    #: --sleep-on-idle (SGLang 0.5.9+): the idle server's scheduler blocks on its sockets instead of
    #: spinning a core, so the one being measured does not share the host with a busy loop.
    sleep_on_idle: bool = True
    #: Each server on its own physical cores and the client on another (Linux affinity, inherited by
    #: SGLang's scheduler and detokenizer), so that the busy Python processes of one server never take the
    #: cores of the other or of the client. (It did not calm the tiny model on the H200 VM: CV 22 % pinned
    #: vs 13 % unpinned, both within that shape's run-to-run spread; the 8B shape is what brought CV < 2 %.)
    pin_cpus: bool = True
    extra_server_args: tuple[str, ...] = ()
    #: Seconds until /health must answer 200 (the first start JIT-compiles kernels: ~70 s on an H200).
    health_timeout: float = 600.0
    #: Seconds one request may stay silent.
    request_timeout: float = 300.0
    #: The first server's port (the next ones count up); unset: free ports in [30000, 50000).
    port: int | None = None
    log_level: str = "info"
    #: "one_batch_server": also run sglang.bench_one_batch_server against the baseline (needs a tokenizer).
    bench_tool: str | None = None
    #: The last qualified run, for `max_regression_pct`: a qualification record or a throughput.json
    #: ($STACKFARM_THROUGHPUT_BASELINE wins over this).
    baseline_record: str | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Settings:
        """The settings from the raw TOML table, checked against SCHEMA (MeasureError names the key), or from
        their JSON form as the runner hands them over (stackfarm.family.to_json: unset keys as null, no planted
        rates as []), so that ``from_mapping(to_json(s)) == s`` (the suite family's contract)."""
        raw = {k: v for k, v in raw.items() if v is not None and not (k == "acceptance" and not v)}
        _raise(first_problem(dict(raw), SCHEMA))
        return cls(**_values(raw))

    def validate(self) -> None:
        """Check these values against SCHEMA (its types, bounds and cross-key rules): MeasureError if off."""
        unset = {k for k, v in self.as_dict().items() if v is None or (k == "acceptance" and not v)}
        _raise(first_problem({k: v for k, v in self.as_dict().items() if k not in unset}, SCHEMA))

    def problems(self) -> list[Problem]:
        """What the keys' types and bounds cannot say: how they fit together."""
        found = []
        if self.warmup_max_runs < self.warmup_window:
            found.append(
                _rule(
                    "warmup_max_runs",
                    self.warmup_max_runs,
                    f"must be >= warmup_window ({self.warmup_window})",
                )
            )
        if len(self.mem_fraction_static) < len(self.configs()):
            found.append(
                _rule(
                    "mem_fraction_static",
                    list(self.mem_fraction_static),
                    f"needs one value per configuration {self.configs()}",
                )
            )
        unknown = [c for c in self.cuda_graph if c not in (BASELINE, EAGLE3)]
        if unknown:
            found.append(
                _rule(
                    "cuda_graph",
                    list(self.cuda_graph),
                    f"names unknown configurations {unknown}: use {BASELINE!r}, {EAGLE3!r}",
                )
            )
        found += self._curve_problems()
        if self.model_path and self.eagle3 and not self.draft_model_path:
            found.append(
                _rule(
                    "model_path",
                    self.model_path,
                    "is set with eagle3 on: set draft_model_path too (or eagle3 = false)",
                )
            )
        return found

    def _curve_problems(self) -> list[Problem]:
        if not self.acceptance:
            return []
        rates = list(self.acceptance)
        if not self.eagle3:
            return [_rule("acceptance", rates, "needs eagle3 = true (the curve is EAGLE-3 vs the baseline)")]
        if self.model_path:
            return [_rule("acceptance", rates, "plants its own models: remove model_path (or acceptance)")]
        if (
            self.speculative_eagle_topk != 1
            or self.speculative_num_draft_tokens != self.speculative_num_steps + 1
        ):
            return [
                _rule(
                    "acceptance",
                    rates,
                    "plants chain drafting: speculative_eagle_topk = 1 and "
                    "speculative_num_draft_tokens = speculative_num_steps + 1",
                )
            ]
        if len(set(rates)) != len(rates):
            return [_rule("acceptance", rates, "lists a rate twice")]
        odd = [r for r in rates if not curve.whole(r, self.acceptance_requests)]
        if odd:
            return [
                _rule(
                    "acceptance",
                    rates,
                    f"rates {odd} x acceptance_requests ({self.acceptance_requests}) "
                    "are not whole numbers of requests: set acceptance_requests so they are, e.g. 10",
                )
            ]
        return []

    def figures(self) -> tuple[str, ...]:
        """Every figure these settings measure (stackfarm.throughput.thresholds names them)."""
        from .thresholds import figure_names

        return figure_names(self.batch_sizes, eagle3=self.eagle3, acceptance=self.acceptance)

    def configs(self) -> tuple[str, ...]:
        return (BASELINE, EAGLE3) if self.eagle3 else (BASELINE,)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _rule(key: str, value: Any, message: str) -> Problem:
    return Problem((key,), message, "", value)


def _values(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}


def _consistent(raw: Mapping[str, Any]) -> list[Problem]:
    return Settings(**_values(raw)).problems()


def _raise(problem: Problem | None) -> None:
    if problem is None:
        return
    value = f" = {problem.value!r}" if problem.value is not NOTHING else ""
    fix = f"; fix: {problem.fix}" if problem.fix else ""
    raise MeasureError(f"[suites.{SUITE}.settings] {problem.key}{value}: {problem.message}{fix}")


def _count(what: str, low: int, high: int | None = None) -> Int:
    bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
    return Int(f"{what}: a whole number {bounds}", min=low, max=high)


def _seconds(what: str) -> Number:
    return Number(f"{what}: a number of seconds > 0", positive=True)


def _path(what: str) -> Str:
    return Str(f'{what}: a folder or file, e.g. "/models/..."')


#: Every key of [suites.40-throughput.settings], its type and bounds (the meaning is on `Settings`).
SCHEMA = Table(
    {
        "repeats": _count("rounds per figure; at least 2 samples (an interval needs them)", 2),
        "max_remeasures": _count("extra rounds of `repeats` while an interval straddles its threshold", 0),
        "batch_sizes": List(Int("a batch size >= 1", min=1), "positive integers, e.g. [1, 8]", min_len=1),
        "output_tokens": _count(
            "new tokens per request; at least 2 tokens (decode is timed after the first)", 2
        ),
        "input_tokens": _count("prompt tokens per request", 1),
        "vocab_limit": _count("prompt token ids are drawn below it (above 3)", 4),
        "confidence": Number("the bootstrap interval's confidence, e.g. 0.95", min=0.5, max=0.999),
        "resamples": _count("bootstrap resamples", 100),
        "seed": _count("the random seed", 0),
        "warmup_window": _count("consecutive single-stream rates that must agree", 2),
        "warmup_tolerance": Number("the relative spread they may have, e.g. 0.02", min=0.0),
        "warmup_max_runs": _count("warm-up requests at most", 2),
        "warmup_batches": _count("requests per batch size > 1 before measuring", 0),
        "eagle3": Bool("true or false: measure EAGLE-3 beside the baseline"),
        "acceptance": List(
            Number("an acceptance rate in [0, 1]", min=0.0, max=1.0),
            "planted acceptance rates, e.g. [0.0, 0.5, 0.9]",
            min_len=1,
        ),
        "acceptance_requests": _count("requests per sample at each acceptance rate", 1),
        "accept_length_tolerance": Number("tokens: accept_length@r may miss 1 + steps x r by this", min=0.0),
        "model_path": _path("a model to serve"),
        "model_shape": Enum(tuple(SHAPES), f"one of {', '.join(SHAPES)}", noun="shape"),
        "draft_model_path": _path("the EAGLE-3 draft of model_path"),
        "attention_backend": Str('SGLang\'s --attention-backend, e.g. "triton"'),
        "sampling_backend": Str('SGLang\'s --sampling-backend, e.g. "pytorch"'),
        "cuda_graph": List(
            Str("a configuration"), f"the configurations run with CUDA graphs: {BASELINE!r}, {EAGLE3!r}"
        ),
        "mem_fraction_static": List(
            Number("a share of GPU memory", min=0.01, max=0.95),
            "--mem-fraction-static per configuration, in start order, e.g. [0.2, 0.45]",
            min_len=1,
        ),
        "speculative_num_steps": _count("EAGLE-3 draft steps", 1),
        "speculative_eagle_topk": _count("EAGLE-3 top-k", 1),
        "speculative_num_draft_tokens": _count("EAGLE-3 draft tokens", 1),
        "sleep_on_idle": Bool("true or false: --sleep-on-idle"),
        "pin_cpus": Bool("true or false: each server on its own physical cores"),
        "extra_server_args": List(
            Str("an argument"), 'more sglang.launch_server arguments, e.g. ["--tp", "8"]'
        ),
        "health_timeout": _seconds("until /health must answer 200"),
        "request_timeout": _seconds("one request may stay silent"),
        "port": _count("the first server's port (SGLang also needs port + 10000)", 1024, 55535),
        "log_level": Enum(("debug", "info", "warning", "error", "critical"), noun="log level"),
        "bench_tool": Enum(("one_batch_server",), "only 'one_batch_server' is supported", noun="bench tool"),
        "baseline_record": _path("the last qualified run (a qualification record or a throughput.json)"),
    },
    rules=(_consistent,),
    noun="setting",
)

__all__ = ["BASELINE", "EAGLE3", "SCHEMA", "SUITE", "Settings"]
