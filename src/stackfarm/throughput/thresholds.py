"""Thresholds per runner kind, from matrix.toml's ``[thresholds.<runner-kind>]`` tables.

A runner kind names the machine: ``<count>x-<gpu>``, e.g. ``1x-h200``, ``8x-h200``, ``8x-rtx-pro-6000``
(`runner_kind` derives it from the GPU names nvidia-smi reports; ``STACKFARM_RUNNER_KIND`` overrides it).
A table holds three sorts of keys:

- absolute bounds, keyed by the figure's name: a floor for a throughput (``decode_tok_s = 92.6``,
  ``batch8_tok_s``, ``eagle3_accept_length``), a ceiling for a latency (``ttft_ms``, ``itl_ms``);
- ``eagle3_over_baseline = k``: EAGLE-3 single-stream decode >= k x baseline, judged on the ratio of each
  interleaved pair (A B A B), so slow drift of the machine cancels out. Where EAGLE-3 is measured and a table
  sets no relative figure of its own (``eagle3_over_baseline``, ``eagle3_over_baseline@<r>`` or
  ``break_even_acceptance``), the seeds' rule "EAGLE-3 must beat baseline" applies by default:
  ``eagle3_over_baseline >= DEFAULT_EAGLE3_OVER_BASELINE`` (1.0), so a table of absolute floors alone never
  passes an EAGLE-3 that is 7x slower than the baseline;
- ``max_regression_pct = x``: every throughput figure >= (1 - x/100) x its median in the last qualified
  run on the same runner kind: a qualification record (reports/qualifications/<release>.json) or a
  throughput.json, named by ``$STACKFARM_THROUGHPUT_BASELINE`` or settings.baseline_record
  (`stackfarm.qualrecord.load_baseline`); without one there is nothing to regress against.

Figure names: ``decode_tok_s``, ``ttft_ms``, ``itl_ms`` (batch 1), ``batch<B>_tok_s``, ``batch<B>_ttft_ms``
(B > 1); the same with an ``eagle3_`` prefix for the EAGLE-3 configuration; ``eagle3_accept_length`` and
``eagle3_over_baseline``. `FIGURES` says what each means; `table_schema` declares one table for matrix.load
(which checks every [thresholds.<kind>] before any work starts), `is_known_kind` which kinds exist.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import StackfarmError, did_you_mean
from ..schema import Map, Number, Problem
from . import curve
from .stats import Bound

CheckKind = Literal["absolute", "relative", "regression"]

RELATIVE_KEY = "eagle3_over_baseline"
REGRESSION_KEY = "max_regression_pct"
#: The seeds' rule, "EAGLE-3 must beat baseline": the floor on eagle3_over_baseline wherever EAGLE-3 is measured
#: and the runner kind's table sets no relative figure (a table's own eagle3_over_baseline[@r] or
#: break_even_acceptance replaces it: a kind may know EAGLE-3 only pays off above some acceptance rate).
DEFAULT_EAGLE3_OVER_BASELINE = 1.0
DEFAULT_RELATIVE_SOURCE = (
    "stackfarm default (thresholds.DEFAULT_EAGLE3_OVER_BASELINE): EAGLE-3 must beat baseline"
)

_FIGURE = re.compile(
    r"^(?P<prefix>eagle3_)?(?:(?P<b1>decode_tok_s|ttft_ms|itl_ms)|batch(?P<batch>\d+)_(?P<bm>tok_s|ttft_ms))$"
)


#: What each figure a threshold may name means (B is a batch size > 1 of settings.batch_sizes).
FIGURES: Mapping[str, str] = {
    "decode_tok_s": "single-stream decode throughput, tok/s (a floor)",
    "ttft_ms": "single-stream time to first token, ms (a ceiling)",
    "itl_ms": "single-stream inter-token latency, ms (a ceiling)",
    "batch<B>_tok_s": "decode throughput of a batch of B, tok/s summed over the items (a floor)",
    "batch<B>_ttft_ms": "time to the last item's first token in a batch of B, ms (a ceiling)",
    "eagle3_<figure>": "any of the above, measured with EAGLE-3",
    "eagle3_accept_length": "EAGLE-3's mean accept length, tokens (a floor)",
    RELATIVE_KEY: "EAGLE-3 decode / baseline decode per interleaved pair (a floor on the ratio)",
    "<figure>@<r>": "with settings.acceptance: decode_tok_s, eagle3_decode_tok_s, eagle3_over_baseline or "
    "accept_length at planted acceptance rate r (a group of requests per sample, stackfarm.throughput.curve)",
    curve.BREAK_EVEN: "the acceptance rate where eagle3_over_baseline reaches 1, interpolated (a ceiling)",
    "max_regression_pct": "every tok/s figure >= (1 - x/100) x the last qualified record's median",
}


class ThresholdError(StackfarmError):
    """A [thresholds.*] table that cannot be used as written."""


def is_figure(name: str) -> bool:
    return (
        name in ("eagle3_accept_length", RELATIVE_KEY)
        or _FIGURE.match(name) is not None
        or curve.is_curve_figure(name)
    )


def unit(figure: str) -> str:
    if figure == curve.BREAK_EVEN:
        return "acceptance"
    figure = figure.partition("@")[0]
    if figure.endswith("_tok_s"):
        return "tok/s"
    if figure.endswith("_ms"):
        return "ms"
    if figure.endswith("accept_length"):
        return "tokens"
    return "ratio"


def higher_is_better(figure: str) -> bool:
    """Throughputs, ratios and accept lengths are floors; latencies and the break-even rate are ceilings."""
    return unit(figure) not in ("ms", "acceptance")


def figure_batch(figure: str) -> int | None:
    """The batch size a figure is measured at (1 for the single-stream ones), None for derived figures."""
    match = _FIGURE.match(figure)
    if match is None:  # derived figures and the curve's (its groups are single-stream requests)
        return 1 if figure == "eagle3_accept_length" else None
    return int(match["batch"]) if match["batch"] else 1


def figure_config(figure: str) -> str:
    return "eagle3" if figure.startswith("eagle3_") else "baseline"


def figure_names(
    batch_sizes: Sequence[int], *, eagle3: bool, acceptance: Sequence[float] = ()
) -> tuple[str, ...]:
    """Every figure a measurement with these settings produces, in a stable order (the curve's with
    settings.acceptance, which needs EAGLE-3)."""
    configs = ("", "eagle3_") if eagle3 else ("",)
    names: list[str] = []
    for prefix in configs:
        names += [f"{prefix}decode_tok_s", f"{prefix}ttft_ms", f"{prefix}itl_ms"]
        for batch in sorted(set(batch_sizes)):
            if batch > 1:
                names += [f"{prefix}batch{batch}_tok_s", f"{prefix}batch{batch}_ttft_ms"]
    if eagle3:
        names += ["eagle3_accept_length", RELATIVE_KEY, *curve.figure_names(acceptance)]
    return tuple(names)


# ------------------------------------------------------------------------------------------ runner kinds

#: GPU families by the words nvidia-smi uses; the first match names the GPU. Order matters (gb200 > b200).
_FAMILIES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"rtx pro 6000"), "rtx-pro-6000"),
    (re.compile(r"\bgb200\b"), "gb200"),
    (re.compile(r"\bgb300\b"), "gb300"),
    (re.compile(r"\bb200\b"), "b200"),
    (re.compile(r"\bb300\b"), "b300"),
    (re.compile(r"\bh200\b"), "h200"),
    (re.compile(r"\bh100\b"), "h100"),
    (re.compile(r"\bh20\b"), "h20"),
    (re.compile(r"\ba100\b"), "a100"),
    (re.compile(r"\bl40s\b"), "l40s"),
)


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200'; 'NVIDIA RTX PRO 6000 Blackwell Server Edition' -> 'rtx-pro-6000'."""
    text = re.sub(r"\s+", " ", name.lower().replace("nvidia", "")).strip()
    for pattern, slug in _FAMILIES:
        if pattern.search(text):
            return slug
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "unknown-gpu"


