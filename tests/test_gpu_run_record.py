"""The README's GPU command on the lent H200, run twice and committed in tests/test_gpu_runs/h200-2026-12-02 and
h200-2026-12-02b: one `stackfarm run --backend host --python python3 --profile runners/1x-h200.toml --cells
'cu130-torch2.11.0*'` from a fresh clone plus the `stackfarm bundle` wheelhouse (00 -> 40, gates on; 1352 s and
1293 s). Each stored verdict is re-judged from its own JUnit files (never believed), and `[thresholds.1x-h200]` is
what `stackfarm thresholds` derives from the two runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from stackfarm import families, history, htmlreport, verdict
from stackfarm.matrix import load
from stackfarm.throughput import derive

REPO = Path(__file__).parents[1]
RUNS = tuple(
    Path(__file__).parent / "test_gpu_runs" / name for name in ("h200-2026-12-02", "h200-2026-12-02b")
)
CELL = "cu130-torch2.11.0-sk0.4.4-fi0.6.12-sgl0.5.15"
#: The third run (commit 4f47634, issue 26): every suite family wrote its record on the GPU.
FAMILY_RUN = Path(__file__).parent / "test_gpu_runs" / "h200-2026-12-02c"


def _records() -> list[dict[str, Any]]:
    return [json.loads((run / CELL / "throughput.json").read_text(encoding="utf-8")) for run in RUNS]


@pytest.mark.parametrize("run", [*RUNS, FAMILY_RUN], ids=lambda p: p.name)
def test_the_run_passes_when_re_judged_from_its_junit_files(run: Path) -> None:
    stored = verdict.read(run / CELL / verdict.VERDICT)
    fresh = verdict.rejudged(stored)
    assert verdict.rejudge_problem(stored) is None
    assert fresh.status is verdict.Status.PASSED
    suites = {s.suite: s.outcome for s in fresh.suites}
    assert set(suites) == {
        "00-stack", "05-import", "10-capability", "15-toolchain", "20-eagle3", "30-numerics", "40-throughput"
    }  # fmt: skip
    assert set(suites.values()) == {"passed"}
    facts = fresh.backend_facts
    assert facts.profile_name == "1x-h200"
    # the profile as it was at the run (runners/1x-h200.toml may move on; the record says which one it ran under)
    want = hashlib.sha256((run / "1x-h200.toml").read_bytes()).hexdigest()
    assert facts.profile_sha256 == want


def test_the_h200_table_is_derived_from_the_two_runs() -> None:
    """matrix.toml's [thresholds.1x-h200] is `stackfarm thresholds --from <run 1> --from <run 2>`, bound for bound."""
    shipped = load(REPO / "matrix.toml").thresholds["1x-h200"]
    found = {r.figure: r for r in derive.readings(_records())}
    for key, value in shipped.items():
        if key == "max_regression_pct":
            continue
        reading = found[key]
        assert reading.unstable is None, f"{key}: {reading.unstable}"
        assert reading.agrees(), f"{key}: medians {reading.medians} differ by more than the runs' CV"
        assert reading.bound == value, f"{key}: the runs give {reading.bound}, matrix.toml has {value}"


def test_no_unstable_figure_carries_a_bound() -> None:
    shipped = load(REPO / "matrix.toml").thresholds["1x-h200"]
    unstable = {r.figure for r in derive.readings(_records()) if r.unstable is not None}
    assert {"ttft_ms", "batch8_ttft_ms", "eagle3_ttft_ms"} <= unstable
    assert not unstable & set(shipped)


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_both_numerics_defects_were_caught_on_the_gpu_and_nothing_tied(run: Path) -> None:
    rows = {
        r["test"].split("::")[-1]: r for r in json.loads((run / CELL / "numerics.json").read_text("utf-8"))
    }
    for bug in ("attention", "mlp"):
        row = rows[f"test_e2e_gpu_bug[{bug}]"]
        assert row["ok"] is False
        assert " 0 near-tie(s), 8 real" in row["verdict"]
    for config in ("eagle3-bfloat16", "eagle3-tree-bfloat16"):
        row = rows[f"test_e2e_gpu[{config}]"]
        assert row["ok"] is True
        assert row["verdict"].startswith("8/8 prompts identical")


def test_the_path_draft_accepts_its_whole_proposal_on_the_gpu() -> None:
    """The second run is the first under the rebuilt path draft (lag-1 head, MLP memory, cancelling heads):
    SGLang's EAGLE-3 chain and tree accepted 4 of 4 drafted tokens on every prompt (the first run's draft, 1.03),
    and 30-numerics held it to its floor."""
    rows = {
        r["test"].split("::")[-1]: r
        for r in json.loads((RUNS[1] / CELL / "numerics.json").read_text("utf-8"))
    }
    for config in ("eagle3-bfloat16", "eagle3-tree-bfloat16"):
        assert float(rows[f"test_e2e_gpu[{config}]"]["properties"]["accept_length"]) >= 3.0


def test_the_families_records_written_on_the_gpu_are_bound_and_render() -> None:
    """Every suite family of the third run wrote `<suite>.json` on the H200; the verdict binds each record's
    sha256, and the cell page renders each family's section from the record (not from JUnit properties)."""
    stored = verdict.read(FAMILY_RUN / CELL / verdict.VERDICT)
    registry = families.load(REPO / "suites")
    bound = {s.suite for s in stored.report.suites if s.record_sha256}
    assert bound == set(registry), "each family's record is bound by the verdict"
    for suite in stored.report.suites:
        if suite.record_sha256:
            raw = (FAMILY_RUN / CELL / f"{suite.suite}.json").read_bytes()
            assert hashlib.sha256(raw).hexdigest() == suite.record_sha256
    page = htmlreport.cell_page(history.read_run(FAMILY_RUN).cells[CELL], registry=registry)
    for family in registry.values():
        assert f"<h2>{family.title}" in page or family.title in page, family.name
    assert "not the record the verdict binds" not in page
