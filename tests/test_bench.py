"""`stackfarm bench`'s two-runner line (stackfarm.cli.bench): on the fake stack against the real verdict store
server when $STACKFARM_TEST_STORE names one, and a clear "skipped" row when no server answers. No timing is
asserted here: the figures are read in `nox -s bench`."""

from __future__ import annotations

import math
import os
import shutil
import socket
from pathlib import Path

import pytest

from fakestack import OLD, FakeProject, cell_id
from stackfarm import indexwait, store
from stackfarm.cli import bench, main

pytest_plugins = ("fakestack",)


def test_no_server_is_a_skipped_row_with_the_reason(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/store"
    monkeypatch.setenv("STACKFARM_TEST_STORE", url)
    [(name, seconds, note)] = bench._two_runners(main, fake_project.matrix, cell_id(OLD), tmp_path)
    assert "two runners" in name
    assert math.isnan(seconds)
    assert note.startswith(f"skipped: no verdict store answers at {url}")
    assert ".ci/servers.sh" in note


@pytest.mark.integration
@pytest.mark.skipif(
    not os.environ.get("STACKFARM_TEST_STORE"),
    reason="STACKFARM_TEST_STORE is not set: start the verdict store with .ci/servers.sh (as root)",
)
def test_runner_2_reuses_runner_1s_verdict(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "RETRY_DELAYS", (0.0,))
    indexwait.reset()
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    rows = bench._two_runners(main, fake_project.matrix, cell_id(OLD), tmp_path)
    [(first, _, note1), (second, seconds2, note2)] = rows
    assert first.startswith(f"runner 1: {cell_id(OLD)}")
    assert note1 == "exit 0"
    assert second.startswith("runner 2:")
    assert seconds2 > 0
    assert note2.startswith("exit 0, verdict reused")
    assert "runner 1 / runner 2 = " in note2
    assert [c for c, _ in fake_project.runs()] == [cell_id(OLD)], "only runner 1 ran the suite"


def test_no_nox_is_a_skipped_row_saying_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    [(name, seconds, note)] = bench._nox_vs_stackfarm(tmp_path / "matrix.toml", "c", tmp_path / "reports")
    assert name == "warm no-op: nox -s matrix vs stackfarm run"
    assert math.isnan(seconds)
    assert note == "skipped: no nox on PATH (`python3 -m pip install nox` gives it)"


def test_no_noxfile_is_a_skipped_row_naming_the_folder(tmp_path: Path) -> None:
    rows = bench._nox_vs_stackfarm(tmp_path / "matrix.toml", "c", tmp_path / "r", nox="nox", root=tmp_path)
    [(_, seconds, note)] = rows
    assert math.isnan(seconds)
    assert note == f"skipped: {tmp_path} has no noxfile.py (stackfarm is installed, not checked out)"


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("nox") is None, reason="no nox on PATH (pip install nox)")
def test_the_nox_pair_is_timed_side_by_side(fake_project: FakeProject, tmp_path: Path) -> None:
    """The README's first run through `nox -s matrix` and through `stackfarm run`, as warm no-ops (the first
    nox call runs the suite): two rows, the second with the ratio. No timing is asserted."""
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    rows = bench._nox_vs_stackfarm(fake_project.matrix, cell_id(OLD), tmp_path / "reports", repeats=2)
    [(direct_name, direct, direct_note), (nox_name, via_nox, nox_note)] = rows
    assert direct_name == f"warm no-op: stackfarm run --cells {cell_id(OLD)} --suites '00-*' (min of 2)"
    assert nox_name.startswith("warm no-op: nox -s matrix -- the same (min of 2, nox ")
    assert direct > 0
    assert via_nox > 0
    assert direct_note.startswith("median ")
    assert nox_note.startswith(f"{via_nox / direct:.2f}x stackfarm run (target <= 1.3; median ")
    # The first nox call ran the suite through the session; the later calls reuse its verdict (unless the
    # package's sources, an input of every verdict, change meanwhile: a shared tree being edited).
    assert fake_project.runs()[0] == (cell_id(OLD), "00-ok")
