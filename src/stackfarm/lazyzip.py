"""Read members of a remote wheel with HTTP range requests: the zip's central directory, then only the members
asked for, without downloading the rest of the archive.

A request costs one round trip, so ``read_many`` reads neighbouring members in one range (gaps up to
``MERGE_GAP`` are fetched and dropped). A deflated member cannot be entered in the middle: its bytes are inflated
from the start, so reading any part of it costs its compressed bytes up to that part (``stream`` inflates a large
one into a file, chunk by chunk, never whole in memory).

What is read is checked: each member's CRC-32 and size against the central directory, and the archive's size (the
server's ``Content-Range`` total) against the size the index listed. These are not the wheel's sha256 (only all
of its bytes hash to that); callers that need more check a member against the wheel's RECORD sha256.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

from stackfarm import httpclient, indexauth, proc
from stackfarm.errors import ArtifactError

#: Members closer than this (bytes) are read in one request, the gap fetched and dropped.
MERGE_GAP = 1 << 18
#: One request reads at most this many bytes (a group of members is held in memory once).
MAX_RANGE = 64 << 20
_TAIL = 1 << 16  # the end of the archive read first: EOCD (22 bytes + a comment up to 64 KiB)
_CHUNK = 1 << 20
_EOCD, _EOCD64, _LOCATOR64 = b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07"
_CENTRAL, _LOCAL = b"PK\x01\x02", b"PK\x03\x04"
_STORED, _DEFLATED = 0, 8
_USER_AGENT = "stackfarm/0.1"
_T = TypeVar("_T")
Retrying = Callable[[str, Callable[[float], _T]], _T]


class NoRanges(ArtifactError):
    """The server does not answer range requests: the caller downloads the whole file instead."""


@dataclass(frozen=True)
class Member:
    """One file in the archive, as its central directory describes it."""

    name: str
    method: int
    crc: int
    compressed: int
    size: int
    header: int  # offset of its local header
    mode: int  # unix permission bits (0 when the zip has none)


#: Without a caller's client: one attempt through stackfarm.httpclient (credentials, the budget), no retry.
_ONCE = httpclient.Client(role="server", hint="check the URL", delays=(), sleep=time.sleep)


class RemoteZip:
    """A zip archive at ``url``; ``size`` is the size the index listed (checked against the server's)."""

    def __init__(self, url: str, size: int | None = None, *, retrying: Retrying[bytes] | None = None) -> None:
        self.url = url
        self.size = size
        self.fetched = 0  # bytes received, all requests together
        self.requests = 0
        self._retrying: Retrying[bytes] = retrying or _ONCE.call
        self.members = self._directory()

    # ----------------------------------------------------------------- HTTP

    def _get(self, start: int, end: int) -> bytes:
        """Bytes ``start`` .. ``end`` - 1 of the archive (``start`` < 0: the last -start bytes)."""
        spec = f"bytes={start}" if start < 0 else f"bytes={start}-{end - 1}"  # "bytes=-N": the last N

        def once(timeout: float) -> bytes:
            headers = {"Range": spec, "User-Agent": _USER_AGENT}
            with httpclient.send(self.url, headers, timeout=timeout) as resp:
                if resp.status != 206:
                    raise NoRanges(
                        f"{indexauth.redact(self.url)} ignores range requests (HTTP {resp.status})"
                    )
                total = str(resp.headers.get("Content-Range", "")).rpartition("/")[2]
                body: bytes = resp.read()
            if total.isdigit():
                if self.size is not None and int(total) != self.size:
                    raise ArtifactError(
                        f"{indexauth.redact(self.url)} is {total} bytes, the index listed {self.size}: "
                        "not the file the index described (a re-upload, or a broken mirror)"
                    )
                self.size = int(total)
            return body

        body = self._retrying(self.url, once)
        self.requests += 1
        self.fetched += len(body)
        want = -start if start < 0 else end - start
        if len(body) < min(want, self.size or want):
            raise ArtifactError(f"{indexauth.redact(self.url)}: a range answer was cut short")
        return body

    # ----------------------------------------------------------------- the central directory

    def _directory(self) -> dict[str, Member]:
        tail = self._get(-_TAIL, 0)
        at = tail.rfind(_EOCD)
        if at < 0 or len(tail) - at < 22:
            raise ArtifactError(f"{indexauth.redact(self.url)}: no zip end-of-directory record: not a wheel")
        count, cd_size, cd_offset = struct.unpack_from("<HII", tail, at + 10)
        if 0xFFFFFFFF in (cd_size, cd_offset) or count == 0xFFFF:
            loc = tail.rfind(_LOCATOR64, 0, at)
            if loc < 0:
                raise ArtifactError(f"{indexauth.redact(self.url)}: a Zip64 archive without its locator")
            (eocd64,) = struct.unpack_from("<Q", tail, loc + 8)
            record = self._get(eocd64, eocd64 + 56)
            if record[:4] != _EOCD64:
                raise ArtifactError(f"{indexauth.redact(self.url)}: a damaged Zip64 end-of-directory record")
            count, cd_size, cd_offset = struct.unpack_from("<QQQ", record, 32)
        assert self.size is not None  # set by the first answer
        tail_start = self.size - len(tail)
        if cd_offset >= tail_start:
            data = tail[cd_offset - tail_start : cd_offset - tail_start + cd_size]
        else:
            data = self._get(cd_offset, cd_offset + cd_size)
        return _parse_directory(data, count, self.url)

    # ----------------------------------------------------------------- members

    def _data_start(self, member: Member, blob: bytes, blob_start: int) -> int:
        """The offset of ``member``'s data (after its local header), read from ``blob`` where it holds it."""
        rel = member.header - blob_start
        head = blob[rel : rel + 30] if rel >= 0 else b""
        if len(head) < 30:
            head = self._get(member.header, member.header + 30)
        if head[:4] != _LOCAL:
            raise ArtifactError(f"{indexauth.redact(self.url)}: {member.name}: no local header where listed")
        name_len, extra_len = struct.unpack_from("<HH", head, 26)
        return int(member.header + 30 + name_len + extra_len)

    def read_many(self, names: Iterable[str]) -> dict[str, bytes]:
        """The named members, whole and checked, reading neighbours in one request each."""
        wanted = sorted((self._member(n) for n in set(names)), key=lambda m: m.header)
        out: dict[str, bytes] = {}
        for group in _groups(wanted):
            start = group[0].header
            # Local headers repeat the name and may carry more extra bytes than the central directory: slack.
            end = min(
                group[-1].header + 30 + len(group[-1].name.encode()) + 1024 + group[-1].compressed,
                self.size or 0,
            )
            blob = self._get(start, end)
            for m in group:
                data_at = self._data_start(m, blob, start) - start
                raw = blob[data_at : data_at + m.compressed]
                if len(raw) < m.compressed:  # a local extra field beyond the slack: ask for exactly it
                    raw = self._get(start + data_at, start + data_at + m.compressed)
                out[m.name] = _inflate(m, raw, self.url)
        return out

    def read(self, name: str) -> bytes:
        return self.read_many([name])[name]

    def stream(self, name: str, out: BinaryIO) -> int:
        """Inflate one member into ``out`` chunk by chunk (checked at the end); returns its size."""
        m = self._member(name)
        start = self._data_start(m, b"", 0)
        crc, size = 0, 0
        for data in _inflated(m, self._chunks(start, start + m.compressed), self.url):
            out.write(data)
            crc, size = zlib.crc32(data, crc), size + len(data)
        if crc != m.crc or size != m.size:
            raise ArtifactError(
                f"{indexauth.redact(self.url)}: {name}: CRC-32 or size differs from the archive's"
            )
        return size

    def _chunks(self, start: int, end: int) -> Iterator[bytes]:
        """The bytes start .. end in 8 MiB ranges, the next one fetched (by a thread) while this one is used:
        the network and the inflating overlap (urllib, zlib and hashlib release the GIL)."""
        spans = [(at, min(end, at + 8 * _CHUNK)) for at in range(start, end, 8 * _CHUNK)]
        with ThreadPoolExecutor(max_workers=1) as pool:
            ahead: Future[bytes] | None = pool.submit(self._get, *spans[0]) if spans else None
            for i in range(len(spans)):
                assert ahead is not None
                data = ahead.result()
                if proc.STOP.is_set():  # Ctrl-C / SIGTERM: stop within a chunk
                    raise proc.Stopped(
                        f"range reads of {indexauth.redact(self.url)} stopped: the run is stopping"
                    )
                ahead = pool.submit(self._get, *spans[i + 1]) if i + 1 < len(spans) else None
                yield data

    def _member(self, name: str) -> Member:
        try:
            return self.members[name]
        except KeyError:
            raise ArtifactError(f"{indexauth.redact(self.url)} has no member {name!r}") from None


def _parse_directory(data: bytes, count: int, url: str) -> dict[str, Member]:
    members: dict[str, Member] = {}
    at = 0
    for _ in range(count):
        if data[at : at + 4] != _CENTRAL:
            raise ArtifactError(
                f"{indexauth.redact(url)}: a damaged central directory (entry {len(members)})"
            )
        (method, crc, csize, usize, nlen, xlen, clen, attr, offset) = struct.unpack_from(
            "<10xH4xIIIHHH4xII", data, at
        )
        name = data[at + 46 : at + 46 + nlen].decode("utf-8", "replace")
        extra = data[at + 46 + nlen : at + 46 + nlen + xlen]
        usize, csize, offset = _zip64(extra, usize, csize, offset)
        if not name.endswith("/"):
            members[name] = Member(name, method, crc, csize, usize, offset, (attr >> 16) & 0o777)
        at += 46 + nlen + xlen + clen
    return members


def _zip64(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    """Sizes and offset from a Zip64 extra field (0x0001), for the ones the fixed fields mark 0xFFFFFFFF."""
    at = 0
    while at + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, at)
        if tag == 1:
            values = list(struct.unpack_from(f"<{length // 8}Q", extra, at + 4))
            if usize == 0xFFFFFFFF and values:
                usize = values.pop(0)
            if csize == 0xFFFFFFFF and values:
                csize = values.pop(0)
            if offset == 0xFFFFFFFF and values:
                offset = values.pop(0)
        at += 4 + length
    return usize, csize, offset


def _groups(members: list[Member]) -> Iterator[list[Member]]:
    group: list[Member] = []
    for m in members:
        gap = m.header - (group[-1].header + group[-1].compressed + 1024) if group else 0
        if group and (gap > MERGE_GAP or m.header + m.compressed - group[0].header > MAX_RANGE):
            yield group
            group = []
        group.append(m)
    if group:
        yield group


def _inflated(member: Member, chunks: Iterable[bytes], url: str) -> Iterator[bytes]:
    if member.method == _STORED:
        yield from chunks
        return
    if member.method != _DEFLATED:
        raise ArtifactError(
            f"{indexauth.redact(url)}: {member.name}: compression method {member.method} unsupported"
        )
    inflate = zlib.decompressobj(-15)
    for chunk in chunks:
        yield inflate.decompress(chunk)
    yield inflate.flush()


def _inflate(member: Member, raw: bytes, url: str) -> bytes:
    data = b"".join(_inflated(member, [raw], url))
    if zlib.crc32(data) != member.crc or len(data) != member.size:
        raise ArtifactError(
            f"{indexauth.redact(url)}: {member.name}: CRC-32 or size differs from the archive's"
        )
    return data


__all__ = ["MAX_RANGE", "MERGE_GAP", "Member", "NoRanges", "RemoteZip"]
