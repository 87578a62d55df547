"""The one HTTP client of stackfarm: the package indexes (listings, PEP 658 metadata, wheels, range reads) and
the verdict store (GET, PUT) are spoken to through it, and nothing else in stackfarm opens a connection to them.
(Docker registries are spoken to by the Docker engine, not by stackfarm; the throughput suite talks to the
SGLang server it started on 127.0.0.1 with http.client, timing each token, and asks no credentials.)

What every request gets, in this one place:

- credentials (stackfarm.indexauth keeps them): a bearer token given for the URL's origin
  (``STACKFARM_STORE_TOKEN`` for the store), else the ``user:password@`` the URL was written with, else netrc's,
  else keyring's, sent as an ``Authorization`` header that urllib does not carry across a redirect: a redirect
  gets the credentials of its own origin, or none;
- retries (``Client.call``): network errors and 429/5xx answers are tried again after each of the caller's
  pauses, or after the longer one a Retry-After asks for, while the origin's budget lasts
  (stackfarm.indexwait); each pause is announced on ``indexwait.progress_line``, naming the role ("index",
  "verdict store") and the origin; once the budget is spent, IndexUnreachableError names the origin;
- errors: an answer that is not retried raises HttpStatusError (an ``urllib.error.HTTPError``: callers read
  ``.code`` as before) naming the method, the URL without credentials, the status and the first line the server
  wrote, with every secret the request carried (the token, the password) cut out of it, and any
  ``user:password@``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import email.message
import email.utils
import html
import http.client
import re
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from . import indexauth, indexwait
from .errors import IndexUnreachableError

_T = TypeVar("_T")

#: HTTP answers worth retrying: the server is there but busy or broken for now.
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
#: Errors of the network (not of the answer): retried, then the origin is unreachable.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    urllib.error.URLError,
    TimeoutError,
    ConnectionError,
    http.client.HTTPException,
    ssl.SSLError,
    socket.gaierror,
)
#: What replaces a secret in an error's text.
REDACTED = "***"
#: The User-Agent of a request that names none.
USER_AGENT = "stackfarm/0.1"
_DETAIL_BYTES = 4096  # of an error answer's body, read for its first line
_DETAIL_CHARS = 160
_TAGS = re.compile(r"(?is)<(script|style)\b.*?</\1\s*>|<[^>]*>")


class HttpStatusError(urllib.error.HTTPError):
    """An HTTP answer that is not retried (or no longer): its status, and what the server said, without the
    request's secrets. ``url`` never holds credentials."""

    def __init__(self, url: str, code: int, reason: str, headers: Any, *, method: str, detail: str) -> None:
        super().__init__(url, code, reason, headers, None)
        self.method = method
        #: The first line of the answer's body (HTML tags dropped), secrets cut out; "" when it had none.
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.method} {self.url} answered {answer_text(self)}"


def answer_text(exc: urllib.error.HTTPError) -> str:
    """``HTTP 401 Unauthorized: "what the server said"`` (without the request's secrets)."""
    detail = getattr(exc, "detail", "")
    return f"HTTP {exc.code} {exc.reason}" + (f': "{detail}"' if detail else "")


# --------------------------------------------------------------------------- credentials


def _authorize(req: urllib.request.Request) -> urllib.request.Request:
    bearer = indexauth.bearer(req.full_url)
    if bearer is not None:
        req.add_unredirected_header("Authorization", f"Bearer {bearer}")
        return req
    found = indexauth.credentials(req.full_url)
    if found is not None:
        token = base64.b64encode(f"{found[0]}:{found[1]}".encode()).decode("ascii")
        req.add_unredirected_header("Authorization", f"Basic {token}")
    return req


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects with the credentials of the new URL's origin (urllib drops unredirected headers); a
    ``user:password@`` in the new URL is dropped, never sent or shown."""

    def redirect_request(  # noqa: PLR0917 - urllib's signature
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, indexauth.redact(newurl))
        return None if new is None else _authorize(new)


_OPENER = urllib.request.build_opener(_Redirects())


def request(
    url: str, headers: Mapping[str, str] | None = None, *, method: str = "GET", data: bytes | None = None
) -> urllib.request.Request:
    """A request for ``url`` (its ``user:password@`` kept by indexauth.take_credentials, not in the URL) with
    the credentials of its origin, if any (a bearer token, inline, netrc or keyring)."""
    sent = {"User-Agent": USER_AGENT, **(headers or {})}
    req = urllib.request.Request(indexauth.take_credentials(url), data=data, method=method, headers=sent)
    return _authorize(req)


def _secrets(req: urllib.request.Request, answered: str) -> list[str]:
    """Every secret the request carried, and those of the origin that answered (after a redirect), longest
    first: what an error's text must not hold."""
    found: set[str] = set()
    scheme, _, value = str(req.get_header("Authorization") or "").partition(" ")
    if scheme == "Bearer":
        found.add(value)
    elif scheme == "Basic":
        found.add(value)
        with contextlib.suppress(binascii.Error, UnicodeDecodeError):
            found.add(base64.b64decode(value).decode().partition(":")[2])
    for url in {req.full_url, answered}:
        found.add(indexauth.bearer(url) or "")
        found.add((indexauth.credentials(url) or ("", ""))[1])
    return sorted((s for s in found if s), key=len, reverse=True)


