"""Faults of the cache and of package indexes that used to give wrong answers, each on tiny real wheels.

The indexes here misbehave on purpose, on 127.0.0.1: a PEP 691 server over the fake stack's wheels that can
list a wrong sha256, answer 503/429 with Retry-After, cut its JSON short or refuse a file; and a socket that
accepts connections and never answers. Nothing sleeps for real between retries (the pauses are recorded).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fakestack import CONFLICT, OLD, FakeProject, cell_id
from stackfarm import artifacts, cachekeep, indexwait, verdict
from stackfarm.artifacts import Artifact, Cache, Source, Target, find_artifact, list_versions
from stackfarm.cli import main
from stackfarm.errors import ArtifactError, EnvironmentProblem, ExitCode, IndexUnreachableError
from stackfarm.matrix import load
from stackfarm.plan import Component
from stackfarm.resolve import ANSWER_TTL, Resolver, plan_matrix

pytest_plugins = ("fakestack",)

TARGET = Target(python="3.11", platform="manylinux_2_39_x86_64")
SGLANG_WHEEL = "sglang-0.5.9-py3-none-any.whl"
CONFLICT_WHEEL = "sglang-0.5.10-py3-none-any.whl"
WRONG = "0" * 64


# --------------------------------------------------------------------------- a misbehaving index


@dataclass
class WebIndex:
    """A PEP 691 index over a folder of wheels, with faults to switch on."""

    folder: Path
    base: str = ""
    #: Listings to come that give this wrong sha256 for a file (a count per file name; -1: every one).
    wrong_digest: dict[str, int] = field(default_factory=dict)
    #: Answers listings get before the real one: (status, headers), or "garbled" for JSON cut short.
    listing_faults: list[tuple[int, dict[str, str]] | str] = field(default_factory=list)
    #: Files answered with this HTTP status for ever.
    broken_files: dict[str, int] = field(default_factory=dict)
    #: Files sent a byte at a time, slowly (a download that takes minutes).
    trickle: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.base}/simple"

    def count(self, prefix: str) -> int:
        return sum(path.startswith(prefix) for path in self.requests)

    def listing(self, project: str) -> bytes:
        files = []
        for wheel in sorted(self.folder.glob("*.whl")):
            if wheel.name.split("-")[0].replace("_", "-") != project:
                continue
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            if self.wrong_digest.get(wheel.name, 0):
                digest = WRONG
                if self.wrong_digest[wheel.name] > 0:
                    self.wrong_digest[wheel.name] -= 1
            files.append(
                {"filename": wheel.name, "url": f"../../files/{wheel.name}", "hashes": {"sha256": digest}}
            )
        return json.dumps({"meta": {"api-version": "1.0"}, "files": files}).encode()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, code: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        index = self.server.index
        index.requests.append(self.path)
        parts = self.path.strip("/").split("/")
        if parts[0] == "simple" and len(parts) == 2:
            if index.listing_faults:
                fault = index.listing_faults.pop(0)
                if fault == "garbled":
                    self._send(
                        200,
                        b'{"meta": {"api-version": "1.0"}, "files": [{"filen',
                        "application/vnd.pypi.simple.v1+json",
                    )
                else:
                    assert not isinstance(fault, str)
                    self._send(fault[0], b"busy", "text/plain", fault[1])
                return
            self._send(200, index.listing(parts[1]), "application/vnd.pypi.simple.v1+json")
        elif parts[0] == "files" and (index.folder / parts[1]).is_file():
            if parts[1] in index.broken_files:
                self._send(index.broken_files[parts[1]], b"broken", "text/plain")
            elif parts[1] in index.trickle:
                body = (index.folder / parts[1]).read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for byte in body:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.2)
            else:
                self._send(200, (index.folder / parts[1]).read_bytes(), "application/octet-stream")
        else:
            self._send(404, b"not found", "text/plain")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    index: WebIndex


@pytest.fixture
def web(fake_project: FakeProject) -> Iterator[WebIndex]:
    """The fake stack's wheels on an HTTP index of their own."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.index = WebIndex(folder=fake_project.wheels, base=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server.index
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_index() -> Iterator[str]:
    """An index that accepts connections (the kernel's backlog does) and never says a word."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/simple"
    sock.close()


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts like a new process: no listing, no index budget spent; no proxy in the way."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    artifacts._LISTINGS.clear()
    indexwait.reset()
    yield
    artifacts._LISTINGS.clear()
    indexwait.reset()


@pytest.fixture(autouse=True)
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """No real sleeping between retries; the pauses asked for are recorded."""
    slept: list[float] = []
    monkeypatch.setattr(artifacts, "_sleep", slept.append)
    return slept


@pytest.fixture
def progress(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(indexwait, "progress_line", lines.append)
    return lines


def _web_matrix(
    project: FakeProject, web: WebIndex, *cells: Mapping[str, str], route: str = "sglang"
) -> Path:
    return project.write_matrix(
        list(cells) or [OLD],
        extra=f"""
        [indexes.web]
        url = "{web.url}"

        [[route]]
        requirement = "{route}"
        index = "web"
        """,
    )


def _sglang(resolver: Resolver, version: str = "0.5.9") -> Component:
    return Component(
        axis="sglang",
        distribution="sglang",
        version=version,
        index=resolver.matrix.index_for("sglang", version),
    )


def _memo_files(project: FakeProject) -> list[Path]:
    return sorted((project.cache / "resolved").glob("*.json"))


def _in_thread(fn: Callable[[], object], limit: float) -> tuple[bool, object]:
    """(finished within `limit` seconds, its result or exception): a hang fails the test instead of hanging it."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    return (not thread.is_alive(), out[0] if out else None)


