"""Which cell images a cache's runs used, and removing those no recent run used (`stackfarm cache prune`).

Every realise writes `docker-image.json` into the cell's work dir (`<cache>/cells/<cell>-<hash>/`): the image's
local tags, content id, input hash and when it was last used. A run records the work dirs it used
(`cachekeep.record_use`), so an image is "used by a recent run" exactly when a work dir that names it is one
`cachekeep.prune` keeps. `prune_images` is given the work dirs prune removed (or would remove), reads their
records, and untags the images that no kept work dir names (`docker image rm`, never forced: an image a
container still uses stays, and is listed as kept with the engine's reason). Images labelled as cells that no
record of this cache names (another cache's, or older than these records) are left alone and counted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...files import write_atomic
from .common import LABEL_CELL, DockerError, EngineError

if TYPE_CHECKING:
    from .engine import DockerEngine

#: The record's name in a cell's work dir.
RECORD = "docker-image.json"
#: The build log's name, in the work dir and in reports/<cell>/.
BUILD_LOG = "docker-build.log"


@dataclass(frozen=True, kw_only=True)
class CellImage:
    """The image a cell was realised as."""

    #: `stackfarm/<cell id>:<first 16 hex of input_hash>`.
    tag: str
    #: sha256 over the image's inputs (context_digest): what the tag is keyed by.
    input_hash: str
    #: The engine's content id of the image, `sha256:...` (`docker image inspect --format {{.Id}}`).
    image_id: str
    #: `repository@sha256:...` when the image is in a registry (pushed or pulled), else None.
    repo_digest: str | None
    #: Whether this realise built it (False: the engine already had the tag, or it was pulled).
    built: bool
    seconds: float
    #: Whether this realise pulled it from the registry (and built nothing).
    pulled: bool = False
    #: The image's name in the registry, when one is configured.
    remote: str | None = None
    #: What realise did, for reports/<cell>/docker-build.log: the build's log, or why nothing was built.
    log: Path | None = None


@dataclass(frozen=True, kw_only=True)
class ImageRecord:
    cell: str
    #: Every tag this cache's realise gave the image in the engine (the local one, the registry's ones).
    tags: tuple[str, ...]
    image_id: str
    input_hash: str
    #: time.time() of the realise that last used it.
    last_used: float
    #: "built", "pulled" or "found" (the engine had it).
    how: str

    @classmethod
    def of(cls, cell: str, image: CellImage, *, local_tags: Iterable[str]) -> ImageRecord:
        how = "pulled" if image.pulled else "built" if image.built else "found"
        return cls(
            cell=cell,
            tags=tuple(dict.fromkeys([image.tag, *local_tags])),
            image_id=image.image_id,
            input_hash=image.input_hash,
            last_used=time.time(),
            how=how,
        )


def write_record(workdir: Path, record: ImageRecord) -> Path:
    path = workdir / RECORD
    write_atomic(path, json.dumps(asdict(record), indent=2, sort_keys=True) + "\n")
    return path


def read_record(workdir: Path) -> ImageRecord | None:
    """The work dir's image record; None when it has none or it is unreadable (then it names no image)."""
    try:
        data: dict[str, Any] = json.loads((workdir / RECORD).read_text(encoding="utf-8"))
        return ImageRecord(
            cell=str(data["cell"]),
            tags=tuple(str(t) for t in data["tags"]),
            image_id=str(data["image_id"]),
            input_hash=str(data["input_hash"]),
            last_used=float(data["last_used"]),
            how=str(data.get("how", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_records(cache_root: Path) -> dict[Path, ImageRecord]:
    """Every cell work dir's image record in the cache."""
    cells = cache_root / "cells"
    found = {}
    for workdir in sorted(cells.iterdir()) if cells.is_dir() else ():
        record = read_record(workdir)
        if record is not None:
            found[workdir] = record
    return found


@dataclass
class ImagesPruned:
    #: (tag, cell) of every tag removed (or, dry, that would be).
    removed: list[tuple[str, str]] = field(default_factory=list)
    #: (tag, why) of every tag that should have gone but stayed (in use by a container, ...).
    kept: list[tuple[str, str]] = field(default_factory=list)
    #: Bytes of the images whose last tag went (layers other images share are not freed).
    freed: int = 0
    #: Cell images in the engine that no record of this cache names.
    unknown: int = 0
    #: Why images were not looked at (no engine), else "".
    note: str = ""


def prune_images(
    records: dict[Path, ImageRecord],
    doomed: Iterable[Path],
    *,
    engine: DockerEngine | None = None,
    dry_run: bool = False,
) -> ImagesPruned:
    """Remove the tags of the images whose every naming work dir is in `doomed` (what cachekeep.prune removed
    or would remove). `records` are the cache's records read before prune removed the work dirs."""
    out = ImagesPruned()
    gone = {Path(p).absolute() for p in doomed}
    keep_ids = {r.image_id for w, r in records.items() if w.absolute() not in gone}
    keep_tags = {t for w, r in records.items() if w.absolute() not in gone for t in r.tags}
    victims = {
        tag: record
        for w, record in records.items()
        if w.absolute() in gone and record.image_id not in keep_ids
        for tag in record.tags
        if tag not in keep_tags
    }
    if engine is None:
        from .engine import DockerEngine

        engine = DockerEngine()
    try:
        engine.check()
    except EngineError as exc:
        if victims:
            out.note = f"cell images were not looked at: {str(exc).splitlines()[0]}"
        return out
    known = {t for r in records.values() for t in r.tags}
    out.unknown = sum(1 for t in engine.images_labelled(LABEL_CELL) if t not in known)
    sizes: dict[str, int] = {}
    for tag, record in sorted(victims.items()):
        if engine.image_id(tag) != record.image_id:
            continue  # gone already, or the tag now names another image: not ours to remove
        sizes.setdefault(record.image_id, _size(engine, tag))
        problem = None if dry_run else engine.remove_image(tag)
        if problem is None:
            out.removed.append((tag, record.cell))
        else:
            out.kept.append((tag, problem))
    for image_id, size in sizes.items():
        if dry_run or engine.image_id(image_id) is None:  # its last tag went: the engine dropped it
            out.freed += size
    return out


def _size(engine: DockerEngine, tag: str) -> int:
    try:
        return engine.image_size(tag)
    except DockerError:  # a tag that vanished meanwhile frees nothing we can count
        return 0


__all__ = [
    "BUILD_LOG",
    "RECORD",
    "CellImage",
    "ImageRecord",
    "ImagesPruned",
    "prune_images",
    "read_record",
    "read_records",
    "write_record",
]
