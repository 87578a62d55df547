"""Buildkite: the plan's pending cells as pipelines for `buildkite-agent pipeline upload`, the way vLLM's CI
builds one image and runs every test step in it.

    stackfarm plan --json --matrix M --store S > plan.json && buildkite-agent artifact upload plan.json
    stackfarm emit buildkite --plan plan.json --image REGISTRY/stackfarm-worker:TAG | buildkite-agent pipeline upload

Steps: ``worker-image`` builds docker/worker.Dockerfile (stackfarm and the project) and pushes it to the registry,
tagged by the commit it is built from; a group per runner kind holds one step per cell (``agents: {queue: <kind>}``):
the plan's cell, with the plan's matrix, hash basis and store, its reports as ``artifact_paths``. A cell step runs
in the worker image through the docker plugin, except for a docker hash basis: then it runs on the agent (stackfarm
installed from the checkout into a venv), whose engine runs each suite in the cell's own image. Build once, test
many: for a docker basis each cell's image has a build step of its own (key ``image-<input hash[:12]>``, on the
cell's queue), `stackfarm run --realise-only`, which builds the image (or finds it) and pushes it to the registry
the agents' ``STACKFARM_REGISTRY`` names, and the cell's test step ``depends_on`` it (no test step runs after a
failed build: the merge counts that cell as without a verdict) and pulls that image instead of building it. Another
basis has no cell image to share (the local backend unpacks wheels on each agent), so it gets no build step. The
merge runs in the worker image. A step whose agent was lost (exit -1), stopped (255, or the
agent_stop signal reason) is retried; a verdict (exit 1 failed, 3 incomplete) never is. Then a ``wait`` that lets
failed cells through and the merge (`stackfarm report --gate --plan plan.json`, ``--from STORE`` with a store),
which keeps the gate shut for every planned cell without a verdict, conflicts included.

Secrets never enter the document: the agent's environment (its environment hook, or Buildkite secrets) sets
``STACKFARM_RUNNER_KEY`` (the runner's signing key, the PEM text), ``STACKFARM_STORE_TOKEN``,
``STACKFARM_REGISTRY`` and the registry login (`docker login` on the agent), and the docker plugin passes those
variables into the container by name.

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
    shell_line,
    worker_argv,
)

#: Steps one `buildkite-agent pipeline upload` takes.
UPLOAD_LIMIT = 500
#: Minutes one cell's step may run.
TIMEOUT_MINUTES = 360
#: The docker plugin, pinned to a release.
DOCKER_PLUGIN = "docker#v5.13.0"
#: The worker image unless told: built by the `worker-image` step from this commit, in the registry the agents'
#: STACKFARM_REGISTRY names (Buildkite interpolates both when the pipeline is uploaded).
DEFAULT_IMAGE = "${STACKFARM_REGISTRY}/stackfarm-worker:${BUILDKITE_COMMIT}"
#: The key of the step that builds and pushes the worker image.
IMAGE_KEY = "worker-image"
#: Variables of the agent's environment the container gets by name (secrets: never in the document).
AGENT_ENV = ("STACKFARM_RUNNER_KEY", "STACKFARM_STORE_TOKEN", "STACKFARM_REGISTRY", "STACKFARM_RUNNER_KIND")
#: Exit statuses of the infrastructure, retried: the agent lost (-1), the agent terminated (255).
AGENT_LOST = (-1, 255)
#: The plan every step reads (an artifact of the step that uploaded the pipeline).
PLAN = "plan.json"
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


def retry() -> dict[str, Any]:
    """Automatic retries for a lost or stopped agent only: a verdict's exit status is never retried."""
    automatic: list[dict[str, Any]] = [{"exit_status": code, "limit": 2} for code in AGENT_LOST]
    automatic.append({"signal_reason": "agent_stop", "limit": 2})
    return {"automatic": automatic, "manual": {"permit_on_passed": False}}


def docker_plugin(image: str, *, gpus: int) -> dict[str, Any]:
    """The docker plugin's settings: the worker image, the agent's secrets by name, the GPUs."""
    settings: dict[str, Any] = {
        "image": image,
        "always-pull": True,
        "environment": list(AGENT_ENV),
        "mount-buildkite-agent": True,  # `buildkite-agent artifact download plan.json` inside the container
    }
    if gpus:
        settings["gpus"] = "all"
    return {DOCKER_PLUGIN: settings}


#: Where a docker-basis step installs stackfarm from the checkout (the agent's own Python, a venv per job).
VENV = ".stackfarm-venv"