# --------------------------------------------------------------------------- 1. remembered index answers


def test_a_wrong_sha_listed_once_is_asked_again_within_the_same_plan(
    fake_project: FakeProject, web: WebIndex
) -> None:
    web.wrong_digest[SGLANG_WHEEL] = 1
    matrix = load(_web_matrix(fake_project, web))
    plan, unreachable = plan_matrix(matrix, Resolver(matrix, Cache(fake_project.cache)), None)
    assert unreachable == {}
    assert [c.id for c in plan.cells] == [cell_id(OLD)]
    assert web.count("/simple/sglang/") == 2  # the answer, then once more after the bytes disagreed
    (memo,) = _memo_files(fake_project)
    assert WRONG not in memo.read_text()


def test_a_wrong_sha_remembered_is_dropped_so_the_next_run_asks_the_index(
    fake_project: FakeProject, web: WebIndex
) -> None:
    web.wrong_digest[SGLANG_WHEEL] = -1
    matrix = load(_web_matrix(fake_project, web))
    cache = Cache(fake_project.cache)
    resolver = Resolver(matrix, cache)
    wrong = resolver.artifact(_sglang(resolver), "3.11")
    assert wrong.sha256 == WRONG
    with pytest.raises(ArtifactError, match="the remembered index answer was dropped"):
        cache.fetch(wrong)
    web.wrong_digest.clear()  # the index is fixed; a new process asks again
    artifacts._LISTINGS.clear()
    again = Resolver(matrix, Cache(fake_project.cache)).artifact(_sglang(resolver), "3.11")
    assert again.sha256 == hashlib.sha256((fake_project.wheels / SGLANG_WHEEL).read_bytes()).hexdigest()


def test_a_sha_wrong_on_every_ask_is_a_clear_error_and_only_its_cells_fail(
    fake_project: FakeProject, web: WebIndex
) -> None:
    web.wrong_digest[SGLANG_WHEEL] = -1
    matrix = load(_web_matrix(fake_project, web))
    resolver = Resolver(matrix, Cache(fake_project.cache))
    with pytest.raises(ArtifactError, match="asking it again did not help") as err:
        resolver.fetch(_sglang(resolver), "3.11")
    assert web.url in str(err.value)
    assert WRONG in str(err.value)
    assert web.count("/simple/sglang/") == 2
    artifacts._LISTINGS.clear()
    _plan, unreachable = plan_matrix(matrix, Resolver(matrix, Cache(fake_project.cache)), None)
    assert "asking it again did not help" in unreachable[("sglang", "0.5.9")]
    assert not list((fake_project.cache / "blobs" / "sha256").glob(f"{WRONG}*"))


