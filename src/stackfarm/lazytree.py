"""Lazy trees: a remote wheel's files that the static suites read, fetched with range requests, nothing else.

Measured on one cell (cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9, strace of each suite): 05-import reads the
ELF headers, dynamic sections and symbol tables of the native libraries, 10-capability their section headers
and fatbin headers (and every cubin's ELF headers), both read Python sources and the dist-info; 00-stack
hashes every file against RECORD. So a lazy tree holds:

- the dist-info and Python sources (``*.py``), whole;
- every native library and cubin as a *sparse copy*: a file of the real size holding only the byte ranges the
  readers (stackfarm.analysis.elfsyms, stackfarm.analysis.fatbin) read, recorded while they read the whole
  member once; the rest is a hole (no disk blocks). The readers make the same reads on the copy, so they give
  the same answers (tests compare both on real wheels);
- nothing else (headers, data files): absent.

A deflate stream cannot be entered in the middle, and the readers need each ELF's section headers, which lie at
its end (in torch's patchelf'd libraries the ``.dynstr`` and ``.dynamic`` too): so every library member is
downloaded and inflated whole, once, streamed through a temporary file, its sha256 checked against the wheel's
RECORD. The saving is in what is not a library and in the disk: a lazy tree of torch 2.9.1 takes megabytes
where its unpacked tree takes 1.7 GB. Members whose bytes are all read (sources, dist-info) are checked against
RECORD too. The marker ``LAZY_MARKER`` holds the manifest: every file with the size and sha256 of the whole
member (checked), which files are sparse, and the bytes fetched.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from stackfarm import lazyzip
from stackfarm.analysis import elfsyms, fatbin
from stackfarm.cachekeep import make_read_only, remove_tree
from stackfarm.errors import ArtifactError, StackfarmError

#: The suites a lazy tree serves: they read sources, metadata and ELF/fatbin headers, and import nothing of the
#: stack (30-numerics runs its CPU engine, 40-throughput a server: both need full trees).
STATIC_SUITES = ("00-stack", "05-import", "10-capability", "20-eagle3")
#: The marker of a complete lazy tree (its manifest).
LAZY_MARKER = ".stackfarm-lazy"
#: Library members up to this size are read in memory (neighbours share a request); larger ones are streamed.
IN_MEMORY = 16 << 20


class Recording:
    """A read-only file that records the byte ranges read from it."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.ranges: list[tuple[int, int]] = []

    def read(self, n: int = -1) -> bytes:
        at = self.fh.tell()
        data = self.fh.read(n)
        if data:
            self.ranges.append((at, at + len(data)))
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.fh.seek(offset, whence)

    def tell(self) -> int:
        return self.fh.tell()

    def fileno(self) -> int:
        return self.fh.fileno()


