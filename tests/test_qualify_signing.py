"""qualify's signed records: the DSSE envelope and its key set-up, and --verify refusing what a key cannot vouch
for (an edited payload, an untrusted signer, a needs-GPU suite passed without a GPU, reports changed since).

Each end-to-end test runs a real cell on the fake find_links index (tests/fakestack.py: real tiny wheels,
real pytest processes, nothing downloaded, no GPU answering), qualifies it and verifies the record.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from junitparser import JUnitXml

from fakestack import OLD, FakeProject, cell_id
from stackfarm import attest, qualify
from stackfarm.cli import main as stackfarm_main
from stackfarm.errors import ConfigError, ExitCode
from stackfarm.plan import input_hash

pytest_plugins = ("fakestack",)

CELL = cell_id(OLD)
FIGURES = """
def test_decode(record_property):
    record_property("decode_tok_s", "92.6")
    assert 92.6 > 89.5
"""


# --------------------------------------------------------------------------- DSSE and keys (unit)


def test_pae_is_the_dsse_v1_encoding() -> None:
    # The DSSE specification's own example (protocol.md).
    assert attest.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert attest.pae("", b"") == b"DSSEv1 0  0 "
    assert attest.pae("t\u00e9", b"\x00") == b"DSSEv1 3 t\xc3\xa9 1 \x00", "lengths are in bytes"


def test_keygen_writes_a_private_0600_key_and_its_public_half(tmp_path: Path) -> None:
    private, public, key_id = attest.generate(tmp_path / "keys")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in private.read_bytes()
    assert b"PUBLIC KEY" in public.read_bytes()
    signing = attest.load_signing_key(private)
    [trusted] = attest.load_trusted_keys([public])
    assert signing.key_id == trusted.key_id == key_id
    envelope = attest.sign(b'{"x":1}', signing, "text/plain")
    assert envelope["signatures"][0]["keyid"] == key_id
    # A folder of keys gives its public ones, passing over the private key beside them.
    assert [k.key_id for k in attest.load_trusted_keys([tmp_path / "keys"])] == [key_id]
    with pytest.raises(ConfigError, match="never overwritten"):
        attest.generate(tmp_path / "keys")


def test_no_key_or_the_wrong_key_is_a_config_error_saying_how_to_make_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(attest.SIGNING_KEY_ENV, raising=False)
    monkeypatch.delenv(attest.TRUSTED_KEYS_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"no signing key(.|\n)*stackfarm qualify --keygen DIR"):
        attest.load_signing_key()
    with pytest.raises(ConfigError, match=f"no trusted public key(.|\n)*{attest.TRUSTED_KEYS_ENV}"):
        attest.load_trusted_keys()
    private, public, key_id = attest.generate(tmp_path / "k")
    with pytest.raises(ConfigError, match="a private key: trust its public half"):
        attest.load_trusted_keys([private])
    with pytest.raises(ConfigError, match="not a PEM private key"):
        attest.load_signing_key(public)
    # The environment names them too; several trusted keys are separated by os.pathsep.
    other = attest.generate(tmp_path / "other")
    monkeypatch.setenv(attest.SIGNING_KEY_ENV, str(private))
    monkeypatch.setenv(attest.TRUSTED_KEYS_ENV, f"{public}{os.pathsep}{other[1]}")
    assert attest.load_signing_key().key_id == key_id
    assert [k.key_id for k in attest.load_trusted_keys()] == [key_id, other[2]]


def test_qualify_without_a_key_exits_2_before_reading_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(attest.SIGNING_KEY_ENV, raising=False)
    argv = ["qualify", "--cell", CELL, "--release", "r1", "--approver", "Ana", "--reports", str(tmp_path)]
    assert stackfarm_main(argv) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "no signing key" in err
    assert "stackfarm qualify --keygen DIR" in err
    assert attest.SIGNING_KEY_ENV in err


def test_keygen_and_verify_modes_do_not_mix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert stackfarm_main(["qualify", "--keygen", str(tmp_path), "--verify", "x.json"]) == ExitCode.CONFIG
    assert "--keygen and --verify together" in capsys.readouterr().err
    assert stackfarm_main(["qualify", "--keygen", str(tmp_path / "k")]) == ExitCode.OK
    out = capsys.readouterr().out
    assert f"--key {tmp_path / 'k' / attest.PRIVATE_NAME}" in out
    assert (tmp_path / "k" / attest.PUBLIC_NAME).is_file()


# --------------------------------------------------------------------------- a run on the fake stack


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    private, public, _ = attest.generate(tmp_path / "keys")
    return private, public


def _project(fake: FakeProject, *, gpu_suite: bool = False) -> FakeProject:
    fake.suite("00-ok", "pass")
    (fake.suites / "00-ok" / "test_it.py").write_text(FIGURES, encoding="utf-8")
    if gpu_suite:
        fake.suite("40-throughput", "pass", needs_gpu=True, gate=False)
    fake.write_matrix()
    return fake


def _qualify(fake: FakeProject, key: Path, release: str = "r1", *extra: str) -> int:
    return stackfarm_main(
        ["qualify", "--cell", CELL, "--release", release, "--approver", "Ana Approver",
         "--reports", str(fake.reports), "--matrix", str(fake.matrix), "--key", str(key), *extra]
    )  # fmt: skip


def _verify(fake: FakeProject, record: Path, *public: Path) -> int:
    keys = [arg for p in public for arg in ("--public-key", str(p))]
    return stackfarm_main(["qualify", "--verify", str(record), "--matrix", str(fake.matrix), *keys])


def _record(fake: FakeProject, release: str = "r1") -> Path:
    return fake.reports / "qualifications" / f"{release}.json"


def _statement(record: Path) -> dict[str, Any]:
    envelope = json.loads(record.read_text())
    statement: dict[str, Any] = json.loads(base64.b64decode(envelope["payload"]))
    return statement


def _rewrite(record: Path, statement: dict[str, Any], key: Path | None = None) -> None:
    """The record with `statement` as its payload: re-signed by `key`, or keeping the old signature."""
    envelope = json.loads(record.read_text())
    payload = attest.canonical_json(statement)
    if key is not None:
        envelope = attest.sign(payload, attest.load_signing_key(key))
    else:
        envelope["payload"] = base64.b64encode(payload).decode()
    record.write_text(json.dumps(envelope))


def test_a_signed_record_round_trips_and_binds_the_wheels_and_reports(
    fake_project: FakeProject, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _project(fake_project)
    private, public = keys
    assert fake.run() == ExitCode.OK
    assert _qualify(fake, private) == ExitCode.OK
    key_id = attest.load_signing_key(private).key_id
    assert f"signed by key {key_id}" in capsys.readouterr().out

    envelope = json.loads(_record(fake).read_text())
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    assert [s["keyid"] for s in envelope["signatures"]] == [key_id]
    statement = _statement(_record(fake))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == qualify.PREDICATE_TYPE
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert "sglang-0.5.9-py3-none-any.whl" in subjects
    verdict_json = fake.reports / CELL / "verdict.json"
    assert subjects[f"{CELL}/verdict.json"] == hashlib.sha256(verdict_json.read_bytes()).hexdigest()
    assert f"{CELL}/00-ok.xml" in subjects
    predicate = statement["predicate"]
    assert predicate["approver"] == "Ana Approver"
    assert predicate["gpu"]["present"] is False
    assert predicate["gpu"]["no_gpu_reason"].startswith("nvidia-smi lists no GPU")
    assert predicate["backend"] == "local"
    assert predicate["image_digest"] is None
    assert predicate["run_id"] == json.loads(verdict_json.read_text())["run_id"]
    assert predicate["reports"]["verdict"]["sha256"] == subjects[f"{CELL}/verdict.json"]
    md = _record(fake).with_suffix(".md").read_text()
    assert f"signed by key `{key_id}`" in md
    assert "| 00-ok | test_decode | decode_tok_s | 92.6 |" in md
    assert qualify.verified_predicate(_record(fake), attest.load_trusted_keys([public])) == predicate

    assert _verify(fake, _record(fake), public) == ExitCode.OK
    out = capsys.readouterr().out
    assert f"signature ok: key {key_id[:16]}" in out
    assert "reports: 2 signed file(s) re-hashed" in out
    assert "the record holds" in out


def test_an_edited_payload_is_tampered_even_with_its_hashes_recomputed(
    fake_project: FakeProject, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _project(fake_project)
    private, public = keys
    assert fake.run() == ExitCode.OK
    assert _qualify(fake, private) == ExitCode.OK
    record = _record(fake)
    statement = _statement(record)
    predicate = statement["predicate"]
    predicate["approver"] = "Mallory"
    ok = next(s for s in predicate["suites"] if s["suite"] == "00-ok")
    ok["cases"][0]["properties"]["decode_tok_s"] = "120.0"
    # Every hash inside recomputed as the old seal allowed: nothing of it is a key.
    predicate["input_hash"] = input_hash(predicate["inputs"])
    _rewrite(record, statement)
    capsys.readouterr()
    assert _verify(fake, record, public) == ExitCode.CELLS_FAILED
    out = capsys.readouterr().out
    assert out.startswith("TAMPERED: the signature does not match the payload")
    assert "the record holds" not in out

    # The old unsigned layout (an unkeyed sha256 seal) is never taken for a signed record.
    record.write_text(json.dumps({**predicate, "schema": 1, "record_sha256": "0" * 64}))
    assert _verify(fake, record, public) == ExitCode.CELLS_FAILED
    assert capsys.readouterr().out.startswith("UNSIGNED: ")


def test_a_record_signed_by_an_untrusted_key_is_refused(
    fake_project: FakeProject, keys: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _project(fake_project)
    private, public = keys
    mallory, mallory_public, mallory_id = attest.generate(tmp_path / "mallory")
    assert fake.run() == ExitCode.OK
    assert _qualify(fake, mallory) == ExitCode.OK
    capsys.readouterr()
    assert _verify(fake, _record(fake), public) == ExitCode.CELLS_FAILED
    out = capsys.readouterr().out
    assert out.startswith(f"TAMPERED: signed by key {mallory_id[:16]}…, which is not a trusted key")
    # A signature with no keyid is tried against every trusted key, and still refused.
    envelope = json.loads(_record(fake).read_text())
    del envelope["signatures"][0]["keyid"]
    _record(fake).write_text(json.dumps(envelope))
    assert _verify(fake, _record(fake), public) == ExitCode.CELLS_FAILED
    assert "TAMPERED: the signature does not match" in capsys.readouterr().out
    # A team trusts several keys: once mallory's is among them, the record holds.
    assert _verify(fake, _record(fake), public, mallory_public) == ExitCode.OK
    assert _qualify(fake, private, "r2") == ExitCode.OK
    assert _verify(fake, _record(fake, "r2"), public, mallory_public) == ExitCode.OK


def _forge_passed(fake: FakeProject, suite: str, *, update_sha: bool) -> None:
    """Hand-edit the suite's JUnit file and verdict.json to say "passed" (as a forger would)."""
    xml_path = fake.reports / CELL / f"{suite}.xml"
    xml = JUnitXml.fromfile(str(xml_path))
    for ts in xml:
        for case in ts:
            case.result = []
    xml.update_statistics()  # type: ignore[no-untyped-call]  # junitparser: unannotated
    xml.write(str(xml_path))
    path = fake.reports / CELL / "verdict.json"
    data = json.loads(path.read_text())
    report = data["report"]
    report["status"], report["reason"] = "passed", ""
    for entry in report["suites"]:
        if entry["suite"] == suite:
            entry.update(outcome="passed", skipped=0, first_failure=None)
            if update_sha:
                entry["sha256"] = hashlib.sha256(xml_path.read_bytes()).hexdigest()
    path.write_text(json.dumps(data, indent=1))


