"""The host backend: a stack already installed in a given Python."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.version import Version

from stackfarm.backends.host import HostBackend
from stackfarm.errors import CellError
from stackfarm.plan import Cell, Component


def _cell(*components: tuple[str, str]) -> Cell:
    return Cell(
        id="host-cell",
        values=(("cuda", "12.8"),),
        components=tuple(Component(axis=d, distribution=d, version=v, index="pypi") for d, v in components),
        patch_sets=(),
    )


def test_probe_reports_version_and_location_of_this_python() -> None:
    import packaging

    found = HostBackend(sys.executable).probe(["packaging", "no-such-distribution-xyz"])
    assert set(found) == {"packaging"}
    assert Version(found["packaging"]["version"]) == Version(packaging.__version__)
    assert (Path(found["packaging"]["root"]) / "packaging").is_dir()


def test_realise_points_each_component_at_its_site_packages(tmp_path: Path) -> None:
    backend = HostBackend(sys.executable)
    (comp,) = backend.realise(_cell(("packaging", "0.0")), {}, tmp_path, lambda _: None)
    assert comp.version == "0.0", "the claim is kept: 00-stack compares it with what is installed"
    assert comp.source == f"host:{sys.executable}"
    assert (Path(comp.root) / "packaging" / "version.py").is_file()


def test_a_missing_component_is_left_for_00_stack_to_fail(tmp_path: Path) -> None:
    backend = HostBackend(sys.executable)
    cell = _cell(("packaging", "1"), ("no-such-distribution-xyz", "1.0"))
    _, missing = backend.realise(cell, {}, tmp_path, lambda _: None)
    assert missing.root == "", "an empty root marks a component the host does not have"


def test_a_host_without_any_component_cannot_realise_the_cell(tmp_path: Path) -> None:
    backend = HostBackend(sys.executable)
    with pytest.raises(CellError, match="has none of host-cell's components"):
        backend.realise(_cell(("no-such-distribution-xyz", "1.0")), {}, tmp_path, lambda _: None)


def test_an_unusable_python_is_a_clear_cell_error(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'this is not python' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(CellError, match="could not be probed: this is not python"):
        HostBackend(str(fake)).probe(["packaging"])
