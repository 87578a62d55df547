"""GitHub Actions glue for the workflows in .github/workflows/: the nightly's job matrix from a plan, and
annotations from a reports folder.

    stackfarm plan --json | stackfarm gha matrix [--matrix PATH] [--github-output F]
    stackfarm gha annotate [--reports DIR] [--expect FILE]

`matrix` turns the plan into the nightly's job matrix (``{"include": [{"cell", "runner", "labels", "arch",
"gpus"}]}``): each cell runs on the kind the plan dispatched it to (stackfarm.driver.route over the plan's
matrix: the first ``[runners.<kind>]`` whose ``cells`` globs match its id and whose driver runs it); a cell no
kind can run gets no job, an error annotation, and the command exits 3. `annotate` turns the reports into GitHub annotations (an error per failed suite, conflict, error or missing
cell, a warning per incomplete one) and the command exits 1 when there is an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .driver import DEFAULT_RUNNER, route
from .errors import ConfigError
from .history import Run
from .matrix import Runner, load, locate
from .verdict import Status

#: A kind of self-hosted runner: matrix.toml's [runners.<kind>] (the schema is matrix.py's).
RunnerKind = Runner


def read_runners(matrix_path: Path) -> tuple[tuple[Runner, ...], list[str]]:
    """The ``[runners.<kind>]`` tables of matrix.toml as matrix.load validated them; and warnings (none when
    the table is there)."""
    runners = load(matrix_path).runners
    if not runners:
        return (DEFAULT_RUNNER,), [
            f"{matrix_path} has no [runners] table: every cell runs on runs-on {list(DEFAULT_RUNNER.labels)}"
        ]
    return tuple(runners.values()), []


def dispatch(
    plan: Mapping[str, Any], runners: Sequence[RunnerKind], matrix_path: Path
) -> tuple[dict[str, Any], list[str]]:
    """The plan's cells as a GitHub Actions matrix: one entry per cell on the kind the plan dispatched it to
    (stackfarm.driver.route, by the plan's matrix; a cell of an older plan without a routing is routed here by
    its CUDA floor); and one line per cell dispatched nowhere (unrunnable on every kind), which gets no job."""
    include, unrunnable = [], []
    by_name = {k.name: k for k in runners}
    for cell in plan.get("cells", []):
        cell_id = str(cell["id"])
        if "status" in cell:
            status, reason = str(cell["status"]), str(cell.get("unrunnable") or "")
            kind = by_name.get(str(cell.get("runner"))) if status == "run" else None
            if status == "run" and kind is None:
                raise ConfigError(
                    matrix_path,
                    f"the plan dispatches cell {cell_id} to runner kind {cell.get('runner')!r}, which this "
                    "matrix does not declare",
                    line=locate(matrix_path, "runners"),
                    fix="give `gha matrix` the plan's matrix (--matrix), or make the plan again",
                )
        else:
            found = route(cell_id, str((cell.get("values") or {}).get("cuda", "")), runners)
            status, reason, kind = found.status, found.reason, found.runner
        if status == "unrouted":
            raise ConfigError(
                matrix_path,
                f"cell {cell_id} matches no [runners.*] cells glob: it would never run",
                line=locate(matrix_path, "runners"),
                fix='add a catch-all kind last (cells = ["*"]) or a glob for it',
            )
        if kind is None:
            unrunnable.append(f"{cell_id}: {reason}")
            continue
        include.append(
            {
                "cell": cell_id,
                "runner": kind.name,
                "labels": list(kind.labels),
                "arch": kind.arch or "",
                "gpus": kind.gpus,
            }
        )
    return {"include": include}, unrunnable


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(level: str, title: str, message: str) -> str:
    """A GitHub workflow command (``::error title=...::message``), escaped as the runner expects."""
    return f"::{level} title={_escape_property(title)}::{_escape_data(message)}"


def gha_annotations(run: Run, expected: Sequence[str] = ()) -> list[str]:
    out = [
        annotation("error", cell, f"{cell}: no report; its job ended before the run wrote one")
        for cell in expected
        if cell not in run.cells
    ]
    for cell_id, cell in run.cells.items():
        if cell.report.status in (Status.CONFLICT, Status.ERROR):
            out.append(annotation("error", cell_id, f"{cell.report.status}: {cell.report.reason}"))
            continue
        for suite in cell.suites:
            res = suite.result
            if res.outcome in ("failed", "error"):
                out.append(annotation("error", f"{cell_id} {res.suite}", res.first_failure or res.outcome))
            elif res.outcome in ("skipped", "incomplete"):
                why = next((c.message for c in suite.cases if c.message), "skipped")
                out.append(annotation("warning", f"{cell_id} {res.suite}", f"skipped: {why}"))
    out += [annotation("warning", "unreadable report", p) for p in run.problems]
    return out


__all__ = [
    "DEFAULT_RUNNER",
    "RunnerKind",
    "annotation",
    "dispatch",
    "gha_annotations",
    "read_runners",
]
