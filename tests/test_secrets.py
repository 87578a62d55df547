"""No secret leaves memory: credentials written into an index URL (``http://user:TOKEN@host/simple`` in
matrix.toml's [indexes]) reach the index as an Authorization header and appear nowhere else: not in what
`stackfarm plan` / `stackfarm run` print (retry and give-up lines included), not in any report (verdict.json,
junit.xml, summary.md/html, index.html), not in the cache (remembered answers, run records, keys).

The index is a real HTTP server on 127.0.0.1 (a thread of this process) that demands Basic auth and serves the
fake stack's wheels as a PEP 691 index, or answers 503 so that retries are printed. The CLI runs in a child
process, as a user runs it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fakestack import OLD, FakeProject, cell_id
from stackfarm import indexauth, matrix
from stackfarm.errors import ExitCode

pytest_plugins = ("fakestack",)

SECRET = "s3cr3t-TOKEN"
USER = "user"
#: What the secret looks like in the header: it must not be written anywhere either.
TOKEN = base64.b64encode(f"{USER}:{SECRET}".encode()).decode()


@dataclass
class Private:
    folder: Path
    base: str = ""
    #: Answer every request with HTTP 503 (the index is down): retries are printed, then it gives up.
    down: bool = False
    #: List each file by an absolute URL that carries the credentials (some private indexes do).
    absolute: bool = False
    seen: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def netloc(self) -> str:
        return self.base.removeprefix("http://")

    @property
    def url_with_secret(self) -> str:
        return f"http://{USER}:{SECRET}@{self.netloc}/simple"

    def authorized(self) -> list[str]:
        with self.lock:
            return [p for p, a in self.seen if a == f"Basic {TOKEN}"]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, code: int, body: bytes, ctype: str = "text/plain", **headers: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        state = self.server.state
        with state.lock:
            state.seen.append((self.path, self.headers.get("Authorization")))
        if state.down:
            self._send(503, b"down for maintenance")
            return
        if self.headers.get("Authorization") != f"Basic {TOKEN}":
            self._send(401, b"who are you", WWW_Authenticate='Basic realm="private"')
            return
        parts = self.path.strip("/").split("/")
        if parts[0] == "simple" and len(parts) == 2:
            files = [
                {
                    "filename": wheel.name,
                    "url": (
                        f"http://{USER}:{SECRET}@{state.netloc}/files/{wheel.name}"
                        if state.absolute
                        else f"../../files/{wheel.name}"
                    ),
                    "hashes": {"sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()},
                }
                for wheel in sorted(state.folder.glob("*.whl"))
                if wheel.name.split("-")[0].replace("_", "-") == parts[1]
            ]
            body = json.dumps({"meta": {"api-version": "1.0"}, "files": files}).encode()
            self._send(200, body, "application/vnd.pypi.simple.v1+json")
        elif parts[0] == "files" and len(parts) == 2 and (state.folder / parts[1]).is_file():
            self._send(200, (state.folder / parts[1]).read_bytes(), "application/octet-stream")
        else:
            self._send(404, b"not found")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: Private


@pytest.fixture
def private(fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch) -> Iterator[Private]:
    """The fake stack's wheels on a private index that wants user/SECRET; no netrc, no keyring, no proxy."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.state = Private(folder=fake_project.wheels, base=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(fake_project.root / "no-netrc"))
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    monkeypatch.setenv("STACKFARM_INDEX_BUDGET", "2")
    yield server.state
    server.shutdown()
    server.server_close()


def _private_matrix(project: FakeProject, index: Private) -> Path:
    """The fake stack, sglang routed to the private index written with its credentials in the URL."""
    return project.write_matrix(
        [OLD],
        extra=f"""
        [indexes.private]
        url = "{index.url_with_secret}"

        [[route]]
        requirement = "sglang"
        index = "private"
        """,
    )


def _cli(project: FakeProject, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stackfarm", *args],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
        check=False,
    )


