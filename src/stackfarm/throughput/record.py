"""``throughput.json``: every figure of one run, in a format that stays stable for the history plots.

Written into ``$STACKFARM_SUITE_OUT`` (the runner points it at ``reports/<cell>/``), never into the CWD.
Schema ``stackfarm.throughput/1`` — new keys may be added; existing keys keep their meaning:

    {
      "schema": "stackfarm.throughput/1",
      "cell": "<cell id>",
      "created": "2026-11-29T12:00:00Z",            # UTC, when the file was written
      "runner_kind": "1x-h200",
      "sglang": "0.5.15",                           # the cell's sglang version
      "gpus": [ {index, name, driver, sm_clock_mhz, mem_clock_mhz, max_sm_clock_mhz, max_mem_clock_mhz,
                 power_limit_w, power_draw_w, temperature_c, pstate, memory_total_mib} ],   # before
      "gpus_after": [ ... ],                        # the same, after measuring (clocks under load)
      "settings": { ... },                          # the effective [suites.40-throughput.settings]
      "configs": { "baseline": {"args": [...], "cuda_graph": true, "note": "", "cpus": [1, 2, ...] | null},
                   "eagle3":   {"args": [...], "cuda_graph": false, "note": "EAGLE-3 ran without ..."} },
      "warmup": { "<config>": {"rates": [tok/s, ...], "stable": true, "window": 3, "tolerance": 0.02} },
      "figures": { "<figure>": {"unit": "tok/s" | "ms" | "tokens" | "ratio", "higher_is_better": bool,
                                "samples": [...], "n": int, "median": float, "ci_low": float,
                                "ci_high": float, "confidence": 0.95, "cv": float | null} },
      "checks": [ {"name", "figure", "kind": "absolute" | "relative" | "regression", "bound": ">= 92.6",
                   "threshold": float, "at_least": bool, "source": "thresholds.<kind>.<key>", "note",
                   "verdict": "pass" | "fail" | "inconclusive" | "error", "median", "ci_low", "ci_high",
                   "n", "remeasures", "detail"} ],
      "problems": [ "why a check could not be resolved or run" ],
      "curve": {"rates": [0.0, 0.5, 0.9], "requests_per_sample": 10, "break_even_acceptance": 0.41 | null,
                "break_even": "how it was found", "points": {"<r>": {"eagle3_over_baseline": median,
                "accept_length": median, "expected_accept_length": 1 + steps x r}}} | null,
                                                    # with settings.acceptance (stackfarm.throughput.curve)
      "bench_tool": { ... } | null                  # SGLang's bench figures, when settings.bench_tool is set
    }

Figure names are described in `stackfarm.throughput.thresholds`. Samples are in measuring order; the
interval is a percentile bootstrap of the median (`stackfarm.throughput.stats.bootstrap_ci`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StackfarmError
from .stats import bootstrap_ci, cv, median
from .thresholds import higher_is_better, unit

SCHEMA = "stackfarm.throughput/1"
SUITE = "40-throughput"
FILENAME = "throughput.json"
#: The folder the suite writes into; unset: nothing is written.
OUT_ENV = "STACKFARM_SUITE_OUT"
#: A throughput.json to compare against for `max_regression_pct` (else settings.baseline_record).
BASELINE_ENV = "STACKFARM_THROUGHPUT_BASELINE"


class RecordError(StackfarmError):
    """A throughput.json that cannot be read as a record."""


def summarise_figure(
    name: str, samples: Sequence[float], *, confidence: float, resamples: int, seed: int
) -> dict[str, Any]:
    values = [float(x) for x in samples]
    out: dict[str, Any] = {
        "unit": unit(name),
        "higher_is_better": higher_is_better(name),
        "samples": values,
        "n": len(values),
        "median": median(values) if values else None,
        "ci_low": None,
        "ci_high": None,
        "confidence": confidence,
        "cv": None,
    }
    if len(values) >= 2:
        interval = bootstrap_ci(values, confidence=confidence, resamples=resamples, seed=seed)
        out["ci_low"], out["ci_high"] = interval.low, interval.high
        out["cv"] = cv(values) if any(values) else None
    return out


def document(
    *,
    cell: str,
    runner_kind: str,
    sglang: str,
    gpus: Sequence[Mapping[str, Any]],
    gpus_after: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
    configs: Mapping[str, Mapping[str, Any]],
    warmup: Mapping[str, Mapping[str, Any]],
    figures: Mapping[str, Mapping[str, Any]],
    checks: Sequence[Mapping[str, Any]],
    problems: Sequence[str],
    bench_tool: Mapping[str, Any] | None = None,
    curve: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "cell": cell,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runner_kind": runner_kind,
        "sglang": sglang,
        "gpus": list(gpus),
        "gpus_after": list(gpus_after),
        "settings": dict(settings),
        "configs": {k: dict(v) for k, v in configs.items()},
        "warmup": {k: dict(v) for k, v in warmup.items()},
        "figures": {k: dict(v) for k, v in figures.items()},
        "checks": [dict(c) for c in checks],
        "problems": list(problems),
        "bench_tool": dict(bench_tool) if bench_tool is not None else None,
        "curve": dict(curve) if curve is not None else None,
    }


def out_dir() -> Path | None:
    value = os.environ.get(OUT_ENV)
    return Path(value) if value else None


def write(folder: Path, doc: Mapping[str, Any]) -> Path:
    """Write `doc` as folder/throughput.json atomically (a reader never sees half a file)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILENAME
    tmp = path.with_name(f".{FILENAME}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RecordError(f"{path}: cannot read a throughput record: {exc}") from exc
    return _checked(doc, path)


def _checked(doc: Any, path: Path) -> dict[str, Any]:
    """`doc` when it is a throughput.json of this schema, with its figures; else RecordError."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise RecordError(f"{path}: schema {found!r}, expected {SCHEMA!r}")
    if not isinstance(doc.get("figures"), dict):
        raise RecordError(f"{path}: no `figures` table")
    return doc


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """The figures of the last qualified run, to judge `max_regression_pct` against."""

    runner_kind: str | None
    #: Figure name -> median.
    medians: dict[str, float]
    origin: str


def qualified_figures(doc: Mapping[str, Any], path: Path) -> Baseline:
    """From a qualification record (stackfarm.qualify): 40-throughput's test_figures testcase properties."""
    for suite in doc.get("suites", []):
        if not isinstance(suite, Mapping) or suite.get("suite") != SUITE:
            continue
        for case in suite.get("cases", []):
            if isinstance(case, Mapping) and case.get("name") == "test_figures":
                props = case.get("properties") or {}
                medians = {}
                for key, value in props.items():
                    if key.endswith(".median"):
                        with contextlib.suppress(TypeError, ValueError):
                            medians[key.removesuffix(".median")] = float(value)
                kind = props.get("runner_kind")
                origin = f"{path} (release {doc.get('release', '?')})"
                return Baseline(runner_kind=str(kind) if kind else None, medians=medians, origin=origin)
    raise RecordError(
        f"{path}: a qualification record without {SUITE}'s test_figures: it qualified no figures"
    )


def read_baseline_doc(path: Path) -> Any:
    """The JSON of a baseline record (RecordError when it cannot be read)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RecordError(f"{path}: cannot read a baseline record: {exc}") from exc


def baseline_of(doc: Any, path: Path) -> Baseline:
    """The last qualified figures of an unsigned baseline record read from `path`: a qualification record
    (reports/qualifications/<release>.json, which keeps every testcase property of the qualified run) or a
    throughput.json. A signed sign-off is the sign-off side's to verify first (stackfarm.qualrecord.load_baseline:
    this library imports no sign-off)."""
    if isinstance(doc, dict) and "release" in doc and isinstance(doc.get("suites"), list):
        return qualified_figures(doc, path)
    record = _checked(doc, path)
    medians = {
        name: float(fig["median"])
        for name, fig in record["figures"].items()
        if isinstance(fig, Mapping) and isinstance(fig.get("median"), int | float)
    }
    return Baseline(runner_kind=record.get("runner_kind"), medians=medians, origin=str(path))


__all__ = [
    "BASELINE_ENV",
    "FILENAME",
    "OUT_ENV",
    "SCHEMA",
    "Baseline",
    "RecordError",
    "baseline_of",
    "document",
    "load",
    "out_dir",
    "qualified_figures",
    "read_baseline_doc",
    "summarise_figure",
    "write",
]
