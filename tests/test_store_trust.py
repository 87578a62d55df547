"""Trust that survives the trip: a stored verdict is re-judged and its key recomputed on every read, and a
shared store's entry counts only when a trusted runner key signed it (stackfarm.verdict, stackfarm.store,
stackfarm.storekeys).

Each test is one way a hostile or careless writer could make a verdict greener than the truth, run end to end
on the fake stack: the forged verdict is never reused or merged, the reason names the file, and an honest
entry signed by a trusted runner still is."""

from __future__ import annotations

import base64
import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from fakestack import NEW, OLD, FakeProject, cell_id
from stackfarm import attest, storekeys, verdict
from stackfarm.cli import main
from stackfarm.errors import ExitCode
from stackfarm.store import MANIFEST, BrokenEntry, UntrustedEntry, open_store

pytest_plugins = ("fakestack",)

CELL = cell_id(OLD)


def keypair(folder: Path) -> tuple[Path, Path]:
    private, public, _ = attest.generate(folder)
    return private, public


def as_runner(monkeypatch: pytest.MonkeyPatch, key: Path | None, trusted: list[Path]) -> None:
    """This process becomes a runner signing with `key` and trusting the public keys `trusted`."""
    if key is None:
        monkeypatch.delenv(storekeys.RUNNER_KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(storekeys.RUNNER_KEY_ENV, str(key))
    monkeypatch.setenv(storekeys.TRUSTED_RUNNER_KEYS_ENV, os.pathsep.join(map(str, trusted)))


def only_entry(store: Path) -> tuple[str, Path]:
    [manifest] = sorted(store.glob(f"*/*/{MANIFEST}"))
    return manifest.parent.parent.name, manifest.parent


def predicate(entry: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(attest.unverified_payload(json.loads((entry / MANIFEST).read_text())))
    return dict(data["predicate"])


def rehash(entry: Path, name: str, data: bytes) -> dict[str, Any]:
    """Replace one file of the entry and return a manifest predicate that lists its new sha256 (what a
    forger with write access but no key can make)."""
    import hashlib

    manifest = predicate(entry)
    (entry / manifest["upload"] / name).write_bytes(data)
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    return manifest


def flipped(raw: bytes) -> bytes:
    """A verdict record whose stored status says passed (its JUnit files untouched)."""
    record = json.loads(raw)
    record["report"]["status"] = "passed"
    record["report"]["reason"] = ""
    for suite in record["report"]["suites"]:
        suite["outcome"], suite["failures"], suite["first_failure"] = "passed", 0, None
    return json.dumps(record, indent=1).encode()


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    return {name: keypair(tmp_path / "keys" / name) for name in ("a", "b", "mallory")}


@pytest.fixture
def failed_entry(
    fake_project: FakeProject,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, tuple[Path, Path]],
) -> tuple[Path, str, Path]:
    """Runner A ran a failing cell and pushed its signed verdict: (store, input hash, entry folder)."""
    fake_project.suite("00-ok", "fail")
    fake_project.write_matrix()
    store = tmp_path / "store"
    as_runner(monkeypatch, keys["a"][0], [])
    assert fake_project.run("--store", str(store)) == ExitCode.CELLS_FAILED
    digest, entry = only_entry(store)
    return store, digest, entry


def runner_b(
    project: FakeProject,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, tuple[Path, Path]],
    store: Path,
) -> tuple[int, str]:
    """Runner B (its own key, trusting A's public key, an empty cache and reports folder) runs the cell."""
    as_runner(monkeypatch, keys["b"][0], [keys["a"][1]])
    monkeypatch.setenv("STACKFARM_CACHE", str(tmp_path / "b-cache"))
    code = main(["run", "--matrix", str(project.matrix), "--reports", str(tmp_path / "b-reports"),
                 "--backend", "local", "--jobs", "1", "--store", str(store)])  # fmt: skip
    return code, str(verdict.read(verdict.path_of(tmp_path / "b-reports", CELL)).report.status)


