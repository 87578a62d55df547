"""stackfarm.throughput.thresholds: runner kinds from GPU names, and [thresholds.*] tables resolved per kind.

The GPU names are nvidia-smi's own spellings (the H200 one as read on the lent H200 machines, the RTX PRO
6000 one as the seeds' server reports it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stackfarm.matrix import load
from stackfarm.throughput import curve, record
from stackfarm.throughput.stats import decide
from stackfarm.throughput.thresholds import (
    DEFAULT_EAGLE3_OVER_BASELINE,
    DEFAULT_RELATIVE_SOURCE,
    ThresholdError,
    figure_batch,
    figure_names,
    gpu_slug,
    higher_is_better,
    is_figure,
    resolve,
    runner_kind,
    unit,
)

REPO = Path(__file__).resolve().parents[1]
MEASURED = figure_names([1, 8], eagle3=True)
_CURVE = (*curve.figure_names([0.0, 0.5, 0.9]),)
SEEDS = {"8x-rtx-pro-6000": {"decode_tok_s": 92.6, "eagle3_over_baseline": 1.0}}


@pytest.mark.parametrize(
    ("names", "kind"),
    [
        (["NVIDIA H200"], "1x-h200"),
        (["NVIDIA H200"] * 8, "8x-h200"),
        (["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 8, "8x-rtx-pro-6000"),
        (["NVIDIA H100 80GB HBM3"] * 2, "2x-h100"),
        (["NVIDIA GB200"] * 4, "4x-gb200"),
        (["NVIDIA A100-SXM4-80GB", "NVIDIA H200"], "1x-a100+1x-h200"),
        (["Tesla T4"], "1x-tesla-t4"),
        ([], "no-gpu"),
    ],
)
def test_runner_kind(names: list[str], kind: str) -> None:
    assert runner_kind(names) == kind


def test_gpu_slug_prefers_the_longer_family() -> None:
    assert gpu_slug("NVIDIA GB200") == "gb200"
    assert gpu_slug("NVIDIA B200") == "b200"
    assert gpu_slug("NVIDIA H20") == "h20"


def test_figure_names_and_units() -> None:
    assert MEASURED[:3] == ("decode_tok_s", "ttft_ms", "itl_ms")
    assert "eagle3_batch8_tok_s" in MEASURED
    assert "batch1_tok_s" not in MEASURED
    assert figure_names([1], eagle3=False) == ("decode_tok_s", "ttft_ms", "itl_ms")
    assert (unit("batch8_tok_s"), unit("itl_ms"), unit("eagle3_accept_length")) == ("tok/s", "ms", "tokens")
    assert higher_is_better("decode_tok_s")
    assert not higher_is_better("eagle3_ttft_ms")
    assert figure_batch("eagle3_batch16_tok_s") == 16
    assert figure_batch("eagle3_over_baseline") is None
    assert is_figure("batch32_ttft_ms")
    assert not is_figure("decode_tokens")


def test_seed_thresholds_resolve_for_the_seed_runner() -> None:
    resolution = resolve(SEEDS, "8x-rtx-pro-6000", measured=MEASURED)
    assert resolution.problem is None
    by_name = {c.name: c for c in resolution.checks}
    decode = by_name["decode_tok_s"]
    assert (decode.kind, decode.bound.value, decode.bound.at_least) == ("absolute", 92.6, True)
    assert decode.source == "thresholds.8x-rtx-pro-6000.decode_tok_s"
    relative = by_name["eagle3_over_baseline"]
    assert (relative.kind, relative.figure, relative.bound.value) == ("relative", "eagle3_over_baseline", 1.0)


def test_the_repository_matrix_keeps_the_seed_thresholds() -> None:
    matrix = load(REPO / "matrix.toml")
    assert matrix.thresholds["8x-rtx-pro-6000"] == SEEDS["8x-rtx-pro-6000"]
    resolution = resolve(matrix.thresholds, "8x-rtx-pro-6000", measured=MEASURED)
    assert {c.name for c in resolution.checks} == {"decode_tok_s", "eagle3_over_baseline"}


def test_unknown_runner_kind_is_a_clear_problem() -> None:
    resolution = resolve(SEEDS, "1x-h200", measured=MEASURED)
    assert resolution.checks == ()
    assert resolution.problem is not None
    assert "no [thresholds.1x-h200]" in resolution.problem
    assert "8x-rtx-pro-6000" in resolution.problem  # the known kinds are named
    assert "STACKFARM_RUNNER_KIND" in resolution.problem
    near = resolve(SEEDS, "8x-rtx-pro-600", measured=MEASURED)
    assert near.problem is not None
    assert "did you mean `8x-rtx-pro-6000`" in near.problem


def test_empty_table_is_a_problem() -> None:
    resolution = resolve({"1x-h200": {}}, "1x-h200", measured=MEASURED)
    assert resolution.problem is not None
    assert "sets no thresholds" in resolution.problem


def test_latency_figures_are_ceilings() -> None:
    resolution = resolve({"1x-h200": {"ttft_ms": 40.0, "batch8_tok_s": 3000}}, "1x-h200", measured=MEASURED)
    by_name = {c.name: c for c in resolution.checks}
    assert by_name["ttft_ms"].bound.at_least is False
    assert by_name["batch8_tok_s"].bound.at_least is True


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"decode_toks": 90}, "unknown threshold key; did you mean `decode_tok_s`?"),
        ({"decode_tok_s": "fast"}, "expected a number"),
        ({"decode_tok_s": True}, "expected a number"),
        ({"decode_tok_s": -1}, "expected a number > 0"),
        ({"batch16_tok_s": 100}, "batch size 16 is not in settings.batch_sizes"),
        ({"max_regression_pct": 150}, "must be below 100"),
    ],
)
def test_bad_tables_name_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ThresholdError, match=r"thresholds\.1x-h200") as info:
        resolve({"1x-h200": table}, "1x-h200", measured=MEASURED)
    assert message in str(info.value)


def test_relative_threshold_needs_eagle3() -> None:
    with pytest.raises(ThresholdError, match="EAGLE-3 is not measured"):
        resolve(SEEDS, "8x-rtx-pro-6000", measured=figure_names([1, 8], eagle3=False))


def test_regression_against_the_last_qualified_record() -> None:
    last = {"decode_tok_s": 100.0, "batch8_tok_s": 800.0, "ttft_ms": 9.0}
    table = {"1x-h200": {"max_regression_pct": 5}}
    resolution = resolve(table, "1x-h200", measured=MEASURED, last=last, last_origin="run-41/throughput.json")
    by_figure = {c.figure: c for c in resolution.checks if c.kind == "regression"}
    # only throughput figures the record has; latencies are too noisy at this scale to gate on
    assert set(by_figure) == {"decode_tok_s", "batch8_tok_s"}
    assert by_figure["decode_tok_s"].bound.value == pytest.approx(95.0)
    assert by_figure["batch8_tok_s"].bound.value == pytest.approx(760.0)
    assert by_figure["decode_tok_s"].kind == "regression"
    assert "run-41/throughput.json" in by_figure["decode_tok_s"].note
    # no record yet: nothing to regress against, and that is not an empty-table problem
    first = resolve(table, "1x-h200", measured=MEASURED, last=None)
    assert [c.source for c in first.checks] == [DEFAULT_RELATIVE_SOURCE]  # only the seeds' rule
    assert first.problem is None


def test_where_eagle3_is_measured_and_no_relative_figure_is_set_eagle3_must_beat_baseline() -> None:
    absolute = {"1x-h200": {"decode_tok_s": 200, "eagle3_decode_tok_s": 20}}
    (default,) = [c for c in resolve(absolute, "1x-h200", measured=MEASURED).checks if c.kind == "relative"]
    assert (default.figure, default.bound.value, default.bound.at_least) == (
        "eagle3_over_baseline",
        1.0,
        True,
    )
    assert default.bound.value == DEFAULT_EAGLE3_OVER_BASELINE
    assert default.source == DEFAULT_RELATIVE_SOURCE
    # A table's own relative figure (plain, at a rate, or the break-even) replaces the default.
    for own in (
        {"eagle3_over_baseline": 0.8},
        {"eagle3_over_baseline@0.5": 1.0},
        {"break_even_acceptance": 0.5},
    ):
        checks = resolve(
            {"1x-h200": {"decode_tok_s": 200, **own}}, "1x-h200", measured=[*MEASURED, *_CURVE]
        ).checks
        assert DEFAULT_RELATIVE_SOURCE not in {c.source for c in checks}, own
    # Without EAGLE-3 there is nothing to compare.
    baseline_only = figure_names([1, 8], eagle3=False)
    assert (
        resolve({"1x-h200": {"decode_tok_s": 200}}, "1x-h200", measured=baseline_only).checks[-1].kind
        == "absolute"
    )


def test_a_run_where_eagle3_is_7x_slower_fails_a_table_of_absolute_floors() -> None:
    """The earlier H200 run (EAGLE-3 without CUDA graphs, a random draft: ~0.14x the baseline) clears floors
    set low enough; the seeds' rule, on by default, fails it."""
    figures = record.load(H200_NO_GRAPHS)["figures"]
    floors = {"1x-h200": {"decode_tok_s": 200, "eagle3_decode_tok_s": 20}}
    checks = resolve(floors, "1x-h200", measured=list(figures)).checks
    verdicts = {
        c.name: decide(figures[c.figure]["samples"], c.bound, more=list, max_remeasures=0).verdict
        for c in checks
    }
    assert verdicts == {"decode_tok_s": "pass", "eagle3_decode_tok_s": "pass", "eagle3_over_baseline": "fail"}


