"""`stackfarm bench`'s lazy-artifacts figures (issue 21), side by side in one run, each from an empty cache:

(a) ``pip download --no-deps`` of one cell's wheels (the same files the cell resolves to, by URL);
(b) stackfarm's static tier of that cell (00-stack, 05-import, 10-capability, 20-eagle3) with lazy trees
    (``STACKFARM_LAZY=1``: range reads of what the suites read), in its own process;
(c) the same static tier with full downloads and unpacked trees (what a run does without lazy trees).

Figures: wall seconds, bytes downloaded, bytes on disk (allocated blocks, so sparse copies count what they hold).
``python -m stackfarm.lazybench --compare CELL...`` runs each cell's static tier with full and with lazy trees
and lists every testcase whose outcome differs (none, on the default matrix's three PyPI cells).

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


def testcases(junit: Path) -> dict[str, str]:
    """classname::name -> "passed" or "<failure|error|skipped>: <message>" of one suite's JUnit file."""
    import xml.etree.ElementTree as ET

    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = f"{child.tag}: {child.get('message') or ''}"
        out[f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"] = outcome
    return out


def compare(matrix: Path, cells: list[str], work: Path) -> int:
    """Run each cell's static tier with full trees (the default cache) and with lazy trees (an empty cache under
    ``work``), print every testcase whose outcome or message differs; returns how many differ."""
    differ = 0
    for cell in cells:
        runs = {}
        for lazy in ("0", "1"):
            reports = work / f"{cell}-{'lazy' if lazy == '1' else 'full'}"
            env = {"STACKFARM_LAZY": lazy}
            if lazy == "1":
                env["STACKFARM_CACHE"] = str(work / "lazy-cache")
            argv: list[str | Path] = [sys.executable, "-m", "stackfarm", "run", "--matrix", matrix.resolve()]
            argv += ["--cells", cell, "--suites", ",".join(STATIC_SUITES), "--backend", "local", "--force"]
            call([*argv, "--reports", reports], env=env, cwd=matrix.resolve().parent)
            runs[lazy] = {s: testcases(reports / cell / f"{s}.xml") for s in STATIC_SUITES}
        for suite in STATIC_SUITES:
            full, lazy_cases = runs["0"][suite], runs["1"][suite]
            bad = sorted(k for k in set(full) | set(lazy_cases) if full.get(k) != lazy_cases.get(k))
            differ += len(bad)
            print(f"{cell} {suite}: {len(full)} testcases, {len(bad)} differ")
            for k in bad:
                print(f"  {k}\n    full: {full.get(k)}\n    lazy: {lazy_cases.get(k)}")
    cachekeep_remove(work / "lazy-cache")  # shared by the cells: a lazy tree is made once
    return differ


def main(argv: list[str] | None = None) -> int:
    """``python -m stackfarm.lazybench --compare CELL [CELL...]``: lazy and full static verdicts side by side."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m stackfarm.lazybench")
    parser.add_argument("--matrix", type=Path, default=Path("matrix.toml"))
    parser.add_argument("--compare", nargs="+", required=True, metavar="CELL")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stackfarm-lazycompare-") as tmp:
        return 1 if compare(args.matrix, args.compare, Path(tmp)) else 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["compare", "disk_bytes", "fetched_bytes", "static_tier_vs_pip"]
