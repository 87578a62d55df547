"""The shared verdict store (stackfarm.store): a folder or a real WebDAV server (nginx, started by
.ci/servers.sh, named by $STACKFARM_TEST_STORE), entries keyed by input hash with a manifest written last, sha256
checked on download, and `stackfarm run|plan|report` on top of it, end to end on the fake stack.

The "two runners" tests: two cache folders and two reports folders on one machine, one store. Runner 1 runs a
cell and pushes its verdict; runner 2, with an empty cache, plans the same cell (it is marked stored) and runs
it as a fan-out worker: the verdict is reused, no suite runs, nothing is unpacked or built."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import urllib.parse
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import canonicalize_name

from fakestack import CONFLICT, NEW, OLD, FakeProject, cell_id
from stackfarm import attest, indexwait, store, storekeys, verdict
from stackfarm.cli import main
from stackfarm.errors import ConfigError, EnvironmentProblem, ExitCode, StackfarmError
from stackfarm.store import MANIFEST, BrokenEntry, FolderTransport, HttpTransport, open_store

pytest_plugins = ("fakestack",)

SERVER = os.environ.get("STACKFARM_TEST_STORE", "")
needs_server = pytest.mark.skipif(
    not SERVER,
    reason="STACKFARM_TEST_STORE is not set: start the verdict store with .ci/servers.sh (as root) and export "
    "STACKFARM_TEST_STORE=http://127.0.0.1:8808/store",
)


@pytest.fixture(autouse=True)
def keys(signing_runner: tuple[Path, Path]) -> tuple[Path, Path]:
    """Every runner of these tests signs with one key and trusts it (the forgery tests change that)."""
    return signing_runner


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Retries without pauses, and no index (or store) remembered as dead from another test."""
    monkeypatch.setattr(store, "RETRY_DELAYS", (0.0, 0.0))
    indexwait.reset()
    yield
    indexwait.reset()


@pytest.fixture
def server_base() -> str:
    """A fresh folder on the real store server for this test."""
    base = f"{SERVER.rstrip('/')}/test-{uuid.uuid4().hex[:12]}"
    try:
        HttpTransport(base).probe(create=True)
    except EnvironmentProblem as exc:
        pytest.fail(f"STACKFARM_TEST_STORE={SERVER} is set but does not answer: {exc}")
    return base


def run_as(project: FakeProject, reports: Path, *args: str) -> int:
    """`stackfarm run` on the project into another reports folder (another runner)."""
    return main(["run", "--matrix", str(project.matrix), "--reports", str(reports), "--backend", "local",
                 "--jobs", "1", *args])  # fmt: skip