def merged(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def reader_ranges(fh: BinaryIO, name: str, size: int) -> list[tuple[int, int]]:
    """The byte ranges the ELF and fatbin readers read of the file open in ``fh`` (errors included: a file
    they refuse is refused the same way from its copy)."""
    rec = Recording(fh)
    path = Path(name)
    rec.seek(0)
    with contextlib.suppress(StackfarmError, fatbin.FatbinError, ValueError):
        if elfsyms.looks_like_library(name):
            elfsyms.read_from(rec, path)  # type: ignore[arg-type]
    rec.seek(0)
    with contextlib.suppress(fatbin.FatbinError, StackfarmError, ValueError):
        fatbin.read_binary_from(rec, path, size)  # type: ignore[arg-type]
    return merged(rec.ranges)


def sparse_copy(src: BinaryIO, dest: Path, size: int, ranges: Iterable[tuple[int, int]]) -> int:
    """Write ``dest`` of ``size`` bytes holding ``ranges`` of ``src`` and holes elsewhere; returns bytes kept."""
    kept = 0
    with open(dest, "wb") as out:
        out.truncate(size)
        for start, end in ranges:
            src.seek(start)
            out.seek(start)
            out.write(src.read(end - start))
            kept += end - start
    return kept


def wanted(name: str) -> str | None:
    """What a lazy tree keeps of a member: "whole", "sparse" (a library or cubin) or None (left out)."""
    parts = PurePosixPath(name).parts
    if parts and parts[0].endswith(".dist-info"):
        return "whole"
    if name.endswith(".py"):
        return "whole"
    if elfsyms.looks_like_library(name) or name.endswith(".cubin"):
        return "sparse"
    return None


@dataclass
class Built:
    """What building one lazy tree cost."""

    fetched: int = 0
    requests: int = 0
    members: int = 0
    whole: int = 0
    sparse: int = 0
    kept: int = 0  # bytes written into sparse copies
    files: dict[str, list[object]] = field(default_factory=dict)


def _record(raw: bytes) -> dict[str, tuple[str, int]]:
    """RECORD rows with a sha256: path -> (hex digest, size)."""
    out = {}
    for row in csv.reader(io.StringIO(raw.decode("utf-8", "replace"))):
        if len(row) >= 3 and row[1].startswith("sha256="):
            digest = base64.urlsafe_b64decode(row[1][7:] + "==").hex()
            out[row[0]] = (digest, int(row[2]) if row[2].isdigit() else -1)
    return out


def _checked(name: str, digest: str, size: int, record: dict[str, tuple[str, int]], url: str) -> None:
    want = record.get(name)
    if want is None:
        raise ArtifactError(f"{url}: {name} is not in the wheel's RECORD: refusing a lazy tree of it")
    if want[0] != digest or want[1] not in (-1, size):
        raise ArtifactError(
            f"{url}: {name} differs from the wheel's RECORD (sha256 {digest}, RECORD {want[0]})"
        )


def build(
    remote: lazyzip.RemoteZip,
    dest: Path,
    *,
    keep: Callable[[str], str | None] = wanted,
    scratch: Path | None = None,
) -> Built:
    """Fill the empty folder ``dest`` with the lazy tree of the wheel ``remote``; returns its figures."""
    info = [n for n in remote.members if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if len(info) != 1:
        raise ArtifactError(f"{remote.url}: {len(info)} dist-info/RECORD files, not 1")
    plan = {n: keep(n) for n in remote.members}
    whole = [n for n, k in plan.items() if k == "whole"]
    small = [n for n, k in plan.items() if k == "sparse" and remote.members[n].size <= IN_MEMORY]
    large = [n for n, k in plan.items() if k == "sparse" and remote.members[n].size > IN_MEMORY]
    record = _record(remote.read(info[0]))
    built = Built(members=len(remote.members))
    wholes = set(whole)
    for batch in _batches([*whole, *small], remote):  # in archive order, a batch at a time in memory
        for name, data in remote.read_many(batch).items():
            if name not in wholes:
                _sparse(dest, name, io.BytesIO(data), remote=remote, record=record, built=built)
                continue
            digest = hashlib.sha256(data).hexdigest()
            if not name.endswith("/RECORD"):
                _checked(name, digest, len(data), record, remote.url)
            _write(dest, name, data, remote.members[name].mode)
            built.files[name] = [len(data), digest, "whole"]
            built.whole += 1
    for name in large:
        with tempfile.TemporaryFile(dir=scratch) as tmp:
            remote.stream(name, tmp)
            _sparse(dest, name, tmp, remote=remote, record=record, built=built)
    built.fetched, built.requests = remote.fetched, remote.requests
    return built


def _batches(names: list[str], remote: lazyzip.RemoteZip) -> Iterable[list[str]]:
    batch: list[str] = []
    total = 0
    for name in sorted(names, key=lambda n: remote.members[n].header):
        batch.append(name)
        total += remote.members[name].size
        if total >= lazyzip.MAX_RANGE:
            yield batch
            batch, total = [], 0
    if batch:
        yield batch


def _sparse(
    dest: Path,
    name: str,
    fh: BinaryIO,
    *,
    remote: lazyzip.RemoteZip,
    record: dict[str, tuple[str, int]],
    built: Built,
) -> None:
    size = remote.members[name].size
    fh.seek(0)
    digest = hashlib.sha256()
    while chunk := fh.read(1 << 20):
        digest.update(chunk)
    _checked(name, digest.hexdigest(), size, record, remote.url)
    ranges = reader_ranges(fh, name, size)
    target = dest.joinpath(*PurePosixPath(name).parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    built.kept += sparse_copy(fh, target, size, ranges)
    target.chmod(_mode(remote.members[name].mode))
    built.files[name] = [size, digest.hexdigest(), "sparse"]
    built.sparse += 1


def _mode(mode: int) -> int:
    return 0o555 if mode & 0o111 else 0o444


def _write(dest: Path, name: str, data: bytes, mode: int) -> None:
    target = dest.joinpath(*PurePosixPath(name).parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    target.chmod(_mode(mode))


def lazy_tree(
    root: Path, sha256: str, url: str, size: int | None, filename: str, **kw: object
) -> tuple[Path, Built | None]:
    """The lazy tree of a wheel in ``root/lazy/<sha256>`` (built once, atomically); Built when made now."""
    final = root / "lazy" / sha256
    if (final / LAZY_MARKER).is_file():
        return final, None
    tmp = root / "tmp" / f"{sha256}.lazy-{os.getpid()}"
    remove_tree(tmp)  # a crashed run's leftover is read-only: cachekeep removes it as it removes trees
    tmp.mkdir(parents=True)
    try:
        remote = lazyzip.RemoteZip(url, size, **kw)  # type: ignore[arg-type]
        built = build(remote, tmp, scratch=root / "tmp")
        manifest = {
            "filename": filename,
            "fetched": built.fetched,
            "files": built.files,
            # Every member's size, from the central directory: 00-stack checks the rows it did not fetch
            # against these (a RECORD row the wheel lacks, or of another size, fails as on a full tree).
            "members": {name: m.size for name, m in remote.members.items()},
        }
        (tmp / LAZY_MARKER).write_text(json.dumps(manifest, sort_keys=True) + "\n", encoding="utf-8")
        make_read_only(tmp, top=False)
        remove_tree(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp.replace(final)
    except BaseException:
        remove_tree(tmp)
        raise
    return final, built


__all__ = [
    "LAZY_MARKER",
    "STATIC_SUITES",
    "Built",
    "Recording",
    "build",
    "lazy_tree",
    "merged",
    "reader_ranges",
    "sparse_copy",
    "wanted",
]
