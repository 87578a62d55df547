"""`stackfarm bench` (`nox -s bench`): the figures that keep stackfarm fast, measured the same way every time.

1. planning 1,000 synthetic cells (target < 1 s);
2. a warm no-op re-run of the default matrix (target <= 2 s), and the README's first run (one cell, 00-*) as a
   warm no-op through `nox -s matrix` beside the same `stackfarm run` (target: <= 1.3x; nox as `pip install
   nox` gives it; a row says why when there is no nox or no noxfile.py);
3. one real cell cold (empty cache: download + unpack + suites), warm (--force: cache hit, suites run) and no-op;
4. two runners, one shared verdict store (stackfarm.store on the server $STACKFARM_TEST_STORE names, else the one
   .ci/servers.sh starts): runner 1 runs the cell and pushes, runner 2 (empty cache, its own reports) reuses it;
5. the Ray executor: the same six-cell plan on a one-node and a two-node Ray cluster (stackfarm.cli.raybench).
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


def _walls(commands: dict[str, list[str]], cwd: Path, repeats: int) -> dict[str, list[float]]:
    """Wall seconds of each command run as a user would (its own process, output discarded), `repeats` times,
    the commands taking turns (a busy machine slows them alike)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, argv in commands.items():
            start = time.perf_counter()
            subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            times[name].append(time.perf_counter() - start)
    return times


#: The checkout whose noxfile.py `nox -s matrix` runs (absent where stackfarm is installed, not checked out).
ROOT = Path(__file__).resolve().parents[3]
#: What the README's "first green result" runs: one cell, the suites that need no GPU.
README_SUITES = "00-*"
#: The most `nox -s matrix` may cost beside the same `stackfarm run` (a warm no-op: nox's own start-up).
NOX_RATIO_TARGET = 1.3


def _nox_vs_stackfarm(
    matrix: Path, cell: str, reports: Path, *, nox: str | None = None, root: Path = ROOT, repeats: int = 5
) -> list[tuple[str, float, str]]:
    """The README's first run (`nox -s matrix -- --cells CELL --suites '00-*'`) as a warm no-op through nox,
    beside the same `stackfarm run`, their ratio: what nox itself costs. Nox as a user has it (`pip install
    nox`, on PATH); a row saying why when there is none."""
    name = "warm no-op: nox -s matrix vs stackfarm run"
    nox = nox or shutil.which("nox")
    if nox is None:
        return [(name, float("nan"), "skipped: no nox on PATH (`python3 -m pip install nox` gives it)")]
    if not (root / "noxfile.py").is_file():
        return [
            (
                name,
                float("nan"),
                f"skipped: {root} has no noxfile.py (stackfarm is installed, not checked out)",
            )
        ]
    where = [
        "--matrix",
        str(matrix.resolve()),
        "--reports",
        str(reports),
        "--backend",
        "local",
        "--cells",
        cell,
        "--suites",
        README_SUITES,
    ]
    commands = {
        "nox": [nox, "-s", "matrix", "--", *where],
        "stackfarm": [sys.executable, "-m", "stackfarm", "run", *where],
    }
    # The first call makes nox's venv and installs stackfarm into it, and runs the cell: the rest are no-ops.
    first = subprocess.run(commands["nox"], cwd=root, capture_output=True, text=True, check=False)
    if first.returncode not in (0, 1):  # 1: the cell failed, still a verdict to reuse
        last = (first.stderr.strip().splitlines() or ["no output"])[-1]
        return [(name, float("nan"), f"skipped: `nox -s matrix` exited {first.returncode} ({last})")]
    times = _walls(commands, root, repeats)
    direct, via_nox = min(times["stackfarm"]), min(times["nox"])
    median = statistics.median
    return [
        (
            f"warm no-op: stackfarm run --cells {cell} --suites '{README_SUITES}' (min of {repeats})",
            direct,
            f"median {median(times['stackfarm']):.3f} s",
        ),
        (
            f"warm no-op: nox -s matrix -- the same (min of {repeats}, nox {nox})",
            via_nox,
            f"{via_nox / direct:.2f}x stackfarm run (target <= {NOX_RATIO_TARGET}; "
            f"median {median(times['nox']):.3f} s, {median(times['nox']) / median(times['stackfarm']):.2f}x)",
        ),
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
        return [
            "run",
            "--matrix",
            str(matrix),
            "--reports",
            str(reports),
            "--backend",
            "local",
            "--cells",
            cell,
            "--store",
            where,
            *more,
        ]

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
        rows += _nox_vs_stackfarm(args.matrix, args.cell, Path(tmp) / "readme-reports")

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
    if not args.skip_ray:
        from .raybench import two_nodes_vs_one

        rows += two_nodes_vs_one(lambda argv: _timed(lambda: cli_main(argv)), *_store_server(), ROOT)

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
    p.add_argument("--skip-ray", action="store_true", help="skip the 1-node vs 2-node Ray cluster rows")
    p.set_defaults(func=run)


__all__ = ["NOX_RATIO_TARGET", "README_SUITES", "ROOT", "register", "run", "time_planning"]
