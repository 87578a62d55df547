"""The verdict store's format: typed fields round-trip, and records of an older format still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stackfarm import verdict
from stackfarm.verdict import CellReport, Contradiction, SourceLine, Status

CONFLICT = CellReport(
    cell="cu128-torch2.8.0-sgl0.5.9",
    status=Status.CONFLICT,
    reason="sglang 0.5.9 requires torch==2.9.1; the cell has torch 2.8.0",
    values={"torch": "2.8.0", "sglang": "0.5.9"},
    contradictions=(
        Contradiction(
            axis="torch",
            requirement="torch==2.9.1",
            text="sglang 0.5.9 requires torch==2.9.1; the cell has torch 2.8.0",
        ),
    ),
    declared_at=SourceLine(path="/project/matrix.toml", line=8),
)


def test_a_conflict_keeps_its_contradictions_and_matrix_line(tmp_path: Path) -> None:
    path = verdict.save(tmp_path, CONFLICT)
    assert json.loads(path.read_text())["format"] == verdict.FORMAT == 3
    assert verdict.parse(path.read_bytes(), path).report == CONFLICT
    assert verdict.read(path).report == CONFLICT


def test_a_format_2_conflict_loads_without_them(tmp_path: Path) -> None:
    old = verdict.to_json(CONFLICT)
    del old["contradictions"], old["declared_at"]
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps({"format": 2, "input_hash": "", "run_id": "", "inputs": {}, "report": old}))
    report = verdict.read(path).report
    assert (report.status, report.reason) == (CONFLICT.status, CONFLICT.reason)
    assert (report.contradictions, report.declared_at) == ((), None)


FACTS = {
    "docker.image": "stackfarm/cell:abc",
    "docker.image_digest": "sha256:" + "1" * 64,
    "profile.name": "1x-h200",
}


def test_backend_facts_are_typed_and_stored_by_field(tmp_path: Path) -> None:
    facts = verdict.BackendFacts.from_properties(FACTS)
    assert (facts.docker_image, facts.profile_name, facts.host_python) == (
        "stackfarm/cell:abc",
        "1x-h200",
        None,
    )
    assert facts.as_properties() == FACTS, "JUnit keeps the property names"
    report = CellReport(cell="c", status=Status.ERROR, reason="x", backend_facts=facts)
    path = verdict.save(tmp_path, report)
    stored = json.loads(path.read_text())["report"]["backend_facts"]
    assert stored == {"docker_image": "stackfarm/cell:abc", "docker_image_digest": "sha256:" + "1" * 64,
                      "profile_name": "1x-h200"}  # fmt: skip
    assert verdict.read(path).report == report
    assert report.image_digest == "sha256:" + "1" * 64
    assert report.properties["docker.image"] == "stackfarm/cell:abc"


def test_a_format_2_bag_of_backend_facts_loads_into_the_fields(tmp_path: Path) -> None:
    old = verdict.to_json(CellReport(cell="c", status=Status.ERROR, reason="x"))
    old["backend_facts"] = {**FACTS, "host.python": "3.12.3"}
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps({"format": 2, "input_hash": "", "run_id": "", "inputs": {}, "report": old}))
    facts = verdict.read(path).report.backend_facts
    assert facts == verdict.BackendFacts.from_properties({**FACTS, "host.python": "3.12.3"})
    assert facts.host_python == "3.12.3"


def test_a_fact_without_a_field_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rocm\.version"):
        verdict.BackendFacts.from_properties({"rocm.version": "6.2"})