def test_a_remembered_answer_expires(fake_project: FakeProject, web: WebIndex) -> None:
    matrix = load(_web_matrix(fake_project, web))
    resolver = Resolver(matrix, Cache(fake_project.cache))
    resolver.artifact(_sglang(resolver), "3.11")
    artifacts._LISTINGS.clear()
    resolver.artifact(_sglang(resolver), "3.11")
    assert web.count("/simple/sglang/") == 1  # fresh: remembered
    (memo,) = _memo_files(fake_project)
    data = json.loads(memo.read_text())
    data["resolved_at"] -= ANSWER_TTL + 1
    memo.write_text(json.dumps(data))
    resolver.artifact(_sglang(resolver), "3.11")
    assert web.count("/simple/sglang/") == 2
    assert json.loads(memo.read_text())["resolved_at"] > time.time() - 60  # rewritten


def test_refresh_asks_the_index_again_once_per_project(fake_project: FakeProject, web: WebIndex) -> None:
    matrix = load(_web_matrix(fake_project, web))
    first = Resolver(matrix, Cache(fake_project.cache))
    first.artifact(_sglang(first), "3.11")
    assert web.count("/simple/sglang/") == 1
    refreshing = Resolver(matrix, Cache(fake_project.cache), refresh=True)
    refreshing.artifact(_sglang(refreshing), "3.11")  # the listing of this process is not reused either
    refreshing.artifact(_sglang(refreshing), "3.11")
    assert web.count("/simple/sglang/") == 2


@pytest.mark.parametrize(
    "content", ['{"resolved_at": 17', "", '{"distribution": "sglang"}'], ids=["cut", "empty", "old"]
)
def test_an_unreadable_remembered_answer_counts_as_absent(
    fake_project: FakeProject, web: WebIndex, content: str
) -> None:
    matrix = load(_web_matrix(fake_project, web))
    resolver = Resolver(matrix, Cache(fake_project.cache))
    first = resolver.artifact(_sglang(resolver), "3.11")
    (memo,) = _memo_files(fake_project)
    memo.write_text(content)
    assert resolver.artifact(_sglang(resolver), "3.11") == first
    assert json.loads(memo.read_text())["artifact"]["sha256"] == first.sha256


# --------------------------------------------------------------------------- 2. index faults


def test_an_index_that_never_answers_gives_up_within_its_budget_and_says_so(
    silent_index: str, monkeypatch: pytest.MonkeyPatch, progress: list[str]
) -> None:
    monkeypatch.setenv(indexwait.BUDGET_ENV, "2")
    monkeypatch.setattr(indexwait, "REQUEST_TIMEOUT", 0.5)
    source = Source(name="silent", url=silent_index)
    start = time.monotonic()
    done, result = _in_thread(lambda: list_versions(source, "sglang"), limit=15)
    assert done, "list_versions still waits on an index that never answers"
    assert isinstance(result, IndexUnreachableError)
    assert time.monotonic() - start < 6
    host = silent_index.removesuffix("/simple")
    text = str(result)
    assert f"index {host}: gave up after" in text
    assert "(timeout" in text
    assert progress[:1] == [f"index {host}: retry 1/3 in 0.5 s (timeout)"]
    start = time.monotonic()  # the index is spent: the next question fails at once, it does not wait again
    with pytest.raises(IndexUnreachableError, match="gave up after"):
        list_versions(source, "torch")
    assert time.monotonic() - start < 0.3


@pytest.mark.parametrize("status", [503, 429])
def test_retry_after_is_honoured_and_announced(
    fake_project: FakeProject, web: WebIndex, pauses: list[float], progress: list[str], status: int
) -> None:
    web.listing_faults.append((status, {"Retry-After": "7"}))
    assert list_versions(Source(name="web", url=web.url), "sglang") == ["0.5.9", "0.5.10"]
    assert pauses == [7.0]
    assert progress == [f"index {web.base}: retry 1/3 in 7 s (HTTP {status})"]


def test_a_retry_after_beyond_the_budget_gives_up_at_once(
    fake_project: FakeProject, web: WebIndex, pauses: list[float]
) -> None:
    web.listing_faults.extend([(503, {"Retry-After": "3600"})] * 5)
    with pytest.raises(IndexUnreachableError, match="asked to retry after 3600 s") as err:
        list_versions(Source(name="web", url=web.url), "sglang")
    assert pauses == []
    assert f"index {web.base}" in str(err.value)


