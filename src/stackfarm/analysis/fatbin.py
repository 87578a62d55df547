"""Which GPU code a CUDA binary carries, read from its headers without running anything.

A CUDA shared library keeps its device code in the ELF section ``.nv_fatbin``: a sequence of fatbins, one per
translation unit (``.cu`` file), each a 16-byte header followed by entries (a cubin = SASS for one arch, or PTX
for one virtual arch). Only those headers are read, never the payloads, so a 1.7 GB ``flash_ops.abi3.so`` costs
a few hundred small reads. A standalone ``.cubin`` (flashinfer-cubin ships ~15 000) is one SASS entry whose arch
is in its ELF header.

Layouts, as written by nvcc 12.x/13.0 and checked against ``cuobjdump --list-elf --list-ptx`` (tests/test_fatbin.py):

- fatbin header: ``u32 magic 0xBA55ED50, u16 version, u16 header_size, u64 entries_size``;
- entry header: ``u16 kind (1 PTX, 2 ELF), u16 version, u32 header_size, u64 payload_size, ...,
  u16 code_minor @24, u16 code_major @26, u32 arch @28, ..., u64 flags @40``; flag ``0x100000`` marks an
  ``a`` (arch-specific) target, ``0x200000`` an ``f`` (family) one, ``0x2000``/``0x8000`` a compressed payload;
- cubin ELF (``e_machine`` 190): ABI version 8 keeps the sm number in bits 8..15 of ``e_flags`` (older ABIs in
  bits 0..7); an ``a`` target sets ``e_flags`` bit 3 (CUDA <= 12.9) or attribute 9 of ``.nv.compat`` (CUDA 13).

The per-unit view matters: a library is only usable on a GPU if *every* unit has code for it; a kernel in a unit
without it fails at launch with "no kernel image is available for execution on the device".
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

from stackfarm.analysis.arch import VARIANTS, Arch, ptx_jits_on, sass_runs_on
from stackfarm.proc import call

CodeKind = Literal["sass", "ptx", "other"]
Verdict = Literal["ok", "ptx-jit", "no-code"]

_ELF_MAGIC = b"\x7fELF"
_EM_CUDA = 190
_SHT_NOBITS = 8
_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_HEADER = struct.Struct("<IHHQ")
_ENTRY_MIN = 64
_FLAG_ARCH_SPECIFIC = 0x100000
_FLAG_FAMILY = 0x200000
_FLAG_COMPRESSED = 0x2000 | 0x8000
_EF_ARCH_SPECIFIC = 0x8
_COMPAT_ARCH_SPECIFIC = 9
_KINDS: dict[int, CodeKind] = {1: "ptx", 2: "sass"}
_SECTION = struct.Struct("<IIQQQQ24x")
_WANTED = frozenset({".nv_fatbin", ".nvFatBinSegment", ".nv.compat"})


class FatbinError(Exception):
    """A file whose device code cannot be read: the message names the file and what is wrong with it."""


@dataclass(frozen=True, order=True)
class Code:
    """One entry: SASS for a real arch or PTX for a virtual one."""

    kind: CodeKind
    arch: Arch
    #: The entry's code version: the cubin ELF ABI ("1.8") for SASS, the PTX ISA version ("9.0") for PTX.
    version: tuple[int, int] = (0, 0)
    compressed: bool = False

    def __str__(self) -> str:
        return f"{self.arch}" if self.kind == "sass" else f"compute_{self.arch.sm}{self.arch.variant}"


@dataclass(frozen=True)
class Unit:
    """One fatbin: the code nvcc produced for one translation unit."""

    codes: tuple[Code, ...]


@dataclass(frozen=True)
class Binary:
    """The device code of one file."""

    path: str
    size: int
    container: Literal["fatbin", "cubin"]
    units: tuple[Unit, ...]
    #: Oddities met while reading that did not stop it (skipped padding, unknown entry kinds).
    notes: tuple[str, ...] = ()

    def archs(self, kind: CodeKind) -> tuple[Arch, ...]:
        return tuple(sorted({c.arch for u in self.units for c in u.codes if c.kind == kind}))

    @property
    def sass(self) -> tuple[Arch, ...]:
        return self.archs("sass")

    @property
    def ptx(self) -> tuple[Arch, ...]:
        return self.archs("ptx")

    def describe(self) -> str:
        """``sass sm_80 sm_90a, ptx compute_90 (372 units)``."""
        sass = " ".join(str(a) for a in self.sass) or "none"
        ptx = " ".join(f"compute_{a.sm}{a.variant}" for a in self.ptx) or "none"
        return f"sass {sass}; ptx {ptx} ({len(self.units)} unit{'s' if len(self.units) != 1 else ''})"


@dataclass(frozen=True)
class Coverage:
    """Whether a binary can run on one GPU, unit by unit."""

    gpu: Arch
    verdict: Verdict
    units: int
    sass_units: int
    ptx_units: int
    missing_units: int
    #: PTX ISA versions the driver must accept to JIT the PTX-only units.
    ptx_versions: tuple[tuple[int, int], ...] = field(default=())

    def explain(self, binary: Binary) -> str:
        head = f"{Path(binary.path).name} on {self.gpu}: "
        if self.verdict == "ok":
            return head + f"SASS in all {self.units} units ({binary.describe()})"
        if self.verdict == "ptx-jit":
            isa = ", ".join(f"{a}.{b}" for a, b in self.ptx_versions)
            return head + (
                f"no SASS in {self.ptx_units} of {self.units} units, the driver must JIT their PTX (ISA {isa}); "
                f"slow first launch, and the driver must support that PTX ISA ({binary.describe()})"
            )
        return (
            head
            + f"no code for {self.gpu} in {self.missing_units} of {self.units} units ({binary.describe()})"
        )


def coverage(binary: Binary, gpu: Arch) -> Coverage:
    """Decide per unit: SASS that runs on `gpu`, else PTX the driver can JIT for it, else nothing."""
    sass = ptx = missing = 0
    isas: set[tuple[int, int]] = set()
    for unit in binary.units:
        if any(c.kind == "sass" and sass_runs_on(c.arch, gpu) for c in unit.codes):
            sass += 1
            continue
        jit = [c for c in unit.codes if c.kind == "ptx" and ptx_jits_on(c.arch, gpu)]
        if jit:
            ptx += 1
            isas.add(max(c.version for c in jit))
        else:
            missing += 1
    verdict: Verdict = "no-code" if missing or not binary.units else "ptx-jit" if ptx else "ok"
    return Coverage(
        gpu=gpu,
        verdict=verdict,
        units=len(binary.units),
        sass_units=sass,
        ptx_units=ptx,
        missing_units=missing if binary.units else 0,
        ptx_versions=tuple(sorted(isas)),
    )


# --------------------------------------------------------------------------- ELF, the few bits needed


@dataclass(frozen=True)
class _Elf:
    abi_version: int
    machine: int
    flags: int
    #: name -> (file offset, size), for sections that occupy file space.
    sections: dict[str, tuple[int, int]]


def _read_exact(fh: BinaryIO, offset: int, size: int, what: str, path: Path) -> bytes:
    fh.seek(offset)
    data = fh.read(size)
    if len(data) != size:
        raise FatbinError(
            f"{path}: truncated: {what} at byte {offset} needs {size} bytes, the file ends first"
        )
    return data


def _read_elf(fh: BinaryIO, path: Path, file_size: int, wanted: frozenset[str]) -> _Elf:
    """The ELF header fields and the `wanted` sections' places (only those names are looked up: cubins have
    hundreds of sections, and flashinfer-cubin has 15 000 cubins)."""
    head = fh.read(64)
    if head[:4] != _ELF_MAGIC:
        raise FatbinError(f"{path}: not an ELF file (starts with {head[:4]!r})")
    if len(head) < 64:
        raise FatbinError(f"{path}: truncated: {len(head)} bytes, shorter than an ELF header")
    if head[4] != 2 or head[5] != 1:
        raise FatbinError(f"{path}: only 64-bit little-endian ELF is read (class {head[4]}, data {head[5]})")
    machine, shoff, flags = struct.unpack_from("<H", head, 18)[0], *struct.unpack_from("<QI", head, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 58)
    if shoff == 0:
        return _Elf(abi_version=head[8], machine=machine, flags=flags, sections={})
    if shentsize != 64:
        raise FatbinError(f"{path}: section header size {shentsize}, expected 64")
    if shnum == 0 or shstrndx == 0xFFFF:  # many sections: the real counts live in section 0
        first = _read_exact(fh, shoff, 64, "section header 0", path)
        shnum = shnum or struct.unpack_from("<Q", first, 32)[0]
        shstrndx = struct.unpack_from("<I", first, 40)[0] if shstrndx == 0xFFFF else shstrndx
    if shoff + shnum * 64 > file_size:
        raise FatbinError(
            f"{path}: truncated: section headers end at {shoff + shnum * 64}, file is {file_size} bytes"
        )
    if shstrndx >= shnum:
        raise FatbinError(f"{path}: section name table index {shstrndx} out of range ({shnum} sections)")
    table = _read_exact(fh, shoff, shnum * 64, "section headers", path)
    _, _, _, _, str_off, str_size = _SECTION.unpack_from(table, shstrndx * 64)
    if str_off + str_size > file_size:
        raise FatbinError(
            f"{path}: truncated: section names end at {str_off + str_size}, file is {file_size} bytes"
        )
    names = _read_exact(fh, str_off, str_size, "section names", path)
    return _Elf(abi_version=head[8], machine=machine, flags=flags, sections=_sections(table, names, wanted))


def _sections(table: bytes, names: bytes, wanted: frozenset[str]) -> dict[str, tuple[int, int]]:
    """name -> (file offset, size) of the `wanted` sections that occupy file space, from the section headers
    and the section name table."""
    offsets: dict[int, str] = {}
    for name in wanted:
        needle = name.encode() + b"\0"
        at = names.find(needle)
        while at >= 0:
            if at == 0 or names[at - 1] == 0:
                offsets[at] = name
            at = names.find(needle, at + 1)
    sections: dict[str, tuple[int, int]] = {}
    if offsets:
        for name_off, sh_type, _, _, offset, size in _SECTION.iter_unpack(table):
            found = offsets.get(name_off)
            if found is not None and sh_type != _SHT_NOBITS:
                sections.setdefault(found, (offset, size))
    return sections


# --------------------------------------------------------------------------- readers


def _entry(header: bytes) -> tuple[int, Code | None]:
    kind_num, _, _, _ = struct.unpack_from("<HHIQ", header, 0)
    minor, major, arch_num = struct.unpack_from("<HHI", header, 24)
    flags = struct.unpack_from("<Q", header, 40)[0]
    kind = _KINDS.get(kind_num)
    if kind is None or arch_num < 10:
        return kind_num, None
    variant = "a" if flags & _FLAG_ARCH_SPECIFIC else "f" if flags & _FLAG_FAMILY else ""
    arch = Arch(arch_num // 10, arch_num % 10, VARIANTS[variant])
    return kind_num, Code(kind, arch, (major, minor), bool(flags & _FLAG_COMPRESSED))


def _fatbins(fh: BinaryIO, path: Path, base: int, size: int) -> tuple[tuple[Unit, ...], tuple[str, ...]]:
    units: list[Unit] = []
    notes: list[str] = []
    off = 0
    while off + _FATBIN_HEADER.size <= size:
        magic, _, header_size, entries_size = _FATBIN_HEADER.unpack(
            _read_exact(fh, base + off, _FATBIN_HEADER.size, "fatbin header", path)
        )
        if magic != _FATBIN_MAGIC:
            # fatbins are 8-byte aligned and padded with zeros; anything else is worth a note, not a stop
            if not notes or not notes[-1].startswith("skipped"):
                notes.append(f"skipped non-fatbin bytes at .nv_fatbin+{off}")
            off += 8
            continue
        start, end = off + header_size, off + header_size + entries_size
        if end > size:
            raise FatbinError(
                f"{path}: truncated fatbin at .nv_fatbin+{off}: it claims {entries_size} bytes, "
                f"the section has {size - start} left"
            )
        codes: list[Code] = []
        pos = start
        while pos + _ENTRY_MIN <= end:
            header = _read_exact(fh, base + pos, _ENTRY_MIN, "fatbin entry header", path)
            entry_header, payload = struct.unpack_from("<IQ", header, 4)
            if entry_header < _ENTRY_MIN or pos + entry_header + payload > end:
                raise FatbinError(
                    f"{path}: corrupt fatbin entry at .nv_fatbin+{pos} (header {entry_header} bytes)"
                )
            kind_num, code = _entry(header)
            if code is None:
                notes.append(f"entry kind {kind_num} at .nv_fatbin+{pos} not SASS or PTX: ignored")
            else:
                codes.append(code)
            pos += entry_header + payload
        units.append(Unit(tuple(codes)))
        off = end
    return tuple(units), tuple(dict.fromkeys(notes))


def _compat_arch_specific(fh: BinaryIO, path: Path, elf: _Elf) -> bool:
    where = elf.sections.get(".nv.compat")
    if where is None or where[1] > 4096 or elf.flags & _EF_ARCH_SPECIFIC:
        return False
    data = _read_exact(fh, where[0], where[1], ".nv.compat", path)
    # records of (u8 format, u8 attribute, u16 value) while the format is 2
    for i in range(0, len(data) - 3, 4):
        fmt, attr, value = struct.unpack_from("<BBH", data, i)
        if fmt != 2:
            break
        if attr == _COMPAT_ARCH_SPECIFIC:
            return bool(value == 1)
    return False


def _cubin(fh: BinaryIO, path: Path, elf: _Elf) -> Unit:
    sm = (elf.flags >> 8) & 0xFF if elf.abi_version >= 8 else elf.flags & 0xFF
    if sm < 10:
        raise FatbinError(f"{path}: CUDA ELF with no readable sm number (e_flags {elf.flags:#x})")
    specific = elf.abi_version >= 8 and (
        bool(elf.flags & _EF_ARCH_SPECIFIC) or _compat_arch_specific(fh, path, elf)
    )
    arch = Arch(sm // 10, sm % 10, "a" if specific else "")
    return Unit((Code("sass", arch, (1, elf.abi_version)),))


def read_binary(path: Path | str) -> Binary | None:
    """The device code in `path` (a shared library, object or cubin), or None for an ELF with none.

    Raises `FatbinError`, with a message that says what is wrong, for an unreadable, truncated or corrupt file
    and for one that registers device code (``.nvFatBinSegment``) without a ``.nv_fatbin`` section to read.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:  # plain open: pathlib costs show with 15 000 cubins
            return read_binary_from(fh, path)
    except OSError as exc:
        raise FatbinError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def read_binary_from(fh: BinaryIO, path: Path, size: int | None = None) -> Binary | None:
    """`read_binary` of the file open in `fh` (named `path` in messages; its size from fstat unless given)."""
    try:
        size = os.fstat(fh.fileno()).st_size if size is None else size
        elf = _read_elf(fh, path, size, _WANTED)
        if elf.machine == _EM_CUDA:
            return Binary(str(path), size, "cubin", (_cubin(fh, path, elf),))
        where = elf.sections.get(".nv_fatbin")
        if where is None:
            if ".nvFatBinSegment" in elf.sections:
                raise FatbinError(
                    f"{path}: registers device code (.nvFatBinSegment) but has no .nv_fatbin section "
                    "(stripped, or embedded elsewhere): list it with cuobjdump instead"
                )
            return None
        offset, length = where
        if offset + length > size:
            raise FatbinError(f"{path}: truncated: .nv_fatbin ends at byte {offset + length}, file is {size}")
        units, notes = _fatbins(fh, path, offset, length)
        return Binary(str(path), size, "fatbin", units, notes)
    except OSError as exc:
        raise FatbinError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except struct.error as exc:
        raise FatbinError(f"{path}: corrupt ELF: {exc}") from exc