def _download(what: str) -> str:
    return f"buildkite-agent artifact download {shlex.quote(what)} ."


def docker_basis(doc: Mapping[str, Any]) -> bool:
    """Whether the plan hashes for the docker backend (its default): each cell then has an image of its own."""
    return bool((doc.get("hash_basis") or {}).get("backend", "docker") == "docker")


def _on_agent(argv: Sequence[str], plan: str) -> str:
    """A stackfarm command line run on the agent itself: stackfarm installed from the checkout into a venv."""
    install = f"python3 -m venv {VENV} && {VENV}/bin/python -m pip install -q -e ."
    return f"{_download(plan)} && {install} && {shell_line([f'{VENV}/bin/python', *argv[1:]])}"


def build_key(cell: CellDoc, taken: set[str]) -> str:
    """The build step's key: ``image-`` and the first 12 hex digits of the cell's input hash (its id for a
    cell the plan could not hash), unique in the pipeline."""
    digest = str(cell.get("input_hash") or "")[:12] or _KEY_CHARS.sub("_", str(cell["id"]))[:80]
    key, n = f"image-{digest}", 1
    while key in taken:
        n += 1
        key = f"image-{digest}-{n}"
    taken.add(key)
    return key


def build_step(doc: Mapping[str, Any], cell: CellDoc, key: str, plan: str = PLAN) -> dict[str, Any]:
    """A docker-basis cell's build step: `run --realise-only` on the cell's queue builds its image (or finds
    it in the registry) and pushes it to the agents' STACKFARM_REGISTRY; no suite runs, no verdict is kept."""
    cell_id = str(cell["id"])
    argv = worker_argv(doc, plan, cell=cell_id)
    argv.insert(argv.index("run") + 1, "--realise-only")
    return {
        "label": f":docker: image {cell_id}",
        "key": key,
        "command": _on_agent(argv, plan),
        "agents": {"queue": cell["runner"]},
        "env": {"STACKFARM_RUNNER_KIND": cell["runner"]},
        "artifact_paths": [f"reports/{cell_id}/docker-build.log"],
        "timeout_in_minutes": TIMEOUT_MINUTES,
        "retry": retry(),
    }


def cell_step(
    doc: Mapping[str, Any], cell: CellDoc, key: str, image: str, plan: str = PLAN, *, built: str | None = None
) -> dict[str, Any]:
    """One cell's step. In the worker image (docker plugin), unless the plan hashes for the docker backend:
    then on the agent itself, whose engine runs every suite in the cell's own image (pulled from
    STACKFARM_REGISTRY, where the build step `built` pushed it) and whose paths the suites' bind mounts name
    (from inside a container they would name the container's)."""
    cell_id = str(cell["id"])
    argv = worker_argv(doc, plan, cell=cell_id)
    step: dict[str, Any] = {"label": f":test_tube: {cell_id}", "key": key}
    if docker_basis(doc):
        step["command"] = _on_agent(argv, plan)
        if built is not None:  # the cell's image, built and pushed by its build step: pulled, never rebuilt
            step["depends_on"] = [built]
            step["allow_dependency_failure"] = False
    else:
        step["depends_on"] = IMAGE_KEY
        step["command"] = f"{_download(plan)} && {shell_line(argv)}"
        step["plugins"] = [docker_plugin(image, gpus=int(cell.get("gpus") or 0))]
    return {
        **step,
        "agents": {"queue": cell["runner"]},
        "env": {"STACKFARM_RUNNER_KIND": cell["runner"]},
        "artifact_paths": [f"reports/{cell_id}/**/*"],
        "timeout_in_minutes": TIMEOUT_MINUTES,
        "retry": retry(),
    }


def image_step(image: str) -> dict[str, Any]:
    """Build the worker image once, push it; every cell step runs in it."""
    ref = shlex.quote(image)
    return {
        "label": ":docker: worker image",
        "key": IMAGE_KEY,
        "command": f"docker build -f docker/worker.Dockerfile -t {ref} . && docker push {ref}",
        "timeout_in_minutes": 60,
        "retry": retry(),
    }


def _groups(
    doc: Mapping[str, Any],
    part: Sequence[CellDoc],
    where: tuple[int, int],
    taken: set[str],
    *,
    image: str,
    plan: str,
) -> list[dict[str, Any]]:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for cell in part:
        steps = by_kind.setdefault(str(cell["runner"]), [])
        built = None
        if docker_basis(doc):  # build once (and push), then test in that image
            steps.append(build_step(doc, cell, built := build_key(cell, taken), plan))
        steps.append(cell_step(doc, cell, step_key(str(cell["id"]), taken), image, plan, built=built))
    number, parts = where
    suffix = f" (part {number} of {parts})" if parts > 1 else ""
    return [{"group": f"{kind}{suffix}", "steps": steps} for kind, steps in by_kind.items()]


