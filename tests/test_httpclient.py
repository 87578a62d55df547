"""stackfarm.httpclient, the one HTTP client: the index and the verdict store are asked through the same code
(a real HTTP server on 127.0.0.1 answers them both), and an error says what the server said without a secret.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from stackfarm import artifacts, httpclient, indexauth, indexwait, store
from stackfarm.artifacts import Source, list_versions
from stackfarm.errors import EnvironmentProblem, IndexUnreachableError
from stackfarm.storekeys import StoreKeys

REPO = Path(__file__).resolve().parents[1]
TOKEN = "tok-Zq81-secret"
PASSWORD = "pw-Hx77-secret"
WHEEL = "sglang-0.5.9-py3-none-any.whl"


@dataclass
class Plan:
    """What the server answers: per path, the (status, headers, body) answers left before the good one."""

    faults: dict[str, list[tuple[int, dict[str, str], bytes]]] = field(default_factory=dict)
    seen: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization)
    base: str = ""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        plan = self.server.plan
        plan.seen.append((self.path, self.headers.get("Authorization")))
        left = plan.faults.get(self.path)
        if left:
            status, headers, body = left.pop(0)
            self._answer(status, body, headers)
        elif self.path.startswith("/simple/sglang/"):
            files = [{"filename": WHEEL, "url": f"{plan.base}/files/{WHEEL}", "hashes": {"sha256": "0" * 64}}]
            body = json.dumps({"meta": {"api-version": "1.0"}, "name": "sglang", "files": files}).encode()
            self._answer(200, body, {"Content-Type": "application/vnd.pypi.simple.v1+json"})
        elif self.path.startswith("/store/"):
            self._answer(200, b"stored bytes", {"Content-Type": "application/octet-stream"})
        else:
            self._answer(404, b"no such file", {})


class _Server(ThreadingHTTPServer):
    plan: Plan


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Plan]:
    monkeypatch.setattr(artifacts, "RETRY_DELAYS", (0.0, 0.0))
    monkeypatch.setattr(store, "RETRY_DELAYS", (0.0, 0.0))
    monkeypatch.setattr(indexauth, "USE_KEYRING", False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    indexwait.reset()
    indexauth.forget()
    artifacts._LISTINGS.clear()
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.plan = Plan(base=f"http://127.0.0.1:{srv.server_address[1]}")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.plan
    srv.shutdown()
    srv.server_close()
    indexwait.reset()
    indexauth.forget()
    artifacts._LISTINGS.clear()


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every URL the client's one opener opened (it still opens them)."""
    urls: list[str] = []
    real = httpclient._OPENER.open

    def recording(req: Any, *args: Any, **kw: Any) -> Any:
        urls.append(req.full_url)
        return real(req, *args, **kw)

    monkeypatch.setattr(httpclient._OPENER, "open", recording)
    return urls


@dataclass
class Pauses:
    """The pauses each caller's client took (recorded, not slept), and the progress lines announcing them."""

    index: list[float] = field(default_factory=list)
    store: list[float] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> Pauses:
    taken = Pauses()
    monkeypatch.setattr(artifacts, "_sleep", taken.index.append)
    monkeypatch.setattr(store, "_sleep", taken.store.append)
    monkeypatch.setattr(indexwait, "progress_line", taken.lines.append)
    return taken


def _busy(seconds: int) -> tuple[int, dict[str, str], bytes]:
    return 503, {"Retry-After": str(seconds)}, b"busy, come back later"


def test_the_index_and_the_store_honour_retry_after_through_the_one_client(
    server: Plan, opened: list[str], pauses: Pauses
) -> None:
    listing, entry = "/simple/sglang/", "/store/ab/c/manifest.json"
    server.faults[listing] = [_busy(3)]
    server.faults[entry] = [_busy(4)]

    assert list_versions(Source(name="web", url=f"{server.base}/simple"), "sglang") == ["0.5.9"]
    verdicts = store.open_store(f"{server.base}/store", StoreKeys(signer=None, trusted=()))
    assert verdicts.transport.get("ab/c/manifest.json") == b"stored bytes"

    # Each asked twice through the same opener; each paused as long as its Retry-After asked, not its 0 s delay.
    assert opened == [server.base + listing] * 2 + [server.base + entry] * 2
    assert pauses.index == [3.0]
    assert pauses.store == [4.0]
    assert pauses.lines == [
        f"index {server.base}: retry 1/2 in 3 s (HTTP 503)",
        f"verdict store {server.base}: retry 1/2 in 4 s (HTTP 503)",
    ]