#: The GPU names runner kinds are made of.
KNOWN_GPUS: tuple[str, ...] = tuple(slug for _, slug in _FAMILIES)
_KIND = re.compile(rf"^\d+x-(?:{'|'.join(KNOWN_GPUS)})(?:\+\d+x-(?:{'|'.join(KNOWN_GPUS)}))*$")


def is_known_kind(kind: str) -> bool:
    """Whether `kind` is a runner kind `runner_kind` can name: ``<count>x-<gpu>`` of a known GPU (joined by +)."""
    return _KIND.match(kind) is not None


def runner_kind(gpu_names: Sequence[str]) -> str:
    """'<count>x-<gpu>' for a machine of one GPU type; mixed machines join their parts with '+'."""
    if not gpu_names:
        return "no-gpu"
    counts: dict[str, int] = {}
    for name in gpu_names:
        slug = gpu_slug(name)
        counts[slug] = counts.get(slug, 0) + 1
    return "+".join(f"{n}x-{slug}" for slug, n in sorted(counts.items()))


# ------------------------------------------------------------------------------------------ resolution


@dataclass(frozen=True, kw_only=True)
class Check:
    """One threshold to judge: a figure against a bound, and where the bound came from."""

    #: Unique within a run; the testcase id.
    name: str
    figure: str
    kind: CheckKind
    bound: Bound
    #: e.g. "thresholds.1x-h200.decode_tok_s".
    source: str
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Resolution:
    runner_kind: str
    checks: tuple[Check, ...]
    #: Why no check could be resolved (an unknown runner kind, an empty table), else None.
    problem: str | None = None


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ThresholdError(f"{where} = {value!r}: expected a number")
    if not value > 0:
        raise ThresholdError(f"{where} = {value!r}: expected a number > 0")
    return float(value)


