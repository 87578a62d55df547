"""SGLang's own bench tools: their command lines, and their JSON output read into figures.

Both tools append one JSON object per line (JSONL) to a result file; the keys are what their code writes
(read from the sglang 0.5.15 wheel):

- ``python -m sglang.bench_one_batch_server ... --result-filename F``: `BenchOneCaseResult.dump_to_jsonl`
  in ``sglang/benchmark/one_batch_server.py`` writes run_name, batch_size, input_len, output_len, latency,
  input_throughput, output_throughput, overall_throughput, last_ttft, last_gen_throughput, acc_length and
  cache_hit_rate per (batch, input, output) case; -1 in last_gen_throughput / acc_length means "not known";
- ``python -m sglang.bench_serving ... --output-file F`` writes the same way (the run's arguments and its
  summary); the suite does not run it, so nothing here reads it (its parser, which only tests called, was
  deleted with issue 26).

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
        python,
        "-m",
        "sglang.bench_one_batch_server",
        "--model",
        "None",
        "--base-url",
        base_url,
        "--batch-size",
        *(str(b) for b in batch_sizes),
        "--input-len",
        str(input_len),
        "--output-len",
        str(output_len),
        "--result-filename",
        result_file,
    ]
    if tokenizer:
        argv += ["--local-tokenizer-path", tokenizer]
    return argv


__all__ = [
    "OneBatchCase",
    "one_batch_figures",
    "one_batch_server_argv",
    "parse_one_batch_server",
]