def gate_from(
    project: FakeProject,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, tuple[Path, Path]],
    store: Path,
) -> int:
    """`report --from STORE --gate` by a merge step that trusts A's key."""
    as_runner(monkeypatch, None, [keys["a"][1]])
    return main(["report", "--from", str(store), "--matrix", str(project.matrix), "--backend", "local",
                 "--no-gpu", "--reports", str(tmp_path / "merged"), "--gate"])  # fmt: skip


# --------------------------------------------------------------------------- the store


def test_an_honest_entry_signed_by_a_trusted_runner_is_reused(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    store = tmp_path / "store"
    as_runner(monkeypatch, keys["a"][0], [])
    assert fake_project.run("--store", str(store)) == ExitCode.OK
    capsys.readouterr()
    assert runner_b(fake_project, tmp_path, monkeypatch, keys, store) == (ExitCode.OK, "passed")
    assert "nothing built or run" in capsys.readouterr().err
    assert len(fake_project.runs()) == 1, "runner B reused A's signed verdict"
    assert gate_from(fake_project, tmp_path, monkeypatch, keys, store) == ExitCode.OK


def test_a_forged_status_re_hashed_without_a_key_is_never_reused_or_merged(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, tuple[Path, Path]], failed_entry: tuple[Path, str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Before: the forger's plain re-hashed manifest made runner B print `verdict reused … passed`, exit 0,
    and `report --from --gate` exit 0. After: untrusted (unsigned), counted as missing; B runs the cell."""
    store, digest, entry = failed_entry
    upload = predicate(entry)["upload"]
    forged = rehash(entry, "verdict.json", flipped((entry / upload / "verdict.json").read_bytes()))
    (entry / MANIFEST).write_text(json.dumps({**forged, "format": 1}))  # re-hashed, unsigned
    with pytest.raises(UntrustedEntry, match="unsigned"):
        open_store(store).holds(CELL, digest)
    capsys.readouterr()
    assert runner_b(fake_project, tmp_path, monkeypatch, keys, store) == (ExitCode.CELLS_FAILED, "failed")
    err = " ".join(capsys.readouterr().err.split())
    assert "not trusted: unsigned" in err
    assert "running the cell again" in err
    assert len(fake_project.runs()) == 2, "runner B ran the cell itself"
    # B's own (signed, honest) push replaced the forgery; a merge step trusting only A still refuses B's.
    assert gate_from(fake_project, tmp_path, monkeypatch, keys, store) == ExitCode.INCOMPLETE
    out = " ".join(capsys.readouterr().out.split())
    assert "is not used" in out
    assert "not a trusted key" in out


def test_an_edited_signed_manifest_or_an_unknown_signer_is_untrusted(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, tuple[Path, Path]], failed_entry: tuple[Path, str, Path],
) -> None:  # fmt: skip
    store, digest, entry = failed_entry
    as_runner(monkeypatch, None, [keys["a"][1]])
    reader = open_store(store)
    upload = predicate(entry)["upload"]
    forged = rehash(entry, "verdict.json", flipped((entry / upload / "verdict.json").read_bytes()))
    envelope = json.loads((entry / MANIFEST).read_text())
    import base64

    # The payload swapped under A's signature.
    statement = json.loads(attest.unverified_payload(envelope))
    statement["predicate"] = forged
    edited = {**envelope, "payload": base64.b64encode(attest.canonical_json(statement)).decode()}
    (entry / MANIFEST).write_text(json.dumps(edited))
    with pytest.raises(UntrustedEntry, match="changed after it was signed"):
        reader.holds(CELL, digest)
    # Signed by a key nobody trusts.
    (entry / MANIFEST).write_text(
        json.dumps(storekeys.seal(forged, attest.load_signing_key(keys["mallory"][0])))
    )
    with pytest.raises(UntrustedEntry, match="not a trusted key"):
        reader.holds(CELL, digest)
    # A's own envelope with an unsigned field beside it.
    (entry / MANIFEST).write_text(json.dumps({**envelope, "status": "passed"}))
    with pytest.raises(UntrustedEntry, match="unsigned fields beside the signed envelope: status"):
        reader.holds(CELL, digest)


def test_a_status_flipped_under_a_trusted_signature_is_re_judged_from_junit(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, tuple[Path, Path]], failed_entry: tuple[Path, str, Path],
) -> None:  # fmt: skip
    """Even a trusted key's entry is re-judged: a verdict.json saying passed beside a failing JUnit file."""
    store, digest, entry = failed_entry
    upload = predicate(entry)["upload"]
    forged = rehash(entry, "verdict.json", flipped((entry / upload / "verdict.json").read_bytes()))
    forged["status"] = "passed"
    (entry / MANIFEST).write_text(json.dumps(storekeys.seal(forged, attest.load_signing_key(keys["a"][0]))))
    as_runner(monkeypatch, None, [keys["a"][1]])
    with pytest.raises(BrokenEntry, match=r"00-ok: stored passed, its JUnit file 00-ok\.xml says failed"):
        open_store(store).holds(CELL, digest)


def test_a_signed_entry_replayed_under_another_key_is_refused(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, tuple[Path, Path]], failed_entry: tuple[Path, str, Path],
) -> None:  # fmt: skip
    """A's honest entry copied whole under another input hash (a replay): the signed predicate names the
    other hash, and the verdict's recorded inputs do not hash to it."""
    import shutil

    store, _digest, entry = failed_entry
    other = "f" * 64
    shutil.copytree(entry.parent, store / other)
    as_runner(monkeypatch, None, [keys["a"][1]])
    with pytest.raises(BrokenEntry, match="not of this entry"):
        open_store(store).holds(CELL, other)


def test_a_run_that_pushes_needs_a_runner_key_and_a_reader_a_trusted_one(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    as_runner(monkeypatch, None, [keys["a"][1]])
    assert fake_project.run("--store", str(tmp_path / "store")) == ExitCode.CONFIG
    assert storekeys.RUNNER_KEY_ENV in capsys.readouterr().err
    as_runner(monkeypatch, None, [])
    assert (
        main(["plan", "--json", "--matrix", str(fake_project.matrix), "--store", str(tmp_path)])
        == ExitCode.CONFIG
    )
    assert "no trusted runner key" in " ".join(capsys.readouterr().err.split())


# --------------------------------------------------------------------------- a local reports folder


def test_a_stored_status_edited_in_reports_is_named_and_the_cell_runs_again(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: changing only "status" in a failed cell's verdict.json made the next run say `reused — passed`,
    exit 0 (the summary row showed `❌ 1 of 1 failed` beside `✅ passed`). After: named, and run again."""
    fake_project.suite("00-ok", "fail")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.CELLS_FAILED
    path = verdict.path_of(fake_project.reports, CELL)
    record = json.loads(path.read_text())
    record["report"]["status"] = "passed"
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="stored status passed, re-judged from its JUnit files: failed"):
        verdict.read(path)
    capsys.readouterr()
    assert main(["report", "--reports", str(fake_project.reports), "--gate"]) != ExitCode.OK
    assert str(path) in " ".join(capsys.readouterr().err.split())
    assert fake_project.run() == ExitCode.CELLS_FAILED
    assert "running the cell again" in " ".join(capsys.readouterr().err.split())
    assert len(fake_project.runs()) == 2


def test_a_verdict_whose_inputs_do_not_hash_to_its_key_is_refused(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """An edited "inputs" (here: "this verdict was computed with a GPU") no longer hashes to the key it is
    stored under: never reused, named; a suite of the inputs dropped from the verdict is named on every read."""
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.OK
    path = verdict.path_of(fake_project.reports, CELL)
    record = json.loads(path.read_text())
    record["inputs"]["gpu"] = True
    path.write_text(json.dumps(record))
    stored = verdict.read(path)
    why = verdict.reusable(stored, stored.input_hash)
    assert why is not None
    assert "not to the key it is stored under" in why
    capsys.readouterr()
    assert fake_project.run() == ExitCode.OK
    assert len(fake_project.runs()) == 2, "run again, not reused"
    record = json.loads(path.read_text())
    del record["report"]["suites"][0]
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="no result for suite"):
        verdict.read(path)


def test_an_honest_verdict_reads_back_with_its_key_recomputed(fake_project: FakeProject) -> None:
    fake_project.suite("00-ok", "pass")
    fake_project.suite("10-fail", "fail", gate=False)
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.CELLS_FAILED
    stored = verdict.read(verdict.path_of(fake_project.reports, CELL))
    assert verdict.input_hash(stored.inputs) == stored.input_hash
    assert stored.report.status == "failed"
    assert [s.outcome for s in stored.report.suites] == ["passed", "failed"]


# --------------------------------------------------------------------------- paths and harness errors


def test_relative_matrix_and_reports_paths_are_the_callers(
    fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: every suite failed with `pytest exited 4: file or directory not found`, stored and reused."""
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    monkeypatch.chdir(fake_project.root)
    code = main(
        ["run", "--matrix", "matrix.toml", "--reports", "reports", "--backend", "local", "--jobs", "1"]
    )
    assert code == ExitCode.OK
    assert verdict.read(verdict.path_of(fake_project.reports, CELL)).report.status == "passed"


def test_a_pytest_usage_error_is_a_harness_error_never_reused(fake_project: FakeProject) -> None:
    """pytest exit 4 (here: an option pytest does not know, from the suite's own ini file) is stackfarm's
    error, not the suite's failure: status error, and a re-run asks again."""
    folder = fake_project.suite("00-ok", "pass")
    (folder / "pytest.ini").write_text("[pytest]\naddopts = --no-such-option\n")
    fake_project.write_matrix()
    assert fake_project.run() == ExitCode.CELLS_FAILED
    stored = verdict.read(verdict.path_of(fake_project.reports, CELL))
    assert (stored.report.status, stored.report.cause) == ("error", "internal")
    assert "pytest exited 4" in stored.report.reason
    assert "harness error" in stored.report.reason
    assert fake_project.run() == ExitCode.CELLS_FAILED
    again = verdict.read(verdict.path_of(fake_project.reports, CELL)).report
    assert again.run_id != stored.report.run_id, "never reused: the second run asked pytest again"


def test_a_runner_key_given_as_its_pem_text_signs_like_a_key_file(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A CI secret holds the key itself: STACKFARM_RUNNER_KEY may be the PEM text, which never touches a disk."""
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    store = tmp_path / "store"
    as_runner(monkeypatch, None, [])
    monkeypatch.setenv(storekeys.RUNNER_KEY_ENV, keys["a"][0].read_text())
    assert fake_project.run("--store", str(store)) == ExitCode.OK
    assert "verdict pushed" in capsys.readouterr().err
    assert runner_b(fake_project, tmp_path, monkeypatch, keys, store) == (ExitCode.OK, "passed")
    assert len(fake_project.runs()) == 1, "B trusted A's key and reused the entry"


def test_a_runner_key_others_can_read_is_refused(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    keys["a"][0].chmod(0o644)
    as_runner(monkeypatch, keys["a"][0], [])
    assert fake_project.run("--store", str(tmp_path / "store")) == ExitCode.CONFIG
    assert "chmod 600" in capsys.readouterr().err


def test_the_matrix_names_the_trusted_runner_keys(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """[store] trusted_keys (committed beside matrix.toml): a merge step with no key of its own believes the
    entries of the runners it names, and only those."""
    fake_project.suite("00-ok", "pass")
    folder = fake_project.root / "keys" / "runners"
    folder.mkdir(parents=True)
    (folder / "a.pub.pem").write_bytes(keys["a"][1].read_bytes())
    fake_project.write_matrix(extra='\n[store]\ntrusted_keys = ["keys/runners"]\n')
    store = tmp_path / "store"
    as_runner(monkeypatch, keys["a"][0], [])
    assert fake_project.run("--store", str(store)) == ExitCode.OK
    as_runner(monkeypatch, None, [])
    merge = ["report", "--from", str(store), "--matrix", str(fake_project.matrix), "--backend", "local",
             "--no-gpu", "--gate", "--reports"]  # fmt: skip
    assert main([*merge, str(tmp_path / "merged")]) == ExitCode.OK
    (folder / "a.pub.pem").write_bytes(keys["mallory"][1].read_bytes())  # the repo now trusts another runner
    capsys.readouterr()
    assert main([*merge, str(tmp_path / "merged2")]) == ExitCode.INCOMPLETE
    assert "not a trusted key" in " ".join(capsys.readouterr().out.split())


# --------------------------------------------------------------------------- the store's HTTP client


class _Dav(http.server.BaseHTTPRequestHandler):
    """GET/PUT of whole files, for one Authorization header only (a private store)."""

    files: ClassVar[dict[str, bytes]] = {}
    wanted: ClassVar[str] = ""
    seen: ClassVar[list[str]] = []

    def _allowed(self) -> bool:
        got = self.headers.get("Authorization", "")
        self.seen.append(got)
        if got != self.wanted:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        return True

    def do_GET(self) -> None:
        if not self._allowed():
            return
        body = self.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def do_PUT(self) -> None:
        if not self._allowed():
            return
        self.files[self.path] = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture
def private_store() -> Iterator[tuple[str, type[_Dav]]]:
    handler = type("Dav", (_Dav,), {"files": {}, "seen": [], "wanted": ""})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _everything(project: FakeProject, *more: Path) -> str:
    return "".join(
        p.read_text(errors="replace")
        for root in (project.reports, *more)
        for p in root.rglob("*")
        if p.is_file()
    )


@pytest.mark.parametrize("how", ["inline", "bearer"])
def test_a_private_store_gets_credentials_through_the_index_client_and_never_shows_them(
    fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch, keys: dict[str, tuple[Path, Path]],
    capsys: pytest.CaptureFixture[str], private_store: tuple[str, type[_Dav]], how: str,
) -> None:  # fmt: skip
    """Before: the store had its own urllib path: `user:pw@` in --store went into the request line and every
    message, and a token could not be given. After: the index's client (inline credentials, netrc, a bearer
    token from STACKFARM_STORE_TOKEN) and the URL shown without the secret."""
    from stackfarm import indexauth

    indexauth.forget()
    where, handler = private_store
    secret = "s3cr3t-TOKEN"
    if how == "inline":
        handler.wanted = "Basic " + base64.b64encode(f"ci:{secret}".encode()).decode()
        url = f"http://ci:{secret}@{where}/store"
    else:
        handler.wanted = f"Bearer {secret}"
        monkeypatch.setenv("STACKFARM_STORE_TOKEN", secret)
        url = f"http://{where}/store"
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix()
    as_runner(monkeypatch, keys["a"][0], [])
    assert fake_project.run("--store", url) == ExitCode.OK
    out = capsys.readouterr()
    assert "verdict pushed" in out.err
    assert any(k.endswith("/manifest.json") for k in handler.files), "the signed entry is on the server"
    assert secret not in out.out + out.err + _everything(fake_project)
    assert set(handler.seen) == {handler.wanted}, "every request carried the credentials"
    indexauth.forget()


def test_a_forged_verdict_beside_honest_ones_keeps_report_gate_red(
    fake_project: FakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two cells: one honestly passed, one failed whose verdict.json was edited to passed. Leaving the forged
    one out of the merged report would gate on the honest cell alone (exit 0): it is shown re-judged (failed),
    named, and the gate fails."""
    import shutil

    other = cell_id(NEW)
    fake_project.suite("00-ok", "fail")
    fake_project.write_matrix([OLD, NEW])
    assert fake_project.run() == ExitCode.CELLS_FAILED
    kept = fake_project.root / "failed-copy"
    shutil.copytree(fake_project.reports / other, kept)
    fake_project.suite("00-ok", "pass")
    fake_project.write_matrix([OLD, NEW])
    assert fake_project.run() == ExitCode.OK
    shutil.rmtree(fake_project.reports / other)
    shutil.copytree(kept, fake_project.reports / other)
    path = verdict.path_of(fake_project.reports, other)
    path.write_bytes(flipped(path.read_bytes()))
    capsys.readouterr()
    assert main(["report", "--reports", str(fake_project.reports), "--gate"]) == ExitCode.CELLS_FAILED
    err = " ".join(capsys.readouterr().err.split())
    assert f"{path}: 00-ok: stored passed, its JUnit file 00-ok.xml says failed" in err
    assert "❌" in (fake_project.reports / "summary.md").read_text()
