"""The dynamic-linking facts of an ELF shared object, read from its headers without loading the whole file.

For one ``.so``: DT_NEEDED, DT_SONAME, DT_RPATH / DT_RUNPATH, the GNU build-id, the undefined dynamic symbols
(each with the version it asks for from ``.gnu.version_r``, e.g. ``GLIBCXX_3.4.30`` of ``libstdc++.so.6``, and
whether it is weak) and the defined exported ones (with their versions from ``.gnu.version_d``). Only the section
headers, ``.dynamic``, ``.dynsym``, ``.dynstr``, the version sections and the notes are read: a 1 GB
``libtorch_cuda.so`` costs a few reads of its symbol tables (tens of MB), never its code.

Layouts (the System V gABI and the GNU symbol-versioning extension, as ``readelf -V`` prints them):

- ``.dynsym`` entries: ``st_name u32, st_info u8, st_other u8, st_shndx u16, st_value, st_size`` (ELF64 order);
  ``st_shndx == 0`` is undefined; binding ``st_info >> 4`` (1 global, 2 weak, 10 GNU unique);
- ``.gnu.version`` (versym): one u16 per dynsym entry, the low 15 bits index a version (0 local, 1 global =
  unversioned), bit 15 marks a hidden (non-default) definition;
- ``.gnu.version_r`` (verneed): ``vn_version u16, vn_cnt u16, vn_file u32, vn_aux u32, vn_next u32``, each with
  ``vn_cnt`` aux entries ``vna_hash u32, vna_flags u16, vna_other u16 (the index), vna_name u32, vna_next u32``;
- ``.gnu.version_d`` (verdef): ``vd_version, vd_flags, vd_ndx, vd_cnt u16, vd_hash, vd_aux, vd_next u32`` and
  aux entries ``vda_name u32, vda_next u32``; the entry flagged VER_FLG_BASE names the file itself.

Results are cached by the file's sha256 (stackfarm.analysis.cache) and in memory by (path, size, mtime).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import shutil
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from stackfarm.analysis.cache import JsonCache, default_root
from stackfarm.errors import StackfarmError
from stackfarm.proc import call

#: Bump when what is extracted changes: cached entries of another namespace are never read.
NAMESPACE = "elfsyms-1"

_ELF_MAGIC = b"\x7fELF"
_ET_DYN = 3
_SHT_DYNAMIC, _SHT_NOTE, _SHT_DYNSYM = 6, 7, 11
_SHT_VERDEF, _SHT_VERNEED, _SHT_VERSYM = 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
_DT_NEEDED, _DT_SONAME, _DT_RPATH, _DT_RUNPATH, _DT_FLAGS, _DT_FLAGS_1 = 1, 14, 15, 29, 30, 0x6FFFFFFB
_DF_BIND_NOW, _DF_1_NOW = 0x8, 0x1
_NT_GNU_BUILD_ID = 3
_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10
_EXPORTED = frozenset({_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE})
_STT_SECTION, _STT_FILE = 3, 4
_VER_FLG_BASE = 1
_MAX_TABLE = 1 << 30  # a symbol table larger than this is a damaged header, not a library
_SO_NAME = re.compile(r"\.so(\.\d+)*$")


class ElfError(StackfarmError):
    """A file whose dynamic section cannot be read: the message names the file and what is wrong."""


@dataclass(frozen=True, order=True)
class Undefined:
    """A symbol the object needs from another one."""

    name: str
    #: The version it asks for ("GLIBC_2.34", "libcudart.so.13"), "" when unversioned.
    version: str = ""
    #: The file that version belongs to, as .gnu.version_r names it ("libc.so.6"), "" when unversioned.
    file: str = ""
    #: A weak reference: the object loads without it.
    weak: bool = False


@dataclass(frozen=True)
class ElfInfo:
    """What the dynamic linker reads of one shared object."""

    path: str
    soname: str = ""
    needed: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    build_id: str = ""
    #: DF_BIND_NOW / DF_1_NOW: every symbol binds at load (Python's dlopen binds at load anyway: RTLD_NOW).
    bind_now: bool = False
    undefined: tuple[Undefined, ...] = ()
    #: Exported name -> the versions it is defined with ("" for an unversioned definition).
    defined: Mapping[str, Sequence[str]] = field(default_factory=dict)
    #: The versions the object defines (.gnu.version_d, the base entry excluded).
    versions: tuple[str, ...] = ()
    #: The versions it needs, per file (.gnu.version_r).
    version_needs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The name the loader matches: its SONAME, else its file name."""
        return self.soname or Path(self.path).name

    def to_json(self) -> dict[str, Any]:
        return {
            "soname": self.soname,
            "needed": list(self.needed),
            "rpath": list(self.rpath),
            "runpath": list(self.runpath),
            "build_id": self.build_id,
            "bind_now": self.bind_now,
            "undefined": [[u.name, u.version, u.file, u.weak] for u in self.undefined],
            "defined": {k: list(v) for k, v in self.defined.items()},
            "versions": list(self.versions),
            "version_needs": {k: list(v) for k, v in self.version_needs.items()},
        }

    @classmethod
    def from_json(cls, path: str, data: Mapping[str, Any]) -> ElfInfo:
        return cls(
            path=path,
            soname=str(data["soname"]),
            needed=tuple(data["needed"]),
            rpath=tuple(data["rpath"]),
            runpath=tuple(data["runpath"]),
            build_id=str(data["build_id"]),
            bind_now=bool(data["bind_now"]),
            undefined=tuple(Undefined(str(n), str(v), str(f), bool(w)) for n, v, f, w in data["undefined"]),
            defined=data[
                "defined"
            ],  # name -> list of versions: as read, never copied (100 000 names in torch)
            versions=tuple(data["versions"]),
            version_needs={str(k): tuple(v) for k, v in data["version_needs"].items()},
        )


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Section:
    type: int
    offset: int
    size: int
    link: int
    entsize: int


