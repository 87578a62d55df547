"""SGLang's own bench tools: their command lines, and their JSON output read into figures.

Both tools append one JSON object per line (JSONL) to a result file; the keys are what their code writes
(read from the sglang 0.5.15 wheel):

- ``python -m sglang.bench_one_batch_server ... --result-filename F``: `BenchOneCaseResult.dump_to_jsonl`
  in ``sglang/benchmark/one_batch_server.py`` writes run_name, batch_size, input_len, output_len, latency,
  input_throughput, output_throughput, overall_throughput, last_ttft, last_gen_throughput, acc_length and
  cache_hit_rate per (batch, input, output) case; -1 in last_gen_throughput / acc_length means "not known";
- ``python -m sglang.bench_serving ... --output-file F``: ``sglang/benchmark/serving.py`` writes the run's
  arguments (backend, dataset_name, request_rate, max_concurrency, random_input_len, ...), server_info and
  the results: duration, completed, total_input_tokens, total_output_tokens, request/input/output/total
  throughput, mean/median/std/p90/p95/p99 of e2e latency, TTFT, TPOT and ITL in ms, concurrency,
  accept_length, max_output_tokens_per_s, max_concurrent_requests.

Both tools need a tokenizer (they draw random prompts through it), so they fit real checkpoints, not the
tiny random model the suite serves by default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .measure import BenchError, ZeroTokensError


@dataclass(frozen=True, kw_only=True)
class OneBatchCase:
    """One line of bench_one_batch_server's result file."""

    run_name: str
    batch_size: int
    input_len: int
    output_len: int
    latency_s: float
    input_throughput: float
    output_throughput: float
    overall_throughput: float
    last_ttft_s: float
    #: None where the tool wrote -1 (not reported by the server).
    last_gen_throughput: float | None
    acc_length: float | None
    cache_hit_rate: float | None


@dataclass(frozen=True, kw_only=True)
class ServingResult:
    """The result line of bench_serving (the summary; per-request details are not read)."""

    backend: str
    dataset_name: str
    completed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    mean_ttft_ms: float
    median_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    p99_itl_ms: float
    accept_length: float | None
    max_concurrency: int | None


