"""Thresholds from records: a `[thresholds.<kind>]` table derived from one or more runs' throughput.json.

A threshold is only worth setting on a figure that is stable on its runner: a bound on a figure with a CV of
7.5 % (the H200's TTFT at a 16-token prompt) either sits so far from the median that it catches nothing, or so
close that a quiet loss and a noisy round look alike. The rule here, for each figure:

- it is *stable* when its CV is at most `max_cv` in every record (default 2 %), and, with two or more records,
  their medians agree within `agree` x the largest CV (default 3, i.e. three standard deviations of one sample);
- a stable floor figure (throughputs, ratios, accept lengths) gets ``(1 - margin) x`` the lowest interval bound
  over the records, a stable ceiling (latencies, the break-even rate) ``(1 + margin) x`` the highest, rounded to
  three significant digits (default margin 7 %: bounds 5-10 % outside the intervals catch real losses, e.g. no
  CUDA graphs for EAGLE-3, 147 -> 30 tok/s, and pass the runner's own spread);
- an unstable figure is written commented out, with the reason: no threshold.

`compare` is the same reading as a table (medians, CVs, agreement per figure) for a note or a PR comment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .thresholds import higher_is_better, is_figure

#: A figure's CV must stay at most this in every record to carry a threshold.
MAX_CV = 0.02
#: Bounds sit this far outside the records' intervals.
MARGIN = 0.07
#: Two records agree on a figure when their medians differ by at most this x the larger CV (relative).
AGREE = 3.0


@dataclass(frozen=True, kw_only=True)
class FigureReading:
    """One figure over the records: what a threshold would be, or why there is none."""

    figure: str
    medians: tuple[float, ...]
    cvs: tuple[float | None, ...]
    low: float
    high: float
    #: Relative spread of the medians: (max - min) / mean.
    spread: float
    #: None when stable (a threshold is proposed), else why not.
    unstable: str | None
    bound: float | None

    def agrees(self) -> bool:
        worst = max((c for c in self.cvs if c is not None), default=0.0)
        return self.spread <= AGREE * worst or self.spread == 0.0


def _round3(value: float) -> float:
    if value == 0 or not math.isfinite(value):
        return value
    digits = 2 - math.floor(math.log10(abs(value)))
    return round(value, digits)


def _reading(
    figure: str, entries: Sequence[Mapping[str, Any]], *, max_cv: float, margin: float
) -> FigureReading:
    medians = tuple(float(e["median"]) for e in entries)
    cvs = tuple(None if e.get("cv") is None else float(e["cv"]) for e in entries)
    low = min(float(e["median"] if e.get("ci_low") is None else e["ci_low"]) for e in entries)
    high = max(float(e["median"] if e.get("ci_high") is None else e["ci_high"]) for e in entries)
    mean = sum(medians) / len(medians)
    spread = (max(medians) - min(medians)) / abs(mean) if mean else 0.0
    unstable: str | None = None
    if any(c is None for c in cvs):
        unstable = "fewer than 2 samples in a record: no CV"
    elif (worst := max(c for c in cvs if c is not None)) > max_cv:
        unstable = f"CV {worst:.1%} > {max_cv:.0%}"
    elif len(medians) > 1 and spread > AGREE * worst and spread > 0:
        unstable = f"the records' medians differ by {spread:.1%} > {AGREE:g} x CV {worst:.1%}"
    bound = None
    if unstable is None:
        bound = _round3(low * (1 - margin)) if higher_is_better(figure) else _round3(high * (1 + margin))
    return FigureReading(
        figure=figure,
        medians=medians,
        cvs=cvs,
        low=low,
        high=high,
        spread=spread,
        unstable=unstable,
        bound=bound,
    )


def readings(
    records: Sequence[Mapping[str, Any]], *, max_cv: float = MAX_CV, margin: float = MARGIN
) -> list[FigureReading]:
    """Every figure all the records measured, read as above (records: loaded throughput.json documents)."""
    if not records:
        raise ValueError("no records to derive thresholds from")
    kinds = {str(r.get("runner_kind")) for r in records}
    if len(kinds) > 1:
        raise ValueError(f"the records come from different runner kinds: {', '.join(sorted(kinds))}")
    common = set(records[0].get("figures", {}))
    for record in records[1:]:
        common &= set(record.get("figures", {}))
    out = []
    for figure in sorted(common):
        entries = [r["figures"][figure] for r in records]
        if not is_figure(figure) or any(e.get("median") is None for e in entries):
            continue
        out.append(_reading(figure, entries, max_cv=max_cv, margin=margin))
    return out


def table(
    records: Sequence[Mapping[str, Any]],
    *,
    keys: Sequence[str] = (),
    max_cv: float = MAX_CV,
    margin: float = MARGIN,
) -> str:
    """The `[thresholds.<kind>]` TOML table: `keys` (e.g. the current table's) first, as bounds where stable and
    commented out where not; then every other stable figure, commented out, as a suggestion."""
    kind = str(records[0].get("runner_kind"))
    found = {r.figure: r for r in readings(records, max_cv=max_cv, margin=margin)}
    lines = [
        f"# derived from {len(records)} record(s) by `stackfarm thresholds`: bounds {margin:.0%} outside the "
        f"intervals, only where CV <= {max_cv:.0%}" + (" and the runs agree" if len(records) > 1 else ""),
        f"[thresholds.{kind}]",
    ]
    for key in keys:
        reading = found.get(key)
        if reading is None:
            lines.append(
                f"# {key}: not measured in the record(s)" if is_figure(key) else f"# {key}: kept by hand"
            )
        elif reading.bound is None:
            lines.append(f'# "{key}" = none: {reading.unstable} (medians {_medians(reading)})')
        else:
            lines.append(f'"{key}" = {reading.bound:g}    # medians {_medians(reading)}, CV {_cvs(reading)}')
    extra = [r for name, r in found.items() if name not in keys and r.bound is not None]
    if extra:
        lines.append("# also stable (not thresholded):")
        lines += [f'# "{r.figure}" = {r.bound:g}    # medians {_medians(r)}, CV {_cvs(r)}' for r in extra]
    return "\n".join(lines) + "\n"


def _medians(reading: FigureReading) -> str:
    return " / ".join(f"{m:.4g}" for m in reading.medians)


def _cvs(reading: FigureReading) -> str:
    return " / ".join("n/a" if c is None else f"{c:.2%}" for c in reading.cvs)


def compare(records: Sequence[Mapping[str, Any]], *, max_cv: float = MAX_CV) -> str:
    """A markdown table of every figure over the records: medians, CVs, spread, whether they agree and carry a
    threshold."""
    head = (
        "| figure | "
        + " | ".join(f"run {i + 1}" for i in range(len(records)))
        + " | CV | spread | agree | threshold |"
    )
    rows = [head, "|" + " --- |" * (len(records) + 5)]
    for r in readings(records, max_cv=max_cv):
        rows.append(
            f"| {r.figure} | {' | '.join(f'{m:.4g}' for m in r.medians)} | {_cvs(r)} | {r.spread:.2%} | "
            f"{'yes' if r.agrees() else 'NO'} | {'none: ' + r.unstable if r.unstable else 'ok'} |"
        )
    return "\n".join(rows) + "\n"


__all__ = ["AGREE", "MARGIN", "MAX_CV", "FigureReading", "compare", "readings", "table"]
