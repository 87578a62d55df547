"""What the runs say, read back: one reports/ folder as a Run, and many of them as trends and verdict changes.

A run is a reports/ folder as ``python -m stackfarm run`` leaves it: ``<cell>/verdict.json`` (the CellReport
and its input hash) beside pytest's ``<cell>/NN-suite.xml`` (testcase properties included). A history is a
folder holding one copy of such a folder per run (``history/<run>/``, the nightly names them
``<UTC time>-<run number>``). Runs are ordered by name, numbers compared as numbers.

    python -m stackfarm.history DIR [--out reports]

writes into --out ``history.json`` (the series and the changes), ``history.md`` and ``history.html`` (line
charts as inline SVG): the figures of every cell over time, and each verdict change with the inputs that
changed between the two runs ("cell X started failing in run Y; inputs that changed: patch_sets.…").
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import junit, trendplot, verdict
from .errors import StackfarmError
from .files import write_atomic
from .verdict import CellReport, SuiteResult

#: A cell's verdict in one run (stackfarm.verdict.Status's value: passed, failed, incomplete, ...).
Verdict = str
#: A testcase's outcome as its JUnit file says it (stackfarm.junit reads every JUnit file: one parser).
Outcome = junit.CaseOutcome
Case = junit.Case

#: Property names that look numeric but are identities, not measurements (versions, hashes, line numbers).
_NOT_A_FIGURE = re.compile(r"version|sha256|hash|digest|(^|\.)line$", re.IGNORECASE)
_HEX = re.compile(r"^[0-9a-f]{40,64}$")


# --------------------------------------------------------------------------- one run


@dataclass(frozen=True, kw_only=True)
class SuiteRun:
    result: SuiteResult
    #: <testsuite> properties (e.g. 10-capability's ``capability.<arch>.<component>`` grid).
    properties: Mapping[str, str]
    cases: tuple[Case, ...]
    #: pytest's timestamp of the suite's run, when its JUnit file has one.
    timestamp: str | None


@dataclass(frozen=True, kw_only=True)
class CellRun:
    report: CellReport
    input_hash: str | None
    #: The inputs dict behind input_hash, when verdict.json records it (older verdicts hold only the hash).
    inputs: Mapping[str, Any] | None
    suites: tuple[SuiteRun, ...]

    @property
    def cell(self) -> str:
        return self.report.cell

    @property
    def verdict(self) -> Verdict:
        return str(self.report.status)

    def suite(self, name: str) -> SuiteRun | None:
        return next((s for s in self.suites if s.result.suite == name), None)


@dataclass(frozen=True, kw_only=True)
class Run:
    name: str
    path: Path
    #: The latest JUnit timestamp in the run (reused verdicts keep the time they first ran).
    time: str | None
    cells: Mapping[str, CellRun]
    #: Files that could not be read; the rest of the run is still used.
    problems: tuple[str, ...] = ()


def _suite_file(folder: Path, result: SuiteResult) -> Path:
    """The suite's JUnit file inside this copy of reports/ (a copy moves; the recorded path may not)."""
    local = folder / result.cell / f"{result.suite}.xml"
    if local.is_file() or result.xml is None:
        return local
    return result.xml


def cell_run(folder: Path, report: CellReport, inputs: Mapping[str, Any] | None = None) -> CellRun:
    suites = []
    for result in report.suites:
        path = _suite_file(folder, result)
        try:
            read = junit.read(path)
        except junit.UNREADABLE:  # the verdict names the file's problem; the run is still read
            read = junit.EMPTY
        res = SuiteResult(**{**asdict(result), "xml": path})
        suites.append(
            SuiteRun(result=res, properties=read.properties, cases=read.cases, timestamp=read.timestamp)
        )
    return CellRun(
        report=report,
        input_hash=report.input_hash or None,
        inputs=inputs or None,
        suites=tuple(suites),
    )