def _lines(text: str, origin: str) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchError(f"{origin}:{number}: not JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise BenchError(f"{origin}:{number}: expected a JSON object, got {type(row).__name__}")
        rows.append((number, row))
    if not rows:
        raise ZeroTokensError(f"{origin}: the bench wrote no results (0 tokens measured)")
    return rows


def _get(row: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in row:
        raise BenchError(f"{where}: no `{key}` (keys: {', '.join(sorted(row))})")
    value = row[key]
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise BenchError(f"{where}: `{key}` = {value}")
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is str and isinstance(value, str):
        return value
    raise BenchError(f"{where}: `{key}` = {value!r} is not a {kind.__name__}")


def _known(value: Any) -> float | None:
    """The tools write -1 (or null) for figures the server did not report."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def parse_one_batch_server(text: str, *, origin: str = "result.jsonl") -> tuple[OneBatchCase, ...]:
    cases = []
    for number, row in _lines(text, origin):
        where = f"{origin}:{number}"
        case = OneBatchCase(
            run_name=str(row.get("run_name", "")),
            batch_size=_get(row, "batch_size", int, where),
            input_len=_get(row, "input_len", int, where),
            output_len=_get(row, "output_len", int, where),
            latency_s=_get(row, "latency", float, where),
            input_throughput=_get(row, "input_throughput", float, where),
            output_throughput=_get(row, "output_throughput", float, where),
            overall_throughput=_get(row, "overall_throughput", float, where),
            last_ttft_s=_get(row, "last_ttft", float, where),
            last_gen_throughput=_known(row.get("last_gen_throughput")),
            acc_length=_known(row.get("acc_length")),
            cache_hit_rate=_known(row.get("cache_hit_rate")),
        )
        # The tool computes output throughput from the *requested* length; a first token never seen
        # leaves last_ttft at 0. Either way the server produced nothing to measure.
        if case.output_len <= 0 or case.output_throughput <= 0 or case.last_ttft_s <= 0:
            raise ZeroTokensError(
                f"{where}: the bench returned 0 tokens (output_len {case.output_len}, output_throughput "
                f"{case.output_throughput}, last_ttft {case.last_ttft_s})"
            )
        cases.append(case)
    return tuple(cases)


def parse_bench_serving(text: str, *, origin: str = "bench_serving.jsonl") -> tuple[ServingResult, ...]:
    results = []
    for number, row in _lines(text, origin):
        where = f"{origin}:{number}"
        completed = _get(row, "completed", int, where)
        total_output = _get(row, "total_output_tokens", int, where)
        # First: with every request failed the tool still writes a line (zeros, and NaN latencies).
        if completed == 0 or total_output == 0:
            raise ZeroTokensError(
                f"{where}: the bench returned 0 tokens ({completed} requests completed, {total_output} output tokens)"
            )
        # When a server streams no text at all, sglang 0.5.15's client still counts every request as a
        # success of the requested length (captured: 8 requests, 256 tokens, 30034 tok/s); only the
        # retokenized count of what actually came back says 0.
        received = row.get("total_output_tokens_retokenized")
        if isinstance(received, int) and not isinstance(received, bool) and received == 0:
            raise ZeroTokensError(
                f"{where}: the bench returned 0 tokens: the server streamed no text "
                f"(total_output_tokens_retokenized = 0; the {total_output} output tokens and "
                f"{row.get('output_throughput')} tok/s the tool reports are the requested lengths, not output)"
            )
        result = ServingResult(
            backend=_get(row, "backend", str, where),
            dataset_name=_get(row, "dataset_name", str, where),
            completed=completed,
            duration_s=_get(row, "duration", float, where),
            total_input_tokens=_get(row, "total_input_tokens", int, where),
            total_output_tokens=total_output,
            request_throughput=_get(row, "request_throughput", float, where),
            input_throughput=_get(row, "input_throughput", float, where),
            output_throughput=_get(row, "output_throughput", float, where),
            mean_ttft_ms=_get(row, "mean_ttft_ms", float, where),
            median_ttft_ms=_get(row, "median_ttft_ms", float, where),
            p99_ttft_ms=_get(row, "p99_ttft_ms", float, where),
            mean_tpot_ms=_get(row, "mean_tpot_ms", float, where),
            median_tpot_ms=_get(row, "median_tpot_ms", float, where),
            mean_itl_ms=_get(row, "mean_itl_ms", float, where),
            median_itl_ms=_get(row, "median_itl_ms", float, where),
            p99_itl_ms=_get(row, "p99_itl_ms", float, where),
            accept_length=_known(row.get("accept_length")),
            max_concurrency=row.get("max_concurrency")
            if isinstance(row.get("max_concurrency"), int)
            else None,
        )
        results.append(result)
    return tuple(results)


def one_batch_figures(cases: Sequence[OneBatchCase]) -> dict[str, float]:
    """The suite's figure names for bench_one_batch_server cases (the last case per batch size wins)."""
    out: dict[str, float] = {}
    for case in cases:
        if case.batch_size == 1:
            out["decode_tok_s"] = case.output_throughput
            out["ttft_ms"] = case.last_ttft_s * 1000
        else:
            out[f"batch{case.batch_size}_tok_s"] = case.output_throughput
            out[f"batch{case.batch_size}_ttft_ms"] = case.last_ttft_s * 1000
    return out


def one_batch_server_argv(
    python: str,
    base_url: str,
    *,
    batch_sizes: Sequence[int],
    input_len: int,
    output_len: int,
    result_file: str,
    tokenizer: str | None = None,
) -> list[str]:
    """bench_one_batch_server against a running server (`--model None`: nothing is launched)."""
    argv = [
        python, "-m", "sglang.bench_one_batch_server", "--model", "None", "--base-url", base_url,
        "--batch-size", *(str(b) for b in batch_sizes), "--input-len", str(input_len),
        "--output-len", str(output_len), "--result-filename", result_file,
    ]  # fmt: skip
    if tokenizer:
        argv += ["--local-tokenizer-path", tokenizer]
    return argv


__all__ = [
    "OneBatchCase",
    "ServingResult",
    "one_batch_figures",
    "one_batch_server_argv",
    "parse_bench_serving",
    "parse_one_batch_server",
]