def redact_secrets(text: str, secrets: Sequence[str]) -> str:
    """``text`` with each of ``secrets`` replaced by REDACTED and every ``user:password@`` of a URL removed."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return indexauth.scrub(text)


def _detail(body: bytes, secrets: Sequence[str]) -> str:
    """The first line of an error answer's body, as a person would read it: tags dropped, secrets cut out."""
    text = body.decode("utf-8", "replace")
    if "<" in text:
        text = html.unescape(_TAGS.sub("\n", text))
    text = redact_secrets(text, secrets)  # before the cut: no part of a secret survives it
    line = next((" ".join(t.split()) for t in text.splitlines() if t.strip()), "")
    return line if len(line) <= _DETAIL_CHARS else line[: _DETAIL_CHARS - 1] + "…"


def send(
    url: str,
    headers: Mapping[str, str] | None = None,
    *,
    timeout: float,
    method: str = "GET",
    data: bytes | None = None,
) -> Any:
    """One request (no retry): the answer as urllib gives it (``with send(...) as answer``), or
    HttpStatusError for a 4xx/5xx status. The only place stackfarm opens an index's or a store's URL."""
    req = request(url, headers, method=method, data=data)
    try:
        return _OPENER.open(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        answered = indexauth.redact(exc.url or req.full_url)
        try:
            body = exc.read(_DETAIL_BYTES)
        except (OSError, http.client.HTTPException, ValueError):
            body = b""
        finally:
            exc.close()
        detail = _detail(body, _secrets(req, answered))
        raise HttpStatusError(
            answered, exc.code, str(exc.reason), exc.headers, method=method, detail=detail
        ) from None


# --------------------------------------------------------------------------- retries


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


def _unresolvable(exc: BaseException) -> bool:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return isinstance(reason, socket.gaierror)


@dataclass(frozen=True)
class Answer:
    """A whole answer: where it came from (after redirects, without credentials), its status, headers, body."""

    url: str
    status: int
    headers: email.message.Message
    body: bytes


@dataclass(frozen=True)
class Client:
    """The requests of one caller: what its messages call the server (``role``), the hint its errors give,
    its pauses between attempts and how it waits (a stop may interrupt the wait). Cheap: a caller makes one
    per request from its current settings."""

    role: str
    hint: str
    delays: Sequence[float]
    sleep: Callable[[float], None]

    def call(self, url: str, attempt: Callable[[float], _T]) -> _T:
        """``attempt(timeout)``, retried on network errors and 429/5xx answers after each pause (or the longer
        one a Retry-After asks for) while the origin's budget lasts, each pause announced; other answers
        (HttpStatusError) pass through. Once the budget is spent: IndexUnreachableError naming the origin."""
        delays = tuple(self.delays)
        wait = indexwait.Budget(url)
        shown = indexauth.redact(url)
        if (dead := wait.dead()) is not None:
            raise IndexUnreachableError(f"{shown} is unreachable: {dead}\n  hint: {self.hint}")
        # A host name that does not resolve is an answer, not silence (air-gapped runners): retried once.
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
            indexwait.progress_line(
                f"{self.role} {wait.index}: retry {n + 1}/{len(delays)} in {delay:g} s ({reason})"
            )
            self.sleep(delay)
            wait.spend(delay)
        given_up = wait.give_up(reason, attempts, role=self.role)
        raise IndexUnreachableError(f"{shown} is unreachable: {given_up}\n  hint: {self.hint}")

    def fetch(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        method: str = "GET",
        data: bytes | None = None,
        absent: Collection[int] = (),
    ) -> Answer | None:
        """The whole answer to one request, retried as ``call`` retries (a body shorter than its
        Content-Length is retried too); None when the status is one of ``absent`` (404: no such file)."""

        def once(timeout: float) -> Answer | None:
            try:
                with send(url, headers, timeout=timeout, method=method, data=data) as resp:
                    body: bytes = resp.read()
                    answer = Answer(
                        url=indexauth.redact(resp.geturl()),
                        status=resp.status,
                        headers=resp.headers,
                        body=body,
                    )
            except HttpStatusError as exc:
                if exc.code in absent:
                    return None
                raise
            length = str(answer.headers.get("Content-Length") or "")
            if method != "HEAD" and length.isdigit() and len(body) < int(length):
                raise http.client.IncompleteRead(body, int(length) - len(body))
            return answer

        return self.call(url, once)


__all__ = [
    "NETWORK_ERRORS",
    "REDACTED",
    "RETRY_STATUS",
    "USER_AGENT",
    "Answer",
    "Client",
    "HttpStatusError",
    "answer_text",
    "reason_of",
    "redact_secrets",
    "request",
    "retry_after",
    "send",
]