def test_a_listing_cut_short_is_retried_then_unreachable_never_a_traceback(
    fake_project: FakeProject, web: WebIndex, pauses: list[float]
) -> None:
    web.listing_faults.append("garbled")
    assert list_versions(Source(name="web", url=web.url), "sglang") == ["0.5.9", "0.5.10"]
    assert pauses == [0.5]
    artifacts._LISTINGS.clear()
    web.listing_faults.extend(["garbled"] * 4)
    with pytest.raises(IndexUnreachableError, match="unreadable answer"):
        list_versions(Source(name="web", url=web.url), "sglang")


@pytest.mark.parametrize("status", [401, 403, 407])
def test_an_index_refusing_access_is_the_environment_not_a_wrong_matrix(
    fake_project: FakeProject, web: WebIndex, status: int
) -> None:
    web.listing_faults.extend([(status, {})] * 10)
    matrix = load(_web_matrix(fake_project, web))
    unreachable = Resolver(matrix, Cache(fake_project.cache)).check_axes()  # not a ConfigError (exit 2)
    assert f"answered HTTP {status}" in unreachable[("sglang", "0.5.9")]


def test_a_run_against_a_silent_index_ends_in_an_environment_error_within_seconds(
    fake_project: FakeProject, silent_index: str, monkeypatch: pytest.MonkeyPatch, progress: list[str]
) -> None:
    monkeypatch.setenv(indexwait.BUDGET_ENV, "1")
    monkeypatch.setattr(indexwait, "REQUEST_TIMEOUT", 0.5)
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix(
        [OLD],
        extra=f"""
        [indexes.silent]
        url = "{silent_index}"

        [[route]]
        requirement = "torch"
        index = "silent"
        """,
    )
    done, code = _in_thread(fake_project.run, limit=30)
    assert done, "the run still waits on an index that never answers"
    assert code == ExitCode.ENVIRONMENT
    assert verdict_status(fake_project) == "error"


def verdict_status(project: FakeProject, cell: str = cell_id(OLD)) -> str:
    return str(verdict.read(project.reports / cell / "verdict.json").report.status)


# --------------------------------------------------------------------------- 3. an unfetchable sglang wheel


def test_an_sglang_wheel_that_cannot_be_fetched_makes_its_cells_errors_not_unchecked_runs(
    fake_project: FakeProject, web: WebIndex, capsys: pytest.CaptureFixture[str]
) -> None:
    web.broken_files[CONFLICT_WHEEL] = 503
    fake_project.suite("00-ok", "pass")
    path = _web_matrix(fake_project, web, OLD, CONFLICT, route="sglang==0.5.10")
    matrix = load(path)
    plan, unreachable = plan_matrix(matrix, Resolver(matrix, Cache(fake_project.cache)), None)
    # Its pins could not be read, so its conflict is unknown: the plan must say so, never "run" it unchecked.
    assert "its pins were not checked" in unreachable[("sglang", "0.5.10")]
    assert web.base in unreachable[("sglang", "0.5.10")]
    assert cell_id(CONFLICT) in [c.id for c in plan.cells]

    artifacts._LISTINGS.clear()
    indexwait.reset()
    assert main(["plan", "--matrix", str(path)]) == ExitCode.ENVIRONMENT, (
        "an unanswered index is never exit 0"
    )
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if cell_id(CONFLICT) in line]
    assert "index unreachable for sglang" in row

    artifacts._LISTINGS.clear()
    indexwait.reset()
    assert fake_project.run() == ExitCode.ENVIRONMENT
    assert verdict_status(fake_project) == "passed"
    assert verdict_status(fake_project, cell_id(CONFLICT)) == "error"
    assert not any(cell == cell_id(CONFLICT) for cell, _suite in fake_project.runs())


# --------------------------------------------------------------------------- 4. read-only trees


def _local_artifact(project: FakeProject, filename: str = SGLANG_WHEEL) -> Artifact:
    version = filename.split("-")[1]
    return find_artifact(Source(name="local", find_links=project.wheels), "sglang", version, TARGET)


