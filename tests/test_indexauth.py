"""Tests for stackfarm.indexauth: netrc / keyring credentials for a private index on 127.0.0.1, and that the
secret shows up nowhere but in the Authorization header (not in URLs, errors, the cache or its keys)."""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import threading
import types
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stackfarm import artifacts, httpclient, indexauth, indexwait
from stackfarm.artifacts import Cache, Source, Target, find_artifact, list_versions
from stackfarm.errors import ConfigError, IndexUnreachableError

SECRET = "s3cr3t-Pa55"
TARGET = Target(python="3.11", platform="manylinux_2_39_x86_64")


@dataclass
class Private:
    """A private index: every request needs user/SECRET; /files/ of the other host redirect to 'cdn'."""

    base: str = ""
    other: str = ""  # the same server under another host name (localhost vs 127.0.0.1)
    blobs: dict[str, bytes] = field(default_factory=dict)
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)  # (host, path, Authorization)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, code: int, body: bytes, ctype: str = "text/plain", **headers: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        state = self.server.state
        host = self.headers.get("Host", "").split(":")[0]
        auth = self.headers.get("Authorization")
        state.seen.append((host, self.path, auth))
        parts = self.path.strip("/").split("/")
        if parts[0] == "cdn":  # the file host: public, must never see the index's credentials
            self._send(200, state.blobs[parts[1]], "application/octet-stream")
            return
        want = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
        if auth != want:
            self._send(401, b"who are you", WWW_Authenticate='Basic realm="private"')
            return
        if parts[0] == "simple":
            files = [
                {
                    "filename": n,
                    "url": f"../../files/{n}",
                    "hashes": {"sha256": hashlib.sha256(d).hexdigest()},
                }
                for n, d in state.blobs.items()
            ]
            self._send(200, json.dumps({"files": files}).encode(), "application/vnd.pypi.simple.v1+json")
        elif parts[0] == "files" and parts[1] in state.blobs:
            self._send(302, b"", Location=f"{state.other}/cdn/{parts[1]}")
        else:
            self._send(404, b"no")


class _Server(ThreadingHTTPServer):
    state: Private


@pytest.fixture
def private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Private]:
    server = _Server(("127.0.0.1", 0), _Handler)
    port = server.server_address[1]
    server.state = Private(base=f"http://127.0.0.1:{port}", other=f"http://localhost:{port}")
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
    server.state.blobs[wheel.name] = wheel.read_bytes()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setattr(artifacts, "_sleep", lambda _s: None)
    monkeypatch.setattr(indexwait, "progress_line", lambda _line: None)
    monkeypatch.setattr(indexauth, "USE_KEYRING", False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    artifacts._LISTINGS.clear()
    indexwait.reset()
    yield server.state
    artifacts._LISTINGS.clear()
    indexwait.reset()
    server.shutdown()
    server.server_close()


def _netrc(tmp_path: Path, text: str) -> None:
    (tmp_path / "netrc").write_text(text)
    (tmp_path / "netrc").chmod(0o600)


def _everything_under(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def test_netrc_credentials_reach_the_index_only(private: Private, tmp_path: Path) -> None:
    _netrc(tmp_path, f"machine 127.0.0.1 login user password {SECRET}\n")
    source = Source(name="private", url=f"{private.base}/simple")
    assert list_versions(source, "pkg") == ["1.0"]
    art = find_artifact(source, "pkg", "1.0", TARGET)
    cache = Cache(tmp_path / "cache")
    assert cache.metadata(art)["Name"] == "pkg"  # listing, file (redirected to the other host), METADATA
    index_hits = [a for host, _p, a in private.seen if host == "127.0.0.1"]
    assert index_hits
    assert all(a and a.startswith("Basic ") for a in index_hits)
    cdn = [(p, a) for host, p, a in private.seen if host == "localhost"]
    assert cdn
    assert all(a is None for _p, a in cdn), "the redirect carried the index's credentials"
    token = base64.b64encode(f"user:{SECRET}".encode()).decode()
    for text in (repr(art), art.url, _everything_under(cache.root)):
        assert SECRET not in text
        assert token not in text


def test_wrong_password_error_names_no_secret(private: Private, tmp_path: Path) -> None:
    _netrc(tmp_path, "machine 127.0.0.1 login user password wrong-Pa55\n")
    with pytest.raises(IndexUnreachableError) as info:
        list_versions(Source(name="private", url=f"{private.base}/simple"), "pkg")
    assert "401" in str(info.value)
    assert "credentials" in str(info.value)
    assert "wrong-Pa55" not in str(info.value)


def test_no_netrc_entry_is_no_credentials(private: Private, tmp_path: Path) -> None:
    _netrc(tmp_path, f"machine elsewhere.example login user password {SECRET}\n")
    assert indexauth.credentials(f"{private.base}/simple") is None
    with pytest.raises(IndexUnreachableError, match="401"):
        list_versions(Source(name="private", url=f"{private.base}/simple"), "pkg")


def test_broken_netrc_is_a_config_error_naming_the_file_not_the_secret(tmp_path: Path) -> None:
    path = tmp_path / "broken-netrc"
    path.write_text(f"machine 127.0.0.1 login user password {SECRET}\nbogus-token here\n")
    path.chmod(0o600)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NETRC", str(path))
        with pytest.raises(ConfigError) as info:
            indexauth.credentials("https://127.0.0.1/simple")
    assert str(path) in str(info.value)
    assert "fix:" in str(info.value)
    assert SECRET not in str(info.value)


def test_keyring_is_asked_when_importable(
    private: Private, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def get_credential(service: str, username: str | None) -> object:
        asked.append(service)
        return types.SimpleNamespace(username="user", password=SECRET) if service == "127.0.0.1" else None

    monkeypatch.setitem(sys.modules, "keyring", types.SimpleNamespace(get_credential=get_credential))
    monkeypatch.setattr(indexauth, "USE_KEYRING", True)
    assert list_versions(Source(name="private", url=f"{private.base}/simple"), "pkg") == ["1.0"]
    assert asked[:2] == ["http://127.0.0.1", "127.0.0.1"]


def test_keyring_absent_or_broken_means_no_credentials(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setattr(indexauth, "USE_KEYRING", True)
    monkeypatch.setitem(sys.modules, "keyring", None)  # import keyring raises ImportError
    assert indexauth.credentials("https://example.invalid/simple") is None

    def broken(service: str, username: str | None) -> object:
        raise RuntimeError("no backend")

    monkeypatch.setitem(sys.modules, "keyring", types.SimpleNamespace(get_credential=broken))
    assert indexauth.credentials("https://example.invalid/simple") is None


def test_redact_strips_userinfo() -> None:
    assert indexauth.redact(f"https://user:{SECRET}@host.example/simple") == "https://host.example/simple"
    assert indexauth.redact("https://host.example/simple") == "https://host.example/simple"
    assert httpclient.request(f"https://user:{SECRET}@host.example/x").full_url == "https://host.example/x"
