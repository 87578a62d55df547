"""GitHub Actions: the plan's pending cells as a caller workflow, one job per chunk of at most 256 cells (the
limit of jobs one matrix may start) calling the reusable .github/workflows/cells.yml with the chunk's cells as
its `cells` input, then a job that merges every cell's reports.

    stackfarm emit gha --plan plan.json [--chunk N] > .github/workflows/stackfarm-cells.yml

The chunks follow the plan's order (longest first by estimated duration), so the longest cells start first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .. import storekeys
from ..planjson import PlanContract
from . import CellDoc, check_chunk, chunks, conflict_lines, merge_command, pending, store_of

#: Jobs one matrix may start (docs.github.com: Actions limits).
MATRIX_LIMIT = 256
#: The reusable workflow each chunk calls (this repository's .github/workflows/cells.yml).
CELLS_WORKFLOW = "./.github/workflows/cells.yml"

# The actions the report job uses, pinned as the repository's own workflows pin them.
CHECKOUT = "actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683"
SETUP_PYTHON = "actions/setup-python@a26af69be951a213d495a4c3e4e4022e16d87065"
DOWNLOAD = "actions/download-artifact@d3f86a106a0bac45b974a628896c90dbdf5c8093"
UPLOAD = "actions/upload-artifact@ea165f8d65b6e75b540449e92b4886f43607fa02"

_READ = {"contents": "read"}
#: The secret (and environment variable) holding the runner's signing key.
RUNNER_KEY = storekeys.RUNNER_KEY_ENV


def entry(cell: CellDoc) -> dict[str, Any]:
    """A cell as cells.yml's matrix takes it (stackfarm.gha.job_matrix's entry)."""
    return {
        "cell": cell["id"],
        "runner": cell["runner"],
        "labels": list(cell.get("labels") or ()),
        "arch": cell.get("arch") or "",
        "gpus": cell.get("gpus") or 0,
    }


def _report_job(needs: Sequence[str], command: str) -> dict[str, Any]:
    return {
        "name": "merge and report",
        **({"needs": list(needs)} if needs else {}),
        "if": "always()",
        "runs-on": "ubuntu-latest",
        "permissions": dict(_READ),
        "timeout-minutes": 30,
        "steps": [
            {"uses": CHECKOUT, "with": {"persist-credentials": False}},
            {"uses": SETUP_PYTHON, "with": {"python-version": "3.11"}},
            {
                "name": "install stackfarm",
                "run": "python -m pip install --disable-pip-version-check -e .",
            },
            *(
                [
                    {
                        "uses": DOWNLOAD,
                        "with": {"pattern": "reports-*", "path": "reports", "merge-multiple": True},
                    }
                ]
                if needs
                else []
            ),
            {"name": "merge the reports", "run": command},
            {
                "name": "upload the merged report",
                "if": "always()",
                "uses": UPLOAD,
                "with": {"name": "stackfarm-report", "path": "reports/", "retention-days": 90},
            },
        ],
    }


def workflow(
    doc: Mapping[str, Any],
    *,
    chunk: int | None = None,
    name: str = "stackfarm cells",
    plan: str = "plan.json",
) -> dict[str, Any]:
    """The caller workflow: `chunk-<n>` jobs (each `uses:` cells.yml with up to `chunk` cells) and `report`."""
    size = check_chunk(chunk, MATRIX_LIMIT, "a GitHub Actions matrix")
    cells = pending(doc)
    contract = PlanContract.of(doc)
    jobs: dict[str, Any] = {}
    for n, part in enumerate(chunks(cells, size), 1):
        first = (n - 1) * size + 1
        jobs[f"chunk-{n}"] = {
            "name": f"cells {first}-{first + len(part) - 1} of {len(cells)}",
            "permissions": dict(_READ),
            "uses": CELLS_WORKFLOW,
            "with": {
                "cells": json.dumps([entry(c) for c in part], separators=(",", ":")),
                "store": store_of(doc) or "",
                # The plan's matrix and backend: a plan made from --matrix X runs X, under the plan's basis.
                **({"matrix": contract.matrix.path} if contract.matrix else {}),
                **({"backend": contract.basis.backend} if contract.basis else {}),
                "plan": plan,  # the workers check their input hashes against it
            },
            # What a worker pushes is signed with the runner key (stackfarm.storekeys), a repository secret.
            **({"secrets": {RUNNER_KEY: f"${{{{ secrets.{RUNNER_KEY} }}}}"}} if store_of(doc) else {}),
        }
    conflicts = conflict_lines(doc)
    if conflicts:  # cells no job runs: the workflow says they are not green (a `run` exits 1 for them)
        jobs["conflicts"] = {
            "name": f"{len(conflicts)} conflict cell(s)",
            "runs-on": "ubuntu-latest",
            "permissions": dict(_READ),
            "env": {"CONFLICTS": "\n".join(conflicts)},
            "steps": [{"run": "printf '%s\\n' \"${CONFLICTS}\" | sed 's/^/::error::/'\nexit 1"}],
        }
    cell_jobs = [k for k in jobs if k.startswith("chunk-")]
    # With a store, the stored verdicts are merged and gated even when no cell had to run.
    if cell_jobs or store_of(doc):
        jobs["report"] = _report_job(cell_jobs, merge_command(doc, plan))
    elif not conflicts:
        jobs["nothing"] = {
            "name": "nothing to run",
            "runs-on": "ubuntu-latest",
            "permissions": dict(_READ),
            "steps": [{"run": "echo 'every planned cell has a stored verdict for its inputs'"}],
        }
    return {"name": name, "on": {"workflow_dispatch": {}}, "permissions": {}, "jobs": jobs}


__all__ = ["CELLS_WORKFLOW", "MATRIX_LIMIT", "entry", "workflow"]
