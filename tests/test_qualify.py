"""qualify: refusals, the signed record, --verify naming what changed; the CI helpers (job matrix, annotations).

Unit tests judge small synthetic reports/ folders (test_history.write_cell). The integration tests run a real
cell (real wheels, the real sm120-capability patch set applied by the runner, tiny suites) in a project under
tmp_path that is its own git repository, qualify it, and then change a patch, tamper with the record, and make
a suite fail or skip.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from stackfarm import attest, gha, qualify
from stackfarm.cli import main as stackfarm_main
from stackfarm.errors import ConfigError, ExitCode
from stackfarm.history import read_run
from stackfarm.plan import input_hash
from test_history import CELL, CaseSpec, write_cell

REPO = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- judging a run (unit)

PASSED: dict[str, list[CaseSpec]] = {
    "00-stack": [("test_a", "passed", "", {"x": "1"})],
    "10-capability": [
        ("test_b", "passed", "", {}),
        ("test_gpu_device", "skipped", "needs GPU: none here", {}),
    ],
}


#: The inputs a verdict records, and their hash as its key: a verdict the store reads (it recomputes the key).
INPUTS = {"values": {"sglang": "0.5.9"}, "gpu": False}


def _write(tmp_path: Path, suites: dict[str, list[CaseSpec]]) -> None:
    write_cell(tmp_path, CELL, suites, inputs=INPUTS, properties={"stackfarm.input_hash": input_hash(INPUTS)})


def _judge(tmp_path: Path, suites: dict[str, list[CaseSpec]], *allow: str) -> qualify.Judgement:
    _write(tmp_path, suites)
    # As qualify reads it: the run as stored (write_cell stores a suite with a skipped testcase as passed).
    cell = qualify.stored_run(tmp_path, CELL)
    return qualify.judge(cell, ["00-stack", "10-capability", "20-eagle3"], allow)


def test_every_required_suite_must_pass_and_a_skip_is_not_a_pass(tmp_path: Path) -> None:
    suites: dict[str, list[CaseSpec]] = {
        **PASSED,
        "20-eagle3": [("test_runtime", "skipped", "needs GPU: none here", {})],
        "00-patches": [("kimi/0001.patch", "failed", "drift: hunk 1", {})],
    }
    judged = _judge(tmp_path, suites)
    assert judged.missing == (
        "10-capability::test_gpu_device: skipped (needs GPU: none here)",
        "20-eagle3: skipped (needs GPU: none here)",
        "00-patches: failed (kimi/0001.patch: drift: hunk 1)",
    )


def test_a_missing_suite_is_listed_and_accepted_skips_are_kept(tmp_path: Path) -> None:
    judged = _judge(tmp_path, PASSED, "10-capability::test_gpu_*")
    assert judged.missing == ("20-eagle3: not in the latest run",)
    assert judged.accepted_skips == (
        {"case": "10-capability::test_gpu_device", "reason": "needs GPU: none here"},
    )


# --------------------------------------------------------------------------- what no signature vouches for (unit)


def test_a_record_whose_inputs_are_not_its_hash_or_that_passes_a_gpu_suite_without_gpu_is_refused() -> None:
    inputs = {"a": 1, "suite_settings": [{"name": "40-throughput", "needs_gpu": True}]}
    record = {
        "inputs": inputs,
        "input_hash": input_hash(inputs),
        "gpu": {"present": False, "no_gpu_reason": "nvidia-smi not found"},
        "suites": [
            {"suite": "00-stack", "outcome": "passed"},
            {"suite": "40-throughput", "outcome": "passed"},
        ],
    }
    needs = qualify.needs_gpu_suites(None, inputs)
    assert needs == {"40-throughput"}
    assert qualify.record_refusals(record, needs) == [
        "40-throughput: needs a GPU, yet it is recorded passed by a run that had none (nvidia-smi not found): "
        "a forged verdict; run the cell on a GPU runner"
    ]
    assert qualify.record_refusals({**record, "gpu": {"present": True, "no_gpu_reason": None}}, needs) == []
    assert qualify.record_refusals({**record, "input_hash": "0" * 64, "gpu": {"present": True}}, needs) == [
        "the record's inputs do not hash to its input_hash"
    ]


def test_bad_names_are_refused_before_any_planning_or_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a release name"):
        qualify.qualify(cell_id=CELL, release="../x", approver="a", reports=tmp_path, matrix_path=tmp_path)
    with pytest.raises(ConfigError, match="approver is empty"):
        qualify.qualify(cell_id=CELL, release="r1", approver=" ", reports=tmp_path, matrix_path=tmp_path)


# --------------------------------------------------------------------------- CI helpers (unit)

RUNNERS = """
[axes]
cuda = ["12.8"]
torch = ["2.9.1"]
sgl_kernel = ["0.3.21"]
flashinfer = ["0.6.3"]
sglang = ["0.5.9"]

