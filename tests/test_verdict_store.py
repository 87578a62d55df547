"""The verdict store's format: typed fields round-trip, and records of an older format still load."""

from __future__ import annotations

import json
from pathlib import Path

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
