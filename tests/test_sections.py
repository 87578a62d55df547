"""stackfarm.sections: a cell page's sections, the patch step's and each suite family's from its record
(suites/NN-name/family.py)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from stackfarm import families, htmlreport, sections
from stackfarm.family import to_json
from stackfarm.history import read_run
from stackfarm.sections.html import loc
from test_history import CELL, OTHER, CaseSpec, write_cell
from test_htmlreport import FAILING, FAILING_RECORDS, PASSING, PASSING_RECORDS

SRC = Path(htmlreport.__file__)
REPO = Path(__file__).resolve().parents[1]
TOOLCHAIN = families.module(REPO / "suites" / "15-toolchain" / "family.py")


def test_each_suite_family_has_its_renderer() -> None:
    registry = families.load(REPO / "suites")
    assert {name: f.section is not None and f.record is not None for name, f in registry.items()} == {
        "10-capability": True,
        "15-toolchain": True,
        "20-eagle3": True,
        "30-numerics": True,
        "40-throughput": True,
    }, "every family renders from its records"
    for name in registry:
        assert sections.claimed(name, registry)
    assert not sections.claimed("00-stack", registry), "a suite without a family shows its testcases only"
    assert {n for n, f in registry.items() if f.legacy is not None} == {
        "10-capability",
        "15-toolchain",
        "20-eagle3",
        "30-numerics",
        "40-throughput",
    }, "every family with held runs reads them (format 0)"


def test_htmlreport_has_no_suite_specific_code() -> None:
    text = SRC.read_text(encoding="utf-8")
    code = re.sub(r'"""(.|\n)*?"""', "", text)  # docstrings may name the families
    for word in ("capability", "eagle3", "EAGLE", "throughput", "numerics", "equivalence", "match_rate",
                 "decode_tok_s", "patch."):  # fmt: skip
        assert word not in code, word
    assert len(text.splitlines()) <= 600


def test_findings_carry_their_file_line(tmp_path: Path) -> None:
    write_cell(tmp_path, CELL, FAILING, records=FAILING_RECORDS)
    page = htmlreport.cell_page(read_run(tmp_path).cells[CELL])
    findings = page.split("<h2>Capability findings</h2>", 1)[1].split("<h2>", 1)[0]
    assert '<code class="loc">torch_symm_mem.py:40</code>' in findings
    assert loc("/opt/sglang/srt/x.py", "12") == (
        '<a class="loc" href="file:///opt/sglang/srt/x.py#L12"><code>/opt/sglang/srt/x.py:12</code></a>'
    )
    assert loc("libtorch_cuda.so", "0") == '<code class="loc">libtorch_cuda.so</code>'


def test_eagle3_findings_locate_provider_and_consumer(tmp_path: Path) -> None:
    suites: dict[str, list[CaseSpec]] = {
        "20-eagle3": [
            ("test_provider[target:K.get_embed_and_head]", "failed", "missing",
             {"model_class": "K", "method": "get_embed_and_head", "verdict": "missing", "role": "target",
              "provider_file": "", "consumer_site": "sglang/srt/speculative/eagle_worker.py:88"}),
        ],
        **{k: v for k, v in PASSING.items() if k != "20-eagle3"},
    }  # fmt: skip
    write_cell(tmp_path, CELL, suites, records=PASSING_RECORDS)
    page = htmlreport.cell_page(read_run(tmp_path).cells[CELL])
    assert '<code class="loc">sglang/srt/speculative/eagle_worker.py:88</code>' in page


def _tool(testcase: str, kind: str, arch: str, outcome: str, **facts: object) -> Any:
    """One 15-toolchain finding: the record's (family.py), and its outcome as the suite's analysis gave it."""
    return TOOLCHAIN.Finding(testcase=testcase, kind=kind, arch=arch, **facts), SimpleNamespace(
        kind=kind, arch=arch, outcome=outcome
    )


def test_toolchain_section_gives_each_arch_a_toolchain_and_a_selection_verdict(tmp_path: Path) -> None:
    sel = "sglang/srt/layers/attention/nsa_backend.py"
    found = [
        _tool("test_finding[triton-sm_120]", "triton", "sm_120", "pass"),
        _tool("test_finding[selection-mla-prefill-trtllm-gen-sm_120]", "selection", "sm_120", "fail",
              target="trtllm-gen", file=sel, line=1776),
        _tool("test_finding[flashinfer-jit-sm_90]", "flashinfer-jit", "sm_90", "skip"),
        _tool("test_finding[selection-attention-fa3-sm_90]", "selection", "sm_90", "pass"),
        _tool("test_finding[selection-attention-triton-sm_90]", "selection", "sm_90", "n/a"),
    ]  # fmt: skip
    junit = {"pass": "passed", "fail": "failed", "skip": "skipped", "n/a": "skipped"}
    suites: dict[str, list[CaseSpec]] = {
        **PASSING,
        "15-toolchain": [(f.testcase, junit[o.outcome], o.outcome, {}) for f, o in found],
    }
    record = TOOLCHAIN.ToolchainRecord(
        archs=TOOLCHAIN.arch_verdicts(o for _, o in found), findings=tuple(f for f, _ in found)
    )
    write_cell(tmp_path, CELL, suites, records={**PASSING_RECORDS, "15-toolchain": to_json(record)})
    page = htmlreport.cell_page(read_run(tmp_path).cells[CELL])
    part = page.split("<h2>Toolchain and backend selection</h2>", 1)[1].split("<h2>", 1)[0]
    assert "<td><strong>sm_120</strong></td><td>passed</td><td>failed (1 of 1)</td>" in part
    assert "<td><strong>sm_90</strong></td><td>unanswered (1 of 1)</td><td>passed</td>" in part
    assert f'<code class="loc">{sel}:1776</code>' in part
    assert TOOLCHAIN.arch_verdicts([]) == ()
    only_tool = TOOLCHAIN.arch_verdicts([SimpleNamespace(kind="triton", arch="sm_90", outcome="pass")])
    assert only_tool[0].selection == "no finding"  # never passed


def test_a_record_the_verdict_does_not_bind_is_not_rendered(tmp_path: Path) -> None:
    write_cell(tmp_path, CELL, FAILING, records=FAILING_RECORDS)
    record = tmp_path / CELL / "10-capability.json"
    record.write_text(record.read_text().replace("missing-key x1", "ok"))  # edited after the run
    page = htmlreport.cell_page(read_run(tmp_path).cells[CELL])
    assert "missing-key x1" not in page
    assert "torch_symm_mem.py:40" not in page.split("<h2>All testcases</h2>", 1)[0]
    assert "10-capability.json: not the record the verdict binds (its sha256 differs): not shown" in page
    record.unlink()
    page = htmlreport.cell_page(read_run(tmp_path).cells[CELL])
    assert "10-capability.json: the verdict binds a record that is not there" in page


def test_the_patch_section_judges_a_status_as_the_runner_does(tmp_path: Path) -> None:
    # An upstreamed patch fails the runner's patch step (stackfarm.patches.model.fine): the page says so too.
    props = {"patch.sm120-capability/0001-all-reduce.patch.status": "upstreamed",
             "patch.sm120-capability/0002-gate.patch.status": "applied"}  # fmt: skip
    write_cell(tmp_path, CELL, FAILING, properties=props)
    page = htmlreport.cell_page(read_run(tmp_path).cells[CELL])
    patches = page.split("<h2>Patches</h2>", 1)[1].split("<h2>", 1)[0]
    assert '0001-all-reduce.patch</code></td><td><span class="badge o-failed">upstreamed' in patches
    assert '0002-gate.patch</code></td><td><span class="badge o-passed">applied' in patches


def test_numerics_and_throughput_render_a_record_as_they_render_a_held_run(tmp_path: Path) -> None:
    """A held run (no record: format 0, its JUnit properties) and a run whose suites wrote that run's record
    show the same Equivalence and Throughput sections; a record the verdict does not bind is not shown."""
    registry = families.load(REPO / "suites")
    write_cell(tmp_path / "held", OTHER, PASSING, records=PASSING_RECORDS)
    held_run = read_run(tmp_path / "held").cells[OTHER]
    records = dict(PASSING_RECORDS)
    for name in ("30-numerics", "40-throughput"):
        suite = next(s for s in held_run.suites if s.result.suite == name)
        legacy = registry[name].legacy
        assert legacy is not None
        records[name] = to_json(legacy(suite))
    assert records["30-numerics"]["comparisons"][0]["match_rate"] == "0.5"
    assert [f["name"] for f in records["40-throughput"]["figures"]] == ["decode_tok_s", "eagle3_decode_tok_s"]
    write_cell(tmp_path / "new", OTHER, PASSING, records=records)
    new = htmlreport.cell_page(read_run(tmp_path / "new").cells[OTHER], None, registry)
    held = htmlreport.cell_page(held_run, None, registry)

    def part(page: str, title: str) -> str:
        return page.split(f"<h2>{title}</h2>", 1)[1].split("<h2>", 1)[0]

    for title in ("Equivalence", "Throughput"):
        assert part(new, title) == part(held, title), title
    assert "<title>absolute threshold 89.5</title>" in part(new, "Throughput")
    record = tmp_path / "new" / OTHER / "40-throughput.json"
    record.write_text(record.read_text().replace("92.6", "192.6"))
    page = htmlreport.cell_page(read_run(tmp_path / "new").cells[OTHER], None, registry)
    assert "40-throughput.json: not the record the verdict binds (its sha256 differs): not shown" in page
    assert 'aria-label="decode"' not in page
