"""The one door for subprocesses: every external command stackfarm runs goes through `call`."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import StackfarmError


@dataclass(frozen=True, kw_only=True)
class Outcome:
    args: tuple[str, ...]
    returncode: int
    output: str
    elapsed: float
    timed_out: bool = False


def call(
    args: Sequence[str | Path],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    log: Path | None = None,
) -> Outcome:
    """Run a command to completion, capturing stdout+stderr (into `log` as well when given)."""
    argv = tuple(str(a) for a in args)
    if shutil.which(argv[0]) is None and not Path(argv[0]).exists():
        raise StackfarmError(f"command not found: {argv[0]}")
    full_env = {**os.environ, **(env or {})}
    start = time.monotonic()
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
        outcome = Outcome(
            args=argv, returncode=done.returncode, output=done.stdout, elapsed=time.monotonic() - start
        )
    except subprocess.TimeoutExpired as exc:
        raw = exc.stdout or ""
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        outcome = Outcome(
            args=argv, returncode=124, output=text, elapsed=time.monotonic() - start, timed_out=True
        )
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"+ {' '.join(argv)}\n{outcome.output}", encoding="utf-8")
    return outcome


__all__ = ["Outcome", "call"]
