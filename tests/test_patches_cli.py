"""`stackfarm patches check|port|resolve` (stackfarm.cli.patches) and its wheels (stackfarm.sglangtrees).

The wheels are tiny real sglang wheels in find_links folders named by matrix.toml's [indexes]; a [[route]]
sends the newer versions to another folder, so each test shows which index a tree came from. The artifact
cache is a fresh folder per test (STACKFARM_CACHE).
"""

from __future__ import annotations

import argparse
import textwrap
import zipfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from stackfarm import sglangtrees
from stackfarm.artifacts import Cache
from stackfarm.cli import patches as patches_cli
from stackfarm.errors import ConfigError
from stackfarm.matrix import Matrix, load
from stackfarm.patches.git import make_patch
from stackfarm.patches.status import tree_version

TABLE = "sglang/srt/table.py"
OLD = "SIZES = {\n    9: 1,\n    10: 2,\n}\n"
NEW = "MiB = 1\n\n\nSIZES = {\n    9: 1,\n    10: 2,\n}\n"  # moved down: the patch drifts, a port carries it
PATCHED = OLD.replace("    10: 2,\n", "    10: 2,\n    12: 3,\n")
HEADERS = {"Description": "key 12", "Origin": "vendor, tests", "Forwarded": "no"}


def _wheel(folder: Path, version: str, files: Mapping[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(
            f"sglang-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n",
        )
        for rel, text in files.items():
            zf.writestr(rel, text)
    return path


@pytest.fixture
def farm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """matrix.toml with a default index (0.5.9, and a decoy 0.5.10) and a routed one (0.5.10 on), one set."""
    monkeypatch.setenv("STACKFARM_CACHE", str(tmp_path / "cache"))
    _wheel(tmp_path / "old", "0.5.9", {TABLE: OLD})
    _wheel(tmp_path / "old", "0.5.10", {"sglang/decoy.py": "x = 1\n"})  # routed away: never used
    _wheel(tmp_path / "old", "0.5.11", {TABLE: NEW})  # routed away, and the routed index lacks it
    _wheel(tmp_path / "new", "0.5.10", {TABLE: NEW})
    folder = tmp_path / "patches" / "table"
    folder.mkdir(parents=True)
    (folder / "0001-table.patch").write_text(make_patch(TABLE, OLD, PATCHED, HEADERS), encoding="utf-8")
    (folder / "series").write_text("0001-table.patch\n", encoding="utf-8")
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(
        textwrap.dedent(
            """\
            [axes]
            cuda = ["12.8"]
            torch = ["2.9.1"]
            sgl_kernel = ["0.3.21"]
            flashinfer = ["0.6.3"]
            sglang = ["0.5.9"]
            python = ["3.11"]

            [indexes.old]
            find_links = "old"
            default = true

            [indexes.new]
            find_links = "new"

            [[route]]
            requirement = "sglang>=0.5.10"
            index = "new"

            [patches.table]
            applies_to = "sglang>=0.5.9,<0.5.10"
            """
        ),
        encoding="utf-8",
    )
    return matrix


def _cli(argv: list[str]) -> int:
    """``stackfarm patches ARGV...`` as the top-level command line runs it."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    patches_cli.register(sub)
    args = parser.parse_args(["patches", *argv])
    assert args.func is patches_cli.run
    code: int = args.func(args)
    return code


def test_available_versions_follow_the_routes(farm: Path) -> None:
    assert sglangtrees.available_versions(load(farm)) == ["0.5.9", "0.5.10"]


def test_trees_come_from_the_routed_index_through_the_shared_cache(farm: Path) -> None:
    matrix: Matrix = load(farm)
    trees = sglangtrees.sglang_trees(matrix, ["0.5.9", "0.5.10"])
    assert (trees["0.5.9"] / TABLE).read_text() == OLD
    assert (trees["0.5.10"] / TABLE).read_text() == NEW  # from "new", not the decoy on the default index
    assert tree_version(trees["0.5.10"]) == "0.5.10"
    cache = Cache()
    assert all(tree.parent == cache.root / "trees" for tree in trees.values())
    assert not (cache.root / "resolved").exists()  # find_links answers are never memoised


def test_the_download_cap_skips_what_is_not_cached_yet(farm: Path) -> None:
    matrix = load(farm)
    sglangtrees.sglang_trees(matrix, ["0.5.9"])
    said: list[str] = []
    trees = sglangtrees.sglang_trees(matrix, ["0.5.9", "0.5.10"], max_mb=0, echo=said.append)
    assert list(trees) == ["0.5.9"]
    assert said == ["skipping sglang 0.5.10: 0 MB more would pass --max-mb 0"]


def test_check_prints_the_table(farm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["--matrix", str(farm), "check"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["set/patch", "0.5.9", "0.5.10"]
    # 0.5.10 is past the range (a preview, *) and moved the table down: the port below carries the patch.
    assert out.splitlines()[2].split() == ["table/0001-table.patch", "applies", "DRIFT*"]
    assert "first fails on sglang 0.5.10 (drift)" in out


def test_check_json_and_matrix_after_the_command(farm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["check", "--matrix", str(farm), "--json", "--version", "0.5.9"]) == 0
    out = capsys.readouterr().out
    assert '"status": "applied"' in out
    assert '"version": "0.5.10"' not in out


def test_check_fails_when_an_in_range_patch_drifts(farm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (farm.parent / "patches" / "table" / "0001-table.patch").write_text(
        make_patch(TABLE, OLD.replace("9: 1", "9: 7"), PATCHED.replace("9: 1", "9: 7"), HEADERS)
    )
    assert _cli(["--matrix", str(farm), "check", "--version", "0.5.9"]) == 1
    assert "first fails on sglang 0.5.9 (drift)" in capsys.readouterr().out


def test_port_then_resolve(farm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ported"
    code = _cli(
        ["--matrix", str(farm), "port", "table", "--from", "0.5.9", "--to", "0.5.10", "--out", str(out)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "port table: sglang 0.5.9 -> 0.5.10" in printed
    assert "verify on sglang 0.5.10: 0001-table.patch applied" in printed
    assert (out / "0001-table.patch").is_file()
    assert _cli(["resolve", str(out), "--to", "0.5.10", "--matrix", str(farm)]) == 0
    assert "verify on sglang 0.5.10: 0001-table.patch applied" in capsys.readouterr().out


def test_errors_are_left_to_the_caller(farm: Path) -> None:
    with pytest.raises(ConfigError, match="no patch set `tabel`"):
        _cli(["--matrix", str(farm), "port", "tabel", "--from", "0.5.9", "--to", "0.5.10"])


def test_patches_needs_a_command() -> None:
    with pytest.raises(SystemExit):
        _cli([])


def test_check_with_every_release_past_the_cap(farm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["--matrix", str(farm), "check", "--max-mb", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("no release was checked")
    assert "skipping sglang 0.5.9" in captured.err