def _merge_steps(doc: Mapping[str, Any], image: str, plan: str, *, ran: bool) -> list[Any]:
    """The wait and the merge, which reads the plan (and the store, when there is one): it is there even when
    no cell had to run. Conflict cells (no step runs them) get a step of their own that fails."""
    merge = f"{_download(plan)} && {merge_command(doc, plan)}"
    if ran:
        merge = f"{_download('reports/**/*')} && {merge}"
    steps: list[Any] = [{"wait": None, "continue_on_failure": True}] if ran else []
    steps.append(
        {
            "label": ":bar_chart: merge and gate",
            "key": "merge",
            "command": merge,
            "plugins": [docker_plugin(image, gpus=0)],
            "artifact_paths": ["reports/**/*"],
            "retry": retry(),
        }
    )
    conflicts = conflict_lines(doc)
    if conflicts:
        text = shlex.quote("\n".join(conflicts))
        steps.append(
            {
                "label": f":x: {len(conflicts)} conflict cell(s)",
                "key": "conflicts",
                "command": f"printf '%s\\n' {text} >&2 && exit 1",
            }
        )
    return steps


def _upload_rest(parts: int, plan: str, image: str, size: int) -> dict[str, Any]:
    """Uploads parts 2..N, each made from the plan artifact with this part's own chunk size (another size would
    cut other parts)."""
    emit = shlex.join(
        [
            "python",
            "-m",
            "stackfarm",
            "emit",
            "buildkite",
            "--plan",
            plan,
            "--image",
            image,
            "--chunk",
            str(size),
        ]
    )
    uploads = " && ".join(
        f"{emit} --part {k} | buildkite-agent pipeline upload"
        for k in range(parts, 1, -1)  # each lands right after this step: the last uploaded comes first
    )
    return {
        "label": f":pipeline: upload parts 2-{parts}",
        "key": "upload-parts",
        "depends_on": IMAGE_KEY,
        "command": f"{_download(plan)} && {uploads}",
        "plugins": [docker_plugin(image, gpus=0)],
    }


def pipelines(
    doc: Mapping[str, Any], *, chunk: int | None = None, plan: str = PLAN, image: str = DEFAULT_IMAGE
) -> list[dict[str, Any]]:
    """Every part: part 1 (the upload step when there are more, the worker image, its cells, wait, merge),
    then parts 2..N. `plan`: the artifact the parts are made from.

    `chunk`: cells per part (at most 500, less the group, image, wait, merge and upload steps a part carries;
    half that for a docker basis, whose cells have a build step each)."""
    size = check_chunk(chunk, UPLOAD_LIMIT, "a Buildkite upload")
    cells = pending(doc)
    kinds = len({c["runner"] for c in cells}) or 1
    overhead = kinds + 5  # a group per kind, the upload, image, wait, merge and conflicts steps
    room = UPLOAD_LIMIT - overhead
    if room < 1:
        raise EmitError(f"{kinds} runner kinds leave no room for a cell in a Buildkite upload")
    size = min(
        size, room // (2 if docker_basis(doc) else 1)
    )  # a docker cell: its build step and its test step
    if not cells:  # the merge still reads the plan: stored verdicts (with a store) and conflicts are gated
        return [{"steps": [image_step(image), *_merge_steps(doc, image, plan, ran=False)]}]
    parts = list(chunks(cells, size))
    taken: set[str] = {"merge", "upload-parts", "conflicts", IMAGE_KEY}
    docs: list[dict[str, Any]] = []
    for number, part in enumerate(parts, 1):
        steps: list[Any] = []
        if number == 1 and len(parts) > 1:
            steps.append(_upload_rest(len(parts), plan, image, size))
        if number == 1:
            steps.append(image_step(image))
        steps += _groups(doc, part, (number, len(parts)), taken, image=image, plan=plan)
        if number == 1:
            steps += _merge_steps(doc, image, plan, ran=True)
        docs.append({"steps": steps})
    return docs


__all__ = [
    "DEFAULT_IMAGE",
    "IMAGE_KEY",
    "UPLOAD_LIMIT",
    "build_key",
    "build_step",
    "cell_step",
    "docker_basis",
    "pipelines",
    "retry",
    "step_key",
]