@pytest.mark.parametrize("update_sha", [True, False], ids=["junit-hash-updated", "junit-hash-stale"])
def test_a_needs_gpu_suite_hand_edited_to_passed_on_a_run_without_gpu_is_refused(
    fake_project: FakeProject, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str], update_sha: bool
) -> None:
    fake = _project(fake_project, gpu_suite=True)
    assert fake.run() == ExitCode.INCOMPLETE, "40-throughput needs a GPU, and none answers"
    _forge_passed(fake, "40-throughput", update_sha=update_sha)
    capsys.readouterr()
    assert _qualify(fake, keys[0]) == ExitCode.CELLS_FAILED
    err = capsys.readouterr().err
    assert f"refused: the latest run of {CELL} cannot be genuine:" in err
    assert "40-throughput: needs a GPU, yet it is recorded passed by a run that had none" in err
    assert "a forged verdict" in err
    if not update_sha:
        assert "40-throughput.xml is not the JUnit file the verdict summarised" in err
    assert not _record(fake).exists()


def test_a_verdict_that_says_otherwise_than_its_junit_file_is_refused(
    fake_project: FakeProject, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _project(fake_project, gpu_suite=True)
    assert fake.run() == ExitCode.INCOMPLETE
    path = fake.reports / CELL / "verdict.json"
    data = json.loads(path.read_text())
    data["report"]["no_gpu_reason"] = None  # the forger claims a GPU, too
    data["report"]["status"] = "passed"
    data["report"]["suites"][-1].update(outcome="passed", skipped=0)
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert _qualify(fake, keys[0]) == ExitCode.CELLS_FAILED
    err = capsys.readouterr().err
    assert "40-throughput: verdict.json says passed, its JUnit file says skipped" in err
    # no_gpu_reason erased, the run's inputs still say no GPU.
    assert "recorded passed by a run that had none (its inputs say no GPU)" in err


def test_a_signed_record_of_a_gpu_suite_passed_without_gpu_is_refused_at_verify(
    fake_project: FakeProject, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _project(fake_project)
    private, public = keys
    assert fake.run() == ExitCode.OK
    assert _qualify(fake, private) == ExitCode.OK
    # A key holder signs a record (an older stackfarm, a script) whose needs-GPU suite passed with no GPU.
    statement = _statement(_record(fake))
    statement["predicate"]["suites"][-1]["needs_gpu"] = True
    _rewrite(_record(fake), statement, key=private)
    capsys.readouterr()
    assert _verify(fake, _record(fake), public) == ExitCode.CELLS_FAILED
    out = capsys.readouterr().out
    assert "signature ok" in out
    assert "REFUSED: 00-ok: needs a GPU, yet it is recorded passed by a run that had none" in out
    assert "the record no longer holds: it records a verdict that cannot be genuine" in out


def test_a_report_edited_after_signing_is_named_and_absent_reports_are_not_rechecked(
    fake_project: FakeProject, keys: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _project(fake_project)
    private, public = keys
    assert fake.run() == ExitCode.OK
    assert _qualify(fake, private) == ExitCode.OK
    junit = fake.reports / CELL / "00-ok.xml"
    junit.write_text(junit.read_text().replace("92.6", "99.9"))
    capsys.readouterr()
    assert _verify(fake, _record(fake), public) == ExitCode.CELLS_FAILED
    out = capsys.readouterr().out
    assert "reports: 2 signed file(s) re-hashed" in out
    assert f"  changed since the sign-off: {junit}: sha256 " in out
    assert out.count("changed since the sign-off") == 1, "only the edited JUnit file"
    assert "the record no longer holds: 1 signed report file(s) changed" in out

    # The record alone (a release artefact, away from reports/): signature and inputs still checked.
    alone = tmp_path / "release" / "qualifications" / "r1.json"
    alone.parent.mkdir(parents=True)
    alone.write_bytes(_record(fake).read_bytes())
    assert _verify(fake, alone, public) == ExitCode.OK
    out = capsys.readouterr().out
    assert f"reports: not on disk under {tmp_path / 'release'}/ (not re-checked)" in out
    assert "the record holds" in out


def test_a_foreign_key_type_is_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "ec.pem").write_bytes(pem)
    with pytest.raises(ConfigError, match="not an Ed25519 private key"):
        attest.load_signing_key(tmp_path / "ec.pem")
    # And a bare Ed25519 key object signs as any other (the attest API takes keys, not only files).
    key = Ed25519PrivateKey.generate()
    signing = attest.SigningKey(private=key, key_id=attest.key_id(key.public_key()), path=tmp_path)
    trusted = attest.TrustedKey(public=key.public_key(), key_id=signing.key_id, path=tmp_path)
    stmt = attest.statement([{"name": "a", "digest": {"sha256": "0" * 64}}], "urn:x", {"k": 1})
    opened = attest.open_envelope(attest.sign(attest.canonical_json(stmt), signing), [trusted])
    assert opened.statement == stmt