# ------------------------------------------------------------------------------------------ the shipped table
#: A real record: 40-throughput on the lent H200 (SGLang 0.5.15, the dummy Llama-3-8B shape), run under a
#: runner-kind override so that it judged nothing itself.
#: The run [thresholds.1x-h200] was set from (planted curve, CUDA graphs on both servers, 2026-12-01).
H200_RECORD = REPO / "tests" / "test_throughput_fixtures" / "h200_planted_curve_throughput.json"
#: An earlier H200 run: EAGLE-3 without CUDA graphs and a random draft (2026-11-29).
H200_NO_GRAPHS = REPO / "tests" / "test_throughput_fixtures" / "h200_llama3_8b_shape_throughput.json"


def test_the_shipped_h200_table_passes_the_h200_run_it_was_set_from() -> None:
    """Every bound of [thresholds.1x-h200] is judged on the real H200 samples the way the suite judges
    them (bootstrap interval, no re-measure): all must pass, or the shipped table fails its own runner."""
    figures = record.load(H200_RECORD)["figures"]
    tables = load(REPO / "matrix.toml").thresholds
    resolution = resolve(tables, "1x-h200", measured=list(figures), last=None)
    assert resolution.problem is None
    assert {c.figure for c in resolution.checks} == {
        "decode_tok_s", "itl_ms", "batch8_tok_s", "eagle3_decode_tok_s", "eagle3_batch8_tok_s",
        "eagle3_over_baseline@0.9", "eagle3_over_baseline@0.5", "eagle3_over_baseline@0", "break_even_acceptance",
    }  # fmt: skip

    def no_more() -> list[float]:
        raise AssertionError("no re-measure on a recorded run")

    verdicts = {
        c.name: decide(figures[c.figure]["samples"], c.bound, more=no_more, max_remeasures=0).verdict
        for c in resolution.checks
    }
    assert set(verdicts.values()) == {"pass"}, verdicts


