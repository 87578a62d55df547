"""stackfarm.throughput.derive and `stackfarm thresholds`: bounds only on stable figures, from real H200 records."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from stackfarm.cli import main
from stackfarm.throughput import derive

FIXTURES = Path(__file__).parent / "test_throughput_fixtures"
H200 = FIXTURES / "h200_planted_curve_throughput.json"


def _record() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(H200.read_text(encoding="utf-8"))
    return doc


def test_unstable_figures_get_no_bound() -> None:
    """The H200 record: TTFT at a 16-token prompt (batch-8 CV 28 %, EAGLE-3 12 %) is no place for a threshold."""
    found = {r.figure: r for r in derive.readings([_record()])}
    assert found["batch8_ttft_ms"].bound is None
    assert "CV 28.2% > 2%" in (found["batch8_ttft_ms"].unstable or "")
    assert found["eagle3_ttft_ms"].bound is None
    decode = found["decode_tok_s"]
    assert decode.unstable is None
    assert decode.bound is not None
    assert decode.bound < decode.low  # a floor, below the interval
    itl = found["itl_ms"].bound
    assert itl is not None
    assert itl > found["itl_ms"].high  # a ceiling


def test_two_records_must_agree() -> None:
    """A figure whose medians differ between runs by more than 3 x its CV is not stable, however small its CV."""
    a, b = _record(), _record()
    b = copy.deepcopy(b)
    b["figures"]["decode_tok_s"]["median"] *= 1.10
    found = {r.figure: r for r in derive.readings([a, b])}
    assert found["decode_tok_s"].bound is None
    assert "medians differ by" in (found["decode_tok_s"].unstable or "")
    assert found["itl_ms"].unstable is None
    assert found["itl_ms"].agrees()


def test_records_of_different_kinds_are_refused() -> None:
    a, b = _record(), _record()
    b["runner_kind"] = "8x-rtx-pro-6000"
    with pytest.raises(ValueError, match="different runner kinds"):
        derive.readings([a, b])


def test_the_cli_writes_a_table_with_the_matrix_keys_first(capsys: pytest.CaptureFixture[str]) -> None:
    matrix = Path(__file__).parents[1] / "matrix.toml"
    assert main(["thresholds", "--from", str(H200), "--matrix", str(matrix)]) == 0
    out = capsys.readouterr().out
    assert "[thresholds.1x-h200]" in out
    assert '"decode_tok_s" = ' in out
    assert "# also stable" in out
    assert main(["thresholds", "--from", str(H200), "--from", str(H200), "--compare"]) == 0
    table = capsys.readouterr().out
    assert "| decode_tok_s | 214.1 | 214.1 |" in table


def test_a_bad_record_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "throughput.json"
    bad.write_text("{}", encoding="utf-8")
    assert main(["thresholds", "--from", str(tmp_path)]) == 2
    assert "not a readable throughput.json" in capsys.readouterr().err
    assert main(["thresholds", "--from", str(H200), "--max-cv", "3"]) == 2


def test_every_h200_threshold_sits_on_a_stable_figure() -> None:
    """Each figure [thresholds.1x-h200] bounds has CV <= 2 % in the committed H200 record (TTFT at a 16-token prompt
    does not, and carries no bound)."""
    from stackfarm.matrix import load

    table = load(Path(__file__).parents[1] / "matrix.toml").thresholds["1x-h200"]
    found = {r.figure: r for r in derive.readings([_record()])}
    for key in table:
        if key == "max_regression_pct":
            continue
        assert key in found, f"{key} is not measured in {H200.name}"
        assert found[key].unstable is None, f"{key}: {found[key].unstable}"
