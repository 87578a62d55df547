"""The 40-throughput suite run end to end without a GPU, the way the runner runs it (pytest in a child process,
STACKFARM_CELL, JUnit), against stand-ins: tests/test_throughput_fixtures/fake_sglang as the cell's SGLang
(real server processes speaking SGLang's /health and streamed /generate) and fake_bin/nvidia-smi (one H200).

What the real SGLang on a GPU does is for the H200 run; this pins the suite's own logic: servers started
and stopped, figures and verdicts in the JUnit properties and in throughput.json, and the bad cases (a server
that never becomes healthy, an unknown runner kind, no GPU) reported as such.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from stackfarm import families
from stackfarm.cellspec import CellSpec, InstalledComponent
from stackfarm.family import from_json

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "test_throughput_fixtures"
SETTINGS = {
    "repeats": 3,
    "max_remeasures": 1,
    "batch_sizes": [1, 2],
    "output_tokens": 16,
    "warmup_tolerance": 10.0,  # the fake's sleep-driven rates need not settle to 2 %
    "warmup_batches": 1,
    "health_timeout": 20.0,
    "resamples": 2000,
}
THRESHOLDS = {"1x-h200": {"decode_tok_s": 1.0, "ttft_ms": 10_000.0, "eagle3_over_baseline": 50.0}}


@dataclass(frozen=True)
class Case:
    outcome: str  # passed / failed / error / skipped
    message: str
    properties: dict[str, str]


def run_suite(
    tmp_path: Path,
    *,
    settings: dict[str, Any] | None = None,
    no_gpu_reason: str | None = None,
    env: dict[str, str] | None = None,
    thresholds: dict[str, Any] | None = None,
) -> tuple[int, dict[str, Case], Path]:
    cell = CellSpec(
        id="cu130-torch2.11.0-sk0.4.4-fi0.6.12-sgl0.5.15",
        values={"sglang": "0.5.15"},
        backend="host",
        components=(
            InstalledComponent(
                axis="sglang",
                distribution="sglang",
                version="0.5.15",
                filename="",
                sha256="",
                source="test",
                root=str(FIXTURES / "fake_sglang"),
            ),
        ),
        thresholds=THRESHOLDS if thresholds is None else thresholds,
        settings={"40-throughput": {**SETTINGS, **(settings or {})}},
        no_gpu_reason=no_gpu_reason,
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "cell.json"
    cell.dump(spec)
    out = tmp_path / "reports" / cell.id
    junit = tmp_path / "40-throughput.xml"
    full_env = {
        **{k: v for k, v in os.environ.items() if k not in ("STACKFARM_RUNNER_KIND", "PYTEST_ADDOPTS")},
        "PATH": f"{FIXTURES / 'fake_bin'}{os.pathsep}{os.environ['PATH']}",
        "STACKFARM_CELL": str(spec),
        "STACKFARM_SUITE_OUT": str(out),
        "FAKE_SGLANG_TOKEN_S": "0.002",
        "FAKE_SGLANG_START_S": "0.2",
        **(env or {}),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/40-throughput", f"--junitxml={junit}", "-q", "-p", "no:cacheprovider"],
        cwd=REPO, env=full_env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert junit.is_file(), done.stdout + done.stderr
    cases: dict[str, Case] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = (found.get("message") or "") + "\n" + (found.text or "")
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        cases[case.get("name", "")] = Case(outcome, message, props)
    return done.returncode, cases, out


def assert_record_shows_the_junit(out: Path, cases: dict[str, Case]) -> None:
    """The suite's record (40-throughput.json, family.py) holds what format 0 reads from its JUnit properties:
    the section renders a run from its record as it renders a held run of the same JUnit file."""
    family = families.load_one(REPO / "suites" / "40-throughput" / families.FAMILY_FILE)
    assert family.record is not None
    assert family.legacy is not None
    doc = json.loads((out / "40-throughput.json").read_text(encoding="utf-8"))
    held = SimpleNamespace(cases=[SimpleNamespace(name=n, properties=c.properties) for n, c in cases.items()])
    assert from_json(family.record, doc["record"]) == family.legacy(held)


def test_suite_measures_records_and_judges(tmp_path: Path) -> None:
    code, cases, out = run_suite(tmp_path)
    assert code == 1, "one threshold fails on purpose"
    gpu = cases["test_gpu"]
    assert gpu.outcome == "passed"
    assert gpu.properties["runner_kind"] == "1x-h200"
    assert gpu.properties["gpu0.name"] == "NVIDIA H200"
    assert gpu.properties["gpu0.power_limit_w"] == "700.0"

    figures = cases["test_figures"]
    assert figures.outcome == "passed", figures.message
    for name in (
        "decode_tok_s",
        "eagle3_decode_tok_s",
        "batch2_tok_s",
        "eagle3_accept_length",
        "eagle3_over_baseline",
    ):
        assert float(figures.properties[f"{name}.median"]) > 0
        assert figures.properties[f"{name}.n"] == "3"
        assert len(json.loads(figures.properties[f"{name}.samples"])) == 3
    assert figures.properties["config.eagle3.cuda_graph"] == "False"
    assert "without CUDA graphs" in figures.properties["config.eagle3.note"]
    assert "--disable-cuda-graph" in figures.properties["config.eagle3.args"]

    resolved = cases["test_thresholds_resolved"]
    assert resolved.outcome == "passed"
    assert resolved.properties["checks"] == "decode_tok_s >= 1, eagle3_over_baseline >= 50, ttft_ms <= 10000"
    decode = cases["test_threshold[decode_tok_s]"]
    assert decode.outcome == "passed"
    assert decode.properties["verdict"] == "pass"
    assert decode.properties["source"] == "thresholds.1x-h200.decode_tok_s"
    assert cases["test_threshold[ttft_ms]"].properties["bound"] == "<= 10000"
    ratio = cases["test_threshold[eagle3_over_baseline]"]
    assert ratio.outcome == "failed"
    assert "performance shortfall" in ratio.message
    assert ratio.properties["verdict"] == "fail"
    assert cases["test_bench_tool"].outcome == "skipped"

    doc = json.loads((out / "throughput.json").read_text(encoding="utf-8"))
    assert doc["schema"] == "stackfarm.throughput/1"
    assert doc["runner_kind"] == "1x-h200"
    assert doc["gpus"][0]["name"] == "NVIDIA H200"
    assert doc["gpus_after"], "the GPU is read again after measuring"
    assert {c["name"]: c["verdict"] for c in doc["checks"]} == {
        "decode_tok_s": "pass",
        "ttft_ms": "pass",
        "eagle3_over_baseline": "fail",
    }
    # the JUnit properties and the file hold the same samples (the file with any re-measures appended)
    recorded = [round(x, 4) for x in doc["figures"]["decode_tok_s"]["samples"][:3]]
    assert recorded == json.loads(figures.properties["decode_tok_s.samples"])
    assert (out / "throughput-baseline.log").is_file()
    assert (out / "throughput-eagle3.log").is_file()
    assert not (REPO / "throughput.json").exists(), "never written into the CWD"
    assert_record_shows_the_junit(out, cases)


def test_server_that_never_becomes_healthy(tmp_path: Path) -> None:
    code, cases, out = run_suite(
        tmp_path, settings={"health_timeout": 2.0}, env={"FAKE_SGLANG_MODE": "never-healthy"}
    )
    assert code == 1
    figures = cases["test_figures"]
    assert figures.outcome == "error"
    assert "[timeout, not retried] ServerStartError: baseline server not healthy after 2 s" in figures.message
    assert "health check received; the scheduler is stuck" in figures.message  # the log tail
    assert cases["test_threshold[decode_tok_s]"].outcome == "error"
    doc = json.loads((out / "throughput.json").read_text(encoding="utf-8"))
    assert any("not healthy after 2 s" in p for p in doc["problems"])


def test_unknown_runner_kind_is_one_clear_failure(tmp_path: Path) -> None:
    code, cases, out = run_suite(tmp_path, env={"STACKFARM_RUNNER_KIND": "8x-h200"})
    assert code == 1
    unknown = cases["test_thresholds_resolved"]
    assert unknown.outcome == "failed"
    assert unknown.properties["runner_kind"] == "8x-h200"
    assert "no [thresholds.8x-h200] in matrix.toml" in unknown.message
    assert "known runner kinds: 1x-h200" in unknown.message
    assert cases["test_threshold[none]"].outcome == "skipped"
    assert cases["test_figures"].outcome == "passed", "the figures are still measured and recorded"
    doc = json.loads((out / "throughput.json").read_text(encoding="utf-8"))
    assert doc["runner_kind"] == "8x-h200"
    assert any("no [thresholds.8x-h200]" in p for p in doc["problems"])


def test_without_a_gpu_everything_skips_with_the_reason(tmp_path: Path) -> None:
    code, cases, out = run_suite(
        tmp_path, no_gpu_reason="no NVIDIA GPU on this machine (nvidia-smi not found)"
    )
    assert code == 0
    assert {c.outcome for c in cases.values()} == {"skipped"}
    assert all("needs GPU: no NVIDIA GPU" in c.message for c in cases.values())
    assert [p.name for p in out.iterdir()] == ["40-throughput.json"], "no figures, no logs: only the record"
    assert_record_shows_the_junit(out, cases)


def test_server_that_crashes_is_an_import_error_not_retried(tmp_path: Path) -> None:
    code, cases, out = run_suite(tmp_path, env={"FAKE_SGLANG_MODE": "crash"})
    assert code == 1
    figures = cases["test_figures"]
    assert figures.outcome == "error"
    assert "[import-error, not retried]" in figures.message
    assert "exited with code 1 before it became healthy" in figures.message
    assert "ImportError: cannot import name 'fp8_kernel'" in figures.message
    assert (out / "throughput-baseline.log").is_file()
    assert not (out / "throughput-eagle3.log").exists(), (
        "the second server never starts after the first failed"
    )


def test_configured_model_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    code, cases, _ = run_suite(
        tmp_path, settings={"model_path": str(missing), "draft_model_path": str(missing)}
    )
    assert code == 1
    assert cases["test_figures"].outcome == "error"
    assert f"model path {missing} does not exist" in cases["test_figures"].message


def test_regression_against_the_last_record(tmp_path: Path) -> None:
    _, _, first = run_suite(tmp_path / "first")
    baseline = first / "throughput.json"
    limits = {"1x-h200": {"max_regression_pct": 90}}  # the fake is as fast as last time, give or take
    code, cases, out = run_suite(
        tmp_path / "second", thresholds=limits, env={"STACKFARM_THROUGHPUT_BASELINE": str(baseline)}
    )
    assert code == 0, {n: c.message for n, c in cases.items() if c.outcome != "passed"}
    regression = cases["test_threshold[decode_tok_s-regression]"]
    assert regression.properties["kind"] == "regression"
    assert str(baseline) in regression.properties["note"]
    doc = json.loads((out / "throughput.json").read_text(encoding="utf-8"))
    assert {c["figure"] for c in doc["checks"]} == {
        "decode_tok_s", "batch2_tok_s", "eagle3_decode_tok_s", "eagle3_batch2_tok_s",
        "eagle3_over_baseline",  # the seeds' rule: the table sets no relative figure of its own
    }  # fmt: skip
    # a record of another runner kind is no baseline for this one
    code, cases, _ = run_suite(
        tmp_path / "third",
        thresholds={"8x-h200": {"max_regression_pct": 5}},
        env={"STACKFARM_THROUGHPUT_BASELINE": str(baseline), "STACKFARM_RUNNER_KIND": "8x-h200"},
    )
    assert cases["test_thresholds_resolved"].outcome == "failed"
    assert "is from runner kind '1x-h200', not '8x-h200'" in cases["test_thresholds_resolved"].message


def test_acceptance_curve_on_planted_models(tmp_path: Path) -> None:
    """settings.acceptance: planted weights written, a group of requests per rate, the accept length checked
    against 1 + 3r, the curve and its break-even in the JUnit properties and throughput.json."""
    limits = {"1x-h200": {"eagle3_over_baseline@0.9": 1.2, "break_even_acceptance": 0.95}}
    settings = {"acceptance": [0.0, 0.5, 0.9], "model_shape": "tiny", "acceptance_requests": 10, "repeats": 2}
    code, cases, out = run_suite(tmp_path, settings=settings, thresholds=limits)
    assert code == 0, {n: c.message for n, c in cases.items() if c.outcome not in ("passed", "skipped")}
    assert (out.parent.parent / "cell.json").is_file()
    for rate, want in (("0", 1.0), ("0.5", 2.5), ("0.9", 3.7)):
        case = cases[f"test_accept_length[{rate}]"]
        assert case.outcome == "passed", case.message
        assert float(case.properties["expected"]) == pytest.approx(want)
        assert abs(float(case.properties["median"]) - want) < 0.1
    figures = cases["test_figures"].properties
    assert float(figures["eagle3_over_baseline@0.9.median"]) > 1.2
    assert float(figures["eagle3_over_baseline@0.median"]) < 1.0
    breakeven = cases["test_break_even"]
    assert breakeven.outcome == "passed"
    assert 0.0 < float(breakeven.properties["break_even_acceptance"]) < 0.9
    assert cases["test_threshold[eagle3_over_baseline@0.9]"].properties["kind"] == "relative"
    assert cases["test_threshold[break_even_acceptance]"].properties["verdict"] == "pass"
    doc = json.loads((out / "throughput.json").read_text(encoding="utf-8"))
    assert doc["curve"]["rates"] == [0.0, 0.5, 0.9]
    assert doc["curve"]["points"]["0.5"]["expected_accept_length"] == 2.5
    assert 0.0 < doc["curve"]["break_even_acceptance"] < 0.9
    assert "--load-format" not in figures["config.eagle3.args"], "planted weights are real, not dummy"
    assert_record_shows_the_junit(out, cases)


def test_a_warmup_that_never_settles_is_inconclusive_not_passed(tmp_path: Path) -> None:
    code, cases, out = run_suite(
        tmp_path,
        settings={"warmup_tolerance": 0.0, "warmup_max_runs": 3},
        thresholds={"1x-h200": {"decode_tok_s": 1.0}},
    )
    assert code == 1
    decode = cases["test_threshold[decode_tok_s]"]
    assert decode.outcome == "failed"
    assert decode.properties["verdict"] == "inconclusive"
    assert "the warm-up of baseline never became stable" in decode.message
    assert cases["test_figures"].properties["warmup.baseline.stable"] == "False"
    doc = json.loads((out / "throughput.json").read_text(encoding="utf-8"))
    # decode_tok_s, and the default eagle3_over_baseline >= 1 (the table sets no relative figure): neither
    # decided by samples of an unstable warm-up.
    assert [(c["figure"], c["verdict"]) for c in doc["checks"]] == [
        ("decode_tok_s", "inconclusive"),
        ("eagle3_over_baseline", "inconclusive"),
    ]
