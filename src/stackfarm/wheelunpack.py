"""Unpack a wheel into a cache tree the way an installer lays it out (the ``installer`` package, PyPA's).

A tree's root is the wheel's site-packages: the archive root and ``<name>.data/purelib|platlib`` merged into it.
The other install schemes land where a real install puts them relative to its prefix, with the prefix inside the
tree at ``PREFIX``: ``.data/scripts`` in ``<PREFIX>/bin`` (entry points get launchers there too),
``.data/headers`` in ``<PREFIX>/include/site/python<X.Y>/<name>``, ``.data/data`` in ``<PREFIX>`` itself. The
RECORD in the tree is the installed one (paths relative to the root, as pip writes it).

RECORD is respected: every member is hashed while it is written and checked against the wheel's RECORD entry;
a member whose size or sha256 differs refuses the whole wheel (the tree is never made). Paths that would leave
the tree are refused before anything is written. A hand-made archive without ``WHEEL`` or ``RECORD`` (not a wheel
by the spec; test fixtures) is unpacked member by member, as a plain zip.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.exceptions import InstallerError
from installer.records import RecordEntry
from installer.sources import WheelContentElement, WheelFile
from installer.utils import Scheme

from stackfarm.errors import ArtifactError
from stackfarm.files import sha256_file

#: The install prefix inside a tree (bin/, include/, data files); the tree's root is its site-packages.
PREFIX = ".stackfarm-prefix"
_CHUNK = 1 << 20
Manifest = dict[str, tuple[int, str]]


class _Hashing:
    """A read stream that hashes what passes through it (with the algorithm its RECORD entry names)."""

    def __init__(self, stream: BinaryIO, algorithm: str) -> None:
        self.stream = stream
        self.algorithm = algorithm
        self.digest = hashlib.new(algorithm)
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        return self._seen(self.stream.read(n))

    def readline(self, n: int = -1) -> bytes:
        return self._seen(self.stream.readline(n))

    def seek(self, offset: int, whence: int = 0) -> int:
        if (offset, whence) != (0, 0):
            raise ValueError("only a rewind to the start is supported")
        self.digest, self.size = hashlib.new(self.algorithm), 0  # read again from the start: hashed again
        return int(self.stream.seek(0))

    def _seen(self, data: bytes) -> bytes:
        self.digest.update(data)
        self.size += len(data)
        return data

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


class _Checked(WheelFile):
    """The wheel's members, each checked against its RECORD entry once the destination has read it."""

    bad: list[str]

    def get_contents(self) -> Iterator[WheelContentElement]:
        self.bad = []
        for (path, hash_text, size_text), stream, executable in super().get_contents():
            entry = RecordEntry.from_elements(path, hash_text, size_text)
            hashing = _Hashing(stream, self._algorithm(entry))
            yield (path, hash_text, size_text), hashing, executable  # type: ignore[misc]
            while hashing.read(_CHUNK):  # a member the installer skipped is still checked
                pass
            if not _matches(entry, hashing):
                self.bad.append(path)

    def _algorithm(self, entry: RecordEntry) -> str:
        """The hash to check the member with: its RECORD's, sha256 in place of a weak one (which is `bad`)."""
        algorithm = entry.hash_.name if entry.hash_ is not None else "sha256"
        if algorithm not in hashlib.algorithms_guaranteed or algorithm in ("md5", "sha1"):
            self.bad.append(f"{entry.path} (RECORD hashes it with {algorithm}, not sha256 or stronger)")
            return "sha256"
        return algorithm


def _matches(entry: RecordEntry, hashing: _Hashing) -> bool:
    """The member as read has its RECORD entry's hash and size."""
    if entry.path.endswith(".dist-info/RECORD") or entry.hash_ is None:
        return True  # RECORD itself, and the signature files, are listed without a hash
    ok = base64.urlsafe_b64encode(hashing.digest.digest()).rstrip(b"=").decode() == entry.hash_.value
    return ok and (entry.size is None or entry.size == hashing.size)


