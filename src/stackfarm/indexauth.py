"""Credentials for private package indexes and the verdict store (stackfarm.httpclient sends them).

Credentials written into an index URL (``https://user:token@host/simple`` in matrix.toml's [indexes]) are taken
out of it when the matrix is loaded (``take_credentials``): the rest of the program only ever sees the URL
without them, and they stay in this module's memory, for that scheme, host and port only, asked before netrc
and keyring. Other credentials come from the netrc file (``$NETRC``, else ``~/.netrc``; Python's :mod:`netrc`)
for the URL's host, else from :mod:`keyring` when it is importable (optional: ``pip install keyring``), asked
for the URL's ``scheme://host`` and then the host, as pip asks it; a bearer token (``bearer_for``) takes the
place of them for its origin. stackfarm.httpclient sends them as an ``Authorization`` header that does not
cross a redirect, and cuts them out of its errors. They never appear in URLs, so never in logs, errors, reports
or cache keys (those hold URLs); ``redact`` strips any ``user:password@`` a URL was written with before it is
shown.
"""

from __future__ import annotations

import functools
import importlib
import netrc
import os
import re
import threading
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from stackfarm.errors import ConfigError

#: Tests set this to False so that a developer's own keyring is never asked.
USE_KEYRING = True


def redact(url: str) -> str:
    """``url`` without any ``user:password@`` part (what may be shown or used as a key)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


#: ``user:password@`` right after an http(s):// anywhere in a text (what ``scrub`` removes).
_USERINFO = re.compile(r"(?i)\b(https?://)[^\s/?#@\[\]<>\"']+@")


def scrub(text: str) -> str:
    """``text`` with the ``user:password@`` of every http(s) URL in it removed: the last guard of what is
    written for people (the reports), for text that came from elsewhere (a suite's output, an old verdict)."""
    return _USERINFO.sub(r"\1", text) if "@" in text else text


_DEFAULT_PORTS = {"http": 80, "https": 443}
#: Credentials taken out of URLs (``take_credentials``), by (scheme, host, port): in memory only, never written.
_INLINE: dict[tuple[str, str, int], tuple[str, str]] = {}
_INLINE_LOCK = threading.Lock()


def _origin(parts: SplitResult) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, the port spelled out (80/443 where the URL gives none)."""
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    try:
        port = parts.port
    except ValueError:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme]


def take_credentials(url: str) -> str:
    """``url`` without its ``user:password@`` part, which is kept in memory as the credentials of the URL's
    scheme, host and port (percent-escapes decoded; a lone ``token@`` is a login with an empty password).
    What matrix.toml's index URLs go through when they are loaded: nothing else ever sees the secret."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    userinfo = parts.netloc.rpartition("@")[0]
    login, _colon, password = userinfo.partition(":")
    origin = _origin(parts)
    if origin is not None and (login or password):
        with _INLINE_LOCK:
            _INLINE[origin] = (unquote(login), unquote(password))
    return redact(url)


def forget() -> None:
    """Drop every credential ``take_credentials`` kept (tests; a long-lived process loading another matrix)."""
    with _INLINE_LOCK:
        _INLINE.clear()
        _BEARER.clear()


#: Bearer tokens by (scheme, host, port), kept in memory only (``bearer_for``).
_BEARER: dict[tuple[str, str, int], str] = {}


def bearer_for(url: str, token: str) -> None:
    """Send ``Authorization: Bearer <token>`` to ``url``'s scheme, host and port (and nowhere else, redirects
    included); it takes the place of any Basic credentials for that origin."""
    origin = _origin(urlsplit(url))
    if origin is not None and token:
        with _INLINE_LOCK:
            _BEARER[origin] = token


def bearer(url: str) -> str | None:
    """The bearer token ``bearer_for`` gave ``url``'s origin, or None."""
    origin = _origin(urlsplit(url))
    if origin is None:
        return None
    with _INLINE_LOCK:
        return _BEARER.get(origin)


def _inline(url: str) -> tuple[str, str] | None:
    origin = _origin(urlsplit(url))
    if origin is None:
        return None
    with _INLINE_LOCK:
        return _INLINE.get(origin)


def _netrc_path() -> Path:
    env = os.environ.get("NETRC")
    return Path(env).expanduser() if env else Path.home() / ".netrc"


@functools.lru_cache(maxsize=8)
def _netrc(path: str, mtime_ns: int) -> netrc.netrc:
    del mtime_ns  # part of the cache key: an edited file is read again
    try:
        return netrc.netrc(path)
    except netrc.NetrcParseError as exc:
        # The message names the line, never its content (it may hold a password).
        raise ConfigError(
            Path(path),
            "cannot parse this netrc file (the line is not shown: it may hold a password)",
            line=exc.lineno,
            fix="fix the line (machine <host> login <user> password <secret>) or set NETRC to another file",
        ) from None


def _from_netrc(host: str) -> tuple[str, str] | None:
    path = _netrc_path()
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return None
    try:
        found = _netrc(str(path), mtime).authenticators(host)
    except OSError:
        return None
    if not found:
        return None
    login, _account, password = found
    return (login or "", password or "") if (login or password) else None


def _from_keyring(url: str, host: str) -> tuple[str, str] | None:
    if not USE_KEYRING:
        return None
    try:
        keyring: Any = importlib.import_module("keyring")  # optional: not a dependency
    except ImportError:
        return None
    parts = urlsplit(url)
    for service in (f"{parts.scheme}://{host}", host):
        try:
            cred: Any = keyring.get_credential(service, None)
        except Exception:
            return None
        if cred is not None and (cred.username or cred.password):
            return str(cred.username or ""), str(cred.password or "")
    return None


def credentials(url: str) -> tuple[str, str] | None:
    """(login, password) for ``url``'s host: those an index URL was written with (``take_credentials``: same
    scheme, host and port), else netrc's, else keyring's; None when none has any."""
    host = urlsplit(url).hostname or ""
    if not host or urlsplit(url).scheme not in ("http", "https"):
        return None
    return _inline(url) or _from_netrc(host) or _from_keyring(url, host)


__all__ = [
    "USE_KEYRING",
    "bearer",
    "bearer_for",
    "credentials",
    "forget",
    "redact",
    "scrub",
    "take_credentials",
]
