"""Tests for stackfarm.lazybench's measuring helpers (the figures themselves come from `nox -s bench`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from stackfarm import lazybench


def test_testcases_reads_outcomes_and_messages(tmp_path: Path) -> None:
    junit = tmp_path / "s.xml"
    junit.write_text(
        '<testsuites><testsuite name="s">'
        '<testcase classname="suites.s.test_x" name="test_a"/>'
        '<testcase classname="suites.s.test_x" name="test_b"><failure message="boom">x</failure></testcase>'
        '<testcase classname="test_x" name="test_c"><skipped message="needs GPU"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert lazybench.testcases(junit) == {
        "test_x::test_a": "passed",
        "test_x::test_b": "failure: boom",
        "test_x::test_c": "skipped: needs GPU",
    }


def test_fetched_and_disk_bytes(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "blobs" / "sha256").mkdir(parents=True)
    (cache / "blobs" / "sha256" / "a.whl").write_bytes(b"x" * 1000)
    (cache / "metadata").mkdir()
    (cache / "metadata" / "a.zip.METADATA").write_bytes(b"y" * 10)
    (cache / "lazy" / "b").mkdir(parents=True)
    (cache / "lazy" / "b" / ".stackfarm-lazy").write_text(json.dumps({"fetched": 5000, "files": {}}))
    assert lazybench.fetched_bytes(cache) == 6010
    big = tmp_path / "disk" / "big"
    big.parent.mkdir()
    big.write_bytes(os.urandom(1 << 16))
    os.link(big, tmp_path / "disk" / "link")  # one file, counted once
    with open(tmp_path / "disk" / "sparse", "wb") as fh:
        fh.truncate(1 << 30)  # a hole: no blocks
    assert (1 << 16) <= lazybench.disk_bytes(tmp_path / "disk") < (1 << 16) + (1 << 20)