def _as_plain_user(fn: Callable[[], None]) -> None:
    """Run `fn` as an unprivileged user (root ignores file modes): in a forked child when we are root."""
    if os.getuid() != 0:
        fn()
        return
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, report through the exit status
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            fn()
            code = 0
        except BaseException as exc:
            print(f"as nobody: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the check as a plain user failed (see stderr)"


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A cache root a plain user can reach (pytest's own tmp folders are private to root)."""
    root = Path(tempfile.mkdtemp(prefix="stackfarm-ro-", dir="/tmp"))
    root.chmod(0o755)
    yield root / "cache"
    cachekeep.remove_tree(root)


def _chown_all(path: Path, uid: int) -> None:
    for top, dirs, files in os.walk(path):
        os.chown(top, uid, uid)
        for name in [*dirs, *files]:
            os.lchown(Path(top) / name, uid, uid)


def test_unpacked_trees_are_read_only_yet_the_cache_can_remove_them(
    fake_project: FakeProject, shared_root: Path
) -> None:
    art = _local_artifact(fake_project)
    cache = Cache(shared_root)
    tree = cache.unpack(art)
    assert {p.stat().st_mode & 0o777 for p in tree.rglob("*") if p.is_file()} == {0o444}
    assert {p.stat().st_mode & 0o777 for p in [tree, *tree.rglob("*")] if p.is_dir()} == {0o555}
    assert cache.blob_path(art).stat().st_mode & 0o777 == 0o444
    if os.getuid() == 0:
        _chown_all(shared_root, 65534)
    init = tree / "sglang" / "__init__.py"

    def as_user() -> None:
        with pytest.raises(PermissionError):
            init.open("a").close()  # what a suite writing into a shared (hard-linked) file would do
        with pytest.raises(PermissionError):
            (tree / "sglang" / "extra.py").write_text("")
        # The cache itself still repairs and prunes: it makes the folders writable first.
        init.chmod(0o644)
        init.write_text("damaged")
        (damage,) = cachekeep.verify(shared_root, repair=True)
        assert damage.path == tree
        assert not tree.exists()

    _as_plain_user(as_user)
    assert Cache(shared_root).unpack(art) == tree  # unpacked again, whole
    assert "__version__" in init.read_text()


def test_a_patched_copy_of_a_read_only_tree_applies_as_a_plain_user(
    fake_project: FakeProject, shared_root: Path
) -> None:
    from packaging.specifiers import SpecifierSet

    from stackfarm import patches
    from stackfarm.patches.git import make_patch
    from stackfarm.patchset import PatchSet

    tree = Cache(shared_root).unpack(_local_artifact(fake_project))
    init = "sglang/__init__.py"
    before = (tree / init).read_text()
    folder = shared_root.parent / "patches" / "doc"
    folder.mkdir(parents=True)
    headers = {"Description": "a test patch", "Origin": "tests", "Forwarded": "no"}
    (folder / "0001-doc.patch").write_text(make_patch(init, before, before + "PATCHED = True\n", headers))
    (folder / "series").write_text("0001-doc.patch\n")
    patch_set = PatchSet(name="doc", applies_to=SpecifierSet(">=0.5.9"), path=folder, optional=False)
    if os.getuid() == 0:
        _chown_all(shared_root.parent, 65534)

    def as_user() -> None:
        dest = shared_root.parent / "cells" / "one" / "sglang-patched"
        for _again in range(2):  # the second time, the old copy has to go first
            results = patches.patched_copy([patch_set], tree, dest)
            assert [r.status for r in results] == ["applied"], [r.detail for r in results]
        assert "PATCHED" in (dest / init).read_text()
        assert (tree / init).read_text() == before

    _as_plain_user(as_user)


# --------------------------------------------------------------------------- 5. verify and prune


def _damage_everything(project: FakeProject, cache: Cache) -> dict[str, Path]:
    """One of each damage: a truncated blob, a tree missing a file, one with a changed and an added file, a
    cut index answer."""
    arts = {name: _local_artifact(project, name) for name in (SGLANG_WHEEL, CONFLICT_WHEEL)}
    torch = find_artifact(Source(name="local", find_links=project.wheels), "torch", "2.9.1", TARGET)
    for art in [*arts.values(), torch]:
        cache.unpack(art)
    blob = cache.blob_path(arts[SGLANG_WHEEL])
    blob.chmod(0o644)
    blob.write_bytes(blob.read_bytes()[:100])
    missing = cache.tree_path(arts[SGLANG_WHEEL])
    cachekeep.remove_tree(missing / "sglang")
    changed = cache.tree_path(arts[CONFLICT_WHEEL])
    (changed / "sglang").chmod(0o755)
    (changed / "sglang" / "__init__.py").chmod(0o644)
    (changed / "sglang" / "__init__.py").write_text("x = 1\n")
    (changed / "sglang" / "added.py").write_text("")
    (project.cache / "resolved").mkdir(parents=True, exist_ok=True)
    cut = project.cache / "resolved" / "cut.json"
    cut.write_text('{"resolved_at": 1')
    return {
        "blob": blob,
        "missing": missing,
        "changed": changed,
        "answer": cut,
        "good": cache.tree_path(torch),
    }


def test_cache_verify_lists_the_damage_and_repair_removes_it(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = Cache(fake_project.cache)
    hurt = _damage_everything(fake_project, cache)
    assert main(["cache", "verify"]) == ExitCode.ENVIRONMENT
    out = capsys.readouterr().out
    lines = {line.split(": ", 2)[1]: line for line in out.splitlines() if line.startswith("damaged: ")}
    rel = {k: str(p.relative_to(fake_project.cache)) for k, p in hurt.items()}
    assert set(lines) == {rel["blob"], rel["missing"], rel["changed"], rel["answer"]}
    assert "its sha256 is" in lines[rel["blob"]]
    assert "sglang/__init__.py is missing" in lines[rel["missing"]]
    assert "sglang/__init__.py changed" in lines[rel["changed"]]
    assert "sglang/added.py was added" in lines[rel["changed"]]
    assert "stackfarm cache verify --repair" in out
    assert main(["cache", "verify", "--repair"]) == ExitCode.OK
    assert all(not hurt[k].exists() for k in ("blob", "missing", "changed", "answer"))
    assert hurt["good"].is_dir()
    assert main(["cache", "verify"]) == ExitCode.OK
    tree = Cache(fake_project.cache).unpack(_local_artifact(fake_project))  # the next run: fetched anew
    assert (tree / "sglang" / "__init__.py").is_file()


def test_verify_checks_an_old_tree_against_the_wheels_record(fake_project: FakeProject) -> None:
    cache = Cache(fake_project.cache)
    tree = cache.unpack(_local_artifact(fake_project))
    tree.chmod(0o755)
    (tree / cachekeep.MARKER).chmod(0o644)
    (tree / cachekeep.MARKER).write_text(f"{SGLANG_WHEEL}\n")  # a marker from before manifests
    assert cachekeep.verify(cache.root) == []
    (tree / "sglang").chmod(0o755)
    (tree / "sglang" / "__init__.py").unlink()
    (damage,) = cachekeep.verify(cache.root)
    assert damage.problems == ("sglang/__init__.py is missing",)


def _aged(path: Path, seconds: float = 2 * cachekeep.RECENT) -> Path:
    when = time.time() - seconds
    os.utime(path, (when, when), follow_symlinks=False)
    return path


def test_cache_prune_keeps_what_the_last_runs_used(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = Cache(fake_project.cache)
    source = Source(name="local", find_links=fake_project.wheels)
    arts = [
        find_artifact(source, d, v, TARGET)
        for d, v in [("torch", "2.9.1"), ("sglang", "0.5.9"), ("sglang", "0.5.10")]
    ]
    for n, art in enumerate(arts):
        cache.unpack(art)
        cell = fake_project.cache / "cells" / f"cell{n}"
        (cell / "sglang-patched").mkdir(parents=True)
        (cell / "cell.json").write_text("{}")
        cache.record_use(
            f"run{n}", [cache.blob_path(art), cache.tree_path(art) / "torch", cell / "cell.json"]
        )
        run = fake_project.cache / "runs" / f"run{n}.json"
        data = json.loads(run.read_text())
        data["time"] = 1000.0 + n  # run0 is the oldest
        run.write_text(json.dumps(data))
    cache.close()  # the three runs have finished: their leases are given back (a live run's are kept)
    for area in ("blobs/sha256", "trees", "cells"):
        for entry in (fake_project.cache / area).iterdir():
            _aged(entry)
    stale = fake_project.cache / "tmp" / f"{'a' * 64}.part"
    stale.write_bytes(b"half")
    busy = fake_project.cache / "tmp" / f"{'b' * 64}.part"
    busy.write_bytes(b"half")
    fresh = fake_project.cache / "cells" / "just-made"
    fresh.mkdir()

    with cache._locked("b" * 64):  # a download in progress in another run
        assert main(["cache", "prune", "--keep-runs", "2", "--dry-run"]) == 0
        assert "would remove 4 entries" in capsys.readouterr().out
        assert cache.blob_path(arts[0]).is_file()
        assert main(["cache", "prune", "--keep-runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "removed 4 entries" in out
    assert "run2, run1" in out
    assert not cache.blob_path(arts[0]).exists()
    assert not cache.tree_path(arts[0]).exists()
    assert not (fake_project.cache / "cells" / "cell0").exists()
    assert not stale.exists()
    assert busy.exists()
    assert fresh.exists()
    for art in arts[1:]:
        assert cache.blob_path(art).is_file()
        assert cache.tree_path(art).is_dir()
    assert sorted(p.stem for p in (fake_project.cache / "runs").glob("*.json")) == ["run1", "run2"]


def test_prune_without_any_recorded_run_removes_nothing(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = Cache(fake_project.cache)
    tree = _aged(cache.unpack(_local_artifact(fake_project)))
    assert main(["cache", "prune", "--keep-runs", "0"]) == 0
    assert "nothing removed" in capsys.readouterr().out
    assert tree.is_dir()


def test_record_use_merges_the_calls_of_one_run(fake_project: FakeProject) -> None:
    cache = Cache(fake_project.cache)
    art = _local_artifact(fake_project)
    threads = [
        threading.Thread(target=cache.record_use, args=("r/1", [p]))
        for p in (
            cache.blob_path(art),
            cache.tree_path(art),
            fake_project.cache / "cells" / "c" / "x",
            Path("/etc"),
        )
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (record,) = (fake_project.cache / "runs").glob("*.json")
    data = json.loads(record.read_text())
    assert data["run_id"] == "r/1"
    assert data["paths"] == sorted([f"blobs/sha256/{art.sha256}.whl", f"trees/{art.sha256}", "cells/c"])


# --------------------------------------------------------------------------- 6. locks


def test_a_held_lock_makes_the_other_run_wait_visibly_then_refuse(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    workdir = tmp_path / "cache" / "cells" / "cell-1"
    held = threading.Event()
    release = threading.Event()

    def other_run() -> None:
        with Cache(tmp_path / "cache").lock(workdir):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=other_run)
    thread.start()
    assert held.wait(5)
    said: list[str] = []
    start = time.monotonic()
    with (
        pytest.raises(EnvironmentProblem, match=f"another stackfarm run holds {workdir} for more than 0.3 s"),
        cache.lock(workdir, timeout=0.3, notify=said.append),
    ):
        pass
    assert 0.25 < time.monotonic() - start < 3
    assert said == [f"waiting for another stackfarm run holding {workdir}… (up to 0.3 s)"]
    with pytest.raises(EnvironmentProblem), cache.lock(workdir, timeout=0, notify=said.append):
        pass
    release.set()
    thread.join()
    with (
        cache.lock(workdir, timeout=0) as lock_file,
        cache.lock(workdir, timeout=0),
    ):  # re-entrant in one thread
        assert lock_file.parent == tmp_path / "cache" / "locks" / "held"


def test_a_lock_excludes_another_process(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    code = (
        "import sys, time; from pathlib import Path; from stackfarm.artifacts import Cache\n"
        f"with Cache(Path({str(tmp_path / 'cache')!r})).lock(Path({str(reports)!r})):\n"
        "    print('held', flush=True); time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "held\n"
        other = Cache(tmp_path / "cache")
        with (
            pytest.raises(EnvironmentProblem, match="another stackfarm run holds"),
            other.lock(reports, timeout=0.2, notify=lambda _line: None),
        ):
            pass
    finally:
        child.kill()
        child.wait()
    with Cache(tmp_path / "cache").lock(reports, timeout=5):  # a dead holder's lock is free again
        pass


# --------------------------------------------------------------------------- 7. a damaged cache


def test_a_tree_missing_a_file_is_an_artifact_error_with_the_fix(fake_project: FakeProject) -> None:
    art = _local_artifact(fake_project)
    tree = Cache(fake_project.cache).unpack(art)
    (tree / "sglang").chmod(0o755)
    (tree / "sglang" / "__init__.py").unlink()
    for call in (Cache(fake_project.cache).unpack, Cache(fake_project.cache).unpacked):
        with pytest.raises(ArtifactError, match=r"sglang/__init__\.py is missing") as err:
            call(art)
        assert "run `stackfarm cache verify --repair`" in str(err.value)


def test_a_cut_manifest_is_an_artifact_error_with_the_fix(fake_project: FakeProject) -> None:
    art = _local_artifact(fake_project)
    tree = Cache(fake_project.cache).unpack(art)
    tree.chmod(0o755)
    (tree / cachekeep.MARKER).chmod(0o644)
    (tree / cachekeep.MARKER).write_text('{"filename": "x", "fil')
    with pytest.raises(ArtifactError, match=r"manifest .* is unreadable") as err:
        Cache(fake_project.cache).unpack(art)
    assert "cache verify --repair" in str(err.value)


def test_entries_that_are_not_what_they_should_be_are_replaced_not_a_traceback(
    fake_project: FakeProject,
) -> None:
    art = _local_artifact(fake_project)
    cache = Cache(fake_project.cache)
    blob = cache.blob_path(art)
    (blob / "junk").mkdir(parents=True)  # a folder where the wheel should be
    where = cache.root / "trees" / art.sha256
    where.parent.mkdir(parents=True)
    where.write_text("")  # a file where the tree should be
    tree = cache.unpack(art)
    assert blob.is_file()
    assert (tree / "sglang" / "__init__.py").is_file()


def test_an_unusable_cache_folder_is_an_artifact_error(fake_project: FakeProject) -> None:
    (fake_project.cache).mkdir(parents=True)
    (fake_project.cache / "tmp").write_text("not a folder")
    with pytest.raises(ArtifactError, match="cache verify --repair"):
        Cache(fake_project.cache).fetch(_local_artifact(fake_project))


def test_a_run_on_a_damaged_tree_is_an_environment_error_not_a_failed_cell(fake_project: FakeProject) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD])
    assert fake_project.run() == ExitCode.OK
    tree = Cache(fake_project.cache).unpacked(_local_artifact(fake_project))
    assert tree is not None
    (tree / "sglang").chmod(0o755)
    (tree / "sglang" / "__init__.py").unlink()
    assert fake_project.run("--force") == ExitCode.ENVIRONMENT
    report = verdict.read(fake_project.reports / cell_id(OLD) / "verdict.json").report
    assert str(report.status) == "error"
    assert "stackfarm cache verify --repair" in report.reason
    assert main(["cache", "verify", "--repair"]) == ExitCode.OK
    assert fake_project.run("--force") == ExitCode.OK


def test_ctrl_c_stops_a_download_within_seconds_and_keeps_no_verdict(
    fake_project: FakeProject, web: WebIndex
) -> None:
    """A download used to ignore Ctrl-C until it ended (33 s for 1.6 GB), then store a verdict of skips."""
    import signal
    import subprocess
    import sys

    fake_project.suite("00-suite", "pass")
    _web_matrix(fake_project, web)
    web.trickle = {SGLANG_WHEEL}
    run = subprocess.Popen(
        [sys.executable, "-m", "stackfarm", *fake_project.argv()],
        cwd=fake_project.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and web.count(f"/files/{SGLANG_WHEEL}") == 0:
            time.sleep(0.05)
        assert web.count(f"/files/{SGLANG_WHEEL}"), "the download never started"
        time.sleep(0.5)
        stopped_at = time.monotonic()
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=60)
        took = time.monotonic() - stopped_at
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == ExitCode.INTERRUPTED, out
    assert took < 10, f"the download went on for {took:.1f} s after Ctrl-C"
    assert not (fake_project.reports / cell_id(OLD) / "verdict.json").exists()
