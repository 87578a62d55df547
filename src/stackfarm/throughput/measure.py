"""Measure the cell's SGLang: servers, health checks, warm-up, interleaved repeats, GPU facts.

The flow the 40-throughput suite drives:

1. `Settings.from_mapping` reads ``[suites.40-throughput.settings]`` (unknown keys are errors);
2. `server_configs` gives one `ServerConfig` per configuration, baseline first, then EAGLE-3;
3. `launch` starts each as ``python -m sglang.launch_server`` on a free port in its own process session
   (SGLang kills its whole process tree when it fails), polls ``/health`` until it answers 200, and on a
   timeout or an early exit raises `ServerStartError` with the tail of the server's log;
4. `Measurement.warm_up` repeats single-stream requests until the last `warmup_window` rates agree within
   `warmup_tolerance` (one warm-up request is not enough: the H200 reference run kept rising for 7);
5. `Measurement.run_rounds` measures A B A B: every batch size, baseline then EAGLE-3, `repeats` times, so
   drift of the machine hits both configurations alike;
6. `Measurement.figures` turns the requests into samples per figure (see `thresholds` for the names).

Requests go to SGLang's native ``/generate`` with ``input_ids`` and ``stream: true`` (the protocol
``sglang.bench_one_batch_server`` speaks): the client notes when each item's first token and last token
arrive. SGLang's own bench tools need a tokenizer, which the tiny random test model does not have; where a
model has one, `stackfarm.throughput.benchjson` runs them and reads their JSON.

This module holds the client side (requests, warm-up, the interleaved rounds, the figures); the rest lives\nin `settings` (step 1), `server` (steps 2 and 3), `machine` (GPU facts, ports, CPU placement) and `errors`,\nand is re-exported here, so ``from stackfarm.throughput.measure import X`` works for all of it.\n\nOnly the standard library is used, so this runs in whatever Python holds the cell's SGLang.
"""

from __future__ import annotations

import functools
import http.client
import json
import random
import statistics
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import curve
from .errors import BenchError, MeasureError, PortInUseError, ServerStartError, ZeroTokensError
from .machine import (
    NVIDIA_SMI_FIELDS,
    PORT_RANGE,
    CpuPlacement,
    GpuInfo,
    available_cpus,
    cpu_placement,
    ensure_port_free,
    free_ports,
    parse_gpu_csv,
    physical_cores,
    pinned,
    port_free,
    query_gpus,
)
from .server import (
    ModelPaths,
    RunningServer,
    ServerConfig,
    ServerSpec,
    cuda_home,
    launch,
    server_configs,
    server_env,
    sglang_server_argv,
    tail,
)
from .settings import BASELINE, EAGLE3, Settings
from .thresholds import figure_batch

# ------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True, kw_only=True)
class RequestResult:
    """One /generate request of `batch_size` prompts, timed from the client's side."""

    batch_size: int
    input_len: int
    output_len: int
    #: Per item: completion tokens, seconds to the first chunk with a token, to the last chunk, and how
    #: many tokens the first chunk held (EAGLE-3 may accept several at once).
    tokens: tuple[int, ...]
    first_s: tuple[float, ...]
    last_s: tuple[float, ...]
    first_tokens: tuple[int, ...]
    #: Mean of the items' spec_accept_length (completion tokens / verify steps), None without speculation.
    accept_length: float | None = None

    @property
    def latency_s(self) -> float:
        return max(self.last_s)

    @property
    def last_ttft_s(self) -> float:
        return max(self.first_s)

    @property
    def output_tok_s(self) -> float:
        """Decode throughput: the sum over items of tokens after the first chunk / time after it."""
        return sum(
            (n - f) / (last - first)
            for n, f, first, last in zip(
                self.tokens, self.first_tokens, self.first_s, self.last_s, strict=True
            )
        )

    @property
    def itl_ms(self) -> float:
        """Mean inter-token latency after the first chunk, over the items, in ms."""
        per_item = [
            (last - first) / (n - f) * 1000
            for n, f, first, last in zip(
                self.tokens, self.first_tokens, self.first_s, self.last_s, strict=True
            )
        ]
        return sum(per_item) / len(per_item)


