"""Each emitted document run, not only validated: its command lines, in the order its engine runs them, in a
local shell (bash), against the real verdict store (``$STACKFARM_TEST_STORE``, .ci/servers.sh), on fake-stack
cells (tests/fakestack.py), so that a dropped ``--matrix``, a wrong hash basis or a merge that ignores the plan
fails here, not a user.

What stands in for each engine (one working folder stands for every runner, agent or pod):

- GitHub Actions: every ``run:`` step of every job in ``needs`` order, with ``${{ }}`` expanded from the job's
  context (``matrix`` from the plan job's ``$GITHUB_OUTPUT``, ``secrets``, ``vars``); a matrix job once per
  entry of its run-time matrix; ``uses:`` steps (checkout, artifacts) and the install step are the engine's;
- Buildkite: every command step in order (groups opened, ``wait`` passed), with a stand-in ``buildkite-agent``
  whose ``pipeline upload`` inserts the uploaded steps after the uploading one, as Buildkite does; the agent's
  secrets reach a step only through the docker plugin's ``environment`` names; ``depends_on`` honoured (a step
  after a failed one is not run); the worker-image build step is built for real by
  test_the_worker_image_builds (docker marker). These plans are hashed for the local backend, which has no
  cell image to share, so they have no per-cell build step (`run --realise-only`, emitted for docker plans
  only): that step runs for real in tests/test_docker_registry.py (build and push, then a test step's pull);
- Kubernetes: each Job's pods in order (an Indexed Job's pod per index, ``$(JOB_COMPLETION_INDEX)`` and the
  other ``$(VAR)`` references expanded from the container's env), its volumes as local folders (ConfigMaps
  written out, claims and emptyDirs as folders, Secrets from the test's), mount paths mapped onto them; the
  merge Job's kubectl wait is the cluster's and is checked to name every worker Job.

A runner's key reaches a worker only the way the document passes it (a secret), never from this process's
environment, and the merge holds none: it trusts the key the matrix names (``[store] trusted_keys``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fakestack import CONFLICT, NEW, OLD, FakeProject, cell_id
from stackfarm import storekeys
from stackfarm.emit import buildkite, gha, k8s, yamltext

pytest_plugins = ("fakestack",)
yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parent.parent
SERVER = os.environ.get("STACKFARM_TEST_STORE", "")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not SERVER,
        reason="STACKFARM_TEST_STORE is not set: start the verdict store with .ci/servers.sh (as root)",
    ),
]
#: The matrix file is not ./matrix.toml: a worker that drops --matrix finds none and fails.
MATRIX = "farm.toml"

# --------------------------------------------------------------------------- the farm


@dataclass
class Farm:
    """A fake project planned against a fresh folder of the real store; the shells' environment."""

    project: FakeProject
    store: str
    env: dict[str, str]
    secrets: dict[str, str]
    log: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.project.root

    def shell(self, script: str, env: Mapping[str, str] | None = None, *, what: str = "") -> int:
        """`script` in bash (-e, -o pipefail, as GitHub runs `run:` steps) in the project folder."""
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
            cwd=self.root, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        self.log.append(f"$ {what or script}\n{done.stdout}{done.stderr}-> exit {done.returncode}")
        return done.returncode

    def argv(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, *, what: str = "") -> int:
        done = subprocess.run(list(argv), cwd=cwd, env={**self.env, **dict(env)}, capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip
        self.log.append(f"$ {what or ' '.join(argv)}\n{done.stdout}{done.stderr}-> exit {done.returncode}")
        return done.returncode

    def plan(self, *extra: str, store: bool = True) -> dict[str, Any]:
        """`stackfarm plan --json` as the user runs it before emitting (relative --matrix, local hashes)."""
        where = ["--store", self.store] if store else []
        argv = ["plan", "--json", "--matrix", MATRIX, *where, "--backend", "local", "--no-gpu", *extra]
        done = subprocess.run([sys.executable, "-m", "stackfarm", *argv], cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        (self.root / "plan.json").write_text(done.stdout)
        doc: dict[str, Any] = json.loads(done.stdout)
        return doc

    def said(self) -> str:
        return "\n".join(self.log)

    def merge_said(self) -> str:
        """What the last merge (`stackfarm report`) printed."""
        return next(entry for entry in reversed(self.log) if "stackfarm report" in entry.split("\n", 1)[0])


@pytest.fixture
def farm(fake_project: FakeProject, runner_keys: tuple[Path, Path], tmp_path: Path) -> Farm:
    private, public = runner_keys
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, NEW, CONFLICT], extra='\n[store]\ntrusted_keys = ["keys"]\n')
    fake_project.matrix.rename(fake_project.root / MATRIX)
    (fake_project.root / "keys").mkdir()
    shutil.copy(public, fake_project.root / "keys" / "runner.pub.pem")
    bin_dir = tmp_path / "engine-bin"
    bin_dir.mkdir()
    agent = bin_dir / "buildkite-agent"  # a stand-in: artifacts are already in the one working folder
    agent.write_text(
        "#!/bin/sh\n"
        'case "$1 $2" in\n'
        '  "pipeline upload") n=$(ls "$BK_UPLOADS" | wc -l); cat > "$BK_UPLOADS/$n.yml" ;;\n'
        '  "artifact download"|"artifact upload"|"annotate "*) ;;\n'
        '  *) echo "buildkite-agent stand-in: $*?" >&2; exit 2 ;;\n'
        "esac\n"
    )
    agent.chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (storekeys.RUNNER_KEY_ENV, storekeys.TRUSTED_RUNNER_KEYS_ENV)
    }
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    env |= {"PATH": path, "PYTHONPATH": str(REPO / "src"), "BK_UPLOADS": str(tmp_path / "uploads")}
    (tmp_path / "uploads").mkdir()
    store = f"{SERVER.rstrip('/')}/emit-{uuid.uuid4().hex[:12]}"
    # The runner key as CI secrets hold it: the PEM text.
    return Farm(project=fake_project, store=store, env=env, secrets={"key": private.read_text()})