def _unmeasured(figure: str, measured: Sequence[str]) -> str | None:
    """Why a figure name is not among the `measured` ones (None when it is)."""
    if figure in measured:
        return None
    batch = figure_batch(figure)
    why = "EAGLE-3 is not measured (settings.eagle3 is off)" if figure.startswith("eagle3_") else ""
    at_rate = curve.split(figure)
    if at_rate is not None or figure == curve.BREAK_EVEN:
        rates = sorted({found[1] for f in measured if (found := curve.split(f)) is not None})
        why = (
            f"rate {curve.label(at_rate[1])} is not in settings.acceptance ({', '.join(map(curve.label, rates))})"
            if at_rate is not None and rates
            else "settings.acceptance is not set: no curve over acceptance rates is measured"
        )
    if batch is not None and batch > 1 and f"batch{batch}_tok_s" not in measured:
        why = f"batch size {batch} is not in settings.batch_sizes"
    return f"the figure `{figure}` is not measured with these settings" + (f" ({why})" if why else "")


def key_problem(key: str, measured: Sequence[str]) -> str | None:
    """What is wrong with `key` in a [thresholds.<kind>] table judged on `measured` figures, or None."""
    if key == REGRESSION_KEY:
        return None
    if not is_figure(key):
        hint = did_you_mean(key, [*measured, REGRESSION_KEY])
        return "is an unknown threshold" + (f"; {hint}" if hint else "")
    return _unmeasured(key, measured)


def _below_100(table: Mapping[str, Any]) -> list[Problem]:
    pct = table.get(REGRESSION_KEY)
    if isinstance(pct, int | float) and pct >= 100:
        return [Problem((REGRESSION_KEY,), f"= {pct!r}: a regression limit must be below 100 (%)", "", pct)]
    return []


def kind_problem(kind: str, runners: tuple[str, ...]) -> tuple[str, str] | None:
    """Why [thresholds.<kind>] is refused (message, fix): neither a kind of [runners] (`runners`) nor a
    <count>x-<gpu> of KNOWN_GPUS; None when it is one."""
    if kind in runners or is_known_kind(kind):
        return None
    hint = did_you_mean(kind, runners)
    return (
        f"[thresholds.{kind}]: `{kind}` is not a runner kind" + (f"; {hint}" if hint else ""),
        f"use a kind of [runners] ({', '.join(runners) or 'none'}) or <count>x-<gpu> with a gpu of "
        f"{', '.join(KNOWN_GPUS)}, as nvidia-smi names the runner",
    )


def table_schema(measured: Sequence[str]) -> Map:
    """One [thresholds.<kind>] table, declared: figure names (of `measured`) and max_regression_pct, numbers > 0."""
    known = ", ".join([*measured, REGRESSION_KEY])
    return Map(
        Number("a number > 0, e.g. decode_tok_s = 92.6", positive=True),
        f"a figure name ({known}) = a number; see stackfarm.throughput.thresholds",
        keys=lambda key: key_problem(key, measured),
        noun="threshold",
        rules=(_below_100,),
    )


def _absolute(figure: str, value: Any, where: str, measured: Sequence[str]) -> Check:
    unmeasured = _unmeasured(figure, measured)
    if unmeasured:
        raise ThresholdError(f"{where}: {unmeasured}")
    bound = Bound(value=_number(value, where), at_least=higher_is_better(figure))
    return Check(name=f"{figure}", figure=figure, kind="absolute", bound=bound, source=where)


def _regression(
    pct: Any, where: str, measured: Sequence[str], last: Mapping[str, float] | None, last_origin: str
) -> list[Check]:
    limit = _number(pct, where)
    if limit >= 100:
        raise ThresholdError(f"{where} = {pct!r}: a regression limit must be below 100 (%)")
    if last is None:
        return []
    checks = []
    for figure in measured:
        if unit(figure) != "tok/s" or figure not in last:
            continue
        floor = (1 - limit / 100) * float(last[figure])
        checks.append(
            Check(
                name=f"{figure}-regression",
                figure=figure,
                kind="regression",
                bound=Bound(value=floor, at_least=True),
                source=where,
                note=f"<= {limit:g} % below {float(last[figure]):.4g} ({last_origin})",
            )
        )
    return checks


