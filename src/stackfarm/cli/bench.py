"""`stackfarm bench` (`nox -s bench`): the figures that keep stackfarm fast, measured the same way every time.

1. planning 1,000 synthetic cells (target < 1 s);
2. a warm no-op re-run of the default matrix (target <= 2 s);
3. one real cell cold (empty cache: download + unpack + suites), warm (--force: cache hit, suites run) and no-op;
4. two runners, one shared verdict store (stackfarm.store on the server $STACKFARM_TEST_STORE names, else the one
   .ci/servers.sh starts): runner 1 runs the cell and pushes, runner 2 (empty cache, its own reports) reuses it.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from argparse import ArgumentParser, Namespace, _SubParsersAction
from collections.abc import Callable, Iterator
from pathlib import Path

from .. import attest, storekeys, verdict
from ..errors import StackfarmError
from ..matrix import load
from ..plan import plan
from ..store import open_store

#: The verdict store .ci/servers.sh starts (used when $STACKFARM_TEST_STORE is not set).
CI_STORE = "http://127.0.0.1:8808/store"

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


def _store_server() -> tuple[str | None, str]:
    """(URL, "") of the verdict store server to time against, or (None, why there is none)."""
    url = os.environ.get("STACKFARM_TEST_STORE") or CI_STORE
    parts = urllib.parse.urlparse(url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=2).close()
        open_store(url).probe()
    except (OSError, StackfarmError) as exc:
        why = str(exc).splitlines()[0]
        return (
            None,
            f"no verdict store answers at {url} ({why}; as root: .ci/servers.sh, or STACKFARM_TEST_STORE)",
        )
    return url, ""


def _two_runners(
    cli_main: Callable[[list[str]], int], matrix: Path, cell: str, tmp: Path
) -> list[tuple[str, float, str]]:
    """Runner 1 runs the cell (the warm cache: its suites run) and pushes; runner 2 (an empty cache, its own
    reports) plans it and reuses the verdict from the store. Both as `stackfarm run` in this process."""
    url, why = _store_server()
    if url is None:
        return [
            ("two runners, one store: runner 2 reuses runner 1's verdict", float("nan"), f"skipped: {why}")
        ]
    where = f"{url}/bench-{uuid.uuid4().hex[:12]}"  # a fresh store: runner 2 can only reuse runner 1's push

    def runner(reports: Path, *more: str) -> list[str]:
        return ["run", "--matrix", str(matrix), "--reports", str(reports), "--backend", "local",
                "--cells", cell, "--store", where, *more]  # fmt: skip

    # Each runner signs with a key of its own; runner 2 trusts runner 1's public key (stackfarm.storekeys).
    key1, pub1, _ = attest.generate(tmp / "runner1-key")
    key2, _, _ = attest.generate(tmp / "runner2-key")
    first, second = tmp / "runner1-reports", tmp / "runner2-reports"
    with _env(**{storekeys.RUNNER_KEY_ENV: str(key1), storekeys.TRUSTED_RUNNER_KEYS_ENV: ""}):
        seconds1, code1 = _timed(lambda: cli_main(runner(first)))
    signed = {storekeys.RUNNER_KEY_ENV: str(key2), storekeys.TRUSTED_RUNNER_KEYS_ENV: str(pub1)}
    with _env(STACKFARM_CACHE=str(tmp / "runner2-cache"), **signed):
        seconds2, code2 = _timed(lambda: cli_main(runner(second)))
    try:
        ran = verdict.read(verdict.path_of(first, cell)).report.run_id
        reused = verdict.read(verdict.path_of(second, cell)).report.run_id == ran
    except ValueError:
        reused = False
    blobs = tmp / "runner2-cache" / "blobs"
    fetched = sum(1 for p in blobs.rglob("*.whl")) if blobs.is_dir() else 0
    note = f"exit {code2}, {'verdict reused' if reused else 'NOT reused'}, {fetched} wheel(s) fetched"
    return [
        (f"runner 1: {cell} runs, pushes to the store (warm cache)", seconds1, f"exit {code1}"),
        (
            "runner 2: same cell, empty cache, signed verdict from the store (checked, re-judged)",
            seconds2,
            f"{note}; runner 1 / runner 2 = {seconds1 / seconds2:.1f}x",
        ),
    ]


def _lazy_static_tier(matrix: Path, cell: str) -> list[tuple[str, float, str]]:
    """Issue 21: pip download --no-deps of the cell's wheels beside its static tier, lazy and full, all cold."""
    from ..lazybench import static_tier_vs_pip

    return static_tier_vs_pip(matrix, cell)


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
        if not args.skip_cold:
            rows += _lazy_static_tier(args.matrix, args.cell)
        rows += _two_runners(cli_main, args.matrix, args.cell, Path(tmp))

    width = max(len(name) for name, _, _ in rows)
    for name, secs, note in rows:
        print(f"{name:<{width}}  {secs:8.3f} s  {note}")
    return 0


def register(sub: _SubParsersAction[ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", help="time planning, a warm no-op re-run, one cell cold vs warm, two runners sharing a store"
    )
    p.add_argument("--matrix", type=Path, default=Path("matrix.toml"))
    p.add_argument("--cell", default="cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9", help="the cold/warm cell")
    p.add_argument("--skip-cold", action="store_true", help="skip the cold run (it downloads ~1.6 GB)")
    p.set_defaults(func=run)


__all__ = ["register", "run", "time_planning"]
