"""Bounded, visible waits on package indexes: what stackfarm.artifacts' retry loop spends, per index.

Every index (a scheme://host:port) gets a budget of seconds it may spend failing -- timed-out or refused
attempts and the pauses between them -- in one process. Each request's timeout is cut to what is left of
it; once it is spent the index counts as unreachable for as long again, so a hanging index costs one budget,
not one per request. Every pause is announced with a one-line progress message. Every URL these lines and
errors show goes through stackfarm.indexauth.redact first: no ``user:password@`` is ever printed.
"""

from __future__ import annotations

import email.utils
import http.client
import os
import socket
import ssl
import sys
import threading
import time
import urllib.error
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlparse

from .errors import IndexUnreachableError
from .indexauth import redact

_T = TypeVar("_T")

#: Seconds an index may spend failing in one process before it counts as unreachable.
INDEX_BUDGET = 60.0
#: The environment variable that overrides INDEX_BUDGET (tests set it to a second or less).
BUDGET_ENV = "STACKFARM_INDEX_BUDGET"
#: The longest a single request may wait for an answer (connect, or between two reads).
REQUEST_TIMEOUT = 20.0
#: HTTP answers worth retrying: the server is there but busy or broken for now.
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
#: Errors of the network (not of the answer): retried, then the index is unreachable.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    urllib.error.URLError,
    TimeoutError,
    ConnectionError,
    http.client.HTTPException,
    ssl.SSLError,
    socket.gaierror,
)


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


def reason_of(exc: BaseException) -> str:
    """A few words for what went wrong: "timeout", "HTTP 503", "connection refused"..."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    inner = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(inner, TimeoutError | socket.timeout) or "timed out" in str(inner):
        return "timeout"
    if isinstance(inner, ConnectionRefusedError):
        return "connection refused"
    if isinstance(inner, ConnectionResetError):
        return "connection reset"
    if isinstance(inner, socket.gaierror):
        return "host name does not resolve"
    if isinstance(inner, http.client.IncompleteRead):
        return "answer cut short"
    text = str(inner).strip() or type(inner).__name__
    return text.splitlines()[0][:80]


def retry_after(exc: BaseException) -> float | None:
    """Seconds a 429/503 answer's Retry-After asks for (a number or an HTTP date), else None."""
    if not isinstance(exc, urllib.error.HTTPError) or exc.headers is None:
        return None
    raw = exc.headers.get("Retry-After")
    if not raw:
        return None
    raw = raw.strip()
    if raw.isdigit():
        return float(raw)
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


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

    def give_up(self, reason: str, attempts: int) -> str:
        """Mark the index unreachable for a while; returns what the error says about it."""
        with _LOCK:
            text = (
                f"index {self.index}: gave up after {attempts} attempt(s) in {self._state.spent:.1f} s "
                f"({reason}; the budget is {self.total:g} s, {BUDGET_ENV} changes it)"
            )
            self._state.dead_since = time.monotonic()
            self._state.reason = text
        return text


def _unresolvable(exc: BaseException) -> bool:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return isinstance(reason, socket.gaierror)


def retrying(
    url: str,
    attempt: Callable[[float], _T],
    *,
    delays: Sequence[float],
    sleep: Callable[[float], None],
    hint: str,
) -> _T:
    """Run ``attempt(timeout)``, retrying network errors and 429/5xx answers after each of ``delays`` (or the
    longer pause a Retry-After asks for) while the index's budget lasts, each pause announced on
    progress_line; other HTTP errors pass through. When it runs out: IndexUnreachableError naming the index."""
    wait = Budget(url)
    shown = redact(url)
    if (dead := wait.dead()) is not None:
        raise IndexUnreachableError(f"{shown} is unreachable: {dead}\n  hint: {hint}")
    # A host name that does not resolve is an answer, not silence (air-gapped runners): retry it once, not thrice.
    attempts_left_for_dns = 1
    reason, attempts = "no attempt", 0
    for n in range(len(delays) + 1):
        start, attempts = time.monotonic(), attempts + 1
        try:
            result = attempt(wait.timeout())
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code not in RETRY_STATUS:
                raise
            last: BaseException = exc
        except NETWORK_ERRORS as exc:
            last = exc
        else:
            wait.succeeded()
            return result
        wait.spend(time.monotonic() - start)
        reason = reason_of(last)
        if _unresolvable(last):
            if attempts_left_for_dns == 0:
                break
            attempts_left_for_dns -= 1
        if n == len(delays):
            break
        asked = retry_after(last)
        delay = max(delays[n], asked or 0.0)
        if delay >= wait.left():
            if asked is not None:
                reason += f", asked to retry after {asked:g} s"
            break
        progress_line(f"index {wait.index}: retry {n + 1}/{len(delays)} in {delay:g} s ({reason})")
        sleep(delay)
        wait.spend(delay)
    raise IndexUnreachableError(f"{shown} is unreachable: {wait.give_up(reason, attempts)}\n  hint: {hint}")


__all__ = [
    "BUDGET_ENV",
    "INDEX_BUDGET",
    "NETWORK_ERRORS",
    "REQUEST_TIMEOUT",
    "RETRY_STATUS",
    "Budget",
    "budget",
    "index_of",
    "progress_line",
    "reason_of",
    "reset",
    "retry_after",
    "retrying",
]