def test_a_retry_after_past_the_budget_stops_both_at_once(
    server: Plan, pauses: Pauses, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(indexwait.BUDGET_ENV, "5")
    server.faults["/simple/sglang/"] = [_busy(3600)] * 3
    server.faults["/store/x"] = [_busy(3600)] * 3
    with pytest.raises(IndexUnreachableError, match="asked to retry after 3600 s") as index_err:
        list_versions(Source(name="web", url=f"{server.base}/simple"), "sglang")
    indexwait.reset()
    verdicts = store.open_store(f"{server.base}/store", StoreKeys(signer=None, trusted=()))
    with pytest.raises(EnvironmentProblem, match="asked to retry after 3600 s") as store_err:
        verdicts.transport.get("x")
    assert pauses.index == pauses.store == []
    assert f"index {server.base}: gave up after 1 attempt(s)" in str(index_err.value)
    assert f"verdict store {server.base}: gave up after 1 attempt(s)" in str(store_err.value)


def test_a_401_says_what_the_store_said_without_the_token(
    server: Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = f"token {TOKEN} is not valid for http://ci:{PASSWORD}@127.0.0.1/store (expired)"
    server.faults["/store/ab/c/manifest.json"] = [(401, {"Content-Type": "text/plain"}, said.encode())]
    monkeypatch.setenv(store.STORE_TOKEN_ENV, TOKEN)
    verdicts = store.open_store(f"{server.base}/store", StoreKeys(signer=None, trusted=()))
    with pytest.raises(EnvironmentProblem) as err:
        verdicts.transport.get("ab/c/manifest.json")
    text = str(err.value)
    assert server.seen[-1] == ("/store/ab/c/manifest.json", f"Bearer {TOKEN}"), "the token was sent"
    assert (
        f"GET {server.base}/store/ab/c/manifest.json answered HTTP 401 Unauthorized: "
        '"token *** is not valid for http://127.0.0.1/store (expired)"'
    ) in text
    assert TOKEN not in text
    assert PASSWORD not in text
    assert store.STORE_TOKEN_ENV in text, "the fix names where the token comes from"


def test_a_401_says_what_the_index_said_without_the_password(server: Plan) -> None:
    basic = base64.b64encode(f"ci:{PASSWORD}".encode()).decode()
    page = (
        f"<html><head><style>p {{color: red}}</style></head><body>\n<p>user ci, password {PASSWORD} "
        f"(Basic {basic}): no access to sglang</p>\n</body></html>"
    )
    server.faults["/simple/sglang/"] = [(401, {"Content-Type": "text/html"}, page.encode())]
    index = indexauth.take_credentials(f"http://ci:{PASSWORD}@{server.base.removeprefix('http://')}/simple")
    with pytest.raises(IndexUnreachableError) as err:
        list_versions(Source(name="web", url=index), "sglang")
    text = str(err.value)
    assert server.seen[-1] == ("/simple/sglang/", f"Basic {basic}"), "the credentials were sent"
    assert (
        f'unauthorized: {server.base}/simple/sglang/ answered HTTP 401 Unauthorized: "user ci, password *** '
        '(Basic ***): no access to sglang"'
    ) in text
    assert PASSWORD not in text
    assert basic not in text


def test_a_long_answer_is_cut_after_its_secret_is_gone() -> None:
    secret = "s" * 40
    long = ("x" * 150) + secret + ("y" * 100)
    detail = httpclient._detail(long.encode(), [secret])
    assert detail.endswith("…")
    assert len(detail) == 160
    assert "s" not in detail.replace("***", ""), "no part of the secret is left at the cut"
    assert httpclient._detail(b"\n\n  first   line \nsecond", []) == "first line"
    assert httpclient._detail(b"", []) == ""


def test_no_other_module_opens_an_index_or_store_url() -> None:
    """Connections to an index or a store are opened by stackfarm.httpclient alone; the throughput suite's
    client talks to the SGLang server it started on 127.0.0.1 (timing tokens, asking no credentials)."""
    opening = re.compile(r"urlopen\(|build_opener\(|HTTPS?Connection\(|urllib\.request\.Request\(")
    allowed = {"httpclient.py", "throughput/measure.py", "throughput/server.py"}
    found = [
        str(p.relative_to(REPO / "src" / "stackfarm"))
        for p in sorted((REPO / "src" / "stackfarm").rglob("*.py"))
        if opening.search(p.read_text(encoding="utf-8"))
    ]
    assert sorted(set(found) - allowed) == []
    assert "httpclient.py" in found
