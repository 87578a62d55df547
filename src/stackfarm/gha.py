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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions

from .errors import ConfigError, did_you_mean
from .history import Run
from .matrix import locate
from .verdict import Status


@dataclass(frozen=True, kw_only=True)
class RunnerKind:
    """A kind of self-hosted runner: the labels a job asks for, and which cells run there."""

    name: str
    labels: tuple[str, ...]
    arch: str | None
    gpus: int
    #: fnmatch globs on cell ids; the first kind (in file order) that matches a cell runs it.
    cells: tuple[str, ...]


#: Used when matrix.toml has no [runners] table: every cell on one generic GPU runner.
DEFAULT_RUNNER = RunnerKind(
    name="gpu", labels=("self-hosted", "linux", "x64", "gpu"), arch=None, gpus=1, cells=("*",)
)
_RUNNER_KEYS = ("labels", "arch", "gpus", "cells")


def read_runners(matrix_path: Path) -> tuple[tuple[RunnerKind, ...], list[str]]:
    """The ``[runners.<kind>]`` tables of matrix.toml, validated; and warnings (none when the table is there)."""
    try:
        data = tomlkit.parse(matrix_path.read_text(encoding="utf-8")).unwrap()
    except (OSError, tomlkit.exceptions.TOMLKitError) as exc:
        raise ConfigError(matrix_path, f"cannot read it: {exc}") from None
    table = data.get("runners")
    if table is None:
        return (DEFAULT_RUNNER,), [
            f"{matrix_path} has no [runners] table: every cell runs on runs-on {list(DEFAULT_RUNNER.labels)}"
        ]
    archs = data.get("targets", {}).get("archs", [])
    kinds = []
    for name, entry in table.items():
        where = f"runners.{name}"

        def bad(message: str, key: str | None = None, fix: str = "", where: str = where) -> ConfigError:
            return ConfigError(matrix_path, message, line=locate(matrix_path, where, key), fix=fix)

        if not isinstance(entry, dict):
            raise bad(f"[{where}] must be a table", fix='e.g. labels = ["self-hosted", "gpu"]')
        for key in entry:
            if key not in _RUNNER_KEYS:
                hint = did_you_mean(key, _RUNNER_KEYS)
                raise bad(f"`{key}` in [{where}] is unknown" + (f"; {hint}" if hint else ""), key,
                          f"use one of: {', '.join(_RUNNER_KEYS)}")  # fmt: skip
        labels = entry.get("labels")
        if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x for x in labels):
            raise bad(f"labels of [{where}] must be a non-empty list of strings", "labels",
                      'e.g. labels = ["self-hosted", "linux", "x64", "sm_120", "gpus-8"]')  # fmt: skip
        arch = entry.get("arch")
        if arch is not None and arch not in archs:
            raise bad(f"arch `{arch}` of [{where}] is not in [targets] archs {archs}", "arch", "add it there")
        gpus = entry.get("gpus", 1)
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
            raise bad(f"gpus of [{where}] must be a whole number >= 1, got {gpus!r}", "gpus")
        cells = entry.get("cells", ["*"])
        cells = [cells] if isinstance(cells, str) else cells
        if not isinstance(cells, list) or not all(isinstance(x, str) for x in cells):
            raise bad(
                f"cells of [{where}] must be a list of cell-id globs", "cells", 'e.g. cells = ["*-sgl0.5.9"]'
            )
        kinds.append(
            RunnerKind(
                name=name, labels=tuple(labels), arch=arch, gpus=gpus, cells=tuple(str(c) for c in cells)
            )
        )
    if not kinds:
        raise ConfigError(matrix_path, "[runners] lists no runner", fix="add a [runners.<kind>] table")
    return tuple(kinds), []


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