def _files_holding(root: Path, *needles: str) -> list[str]:
    """Every file under `root` whose bytes hold one of `needles` (as text or as bytes)."""
    found = []
    for path in sorted(root.rglob("*")) if root.exists() else ():
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if any(n.encode() in data for n in needles):
                found.append(str(path))
    return found


def _assert_no_secret(project: FakeProject, *outputs: subprocess.CompletedProcess[str]) -> None:
    for done in outputs:
        for stream, text in (("stdout", done.stdout), ("stderr", done.stderr)):
            assert SECRET not in text, f"{stream} of {done.args[3:]} holds the secret:\n{text}"
            assert TOKEN not in text, f"{stream} of {done.args[3:]} holds the Authorization token:\n{text}"
    for area in (project.reports, project.cache):
        assert _files_holding(area, SECRET, TOKEN) == [], f"{area} holds the secret"


# --------------------------------------------------------------------------- in memory, at load


def test_loading_the_matrix_keeps_the_credentials_in_memory_only(
    fake_project: FakeProject, private: Private
) -> None:
    loaded = matrix.load(_private_matrix(fake_project, private))
    url = loaded.indexes["private"].url
    assert url == f"{private.base}/simple"
    assert SECRET not in repr(loaded)
    assert indexauth.credentials(url) == (USER, SECRET)
    # Only for that host and port: another port of the same host gets none.
    assert indexauth.credentials("http://127.0.0.1:1/simple") is None


def test_take_credentials_takes_userinfo_apart_and_keeps_it_for_that_host() -> None:
    assert indexauth.take_credentials("https://tok%40en:p%3Aw@example.invalid:8443/simple/") == (
        "https://example.invalid:8443/simple/"
    )
    assert indexauth.credentials("https://example.invalid:8443/simple/x/") == ("tok@en", "p:w")
    assert indexauth.credentials("https://example.invalid/simple") is None  # port 443: another host
    assert (
        indexauth.take_credentials("https://only-a-token@token.invalid/simple")
        == "https://token.invalid/simple"
    )
    assert indexauth.credentials("https://token.invalid/x") == ("only-a-token", "")
    assert indexauth.take_credentials("https://plain.invalid/simple") == "https://plain.invalid/simple"


def test_the_retry_lines_name_the_index_without_its_credentials(capsys: pytest.CaptureFixture[str]) -> None:
    from stackfarm import httpclient, indexwait
    from stackfarm.errors import IndexUnreachableError

    indexwait.reset()
    url = f"http://{USER}:{SECRET}@127.0.0.1:9/simple/x/"
    lines: list[str] = []

    def down(_timeout: float) -> None:
        raise ConnectionRefusedError("refused")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(indexwait, "progress_line", lines.append)
        client = httpclient.Client(role="index", hint="h", delays=(0.0, 0.0), sleep=lambda _s: None)
        with pytest.raises(IndexUnreachableError) as err:
            client.call(url, down)
    indexwait.reset()
    assert lines
    assert all("index http://127.0.0.1:9: retry" in line for line in lines)
    assert SECRET not in "\n".join(lines)
    assert SECRET not in str(err.value)
    assert "http://127.0.0.1:9/simple/x/ is unreachable" in str(err.value)


# --------------------------------------------------------------------------- the CLI end to end


def test_plan_sends_the_credentials_and_prints_none(fake_project: FakeProject, private: Private) -> None:
    fake_project.suite("00-ok", "pass")
    _private_matrix(fake_project, private)
    done = _cli(fake_project, "plan", "--matrix", str(fake_project.matrix))
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    assert cell_id(OLD) in done.stdout
    assert any(p.startswith("/simple/sglang") for p in private.authorized()), private.seen
    as_json = _cli(fake_project, "plan", "--json", "--refresh", "--matrix", str(fake_project.matrix))
    assert as_json.returncode == ExitCode.OK, as_json.stderr
    _assert_no_secret(fake_project, done, as_json)


