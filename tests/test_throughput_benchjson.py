"""stackfarm.throughput.benchjson and .record: SGLang's bench output read into figures; throughput.json.

The bench file is constructed from the wheel's code (key names, order, rounding, json.dumps): see that folder's
README.md; a test checks it against the wheel itself, when the artifact cache holds it.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any

import pytest

from stackfarm import qualrecord
from stackfarm.throughput import record
from stackfarm.throughput.benchjson import (
    one_batch_figures,
    one_batch_server_argv,
    parse_one_batch_server,
)
from stackfarm.throughput.measure import BenchError, ZeroTokensError
from stackfarm.throughput.stats import cv

FIXTURES = Path(__file__).resolve().parent / "test_throughput_fixtures"


def test_one_batch_server_result_file() -> None:
    text = (FIXTURES / "one_batch_server_result.jsonl").read_text(encoding="utf-8")
    base1, base8, spec1 = parse_one_batch_server(text, origin="result.jsonl")
    assert (base1.batch_size, base1.input_len, base1.output_len) == (1, 16, 128)
    assert base1.output_throughput == 642.44
    assert base1.last_ttft_s == 0.0121
    assert base1.acc_length is None  # -1: no speculative decoding on the baseline
    assert base1.cache_hit_rate is None
    assert base8.cache_hit_rate == 0.0
    assert spec1.acc_length == 1.37
    # the tool's own arithmetic: output_throughput = batch * output_len / (latency - last_ttft)
    assert base8.output_throughput == pytest.approx(8 * 128 / (0.30652 - 0.01893), rel=1e-3)
    figures = one_batch_figures([base1, base8])
    assert figures == {
        "decode_tok_s": 642.44,
        "ttft_ms": pytest.approx(12.1),
        "batch8_tok_s": 3560.62,
        "batch8_ttft_ms": pytest.approx(18.9),
    }


def test_bench_that_returned_zero_tokens() -> None:
    # bench_one_batch_server divides by last_ttft, so with no first token it writes nothing at all
    with pytest.raises(ZeroTokensError, match="wrote no results"):
        parse_one_batch_server("", origin="result.jsonl")
    zero = json.loads(
        (FIXTURES / "one_batch_server_result.jsonl").read_text(encoding="utf-8").splitlines()[0]
    )
    zero.update(output_throughput=0.0, last_ttft=0.0)
    with pytest.raises(ZeroTokensError, match=r"result\.jsonl:1: the bench returned 0 tokens"):
        parse_one_batch_server(json.dumps(zero), origin="result.jsonl")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "result.jsonl:1: not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"batch_size": 1}', "no `input_len`"),
        ('{"batch_size": "one"}', "`batch_size` = 'one' is not a int"),
    ],
)
def test_malformed_bench_lines_name_the_line(line: str, message: str) -> None:
    with pytest.raises(BenchError, match=message):
        parse_one_batch_server(line, origin="result.jsonl")


def test_one_batch_server_command_line() -> None:
    argv = one_batch_server_argv(
        "/py", "http://127.0.0.1:31000", batch_sizes=[1, 8], input_len=16, output_len=128,
        result_file="/r.jsonl", tokenizer="/models/m",
    )  # fmt: skip
    assert argv[:3] == ["/py", "-m", "sglang.bench_one_batch_server"]
    assert argv[argv.index("--batch-size") + 1 : argv.index("--input-len")] == ["1", "8"]
    assert argv[argv.index("--model") + 1] == "None"  # connect to --base-url, launch nothing
    assert argv[-2:] == ["--local-tokenizer-path", "/models/m"]


def _sglang_0_5_15_one_batch_source() -> Path | None:
    for tree in (Path.home() / ".cache" / "stackfarm" / "trees").glob("*"):
        if (tree / "sglang-0.5.15.dist-info").is_dir():
            return tree / "sglang" / "benchmark" / "one_batch_server.py"
    return None


def _dict_keys(path: Path, where: str) -> list[str]:
    """The string keys of the dict literal assigned to `res` / `result` in function `where` of `path`."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == where:
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Assign)
                    and isinstance(sub.value, ast.Dict)
                    and any(isinstance(t, ast.Name) and t.id in ("res", "result") for t in sub.targets)
                ):
                    return [
                        k.value
                        for k in sub.value.keys
                        if isinstance(k, ast.Constant) and isinstance(k.value, str)
                    ]
    raise AssertionError(f"no result dict in {path}:{where}")


def test_fixtures_carry_the_keys_sglang_0_5_15_writes() -> None:
    one_batch = _sglang_0_5_15_one_batch_source()
    if one_batch is None:
        pytest.skip("the sglang 0.5.15 wheel is not unpacked in ~/.cache/stackfarm/trees")
    line = json.loads(
        (FIXTURES / "one_batch_server_result.jsonl").read_text(encoding="utf-8").splitlines()[0]
    )
    assert list(line) == _dict_keys(one_batch, "dump_to_jsonl")


# ------------------------------------------------------------------------------------------ throughput.json