def test_the_shipped_h200_table_catches_a_baseline_without_cuda_graphs() -> None:
    """The baseline decode at EAGLE-3's no-graph pace (~30 tok/s, the earlier run's): a clear fail."""
    figures = record.load(H200_RECORD)["figures"]
    check = next(
        c
        for c in resolve(load(REPO / "matrix.toml").thresholds, "1x-h200", measured=list(figures)).checks
        if c.figure == "decode_tok_s"
    )
    slow = record.load(H200_NO_GRAPHS)["figures"]["eagle3_decode_tok_s"]["samples"]
    assert decide(slow, check.bound, more=list, max_remeasures=0).verdict == "fail"


def test_the_seeds_rule_fails_eagle3_without_graphs() -> None:
    """eagle3_over_baseline@0.5 >= 1 (EAGLE-3 must beat the baseline at 50 % acceptance): the earlier run's
    ratio without CUDA graphs for EAGLE-3 (~0.14) fails it; the planted run's (1.10) passes."""
    figures = record.load(H200_RECORD)["figures"]
    check = next(
        c
        for c in resolve(load(REPO / "matrix.toml").thresholds, "1x-h200", measured=list(figures)).checks
        if c.figure == "eagle3_over_baseline@0.5"
    )
    no_graphs = record.load(H200_NO_GRAPHS)["figures"]["eagle3_over_baseline"]["samples"]
    assert decide(no_graphs, check.bound, more=list, max_remeasures=0).verdict == "fail"
    planted = figures["eagle3_over_baseline@0.5"]["samples"]
    assert decide(planted, check.bound, more=list, max_remeasures=0).verdict == "pass"