# --------------------------------------------------------------------------- GitHub Actions

_EXPR = re.compile(r"\$\{\{\s*(.+?)\s*\}\}")


def _lookup(path: str, ctx: Mapping[str, Any]) -> Any:
    head, *rest = path.split(".")
    value: Any = ctx[head]
    for part in rest:
        value = value.get(part, "") if head in ("secrets", "vars") else value[part]
    return value


def _expand(text: str, ctx: Mapping[str, Any]) -> Any:
    """`${{ x.y }}` and `${{ fromJSON(x.y) }}` (the only expressions the emitter writes), as GitHub expands them."""
    whole = _EXPR.fullmatch(text)
    if whole and whole[1].startswith("fromJSON("):
        return json.loads(_lookup(whole[1][len("fromJSON(") : -1], ctx))

    def one(m: re.Match[str]) -> str:
        value = _lookup(m[1], ctx)
        return value if isinstance(value, str) else json.dumps(value)

    return _EXPR.sub(one, text)


def _condition(text: str | None, ctx: Mapping[str, Any], failed: bool) -> bool:
    if text is None:
        return not failed
    if text == "always()":
        return True
    m = re.fullmatch(r"(\S+) != '(.*)'", text)
    assert m, f"a condition this stand-in cannot read: {text}"
    return not failed and str(_lookup(m[1], ctx)) != m[2]


def run_gha(farm: Farm, workflow: Mapping[str, Any], *, drop: Callable[[str], bool] = lambda c: False) -> int:
    """Every job in order; returns the merge job's exit status (a matrix job once per entry, minus `drop`)."""
    results: dict[str, dict[str, Any]] = {}
    secrets = {"STACKFARM_RUNNER_KEY": farm.secrets["key"]}
    merged = None
    for name, job in workflow["jobs"].items():
        needs = [job["needs"]] if isinstance(job.get("needs"), str) else job.get("needs", [])
        assert all(n in results for n in needs), f"{name} needs a job that has not run"
        ctx: dict[str, Any] = {"needs": {n: results[n] for n in needs}, "secrets": secrets, "vars": {}}
        if not _condition(job.get("if"), ctx, any(results[n]["failed"] for n in needs)):
            results[name] = {"outputs": {}, "failed": False}
            continue
        matrix = _expand(job["strategy"]["matrix"], ctx) if "strategy" in job else {"include": [{}]}
        entries = [e for e in matrix["include"] if "cell" not in e or not drop(e["cell"])]
        codes: list[int] = []
        outputs: dict[str, str] = {}
        for entry in entries:
            code, outputs = _gha_job(farm, job, {**ctx, "matrix": entry})
            codes.append(code)
        results[name] = {"outputs": outputs, "failed": any(codes)}
        if name == "merge":
            merged = codes[0]
    assert merged is not None, "the workflow has no merge job"
    return merged


