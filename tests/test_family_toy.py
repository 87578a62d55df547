"""Adding a suite family is one folder (issue 26): a toy family, suites/50-toy/ with its test and its family.py,
validated at load, run, recorded and rendered, with no edit anywhere else.

The project is the fake stack's (tests/fakestack.py: a local find_links index of real tiny wheels, the real
suites/conftest.py, the local backend), so the run is the runner's own, end to end, in a few seconds.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import pytest

from fakestack import OLD, FakeProject, cell_id
from stackfarm import htmlreport, matrix, verdict
from stackfarm.errors import ConfigError, ExitCode

pytest_plugins = ("fakestack",)

CELL = cell_id(OLD)
TOY = "50-toy"

#: suites/50-toy/family.py: one setting, a record, a section. Nothing else in the project names it.
FAMILY_PY = """
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stackfarm.family import SectionContext, SuiteFamily
from stackfarm.schema import Int, Table


@dataclass(frozen=True, kw_only=True)
class ToySettings:
    times: int = 1

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> ToySettings:
        return cls(times=int(table.get("times", 1)))


@dataclass(frozen=True, kw_only=True)
class Greeting:
    who: str
    times: int


@dataclass(frozen=True, kw_only=True)
class ToyRecord:
    greetings: tuple[Greeting, ...] = ()
    note: str = ""


def render(ctx: SectionContext[ToyRecord]) -> str:
    rows = "".join(f"<li>toy greets {g.who} x{g.times}</li>" for r in ctx.records for g in r.greetings)
    return f"<h2>Toy</h2><ul>{rows}</ul><p>{ctx.records[0].note}</p>"


FAMILY = SuiteFamily(
    name="50-toy",
    title="Toy",
    order=50,
    settings_schema=Table({"times": Int("a whole number >= 1, e.g. times = 2", min=1)}, noun="setting"),
    settings=ToySettings,
    record=ToyRecord,
    section=render,
)
"""

#: suites/50-toy/test_toy.py: reads its parsed settings, fills its record.
TEST_PY = """
from pathlib import Path

from stackfarm import families

FAMILY = families.module(Path(__file__).with_name("family.py"))


def test_greets(cell, settings, results):
    assert isinstance(settings, FAMILY.ToySettings), type(settings)
    results.add("greetings", FAMILY.Greeting(who=cell.id, times=settings.times))
    results.set("note", f"times={settings.times}")
"""


def _toy(project: FakeProject, settings: str) -> Path:
    folder = project.suites / TOY
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "family.py").write_text(FAMILY_PY.lstrip(), encoding="utf-8")
    (folder / "test_toy.py").write_text(TEST_PY.lstrip(), encoding="utf-8")
    project.suite_config[TOY] = {"gate": False}
    return project.write_matrix(extra=f"\n[suites.{TOY}.settings]\n" + textwrap.dedent(settings))


def test_a_bad_toy_setting_is_an_error_at_load_naming_file_line_and_key(fake_project: FakeProject) -> None:
    path = _toy(fake_project, "times = 0\n")
    with pytest.raises(ConfigError) as exc:
        matrix.load(path)
    line = path.read_text().splitlines().index("times = 0") + 1
    assert f"{path}:{line}:" in str(exc.value)
    assert f"`times` in [suites.{TOY}.settings]" in str(exc.value)
    path = _toy(fake_project, "tims = 2\n")
    with pytest.raises(ConfigError, match="did you mean `times`"):
        matrix.load(path)
    assert fake_project.run() == ExitCode.CONFIG, "a run refuses it before any work"


def test_the_toy_family_is_validated_run_recorded_and_rendered(fake_project: FakeProject) -> None:
    path = _toy(fake_project, "times = 3\n")
    (suite,) = (s for s in matrix.load(path).suites if s.name == TOY)
    assert type(suite.parsed_settings).__name__ == "ToySettings"
    assert suite.parsed_settings.times == 3, "parsed once, at load"

    assert fake_project.run() == ExitCode.OK
    folder = fake_project.reports / CELL
    # (b) the suite got the parsed settings (its test asserts their type) and (c) wrote its record beside JUnit
    record = folder / f"{TOY}.json"
    doc = json.loads(record.read_text())
    assert doc == {
        "schema": 1,
        "family": TOY,
        "record": {"greetings": [{"who": CELL, "times": 3}], "note": "times=3"},
    }
    stored = verdict.read(folder / "verdict.json")
    (result,) = (s for s in stored.report.suites if s.suite == TOY)
    assert result.outcome == "passed"
    assert result.record_sha256 == hashlib.sha256(record.read_bytes()).hexdigest(), "the verdict binds it"
    # (d) the report renders the toy section from the record
    page = (folder / "index.html").read_text()
    assert f"<h2>Toy</h2><ul><li>toy greets {CELL} x3</li></ul><p>times=3</p>" in page
    # (e) a record edited after the run is never rendered, and the verdict no longer stands for a rerun
    record.write_text(record.read_text().replace('"times": 3', '"times": 30'))
    htmlreport.write(fake_project.reports, suites=fake_project.suites)
    page = (folder / "index.html").read_text()
    assert "toy greets" not in page
    assert f"{TOY}.json: not the record the verdict binds (its sha256 differs): not shown" in page
    assert verdict.reusable(stored, stored.input_hash) == (
        f"{TOY}: its record {TOY}.json is not the one the verdict binds"
    )