def read_run(folder: Path, reports: Sequence[CellReport] | None = None, *, name: str | None = None) -> Run:
    """Read a reports/ folder through the verdict store. `reports` (the runner's list) replaces the stored
    verdicts when given."""
    stored, problems = verdict.read_all(folder, shown=True)  # re-judged: a stored claim is never shown
    by_cell = {s.report.cell: s for s in stored}
    cells: dict[str, CellRun] = {}
    for report in reports if reports is not None else [s.report for s in stored]:
        found = by_cell.get(report.cell)
        cells[report.cell] = cell_run(folder, report, found.inputs if found else None)
    stamps = [s.timestamp for c in cells.values() for s in c.suites if s.timestamp]
    return Run(
        name=name or folder.name,
        path=folder,
        time=max(stamps, default=None),
        cells=dict(sorted(cells.items())),
        problems=tuple(problems),
    )


# --------------------------------------------------------------------------- figures


def as_number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def figures(cell: CellRun) -> dict[str, float]:
    """Every number a cell's run reports, keyed ``suite::name`` (suite properties, plus its seconds) and
    ``suite::testcase::property`` (testcase properties)."""
    out: dict[str, float] = {}
    for suite in cell.suites:
        name = suite.result.suite
        out[f"{name}::seconds"] = suite.result.time
        for key, value in suite.properties.items():
            number = as_number(value)
            if number is not None and not _NOT_A_FIGURE.search(key):
                out[f"{name}::{key}"] = number
        for case in suite.cases:
            for key, value in case.properties.items():
                number = as_number(value)
                if number is not None and not _NOT_A_FIGURE.search(key):
                    out[f"{name}::{case.name}::{key}"] = number
    return out


# --------------------------------------------------------------------------- what changed


@dataclass(frozen=True, kw_only=True)
class Difference:
    """One input that differs: its dotted key and both values (None where it is absent)."""

    key: str
    before: Any
    after: Any

    def __str__(self) -> str:
        if self.before is None:
            return f"{self.key} (added)"
        if self.after is None:
            return f"{self.key} (removed)"
        return f"{self.key}: {_short(self.before)} → {_short(self.after)}"


def _short(value: Any) -> str:
    if isinstance(value, str):
        return value[:12] + "…" if _HEX.match(value) else (value if len(value) <= 40 else value[:37] + "…")
    if isinstance(value, bool | int | float) or value is None:
        return json.dumps(value)
    return "changed"


def diff_inputs(before: Mapping[str, Any], after: Mapping[str, Any], prefix: str = "") -> list[Difference]:
    """Key by key, into nested tables: ``patch_sets.sm120-capability``, ``artifacts.sglang``, ``values.cuda``."""
    out: list[Difference] = []
    for key in sorted(set(before) | set(after)):
        path = f"{prefix}{key}"
        if key not in after:
            out.append(Difference(key=path, before=before[key], after=None))
        elif key not in before:
            out.append(Difference(key=path, before=None, after=after[key]))
        elif isinstance(before[key], Mapping) and isinstance(after[key], Mapping):
            out += diff_inputs(before[key], after[key], f"{path}.")
        elif before[key] != after[key]:
            out.append(Difference(key=path, before=before[key], after=after[key]))
    return out


def changed_inputs(before: CellRun, after: CellRun) -> list[str]:
    """What differs between two runs of a cell: the inputs dicts when both verdicts record them, else the
    report properties (versions, wheel and patch hashes, the input hash)."""
    if before.inputs is not None and after.inputs is not None:
        return [str(d) for d in diff_inputs(before.inputs, after.inputs)]
    diffs = diff_inputs(before.report.properties, after.report.properties)
    named = [str(d) for d in diffs if d.key not in ("stackfarm.input_hash", "stackfarm.run_id")]
    if not named and before.input_hash != after.input_hash:
        # The hash covers suites, settings and matrix tables that the properties do not name.
        return [
            f"stackfarm.input_hash: {_short(before.input_hash)} → {_short(after.input_hash)} "
            "(suite code, suite settings or matrix tables; verdicts that record their inputs name which)"
        ]
    return named