class _Reader:
    def __init__(self, fh: BinaryIO, path: Path) -> None:
        self.fh = fh
        self.path = path
        ident = fh.read(16)
        if len(ident) < 16 or ident[:4] != _ELF_MAGIC:
            raise ElfError(f"{path}: not an ELF file")
        if ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ElfError(f"{path}: unknown ELF class {ident[4]} / data encoding {ident[5]}")
        self.is64 = ident[4] == 2
        self.end = "<" if ident[5] == 1 else ">"
        fh.seek(0, 2)
        self.size = fh.tell()

    def read(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or size > _MAX_TABLE or offset + size > self.size:
            raise ElfError(f"{self.path}: a table at {offset:#x} (+{size}) lies outside the file: truncated?")
        self.fh.seek(offset)
        return self.fh.read(size)

    def header(self) -> tuple[int, list[_Section]]:
        fmt = self.end + ("HHIQQQIHHHHHH" if self.is64 else "HHIIIIIHHHHHH")
        raw = self.read(16, struct.calcsize(fmt))
        e_type, _mach, _ver, _entry, _phoff, shoff, _flags, _ehsz, _phes, _phn, shes, shnum, _shstr = (
            struct.unpack(fmt, raw)
        )
        sfmt = self.end + ("IIQQQQIIQQ" if self.is64 else "IIIIIIIIII")
        if shnum == 0 or shes < struct.calcsize(sfmt):
            raise ElfError(f"{self.path}: no section headers (stripped with sstrip?)")
        table = self.read(shoff, shes * shnum)
        sections = []
        for i in range(shnum):
            _name, stype, _fl, _addr, off, size, link, _info, _align, entsize = struct.unpack_from(
                sfmt, table, i * shes
            )
            sections.append(_Section(stype, off, size, link, entsize))
        return e_type, sections


def _cstr(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    return table[offset : end if end >= 0 else len(table)].decode("utf-8", "replace")


def _read(path: Path, given: BinaryIO | None = None) -> ElfInfo:
    """The facts of `path`, read from `given` when set (an open file of it: what it reads can be recorded)."""
    with contextlib.nullcontext(given) if given is not None else path.open("rb") as fh:
        r = _Reader(fh, path)
        e_type, sections = r.header()
        if e_type != _ET_DYN:
            raise ElfError(f"{path}: not a shared object (e_type {e_type})")
        tables = _Tables(r, sections)
        dynamic = tables.dynamic()
        need_names, version_needs = tables.verneed()
        def_names, versions = tables.verdef()
        undefined, defined = tables.symbols(need_names, def_names)
        return ElfInfo(
            path=str(path),
            soname=str(dynamic["soname"]),
            needed=tuple(dynamic["needed"]),
            rpath=tuple(dynamic["rpath"]),
            runpath=tuple(dynamic["runpath"]),
            build_id=tables.build_id(),
            bind_now=bool(dynamic["bind_now"]),
            undefined=tuple(sorted(set(undefined))),
            defined={k: tuple(sorted(set(v))) for k, v in defined.items()},
            versions=tuple(versions),
            version_needs={k: tuple(v) for k, v in version_needs.items()},
        )


class _Tables:
    def __init__(self, r: _Reader, sections: list[_Section]) -> None:
        self.r = r
        self.sections = sections

    def first(self, kind: int) -> _Section | None:
        return next((s for s in self.sections if s.type == kind), None)

    def strtab(self, sec: _Section) -> bytes:
        if not 0 < sec.link < len(self.sections):
            raise ElfError(f"{self.r.path}: a section links to string table {sec.link}, which does not exist")
        link = self.sections[sec.link]
        return self.r.read(link.offset, link.size)

    def dynamic(self) -> dict[str, Any]:
        info: dict[str, Any] = {"needed": [], "rpath": [], "runpath": [], "soname": "", "bind_now": False}
        dyn = self.first(_SHT_DYNAMIC)
        if dyn is None:
            return info
        strings = self.strtab(dyn)
        fmt = self.r.end + ("qQ" if self.r.is64 else "iI")
        width = struct.calcsize(fmt)
        for tag, val in struct.iter_unpack(fmt, self.r.read(dyn.offset, dyn.size - dyn.size % width)):
            if tag == 0:
                break
            _dynamic_entry(info, tag, val, strings)
        return info

    def build_id(self) -> str:
        for note in (s for s in self.sections if s.type == _SHT_NOTE and 0 < s.size < 1 << 16):
            data = self.r.read(note.offset, note.size)
            pos = 0
            while pos + 12 <= len(data):
                namesz, descsz, ntype = struct.unpack_from(self.r.end + "III", data, pos)
                desc = pos + 12 + (namesz + 3) // 4 * 4
                if ntype == _NT_GNU_BUILD_ID and data[pos + 12 : pos + 12 + namesz].rstrip(b"\0") == b"GNU":
                    return data[desc : desc + descsz].hex()
                pos = desc + (descsz + 3) // 4 * 4
        return ""

    def verneed(self) -> tuple[dict[int, tuple[str, str]], dict[str, list[str]]]:
        """(version index -> (version, file), file -> the versions needed from it)."""
        names: dict[int, tuple[str, str]] = {}
        needs: dict[str, list[str]] = {}
        vn = self.first(_SHT_VERNEED)
        if vn is None:
            return names, needs
        data, strings = self.r.read(vn.offset, vn.size), self.strtab(vn)
        pos = 0
        for _ in range(10_000):
            if pos + 16 > len(data):
                break
            _v, cnt, vfile, aux, nxt = struct.unpack_from(self.r.end + "HHIII", data, pos)
            file = _cstr(strings, vfile)
            apos = pos + aux
            for _ in range(cnt):
                if apos + 16 > len(data):
                    break
                _h, _f, other, vname, anext = struct.unpack_from(self.r.end + "IHHII", data, apos)
                names[other] = (_cstr(strings, vname), file)
                needs.setdefault(file, []).append(_cstr(strings, vname))
                if not anext:
                    break
                apos += anext
            if not nxt:
                break
            pos += nxt
        return names, needs

    def verdef(self) -> tuple[dict[int, str], list[str]]:
        """(version index -> version, the versions defined other than the file's base one)."""
        names: dict[int, str] = {}
        versions: list[str] = []
        vd = self.first(_SHT_VERDEF)
        if vd is None:
            return names, versions
        data, strings = self.r.read(vd.offset, vd.size), self.strtab(vd)
        pos = 0
        for _ in range(10_000):
            if pos + 20 > len(data):
                break
            _v, flags, ndx, cnt, _h, aux, nxt = struct.unpack_from(self.r.end + "HHHHIII", data, pos)
            if cnt and pos + aux + 8 <= len(data):
                vname = _cstr(strings, struct.unpack_from(self.r.end + "I", data, pos + aux)[0])
                names[ndx] = vname
                if not flags & _VER_FLG_BASE:
                    versions.append(vname)
            if not nxt:
                break
            pos += nxt
        return names, versions

    def _dynsym_rows(self, ds: _Section) -> list[tuple[int, int, int, int]]:
        """Each .dynsym entry's (st_name, st_info, st_other, st_shndx), in table order."""
        is64 = self.r.is64
        fmt = self.r.end + ("IBBHQQ" if is64 else "IIIBBH")
        width = struct.calcsize(fmt)
        count = ds.size // width
        return [
            (row[0], row[1], row[2], row[3]) if is64 else (row[0], row[3], row[4], row[5])
            for row in struct.iter_unpack(fmt, self.r.read(ds.offset, count * width))
        ]

    def _versym(self, count: int) -> tuple[int, ...]:
        """The version index of each of the `count` dynamic symbols (() when the file has no usable .gnu.version)."""
        vs = self.first(_SHT_VERSYM)
        if vs is None or vs.size < 2 * count:
            return ()
        return struct.unpack(self.r.end + f"{count}H", self.r.read(vs.offset, 2 * count))

    def symbols(
        self, need_names: Mapping[int, tuple[str, str]], def_names: Mapping[int, str]
    ) -> tuple[list[Undefined], dict[str, list[str]]]:
        undefined: list[Undefined] = []
        defined: dict[str, list[str]] = {}
        ds = self.first(_SHT_DYNSYM)
        if ds is None:
            return undefined, defined
        strings = self.strtab(ds)
        rows = self._dynsym_rows(ds)
        versym = self._versym(len(rows))
        for i, (st_name, st_info, st_other, shndx) in enumerate(rows):
            bind = st_info >> 4
            if i == 0 or not _linkable(st_info):
                continue
            name = _cstr(strings, st_name)
            if not name:
                continue
            ver = versym[i] & 0x7FFF if versym else 1
            if shndx == 0:
                vname, vfile = need_names.get(ver, ("", ""))
                undefined.append(Undefined(name, vname, vfile, bind == _STB_WEAK))
            elif st_other & 0x3 in (0, 3):  # default or protected visibility: exported
                defined.setdefault(name, []).append(def_names.get(ver, "") if ver > 1 else "")
        return undefined, defined


def _dynamic_entry(info: dict[str, Any], tag: int, val: int, strings: bytes) -> None:
    """Take one DT_* entry of the dynamic section into `info` (the others are not read)."""
    if tag == _DT_NEEDED:
        info["needed"].append(_cstr(strings, val))
    elif tag == _DT_SONAME:
        info["soname"] = _cstr(strings, val)
    elif tag in (_DT_RPATH, _DT_RUNPATH):
        key = "rpath" if tag == _DT_RPATH else "runpath"
        info[key].extend(p for p in _cstr(strings, val).split(":") if p)
    elif _binds_now(tag, val):
        info["bind_now"] = True


def _binds_now(tag: int, val: int) -> bool:
    """DF_BIND_NOW in DT_FLAGS, or DF_1_NOW in DT_FLAGS_1 (``-z now``)."""
    return bool((tag == _DT_FLAGS and val & _DF_BIND_NOW) or (tag == _DT_FLAGS_1 and val & _DF_1_NOW))


def _linkable(st_info: int) -> bool:
    """A global or weak symbol (per _EXPORTED) that is not a section or file symbol."""
    return st_info >> 4 in _EXPORTED and st_info & 0xF not in (_STT_SECTION, _STT_FILE)


def is_shared_object(path: Path) -> bool:
    """An ELF file of type ET_DYN (a ``.so`` or a PIE); linker scripts and cubins are not."""
    try:
        with path.open("rb") as fh:
            head = fh.read(18)
    except OSError:
        return False
    if len(head) < 18 or head[:4] != _ELF_MAGIC:
        return False
    e_type: int = struct.unpack(("<" if head[5] == 1 else ">") + "H", head[16:18])[0]
    return e_type == _ET_DYN


def looks_like_library(relpath: str) -> bool:
    """``x.so``, ``x.so.2``, ``x.abi3.so``, ``x.cpython-311-x86_64-linux-gnu.so``."""
    return bool(_SO_NAME.search(relpath))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def record_sha256(entry: str) -> str | None:
    """A wheel RECORD hash ``sha256=<urlsafe b64>`` as hex (the file's sha256), or None for another algorithm."""
    algo, _, b64 = entry.partition("=")
    if algo != "sha256" or not b64:
        return None
    try:
        return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    except ValueError:
        return None


_MEMO: dict[tuple[str, int, int], ElfInfo] = {}


def read_from(fh: BinaryIO, path: Path) -> ElfInfo:
    """The dynamic facts of the shared object open in `fh` (named `path` in messages), uncached: the reads are
    the ones read_elf makes, so a copy holding only the byte ranges read here gives the same answer."""
    try:
        return _read(path, fh)
    except (OSError, struct.error) as exc:
        raise ElfError(f"{path}: cannot read its dynamic section: {exc}") from exc


def read_elf(path: Path, *, sha256: str | None = None, cache: JsonCache | None = None) -> ElfInfo:
    """The dynamic facts of `path`, from the cache when its sha256 is known there.

    `sha256` is the file's hash when the caller already knows it (a verified wheel RECORD entry: 00-stack checks
    every file against it); otherwise the file is hashed. Raises ElfError for a file that is not a readable
    shared object."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ElfError(f"{path}: {exc.strerror or exc}") from exc
    memo = (str(path), st.st_size, st.st_mtime_ns)
    if memo in _MEMO:
        return _MEMO[memo]
    store = cache if cache is not None else JsonCache(default_root(), NAMESPACE)
    key = sha256 or file_sha256(path)
    hit = store.get(key)
    info: ElfInfo | None = None
    if isinstance(hit, dict):
        try:
            info = ElfInfo.from_json(str(path), hit)
        except (KeyError, TypeError, ValueError):
            info = None
    if info is None:
        try:
            info = _read(path)
        except (OSError, struct.error) as exc:
            raise ElfError(f"{path}: cannot read its dynamic section: {exc}") from exc
        store.put(key, info.to_json())
    _MEMO[memo] = info
    return info


# --------------------------------------------------------------------------- demangling


def demangle(names: Iterable[str]) -> dict[str, str]:
    """Mangled C++ name -> its demangled form, through ``c++filt`` (binutils) when it is on PATH; names it
    cannot demangle (and every name when c++filt is missing) map to themselves."""
    todo = sorted({n for n in names if n.startswith("_Z")})
    out = {n: n for n in names}
    if not todo or shutil.which("c++filt") is None:
        return out
    for start in range(0, len(todo), 500):
        chunk = todo[start : start + 500]
        try:
            done = call(["c++filt", *chunk], timeout=60)
        except StackfarmError:
            return out
        lines = done.output.splitlines()
        if done.returncode != 0 or len(lines) != len(chunk):
            continue
        out.update(zip(chunk, lines, strict=True))
    return out


__all__ = [
    "NAMESPACE",
    "ElfError",
    "ElfInfo",
    "Undefined",
    "demangle",
    "file_sha256",
    "is_shared_object",
    "looks_like_library",
    "read_elf",
    "record_sha256",
]