[targets]
archs = ["sm_120", "sm_90"]

[runners.8x-rtx-pro-6000]
arch = "sm_120"
gpus = 8
labels = ["self-hosted", "linux", "x64", "sm_120", "gpus-8"]
cells = ["*-sgl0.5.9", "*-sgl0.5.10"]

[runners.1x-h200]
arch = "sm_90"
gpus = 1
labels = ["self-hosted", "linux", "x64", "sm_90", "gpus-1"]
"""


def _plan(*ids: str) -> dict[str, object]:
    return {"cells": [{"id": i} for i in ids], "conflicts": [], "excluded": [], "warnings": []}


def test_job_matrix_picks_the_first_runner_kind_matching_each_cell(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(RUNNERS)
    runners, warnings = gha.read_runners(matrix)
    assert warnings == []
    jobs = gha.dispatch(_plan(CELL, "cu130-torch2.11.0-sk0.4.4-fi0.6.12-sgl0.5.15"), runners, matrix)[0]
    assert [(j["cell"], j["runner"], j["gpus"]) for j in jobs["include"]] == [
        (CELL, "8x-rtx-pro-6000", 8),
        ("cu130-torch2.11.0-sk0.4.4-fi0.6.12-sgl0.5.15", "1x-h200", 1),
    ]
    assert jobs["include"][0]["labels"] == ["self-hosted", "linux", "x64", "sm_120", "gpus-8"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('arch = "sm_90"', 'arch = "sm_100"'), "`arch` in [runners.1x-h200] names an unknown target arch 'sm_100'"),
        (('gpus = 8', 'gpus = 0'), "`gpus` in [runners.8x-rtx-pro-6000] 0 is outside [1, inf]"),
        (('labels = ["self-hosted", "linux", "x64", "sm_90", "gpus-1"]', "labels = []"), "labels"),
        (('gpus = 1', 'gpu = 1'), "did you mean `gpus`?"),
    ],
)  # fmt: skip
def test_bad_runner_tables_name_the_line(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(RUNNERS.replace(*edit))
    with pytest.raises(ConfigError) as info:
        gha.read_runners(matrix)
    assert message in str(info.value)
    assert f"{matrix}:" in str(info.value), "the error names file:line"


def test_a_cell_no_runner_takes_is_an_error_and_no_table_is_a_warning(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(RUNNERS.replace("\n[runners.1x-h200]", "\n[runners.1x-h200]\ncells = ['cu130-*']"))
    runners, _ = gha.read_runners(matrix)
    with pytest.raises(ConfigError, match=r"cell cu128-x-sgl0\.6\.0 matches no"):
        gha.dispatch(_plan("cu128-x-sgl0.6.0"), runners, matrix)[0]
    matrix.write_text(RUNNERS.split("[targets]", maxsplit=1)[0] + '[targets]\narchs = ["sm_90"]\n')
    runners, warnings = gha.read_runners(matrix)
    assert runners == (gha.DEFAULT_RUNNER,)
    assert "has no [runners] table" in warnings[0]


def test_annotations_escape_and_name_missing_cells(tmp_path: Path) -> None:
    _write(tmp_path, {"10-capability": [("t", "failed", "KeyError: 12, 100%\nsecond line", {})]})
    lines = gha.gha_annotations(read_run(tmp_path), [CELL, "cu-gone"])
    assert lines == [
        "::error title=cu-gone::cu-gone: no report; its job ended before the run wrote one",
        f"::error title={CELL} 10-capability::t: KeyError: 12, 100%25%0Asecond line",
    ]
    assert gha.annotation("warning", "a:b,c", "x\ny") == "::warning title=a%3Ab%2Cc::x%0Ay"


# --------------------------------------------------------------------------- a real cell (integration)

AXES = """
[axes]
cuda = ["12.8"]
torch = ["2.9.1"]
sgl_kernel = ["0.3.21"]
flashinfer = ["0.6.3"]
sglang = ["0.5.9"]

