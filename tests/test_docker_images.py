"""docker.images: the record of which image a cell's work dir used, and `stackfarm cache prune` removing the cell
images that no recent run used: the rules against a stand-in engine, and the command against the real one
(tiny labelled images, `@pytest.mark.docker`)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stackfarm.backends.docker.common import LABEL_CELL
from stackfarm.backends.docker.engine import DockerEngine, EngineInfo
from stackfarm.backends.docker.images import ImageRecord, prune_images, read_record, write_record
from stackfarm.cli import main
from test_docker_support import local_base, real_engine

OLD = 7200.0  # seconds: older than cachekeep.RECENT, so prune may take it


def _record(cell: str, tags: tuple[str, ...], image_id: str) -> ImageRecord:
    return ImageRecord(
        cell=cell, tags=tags, image_id=image_id, input_hash="ab" * 32, last_used=time.time(), how="built"
    )


class _Engine(DockerEngine):
    """An engine that holds `images` (tag -> id); `busy` tags are used by a container and refuse removal."""

    def __init__(
        self, images: dict[str, str], busy: frozenset[str] = frozenset(), unknown: tuple[str, ...] = ()
    ) -> None:
        super().__init__("docker")
        self.images = dict(images)
        self.busy = set(busy)
        self.unknown = unknown
        self.removed: list[str] = []

    def check(self) -> EngineInfo:
        return EngineInfo(executable="docker", client="20.10", server="20.10", gpu=False, root_dir="")

    def images_labelled(self, key: str, value: str | None = None) -> list[str]:
        return [*self.images, *self.unknown]

    def image_id(self, ref: str) -> str | None:
        return self.images.get(ref) or (ref if ref in self.images.values() else None)

    def image_size(self, ref: str) -> int:
        return 1_000_000

    def remove_image(self, ref: str) -> str | None:
        if ref in self.busy:
            return "conflict: unable to remove repository reference (must force) - container abc is using it"
        self.images.pop(ref, None)
        self.removed.append(ref)
        return None


def test_records_round_trip_and_unreadable_ones_name_nothing(tmp_path: Path) -> None:
    record = _record("cell-a", ("stackfarm/cell-a:1", "127.0.0.1:5000/stackfarm/cell-a:1"), "sha256:1")
    write_record(tmp_path / "w", record)
    assert read_record(tmp_path / "w") == record
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "docker-image.json").write_text("{not json")
    assert read_record(tmp_path / "bad") is None
    assert read_record(tmp_path / "none") is None


def test_only_images_no_kept_work_dir_names_go(tmp_path: Path) -> None:
    old, kept, shared = tmp_path / "old", tmp_path / "kept", tmp_path / "shared"
    records = {
        old: _record("a", ("stackfarm/a:1", "reg:5000/stackfarm/a:1"), "sha256:1"),
        kept: _record("b", ("stackfarm/b:2",), "sha256:2"),
        # An old work dir naming the image a kept one names (another matrix, same inputs): it stays.
        shared: _record("b", ("stackfarm/b:2", "stackfarm/b-alias:2"), "sha256:2"),
    }
    engine = _Engine(
        {"stackfarm/a:1": "sha256:1", "reg:5000/stackfarm/a:1": "sha256:1", "stackfarm/b:2": "sha256:2"},
        unknown=("stackfarm/other-cache:9",),
    )
    dry = prune_images(records, [old, shared], engine=engine, dry_run=True)
    assert sorted(dry.removed) == [("reg:5000/stackfarm/a:1", "a"), ("stackfarm/a:1", "a")]
    assert engine.removed == []
    assert dry.freed == 1_000_000
    done = prune_images(records, [old, shared], engine=engine)
    assert sorted(engine.removed) == ["reg:5000/stackfarm/a:1", "stackfarm/a:1"]
    assert done.freed == 1_000_000  # its last tag went: the engine dropped it
    assert "stackfarm/b:2" in engine.images
    assert done.unknown == 1  # another cache's image (or one older than records): left alone, counted


def test_an_image_a_container_uses_stays_and_says_why(tmp_path: Path) -> None:
    records = {tmp_path / "old": _record("a", ("stackfarm/a:1",), "sha256:1")}
    engine = _Engine({"stackfarm/a:1": "sha256:1"}, busy=frozenset({"stackfarm/a:1"}))
    done = prune_images(records, [tmp_path / "old"], engine=engine)
    assert done.removed == []
    assert [tag for tag, _ in done.kept] == ["stackfarm/a:1"]
    assert "container abc is using it" in done.kept[0][1]
    assert done.freed == 0


def test_a_tag_that_now_names_another_image_is_not_ours(tmp_path: Path) -> None:
    records = {tmp_path / "old": _record("a", ("stackfarm/a:1",), "sha256:1")}
    engine = _Engine({"stackfarm/a:1": "sha256:rebuilt"})
    assert prune_images(records, [tmp_path / "old"], engine=engine).removed == []
    assert engine.removed == []


def test_without_an_engine_prune_says_images_were_not_looked_at(tmp_path: Path) -> None:
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    records = {tmp_path / "old": _record("a", ("stackfarm/a:1",), "sha256:1")}
    done = prune_images(records, [tmp_path / "old"], engine=DockerEngine(str(fake)))
    assert done.removed == []
    assert done.note.startswith("cell images were not looked at: the Docker engine does not answer")


# -- `stackfarm cache prune` against the real engine ---------------------------------------------------------


def _tiny_image(engine: DockerEngine, base: str, tmp_path: Path, tag: str, cell: str) -> str:
    folder = tmp_path / tag.replace("/", "_").replace(":", "_")
    folder.mkdir()
    (folder / "Dockerfile").write_text(f"FROM {base}\nLABEL {LABEL_CELL}={cell}\n")
    engine.build(
        dockerfile=folder / "Dockerfile",
        context=folder,
        tag=tag,
        build_args={},
        labels={},
        secrets={},
        log=folder / "build.log",
        timeout=300,
    )
    found = engine.image_id(tag)
    assert found is not None
    return found


def _aged(path: Path, seconds: float = OLD) -> None:
    when = time.time() - seconds
    os.utime(path, (when, when))


@pytest.fixture
def images(tmp_path: Path) -> Iterator[tuple[DockerEngine, str, str]]:
    """Two tiny cell images (labels of their own), removed again whatever the test did."""
    engine = real_engine()
    base = local_base(engine)
    run = uuid.uuid4().hex[:12]
    old, new = f"stackfarm-test/prune-old-{run}:1", f"stackfarm-test/prune-new-{run}:1"
    _tiny_image(engine, base, tmp_path, old, f"old-{run}")
    _tiny_image(engine, base, tmp_path, new, f"new-{run}")
    yield engine, old, new
    for tag in (old, new):
        engine.remove_image(tag)


@pytest.mark.docker
def test_cache_prune_removes_the_cell_images_only_old_runs_used(
    images: tuple[DockerEngine, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine, old_tag, new_tag = images
    cache = tmp_path / "cache"
    monkeypatch.setenv("STACKFARM_CACHE", str(cache))
    now = time.time()
    for n, tag in enumerate((old_tag, new_tag)):
        workdir = cache / "cells" / f"cell{n}-{'0' * 12}"
        image_id = engine.image_id(tag)
        assert image_id is not None
        write_record(workdir, _record(f"cell{n}", (tag,), image_id))
        _aged(workdir)
        runs = cache / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        (runs / f"run{n}.json").write_text(
            json.dumps({"run_id": f"run{n}", "time": now - OLD + n * 100, "paths": [f"cells/{workdir.name}"]})
        )
    assert main(["cache", "prune", "--keep-runs", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would remove: docker image {old_tag} (cell cell0)" in out
    assert engine.image_id(old_tag) is not None
    assert main(["cache", "prune", "--keep-runs", "1"]) == 0
    out = capsys.readouterr().out
    assert f"removed: docker image {old_tag} (cell cell0)" in out
    assert "docker: removed 1 cell image tags" in out
    assert engine.image_id(old_tag) is None
    assert engine.image_id(new_tag) is not None  # the last run's image stays
    assert not (cache / "cells" / f"cell0-{'0' * 12}").exists()