def plan_json(project: FakeProject, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    """`stackfarm plan --json` of the project, hashed as a GPU-less local run (the fake stack's runs)."""
    capsys.readouterr()
    code = main(["plan", "--json", "--matrix", str(project.matrix), "--backend", "local", "--no-gpu", *args])
    assert code == ExitCode.OK
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


def cache_files(cache: Path, area: str) -> list[Path]:
    return sorted(p for p in (cache / area).rglob("*") if p.is_file()) if (cache / area).is_dir() else []


def read_manifest(path: Path) -> dict[str, Any]:
    """The predicate of a signed manifest file (its signature not checked: the store's reader does that)."""
    envelope = json.loads(path.read_text())
    data: dict[str, Any] = json.loads(attest.unverified_payload(envelope))["predicate"]
    return data


def write_manifest(path: Path, predicate: dict[str, Any], key: Path) -> None:
    """Sign `predicate` with the private key at `key` and write it as the entry's manifest."""
    path.write_text(json.dumps(storekeys.seal(predicate, attest.load_signing_key(key))))


def only_entry(folder: Path) -> tuple[str, Path]:
    """(input hash, entry folder) of a folder store holding one entry."""
    [manifest] = sorted(folder.glob(f"*/*/{MANIFEST}"))
    return manifest.parent.parent.name, manifest.parent


def two_runners(
    project: FakeProject,
    where: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[Path, str]:
    """Runner 1 runs the cell and pushes; runner 2 (empty cache) plans it, then runs it from the plan. Returns
    runner 2's cache and its output."""
    cell = cell_id(OLD)
    assert project.run("--store", where) == ExitCode.OK
    assert [c for c, _ in project.runs()] == [cell]
    pushed = capsys.readouterr().err
    assert f"{cell}: verdict pushed to {where}" in pushed

    cache2 = tmp_path / "runner2" / "cache"
    reports2 = tmp_path / "runner2" / "reports"
    monkeypatch.setenv("STACKFARM_CACHE", str(cache2))
    doc = plan_json(project, capsys, "--store", where)
    cells = doc["cells"]
    assert isinstance(cells, list)
    [planned] = cells
    assert planned["stored"] is True
    plan = tmp_path / "runner2" / "plan.json"
    plan.write_text(json.dumps(doc))
    assert (
        run_as(project, reports2, "--plan", str(plan), "--cell-index", "0", "--store", where) == ExitCode.OK
    )
    out = capsys.readouterr().err
    digest = planned["input_hash"]
    assert f"{cell}: verdict reused from {where} (input hash {digest[:12]}…), nothing built or run" in out
    assert [c for c, _ in project.runs()] == [cell], "runner 2 ran no suite"
    mine = verdict.read(verdict.path_of(project.reports, cell))
    theirs = verdict.read(verdict.path_of(reports2, cell))
    assert theirs.input_hash == mine.input_hash == digest
    assert theirs.report.run_id == mine.report.run_id, "the verdict of runner 1's run"
    assert [s.xml for s in theirs.report.suites] == [reports2 / cell / "00-ok.xml"], "JUnit paths point here"
    assert verdict.reusable(theirs, digest) is None
    assert "reused" in (reports2 / "summary.md").read_text()
    assert cache_files(cache2, "trees") == [], "nothing unpacked"
    assert cache_files(cache2, "cells") == [], "no cell work dir: nothing built"
    return cache2, out


# --------------------------------------------------------------------------- open_store


def test_open_store_takes_a_folder_or_an_http_url(tmp_path: Path) -> None:
    assert isinstance(open_store(tmp_path).transport, FolderTransport)
    assert isinstance(open_store(f"file://{tmp_path}").transport, FolderTransport)
    assert open_store(f"file://{tmp_path}").where == str(tmp_path)
    http = open_store("http://127.0.0.1:8808/store/")
    assert isinstance(http.transport, HttpTransport)
    assert http.where == "http://127.0.0.1:8808/store"
    assert isinstance(http.transport, HttpTransport)
    assert http.transport.url("ab/c d+e/x.xml") == "http://127.0.0.1:8808/store/ab/c%20d%2Be/x.xml"
    with pytest.raises(ConfigError, match=r"s3:// store is not supported"):
        open_store("s3://bucket/verdicts")


def test_a_reports_folder_or_a_missing_folder_is_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentProblem, match="no such folder"):
        open_store(tmp_path / "nowhere").probe()
    open_store(tmp_path / "new").probe(create=True)
    assert (tmp_path / "new").is_dir()
    (tmp_path / "reports" / "cell-a").mkdir(parents=True)
    (tmp_path / "reports" / "cell-a" / "verdict.json").write_text("{}")
    with pytest.raises(ConfigError, match="is a reports folder"):
        open_store(tmp_path / "reports").probe()


def test_entry_keys_refuse_what_cannot_be_one_path_segment() -> None:
    digest = "a" * 64
    assert store.entry(digest, "cu128-torch2.9.1") == f"{digest}/cu128-torch2.9.1"
    for cell in ("a/b", "..", ".hidden", "", "a\\b"):
        with pytest.raises(StackfarmError, match="cannot name a store entry"):
            store.entry(digest, cell)
    with pytest.raises(StackfarmError, match="not a sha256"):
        store.entry("../etc", "cell")


# --------------------------------------------------------------------------- the folder store


def test_two_runners_share_one_cell_through_a_folder_store(
    fake_project: FakeProject,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    where = str(tmp_path / "store")
    cache2, _ = two_runners(fake_project, where, tmp_path, monkeypatch, capsys)
    # A find_links folder serves no PEP 658 metadata: planning read sglang's pins from its wheel, the one
    # blob runner 2 holds (test_two_runners_share_one_cell_through_the_server serves metadata: no blob at all).
    [blob] = cache_files(cache2, "blobs")
    sglang = fake_project.wheels / "sglang-0.5.9-py3-none-any.whl"
    assert blob.name == f"{hashlib.sha256(sglang.read_bytes()).hexdigest()}.whl"
    digest, folder = only_entry(tmp_path / "store")
    manifest = read_manifest(folder / MANIFEST)
    assert manifest["cell"] == cell_id(OLD)
    assert manifest["input_hash"] == digest
    assert {"verdict.json", "00-ok.xml", "00-ok.log"} <= set(manifest["files"])
    for name, meta in manifest["files"].items():
        data = (folder / manifest["upload"] / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == meta["sha256"]
        assert len(data) == meta["size"]


def test_a_half_uploaded_entry_is_absent_and_the_cell_runs(
    fake_project: FakeProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    where = tmp_path / "store"
    assert fake_project.run("--store", str(where)) == ExitCode.OK
    digest, folder = only_entry(where)
    (folder / MANIFEST).unlink()  # every file uploaded, the manifest not yet: a push cut short
    s = open_store(where)
    assert s.manifest(cell_id(OLD), digest) is None
    assert s.holds(cell_id(OLD), digest) is False
    assert s.fetch(cell_id(OLD), digest, tmp_path / "elsewhere") is None
    assert not (tmp_path / "elsewhere").exists(), "nothing written for an absent entry"
    assert plan_json(fake_project, capsys, "--store", str(where))["cells"][0]["stored"] is False  # type: ignore[index]
    assert run_as(fake_project, tmp_path / "r2", "--store", str(where)) == ExitCode.OK
    assert [c for c, _ in fake_project.runs()] == [cell_id(OLD)] * 2, "runner 2 ran the cell itself"
    assert s.holds(cell_id(OLD), digest) is True, "and pushed a complete entry"


def test_a_file_with_other_bytes_is_a_broken_entry_run_again_and_repaired(
    fake_project: FakeProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    where = tmp_path / "store"
    assert fake_project.run("--store", str(where)) == ExitCode.OK
    digest, folder = only_entry(where)
    upload = read_manifest(folder / MANIFEST)["upload"]
    junit = folder / upload / "00-ok.xml"
    junit.write_bytes(junit.read_bytes().replace(b'failures="0"', b'failures="0" '))
    s = open_store(where)
    with pytest.raises(
        BrokenEntry, match=r"00-ok\.xml: sha256 [0-9a-f]{16}…, the manifest says [0-9a-f]{16}…"
    ):
        s.fetch(cell_id(OLD), digest, tmp_path / "elsewhere")
    assert not verdict.path_of(tmp_path / "elsewhere", cell_id(OLD)).exists(), (
        "no verdict from a broken entry"
    )
    doc = plan_json(fake_project, capsys, "--store", str(where))
    assert doc["cells"][0]["stored"] is False  # type: ignore[index]
    assert any("the manifest says" in w for w in doc["warnings"])  # type: ignore[attr-defined]
    capsys.readouterr()
    assert run_as(fake_project, tmp_path / "r2", "--store", str(where)) == ExitCode.OK
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "the manifest says" in err
    assert "running the cell again" in err
    assert len(fake_project.runs()) == 2
    assert s.holds(cell_id(OLD), digest) is True, "the new push replaced the broken entry"


def test_a_manifest_of_another_entry_or_none_at_all_is_broken(
    fake_project: FakeProject, tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    where = tmp_path / "store"
    assert fake_project.run("--store", str(where)) == ExitCode.OK
    digest, folder = only_entry(where)
    s = open_store(where)
    good = read_manifest(folder / MANIFEST)
    for bad, message in [  # each signed by the trusted key: what it says is checked too
        ({**good, "cell": "other"}, "not of this entry"),
        ({**good, "format": 99}, "not a store manifest"),
        ({**good, "upload": "../x"}, "names no upload folder"),
        ({**good, "files": {"../verdict.json": good["files"]["verdict.json"]}}, "lists no verdict.json"),
        ({**good, "files": {**good["files"], "00-ok.xml": {"sha256": "x"}}}, "no sha256"),
    ]:
        write_manifest(folder / MANIFEST, bad, keys[0])
        with pytest.raises(BrokenEntry, match=message):
            s.holds(cell_id(OLD), digest)
    (folder / MANIFEST).write_text("{not json")
    with pytest.raises(BrokenEntry, match="not a manifest"):
        s.holds(cell_id(OLD), digest)


def test_force_re_runs_and_re_pushes_an_entry_whole(fake_project: FakeProject, tmp_path: Path) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    where = tmp_path / "store"
    assert fake_project.run("--store", str(where)) == ExitCode.OK
    digest, folder = only_entry(where)
    first = read_manifest(folder / MANIFEST)
    assert fake_project.run("--store", str(where)) == ExitCode.OK
    assert len(fake_project.runs()) == 1, "reused locally: not run again"
    assert read_manifest(folder / MANIFEST) == first, "the store already held it: not pushed again"
    assert fake_project.run("--store", str(where), "--force") == ExitCode.OK
    second = read_manifest(folder / MANIFEST)
    assert second["upload"] != first["upload"]
    assert second["run_id"] != first["run_id"]
    assert (folder / first["upload"]).is_dir(), "a reader of the old manifest still finds its files"
    assert open_store(where).holds(cell_id(OLD), digest)


def test_a_verdict_computed_before_the_store_is_pushed_on_reuse(
    fake_project: FakeProject, tmp_path: Path
) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.OK
    where = tmp_path / "store"
    assert fake_project.run("--store", str(where)) == ExitCode.OK
    assert len(fake_project.runs()) == 1
    digest, _ = only_entry(where)
    assert open_store(where).holds(cell_id(OLD), digest)


def test_only_verdicts_of_cells_that_ran_are_pushed(fake_project: FakeProject, tmp_path: Path) -> None:
    fake_project.suite("00-ok", "fail")
    fake_project.write_matrix([OLD, CONFLICT])
    where = tmp_path / "store"
    assert fake_project.run("--store", str(where)) == ExitCode.CELLS_FAILED
    assert verdict.read(verdict.path_of(fake_project.reports, cell_id(CONFLICT))).report.status == "conflict"
    [manifest] = where.glob(f"*/*/{MANIFEST}")
    assert manifest.parent.name == cell_id(OLD), "a failed verdict is a verdict; a conflict is not stored"
    assert read_manifest(manifest)["status"] == "failed"


def test_report_from_the_store_merges_every_planned_cell(
    fake_project: FakeProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, NEW])
    where = tmp_path / "store"
    assert fake_project.run("--store", str(where), "--cells", cell_id(OLD)) == ExitCode.OK
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_json(fake_project, capsys)))
    merged = tmp_path / "merged"
    report = ["report", "--from", str(where), "--plan", str(plan), "--reports", str(merged)]
    assert main([*report, "--gate"]) == ExitCode.INCOMPLETE, "a planned cell without a verdict is not green"
    out = capsys.readouterr().out
    assert "merged 1 verdict(s)" in out
    assert "1 planned cell(s) have none" in out
    assert f"{cell_id(NEW)}: the store holds no verdict for its inputs" in out
    assert verdict.read(verdict.path_of(merged, cell_id(OLD))).report.status is verdict.Status.PASSED
    assert (merged / "junit.xml").is_file()
    assert (merged / "index.html").is_file()
    assert main(report) == 0, "without --gate: the report, exit 0"
    # Once every cell is in the store, the merge is green; planning the matrix gives the same hashes.
    assert fake_project.run("--store", str(where)) == ExitCode.OK
    capsys.readouterr()
    again = ["report", "--from", str(where), "--matrix", str(fake_project.matrix), "--backend", "local"]
    assert main([*again, "--no-gpu", "--reports", str(tmp_path / "m2"), "--gate"]) == ExitCode.OK
    assert "merged 2 verdict(s)" in capsys.readouterr().out


def test_report_from_the_store_counts_the_plans_conflicts(
    fake_project: FakeProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A conflict cell is never run, so no store holds it: the merged report lists it and the gate fails,
    as the single `run` that records it would."""
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD])
    where = tmp_path / "store"
    assert fake_project.run("--store", str(where)) == ExitCode.OK
    doc = plan_json(fake_project, capsys)
    doc["conflicts"] = [{"id": "cu128-x-sgl0.0", "problems": ["sglang 0.0 requires torch==1"]}]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    merged = tmp_path / "merged"
    argv = ["report", "--from", str(where), "--plan", str(plan), "--reports", str(merged), "--gate"]
    assert main(argv) == ExitCode.CELLS_FAILED
    stored = verdict.read(verdict.path_of(merged, "cu128-x-sgl0.0")).report
    assert stored.status is verdict.Status.CONFLICT
    assert stored.reason == "sglang 0.0 requires torch==1"


# --------------------------------------------------------------------------- an unreachable server


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_store_is_an_environment_error_naming_it(
    fake_project: FakeProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    url = f"http://127.0.0.1:{closed_port()}/store"
    assert fake_project.run("--store", url) == ExitCode.ENVIRONMENT
    err = capsys.readouterr().err
    assert f"verdict store {url} is unreachable" in err
    assert "connection refused" in err
    assert fake_project.runs() == [], "nothing ran"
    capsys.readouterr()
    assert (
        main(["plan", "--json", "--matrix", str(fake_project.matrix), "--store", url]) == ExitCode.ENVIRONMENT
    )
    assert main(["report", "--from", url, "--matrix", str(fake_project.matrix)]) == ExitCode.ENVIRONMENT
    with pytest.raises(EnvironmentProblem, match=r"GET http://127\.0\.0\.1:\d+/store/a{64}/c/manifest\.json"):
        open_store(url).holds("c", "a" * 64)


def test_a_store_that_goes_away_mid_run_fails_the_push_not_the_verdict(
    fake_project: FakeProject,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    where = tmp_path / "store"

    def refuse(self: FolderTransport, key: str, data: bytes) -> None:
        raise EnvironmentProblem(f"verdict store {self.root} is unreachable: PUT {key}: synthetic")

    monkeypatch.setattr(FolderTransport, "put", refuse)
    assert fake_project.run("--store", str(where)) == ExitCode.ENVIRONMENT
    err = capsys.readouterr()
    assert f"{cell_id(OLD)}: verdict not pushed to {where}" in err.err
    assert "1 verdict(s) not pushed to the store: exit 4" in err.out
    kept = verdict.read(verdict.path_of(fake_project.reports, cell_id(OLD)))
    assert kept.report.status is verdict.Status.PASSED, "the cell's own verdict stands"


# --------------------------------------------------------------------------- the real server


def put(url: str, data: bytes) -> None:
    urllib.request.urlopen(urllib.request.Request(url, data=data, method="PUT"), timeout=10).close()


def publish_index(wheels: Path, base: str) -> str:
    """The fake stack as a PEP 503 index with PEP 658 metadata files on the store server; its simple URL."""
    links: dict[str, list[str]] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        data = wheel.read_bytes()
        with zipfile.ZipFile(wheel) as zf:
            [name] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
            meta = zf.read(name)
        quoted = urllib.parse.quote(wheel.name)
        put(f"{base}/files/{quoted}", data)
        put(f"{base}/files/{quoted}.metadata", meta)
        project = canonicalize_name(wheel.name.split("-")[0])
        links.setdefault(project, []).append(
            f'<a href="../../files/{quoted}#sha256={hashlib.sha256(data).hexdigest()}" '
            f'data-core-metadata="sha256={hashlib.sha256(meta).hexdigest()}">{wheel.name}</a>'
        )
    for name, anchors in links.items():
        page = "<!DOCTYPE html><html><body>\n" + "<br/>\n".join(anchors) + "\n</body></html>\n"
        put(f"{base}/simple/{name}/index.html", page.encode())
    return f"{base}/simple"


@pytest.mark.integration
@needs_server
def test_two_runners_share_one_cell_through_the_server(
    fake_project: FakeProject,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    server_base: str,
) -> None:
    fake_project.suite("00-ok", "pass")
    matrix = fake_project.write_matrix()
    # The wheels come from an HTTP index too (on the same server), as on real runners: with PEP 658 metadata,
    # planning reads sglang's pins without its wheel, so runner 2 fetches no wheel at all.
    index = publish_index(fake_project.wheels, f"{server_base}/index")
    matrix.write_text(matrix.read_text().replace('find_links = "wheels"', f'url = "{index}"'))
    where = f"{server_base}/verdicts"
    cache2, _ = two_runners(fake_project, where, tmp_path, monkeypatch, capsys)
    assert cache_files(cache2, "blobs") == [], "runner 2 fetched no wheel"
    assert cache_files(fake_project.cache, "blobs"), "runner 1 did (it ran the cell)"
    digest = verdict.read(verdict.path_of(fake_project.reports, cell_id(OLD))).input_hash
    manifest = open_store(where).manifest(cell_id(OLD), digest)
    assert manifest is not None
    assert manifest["status"] == "passed"
    with urllib.request.urlopen(f"{where}/{digest}/{cell_id(OLD)}/{MANIFEST}", timeout=10) as answer:
        envelope = json.loads(answer.read())
    signed = json.loads(attest.unverified_payload(envelope))["predicate"]
    assert signed == manifest, "the server holds the signed manifest at the documented key"


@pytest.mark.integration
@needs_server
def test_half_uploaded_and_corrupt_entries_on_the_server(
    fake_project: FakeProject, tmp_path: Path, server_base: str, keys: tuple[Path, Path]
) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    where = f"{server_base}/verdicts"
    assert fake_project.run("--store", where) == ExitCode.OK
    cell = cell_id(OLD)
    digest = verdict.read(verdict.path_of(fake_project.reports, cell)).input_hash
    s = open_store(where)
    manifest = s.manifest(cell, digest)
    assert manifest is not None
    assert s.holds(cell, digest)
    # Corrupt one JUnit file on the server: the sha256 check refuses the entry.
    put(f"{where}/{digest}/{cell}/{manifest['upload']}/00-ok.xml", b"<testsuites/>")
    with pytest.raises(BrokenEntry, match=r"00-ok\.xml: sha256"):
        s.fetch(cell, digest, tmp_path / "elsewhere")
    # A manifest naming an upload the server lacks: a file listed but missing.
    resigned = storekeys.seal({**manifest, "upload": "0" * 32}, attest.load_signing_key(keys[0]))
    put(f"{where}/{digest}/{cell}/{MANIFEST}", json.dumps(resigned).encode())
    with pytest.raises(BrokenEntry, match="listed in the manifest but missing"):
        s.holds(cell, digest)
    # Another cell: files uploaded, no manifest (a push cut short) — absent, not an error.
    assert s.manifest("never-finished", digest) is None
    put(f"{where}/{digest}/never-finished/{'1' * 32}/verdict.json", b"{}")
    assert s.holds("never-finished", digest) is False
    # The runner repairs the broken entry by running the cell and pushing it again.
    assert run_as(fake_project, tmp_path / "r2", "--store", where) == ExitCode.OK
    assert len(fake_project.runs()) == 2
    assert s.holds(cell, digest)


@pytest.mark.integration
@needs_server
def test_a_forged_entry_on_the_server_is_not_reused(
    fake_project: FakeProject, tmp_path: Path, server_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Anyone who can PUT to the store: a failed verdict edited to passed and its manifest re-hashed (no key)
    is untrusted on the real server too; the next runner runs the cell and its signed push replaces it."""
    fake_project.suite("00-ok", "fail")
    fake_project.write_matrix()
    where = f"{server_base}/verdicts"
    assert fake_project.run("--store", where) == ExitCode.CELLS_FAILED
    cell = cell_id(OLD)
    digest = verdict.read(verdict.path_of(fake_project.reports, cell)).input_hash
    manifest = open_store(where).manifest(cell, digest)
    assert manifest is not None
    record = json.loads((fake_project.reports / cell / "verdict.json").read_text())
    record["report"]["status"] = "passed"
    forged = json.dumps(record).encode()
    put(f"{where}/{digest}/{cell}/{manifest['upload']}/verdict.json", forged)
    files = {
        **manifest["files"],
        "verdict.json": {"sha256": hashlib.sha256(forged).hexdigest(), "size": len(forged)},
    }
    put(f"{where}/{digest}/{cell}/{MANIFEST}", json.dumps({**manifest, "format": 1, "files": files}).encode())
    capsys.readouterr()
    assert run_as(fake_project, tmp_path / "r2", "--store", where) == ExitCode.CELLS_FAILED
    assert "not trusted: unsigned" in " ".join(capsys.readouterr().err.split())
    assert len(fake_project.runs()) == 2, "run again, never reused"
    assert open_store(where).holds(cell, digest), "the honest signed push replaced the forgery"