def _gha_job(farm: Farm, job: Mapping[str, Any], ctx: dict[str, Any]) -> tuple[int, dict[str, str]]:
    files = {
        k: farm.root.parent / f"gha-{k.lower()}-{uuid.uuid4().hex[:6]}"
        for k in ("GITHUB_OUTPUT", "GITHUB_ENV")
    }
    for f in files.values():
        f.write_text("")
    base = {"RUNNER_TEMP": str(farm.root.parent), "GITHUB_PATH": str(farm.root.parent / "gha-path"),
            **{k: str(v) for k, v in files.items()}}  # fmt: skip
    env = {**base, **{k: _expand(str(v), ctx) for k, v in job.get("env", {}).items()}}
    steps: dict[str, Any] = {}
    failed = 0
    for step in job["steps"]:
        if "uses" in step or step.get("name") == gha.INSTALL:
            continue  # the engine's: checkout, artifacts (one folder here), the install (this venv)
        if failed:
            continue
        step_ctx = {**ctx, "steps": steps}
        out = files["GITHUB_OUTPUT"]
        out.write_text("")
        code = farm.shell(_expand(step["run"], step_ctx), env, what=f"[{job.get('name')}] {step['run']}")
        if "id" in step:
            steps[step["id"]] = {"outputs": dict(line.split("=", 1) for line in out.read_text().splitlines())}
        failed = code
    outputs = {k: _expand(v, {**ctx, "steps": steps}) for k, v in job.get("outputs", {}).items()}
    return failed, outputs


# --------------------------------------------------------------------------- Buildkite


def run_buildkite(
    farm: Farm, pipeline: Mapping[str, Any], *, drop: Callable[[str], bool] = lambda c: False
) -> int:
    """Every command step in order (uploaded parts inserted after their uploader); the merge's exit status. A
    step's ``depends_on`` must name steps that ran before it; after a failed one it is not run, as Buildkite
    does unless ``allow_dependency_failure``."""
    queue: list[Any] = list(pipeline["steps"])
    uploads = Path(farm.env["BK_UPLOADS"])
    agent = {"STACKFARM_RUNNER_KEY": farm.secrets["key"]}  # the agent's environment hook
    merged = None
    outcomes: dict[str, int] = {buildkite.IMAGE_KEY: 0}  # the image is built by test_the_worker_image_builds
    while queue:
        step = queue.pop(0)
        if "group" in step:
            queue[:0] = step["steps"]
            continue
        if "wait" in step or step.get("key") == buildkite.IMAGE_KEY:
            continue
        if step.get("label", "").startswith(":test_tube:") and drop(step["label"].split(" ", 1)[1]):
            outcomes[step["key"]] = -1  # its agent never ran it
            continue
        needs = step.get("depends_on", [])
        needs = [needs] if isinstance(needs, str) else [n if isinstance(n, str) else n["step"] for n in needs]
        assert all(n in outcomes for n in needs), f"{step.get('key')} depends on a step that has not run"
        if any(outcomes[n] for n in needs) and not step.get("allow_dependency_failure", False):
            outcomes[step["key"]] = -1
            continue
        (plugin,) = step.get("plugins", [{}]) or [{}]
        options: dict[str, Any] = next(iter(plugin.values()), {})
        names = options.get("environment", [])
        env = {**dict(step.get("env", {})), **{n: agent[n] for n in names if n in agent}}
        before = set(uploads.iterdir())
        code = farm.shell(step["command"], env, what=f"[{step.get('key')}] {step['command']}")
        for path in sorted(set(uploads.iterdir()) - before, key=lambda p: int(p.stem), reverse=True):
            uploaded = yaml.safe_load(path.read_text())
            assert uploaded, f"an empty upload:\n{farm.said()}"
            queue[:0] = uploaded["steps"]  # right after the step that uploaded it
        outcomes[step.get("key") or f"step-{len(outcomes)}"] = code
        if step.get("key") == "merge":
            merged = code
    assert merged is not None, "the pipeline has no merge step"
    return merged


# --------------------------------------------------------------------------- Kubernetes