@dataclass(frozen=True, kw_only=True)
class Change:
    """A cell whose verdict differs from its previous run."""

    cell: str
    run: str
    previous_run: str
    before: Verdict
    after: Verdict
    #: "suite: before → after (first failure)" for each suite whose outcome moved.
    suites: tuple[str, ...]
    inputs: tuple[str, ...]

    def sentence(self) -> str:
        if self.after == "passed":
            what = "passes again"
        elif self.before == "passed":
            what = "started failing" if self.after == "failed" else f"became {self.after}"
        else:
            what = f"went from {self.before} to {self.after}"
        inputs = (
            ", ".join(self.inputs) if self.inputs else "none (the same inputs: a flaky suite or the machine)"
        )
        return f"cell {self.cell} {what} in run {self.run}; inputs that changed: {inputs}"


def _suite_moves(before: CellRun, after: CellRun) -> tuple[str, ...]:
    moves = []
    old = {s.result.suite: s.result for s in before.suites}
    for suite in after.suites:
        was = old.get(suite.result.suite)
        if was is None or was.outcome != suite.result.outcome:
            why = f" ({suite.result.first_failure})" if suite.result.first_failure else ""
            moves.append(
                f"{suite.result.suite}: {was.outcome if was else 'not run'} → {suite.result.outcome}{why}"
            )
    return tuple(moves)


def _natural(name: str) -> list[tuple[int, int | str]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p]


def load_history(folder: Path) -> list[Run]:
    """Every run under `folder` (each a copy of reports/), in run order."""
    if not folder.is_dir():
        raise StackfarmError(
            f"{folder}: no such history folder; copy each run's reports/ into {folder}/<run>/"
        )
    runs = [
        read_run(path)
        for path in sorted(folder.iterdir(), key=lambda p: _natural(p.name))
        if path.is_dir() and any(path.glob("*/verdict.json"))
    ]
    if not runs:
        raise StackfarmError(f"{folder}: no runs (folders holding <cell>/verdict.json) inside")
    return runs


def changes(runs: Sequence[Run]) -> list[Change]:
    """Each verdict change, cell by cell, between a run and that cell's previous run."""
    out: list[Change] = []
    last: dict[str, tuple[Run, CellRun]] = {}
    for run in runs:
        for cell_id, now in run.cells.items():
            if cell_id in last:
                prev_run, prev = last[cell_id]
                if prev.verdict != now.verdict:
                    out.append(
                        Change(
                            cell=cell_id,
                            run=run.name,
                            previous_run=prev_run.name,
                            before=prev.verdict,
                            after=now.verdict,
                            suites=_suite_moves(prev, now),
                            inputs=tuple(changed_inputs(prev, now)),
                        )
                    )
            last[cell_id] = (run, now)
    return out


#: cell -> figure -> [(run, value), ...] in run order.
Series = dict[str, dict[str, list[tuple[str, float]]]]


def series(runs: Iterable[Run]) -> Series:
    out: Series = {}
    for run in runs:
        for cell_id, cell in run.cells.items():
            for key, value in figures(cell).items():
                out.setdefault(cell_id, {}).setdefault(key, []).append((run.name, value))
    return out


@dataclass(frozen=True, kw_only=True)
class History:
    runs: tuple[Run, ...]
    series: Series = field(default_factory=dict)
    changes: tuple[Change, ...] = ()

    def verdicts(self) -> dict[str, dict[str, Verdict]]:
        """cell -> run -> verdict."""
        out: dict[str, dict[str, Verdict]] = {}
        for run in self.runs:
            for cell_id, cell in run.cells.items():
                out.setdefault(cell_id, {})[run.name] = cell.verdict
        return dict(sorted(out.items()))


def build(runs: Sequence[Run]) -> History:
    return History(runs=tuple(runs), series=series(runs), changes=tuple(changes(runs)))


