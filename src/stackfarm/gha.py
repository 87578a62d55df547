"""GitHub Actions glue for the workflows in .github/workflows/: the nightly's job matrix from a plan, and
annotations from a reports folder.

    stackfarm plan --json | stackfarm gha matrix [--matrix PATH] [--github-output F]
    stackfarm gha annotate [--reports DIR] [--expect FILE]

`matrix` turns the plan into the nightly's job matrix (``{"include": [{"cell", "runner", "labels", "arch",
"gpus"}]}``): each cell runs on the first ``[runners.<kind>]`` of matrix.toml whose ``cells`` globs match its
id. `annotate` turns the reports into GitHub annotations (an error per failed suite, conflict, error or missing
cell, a warning per incomplete one) and the command exits 1 when there is an error.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .history import Run
from .matrix import Runner, load, locate
from .verdict import Status

#: A kind of self-hosted runner: matrix.toml's [runners.<kind>] (the schema is matrix.py's).
RunnerKind = Runner

#: Used when matrix.toml has no [runners] table: every cell on one generic GPU runner.
DEFAULT_RUNNER = Runner(
    name="gpu", labels=("self-hosted", "linux", "x64", "gpu"), arch=None, gpus=1, cells=("*",)
)


def read_runners(matrix_path: Path) -> tuple[tuple[Runner, ...], list[str]]:
    """The ``[runners.<kind>]`` tables of matrix.toml as matrix.load validated them; and warnings (none when
    the table is there)."""
    runners = load(matrix_path).runners
    if not runners:
        return (DEFAULT_RUNNER,), [
            f"{matrix_path} has no [runners] table: every cell runs on runs-on {list(DEFAULT_RUNNER.labels)}"
        ]
    return tuple(runners.values()), []


def job_matrix(plan: Mapping[str, Any], runners: Sequence[RunnerKind], matrix_path: Path) -> dict[str, Any]:
    """The plan's cells as a GitHub Actions matrix: one entry per cell, on the first runner kind matching it."""
    include = []
    for cell in plan.get("cells", []):
        cell_id = str(cell["id"])
        kind = next((k for k in runners if any(fnmatch.fnmatchcase(cell_id, g) for g in k.cells)), None)
        if kind is None:
            raise ConfigError(
                matrix_path,
                f"cell {cell_id} matches no [runners.*] cells glob: it would never run",
                line=locate(matrix_path, "runners"),
                fix='add a catch-all kind last (cells = ["*"]) or a glob for it',
            )
        include.append(
            {"cell": cell_id, "runner": kind.name, "labels": list(kind.labels), "arch": kind.arch or "",
             "gpus": kind.gpus}
        )  # fmt: skip
    return {"include": include}


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


__all__ = ["DEFAULT_RUNNER", "RunnerKind", "annotation", "gha_annotations", "job_matrix", "read_runners"]
