"""suites/20-eagle3/family.py: its settings parsed once and handed over, the wheels it asks the runner for, its
record and section, and format 0 (a held run's JUnit properties read into the same record, rendered the same)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stackfarm import families, htmlreport
from stackfarm.family import StackOnly, from_json, to_json
from stackfarm.history import read_run
from test_history import CELL, CaseSpec, write_cell
from test_htmlreport import PASSING, PASSING_RECORDS

REPO = Path(__file__).resolve().parents[1]
FAMILY_FILE = REPO / "suites" / "20-eagle3" / families.FAMILY_FILE
EAGLE3 = families.module(FAMILY_FILE)

CASES: list[CaseSpec] = [
    ("test_contract", "passed", "", {"sglang": "0.5.15", "contract": "target <get_embed_and_head>", "contract_json": "{}"}),
    ("test_contract_diff", "failed", "empty", {"compared_with": "0.5.10", "contract_diff": "sglang 0.5.10 -> 0.5.15",
                                               "verdict_diff": "verdict changes: none"}),
    ("test_provider[target:K.get_embed_and_head]", "failed", "missing",
     {"model_class": "K", "method": "get_embed_and_head", "verdict": "missing", "role": "target", "provider_file": "",
      "consumer_site": "sglang/srt/speculative/eagle_worker.py:88", "provider_class": "", "detail": "not defined"}),
    ("test_provider[draft:D.set_embed]", "passed", "",
     {"model_class": "D", "method": "set_embed", "verdict": "implemented", "role": "draft", "provider_class": "D",
      "provider_file": "sglang/srt/models/llama_eagle3.py:12", "consumer_site": "x.py:3", "detail": ""}),
    ("test_runtime[A+B]", "skipped", "needs GPU: no NVIDIA GPU", {}),
]  # fmt: skip


def test_settings_are_parsed_once_and_read_back_from_their_json() -> None:
    family = families.load_one(FAMILY_FILE)
    table = {"compare_with": ["0.5.9", "0.5.10"], "runtime_pairs": [["A", "B"]], "runtime_timeout": 60}
    settings = family.parse(table)
    assert settings == EAGLE3.Eagle3Settings(
        compare_with=("0.5.9", "0.5.10"), runtime_pairs=(("A", "B"),), runtime_timeout=60.0
    )
    assert family.settings_of(to_json(settings)) == settings
    assert family.parse({}) == EAGLE3.Eagle3Settings()
    assert EAGLE3.Eagle3Settings().runtime_pairs is None, "no pairs configured: the suite's default pairs"


def test_the_baseline_wheel_is_declared_for_the_runner() -> None:
    """Only the nearest older compare_with release than the cell's SGLang: the one the suite reads, the one a
    host's bundle carries (stackfarm.handover.required)."""
    family = families.load_one(FAMILY_FILE)
    settings = family.parse({"compare_with": ["0.5.9", "0.5.10", "0.5.15"]})
    assert family.needs.wheels(settings, StackOnly({"sglang": "0.5.15", "torch": "2.11.0"})) == (
        "sglang==0.5.10",
    )
    assert family.needs.wheels(settings, StackOnly({"sglang": "0.5.10"})) == ("sglang==0.5.9",)
    assert family.needs.wheels(settings, StackOnly({"sglang": "0.5.9"})) == (), (
        "nothing older: nothing to fetch"
    )
    assert family.needs.wheels(settings, StackOnly({"torch": "2.11.0"})) == (), "no SGLang in the cell"
    assert family.needs.wheels(family.parse({}), StackOnly({"sglang": "0.5.15"})) == ()


def _page(folder: Path, records: dict[str, Any]) -> str:
    write_cell(folder, CELL, {**PASSING, "20-eagle3": CASES}, records=records)
    return htmlreport.cell_page(read_run(folder).cells[CELL])


def test_a_held_run_renders_from_its_junit_as_a_record_renders(tmp_path: Path) -> None:
    """Format 0: a run without a record (the verdict binds none) shows the section its properties made; the
    same facts written as the record render the same page."""
    held = _page(tmp_path / "held", dict(PASSING_RECORDS))
    run = read_run(tmp_path / "held").cells[CELL]
    suite = next(s for s in run.suites if s.result.suite == "20-eagle3")
    record = EAGLE3.from_junit(suite)
    assert record is not None
    assert [(t.key, t.version) for t in record.texts] == [
        ("contract", "0.5.15"), ("contract_diff", "0.5.10"), ("verdict_diff", "0.5.10")
    ]  # fmt: skip
    assert [c.testcase for c in record.classes] == [c[0] for c in CASES if c[0].startswith("test_provider[")]
    assert from_json(EAGLE3.Eagle3Record, to_json(record)) == record
    fresh = _page(tmp_path / "fresh", {**PASSING_RECORDS, "20-eagle3": to_json(record)})
    assert fresh.replace(str(tmp_path / "fresh"), "X") == held.replace(str(tmp_path / "held"), "X")
    section = held.split("<h2>EAGLE-3 contract</h2>", 1)[1].split("<h2>", 1)[0]
    assert "<h3>Derived contract (sglang 0.5.15)</h3><pre>target &lt;get_embed_and_head&gt;</pre>" in section
    assert "<h3>Contract diff</h3><pre>sglang 0.5.10 -&gt; 0.5.15</pre>" in section
    assert "Classes against the contract: 1 passed, 1 not passed" in section
    assert '<code class="loc">sglang/srt/speculative/eagle_worker.py:88</code>' in section


def test_a_record_naming_a_testcase_the_junit_lacks_shows_no_result(tmp_path: Path) -> None:
    record = EAGLE3.Eagle3Record(
        classes=(EAGLE3.ClassCheck(testcase="test_provider[gone]", role="target", model_class="G", method="m",
                                   verdict="missing"),)
    )  # fmt: skip
    page = _page(tmp_path, {**PASSING_RECORDS, "20-eagle3": to_json(record)})
    assert "<h2>EAGLE-3 contract</h2>" not in page
    assert "test_provider[gone]" not in page


@pytest.mark.parametrize("props", [{}, {"verdict": "ok"}])
def test_a_held_run_without_the_figures_has_no_record(tmp_path: Path, props: dict[str, str]) -> None:
    write_cell(tmp_path, CELL, {"20-eagle3": [("test_runtime[A+B]", "passed", "", props)]})
    suite = read_run(tmp_path).cells[CELL].suites[0]
    assert EAGLE3.from_junit(suite) is None
