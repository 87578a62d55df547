"""The worker side of a fan-out: pick one cell of a stored plan (`stackfarm plan --json`'s document), so that
an engine that knows only an index (a Kubernetes Indexed Job's $JOB_COMPLETION_INDEX, a Slurm array task id)
or an id runs exactly that cell:

    stackfarm run --plan plan.json --cell-index I      # the plan's I-th cell (0-based)
    stackfarm run --plan plan.json --cells ID          # the cell with that id, which the plan must hold

`stackfarm run` then plans the matrix itself and runs the cells matching the glob returned here: one cell,
whatever characters its id holds. With ``--store URL`` (stackfarm.store) the worker first looks for a verdict of
the cell's inputs in the shared store (another runner's: then nothing is built or run) and pushes the verdict
it computes, so `stackfarm report --from URL --plan plan.json` merges what every worker did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import StackfarmError


def read_plan(path: Path | str) -> dict[str, Any]:
    """A plan document from a file ("-": standard input)."""
    import sys

    try:
        text = sys.stdin.read() if str(path) == "-" else Path(path).read_text(encoding="utf-8")
        data = json.loads(text)
    except OSError as exc:
        raise StackfarmError(f"{path}: cannot read the plan ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise StackfarmError(f"{path}: not a plan (`stackfarm plan --json` output): {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise StackfarmError(f"{path}: not a plan (`stackfarm plan --json` output): it has no cells list")
    return data


def exact_glob(cell_id: str) -> str:
    """An fnmatch pattern that matches this id alone (`*`, `?` and `[` escaped; `,` would split --cells)."""
    if "," in cell_id:
        raise StackfarmError(f"cell id {cell_id!r} holds a comma, which --cells reads as a separator")
    return re.sub(r"([*?\[])", r"[\1]", cell_id)


def select_from_plan(
    plan_json: Mapping[str, Any], index: int | str | None = None, cell_id: str | None = None
) -> str:
    """The --cells glob for the plan's cell at `index` (0-based; a string such as "$JOB_COMPLETION_INDEX" is
    read as a number) or with id `cell_id` (exactly one of the two)."""
    cells = [str(c["id"]) for c in plan_json.get("cells", [])]
    if (index is None) == (cell_id is None):
        raise StackfarmError("give the plan's cell by --cell-index or by --cells (one of them)")
    if cell_id is not None:
        if cell_id not in cells:
            raise StackfarmError(
                f"the plan has no cell {cell_id!r} (it has {len(cells)}; --cells with --plan takes an exact id)"
            )
        return exact_glob(cell_id)
    try:
        number = int(str(index).strip())
    except ValueError:
        raise StackfarmError(f"--cell-index {index!r} is not a number") from None
    if not 0 <= number < len(cells):
        raise StackfarmError(
            f"--cell-index {number}: the plan has {len(cells)} cells (0 to {len(cells) - 1})"
        )
    return exact_glob(cells[number])


__all__ = ["exact_glob", "read_plan", "select_from_plan"]