def summarise(
    events: Sequence[tuple[float, Mapping[str, Any]]], *, batch_size: int, input_len: int, output_len: int
) -> RequestResult:
    """A RequestResult from the streamed events: (seconds since the request was sent, decoded event)."""
    tokens = [0] * batch_size
    first: list[float | None] = [None] * batch_size
    first_tokens = [0] * batch_size
    last = [0.0] * batch_size
    accept: list[float | None] = [None] * batch_size
    for when, event in events:
        if "error" in event:
            raise BenchError(f"the server reported an error: {event['error']}")
        index = int(event.get("index", 0))
        if not 0 <= index < batch_size:
            raise BenchError(f"an event for item {index} of a batch of {batch_size}")
        meta = event.get("meta_info") or {}
        count = meta.get("completion_tokens")
        if count is None:
            count = len(event.get("output_ids") or ())
        count = int(count)
        if count > 0 and first[index] is None:
            first[index], first_tokens[index] = when, count
        if count > tokens[index]:
            tokens[index], last[index] = count, when
        if meta.get("spec_accept_length") is not None:
            accept[index] = float(meta["spec_accept_length"])
    where = f"a request of {batch_size} x {output_len} new tokens"
    if not events or not any(tokens):
        raise ZeroTokensError(f"the server returned 0 tokens for {where}")
    empty = [i for i, n in enumerate(tokens) if n == 0]
    if empty:
        raise ZeroTokensError(f"items {empty} of {where} received 0 tokens")
    short = {i: n for i, n in enumerate(tokens) if n < output_len}
    if short:
        raise BenchError(f"{where} (ignore_eos) came back short: item -> tokens {short}")
    firsts = [f for f in first if f is not None]
    no_decode = [i for i in range(batch_size) if tokens[i] <= first_tokens[i] or last[i] <= firsts[i]]
    if no_decode:
        raise BenchError(f"items {no_decode} of {where} arrived in one chunk: no decode time to measure")
    accepts = [a for a in accept if a is not None]
    return RequestResult(
        batch_size=batch_size,
        input_len=input_len,
        output_len=output_len,
        tokens=tuple(tokens),
        first_s=tuple(firsts),
        last_s=tuple(last),
        first_tokens=tuple(first_tokens),
        accept_length=sum(accepts) / len(accepts) if accepts else None,
    )