class _Destination(SchemeDictionaryDestination):
    """Writes into the tree and keeps the manifest (size, sha256 hex) of every file, by path from the root."""

    manifest: Manifest
    root: Path

    def write_to_fs(self, scheme: Scheme, path: str, stream: BinaryIO, is_executable: bool) -> RecordEntry:
        entry = super().write_to_fs(scheme, path, stream, is_executable)
        target = Path(self.scheme_dict[scheme]) / path
        digest = base64.urlsafe_b64decode(entry.hash_.value + "==").hex() if entry.hash_ else ""
        self.manifest[target.relative_to(self.root).as_posix()] = (entry.size or 0, digest)
        return entry


def _unsafe(names: list[str], filename: str) -> None:
    for name in names:
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts:
            raise ArtifactError(f"{filename} holds an unsafe path {name!r}; not unpacking it")


def _plain(zf: zipfile.ZipFile, dest: Path) -> Manifest:
    files: Manifest = {}
    for info in zf.infolist():
        target = dest.joinpath(*PurePosixPath(info.filename).parts)
        if info.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        with zf.open(info) as src, open(target, "wb") as out:
            while chunk := src.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        files[PurePosixPath(info.filename).as_posix()] = (size, digest.hexdigest())
        mode = (info.external_attr >> 16) & 0o777
        target.chmod((mode | 0o600) if mode else 0o644)
    return files


def _dist_info(names: list[str]) -> str | None:
    """The wheel's one ``.dist-info`` folder when it has exactly one, with WHEEL and RECORD (else it is
    unpacked as a plain zip)."""
    infos = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    has = {n.split("/", 1)[1] for n in names if n.split("/")[0] in infos and "/" in n}
    if len(infos) != 1 or not {"WHEEL", "RECORD"} <= has:
        return None
    return next(iter(infos))


def _schemes(dest: Path, info: str) -> dict[str, str]:
    """Where each install scheme of the wheel goes: the libraries at the root, the rest under PREFIX."""
    python = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    dist = info.split("-", maxsplit=1)[0]
    prefix = dest / PREFIX
    return {
        "purelib": str(dest),
        "platlib": str(dest),
        "scripts": str(prefix / "bin"),
        "headers": str(prefix / "include" / "site" / python / dist),
        "data": str(prefix),
    }


def _damaged(filename: str, bad: list[str]) -> ArtifactError:
    shown = ", ".join(bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else "")
    return ArtifactError(
        f"{filename}: {len(bad)} members differ from its RECORD ({shown}); not unpacking it\n"
        "  fix: the wheel is damaged or was altered: fetch it again (stackfarm cache verify --repair)"
    )


def extract_wheel(blob: Path, dest: Path, filename: str) -> Manifest:
    """Unpack the wheel ``blob`` into the empty folder ``dest``; returns the manifest of every file written."""
    with zipfile.ZipFile(blob) as zf:
        names = zf.namelist()
        _unsafe(names, filename)
        info = _dist_info(names)
        if info is None:
            return _plain(zf, dest)
    target = _Destination(_schemes(dest, info), interpreter=sys.executable, script_kind="posix")
    target.manifest, target.root = {}, dest
    try:
        with zipfile.ZipFile(blob) as zf:
            zf.filename = filename  # the blob is named by its hash; installer reads the name from the wheel's
            source = _Checked(zf)
            with warnings.catch_warnings():
                warnings.simplefilter(
                    "ignore", RuntimeWarning
                )  # __pycache__ members are skipped, as pip does
                install(source, target, additional_metadata={})
    except (InstallerError, ValueError, FileExistsError, KeyError) as exc:
        # ValueError: a path outside its scheme; FileExistsError: a member listed twice; KeyError: no RECORD.
        raise ArtifactError(f"{filename} is not a valid wheel: {exc}") from exc
    if source.bad:
        raise _damaged(filename, source.bad)
    record = next(dest.glob("*.dist-info/RECORD"))
    target.manifest[record.relative_to(dest).as_posix()] = (record.stat().st_size, sha256_file(record))
    return target.manifest


__all__ = ["PREFIX", "extract_wheel"]
