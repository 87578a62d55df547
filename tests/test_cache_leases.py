"""The cache respects live runs: `cache prune` and `cache verify --repair` never remove what a running run uses.

A run's first Cache.record_use takes a lease on its record (a shared flock on locks/leases/<run>.lease) and holds
it until its process ends or the Cache is closed. Prune keeps everything a leased run recorded whatever
--keep-runs says, repair leaves the damage such a run uses in place; both skip an entry whose lock a run holds
(a cell's work dir being built, a download), and both say what they kept. The runs here are real other
processes: a Python child that records and waits, and a whole `stackfarm run` on the fake stack.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakestack import OLD, FakeProject, cell_id
from stackfarm import cachekeep, verdict
from stackfarm.artifacts import Artifact, Cache, Source, Target, find_artifact
from stackfarm.cli import main
from stackfarm.errors import ExitCode

pytest_plugins = ("fakestack",)

TARGET = Target(python="3.11", platform="manylinux_2_39_x86_64")


def _artifact(project: FakeProject, name: str = "sglang", version: str = "0.5.9") -> Artifact:
    return find_artifact(Source(name="local", find_links=project.wheels), name, version, TARGET)


def _aged(path: Path, seconds: float = 2 * cachekeep.RECENT) -> Path:
    when = time.time() - seconds
    os.utime(path, (when, when), follow_symlinks=False)
    return path


def _age_everything(root: Path) -> None:
    for area in ("blobs/sha256", "trees", "cells"):
        for entry in (root / area).iterdir() if (root / area).is_dir() else ():
            _aged(entry)


class Child:
    """Another process that runs `code` (with `cache` = Cache(root)), prints "ready", then waits until
    stop() (or the test's end) kills it."""

    def __init__(self, root: Path, code: str) -> None:
        script = (
            "import sys\nfrom pathlib import Path\nfrom stackfarm.artifacts import Cache\n"
            f"cache = Cache(Path({str(root)!r}))\n" + textwrap.dedent(code) + "\nprint('ready', flush=True)\n"
            "sys.stdin.read()\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line == "ready\n", f"the child did not get ready: {line!r}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.stop()


def _recorded_cell(project: FakeProject, cache: Cache, name: str) -> tuple[Artifact, Path]:
    """An unpacked sglang wheel and a cell work dir under cells/<name>, as a run leaves them."""
    art = _artifact(project)
    cache.unpack(art)
    workdir = project.cache / "cells" / name
    (workdir / "sglang-patched").mkdir(parents=True)
    (workdir / "cell.json").write_text("{}")
    return art, workdir


# --------------------------------------------------------------------------- prune


def test_prune_keeps_what_a_live_run_in_another_process_uses_and_says_so(
    fake_project: FakeProject, children: list[Child], capsys: pytest.CaptureFixture[str]
) -> None:
    """`cache prune --keep-runs 0` used to delete a running run's work dir, tree and wheel."""
    cache = Cache(fake_project.cache)
    art, workdir = _recorded_cell(fake_project, cache, "cell-live")
    old_art = _artifact(fake_project, "torch", "2.9.1")  # what a finished run used
    cache.unpack(old_art)
    cachekeep.record_use(fake_project.cache, "finished-run", [cache.tree_path(old_art)])
    paths = [cache.blob_path(art), cache.tree_path(art), workdir]
    names = [str(p) for p in paths]
    children.append(
        Child(fake_project.cache, f"cache.record_use('live/run 1', [Path(p) for p in {names!r}])")
    )
    _age_everything(fake_project.cache)

    assert main(["cache", "prune", "--keep-runs", "0"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "kept 3 paths of live run live/run 1 (it is still running)" in out
    assert all(p.exists() for p in paths), out
    assert not cache.tree_path(old_art).exists()  # the finished run's tree went
    assert (workdir / "cell.json").is_file()
    records = sorted(p.name for p in (fake_project.cache / "runs").glob("*.json"))
    assert len(records) == 1, records  # the live run's record stays, the finished one's went
    assert "live_run_1" in records[0]

    children[0].stop()  # the run ends: its lease goes with its process
    assert main(["cache", "prune", "--keep-runs", "0"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "live run" not in out
    assert not any(p.exists() for p in paths), out


def test_a_run_closing_its_cache_gives_its_lease_back(fake_project: FakeProject) -> None:
    cache = Cache(fake_project.cache)
    art, workdir = _recorded_cell(fake_project, cache, "cell-1")
    cache.record_use("r1", [cache.tree_path(art), workdir])
    cache.record_use("r1", [cache.blob_path(art)])  # the same lease: one per run and Cache
    lease = cachekeep.lease_path(fake_project.cache, "r1")
    assert cachekeep._held(lease)
    cache.close()
    assert not cachekeep._held(lease)
    with Cache(fake_project.cache) as other:
        other.record_use("r2", [workdir])
        assert cachekeep._held(cachekeep.lease_path(fake_project.cache, "r2"))
    assert not cachekeep._held(cachekeep.lease_path(fake_project.cache, "r2"))
    forgotten = Cache(fake_project.cache)
    forgotten.record_use("r3", [workdir])
    del forgotten
    gc.collect()  # a Cache nobody refers to any more gives its leases back too
    assert not cachekeep._held(cachekeep.lease_path(fake_project.cache, "r3"))


def test_prune_skips_a_work_dir_whose_lock_a_run_holds(
    fake_project: FakeProject, children: list[Child], capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that holds a cell's work dir (Cache.lock) without a record of it keeps it all the same."""
    cache = Cache(fake_project.cache)
    art, workdir = _recorded_cell(fake_project, cache, "cell-building")
    cachekeep.record_use(fake_project.cache, "finished-run", [cache.tree_path(art)])
    children.append(
        Child(fake_project.cache, f"held = cache.lock(Path({str(workdir)!r}), timeout=0)\nheld.__enter__()")
    )
    _age_everything(fake_project.cache)
    assert main(["cache", "prune", "--keep-runs", "0", "--dry-run"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "kept: cells/cell-building: a running stackfarm holds its lock" in out
    assert "would remove: cells/cell-building" not in out
    assert main(["cache", "prune", "--keep-runs", "0"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "kept: cells/cell-building: a running stackfarm holds its lock" in out
    assert workdir.is_dir()
    assert not cache.tree_path(art).exists()


# --------------------------------------------------------------------------- verify --repair


def test_repair_leaves_the_damage_a_live_run_uses_and_says_so(
    fake_project: FakeProject, children: list[Child], capsys: pytest.CaptureFixture[str]
) -> None:
    cache = Cache(fake_project.cache)
    art = _artifact(fake_project)
    other = _artifact(fake_project, "torch", "2.9.1")
    for a in (art, other):
        cache.unpack(a)
    tree = cache.tree_path(art)
    (tree / "sglang").chmod(0o755)
    (tree / "sglang" / "__init__.py").unlink()  # damaged, and used by the live run
    blob = cache.blob_path(other)
    blob.chmod(0o644)
    blob.write_bytes(b"cut")  # damaged, used by nobody
    children.append(Child(fake_project.cache, f"cache.record_use('live', [Path({str(tree)!r})])"))

    assert main(["cache", "verify", "--repair"]) == ExitCode.ENVIRONMENT
    out = capsys.readouterr().out
    assert "removed 1 damaged entry" in out
    assert "kept 1 damaged path of live run live" in out
    assert "once that run has finished" in out
    assert tree.is_dir()
    assert not blob.exists()

    children[0].stop()
    assert main(["cache", "verify", "--repair"]) == ExitCode.OK
    assert "removed 1 damaged entry" in capsys.readouterr().out
    assert not tree.exists()


# --------------------------------------------------------------------------- a whole run


#: A suite that says it started, then waits (up to a minute) until the test lets it go on.
_WAITING_SUITE = """
import time
from pathlib import Path


def test_waits_for_the_prune():
    Path({started!r}).write_text("started")
    deadline = time.monotonic() + 60
    while not Path({go!r}).exists():
        assert time.monotonic() < deadline, "nobody said go"
        time.sleep(0.05)
"""


def test_prune_during_a_real_run_keeps_its_work_dir_and_the_run_passes(
    fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run used to fail (its tree and work dir gone under it) and that failure was stored."""
    started, go = fake_project.root / "started", fake_project.root / "go"
    folder = fake_project.suites / "00-wait"
    folder.mkdir(parents=True)
    (folder / "test_it.py").write_text(_WAITING_SUITE.format(started=str(started), go=str(go)))
    fake_project.suite_config["00-wait"] = {}
    fake_project.suite("01-ok", "pass")
    fake_project.write_matrix([OLD])
    run = subprocess.Popen(
        [sys.executable, "-m", "stackfarm", *fake_project.argv()],
        cwd=fake_project.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the suite never started"
        # A run that has gone on for longer than prune's grace period (RECENT): nothing it made is "recent".
        monkeypatch.setattr(cachekeep, "RECENT", 0.0)
        assert main(["cache", "prune", "--keep-runs", "0"]) == ExitCode.OK
        out = capsys.readouterr().out
        workdirs = list((fake_project.cache / "cells").iterdir())
        assert len(workdirs) == 1, f"the running cell's work dir was pruned:\n{out}"
        assert "paths of live run" in out, out
        go.write_text("go")
        output, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == ExitCode.OK, output
    report = verdict.read(fake_project.reports / cell_id(OLD) / "verdict.json").report
    assert str(report.status) == "passed", report
