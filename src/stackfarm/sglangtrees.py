"""Unpacked SGLang wheels for checking and porting, fetched through the artifacts layer.

It stands above the resolver, not in stackfarm.patches: the patch readers work on trees that they are handed,
and this module is what fetches them (`stackfarm patches`, `stackfarm upgrade`, the corpus). Inside patches/
it dragged the whole patches room above resolve, plan and matrix.

Every wheel is found by ``stackfarm.resolve.Resolver`` on the index matrix.toml names for its version
(``[indexes]`` and ``[[route]]`` are honoured) and kept in the shared sha256 cache, so a tree unpacked here is
the very tree a cell of the farm uses, and the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from .artifacts import Artifact, Cache, list_versions
from .matrix import Matrix
from .patches.model import DISTRIBUTION
from .plan import Component
from .resolve import Resolver


def sglang_component(matrix: Matrix, version: str) -> Component:
    """The sglang wheel of ``version``, on the index matrix.toml routes it to."""
    return Component(
        axis="sglang",
        distribution=DISTRIBUTION,
        version=version,
        index=matrix.index_for(DISTRIBUTION, version),
    )


def available_versions(matrix: Matrix) -> list[str]:
    """The sglang versions with a wheel on the index that serves them, oldest first.

    The default index lists what it has; an index a ``[[route]]`` sends sglang to adds the versions the route
    sends there. A version counts only where ``index_for`` would fetch it from.
    """
    names = [matrix.default_index] + [
        r.index for r in matrix.routes if canonicalize_name(r.requirement.name) == DISTRIBUTION
    ]
    found: set[str] = set()
    for name in dict.fromkeys(names):
        listed = list_versions(matrix.indexes[name], DISTRIBUTION)
        found.update(v for v in listed if matrix.index_for(DISTRIBUTION, v) == name)
    return sorted(found, key=Version)


def sglang_trees(
    matrix: Matrix,
    versions: Sequence[str],
    *,
    max_mb: float = float("inf"),
    echo: Callable[[str], None] = print,
    cache: Cache | None = None,
) -> dict[str, Path]:
    """Unpacked sglang wheels for ``versions``, fetched in that order; new downloads capped at ``max_mb``.

    A version whose wheel is neither fetched nor unpacked yet costs its size; one that would pass the cap is
    skipped (said through ``echo``), so put the most telling versions first (see ``download_order``).
    """
    cache = cache or Cache()
    resolver = Resolver(matrix, cache)
    python = matrix.axes["python"][0]
    budget = max_mb * 1024 * 1024
    todo: list[tuple[str, Artifact]] = []
    for version in versions:
        artifact = resolver.artifact(sglang_component(matrix, version), python)
        cached = cache.unpacked(artifact) is not None or cache.blob_path(artifact).is_file()
        cost = 0 if cached else (artifact.size or 0)
        if cost > budget:
            echo(f"skipping sglang {version}: {cost / 2**20:.0f} MB more would pass --max-mb {max_mb:.0f}")
            continue
        budget -= cost
        todo.append((version, artifact))

    def unpacked(item: tuple[str, Artifact]) -> tuple[str, Path]:
        version, artifact = item
        return version, cache.unpacked(artifact) or cache.unpack(artifact)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(unpacked, todo))