[patches.sm120-capability]
applies_to = "sglang>=0.5.9,<0.5.16"
"""
OK_SUITE = """
def test_decode(record_property):
    record_property("decode_tok_s", "92.6")
    assert 92.6 > 89.5
"""


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=stackfarm test", "-c", "user.email=test@example.invalid", *args],
        cwd=root, check=True, capture_output=True,
    )  # fmt: skip


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A matrix folder with a real patch set and one tiny suite, committed to its own git repository."""
    (tmp_path / "suites" / "00-ok").mkdir(parents=True)
    shutil.copy(REPO / "suites" / "conftest.py", tmp_path / "suites" / "conftest.py")
    (tmp_path / "suites" / "00-ok" / "test_it.py").write_text(OK_SUITE)
    shutil.copytree(REPO / "patches" / "sm120-capability", tmp_path / "patches" / "sm120-capability")
    (tmp_path / "matrix.toml").write_text(AXES)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "matrix.toml")
    _git(tmp_path, "commit", "-q", "-m", "matrix")
    attest.generate(tmp_path / "keys")
    return tmp_path


def _run(project: Path) -> int:
    return stackfarm_main(
        [
            "run",
            "--matrix",
            str(project / "matrix.toml"),
            "--reports",
            str(project / "reports"),
            "--jobs",
            "1",
            "--backend",
            "local",  # `auto` would pick Docker where CI started an engine
        ]
    )


def _qualify(project: Path, release: str, *extra: str) -> int:
    return stackfarm_main(
        ["qualify", "--cell", CELL, "--release", release, "--approver", "Ana Approver", "--reports",
         str(project / "reports"), "--matrix", str(project / "matrix.toml"),
         "--key", str(project / "keys" / attest.PRIVATE_NAME), *extra]
    )  # fmt: skip


def _verify(project: Path, record: Path) -> int:
    return stackfarm_main(
        ["qualify", "--verify", str(record), "--matrix", str(project / "matrix.toml"),
         "--public-key", str(project / "keys" / attest.PUBLIC_NAME)]
    )  # fmt: skip


