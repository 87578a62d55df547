"""`bundle`: a cell's image as a tarball (`docker save`), for a runner without a registry or a network.

The runner there gives the tarball as its [docker] base or loads it itself (`docker load`).
"""

from __future__ import annotations

from pathlib import Path

from .common import LABEL_CELL, DockerError
from .engine import DockerEngine


def bundle(cell_image_tag: str, out_path: Path, *, engine: DockerEngine | None = None) -> Path:
    """Write a cell's image as a tarball (`docker save`) for a runner without network; `docker load` reads it.

    `cell_image_tag` is the image tag (`DockerBackend.images[cell_id].tag` after realise), or a cell id when the
    engine holds exactly one stackfarm image of that cell: with several (another patch series, another
    Dockerfile) guessing would ship the wrong one, so they are listed instead."""
    engine = engine or DockerEngine()
    ref = cell_image_tag
    if engine.image_id(ref) is None:
        tagged = engine.images_labelled(LABEL_CELL, cell_image_tag)
        if not tagged:
            raise DockerError(
                f"no image {cell_image_tag!r} and no stackfarm image of a cell with that id; build it first: "
                f"nox -s matrix -- --backend docker --cells {cell_image_tag}"
            )
        if len(tagged) > 1:
            raise DockerError(
                f"{len(tagged)} images of cell {cell_image_tag}; name the one to bundle:\n    "
                + "\n    ".join(tagged)
            )
        ref = tagged[0]
    return engine.save(ref, out_path)


__all__ = ["bundle"]
