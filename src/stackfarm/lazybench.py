"""`stackfarm bench`'s lazy-artifacts figures (issue 21), side by side in one run, each from an empty cache:

(a) ``pip download --no-deps`` of one cell's wheels (the same files the cell resolves to, by URL);
(b) stackfarm's static tier of that cell (00-stack, 05-import, 10-capability, 20-eagle3) with lazy trees
    (``STACKFARM_LAZY=1``: range reads of what the suites read), in its own process;
(c) the same static tier with full downloads and unpacked trees (what a run does without lazy trees).

Figures: wall seconds, bytes downloaded, bytes on disk (allocated blocks, so sparse copies count what they hold).
Bytes downloaded for stackfarm are what its cache kept: whole wheels in ``blobs/``, plus what each lazy tree
fetched (its manifest's ``fetched``) and the METADATA files read by range requests.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from .artifacts import Cache
from .lazytree import STATIC_SUITES
from .matrix import load
from .proc import call
from .resolve import Resolver, plan_matrix

Row = tuple[str, float, str]


def disk_bytes(root: Path) -> int:
    """Bytes allocated under ``root`` (a hard-linked file once; holes of sparse files are not counted)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = (Path(folder) / name).lstat()
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def fetched_bytes(cache: Path) -> int:
    """What a stackfarm cache downloaded: its blobs, what its lazy trees fetched, its range-read METADATA."""
    total = sum(p.stat().st_size for p in cache.glob("blobs/sha256/*.whl"))
    total += sum(p.stat().st_size for p in cache.glob("metadata/*"))
    for marker in cache.glob("lazy/*/.stackfarm-lazy"):
        total += int(json.loads(marker.read_text(encoding="utf-8")).get("fetched", 0))
    return total


def _urls(matrix_path: Path, cell_id: str, probe: Path) -> list[str]:
    matrix = load(matrix_path)
    resolver = Resolver(matrix, Cache(probe))
    plan, _unreachable = plan_matrix(matrix, resolver, cell_id)
    cells = [c for c in plan.cells if c.id == cell_id]
    if not cells:
        raise SystemExit(f"bench: cell {cell_id} is not in {matrix_path}'s plan")
    python = cells[0].as_dict().get("python", matrix.axes["python"][0])
    return [resolver.artifact(comp, python).url for comp in cells[0].components]


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def static_tier_vs_pip(matrix: Path, cell: str) -> list[Row]:
    """The three figures of the module docstring, as bench rows (seconds, and a note with the bytes)."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="stackfarm-lazybench-") as tmp:
        base = Path(tmp)
        urls = _urls(matrix, cell, base / "probe")
        pip = call([sys.executable, "-m", "pip", "download", "--no-deps", "--dest", base / "pip", *urls])
        wheels = sum(p.stat().st_size for p in (base / "pip").glob("*.whl"))
        rows.append(
            (
                f"cold pip download --no-deps of {cell}'s {len(urls)} wheels",
                pip.elapsed,
                f"downloaded {_mb(wheels)}, on disk {_mb(disk_bytes(base / 'pip'))} (exit {pip.returncode})",
            )
        )
        for label, lazy in (("lazy trees", "1"), ("full trees", "0")):
            cache = base / f"cache-{lazy}"
            argv: list[str | Path] = [
                sys.executable,
                "-m",
                "stackfarm",
                "run",
                "--matrix",
                matrix.resolve(),
                "--cells",
                cell,
            ]
            argv += [
                "--suites",
                ",".join(STATIC_SUITES),
                "--backend",
                "local",
                "--force",
                "--reports",
                base / f"r-{lazy}",
            ]
            env = {"STACKFARM_CACHE": str(cache), "STACKFARM_LAZY": lazy}
            done = call(argv, env=env, cwd=matrix.resolve().parent)
            got = fetched_bytes(cache)
            rows.append(
                (
                    f"cold static tier of {cell}, {label}",
                    done.elapsed,
                    f"downloaded {_mb(got)} ({100 * got / max(wheels, 1):.0f} % of the wheels), "
                    f"on disk {_mb(disk_bytes(cache))}, {done.elapsed / max(pip.elapsed, 1e-9):.2f} x pip's time "
                    f"(exit {done.returncode})",
                )
            )
            cachekeep_remove(cache)
        rows.append((f"machine load (1/5/15 min) during the above: {os.getloadavg()}", float("nan"), ""))
    return rows


def cachekeep_remove(cache: Path) -> None:
    """Remove a bench cache (its trees are read-only)."""
    from .cachekeep import remove_tree

    if cache.exists():
        remove_tree(cache)


__all__ = ["disk_bytes", "fetched_bytes", "static_tier_vs_pip"]