@pytest.mark.integration
def test_record_of_a_real_run_verifies_and_names_a_changed_patch(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(project) == ExitCode.OK
    assert _qualify(project, "r1") == ExitCode.OK
    record_path = project / "reports" / "qualifications" / "r1.json"
    record = qualify.unverified_predicate(record_path)
    verdict = json.loads((project / "reports" / CELL / "verdict.json").read_text())
    assert record["cell"] == CELL
    assert record["input_hash"] == verdict["input_hash"]
    assert {c["distribution"]: c["version"] for c in record["components"]}["sglang"] == "0.5.9"
    assert all(len(c["sha256"]) == 64 for c in record["components"])
    assert record["patch_sets"]["sm120-capability"] == verdict["report"]["patch_sets"]["sm120-capability"]
    assert set(record["patch_statuses"].values()) == {"applied"}
    assert record["image_digest"] is None, "the local backend has no image"
    commit = subprocess.run(
        ["git", "log", "-1", "--format=%H"], cwd=project, capture_output=True, text=True, check=True
    )
    assert record["matrix"]["commit"] == commit.stdout.strip()
    assert record["matrix"]["modified_since_commit"] is False
    ok = next(s for s in record["suites"] if s["suite"] == "00-ok")
    assert ok["cases"][0]["properties"] == {"decode_tok_s": "92.6"}
    assert record["approver"] == "Ana Approver"
    assert datetime.fromisoformat(record["approved_at"]) <= datetime.now(timezone.utc)
    md = record_path.with_suffix(".md").read_text()
    assert "approved by **Ana Approver**" in md
    assert "| 00-ok | test_decode | decode_tok_s | 92.6 |" in md
    # A second record under the same release name is refused.
    assert _qualify(project, "r1") == ExitCode.CELLS_FAILED
    assert "exists" in capsys.readouterr().err

    assert _verify(project, record_path) == ExitCode.OK
    assert "the record holds" in capsys.readouterr().out

    patch = next((project / "patches" / "sm120-capability").glob("0001-*.patch"))
    patch.write_text(patch.read_text().replace("Description:", "Description: (edited)", 1))
    assert _verify(project, record_path) == ExitCode.CELLS_FAILED
    out = capsys.readouterr().out
    assert "changed: patch_sets.sm120-capability:" in out
    assert f"changed: patch file sm120-capability/{patch.name}: changed" in out
    assert "artifacts." not in out, "only the patch changed"

    envelope = json.loads(record_path.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["approver"] = "Mallory"
    envelope["payload"] = base64.b64encode(attest.canonical_json(statement)).decode()
    record_path.write_text(json.dumps(envelope))
    assert _verify(project, record_path) == ExitCode.CELLS_FAILED
    assert "TAMPERED: the signature does not match the payload" in capsys.readouterr().out


@pytest.mark.integration
def test_failed_skipped_and_missing_suites_are_refused_with_the_list(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    skip = "import pytest\n\ndef test_gpu(cell):\n    pytest.skip(f'needs GPU: {cell.no_gpu_reason or \"test\"}')\n"
    (project / "suites" / "10-gpu").mkdir()
    (project / "suites" / "10-gpu" / "test_it.py").write_text(skip)
    assert _qualify(project, "r2") == ExitCode.CELLS_FAILED
    assert f"refused: cell {CELL} has no run in {project / 'reports'}/" in capsys.readouterr().err
    (project / "suites" / "00-ok" / "test_it.py").write_text(
        OK_SUITE + "\ndef test_more():\n    assert 1 == 2\n"
    )
    assert _run(project) == ExitCode.CELLS_FAILED
    assert _qualify(project, "r2") == ExitCode.CELLS_FAILED
    err = capsys.readouterr().err
    assert f"refused: {CELL} cannot be qualified as r2; not passed:" in err
    assert "  - 00-ok: failed (test_more: " in err
    assert "  - 10-gpu: skipped (suite: gated: 00-ok did not pass (failed))" in err
    assert not (project / "reports" / "qualifications" / "r2.json").exists()

    # Fixed, but the GPU suite only skips: still refused, until the approver accepts that skip by name.
    (project / "suites" / "00-ok" / "test_it.py").write_text(OK_SUITE)
    assert _run(project) == ExitCode.INCOMPLETE
    assert _qualify(project, "r2") == ExitCode.CELLS_FAILED
    assert "  - 10-gpu: skipped (test_gpu: needs GPU: " in capsys.readouterr().err
    assert _qualify(project, "r2", "--allow-skip", "10-gpu::*") == ExitCode.CELLS_FAILED, (
        "a whole skipped suite"
    )

    # A suite added after the run: missing from the latest run, and the inputs moved too.
    (project / "suites" / "10-gpu" / "test_it.py").write_text("def test_gpu():\n    assert 1 + 1 == 2\n")
    assert _run(project) == ExitCode.OK
    (project / "suites" / "20-new").mkdir()
    (project / "suites" / "20-new" / "test_it.py").write_text("def test_new():\n    assert 1 + 1 == 2\n")
    assert _qualify(project, "r2") == ExitCode.CELLS_FAILED
    err = capsys.readouterr().err
    assert "  - 20-new: not in the latest run" in err
    assert "the latest run was made from other inputs" in err
    assert _run(project) == ExitCode.OK
    assert _qualify(project, "r2") == ExitCode.OK


def test_skip_accepted_by_name_is_recorded_as_not_verified(tmp_path: Path) -> None:
    judged = _judge(tmp_path, {**PASSED, "20-eagle3": [("test_contract", "passed", "", {})]}, "*::test_gpu_*")
    assert judged.missing == ()
    assert judged.accepted_skips[0]["case"] == "10-capability::test_gpu_device"
