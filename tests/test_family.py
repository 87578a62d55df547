"""stackfarm.family: the codec of frozen dataclass trees, the record file and its binding, the results builder;
and the real families' settings handed over as JSON (``from_mapping(to_json(s)) == s``)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from stackfarm import families, matrix
from stackfarm.family import RECORD_SCHEMA, Results, from_json, read_record, to_json, write_record

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, kw_only=True)
class Leaf:
    name: str
    line: int = 0
    ratio: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Tree:
    leaves: tuple[Leaf, ...] = ()
    pair: tuple[str, int] = ("a", 1)
    maybe: Leaf | None = None
    by_name: dict[str, int] = field(default_factory=dict)
    kind: Literal["x", "y"] = "x"


def test_a_tree_round_trips_through_json() -> None:
    tree = Tree(
        leaves=(Leaf(name="a", line=3), Leaf(name="b", ratio=0.5)), maybe=Leaf(name="m"), by_name={"k": 2}
    )
    data = json.loads(json.dumps(to_json(tree)))
    assert data["leaves"][0] == {"name": "a", "line": 3, "ratio": 1.0}
    assert from_json(Tree, data) == tree
    assert from_json(Tree, {}) == Tree(), "a field left out takes its default"
    assert from_json(Leaf, {"name": "n", "ratio": 2}).ratio == 2.0, "an int where a float is declared"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"leaves": [{"name": 1}]}, "Tree.leaves[0].name: expected str, got 1"),
        ({"leaves": [{"line": 1}]}, "Tree.leaves[0]"),
        ({"pair": ["a"]}, "Tree.pair: expected 2 items, got 1"),
        ({"kind": "z"}, "Tree.kind: 'z' is not one of ['x', 'y']"),
        ({"extra": 1}, "Tree: unknown field(s) extra"),
        ({"leaves": [{"name": "a", "line": True}]}, "Tree.leaves[0].line: expected int, got True"),
    ],
)
def test_what_does_not_fit_is_named(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        from_json(Tree, data)


def test_a_record_is_read_only_with_the_bytes_the_verdict_binds(tmp_path: Path) -> None:
    path = write_record(tmp_path / "50-x.json", "50-x", Tree(leaves=(Leaf(name="a"),)))
    doc = json.loads(path.read_text())
    assert (doc["schema"], doc["family"]) == (RECORD_SCHEMA, "50-x")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert read_record(Tree, path, sha) == (Tree(leaves=(Leaf(name="a"),)), None)
    assert read_record(Tree, path, None)[1] == "50-x.json: the verdict binds no record sha256: not shown"
    assert read_record(Tree, path, "0" * 64)[0] is None
    assert read_record(Tree, tmp_path / "none.json", None) == (None, None), "no record, none bound: nothing"
    path.write_text(json.dumps({**doc, "schema": 99}))
    record, problem = read_record(Tree, path, hashlib.sha256(path.read_bytes()).hexdigest())
    assert record is None
    assert problem == f"50-x.json: record schema 99, this stackfarm reads {RECORD_SCHEMA}"


def test_results_accumulate_tuples_and_set_scalars() -> None:
    results = Results(Tree)
    results.add("leaves", Leaf(name="a"))
    results.add("leaves", Leaf(name="b"))
    results.set("kind", "y")
    assert results.build() == Tree(leaves=(Leaf(name="a"), Leaf(name="b")), kind="y")
    with pytest.raises(KeyError, match="Tree has no field 'leafs'"):
        results.add("leafs", Leaf(name="c"))


@pytest.mark.parametrize("suite", ["10-capability", "15-toolchain"])
def test_the_default_matrix_settings_survive_the_hand_over(suite: str) -> None:
    (loaded,) = (s for s in matrix.load(REPO / "matrix.toml").suites if s.name == suite)
    family = families.load(REPO / "suites")[suite]
    assert loaded.parsed_settings is not None
    handed = json.loads(json.dumps(to_json(loaded.parsed_settings)))  # what CellSpec carries
    assert family.settings_of(handed) == loaded.parsed_settings


#: What a suite must not stand on (issue 26): the configuration layer and the resolver. A suite gets its settings,
#: its wheels and its facts through CellSpec (the runner's hand-over), never by reading matrix.toml again.
_CONFIG_LAYER = (
    "stackfarm.matrix",
    "stackfarm.resolve",
    "stackfarm.profile",
    "stackfarm.plan",
    "stackfarm.runner",
)


@pytest.mark.parametrize("suite", sorted(p.name for p in (REPO / "suites").glob("[0-9][0-9]-*")))
def test_no_suite_stands_on_the_config_layer_or_the_resolver(suite: str) -> None:
    """Every module of the suite folder imported in a fresh interpreter: none of them, nor what they import,
    loads matrix, resolve, profile, plan or runner."""
    folder = REPO / "suites" / suite
    modules = sorted(p.stem for p in folder.glob("*.py"))
    probe = (
        "import sys, importlib\n"
        f"sys.path[:0] = [{str(folder)!r}, {str(REPO / 'src')!r}]\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m in {_CONFIG_LAYER!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=folder, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"{suite} stands on {done.stdout.strip()}"