def _mounts(
    farm: Farm, pod: Mapping[str, Any], container: Mapping[str, Any], scratch: Path
) -> dict[str, Path]:
    """Each mount path of the container -> the local folder standing for its volume."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    k8s_dir = farm.root.parent / "k8s"
    out = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            local = k8s_dir / "configmaps" / volume["configMap"]["name"]
        elif "persistentVolumeClaim" in volume:
            local = k8s_dir / "claims" / volume["persistentVolumeClaim"]["claimName"]
        elif "secret" in volume:
            local = k8s_dir / "secrets" / volume["secret"]["secretName"]  # optional and absent: empty
        else:
            local = scratch / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        out[mount["mountPath"]] = local
    out[container["workingDir"]] = farm.root
    return out


def _mapped(text: str, mounts: Mapping[str, Path]) -> str:
    for mount in sorted(mounts, key=len, reverse=True):
        text = re.sub(rf"(?<![\w/.-]){re.escape(mount)}(?=/|\s|$)", str(mounts[mount]), text)
    return text


def _pod(farm: Farm, job: Mapping[str, Any], index: int | None) -> int:
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    scratch = farm.root.parent / "k8s" / "pods" / f"{job['metadata']['name']}-{index}"
    mounts = _mounts(farm, pod, container, scratch)
    secrets = {k8s.RUNNER_KEY_SECRET: farm.secrets["key"]}
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = _mapped(var["value"], mounts)
        elif "fieldRef" in var["valueFrom"]:
            assert "job-completion-index" in var["valueFrom"]["fieldRef"]["fieldPath"]
            env[var["name"]] = str(index)
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            value = secrets.get((ref["name"], ref["key"]))
            assert value is not None or ref.get("optional"), f"the Secret {ref['name']} must exist"
            if value is not None:
                env[var["name"]] = value
    argv = [*container["command"], *container.get("args", [])]
    argv = [_mapped(re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], a), mounts) for a in argv]
    where = f"[{job['metadata']['name']}/{index}]"
    return farm.argv(argv, env, mounts[container["workingDir"]], what=f"{where} {shlex.join(argv)}")


def run_k8s(
    farm: Farm, resources: Sequence[Mapping[str, Any]], *, drop: Callable[[str], bool] = lambda c: False
) -> int:
    """ConfigMaps written, each worker Job's pods by index, then the merge Job; its exit status."""
    maps = farm.root.parent / "k8s" / "configmaps"
    workers: list[str] = []
    merged = None
    for resource in resources:
        name = resource["metadata"]["name"]
        if resource["kind"] == "ConfigMap":
            (maps / name).mkdir(parents=True, exist_ok=True)
            for key, text in resource["data"].items():
                (maps / name / key).write_text(text)
        if resource["kind"] != "Job":
            continue
        spec = resource["spec"]
        if spec.get("completionMode") == "Indexed":
            cells = json.loads((maps / name / "plan.json").read_text())["cells"]
            for index in range(spec["completions"]):
                if not drop(cells[index]["id"]):
                    _pod(farm, resource, index)
            workers.append(name)
        else:
            (wait,) = spec["template"]["spec"]["initContainers"]
            assert all(w in wait["command"][-1] for w in workers), "the merge must wait for every worker Job"
            merged = _pod(farm, resource, None)
    assert merged is not None, "no merge Job"
    return merged


# --------------------------------------------------------------------------- the tests


def _yaml(document: Mapping[str, Any]) -> dict[str, Any]:
    """The document as its engine reads it: YAML text, read back."""
    back: dict[str, Any] = yaml.safe_load(yamltext.dump(document))
    return back


Run = Callable[[Farm, dict[str, Any], Callable[[str], bool]], int]
ENGINES: dict[str, Run] = {
    "gha": lambda farm, doc, drop: run_gha(farm, _yaml(gha.workflow(doc, chunk=1)), drop=drop),
    "buildkite": lambda farm, doc, drop: run_buildkite(
        farm, _yaml(buildkite.pipelines(doc, chunk=1, image="r.example/stackfarm-worker:t")[0]), drop=drop
    ),
    "k8s": lambda farm, doc, drop: run_k8s(
        farm, list(yaml.safe_load_all(yamltext.dump_all(k8s.manifests(doc)))), drop=drop
    ),
}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_dropped_worker_shuts_the_gate_and_the_whole_document_merges_green(farm: Farm, engine: str) -> None:
    """Two cells that pass: with one worker dropped the merge exits 3 naming that cell; once its worker has run
    too (the other's verdict is in the store), the merge is green."""
    doc = farm.plan("--cells", f"{cell_id(OLD)},{cell_id(NEW)}")
    assert doc["conflicts"] == []
    run, dropped = ENGINES[engine], cell_id(NEW)
    assert run(farm, doc, lambda cell: cell == dropped) == 3, farm.said()
    said = farm.merge_said()
    assert "gate: exit 3" in said
    assert f"{dropped}: the store holds no verdict" in said
    farm.log.clear()
    assert run(farm, doc, lambda cell: cell != dropped) == 0, farm.said()
    said = farm.merge_said()
    assert "2 cells: 2 passed" in said
    assert "have none" not in said


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_conflict_is_counted_by_the_merge(farm: Farm, engine: str) -> None:
    """A cell that contradicts SGLang's pins runs nowhere, and the merge counts it: exit 1, named."""
    doc = farm.plan()
    assert [c["id"] for c in doc["conflicts"]] == [cell_id(CONFLICT)]
    # typed as the plan found it: the merge records the axes and the matrix line with the conflict
    found = doc["conflicts"][0]["contradictions"]
    assert found
    assert all(c["axis"] and c["requirement"] in c["text"] for c in found), found
    assert isinstance(doc["conflicts"][0]["declared_at"]["line"], int)
    assert ENGINES[engine](farm, doc, lambda cell: False) == 1, farm.said()
    said = farm.merge_said()
    assert "3 cells: 2 passed, 1 conflict" in said
    assert f"{cell_id(CONFLICT)}: conflict: sglang 0.5.10 requires" in said
    assert "have none" not in said