@pytest.mark.parametrize("listing", ["relative", "absolute URLs with the credentials"])
def test_a_run_sends_the_credentials_and_no_report_or_cache_file_holds_them(
    fake_project: FakeProject, private: Private, listing: str
) -> None:
    fake_project.suite("00-ok", "pass")
    _private_matrix(fake_project, private)
    private.absolute = listing != "relative"
    done = _cli(fake_project, *fake_project.argv())
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    assert any(p.startswith("/files/sglang-0.5.9") for p in private.authorized()), private.seen
    for name in ("verdict.json",):
        assert (fake_project.reports / cell_id(OLD) / name).is_file()
    for name in ("junit.xml", "summary.md", "summary.html", "index.html"):
        assert (fake_project.reports / name).is_file(), name
    _assert_no_secret(fake_project, done)


def test_an_index_that_is_down_prints_retries_and_reports_without_the_credentials(
    fake_project: FakeProject, private: Private
) -> None:
    fake_project.suite("00-ok", "pass")
    _private_matrix(fake_project, private)
    private.down = True
    plan = _cli(fake_project, "plan", "--matrix", str(fake_project.matrix))
    assert plan.returncode == ExitCode.ENVIRONMENT, plan.stdout + plan.stderr
    assert f"index {private.base}: retry 1/" in plan.stderr
    as_json = _cli(fake_project, "plan", "--json", "--matrix", str(fake_project.matrix))
    assert as_json.returncode == ExitCode.ENVIRONMENT, as_json.stderr
    assert f"index {private.base}: gave up after" in as_json.stdout
    run = _cli(fake_project, *fake_project.argv())
    assert run.returncode == ExitCode.ENVIRONMENT, run.stdout + run.stderr
    assert "retry 1/" in run.stdout + run.stderr
    reason = json.loads((fake_project.reports / cell_id(OLD) / "verdict.json").read_text())
    assert f"{private.base}/simple" in json.dumps(reason)  # the index is named, without its credentials
    for name in ("junit.xml", "summary.md", "summary.html", "index.html"):
        assert (fake_project.reports / name).is_file(), name
    # The credentials were sent all the same: the index only said it was down.
    assert all(a == f"Basic {TOKEN}" for _p, a in private.seen), private.seen
    _assert_no_secret(fake_project, plan, as_json, run)


# --------------------------------------------------------------------------- the reports' last guard


def test_reports_scrub_a_url_password_that_came_from_elsewhere(tmp_path: Path) -> None:
    """A verdict stored before URLs were stripped (or a suite's own failure message) may name a URL with its
    password: junit.xml, summary.md/html and index.html are written without it."""
    from conftest import cell_report
    from stackfarm import htmlreport, reports

    leaked = f"{private_url()} answered HTTP 401 Unauthorized"
    cells = [
        cell_report(cell="c1", status="error", reason=leaked),
        cell_report(cell="c2", status="conflict", reason=f"see {private_url()}"),
    ]
    out = tmp_path / "reports"
    out.mkdir()
    reports.write_summaries(cells, out)
    htmlreport.write(out, cells)
    written = {p.name for p in out.rglob("*") if p.is_file()}
    assert {"junit.xml", "summary.md", "summary.html", "index.html"} <= written
    assert _files_holding(out, SECRET) == []
    assert "http://127.0.0.1:8080/simple/sglang/ answered HTTP 401" in (out / "summary.md").read_text()
    assert indexauth.scrub(leaked) == "http://127.0.0.1:8080/simple/sglang/ answered HTTP 401 Unauthorized"
    assert indexauth.scrub("mail a@b.example, http://host/p@x") == "mail a@b.example, http://host/p@x"


def private_url() -> str:
    return f"http://{USER}:{SECRET}@127.0.0.1:8080/simple/sglang/"