def test_record_round_trip(tmp_path: Path) -> None:
    figure = record.summarise_figure(
        "decode_tok_s", [497.0, 515.0, 374.0, 501.0, 760.0], confidence=0.95, resamples=2000, seed=0
    )
    assert (figure["unit"], figure["n"], figure["median"]) == ("tok/s", 5, 501.0)
    assert (figure["ci_low"], figure["ci_high"]) == (374.0, 760.0)
    assert figure["cv"] == pytest.approx(
        cv([497.0, 515.0, 374.0, 501.0, 760.0])
    )  # 27 %: the H200 run's noise
    doc = record.document(
        cell="cu130-torch2.11.0-sk0.4.4-fi0.6.12-sgl0.5.15", runner_kind="1x-h200", sglang="0.5.15",
        gpus=[], gpus_after=[], settings={"repeats": 5}, configs={}, warmup={},
        figures={"decode_tok_s": figure}, checks=[], problems=[],
    )  # fmt: skip
    path = record.write(tmp_path / "reports" / "cell", doc)
    assert path.name == "throughput.json"
    loaded = record.load(path)
    assert loaded["schema"] == record.SCHEMA
    assert loaded["figures"]["decode_tok_s"]["median"] == 501.0
    assert not math.isnan(loaded["figures"]["decode_tok_s"]["cv"])


def test_record_load_rejects_other_files(tmp_path: Path) -> None:
    other = tmp_path / "throughput.json"
    other.write_text('{"schema": "something/9", "figures": {}}', encoding="utf-8")
    with pytest.raises(record.RecordError, match=r"expected 'stackfarm\.throughput/1'"):
        record.load(other)
    with pytest.raises(record.RecordError, match="cannot read"):
        record.load(tmp_path / "missing.json")


def test_out_dir_comes_only_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(record.OUT_ENV, raising=False)
    assert record.out_dir() is None  # never the CWD
    monkeypatch.setenv(record.OUT_ENV, str(tmp_path))
    assert record.out_dir() == tmp_path


def test_baseline_from_a_throughput_record(tmp_path: Path) -> None:
    figure = record.summarise_figure(
        "decode_tok_s", [90.0, 92.0, 91.0], confidence=0.95, resamples=500, seed=0
    )
    doc = record.document(
        cell="c", runner_kind="1x-h200", sglang="0.5.15", gpus=[], gpus_after=[], settings={}, configs={},
        warmup={}, figures={"decode_tok_s": figure}, checks=[], problems=[],
    )  # fmt: skip
    base = qualrecord.load_baseline(record.write(tmp_path, doc))
    assert base.runner_kind == "1x-h200"
    assert base.medians == {"decode_tok_s": 91.0}


def test_baseline_from_a_qualification_record(tmp_path: Path) -> None:
    # The shape stackfarm.qualify writes (`_suites`): every testcase's properties, as strings.
    qualified: dict[str, Any] = {
        "schema": 1,
        "release": "r7",
        "cell": "cu130-torch2.11.0-sk0.4.4-fi0.6.12-sgl0.5.15",
        "suites": [
            {"suite": "00-stack", "outcome": "passed", "cases": [{"name": "test_x", "outcome": "passed"}]},
            {
                "suite": "40-throughput",
                "outcome": "passed",
                "cases": [
                    {"name": "test_gpu", "outcome": "passed", "properties": {"runner_kind": "1x-h200"}},
                    {
                        "name": "test_figures",
                        "outcome": "passed",
                        "properties": {
                            "runner_kind": "1x-h200",
                            "decode_tok_s.median": "612.5",
                            "decode_tok_s.ci_low": "598.0",
                            "batch8_tok_s.median": "4100.25",
                            "config.baseline.args": "sha256:00ff (412 chars)",
                        },
                    },
                ],
            },
        ],
    }
    path = tmp_path / "r7.json"
    path.write_text(json.dumps(qualified), encoding="utf-8")
    base = qualrecord.load_baseline(path)
    assert base.runner_kind == "1x-h200"
    assert base.medians == {"decode_tok_s": 612.5, "batch8_tok_s": 4100.25}
    assert "release r7" in base.origin
    qualified["suites"] = qualified["suites"][:1]
    path.write_text(json.dumps(qualified), encoding="utf-8")
    with pytest.raises(record.RecordError, match="qualified no figures"):
        qualrecord.load_baseline(path)


def test_baseline_from_a_signed_record_needs_a_trusted_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stackfarm import attest, qualrecord

    private, public, _ = attest.generate(tmp_path / "keys")
    predicate = {
        "schema": qualrecord.SCHEMA,
        "release": "r8",
        "suites": [
            {"suite": "40-throughput", "outcome": "passed", "cases": [
                {"name": "test_figures", "outcome": "passed",
                 "properties": {"runner_kind": "1x-h200", "decode_tok_s.median": "214.5"}},
            ]},
        ],
    }  # fmt: skip
    statement = attest.statement([], qualrecord.PREDICATE_TYPE, predicate)
    path = tmp_path / "r8.json"
    envelope = attest.sign(attest.canonical_json(statement), attest.load_signing_key(private))
    path.write_text(json.dumps(envelope), encoding="utf-8")
    monkeypatch.delenv(attest.TRUSTED_KEYS_ENV, raising=False)
    with pytest.raises(record.RecordError, match="can trust"):
        qualrecord.load_baseline(path)
    monkeypatch.setenv(attest.TRUSTED_KEYS_ENV, str(public))
    assert qualrecord.load_baseline(path).medians == {"decode_tok_s": 214.5}
    forged = json.loads(path.read_text())
    forged["payload"] = forged["payload"][:-8] + "AAAAAAA="
    path.write_text(json.dumps(forged), encoding="utf-8")
    with pytest.raises(record.RecordError, match="can trust"):
        qualrecord.load_baseline(path)