def test_without_a_store_the_pods_reports_are_gathered_and_merged(farm: Farm) -> None:
    """No store: each pod writes its own folder of the reports claim, the merge Job gathers them."""
    doc = farm.plan("--cells", f"{cell_id(OLD)},{cell_id(NEW)}", store=False)
    assert ENGINES["k8s"](farm, doc, lambda cell: False) == 0, farm.said()
    assert "2 cells: 2 passed" in farm.merge_said()
    claim = farm.root.parent / "k8s" / "claims" / "stackfarm-reports"
    assert sorted(p.parent.parent.name for p in claim.glob("*/*/verdict.json")) == [
        "stackfarm-gpu-0",
        "stackfarm-gpu-1",
    ]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_without_a_store_a_dropped_worker_shuts_the_gate(farm: Farm, engine: str) -> None:
    doc = farm.plan("--cells", f"{cell_id(OLD)},{cell_id(NEW)}", store=False)
    assert ENGINES[engine](farm, doc, lambda cell: cell == cell_id(NEW)) == 3, farm.said()


def test_a_worker_line_runs_the_plans_matrix_and_refuses_another(farm: Farm) -> None:
    """The worker line as emitted runs; without --matrix it still runs the plan's matrix (the worker adopts it:
    the bug of issue 31, a plan from --matrix X run against ./matrix.toml, cannot happen); a line naming a matrix
    whose content is not the plan's is refused (exit 2), never run under other inputs."""
    doc = farm.plan("--cells", cell_id(OLD))
    workflow = gha.workflow(doc)
    line = next(s["run"] for s in workflow["jobs"]["cells-1"]["steps"] if s.get("name") == "run the cell")
    path = doc["matrix"]["path"] if isinstance(doc["matrix"], dict) else doc["matrix"]
    given = f"--matrix {path} "
    assert given in line
    env = {"CELL": cell_id(OLD), storekeys.RUNNER_KEY_ENV: farm.secrets["key"]}
    other = Path(path).with_name("other.toml")
    other.write_text(Path(path).read_text() + "\n# edited after the plan\n")
    assert farm.shell(line.replace(given, f"--matrix {other} "), env) == 2, farm.said()
    assert farm.shell(line.replace(given, ""), env) == 0, farm.said()
    assert farm.shell(line, env) == 0, farm.said()


@pytest.mark.docker
def test_the_worker_image_builds(tmp_path: Path) -> None:
    """docker/worker.Dockerfile built for real on the local base (docker/make-base.sh): stackfarm runs in it,
    as uid 10001, in /project."""
    engine = shutil.which("docker")
    base = "stackfarm-base:bookworm"
    if (
        engine is None
        or subprocess.run([engine, "image", "inspect", base], capture_output=True, check=False).returncode
    ):
        pytest.skip(f"no docker engine or no {base} (docker/make-base.sh makes it)")
    tag = f"stackfarm-worker:test-{uuid.uuid4().hex[:8]}"
    built = subprocess.run([engine, "build", "-f", "docker/worker.Dockerfile", "-t", tag, "."], cwd=REPO,
                           capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    try:
        ran = subprocess.run([engine, "run", "--rm", tag, "sh", "-c", "id -u; pwd; python -m stackfarm plan --help"],
                             capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        uid, cwd, *_ = ran.stdout.splitlines()
        assert (uid, cwd) == ("10001", k8s.PROJECT)
    finally:
        subprocess.run([engine, "image", "rm", "-f", tag], capture_output=True, check=False)