# --------------------------------------------------------------------------- cuobjdump, for cross-checks

_LISTING = re.compile(r"^(ELF|PTX) file\s+\d+:\s+\S*?\.(sm_\d+[af]?)\.(?:cubin|ptx)\s*$")


def find_cuobjdump() -> Path | None:
    """cuobjdump on PATH, else the one PyPI's ``nvidia-cuda-cuobjdump`` puts under ``nvidia/cu*/bin/``."""
    found = shutil.which("cuobjdump")
    if found:
        return Path(found)
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(base).glob("*/bin/cuobjdump")):
            return candidate
    default = Path("/usr/local/cuda/bin/cuobjdump")
    return default if default.exists() else None


def cuobjdump_codes(path: Path | str, exe: Path | None = None) -> tuple[tuple[CodeKind, str], ...]:
    """``(kind, "sm_90a")`` per entry as ``cuobjdump --list-elf --list-ptx`` names them, in its order.

    cuobjdump spells an ``f`` cubin without the suffix (``sm_100f`` lists as ``sm_100``).
    """
    exe = exe or find_cuobjdump()
    if exe is None:
        raise FatbinError(
            "cuobjdump not found: pip install nvidia-cuda-cuobjdump, or put the CUDA bin/ on PATH"
        )
    done = call([exe, "--list-elf", "--list-ptx", Path(path)], timeout=300)
    if done.returncode != 0 and "No PTX file found" not in done.output and "No ELF file" not in done.output:
        raise FatbinError(f"{path}: cuobjdump exited {done.returncode}: {done.output.strip()[-300:]}")
    out: list[tuple[CodeKind, str]] = []
    for line in done.output.splitlines():
        if match := _LISTING.match(line.strip()):
            out.append(("sass" if match.group(1) == "ELF" else "ptx", match.group(2)))
    return tuple(out)


def listing(binary: Binary) -> tuple[tuple[CodeKind, str], ...]:
    """This module's view in cuobjdump's spelling, for comparing with `cuobjdump_codes`."""
    out: list[tuple[CodeKind, str]] = []
    for unit in binary.units:
        for code in unit.codes:
            variant = "" if code.kind == "sass" and code.arch.variant == "f" else code.arch.variant
            out.append((code.kind, f"sm_{code.arch.sm}{variant}"))
    return tuple(out)


def read_all(paths: Iterable[Path]) -> dict[Path, Binary | FatbinError | None]:
    """`read_binary` over many files; a bad file gives its error in place of a result, never an exception."""
    out: dict[Path, Binary | FatbinError | None] = {}
    for path in paths:
        try:
            out[path] = read_binary(path)
        except FatbinError as exc:
            out[path] = exc
    return out


__all__ = [
    "Binary",
    "Code",
    "CodeKind",
    "Coverage",
    "FatbinError",
    "Unit",
    "Verdict",
    "coverage",
    "cuobjdump_codes",
    "find_cuobjdump",
    "listing",
    "read_all",
    "read_binary",
]
