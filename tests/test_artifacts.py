"""Tests for stackfarm.artifacts against a fake PEP 691 index on 127.0.0.1 (no network)."""

from __future__ import annotations

import base64
import dataclasses
import errno
import hashlib
import json
import shutil
import socket
import sys
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from packaging.utils import parse_sdist_filename, parse_wheel_filename

from stackfarm import artifacts, cachekeep, indexwait, wheelunpack
from stackfarm.artifacts import (
    Artifact,
    Cache,
    Source,
    Target,
    find_artifact,
    list_versions,
    requires_dist,
)
from stackfarm.errors import ArtifactError, IndexUnreachableError

TARGET = Target(python="3.11", platform="manylinux_2_39_x86_64")


def build_wheel(
    folder: Path,
    name: str = "pkg",
    version: str = "1.0",
    tag: str = "cp311-cp311-manylinux_2_28_x86_64",
    requires: tuple[str, ...] = (),
    extra: dict[str, bytes] | None = None,
    record: dict[str, str] | None = None,
) -> Path:
    """A tiny real-format wheel (PEP 427): METADATA with Requires-Dist, WHEEL, a module, an executable .so, the
    ``extra`` members, and a RECORD of their sha256 (``record`` overrides entries: a lying RECORD)."""
    path = folder / f"{name}-{version}-{tag}.whl"
    info_dir = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    purelib = "true" if tag.endswith("none-any") else "false"
    members = [
        (f"{info_dir}/METADATA", meta.encode(), 0o644),
        (
            f"{info_dir}/WHEEL",
            f"Wheel-Version: 1.0\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n".encode(),
            0o644,
        ),
        (f"{name}/__init__.py", b"x = 1\n", 0o644),
        (f"{name}/lib.so", b"\x7fELF fake", 0o755),
        *((m, d, 0o755 if "/scripts/" in m else 0o644) for m, d in (extra or {}).items()),
    ]
    rows = {m: f"{m},sha256={_b64(hashlib.sha256(d).digest())},{len(d)}" for m, d, _ in members}
    rows.update(record or {})
    members.append(
        (f"{info_dir}/RECORD", ("\n".join([*rows.values(), f"{info_dir}/RECORD,,"]) + "\n").encode(), 0o644)
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data, mode in members:
            info = zipfile.ZipInfo(member)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return path


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class FakeIndex:
    """State behind the fake server; tests add files and tweak behaviour."""

    base: str = ""
    projects: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    html: bool = False
    fail_listing: int = 0
    ignore_range: bool = False
    cut_after: int | None = None  # send only this many bytes of the next file, then hang up

    @property
    def url(self) -> str:
        return f"{self.base}/simple"

    @property
    def source(self) -> Source:
        return Source(name="fake", url=self.url)

    def add(
        self,
        wheel: Path | str,
        data: bytes | None = None,
        *,
        yanked: bool = False,
        digest: str | None = None,
        metadata: bytes | None = None,
        metadata_digest: str | None = None,
        metadata_key: str = "core-metadata",
    ) -> Artifact:
        """Serve a wheel (a built file, or just a filename with bytes); return what the index says. With
        ``metadata``, the index also serves ``<file>.metadata`` (PEP 658) and lists its sha256 (PEP 714 key
        ``metadata_key``; ``metadata_digest`` "" lists it without a hash)."""
        filename = wheel.name if isinstance(wheel, Path) else wheel
        data = wheel.read_bytes() if isinstance(wheel, Path) else (data or filename.encode())
        is_wheel = filename.endswith(".whl")
        name, version = (parse_wheel_filename if is_wheel else parse_sdist_filename)(filename)[:2]
        self.blobs[filename] = data
        entry: dict[str, object] = {
            "filename": filename,
            "url": f"../../files/{filename}",
            "hashes": {"sha256": digest or sha(data)},
            "size": len(data),
            "yanked": yanked,
        }
        meta_sha = None
        if metadata is not None:
            self.blobs[filename + ".metadata"] = metadata
            meta_sha = sha(metadata) if metadata_digest is None else metadata_digest
            entry[metadata_key] = {"sha256": meta_sha} if meta_sha else True
        self.projects.setdefault(name, []).append(entry)
        return Artifact(
            distribution=name,
            version=str(version),
            filename=filename,
            url=f"{self.base}/files/{filename}",
            sha256=digest or sha(data),
            size=len(data),
            source="fake",
            metadata_sha256=meta_sha or None,
        )

    def count(self, prefix: str) -> int:
        return sum(path.startswith(prefix) for path, _ in self.requests)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # silence the test output
        pass

    def _send(self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        state = self.server.state
        state.requests.append((self.path, dict(self.headers.items())))
        parts = self.path.strip("/").split("/")
        if parts[0] == "simple" and len(parts) == 2:
            if state.fail_listing > 0:
                state.fail_listing -= 1
                self._send(503, b"busy", "text/plain")
            elif parts[1] not in state.projects:
                self._send(404, b"not found", "text/plain")
            elif state.html:
                links = "".join(
                    f'<a href="{f["url"]}#sha256={f["hashes"]["sha256"]}"'  # type: ignore[index]
                    f"{' data-yanked' if f['yanked'] else ''}{_html_metadata(f)}>{f['filename']}</a>\n"
                    for f in state.projects[parts[1]]
                )
                self._send(200, f"<html><body>{links}</body></html>".encode(), "text/html")
            else:
                body = json.dumps({"meta": {"api-version": "1.0"}, "files": state.projects[parts[1]]})
                self._send(200, body.encode(), "application/vnd.pypi.simple.v1+json")
        elif parts[0] == "files" and parts[1] in state.blobs:
            data = state.blobs[parts[1]]
            rng = self.headers.get("Range")
            if state.cut_after is not None and not rng:
                cut, state.cut_after = state.cut_after, None
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[:cut])
                self.close_connection = True
                return
            if rng and not state.ignore_range:
                first, _, last = rng.removeprefix("bytes=").partition("-")
                if not first:  # bytes=-N: the last N bytes
                    start, end = max(0, len(data) - int(last)), len(data)
                else:
                    start, end = int(first), min(len(data), int(last) + 1 if last else len(data))
                crange = f"bytes {start}-{end - 1}/{len(data)}"
                self._send(206, data[start:end], "application/octet-stream", {"Content-Range": crange})
            else:
                self._send(200, data, "application/octet-stream")
        else:
            self._send(404, b"not found", "text/plain")


def _html_metadata(entry: dict[str, object]) -> str:
    """The PEP 658 attribute of an HTML link (PEP 714 name, or the old one)."""
    for key in ("core-metadata", "dist-info-metadata"):
        if key in entry:
            value = entry[key]
            digest = value.get("sha256") if isinstance(value, dict) else None
            return f' data-{key}="{f"sha256={digest}" if digest else "true"}"'
    return ""


class _Server(ThreadingHTTPServer):
    state: FakeIndex


@pytest.fixture
def index() -> Iterator[FakeIndex]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.state = FakeIndex(base=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server.state
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """No real sleeping between retries; the list records the pauses asked for. Each test starts with no
    index budget spent (a port one test found dead may serve the next one) and no progress lines shown."""
    slept: list[float] = []
    monkeypatch.setattr(artifacts, "_sleep", slept.append)
    monkeypatch.setattr(indexwait, "progress_line", lambda _line: None)
    indexwait.reset()
    yield slept
    indexwait.reset()


@pytest.fixture
def cache(tmp_path: Path) -> Cache:
    return Cache(tmp_path / "cache")


# --- listing and selection ---------------------------------------------------------------


def test_list_versions_skips_sdists_and_yanked_and_lists_once(index: FakeIndex) -> None:
    for v in ["1.0", "1.10", "1.2"]:
        index.add(f"pkg-{v}-py3-none-any.whl")
    index.add("pkg-2.0-py3-none-any.whl", yanked=True)
    index.add("pkg-3.0.tar.gz")
    assert list_versions(index.source, "PKG") == ["1.0", "1.2", "1.10"]
    assert list_versions(index.source, "pkg") == ["1.0", "1.2", "1.10"]
    assert index.count("/simple/pkg/") == 1
    accept = index.requests[0][1]["Accept"]
    assert accept.startswith("application/vnd.pypi.simple.v1+json")


def test_unknown_project_is_empty_not_unreachable(index: FakeIndex) -> None:
    assert list_versions(index.source, "nope") == []
    with pytest.raises(ArtifactError, match="no wheels of nope") as err:
        find_artifact(index.source, "nope", "1.0", TARGET)
    assert not isinstance(err.value, IndexUnreachableError)


def test_html_fallback_with_sha_fragment(index: FakeIndex, cache: Cache, tmp_path: Path) -> None:
    index.html = True
    expected = index.add(build_wheel(tmp_path))
    index.add("pkg-1.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    index.add("pkg-1.0-py3-none-any.whl", yanked=True)
    found = find_artifact(index.source, "pkg", "1.0", TARGET)
    assert found == dataclasses.replace(expected, size=None)  # PEP 503 pages carry no size
    assert cache.fetch(found).read_bytes() == (tmp_path / found.filename).read_bytes()


@pytest.mark.parametrize(
    ("tags", "best"),
    [
        (
            [
                "cp312-cp312-manylinux_2_28_x86_64",
                "cp311-cp311-musllinux_1_2_x86_64",
                "cp39-abi3-manylinux_2_17_x86_64",
                "py3-none-any",
                "cp311-cp311-manylinux_2_40_x86_64",  # needs a newer glibc than the target
                "cp311-cp311-manylinux_2_28_aarch64",
                "cp311-cp311-manylinux_2_28_x86_64",
                "cp311-cp311-manylinux2014_x86_64",
            ],
            "cp311-cp311-manylinux_2_28_x86_64",
        ),
        (
            ["cp311-cp311-manylinux1_x86_64", "cp311-cp311-manylinux2010_x86_64"],
            "cp311-cp311-manylinux2010_x86_64",
        ),
        (
            ["py3-none-any", "cp39-abi3-manylinux2014_x86_64", "cp312-cp312-manylinux1_x86_64"],
            "cp39-abi3-manylinux2014_x86_64",
        ),
        (["cp312-abi3-manylinux_2_28_x86_64", "py3-none-any"], "py3-none-any"),
    ],
)
def test_tag_selection_picks_best_ranked(index: FakeIndex, tags: list[str], best: str) -> None:
    for tag in tags:
        index.add(f"pkg-1.0-{tag}.whl")
    assert find_artifact(index.source, "pkg", "1.0", TARGET).filename == f"pkg-1.0-{best}.whl"


def test_no_wheel_fits_target_lists_wheels(index: FakeIndex) -> None:
    index.add("pkg-1.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    index.add("pkg-1.0-cp311-cp311-musllinux_1_2_x86_64.whl")
    with pytest.raises(ArtifactError) as err:
        find_artifact(index.source, "pkg", "1.0", TARGET)
    text = str(err.value)
    assert "no wheel fits python 3.11 on manylinux_2_39_x86_64" in text
    assert "pkg-1.0-cp312-cp312-manylinux_2_28_x86_64.whl" in text
    assert "pkg-1.0-cp311-cp311-musllinux_1_2_x86_64.whl" in text


def test_missing_version_lists_nearby_and_suggests(index: FakeIndex) -> None:
    for v in ["1.0", "1.1", "1.2", "2.0", "2.1", "2.2", "3.0"]:
        index.add(f"pkg-{v}-py3-none-any.whl")
    with pytest.raises(ArtifactError) as err:
        find_artifact(index.source, "pkg", "2.3", TARGET)
    text = str(err.value)
    assert f"pkg 2.3 is not on {index.url}" in text
    assert "versions nearby (newest first): 3.0, 2.2, 2.1, 2.0, 1.2" in text
    assert "did you mean `2." in text


def test_local_label_must_match_exactly(index: FakeIndex) -> None:
    index.add("torch-2.9.0-py3-none-any.whl")
    index.add("torch-2.9.1+cu130-py3-none-any.whl")
    found = find_artifact(index.source, "torch", "2.9.1+cu130", TARGET)
    assert (found.version, found.distribution) == ("2.9.1+cu130", "torch")
    with pytest.raises(ArtifactError, match=r"torch 2\.9\.1 is not on") as err:
        find_artifact(index.source, "torch", "2.9.1", TARGET)
    assert "+label" in str(err.value)
    assert "2.9.1+cu130" in str(err.value)
    index.add("torch-2.9.1-py3-none-any.whl")
    artifacts._LISTINGS.clear()
    assert find_artifact(index.source, "torch", "2.9.1", TARGET).version == "2.9.1"


def test_unreachable_index_retries_then_raises(fast_retries: list[float]) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    source = Source(name="dead", url=f"http://127.0.0.1:{port}/simple")
    with pytest.raises(IndexUnreachableError) as err:
        list_versions(source, "pkg")
    assert f"http://127.0.0.1:{port}/simple/pkg/" in str(err.value)
    assert "check the index URL in matrix.toml [indexes] or your network" in str(err.value)
    assert fast_retries == [0.5, 1.0, 2.0]


def test_5xx_is_retried(index: FakeIndex, fast_retries: list[float]) -> None:
    index.add("pkg-1.0-py3-none-any.whl")
    index.fail_listing = 2
    assert list_versions(index.source, "pkg") == ["1.0"]
    assert fast_retries == [0.5, 1.0]


# --- cache: fetch ------------------------------------------------------------------------


def test_fetch_downloads_verifies_and_reports_progress(
    index: FakeIndex, cache: Cache, tmp_path: Path
) -> None:
    wheel = build_wheel(tmp_path)
    index.add(wheel)
    art = find_artifact(index.source, "pkg", "1.0", TARGET)
    seen: list[tuple[int, int | None]] = []
    blob = cache.fetch(art, lambda done, total: seen.append((done, total)))
    assert blob == cache.blob_path(art)
    assert blob.read_bytes() == wheel.read_bytes()
    assert seen[-1] == (wheel.stat().st_size, wheel.stat().st_size)
    assert cache.fetch(art) == blob
    assert index.count("/files/") == 1
    assert not list((cache.root / "tmp").iterdir())


def test_fetch_resumes_a_part_file_with_range(index: FakeIndex, cache: Cache) -> None:
    data = bytes(range(256)) * 20_000
    art = index.add("pkg-1.0-py3-none-any.whl", data)
    part = cache.root / "tmp" / f"{art.sha256}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:1234])
    assert cache.fetch(art).read_bytes() == data
    ranges = [h.get("Range") for p, h in index.requests if p.startswith("/files/")]
    assert ranges == ["bytes=1234-"]
    assert not part.exists()


def test_dropped_connection_is_resumed(index: FakeIndex, cache: Cache, fast_retries: list[float]) -> None:
    data = bytes(range(256)) * 4000
    art = index.add("pkg-1.0-py3-none-any.whl", data)
    index.cut_after = 5000
    assert cache.fetch(art).read_bytes() == data
    ranges = [h.get("Range") for p, h in index.requests if p.startswith("/files/")]
    assert ranges == [None, "bytes=5000-"]
    assert fast_retries == [0.5]


def test_missing_blob_on_server_is_an_artifact_error(index: FakeIndex, cache: Cache) -> None:
    art = index.add("pkg-1.0-py3-none-any.whl", b"data")
    del index.blobs[art.filename]
    with pytest.raises(ArtifactError, match="HTTP 404"):
        cache.fetch(art)


def test_disk_full_while_fetching(index: FakeIndex, cache: Cache, monkeypatch: pytest.MonkeyPatch) -> None:
    art = index.add("pkg-1.0-py3-none-any.whl", b"data" * 1000)

    def full(*args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(artifacts, "_copy", full)
    with pytest.raises(ArtifactError, match="disk full while fetching"):
        cache.fetch(art)
    assert not cache.blob_path(art).exists()


def test_fetch_starts_over_when_server_ignores_range(index: FakeIndex, cache: Cache) -> None:
    data = b"wheel bytes " * 1000
    art = index.add("pkg-1.0-py3-none-any.whl", data)
    index.ignore_range = True
    part = cache.root / "tmp" / f"{art.sha256}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:100])
    assert cache.fetch(art).read_bytes() == data


def test_stale_part_is_discarded_and_fresh_download_wins(index: FakeIndex, cache: Cache) -> None:
    data = b"good " * 1000
    art = index.add("pkg-1.0-py3-none-any.whl", data)
    part = cache.root / "tmp" / f"{art.sha256}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"junk!")  # not a prefix of the real file
    assert cache.fetch(art).read_bytes() == data


def test_corrupted_blob_is_detected_and_refetched(index: FakeIndex, cache: Cache, tmp_path: Path) -> None:
    art = index.add(build_wheel(tmp_path))
    blob = cache.fetch(art)
    blob.write_bytes(b"bit rot")
    assert Cache(cache.root).fetch(art).read_bytes() == (tmp_path / art.filename).read_bytes()
    blob.write_bytes(b"bit rot, again, same process")
    assert cache.fetch(art).read_bytes() == (tmp_path / art.filename).read_bytes()
    assert index.count("/files/") == 3


def test_sha_mismatch_raises_and_leaves_nothing(index: FakeIndex, cache: Cache) -> None:
    art = index.add("pkg-1.0-py3-none-any.whl", b"payload", digest="0" * 64)
    with pytest.raises(ArtifactError) as err:
        cache.fetch(art)
    text = str(err.value)
    assert art.filename in text
    assert "0" * 64 in text
    assert sha(b"payload") in text
    assert not cache.blob_path(art).exists()
    assert not list((cache.root / "tmp").iterdir())


def test_parallel_fetches_of_one_blob_do_not_collide(index: FakeIndex, tmp_path: Path) -> None:
    data = b"x" * 3_000_000
    art = index.add("pkg-1.0-py3-none-any.whl", data)
    root = tmp_path / "shared"
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(Cache(root).fetch(art))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4
    assert {p.read_bytes() == data for p in results} == {True}
    assert index.count("/files/") == 1


def test_bad_sha_in_artifact_is_rejected(cache: Cache) -> None:
    art = Artifact(
        distribution="pkg", version="1", filename="p.whl", url="", sha256="../x", size=None, source="s"
    )
    with pytest.raises(ArtifactError, match="not a sha256"):
        cache.blob_path(art)


# --- cache: unpack and metadata ----------------------------------------------------------


def test_unpack_is_atomic_idempotent_read_only_and_keeps_exec_bits(
    index: FakeIndex, cache: Cache, tmp_path: Path
) -> None:
    art = index.add(build_wheel(tmp_path))
    tree = cache.unpack(art)
    assert tree == cache.root / "trees" / art.sha256
    assert (tree / "pkg" / "__init__.py").read_text() == "x = 1\n"
    assert (tree / "pkg" / "lib.so").stat().st_mode & 0o777 == 0o555
    assert (tree / "pkg" / "__init__.py").stat().st_mode & 0o777 == 0o444
    assert (tree / "pkg").stat().st_mode & 0o777 == 0o555
    assert tree.stat().st_mode & 0o777 == 0o555
    assert (tree / ".stackfarm-complete").is_file()
    assert not list((cache.root / "tmp").iterdir())
    cache.blob_path(art).unlink()  # a complete tree needs neither the blob nor the network
    assert cache.unpack(art) == tree
    assert not cache.blob_path(art).exists()


def test_unpack_replaces_an_unmarked_leftover(index: FakeIndex, cache: Cache, tmp_path: Path) -> None:
    art = index.add(build_wheel(tmp_path))
    leftover = cache.root / "trees" / art.sha256
    leftover.mkdir(parents=True)
    (leftover / "half-written").write_text("")
    tree = cache.unpack(art)
    assert not (tree / "half-written").exists()
    assert (tree / "pkg" / "lib.so").is_file()


@pytest.mark.parametrize("evil", ["../evil.txt", "/tmp/evil.txt", "pkg/../../evil.txt"])
def test_zip_slip_is_rejected(index: FakeIndex, cache: Cache, tmp_path: Path, evil: str) -> None:
    art = index.add(build_wheel(tmp_path, extra={evil: b"owned"}))
    with pytest.raises(ArtifactError, match="unsafe path"):
        cache.unpack(art)
    assert not (cache.root / "trees" / art.sha256).exists()
    assert not list((cache.root / "tmp").glob("*.unpack-*"))
    assert not (cache.root / "evil.txt").exists()
    assert not (cache.root / "tmp" / "evil.txt").exists()


def test_disk_full_while_unpacking(
    index: FakeIndex, cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    art = index.add(build_wheel(tmp_path))
    cache.fetch(art)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wheelunpack._Destination, "write_to_fs", full)
    with pytest.raises(ArtifactError, match="disk full while unpacking") as err:
        cache.unpack(art)
    assert "STACKFARM_CACHE" in str(err.value)
    assert art.filename in str(err.value)
    assert not list((cache.root / "tmp").glob("*.unpack-*"))
    assert not (cache.root / "trees" / art.sha256).exists()


def test_unpack_places_data_schemes_like_an_install(index: FakeIndex, cache: Cache, tmp_path: Path) -> None:
    data = "pkg-1.0.data"
    art = index.add(
        build_wheel(
            tmp_path,
            extra={
                f"{data}/purelib/pkg_pure.py": b"pure = 1\n",
                f"{data}/platlib/pkg/_native.so": b"\x7fELF plat",
                f"{data}/scripts/pkg-tool": b"#!python\nprint('tool')\n",
                f"{data}/headers/pkg.h": b"int pkg(void);\n",
                f"{data}/data/share/pkg/config.json": b"{}\n",
            },
        )
    )
    tree = cache.unpack(art)
    assert (tree / "pkg_pure.py").read_text() == "pure = 1\n"  # merged into the root (site-packages)
    assert (tree / "pkg" / "_native.so").read_bytes() == b"\x7fELF plat"
    assert (tree / "pkg" / "__init__.py").is_file()
    prefix = tree / wheelunpack.PREFIX
    tool = prefix / "bin" / "pkg-tool"
    assert tool.read_text().startswith("#!")
    assert "#!python\n" not in tool.read_text()
    assert tool.stat().st_mode & 0o111
    py = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert (prefix / "include" / "site" / py / "pkg" / "pkg.h").read_text() == "int pkg(void);\n"
    assert (prefix / "share" / "pkg" / "config.json").read_text() == "{}\n"
    assert not (tree / data).exists()
    # The installed RECORD lists every file where it now is, and the manifest agrees with the files.
    record = (tree / "pkg-1.0.dist-info" / "RECORD").read_text()
    assert "pkg_pure.py,sha256=" in record
    assert f"{wheelunpack.PREFIX}/bin/pkg-tool,sha256=" in record
    assert cachekeep.tree_problems(tree) == []


def test_unpack_refuses_members_that_differ_from_record(
    index: FakeIndex, cache: Cache, tmp_path: Path
) -> None:
    lie = f"pkg/__init__.py,sha256={_b64(hashlib.sha256(b'y = 2').digest())},5"
    art = index.add(build_wheel(tmp_path, record={"pkg/__init__.py": lie}))
    with pytest.raises(ArtifactError, match=r"1 members differ from its RECORD \(pkg/__init__.py\)"):
        cache.unpack(art)
    assert cache.unpacked(art) is None
    assert not list((cache.root / "tmp").glob("*.unpack-*"))


@pytest.mark.parametrize(("algorithm", "ok"), [("sha512", True), ("sha384", True), ("md5", False)])
def test_record_hash_algorithms(
    index: FakeIndex, cache: Cache, tmp_path: Path, algorithm: str, ok: bool
) -> None:
    digest = _b64(hashlib.new(algorithm, b"x = 1\n").digest())
    art = index.add(
        build_wheel(tmp_path, record={"pkg/__init__.py": f"pkg/__init__.py,{algorithm}={digest},6"})
    )
    if ok:
        assert (cache.unpack(art) / "pkg" / "__init__.py").read_text() == "x = 1\n"
    else:
        with pytest.raises(ArtifactError, match="md5, not sha256 or stronger"):
            cache.unpack(art)


def test_unpack_refuses_an_unknown_data_scheme(index: FakeIndex, cache: Cache, tmp_path: Path) -> None:
    art = index.add(build_wheel(tmp_path, extra={"pkg-1.0.data/elsewhere/x.txt": b"x"}))
    with pytest.raises(ArtifactError, match=r"not a valid wheel.*valid \.data subdirectory"):
        cache.unpack(art)


def test_metadata_and_requires_dist(index: FakeIndex, cache: Cache, tmp_path: Path) -> None:
    requires = (
        "torch==2.9.1",
        "tomli; python_version < '3.11'",
        "pytest; extra == 'test'",
        "nvidia-nccl-cu12; platform_machine == 'x86_64' and sys_platform == 'linux'",
        "pywin32; sys_platform == 'win32'",
        "cpy-only; implementation_name == 'cpython' and os_name == 'posix'",
        "new-py; python_full_version >= '3.11.0'",
    )
    art = index.add(build_wheel(tmp_path, requires=requires))
    index.ignore_range = True  # neither PEP 658 nor ranges: the whole wheel is read
    meta = cache.metadata(art)
    assert meta["Name"] == "pkg"
    assert cache.metadata(art) is meta
    names = [r.name for r in requires_dist(meta, python="3.11")]
    assert names == ["torch", "nvidia-nccl-cu12", "cpy-only", "new-py"]
    names = [r.name for r in requires_dist(meta, python="3.10", platform_machine="aarch64")]
    assert names == ["torch", "tomli", "cpy-only"]


def _metadata_of(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")))


@pytest.mark.parametrize(
    ("html", "key"),
    [
        (False, "core-metadata"),
        (True, "core-metadata"),
        (True, "dist-info-metadata"),
        (False, "dist-info-metadata"),
    ],
)
def test_pep658_metadata_is_read_without_the_wheel(
    index: FakeIndex, tmp_path: Path, html: bool, key: str
) -> None:
    index.html = html
    wheel = build_wheel(tmp_path, requires=("torch==2.9.1",))
    index.add(wheel, metadata=_metadata_of(wheel), metadata_key=key)
    art = find_artifact(index.source, "pkg", "1.0", TARGET)
    assert art.metadata_sha256 == sha(_metadata_of(wheel))
    cache = Cache(tmp_path / "cache")
    meta = cache.metadata(art)
    assert [str(r) for r in requires_dist(meta, python="3.11")] == ["torch==2.9.1"]
    assert index.count(f"/files/{wheel.name}.metadata") == 1
    assert index.count(f"/files/{wheel.name}") == 1  # the .metadata request only: the wheel was never asked
    assert not cache.blob_path(art).exists()
    # Kept by the wheel's sha256: a new process reads it from disk.
    assert Cache(tmp_path / "cache").metadata(art)["Name"] == "pkg"
    assert index.count(f"/files/{wheel.name}") == 1


def test_pep658_metadata_mismatch_is_refused_and_not_kept(
    index: FakeIndex, cache: Cache, tmp_path: Path
) -> None:
    wheel = build_wheel(tmp_path)
    art = index.add(wheel, metadata=b"Name: evil\n", metadata_digest=sha(_metadata_of(wheel)))
    with pytest.raises(artifacts.ShaMismatchError, match=r"pkg-1.0-.*\.whl\.metadata .*expected"):
        cache.metadata(art)
    assert not list(cache.root.glob("metadata/*"))
    assert not cache.blob_path(art).exists()


def test_pep658_without_hash_or_missing_falls_back_to_the_wheel(
    index: FakeIndex, cache: Cache, tmp_path: Path
) -> None:
    index.ignore_range = True  # no range reads either: the whole wheel
    one = build_wheel(tmp_path, name="one")
    index.add(one, metadata=_metadata_of(one), metadata_digest="")  # "true": no hash to check it by
    art = find_artifact(index.source, "one", "1.0", TARGET)
    assert art.metadata_sha256 is None
    assert cache.metadata(art)["Name"] == "one"
    assert index.count(f"/files/{one.name}.metadata") == 0
    assert cache.blob_path(art).is_file()

    two = build_wheel(tmp_path, name="two")
    art = index.add(two, metadata=_metadata_of(two))
    del index.blobs[two.name + ".metadata"]  # listed, but the server has no such file
    assert cache.metadata(art)["Name"] == "two"
    assert cache.blob_path(art).is_file()


def test_metadata_by_range_requests_without_pep658(index: FakeIndex, tmp_path: Path) -> None:
    filler = {f"pkg/data{i}.bin": bytes(range(256)) * 4096 for i in range(8)}  # 8 MiB the read never needs
    wheel = build_wheel(tmp_path, requires=("torch==2.9.1",), extra=filler)
    art = index.add(wheel)
    cache = Cache(tmp_path / "cache")
    assert [str(r) for r in requires_dist(cache.metadata(art), python="3.11")] == ["torch==2.9.1"]
    assert not cache.blob_path(art).exists()
    ranges = [h.get("Range") for path, h in index.requests if path == f"/files/{wheel.name}"]
    assert ranges
    assert all(ranges)  # every request asked a range: the wheel was never downloaded whole
    assert Cache(cache.root).metadata(art)["Name"] == "pkg"  # kept: no more requests
    assert len([p for p, _h in index.requests if p == f"/files/{wheel.name}"]) == len(ranges)


def test_range_read_of_a_file_of_another_size_is_refused(
    index: FakeIndex, cache: Cache, tmp_path: Path
) -> None:
    art = dataclasses.replace(index.add(build_wheel(tmp_path)), size=123)
    with pytest.raises(ArtifactError, match="the index listed 123"):
        cache.metadata(art)


def test_metadata_comes_from_the_cached_wheel_first(index: FakeIndex, cache: Cache, tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    art = index.add(wheel, metadata=_metadata_of(wheel))
    cache.fetch(art)
    assert Cache(cache.root).metadata(art)["Name"] == "pkg"
    assert index.count(f"/files/{wheel.name}.metadata") == 0


# --- local sources -----------------------------------------------------------------------


def test_find_links_folder(cache: Cache, tmp_path: Path) -> None:
    folder = tmp_path / "wheels"
    folder.mkdir()
    build_wheel(folder, version="1.0")
    wheel = build_wheel(folder, version="1.1")
    build_wheel(folder, name="other", version="9.0")
    (folder / "pkg-2.0.tar.gz").write_bytes(b"sdist")
    source = Source(name="local", find_links=folder)
    assert list_versions(source, "pkg") == ["1.0", "1.1"]
    art = find_artifact(source, "pkg", "1.1", TARGET)
    assert art.sha256 == sha(wheel.read_bytes())
    assert art.url == wheel.resolve().as_uri()
    assert (art.source, art.size) == ("local", wheel.stat().st_size)
    assert cache.fetch(art).read_bytes() == wheel.read_bytes()
    assert (cache.unpack(art) / "pkg" / "lib.so").stat().st_mode & 0o111
    with pytest.raises(ArtifactError, match=f"pkg 3.0 is not on {folder}"):
        find_artifact(source, "pkg", "3.0", TARGET)


def test_single_wheel_source(cache: Cache, tmp_path: Path) -> None:
    wheel = build_wheel(
        tmp_path, name="sgl_kernel", version="0.3.21+cu130", tag="cp310-abi3-manylinux2014_x86_64"
    )
    source = Source(name="mine", wheel=wheel)
    assert list_versions(source, "sgl-kernel") == ["0.3.21+cu130"]
    art = find_artifact(source, "sgl-kernel", "0.3.21+cu130", TARGET)
    assert art.distribution == "sgl-kernel"
    assert cache.metadata(art)["Version"] == "0.3.21+cu130"


def test_source_needs_exactly_one_location(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Source(name="none")
    with pytest.raises(ValueError, match="exactly one"):
        Source(name="two", url="https://pypi.org/simple", wheel=tmp_path / "x.whl")


def test_default_cache_root_honours_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKFARM_CACHE", str(tmp_path / "c"))
    assert Cache().root == tmp_path / "c"
    monkeypatch.delenv("STACKFARM_CACHE")
    assert Cache().root == Path.home() / ".cache" / "stackfarm"


# --- the real index ----------------------------------------------------------------------


@pytest.mark.integration
def test_real_pypi_sglang(tmp_path: Path) -> None:
    pypi = Source(name="pypi", url="https://pypi.org/simple")
    versions = list_versions(pypi, "sglang")
    assert "0.5.9" in versions
    art = find_artifact(pypi, "sglang", "0.5.9", TARGET)
    assert art.filename.startswith("sglang-0.5.9-")
    cache = Cache(tmp_path / "cache")
    blob = cache.fetch(art)
    assert sha(blob.read_bytes()) == art.sha256
    reqs = {str(r) for r in requires_dist(cache.metadata(art), python="3.11")}
    assert "sgl-kernel==0.3.21" in reqs
    assert "torch==2.9.1" in reqs
    shutil.rmtree(tmp_path / "cache")
