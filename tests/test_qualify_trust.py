"""qualify must mean "passed": a cell whose JUnit files do not make it passed, or that ran no required suite,
is refused; --verify binds the record to its release name and to nothing unsigned beside the envelope; a
signing key others can read is refused, as ssh refuses one.

The end-to-end tests run a real cell on the fake find_links index (tests/fakestack.py), like
tests/test_qualify_signing.py, with its helpers.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

from fakestack import FakeProject
from stackfarm import attest, qualify, verdict
from stackfarm.cli import main as stackfarm_main
from stackfarm.errors import ConfigError, ExitCode
from stackfarm.history import cell_run
from stackfarm.patches.git import make_patch
from test_qualify_signing import CELL, _project, _qualify, _record

pytest_plugins = ("fakestack",)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    private, public, _ = attest.generate(tmp_path / "keys")
    return private, public


def _verify(fake: FakeProject, record: Path, public: Path, *extra: str) -> int:
    argv = ["qualify", "--verify", str(record), "--matrix", str(fake.matrix), "--public-key", str(public)]
    return stackfarm_main([*argv, *extra])


def _refused(fake: FakeProject, key: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """qualify exits 1, writes no record, and says why on stderr (returned)."""
    capsys.readouterr()
    assert _qualify(fake, key) == ExitCode.CELLS_FAILED
    assert not _record(fake).exists(), "a refused cell has no record"
    err = capsys.readouterr().err
    assert CELL in err, "the refusal names the cell"
    return err


# --------------------------------------------------------------------------- 1. only a passed cell is signed


def test_a_cell_that_ran_zero_suites_is_refused(
    fake_project: FakeProject, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fake_project
    fake.write_matrix()  # no suite at all
    assert fake.run() == ExitCode.INCOMPLETE, "zero suites run is incomplete, never passed"
    err = _refused(fake, keys[0], capsys)
    assert f"refused: {CELL} cannot be qualified as r1; not passed:" in err
    assert f"  - cell {CELL} is incomplete, re-judged from its JUnit files (no suite ran" in err
    assert f"  - cell {CELL} ran no required suite: it ran zero suites" in err


def test_a_cell_whose_every_suite_did_not_apply_is_refused(
    fake_project: FakeProject, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fake_project
    # fakestack's "not-applicable" suite without its one testcase that passes: every testcase does not apply.
    module = fake.suite("00-ok", "not-applicable") / "test_it.py"
    text = module.read_text(encoding="utf-8")
    assert "def test_passes(" in text
    module.write_text(text.replace("def test_passes(", "def _passes("), encoding="utf-8")
    fake.write_matrix()
    assert fake.run() == ExitCode.INCOMPLETE
    err = _refused(fake, keys[0], capsys)
    assert f"  - cell {CELL} is incomplete, re-judged from its JUnit files" in err
    assert f"  - cell {CELL} ran no required suite: every suite it ran is not_applicable (00-ok)" in err


def _patch_set(fake: FakeProject) -> None:
    """patches/doc/: one patch that applies to the fake sglang 0.5.9, and its [patches.doc] table."""
    wheel = fake.wheels / "sglang-0.5.9-py3-none-any.whl"
    init = "sglang/__init__.py"
    with zipfile.ZipFile(wheel) as zf:
        before = zf.read(init).decode("utf-8")
    folder = fake.root / "patches" / "doc"
    folder.mkdir(parents=True)
    headers = {"Description": "a test patch", "Origin": "tests", "Forwarded": "no"}
    patch = make_patch(init, before, before + "PATCHED = True\n", headers)
    (folder / "0001-doc.patch").write_text(patch, encoding="utf-8")
    (folder / "series").write_text("0001-doc.patch\n", encoding="utf-8")
    fake.write_matrix(extra='\n[patches.doc]\napplies_to = "sglang>=0.5.9"\n')


def test_a_cell_that_ran_only_the_patch_step_is_refused_though_its_verdict_says_passed(
    fake_project: FakeProject, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fake_project
    _patch_set(fake)
    assert fake.run() == ExitCode.OK, "the rule passes a cell whose one step, 00-patches, passed"
    stored = json.loads((fake.reports / CELL / "verdict.json").read_text())["report"]
    assert [s["suite"] for s in stored["suites"]] == ["00-patches"]
    err = _refused(fake, keys[0], capsys)
    assert f"  - cell {CELL} ran no required suite: only the runner's own 00-patches step" in err


def _forge_a_failed_suite_as_passed(fake: FakeProject, elsewhere: Path) -> Path:
    """A forger's verdict.json: the failed suite's JUnit file beside it removed, its result pointed at a
    passing JUnit file elsewhere (with that file's sha256), the suite and the cell said passed. Each stored
    result agrees with the file it names and with the stored status: only the files beside the verdict
    tell. Returns the JUnit file that was removed."""
    cell_dir = fake.reports / CELL
    elsewhere.mkdir(parents=True)
    passing = elsewhere / "10-bad.xml"
    shutil.copy(cell_dir / "00-ok.xml", passing)
    removed = cell_dir / "10-bad.xml"
    removed.unlink()
    path = cell_dir / "verdict.json"
    data = json.loads(path.read_text())
    report = data["report"]
    good = verdict.read_suite(passing, cell=CELL, suite="10-bad")
    report["status"], report["reason"] = "passed", ""
    for entry in report["suites"]:
        if entry["suite"] == "10-bad":
            entry.update(
                outcome="passed", tests=good.tests, failures=0, errors=0, skipped=0,
                first_failure=None, xml=str(passing), sha256=good.sha256,
            )  # fmt: skip
    path.write_text(json.dumps(data, indent=1))
    return removed


def test_the_status_is_re_judged_from_the_junit_files_beside_the_verdict(
    fake_project: FakeProject, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    fake = _project(fake_project)
    fake.suite("10-bad", "fail", gate=False)
    fake.write_matrix()
    assert fake.run() == ExitCode.CELLS_FAILED
    removed = _forge_a_failed_suite_as_passed(fake, tmp_path / "elsewhere")
    vpath = verdict.path_of(fake.reports, CELL)
    # Read as stored (not through verdict.read, which may re-judge it by itself): the forged result.
    data = json.loads(vpath.read_text())
    cell = cell_run(fake.reports, verdict.from_json(data["report"]), data.get("inputs"))
    assert str(cell.report.status) == "passed"
    assert qualify.run_forgeries(cell, set(), True) == [], "each stored result agrees with the file it names"
    found = qualify.rejudge(vpath, cell)
    assert str(found.status) == "failed"
    assert found.disagreements == (
        f"{removed}: verdict.json says 10-bad passed, its JUnit file says error (10-bad: no JUnit report)",
        f"{vpath}: verdict.json says the cell passed, re-judged from its JUnit files it is failed "
        "(10-bad: 10-bad: no JUnit report)",
    )


def test_qualify_refuses_a_verdict_whose_junit_files_beside_it_say_otherwise(
    fake_project: FakeProject, keys: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _project(fake_project)
    fake.suite("10-bad", "fail", gate=False)
    fake.write_matrix()
    assert fake.run() == ExitCode.CELLS_FAILED
    removed = _forge_a_failed_suite_as_passed(fake, tmp_path / "elsewhere")
    err = _refused(fake, keys[0], capsys)
    # Said by qualify itself, or (where verdict.read re-judges) by the store reading it: the file is named.
    assert removed.name in err


# --------------------------------------------------------------------------- 2. the release is the file's name


def test_a_record_copied_under_another_release_name_fails_verification(
    fake_project: FakeProject, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _project(fake_project)
    private, public = keys
    assert fake.run() == ExitCode.OK
    assert _qualify(fake, private) == ExitCode.OK
    copy = _record(fake, "rel-2.0")
    shutil.copy(_record(fake), copy)
    capsys.readouterr()
    assert _verify(fake, copy, public) == ExitCode.CELLS_FAILED
    out = capsys.readouterr().out
    assert (
        f"REFUSED: the record signs release r1, but its file {copy} names release rel-2.0: "
        "a record copied or renamed under another release name"
    ) in out
    assert "the record holds" not in out
    assert "the record no longer holds: it is not the record of release rel-2.0" in out

    # --release names the release the verifier expects: the signed one and the file's must both be it.
    assert _verify(fake, _record(fake), public, "--release", "r1") == ExitCode.OK
    assert "the record holds" in capsys.readouterr().out
    assert _verify(fake, _record(fake), public, "--release", "rel-2.0") == ExitCode.CELLS_FAILED
    out = capsys.readouterr().out
    assert "REFUSED: the record signs release r1, but --release names rel-2.0" in out
    assert "the record no longer holds: it is not the record of release rel-2.0" in out


def test_a_bad_release_name_to_verify_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["qualify", "--verify", str(tmp_path / "r1.json"), "--release", "../x", "--public-key", "k"]
    assert stackfarm_main(argv) == ExitCode.CONFIG
    assert "not a release name" in capsys.readouterr().err


# --------------------------------------------------------------------------- 3. nothing unsigned beside it


def test_unsigned_fields_beside_the_envelope_fail_verification(
    fake_project: FakeProject, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _project(fake_project)
    private, public = keys
    assert fake.run() == ExitCode.OK
    assert _qualify(fake, private) == ExitCode.OK
    envelope = json.loads(_record(fake).read_text())
    envelope["approver"] = "The Board"
    envelope["status"] = "passed"
    _record(fake).write_text(json.dumps(envelope))
    capsys.readouterr()
    assert _verify(fake, _record(fake), public) == ExitCode.CELLS_FAILED
    out = capsys.readouterr().out
    assert "signature ok" in out, "the signed part is intact"
    assert (
        "REFUSED: unsigned field(s) beside the signed envelope: approver, status "
        "(a record holds only payloadType, payload and signatures; nothing else is vouched for)"
    ) in out
    assert "the record no longer holds: it carries unsigned fields" in out


# --------------------------------------------------------------------------- 4. a private key kept private


@pytest.mark.skipif(os.name == "nt", reason="no POSIX modes")
@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o644, 0o666], ids=oct)
def test_a_private_key_group_or_others_can_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    private, _, _ = attest.generate(tmp_path / "keys")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600, "keygen writes 0600"
    assert attest.load_signing_key(private).key_id
    private.chmod(mode)
    with pytest.raises(ConfigError) as info:
        attest.load_signing_key(private)
    text = str(info.value)
    assert f"{private}: the private key is accessible by group or others (mode 0{mode:o})" in text
    assert f"fix: chmod 600 {private}" in text
    private.chmod(0o400)  # read-only for its owner is private as well
    assert attest.load_signing_key(private).key_id


@pytest.mark.skipif(os.name == "nt", reason="no POSIX modes")
def test_qualify_with_an_exposed_key_exits_2_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    private, _, _ = attest.generate(tmp_path / "keys")
    private.chmod(0o644)
    monkeypatch.setenv(attest.SIGNING_KEY_ENV, str(private))
    argv = ["qualify", "--cell", CELL, "--release", "r1", "--approver", "Ana", "--reports", str(tmp_path)]
    assert stackfarm_main(argv) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "accessible by group or others (mode 0644)" in err
    assert f"chmod 600 {private}" in err


def test_where_files_have_no_modes_the_check_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private, _, key_id = attest.generate(tmp_path / "keys")
    private.chmod(0o644)  # what a mode-less file system reports
    monkeypatch.setattr(attest, "_has_modes", lambda: False)
    assert attest.load_signing_key(private).key_id == key_id
