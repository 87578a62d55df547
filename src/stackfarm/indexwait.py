"""Bounded waits on package indexes and the verdict store: what stackfarm.httpclient's retries spend, per origin.

Every index (a scheme://host:port) gets a budget of seconds it may spend failing -- timed-out or refused
attempts and the pauses between them -- in one process. Each request's timeout is cut to what is left of
it; once it is spent the index counts as unreachable for as long again, so a hanging index costs one budget,
not one per request. The client announces every pause on ``progress_line``. Every URL these lines and errors
show goes through stackfarm.indexauth.redact first: no ``user:password@`` is ever printed.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

from .indexauth import redact

#: Seconds an index may spend failing in one process before it counts as unreachable.
INDEX_BUDGET = 60.0
#: The environment variable that overrides INDEX_BUDGET (tests set it to a second or less).
BUDGET_ENV = "STACKFARM_INDEX_BUDGET"
#: The longest a single request may wait for an answer (connect, or between two reads).
REQUEST_TIMEOUT = 20.0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


#: Where "index X: retry 2/3 in 3 s (timeout)" goes; the runner may point it at its own display.
progress_line: Callable[[str], None] = _stderr


def budget() -> float:
    """INDEX_BUDGET, or STACKFARM_INDEX_BUDGET when it is a number of seconds."""
    raw = os.environ.get(BUDGET_ENV, "")
    try:
        value = float(raw) if raw else INDEX_BUDGET
    except ValueError:
        return INDEX_BUDGET
    return value if value > 0 else INDEX_BUDGET


def index_of(url: str) -> str:
    """The index a URL belongs to, as its budget is kept: scheme://host[:port] (never its credentials)."""
    parts = urlparse(redact(url))
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else url


@dataclass
class _State:
    spent: float = 0.0
    dead_since: float | None = None
    reason: str = ""


_STATES: dict[str, _State] = {}
_LOCK = threading.Lock()


def reset() -> None:
    """Forget every index's spending (tests; a long-lived process that wants a fresh start)."""
    with _LOCK:
        _STATES.clear()


class Budget:
    """One request's view of its index's budget."""

    def __init__(self, url: str) -> None:
        self.index = index_of(url)
        self.total = budget()
        with _LOCK:
            self._state = _STATES.setdefault(self.index, _State())

    def dead(self) -> str | None:
        """Why the index already counts as unreachable, or None (it gets a fresh budget once as long passed)."""
        with _LOCK:
            state = self._state
            if state.dead_since is None:
                return None
            if time.monotonic() - state.dead_since >= self.total:
                state.dead_since, state.spent = None, 0.0
                return None
            return state.reason

    def left(self) -> float:
        with _LOCK:
            return max(0.0, self.total - self._state.spent)

    def timeout(self) -> float:
        """The timeout of the next attempt: REQUEST_TIMEOUT, or less when less budget is left."""
        return max(0.05, min(REQUEST_TIMEOUT, self.left()))

    def spend(self, seconds: float) -> None:
        with _LOCK:
            self._state.spent += max(0.0, seconds)

    def succeeded(self) -> None:
        with _LOCK:
            self._state.spent = 0.0
            self._state.dead_since = None

    def give_up(self, reason: str, attempts: int, *, role: str = "index") -> str:
        """Mark the origin unreachable for a while; returns what the error says about it (``role``: what the
        server is to stackfarm, "index" or "verdict store")."""
        with _LOCK:
            text = (
                f"{role} {self.index}: gave up after {attempts} attempt(s) in {self._state.spent:.1f} s "
                f"({reason}; the budget is {self.total:g} s, {BUDGET_ENV} changes it)"
            )
            self._state.dead_since = time.monotonic()
            self._state.reason = text
        return text


__all__ = [
    "BUDGET_ENV",
    "INDEX_BUDGET",
    "REQUEST_TIMEOUT",
    "Budget",
    "budget",
    "index_of",
    "progress_line",
    "reset",
]
