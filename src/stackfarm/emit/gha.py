"""GitHub Actions: the plan as a workflow whose matrix is made when it runs, the way PyTorch's CI fans out.

    stackfarm plan --json --matrix M --store S > plan.json
    stackfarm emit gha --plan plan.json [--chunk N] > .github/workflows/stackfarm-cells.yml
    git add plan.json .github/workflows/stackfarm-cells.yml      # the plan is the contract: both are committed

Jobs:

- ``plan``: `stackfarm gha matrix --chunks K` turns the committed plan into one job matrix per chunk of at most
  256 cells (the jobs one matrix may start), longest first, on ``$GITHUB_OUTPUT``; a plan committed later with
  more cells than the K chunk jobs take is refused, saying to emit again; the plan goes up as the artifact
  ``plan``, which every job reads;
- ``cells-1`` .. ``cells-K``: one job per cell of the chunk (``fromJSON`` of the plan job's output), on the runner
  labels of its kind; each worker runs its cell of plan.json with the plan's matrix, basis and store, signs what it
  pushes with the runner key, logs in to the image registry, and uploads its reports;
- ``conflicts``: cells no job runs (they contradict SGLang's own pins), as error annotations;
- ``merge``: after every job (``if: always()``), `stackfarm report --gate --plan plan.json` (``--from STORE`` when
  there is one): a planned cell without a verdict keeps the gate shut.

Every credential is a secret, never part of the document: ``STACKFARM_RUNNER_KEY`` (the runner's signing key),
``STACKFARM_STORE_TOKEN`` (the store's bearer token), ``STACKFARM_NETRC`` (netrc lines for private indexes),
``STACKFARM_REGISTRY`` (host:port/prefix; unset: the matrix's ``[docker] registry``) with ``STACKFARM_REGISTRY_USER``
/ ``STACKFARM_REGISTRY_PASSWORD`` for `docker login`.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from .. import storekeys
from . import (
    CellDoc,
    check_chunk,
    conflict_lines,
    merge_command,
    pending,
    shell_line,
    worker_argv,
)

#: Jobs one matrix may start (docs.github.com: Actions limits).
MATRIX_LIMIT = 256

# The actions the jobs use, pinned as the repository's own workflows pin them.
CHECKOUT = "actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683"
SETUP_PYTHON = "actions/setup-python@a26af69be951a213d495a4c3e4e4022e16d87065"
DOWNLOAD = "actions/download-artifact@d3f86a106a0bac45b974a628896c90dbdf5c8093"
UPLOAD = "actions/upload-artifact@ea165f8d65b6e75b540449e92b4886f43607fa02"

_READ = {"contents": "read"}
#: The secret (and environment variable) holding the runner's signing key.
RUNNER_KEY = storekeys.RUNNER_KEY_ENV
#: The plan every job reads: made by the plan job, passed on as an artifact.
PLAN = "plan.json"
#: Step names the local executor of tests/test_emit_run.py leaves to the engine (provisioning, no verdict).
INSTALL = "install stackfarm"
_SECRETS = {
    RUNNER_KEY: RUNNER_KEY,
    "STACKFARM_STORE_TOKEN": "STACKFARM_STORE_TOKEN",
    "REGISTRY_USER": "STACKFARM_REGISTRY_USER",
    "REGISTRY_PASSWORD": "STACKFARM_REGISTRY_PASSWORD",
    "NETRC_LINES": "STACKFARM_NETRC",
}


def entry(cell: CellDoc) -> dict[str, Any]:
    """A cell as a chunk job's matrix takes it (an entry of stackfarm.gha.dispatch's matrix)."""
    return {
        "cell": cell["id"],
        "runner": cell["runner"],
        "labels": list(cell.get("labels") or ()),
        "arch": cell.get("arch") or "",
        "gpus": cell.get("gpus") or 0,
    }


def _secret_env(*names: str) -> dict[str, str]:
    return {name: f"${{{{ secrets.{_SECRETS[name]} }}}}" for name in names}


#: netrc lines from a secret, for the indexes and the store (stackfarm.indexauth, stackfarm.httpclient).
_NETRC = (
    'if [ -n "${NETRC_LINES}" ]; then\n'
    '  printf \'%s\\n\' "${NETRC_LINES}" > "${RUNNER_TEMP}/netrc"\n'
    '  chmod 600 "${RUNNER_TEMP}/netrc"\n'
    '  echo "NETRC=${RUNNER_TEMP}/netrc" >> "${GITHUB_ENV}"\n'
    "fi"
)
_LOGIN = (
    'if [ -n "${STACKFARM_REGISTRY}" ]; then\n'
    '  printf \'%s\' "${REGISTRY_PASSWORD}" | docker login "${STACKFARM_REGISTRY%%/*}" '
    '-u "${REGISTRY_USER}" --password-stdin\n'
    "fi"
)


def _setup(venv: bool) -> list[dict[str, Any]]:
    """Checkout and stackfarm: a venv per job on a self-hosted runner (it keeps its disk between jobs)."""
    steps: list[dict[str, Any]] = [{"uses": CHECKOUT, "with": {"persist-credentials": False}}]
    if venv:
        run = (
            'python3 -m venv "${RUNNER_TEMP}/venv"\n'
            '"${RUNNER_TEMP}/venv/bin/python" -m pip install --disable-pip-version-check -e .\n'
            'echo "${RUNNER_TEMP}/venv/bin" >> "${GITHUB_PATH}"'
        )
    else:
        steps.append({"uses": SETUP_PYTHON, "with": {"python-version": "3.11"}})
        run = "python -m pip install --disable-pip-version-check -e ."
    return [*steps, {"name": INSTALL, "run": run}, {"name": "index and store credentials", "run": _NETRC}]


def _plan_job(plan: str, parts: int, size: int) -> dict[str, Any]:
    script = (
        (f"cp {shlex.quote(plan)} {PLAN}\n" if plan != PLAN else "")
        + f"python -m stackfarm gha matrix --plan {PLAN} --chunks {parts} --chunk {size} "
        '--github-output "${GITHUB_OUTPUT}"'
    )
    outputs = {"count": "${{ steps.plan.outputs.count }}"}
    for n in range(1, parts + 1):
        outputs[f"count_{n}"] = f"${{{{ steps.plan.outputs.count_{n} }}}}"
        outputs[f"matrix_{n}"] = f"${{{{ steps.plan.outputs.matrix_{n} }}}}"
    return {
        "name": "plan",
        "runs-on": "ubuntu-latest",
        "permissions": dict(_READ),
        "timeout-minutes": 30,
        "outputs": outputs,
        "steps": [
            *_setup(venv=False)[:3],
            {"name": "the run-time matrix", "id": "plan", "run": script},
            {"uses": UPLOAD, "with": {"name": "plan", "path": PLAN, "retention-days": 30}},
        ],
    }


def _cells_job(doc: Mapping[str, Any], n: int, first: int, last: int, total: int) -> dict[str, Any]:
    worker = shell_line(worker_argv(doc, PLAN, cell="$CELL"), variables=["CELL"])
    return {
        "name": f"cells {first}-{last} of {total}: ${{{{ matrix.cell }}}}",
        "needs": "plan",
        "if": f"needs.plan.outputs.count_{n} != '0'",
        "runs-on": "${{ matrix.labels }}",
        "permissions": dict(_READ),
        "timeout-minutes": 360,
        "strategy": {"fail-fast": False, "matrix": f"${{{{ fromJSON(needs.plan.outputs.matrix_{n}) }}}}"},
        "env": {
            "CELL": "${{ matrix.cell }}",
            # The runner kind picks the throughput thresholds ([thresholds.<kind>] of matrix.toml).
            "STACKFARM_RUNNER_KIND": "${{ matrix.runner }}",
            # Cell images are pushed to and pulled from this registry ([docker] registry when unset).
            "STACKFARM_REGISTRY": "${{ secrets.STACKFARM_REGISTRY }}",
            **_secret_env(
                RUNNER_KEY, "STACKFARM_STORE_TOKEN", "REGISTRY_USER", "REGISTRY_PASSWORD", "NETRC_LINES"
            ),
        },
        "steps": [
            *_setup(venv=True),
            {"uses": DOWNLOAD, "with": {"name": "plan"}},
            {"name": "log in to the image registry", "run": _LOGIN},
            {"name": "run the cell", "run": worker},
            {
                "name": "upload the cell's reports",
                "if": "always()",
                "uses": UPLOAD,
                "with": {
                    "name": "reports-${{ matrix.cell }}",
                    # Only reports/<cell>/: the merged files are rebuilt from every cell by the merge job.
                    "path": "reports/\n!reports/junit.xml\n!reports/summary.*\n!reports/index.html",
                    "if-no-files-found": "warn",
                    "retention-days": 30,
                },
            },
        ],
    }


def _merge_job(doc: Mapping[str, Any], needs: Sequence[str]) -> dict[str, Any]:
    return {
        "name": "merge and gate",
        "needs": list(needs),
        "if": "always()",
        "runs-on": "ubuntu-latest",
        "permissions": dict(_READ),
        "timeout-minutes": 30,
        "env": _secret_env("STACKFARM_STORE_TOKEN", "NETRC_LINES"),
        "steps": [
            *_setup(venv=False),
            {"uses": DOWNLOAD, "with": {"name": "plan"}},
            {"uses": DOWNLOAD, "with": {"pattern": "reports-*", "path": "reports", "merge-multiple": True}},
            {"name": "merge the verdicts", "run": merge_command(doc, PLAN)},
            {
                "name": "upload the merged report",
                "if": "always()",
                "uses": UPLOAD,
                "with": {"name": "stackfarm-report", "path": "reports/", "retention-days": 90},
            },
        ],
    }


def workflow(
    doc: Mapping[str, Any], *, chunk: int | None = None, name: str = "stackfarm cells", plan: str = PLAN
) -> dict[str, Any]:
    """The workflow: `plan`, `cells-<n>` for each chunk of the plan's pending cells, `conflicts`, `merge`.

    `plan`: where the repository holds the plan document (committed beside the workflow)."""
    size = check_chunk(chunk, MATRIX_LIMIT, "a GitHub Actions matrix")
    cells = pending(doc)
    parts = max(1, math.ceil(len(cells) / size))
    jobs: dict[str, Any] = {"plan": _plan_job(plan, parts, size)}
    for n in range(1, parts + 1):
        first, last = (n - 1) * size + 1, min(n * size, len(cells))
        jobs[f"cells-{n}"] = _cells_job(doc, n, first, max(first, last), len(cells))
    conflicts = conflict_lines(doc)
    if conflicts:  # cells no job runs: the merge counts them as conflicts, this job says which
        jobs["conflicts"] = {
            "name": f"{len(conflicts)} conflict cell(s)",
            "runs-on": "ubuntu-latest",
            "permissions": dict(_READ),
            "env": {"CONFLICTS": "\n".join(conflicts)},
            "steps": [{"run": "printf '%s\\n' \"${CONFLICTS}\" | sed 's/^/::error::/'\nexit 1"}],
        }
    jobs["merge"] = _merge_job(doc, [k for k in jobs if k != "conflicts"])
    return {
        "name": name,
        "on": {"workflow_dispatch": {}},
        "permissions": {},
        # One run of a plan at a time: a second waits (never cancels one whose workers are pushing verdicts).
        "concurrency": {"group": f"{name} ${{{{ github.ref }}}}", "cancel-in-progress": False},
        "jobs": jobs,
    }


__all__ = ["INSTALL", "MATRIX_LIMIT", "PLAN", "entry", "workflow"]