def varying(points: Sequence[tuple[str, float]]) -> bool:
    return len({v for _, v in points}) > 1


# --------------------------------------------------------------------------- outputs


def to_json(history: History) -> dict[str, Any]:
    return {
        "runs": [
            {"name": r.name, "time": r.time, "problems": list(r.problems)}
            | {"cells": {c: cell.verdict for c, cell in r.cells.items()}}
            for r in history.runs
        ],
        "series": {
            c: {k: [[run, v] for run, v in pts] for k, pts in f.items()} for c, f in history.series.items()
        },
        "changes": [asdict(c) | {"sentence": c.sentence()} for c in history.changes],
    }


def from_json(data: Mapping[str, Any]) -> Series:
    """The series of a history.json (what the HTML report plots beside a cell's current figures)."""
    return {
        cell: {key: [(str(run), float(v)) for run, v in points] for key, points in figs.items()}
        for cell, figs in data.get("series", {}).items()
    }


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(history: History, *, images: Sequence[str] = (), note: str | None = None) -> str:
    """history.md; `images` are paths (relative to it) of the trend PNGs, `note` why there are none."""
    runs = [r.name for r in history.runs]
    lines = [f"# stackfarm history: {len(runs)} runs ({runs[0]} … {runs[-1]})", ""]
    lines += ["## Verdict changes", ""]
    lines += [f"- {_md_escape(c.sentence())}" for c in history.changes] or ["- none"]
    for change in history.changes:
        for move in change.suites:
            lines.append(f"  - {_md_escape(move)}")
    lines += ["", "## Verdicts", "", "| cell | " + " | ".join(runs) + " |", "|---" * (len(runs) + 1) + "|"]
    for cell, by_run in history.verdicts().items():
        lines.append(f"| `{cell}` | " + " | ".join(by_run.get(r, "—") for r in runs) + " |")
    lines += ["", "## Figures that moved", ""]
    moved = [
        (cell, key, pts) for cell, figs in history.series.items() for key, pts in figs.items() if varying(pts)
    ]
    if not moved:
        lines.append("none: every figure is the same in every run")
    else:
        lines += ["| cell | figure | first | last | min | max |", "|---|---|---|---|---|---|"]
        for cell, key, pts in moved:
            values = [v for _, v in pts]
            lines.append(
                f"| `{cell}` | {_md_escape(key)} | {values[0]:g} | {values[-1]:g} | {min(values):g} | {max(values):g} |"
            )
    if images or note:
        lines += ["", "## Throughput over time", ""]
        lines += [f"![{Path(i).parent.name}]({i})" for i in images] or [f"- no plots: {note}"]
    problems = [p for r in history.runs for p in r.problems]
    if problems:
        lines += ["", "## Unreadable files", "", *(f"- {_md_escape(p)}" for p in problems)]
    return "\n".join(lines) + "\n"


def write(history_dir: Path, out: Path) -> History:
    """Read every run under `history_dir`; write history.json and history.md into `out` (the HTML page is the
    report's: `htmlreport.write_history`, which `stackfarm report --history` calls)."""
    history = build(load_history(history_dir))
    write_atomic(out / "history.json", json.dumps(to_json(history), indent=1))
    runs = [r.name for r in history.runs]
    images = [p.relative_to(out).as_posix() for p in trendplot.write(history.series, out, runs)]
    note = None if images else trendplot.why_not(history.series)
    write_atomic(out / "history.md", markdown(history, images=images, note=note))
    return history


__all__ = [
    "Case",
    "CellRun",
    "Change",
    "Difference",
    "History",
    "Run",
    "Series",
    "SuiteRun",
    "Verdict",
    "as_number",
    "build",
    "cell_run",
    "changed_inputs",
    "changes",
    "diff_inputs",
    "figures",
    "from_json",
    "load_history",
    "markdown",
    "read_run",
    "series",
    "to_json",
    "varying",
    "write",
]