def resolve(
    tables: Mapping[str, Any],
    kind: str,
    *,
    measured: Sequence[str],
    last: Mapping[str, float] | None = None,
    last_origin: str = "the last qualified record",
) -> Resolution:
    """The checks for runner kind `kind` from the [thresholds] tables, validated against `measured`.

    An unknown runner kind (or an empty table) is a Resolution with a `problem`, so the suite reports it as
    one clear failing check instead of silently checking nothing. A malformed table raises ThresholdError.
    `last` maps figure names to medians of the last qualified record; without one, no regression checks.
    """
    if kind not in tables:
        known = ", ".join(sorted(tables)) or "none"
        hint = did_you_mean(kind, tables)
        return Resolution(
            runner_kind=kind,
            checks=(),
            problem=(
                f"no [thresholds.{kind}] in matrix.toml for this runner (known runner kinds: {known})"
                + (f"; {hint}" if hint else "")
                + f": add a [thresholds.{kind}] table (the measured figures are in throughput.json), or set "
                "STACKFARM_RUNNER_KIND if the runner was misnamed"
            ),
        )
    table = tables[kind]
    if not isinstance(table, Mapping):
        raise ThresholdError(f"thresholds.{kind} must be a table, got {type(table).__name__}")
    checks: list[Check] = []
    for key, value in table.items():
        where = f"thresholds.{kind}.{key}"
        if key == RELATIVE_KEY:
            if RELATIVE_KEY not in measured:
                raise ThresholdError(
                    f"{where}: EAGLE-3 is not measured with these settings (settings.eagle3)"
                )
            checks.append(
                Check(
                    name=RELATIVE_KEY,
                    figure=RELATIVE_KEY,
                    kind="relative",
                    bound=Bound(value=_number(value, where), at_least=True),
                    source=where,
                    note="EAGLE-3 decode / baseline decode, per interleaved pair",
                )
            )
        elif key.startswith(f"{RELATIVE_KEY}@") and is_figure(key):
            unmeasured = _unmeasured(key, measured)
            if unmeasured:
                raise ThresholdError(f"{where}: {unmeasured}")
            checks.append(
                Check(
                    name=key,
                    figure=key,
                    kind="relative",
                    bound=Bound(value=_number(value, where), at_least=True),
                    source=where,
                    note="EAGLE-3 / baseline decode at a planted acceptance rate, per interleaved pair of groups",
                )
            )
        elif key == REGRESSION_KEY:
            checks += _regression(value, where, measured, last, last_origin)
        elif is_figure(key):
            checks.append(_absolute(key, value, where, measured))
        else:
            hint = did_you_mean(key, [*measured, REGRESSION_KEY])
            raise ThresholdError(
                f"{where}: unknown threshold key" + (f"; {hint}" if hint else "") + "; known: a figure name "
                f"({', '.join(measured)}), {REGRESSION_KEY}"
            )
    if not checks and REGRESSION_KEY not in table:
        return Resolution(
            runner_kind=kind, checks=(), problem=f"[thresholds.{kind}] sets no thresholds: add at least one"
        )
    return Resolution(runner_kind=kind, checks=(*checks, *_default_relative(table, measured)))


def _sets_relative(key: str) -> bool:
    return key in (curve.BREAK_EVEN, RELATIVE_KEY) or key.startswith(f"{RELATIVE_KEY}@")


def _default_relative(table: Mapping[str, Any], measured: Sequence[str]) -> tuple[Check, ...]:
    """The seeds' rule where EAGLE-3 is measured and `table` sets no relative figure of its own."""
    if RELATIVE_KEY not in measured or any(_sets_relative(key) for key in table):
        return ()
    check = Check(
        name=RELATIVE_KEY,
        figure=RELATIVE_KEY,
        kind="relative",
        bound=Bound(value=DEFAULT_EAGLE3_OVER_BASELINE, at_least=True),
        source=DEFAULT_RELATIVE_SOURCE,
        note="EAGLE-3 decode / baseline decode, per interleaved pair; the default where the table sets no "
        "relative figure",
    )
    return (check,)


__all__ = [
    "DEFAULT_EAGLE3_OVER_BASELINE",
    "DEFAULT_RELATIVE_SOURCE",
    "FIGURES",
    "KNOWN_GPUS",
    "REGRESSION_KEY",
    "RELATIVE_KEY",
    "Check",
    "CheckKind",
    "Resolution",
    "ThresholdError",
    "figure_batch",
    "figure_config",
    "figure_names",
    "gpu_slug",
    "higher_is_better",
    "is_figure",
    "is_known_kind",
    "key_problem",
    "kind_problem",
    "resolve",
    "runner_kind",
    "table_schema",
    "unit",
]
