"""`stackfarm bench` (`nox -s bench`): the figures that keep stackfarm fast, measured the same way every time.

1. planning 1,000 synthetic cells (target < 1 s);
2. a warm no-op re-run of the default matrix (target <= 2 s);
3. one real cell cold (empty cache: download + unpack + suites), warm (--force: cache hit, suites run) and no-op.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from argparse import ArgumentParser, Namespace, _SubParsersAction
from collections.abc import Callable, Iterator
from pathlib import Path

from ..matrix import load
from ..plan import plan

_SYNTHETIC = """
[axes]
cuda = {cuda}
torch = {torch}
sgl_kernel = ["0.3.21"]
flashinfer = ["0.6.3"]
sglang = {sglang}
"""


def _versions(prefix: str, count: int) -> str:
    return "[" + ", ".join(f'"{prefix}.{i}"' for i in range(count)) + "]"


def time_planning(cells: int = 1000, repeats: int = 5) -> tuple[float, int]:
    """Median seconds to load + plan a matrix of `cells` cells (10 x 10 x 10), and the cell count."""
    side = round(cells ** (1 / 3))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "matrix.toml"
        path.write_text(
            _SYNTHETIC.format(
                cuda=_versions("12", side), torch=_versions("2", side), sglang=_versions("0.5", side)
            )
        )
        times, count = [], 0
        for _ in range(repeats):
            start = time.perf_counter()
            count = len(plan(load(path), {}).cells)
            times.append(time.perf_counter() - start)
    return statistics.median(times), count


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _timed(run: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = run()
    return time.perf_counter() - start, code


def _wall(argv: list[str], cwd: Path, repeats: int = 3) -> float:
    """Median wall seconds of a command run as a user would (its own process, output discarded)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _nox_vs_stackfarm(matrix: Path, reports: Path) -> list[tuple[str, float, str]]:
    """The warm no-op through nox beside the same no-op through stackfarm itself, in one run: their ratio."""
    nox = shutil.which("nox")
    root = Path(__file__).resolve().parents[3]
    if nox is None or not (root / "noxfile.py").is_file():
        return [
            ("warm no-op: nox -s matrix vs stackfarm run", float("nan"), "skipped: no nox or no noxfile.py")
        ]
    where = ["--matrix", str(matrix.resolve()), "--reports", str(reports), "--backend", "local"]
    _wall([nox, "-s", "matrix", "--", *where], root, repeats=1)  # nox's venv exists and is installed
    via_nox = _wall([nox, "-s", "matrix", "--", *where], root)
    direct = _wall([sys.executable, "-m", "stackfarm", "run", *where], root)
    return [
        ("warm no-op: stackfarm run (own process, median of 3)", direct, ""),
        ("warm no-op: nox -s matrix (median of 3)", via_nox, f"ratio {via_nox / direct:.2f} (target <= 1.5)"),
    ]


def run(args: Namespace) -> int:
    """`stackfarm bench`: every figure in one table, side by side."""
    from . import main as cli_main  # the command being measured

    rows: list[tuple[str, float, str]] = []

    seconds, count = time_planning()
    rows.append((f"plan {count} synthetic cells (median of 5)", seconds, "target < 1 s"))

    with tempfile.TemporaryDirectory(prefix="stackfarm-bench-") as tmp:
        reports = Path(tmp) / "reports"
        run = ["run", "--matrix", str(args.matrix), "--reports", str(reports), "--backend", "local"]
        _timed(lambda: cli_main(run))  # fills the verdicts (and the cache if needed)
        seconds, code = _timed(lambda: cli_main(run))
        rows.append(("warm no-op re-run, default matrix", seconds, f"target <= 2 s (exit {code})"))
        rows += _nox_vs_stackfarm(args.matrix, reports)

        one = [*run, "--cells", args.cell]
        if not args.skip_cold:
            with _env(STACKFARM_CACHE=str(Path(tmp) / "cold-cache")):
                seconds, code = _timed(lambda: cli_main([*one, "--force"]))
                rows.append((f"cold: {args.cell} (empty cache)", seconds, f"exit {code}"))
        seconds, code = _timed(lambda: cli_main([*one, "--force"]))
        rows.append((f"warm: {args.cell} (cache hit, suites run)", seconds, f"exit {code}"))
        seconds, code = _timed(lambda: cli_main(one))
        rows.append((f"no-op: {args.cell} (verdict reused)", seconds, f"exit {code}"))

    width = max(len(name) for name, _, _ in rows)
    for name, secs, note in rows:
        print(f"{name:<{width}}  {secs:8.3f} s  {note}")
    return 0


def register(sub: _SubParsersAction[ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="time planning, a warm no-op re-run, one cell cold vs warm")
    p.add_argument("--matrix", type=Path, default=Path("matrix.toml"))
    p.add_argument("--cell", default="cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9", help="the cold/warm cell")
    p.add_argument("--skip-cold", action="store_true", help="skip the cold run (it downloads ~1.6 GB)")
    p.set_defaults(func=run)


__all__ = ["register", "run", "time_planning"]
