"""Buildkite: the plan's pending cells as pipelines for `buildkite-agent pipeline upload`.

    stackfarm plan --json > plan.json && buildkite-agent artifact upload plan.json
    stackfarm emit buildkite --plan plan.json | buildkite-agent pipeline upload

One command step per cell (`agents: {queue: <runner kind>}`, its reports as `artifact_paths`), a group per
runner kind, then a `wait` that lets failed cells through and the merge step (`stackfarm report`).

An upload holds at most 500 steps (groups and the wait counted). A plan with more is emitted as parts: part 1
(the one piped into `pipeline upload` above) starts with a step that uploads parts 2..N, each made by
`stackfarm emit buildkite --plan plan.json --part K` from the plan.json artifact. Buildkite inserts uploaded
steps right after the step that uploaded them, so every part lands before part 1's `wait`, and the merge step
waits for every cell of every part.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from . import (
    CellDoc,
    EmitError,
    check_chunk,
    chunks,
    conflict_lines,
    merge_command,
    pending,
    store_of,
    worker_args,
)

#: Steps one `buildkite-agent pipeline upload` takes.
UPLOAD_LIMIT = 500
#: Minutes one cell's step may run.
TIMEOUT_MINUTES = 360
_KEY_CHARS = re.compile(r"[^A-Za-z0-9_-]")


def step_key(cell_id: str, taken: set[str]) -> str:
    """A step key for the cell (Buildkite keys take letters, digits, `_ - :` and at most 100 characters)."""
    base = "cell-" + _KEY_CHARS.sub("_", cell_id)[:80]
    key, n = base, 1
    while key in taken:
        n += 1
        key = f"{base}-{n}"
    taken.add(key)
    return key


def cell_step(
    cell: CellDoc, key: str, store: str | None = None, *, plan: str | None = None, doc: CellDoc | None = None
) -> dict[str, Any]:
    """`plan`: the plan artifact the step downloads and runs on (its terms: hash basis, input hashes); `doc`:
    the plan document, whose matrix and store the run is given (stackfarm.emit.worker_args)."""
    cell_id = str(cell["id"])
    worker = worker_args(doc or {}, plan)
    push = f" --store {shlex.quote(store)}" if store and "--store" not in worker else ""
    fetch = f"buildkite-agent artifact download {shlex.quote(plan)} . && " if plan else ""
    args = f" {shlex.join(worker)}" if worker else ""
    return {
        "label": f":test_tube: {cell_id}",
        "key": key,
        "command": f"{fetch}python -m stackfarm run --cells {shlex.quote(cell_id)} --jobs 1{args}{push}",
        "agents": {"queue": cell["runner"]},
        "env": {"STACKFARM_RUNNER_KIND": cell["runner"]},
        "artifact_paths": [f"reports/{cell_id}/**/*"],
        "timeout_in_minutes": TIMEOUT_MINUTES,
    }


def _groups(
    part: Sequence[CellDoc], number: int, parts: int, taken: set[str], *, doc: CellDoc, plan: str
) -> list[dict[str, Any]]:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for cell in part:
        by_kind.setdefault(str(cell["runner"]), []).append(
            cell_step(cell, step_key(str(cell["id"]), taken), plan=plan, doc=doc)
        )
    suffix = f" (part {number} of {parts})" if parts > 1 else ""
    return [{"group": f"{kind}{suffix}", "steps": steps} for kind, steps in by_kind.items()]


def _merge_steps(doc: Mapping[str, Any], plan: str, *, ran: bool) -> list[Any]:
    """The wait and the merge; with a store the merge reads it (the stored verdicts too), and then it is there
    even when no cell had to run. Conflict cells (no step runs them) get a step of their own that fails."""
    merge = merge_command(doc, plan)
    merge = f"buildkite-agent artifact download {shlex.quote(plan)} . && {merge}"  # the merge reads the plan
    if ran:
        merge = f"buildkite-agent artifact download 'reports/**/*' . && {merge}"
    steps: list[Any] = [{"wait": None, "continue_on_failure": True}] if ran else []
    steps.append({"label": ":bar_chart: merge and report", "key": "merge", "command": merge,
                  "artifact_paths": ["reports/**/*"]})  # fmt: skip
    conflicts = conflict_lines(doc)
    if conflicts:
        text = shlex.quote("\n".join(conflicts))
        steps.append({"label": f":x: {len(conflicts)} conflict cell(s)", "key": "conflicts",
                      "command": f"printf '%s\\n' {text} >&2 && exit 1"})  # fmt: skip
    return steps


def _upload_rest(parts: int, plan: str) -> dict[str, Any]:
    uploads = " && ".join(
        f"python -m stackfarm emit buildkite --plan {shlex.quote(plan)} --part {k} | buildkite-agent pipeline upload"
        for k in range(parts, 1, -1)  # each lands right after this step: the last uploaded comes first
    )
    return {
        "label": f":pipeline: upload parts 2-{parts}",
        "key": "upload-parts",
        "command": f"buildkite-agent artifact download {shlex.quote(plan)} . && {uploads}",
    }


def pipelines(
    doc: Mapping[str, Any], *, chunk: int | None = None, plan: str = "plan.json"
) -> list[dict[str, Any]]:
    """Every part: part 1 (upload step when there are more, its cells, wait, merge), then parts 2..N.

    `chunk`: cells per part (at most 500, less the group, wait, merge and upload steps a part carries)."""
    size = check_chunk(chunk, UPLOAD_LIMIT, "a Buildkite upload")
    cells = pending(doc)
    kinds = len({c["runner"] for c in cells}) or 1
    overhead = kinds + 4  # a group per kind, the upload step, the wait, the merge and the conflicts steps
    room = UPLOAD_LIMIT - overhead
    if room < 1:
        raise EmitError(f"{kinds} runner kinds leave no room for a cell in a Buildkite upload")
    size = min(size, room)
    if not cells:
        if store_of(doc) or conflict_lines(doc):
            return [{"steps": _merge_steps(doc, plan, ran=False)}]
        return [
            {
                "steps": [
                    {"label": "nothing to run", "command": "echo 'every planned cell has a stored verdict'"}
                ]
            }
        ]
    parts = list(chunks(cells, size))
    taken: set[str] = {"merge", "upload-parts"}
    docs: list[dict[str, Any]] = []
    for number, part in enumerate(parts, 1):
        steps: list[Any] = []
        if number == 1 and len(parts) > 1:
            steps.append(_upload_rest(len(parts), plan))
        steps += _groups(part, number, len(parts), taken, doc=doc, plan=plan)
        if number == 1:
            steps += _merge_steps(doc, plan, ran=True)
        docs.append({"steps": steps})
    return docs


def count_steps(pipeline: Mapping[str, Any]) -> int:
    """Steps of an upload as its limit counts them: every step, a group's own steps included."""
    total = 0
    for step in pipeline.get("steps", []):
        total += 1
        if isinstance(step, Mapping) and "group" in step:
            total += len(step.get("steps", []))
    return total


__all__ = ["UPLOAD_LIMIT", "cell_step", "count_steps", "pipelines", "step_key"]