def generate(
    base_url: str, prompts: Sequence[Sequence[int]], output_len: int, *, timeout: float
) -> RequestResult:
    """POST /generate (input_ids, greedy, ignore_eos, streamed) and time every item's tokens."""
    parts = urllib.parse.urlsplit(base_url)
    batch = len(prompts)
    payload = {
        "input_ids": [list(p) for p in prompts] if batch > 1 else list(prompts[0]),
        "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True},
        "stream": True,
    }
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    events: list[tuple[float, Mapping[str, Any]]] = []
    try:
        start = time.perf_counter()
        conn.request(
            "POST", "/generate", body=json.dumps(payload), headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        if response.status != 200:
            body = response.read()[:500].decode("utf-8", errors="replace")
            raise BenchError(f"{base_url}/generate answered HTTP {response.status}: {body}")
        for raw in response:  # server-sent events: "data: {...}" lines, then "data: [DONE]"
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            events.append((time.perf_counter() - start, json.loads(data)))
    except TimeoutError as exc:
        raise BenchError(f"{base_url}/generate timed out: no data for {timeout:g} s") from exc
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
        raise BenchError(f"{base_url}/generate failed: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    return summarise(
        events, batch_size=batch, input_len=len(prompts[0]) if prompts else 0, output_len=output_len
    )


# ------------------------------------------------------------------------------------------ noise


@dataclass(frozen=True, kw_only=True)
class Warmup:
    rates: tuple[float, ...]
    stable: bool
    window: int
    tolerance: float


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: how far apart the values are, relative to their middle."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else float("inf")


def warm_up(run: Callable[[], float], *, window: int, tolerance: float, max_runs: int) -> Warmup:
    """Call `run` until its last `window` results lie within `tolerance` (relative spread), or `max_runs`."""
    rates: list[float] = []
    while len(rates) < max_runs:
        rates.append(run())
        if len(rates) >= window and spread(rates[-window:]) <= tolerance:
            return Warmup(rates=tuple(rates), stable=True, window=window, tolerance=tolerance)
    return Warmup(rates=tuple(rates), stable=False, window=window, tolerance=tolerance)


def schedule(configs: Sequence[str], batch_sizes: Sequence[int], rounds: int) -> list[tuple[int, int, str]]:
    """(round, batch, config) in measuring order: per round and batch size, every configuration in turn.

    With configs (A, B) that is A B A B ...: a slow drift of clocks or temperature lands on both alike,
    and the i-th A and B of a batch size form a pair (their ratio cancels the drift).
    """
    return [(r, b, c) for r in range(rounds) for b in batch_sizes for c in configs]


#: How Measurement sends one request: (base URL, prompts, new tokens) -> result (tests pass a fake).
Send = Callable[[str, Sequence[Sequence[int]], int], RequestResult]


@dataclass(frozen=True, kw_only=True)
class PlantedTokens:
    """The planted draft's token sets (stackfarm.numerics.planted): it is wrong after tokens in [wrong_lo,
    wrong_hi) and right after every other token from 3 up to the vocabulary's end."""

    vocab: int
    wrong_lo: int
    wrong_hi: int

    def last_token(self, rng: random.Random, right: bool) -> int:
        if right:
            choice = rng.randrange(3, self.vocab - (self.wrong_hi - self.wrong_lo))
            return choice if choice < self.wrong_lo else choice + (self.wrong_hi - self.wrong_lo)
        return rng.randrange(max(3, self.wrong_lo), self.wrong_hi)


#: One sample at an acceptance rate: the group's requests, in order.
Group = list[RequestResult]


class Measurement:
    """Requests against running servers, kept per (configuration, batch size) in measuring order; with planted
    models also per (configuration, acceptance rate) as groups of single-stream requests."""

    def __init__(
        self,
        endpoints: Mapping[str, str],
        settings: Settings,
        *,
        run: Send | None = None,
        planted: PlantedTokens | None = None,
    ) -> None:
        self.endpoints = dict(endpoints)
        self.settings = settings
        self._run: Send = run or (lambda url, p, n: generate(url, p, n, timeout=settings.request_timeout))
        self._rng = random.Random(settings.seed)
        self.planted = planted
        self.results: dict[tuple[str, int], list[RequestResult]] = {}
        self.curve: dict[tuple[str, float], list[Group]] = {}
        self.warmups: dict[str, Warmup] = {}
        self.rounds = 0
        self.curve_rounds = 0

    def _prompt(self, right: bool = True) -> list[int]:
        # Fresh ids for every request: a repeated prompt would hit the radix cache and shorten its TTFT.
        limit, length = self.settings.vocab_limit, self.settings.input_tokens
        body = [self._rng.randrange(3, limit) for _ in range(length)]
        if self.planted is not None:  # planted models: the last token decides the acceptance
            body[-1] = self.planted.last_token(self._rng, right)
        return body

    def _prompts(self, batch: int) -> list[list[int]]:
        """Outside the curve, planted prompts all end in the right set: the figures are at full acceptance."""
        return [self._prompt() for _ in range(batch)]

    def request(self, config: str, batch: int) -> RequestResult:
        return self._run(self.endpoints[config], self._prompts(batch), self.settings.output_tokens)

    def sizes(self) -> list[int]:
        """The batch sizes a round measures: 1 (single-stream decode, the seeds' figure) and the configured."""
        return sorted({1, *self.settings.batch_sizes})

    def warm_up(self) -> dict[str, Warmup]:
        s = self.settings
        for config in self.endpoints:
            self.warmups[config] = warm_up(
                functools.partial(self._decode_rate, config),
                window=s.warmup_window,
                tolerance=s.warmup_tolerance,
                max_runs=s.warmup_max_runs,
            )
        for batch in sorted(set(s.batch_sizes) - {1}):
            for _ in range(s.warmup_batches):
                for config in self.endpoints:
                    self.request(config, batch)
        return self.warmups

    def _decode_rate(self, config: str) -> float:
        return self.request(config, 1).output_tok_s

    def run_rounds(self, rounds: int, batch_sizes: Sequence[int] | None = None) -> None:
        sizes = list(batch_sizes) if batch_sizes is not None else self.sizes()
        for _, batch, config in schedule(tuple(self.endpoints), sizes, rounds):
            self.results.setdefault((config, batch), []).append(self.request(config, batch))
        self.rounds += rounds

    def run_curve(self, rounds: int) -> None:
        """Per round and acceptance rate, one group per configuration (A B): the same right/wrong pattern, fresh
        prompts, `acceptance_requests` single-stream requests one after another."""
        if self.planted is None:
            raise MeasureError("an acceptance curve needs the planted models (settings.acceptance)")
        s = self.settings
        for _ in range(rounds):
            for rate in s.acceptance:
                pattern = curve.right_in_group(rate, s.acceptance_requests)
                for config in self.endpoints:
                    group = [
                        self._run(self.endpoints[config], [self._prompt(right)], s.output_tokens)
                        for right in pattern
                    ]
                    self.curve.setdefault((config, float(rate)), []).append(group)
        self.curve_rounds += rounds

    def figures(self) -> dict[str, list[float]]:
        return {**figures(self.results), **curve_figures(self.curve)}

    def remeasure(self, figure: str) -> Callable[[], list[float]]:
        """A function that measures `repeats` more rounds at `figure`'s batch size (or of the curve) and returns
        its new samples."""
        batch = figure_batch(figure) or 1

        def more() -> list[float]:
            before = len(self.figures().get(figure, []))
            if curve.is_curve_figure(figure):
                self.run_curve(self.settings.repeats)
            else:
                self.run_rounds(self.settings.repeats, [batch])
            return self.figures()[figure][before:]

        return more


def group_rate(group: Sequence[RequestResult]) -> float:
    """A group's decode throughput: its decode tokens over its decode seconds (requests ran one by one)."""
    tokens = sum(n - f for r in group for n, f in zip(r.tokens, r.first_tokens, strict=True))
    seconds = sum(last - first for r in group for first, last in zip(r.first_s, r.last_s, strict=True))
    return tokens / seconds


def curve_figures(groups: Mapping[tuple[str, float], Sequence[Group]]) -> dict[str, list[float]]:
    """The curve's samples per figure name (stackfarm.throughput.curve) from groups per (config, rate)."""
    out: dict[str, list[float]] = {}
    ratios: dict[float, list[float]] = {}
    for rate in sorted({r for _, r in groups}):
        base, spec = groups.get((BASELINE, rate), ()), groups.get((EAGLE3, rate), ())
        out[curve.at("decode_tok_s", rate)] = [group_rate(g) for g in base]
        if not spec:
            continue
        out[curve.at("eagle3_decode_tok_s", rate)] = [group_rate(g) for g in spec]
        accepts = [[r.accept_length for r in g if r.accept_length is not None] for g in spec]
        if all(accepts):
            out[curve.at("accept_length", rate)] = [sum(a) / len(a) for a in accepts]
        ratios[rate] = [group_rate(e) / group_rate(b) for b, e in zip(base, spec, strict=False)]
        out[curve.at("eagle3_over_baseline", rate)] = ratios[rate]
    if ratios:
        out[curve.BREAK_EVEN] = curve.break_even_samples(ratios)
    return out


def figures(results: Mapping[tuple[str, int], Sequence[RequestResult]]) -> dict[str, list[float]]:
    """Samples per figure name (see stackfarm.throughput.thresholds) from requests per (config, batch)."""
    out: dict[str, list[float]] = {}
    for (config, batch), runs in sorted(results.items()):
        prefix = "" if config == BASELINE else f"{config}_"
        if batch == 1:
            out[f"{prefix}decode_tok_s"] = [r.output_tok_s for r in runs]
            out[f"{prefix}ttft_ms"] = [r.last_ttft_s * 1000 for r in runs]
            out[f"{prefix}itl_ms"] = [r.itl_ms for r in runs]
            accepts = [r.accept_length for r in runs if r.accept_length is not None]
            if config == EAGLE3 and accepts:
                out["eagle3_accept_length"] = accepts
        else:
            out[f"{prefix}batch{batch}_tok_s"] = [r.output_tok_s for r in runs]
            out[f"{prefix}batch{batch}_ttft_ms"] = [r.last_ttft_s * 1000 for r in runs]
    base, spec = results.get((BASELINE, 1), ()), results.get((EAGLE3, 1), ())
    if base and spec:  # the i-th A and the i-th B ran back to back: their ratio cancels slow drift
        out["eagle3_over_baseline"] = [
            s.output_tok_s / b.output_tok_s for b, s in zip(base, spec, strict=False)
        ]
    return out


__all__ = [
    "BASELINE",
    "EAGLE3",
    "NVIDIA_SMI_FIELDS",
    "PORT_RANGE",
    "BenchError",
    "CpuPlacement",
    "GpuInfo",
    "MeasureError",
    "Measurement",
    "ModelPaths",
    "PlantedTokens",
    "PortInUseError",
    "RequestResult",
    "RunningServer",
    "ServerConfig",
    "ServerSpec",
    "ServerStartError",
    "Settings",
    "Warmup",
    "ZeroTokensError",
    "available_cpus",
    "cpu_placement",
    "cuda_home",
    "curve_figures",
    "ensure_port_free",
    "figures",
    "free_ports",
    "generate",
    "group_rate",
    "launch",
    "parse_gpu_csv",
    "physical_cores",
    "pinned",
    "port_free",
    "query_gpus",
    "schedule",
    "server_configs",
    "server_env",
    "sglang_server_argv",
    "spread",
    "summarise",
    "tail",
    "warm_up",
]
