"""Tests for stackfarm.lazyzip: range reads of zip members from a server on 127.0.0.1 (and real PyPI, marked
integration), checked against zipfile reading the whole archive."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from rangeserver import Files, files
from stackfarm import lazyzip
from stackfarm.errors import ArtifactError

__all__ = ["files"]  # the fixture


def _archive(
    members: dict[str, bytes], *, zip64: bool = False, stored: frozenset[str] = frozenset()
) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_STORED if name in stored else zipfile.ZIP_DEFLATED
            info.external_attr = 0o100755 << 16
            with zf.open(info, "w", force_zip64=zip64) as out:
                out.write(data)
    return buf.getvalue()


def _members(count: int = 40) -> dict[str, bytes]:
    import random

    rnd = random.Random(7)
    return {f"pkg/m{i:03d}.bin": rnd.randbytes(rnd.randrange(10, 40_000)) for i in range(count)}


@pytest.mark.parametrize("zip64", [False, True])
def test_members_read_by_ranges_equal_zipfile(files: Files, zip64: bool) -> None:
    members = _members()
    blob = _archive(members, zip64=zip64, stored=frozenset({"pkg/m003.bin"}))
    files.blobs["a.whl"] = blob
    remote = lazyzip.RemoteZip(f"{files.base}/a.whl", len(blob))
    assert set(remote.members) == set(members)
    assert remote.members["pkg/m001.bin"].mode == 0o755
    got = remote.read_many(["pkg/m001.bin", "pkg/m002.bin", "pkg/m003.bin", "pkg/m030.bin"])
    assert got == {n: members[n] for n in got}
    assert all(files.ranges)  # only range requests


def test_neighbours_share_one_request_and_far_members_do_not(
    files: Files, monkeypatch: pytest.MonkeyPatch
) -> None:
    members = _members(60)
    files.blobs["a.whl"] = _archive(members)
    remote = lazyzip.RemoteZip(f"{files.base}/a.whl")
    before = remote.requests
    remote.read_many(list(members))
    assert remote.requests - before == 1  # ~1.2 MB in one range
    monkeypatch.setattr(lazyzip, "MERGE_GAP", 0)
    before = remote.requests
    remote.read_many(["pkg/m000.bin", "pkg/m059.bin"])
    assert remote.requests - before == 2


def test_stream_inflates_a_member_into_a_file(files: Files, tmp_path: Path) -> None:
    big = bytes(range(256)) * 40_000 + b"tail"
    files.blobs["a.whl"] = _archive({"lib.so": big, "x.py": b"x"})
    remote = lazyzip.RemoteZip(f"{files.base}/a.whl")
    with open(tmp_path / "lib.so", "wb") as out:
        assert remote.stream("lib.so", out) == len(big)
    assert (tmp_path / "lib.so").read_bytes() == big


def test_a_damaged_member_is_refused(files: Files) -> None:
    blob = bytearray(_archive({"a.txt": b"hello world " * 100, "b.txt": b"b"}, stored=frozenset({"a.txt"})))
    at = bytes(blob).index(b"hello world")
    blob[at] = ord("J")
    files.blobs["a.whl"] = bytes(blob)
    remote = lazyzip.RemoteZip(f"{files.base}/a.whl")
    with pytest.raises(ArtifactError, match=r"a\.txt: CRC-32"):
        remote.read("a.txt")


def test_no_ranges_no_zip_and_unknown_member(files: Files) -> None:
    files.blobs["a.whl"] = _archive({"a": b"a"})
    files.no_ranges = True
    with pytest.raises(lazyzip.NoRanges):
        lazyzip.RemoteZip(f"{files.base}/a.whl")
    files.no_ranges = False
    files.blobs["b.whl"] = b"not a zip at all"
    with pytest.raises(ArtifactError, match="not a wheel"):
        lazyzip.RemoteZip(f"{files.base}/b.whl")
    with pytest.raises(ArtifactError, match="no member 'zzz'"):
        lazyzip.RemoteZip(f"{files.base}/a.whl").read("zzz")


@pytest.mark.integration
def test_real_torch_wheel_metadata_costs_a_megabyte() -> None:
    from stackfarm.artifacts import Source, Target, find_artifact

    art = find_artifact(
        Source(name="pypi", url="https://pypi.org/simple"),
        "torch",
        "2.9.1",
        Target(python="3.11", platform="manylinux_2_39_x86_64"),
    )
    remote = lazyzip.RemoteZip(art.url, art.size)
    meta = remote.read(next(n for n in remote.members if n.endswith(".dist-info/METADATA")))
    assert b"Name: torch" in meta
    assert remote.fetched < 4 << 20  # of a ~900 MB wheel
