"""stackfarm.tomlread: TOML is read with the standard library (tomllib; tomli on Python 3.10), tomlkit only
where TOML is written; errors keep their positions (file:line, and column)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stackfarm import tomlread
from stackfarm.backends.docker import backend
from stackfarm.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_a_document_reads_as_plain_data(tmp_path: Path) -> None:
    data = tomlread.loads(tmp_path / "m.toml", '[axes]\ncuda = ["12.8"]\n[[include]]\nx = 1.5\n')
    assert data == {"axes": {"cuda": ["12.8"]}, "include": [{"x": 1.5}]}
    assert type(data["axes"]) is dict  # plain dicts: no wrapper types reach the schema checks


def test_an_unterminated_string_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    with pytest.raises(ConfigError) as info:
        tomlread.loads(path, '[axes]\ncuda = ["12.8"]\nname = "open\n')
    assert info.value.line == 3
    assert re.search(r"malformed TOML: .*\(line 3, column \d+\)", str(info.value))
    assert str(info.value).startswith(f"{path}:3: ")


def test_a_table_declared_twice_through_an_array_of_tables(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        tomlread.loads(tmp_path / "m.toml", "[[include]]\na = 1\n\n[include]\nb = 2\n")
    assert info.value.line == 4
    assert "[include] is defined twice (first at line 1)" in str(info.value)


def test_a_key_set_twice_in_a_sub_table_names_both_lines(tmp_path: Path) -> None:
    text = '[axes]\ncuda = ["12.8"]\n\n[suites."10-capability"]\nenabled = true\n# again\nenabled = false\n'
    with pytest.raises(ConfigError) as info:
        tomlread.loads(tmp_path / "m.toml", text)
    assert info.value.line == 7
    assert "`enabled` is defined twice (first at line 5)" in str(info.value)


def test_tomlkit_is_imported_only_where_toml_is_written() -> None:
    """Every reader goes through the standard library (stackfarm.tomlread): a module that imports tomlkit
    writes TOML with it (tomlkit.dumps); the noxfile and the image's tools do not name it."""
    importing = [
        p for p in sorted((REPO / "src").rglob("*.py")) if "import tomlkit" in p.read_text(encoding="utf-8")
    ]
    readers = [
        str(p.relative_to(REPO)) for p in importing if "tomlkit.dump" not in p.read_text(encoding="utf-8")
    ]
    assert readers == []
    assert "tomlkit" not in (REPO / "noxfile.py").read_text(encoding="utf-8")
    assert not [pin for pin in backend.DEFAULT_TOOLS if pin.startswith("tomlkit")]


def test_the_images_tools_read_toml_on_every_python() -> None:
    """The suites' tools in a cell image: tomli only where the cell's Python has no tomllib."""
    pins = [p for p in backend.DEFAULT_TOOLS if p.startswith("tomli")]
    assert pins, "a Python 3.10 cell needs tomli to read matrix.toml"
    assert all(backend._applies(p, "3.10") for p in pins)
    assert not any(backend._applies(p, "3.11") for p in pins)
    assert backend._pin(pins[0])[0] == "tomli"
    assert all(backend._applies(p, "3.11") for p in backend.DEFAULT_TOOLS if ";" not in p)
