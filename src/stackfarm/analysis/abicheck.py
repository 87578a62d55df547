"""Can every native library of a cell load? Its undefined symbols resolved against what the cell provides.

For each shared object of the cell's components (torch's own, sgl_kernel's per-arch ops, deep_gemm, mscclpp...),
the loader's view is rebuilt from ELF headers (stackfarm.analysis.elfsyms): its DT_NEEDED closure, each name
looked up in its RPATH/RUNPATH (``$ORIGIN`` expanded), then among the cell's libraries by SONAME or file name
(what an already-imported torch puts in the process). Every non-weak undefined symbol is then

- **cell**: defined by a library of that closure (a versioned reference needs that version, when the definer
  has versions);
- **python**: ``Py*`` / ``_Py*``, provided by the interpreter that imports the extension;
- **system**: glibc, libstdc++, libgcc_s (their version needs are checked against the cell's platform tag:
  ``manylinux_2_39`` means glibc <= 2.39 and that distro's libstdc++), and the CUDA driver / toolkit libraries
  the image or the host provides (libcuda, libcudart, cuBLAS, cuDNN, NCCL...), listed by library;
- **unresolved**: anything else, demangled, with the likely cause: a c10/at/torch symbol means the library was
  built against another torch. Which other torch releases define those symbols is a hint beside the cause, never
  part of it: from the releases the caller declares (``compare``), else from the torch trees that happen to lie
  in the artifact cache, labelled "also cached here" (what else was unpacked before must not change a verdict).

Python's dlopen binds every symbol at load (RTLD_NOW), so one unresolved symbol is an ImportError.
"""

from __future__ import annotations

import csv
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from stackfarm.analysis.cache import JsonCache, default_root
from stackfarm.analysis.elfsyms import (
    NAMESPACE,
    ElfError,
    ElfInfo,
    Undefined,
    demangle,
    is_shared_object,
    looks_like_library,
    read_elf,
    record_sha256,
)
from stackfarm.cellspec import CellSpec, InstalledComponent, dist_info

#: Libraries the platform (glibc, the compiler runtime) or the CUDA image / driver provides when no component
#: of the cell ships them.
_SYSTEM_LIB = re.compile(
    r"^(?:ld-linux[\w.-]*|lib(?:c|m|dl|pthread|rt|util|resolv|anl|stdc\+\+|gcc_s|atomic|z|numa|ibverbs|mlx5|"
    r"rdmacm|cuda|nvidia-ml|cudart|cublas|cublasLt|cufft|cufftw|cufile|cufile_rdma|curand|cusolver|cusolverMg|"
    r"cusparse|cusparseLt|nvrtc|nvrtc-builtins|nvJitLink|nvToolsExt|nvtx3interop|cupti|cudnn\w*|nccl|"
    r"nvshmem\w*|nvperf_host|nvperf_target|gomp|mpi))\.so(?:\.[\d.]+)?$"
)
#: Who defines an unversioned symbol that no library of the cell defines: prefix -> system library stem.
_OWNER = (
    (re.compile(r"^cuFile"), "libcufile"),
    (re.compile(r"^cu(?:blasLt)"), "libcublasLt"),
    (re.compile(r"^cublas"), "libcublas"),
    (re.compile(r"^cufft"), "libcufft"),
    (re.compile(r"^curand"), "libcurand"),
    (re.compile(r"^cusolver"), "libcusolver"),
    (re.compile(r"^cusparseLt"), "libcusparseLt"),
    (re.compile(r"^cusparse"), "libcusparse"),
    (re.compile(r"^cudnn"), "libcudnn"),
    (re.compile(r"^cupti"), "libcupti"),
    (re.compile(r"^(?:__)?cuda[A-Z_]"), "libcudart"),
    (re.compile(r"^cu[A-Z]"), "libcuda"),
    (re.compile(r"^nvrtc"), "libnvrtc"),
    (re.compile(r"^nvJitLink"), "libnvJitLink"),
    (re.compile(r"^p?nccl"), "libnccl"),
    (re.compile(r"^nvshmem"), "libnvshmem"),
    (re.compile(r"^nvtx"), "libnvToolsExt"),
    (re.compile(r"^numa_"), "libnuma"),
    (re.compile(r"^ibv_"), "libibverbs"),
    (re.compile(r"^(?:GOMP_|omp_)"), "libgomp"),
)
_PLATFORM_VERSIONS = re.compile(r"^(GLIBC|GLIBCXX|CXXABI|GCC)_([\d.]+)$")
_TORCH_SYMBOL = re.compile(r"^_Z(?:T[VIST]|GV)?N?K?(?:3c10|2at|5torch|6caffe2)")
#: The C++ runtime's own names (std::, __gnu_cxx::, __cxxabiv1::, operator new/delete, __cxa_*, unwinding).
_CXX_RUNTIME = re.compile(
    r"^_Z(?:T[VISTHW])?N?K?(?:St|S[absiod]|9__gnu_cxx|10__cxxabiv1)|^_Z(?:nw|na|dl|da)[a-zA-Z]"
    r"|^__(?:cxa|gxx)_|^_Unwind_|^__dynamic_cast$"
)
_CPYTHON_TAG = re.compile(r"\.cpython-(\d)(\d+)-")
#: glibc -> (libstdc++ GLIBCXX_3.4.N, CXXABI_1.3.N, the distro), for the distro that ships that glibc.
_LIBSTDCXX = (
    ((2, 17), (19, 7, "CentOS 7 (GCC 4.8)")),
    ((2, 28), (25, 11, "RHEL 8 / Debian 10 (GCC 8)")),
    ((2, 31), (28, 12, "Ubuntu 20.04 (GCC 10)")),
    ((2, 34), (29, 13, "RHEL 9 (GCC 11)")),
    ((2, 35), (30, 13, "Ubuntu 22.04 (GCC 12)")),
    ((2, 36), (30, 13, "Debian 12 (GCC 12)")),
    ((2, 39), (33, 15, "Ubuntu 24.04 (GCC 14)")),
)


@dataclass(frozen=True)
class Platform:
    """What a platform tag promises: the glibc, and the libstdc++ of the distro that ships it."""

    tag: str
    glibc: tuple[int, int] | None

    @classmethod
    def from_tag(cls, tag: str) -> Platform:
        if m := re.match(r"^manylinux_(\d+)_(\d+)_", tag):
            return cls(tag, (int(m.group(1)), int(m.group(2))))
        legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
        return cls(tag, next((v for k, v in legacy.items() if tag.startswith(k + "_")), None))

    def libstdcxx(self) -> tuple[int, int, str] | None:
        if self.glibc is None:
            return None
        fits = [v for g, v in _LIBSTDCXX if g <= self.glibc]
        return fits[-1] if fits else None

    def lacks(self, version: str) -> str | None:
        """Why the platform does not provide a GLIBC_/GLIBCXX_/CXXABI_ version, or None when it does."""
        m = _PLATFORM_VERSIONS.match(version)
        if not m or self.glibc is None:
            return None
        nums = tuple(int(x) for x in m.group(2).split(".") if x)
        if m.group(1) == "GLIBC" and nums[:2] > self.glibc:
            return f"needs {version}, the platform {self.tag} has glibc {self.glibc[0]}.{self.glibc[1]}"
        return self._lacks_libstdcxx(version, m.group(1), nums)

    def _lacks_libstdcxx(self, version: str, kind: str, nums: tuple[int, ...]) -> str | None:
        """The GLIBCXX_/CXXABI_ half of `lacks`: against the libstdc++ of the distro of the platform's glibc."""
        std = self.libstdcxx()
        if std is None or kind not in ("GLIBCXX", "CXXABI"):
            return None
        limit = (3, 4, std[0]) if kind == "GLIBCXX" else (1, 3, std[1])
        if nums > limit:
            have = ".".join(map(str, limit))
            return f"needs {version}, newer than the libstdc++ of {std[2]} ({kind}_{have}), {self.tag}"
        return None


@dataclass(frozen=True)
class NativeLib:
    """One shared object of a component."""

    component: str
    version: str
    relpath: str
    path: Path
    info: ElfInfo


@dataclass(frozen=True)
class Unresolved:
    name: str
    demangled: str
    version: str
    cause: str


@dataclass
class LibraryVerdict:
    """Whether one library's undefined symbols all resolve in the cell."""

    lib: NativeLib
    resolved: int = 0
    python: int = 0
    #: System library -> how many symbols it is expected to provide.
    system: dict[str, int] = field(default_factory=dict)
    unresolved: list[Unresolved] = field(default_factory=list)
    #: DT_NEEDED names found neither in the cell nor among the system libraries.
    missing: list[str] = field(default_factory=list)
    #: libcuda (driver API) symbols it needs: the driver floor reads them.
    driver_symbols: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The cause line when symbols are unresolved (the first distinct causes, joined): facts of the cell alone.
    cause: str = ""
    #: Which other torch releases define the unresolved torch symbols: of the declared comparison set, or
    #: labelled "also cached here" (then it depends on the cache, and is kept out of `cause` and `line`).
    hint: str = ""

    @property
    def ok(self) -> bool:
        return not self.unresolved and not self.missing

    def line(self, torch: str) -> str:
        """``<lib> cannot load with torch X: N unresolved symbols: a, b, c`` (one line)."""
        if self.ok:
            return f"{self.lib.relpath} loads with torch {torch}: {self.resolved} symbols from the cell"
        parts = []
        if self.unresolved:
            names = ", ".join(u.demangled for u in self.unresolved[:3])
            more = ", ..." if len(self.unresolved) > 3 else ""
            n = len(self.unresolved)
            parts.append(f"{n} unresolved symbol{'s' if n != 1 else ''}: {names}{more}")
        if self.missing:
            parts.append(f"no library {', '.join(self.missing)} in the cell or the system")
        cause = f" ({self.cause})" if self.cause else ""
        return f"{self.lib.relpath} cannot load with torch {torch}: {'; '.join(parts)}{cause}"


@dataclass(frozen=True)
class SharedSoname:
    """One SONAME shipped by several components."""

    soname: str
    #: (component, version, relpath, build-id) of each copy.
    copies: tuple[tuple[str, str, str, str], ...]

    def describe(self) -> str:
        each = "; ".join(f"{c} {v}: {p} (build-id {b[:16] or 'none'})" for c, v, p, b in self.copies)
        same = len({b for *_, b in self.copies}) == 1
        return f"{self.soname} is shipped {'identically' if same else 'as different builds'} by {each}"


@dataclass
class CellAbi:
    libraries: list[LibraryVerdict] = field(default_factory=list)
    shared: list[SharedSoname] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------- collecting


def _record(comp: InstalledComponent) -> dict[str, tuple[str | None, int | None]] | None:
    """The libraries its wheel's RECORD lists, with their sha256 and size; None without a RECORD."""
    info = dist_info(comp)
    if info is None or not (info / "RECORD").is_file():
        return None
    out: dict[str, tuple[str | None, int | None]] = {}
    with (info / "RECORD").open(newline="", encoding="utf-8") as fh:
        for row in csv.reader(fh):
            if len(row) >= 3 and looks_like_library(row[0]):
                out[row[0]] = (record_sha256(row[1]), int(row[2]) if row[2].isdigit() else None)
    return out


def native_libraries(
    comp: InstalledComponent, errors: list[str] | None = None, cache: JsonCache | None = None
) -> list[NativeLib]:
    """The component's shared objects (by its RECORD when it has one, else every ``*.so*`` under its root)."""
    if not comp.root:
        return []
    root = Path(comp.root)
    record = _record(comp)
    libs = []
    for rel in _library_paths(root, record):
        path = root / rel
        if not path.is_file() or not is_shared_object(path):
            continue
        try:
            info = _read_library(path, (record or {}).get(rel, (None, None)), cache)
        except (ElfError, OSError) as exc:
            if errors is not None:
                errors.append(f"{comp.distribution}: {exc}")
            continue
        libs.append(NativeLib(comp.distribution, comp.version, rel, path, info))
    return libs


def _library_paths(root: Path, record: Mapping[str, object] | None) -> list[str]:
    """The library paths of a component, relative to its root: its RECORD's, else every ``*.so*`` under it."""
    # A RECORD that lists no library means the wheel has none: never fall back to scanning its root, which in
    # an installed stack (Docker, a host) is the site-packages every component shares.
    if record is not None:
        return sorted(p for p in record if looks_like_library(p))
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.so*") if looks_like_library(p.name))


def _read_library(path: Path, listed: tuple[str | None, int | None], cache: JsonCache | None) -> ElfInfo:
    """`read_elf`, trusting the RECORD's sha256 (`listed`: it and the size) while the file keeps its size."""
    sha, size = listed
    trusted = sha if size is not None and path.stat().st_size == size else None
    return read_elf(path, sha256=trusted, cache=cache)


def _expand(entry: str, origin: Path) -> Path:
    return Path(entry.replace("$ORIGIN", str(origin)).replace("${ORIGIN}", str(origin)))


class _Index:
    """The cell's libraries by loader name (SONAME and file name), by path, and by the names they define."""

    def __init__(self, libs: Iterable[NativeLib]) -> None:
        self.by_name: dict[str, NativeLib] = {}
        self.by_path: dict[str, NativeLib] = {}
        self.definers: dict[str, list[NativeLib]] = {}
        self._found: dict[tuple[str, str, tuple[str, ...]], NativeLib | None] = {}
        for lib in libs:
            self.by_path[os.path.normpath(lib.path)] = lib
            for name in (lib.info.soname, lib.path.name):
                if name:
                    self.by_name.setdefault(name, lib)
            for symbol in lib.info.defined:
                self.definers.setdefault(symbol, []).append(lib)

    def find(self, name: str, requirer: NativeLib) -> NativeLib | None:
        dirs = requirer.info.runpath or requirer.info.rpath
        key = (name, str(requirer.path.parent), dirs)
        if key in self._found:
            return self._found[key]
        hit = None
        for entry in dirs:
            candidate = _expand(entry, requirer.path.parent) / name
            hit = self.by_path.get(os.path.normpath(candidate))
            if hit is not None:
                break
        if hit is None:
            hit = self.by_name.get(name)
        self._found[key] = hit
        return hit

    def closure(self, lib: NativeLib) -> tuple[list[NativeLib], set[str], list[str]]:
        """(the libraries it loads, breadth first; the system libraries it needs; names found nowhere)."""
        order, seen, system, missing = [lib], {id(lib)}, set(), []
        i = 0
        while i < len(order):
            current = order[i]
            i += 1
            for name in current.info.needed:
                hit = self.find(name, current)
                if hit is not None:
                    if id(hit) not in seen:
                        seen.add(id(hit))
                        order.append(hit)
                elif _SYSTEM_LIB.match(name):
                    system.add(name)
                elif current is lib and name not in missing:
                    missing.append(name)
        return order, system, missing


def _stem(soname: str) -> str:
    return soname.split(".so", 1)[0]


def _system_owner(u: Undefined) -> str | None:
    if _CXX_RUNTIME.match(u.name):
        return "libgcc_s.so.1" if u.name.startswith("_Unwind_") else "libstdc++.so.6"
    if u.file and _SYSTEM_LIB.match(u.file):
        return u.file
    if u.version and _PLATFORM_VERSIONS.match(u.version):
        return {"GLIBC": "libc.so.6", "GCC": "libgcc_s.so.1"}.get(u.version.split("_")[0], "libstdc++.so.6")
    return next((stem for pattern, stem in _OWNER if pattern.match(u.name)), None)


def _defines(lib: NativeLib, u: Undefined) -> bool:
    versions = lib.info.defined.get(u.name)
    if versions is None:
        return False
    return not u.version or not lib.info.versions or u.version in versions or "" in versions


# --------------------------------------------------------------------------- judging


@dataclass(frozen=True)
class _Scope:
    """What the loader searches for one library's undefined symbols: the ids of the cell's libraries in its
    scope, the system libraries there (by stem), the cell's index, and the platform."""

    providers: set[int]
    stems: dict[str, str]
    index: _Index
    platform: Platform

    def _in_cell(self, u: Undefined) -> bool:
        return any(id(p) in self.providers and _defines(p, u) for p in self.index.definers.get(u.name, ()))

    def binding(self, u: Undefined) -> tuple[str, str]:
        """Where `u` binds: ("weak" | "cell" | "python", ""), ("system", the library), or ("left", why the
        platform lacks its version, "" when nothing defines it)."""
        if u.weak:
            return "weak", ""
        if self._in_cell(u):
            return "cell", ""
        if u.name.startswith(("Py", "_Py")):
            return "python", ""
        owner = _system_owner(u)
        if owner is None or not (_stem(owner) in self.stems or u.version):
            return "left", ""
        if why := self.platform.lacks(u.version):
            return "left", why
        return "system", owner if "." in owner else self.stems[owner]


def _judge(
    lib: NativeLib, scope: tuple[list[NativeLib], set[str]], index: _Index, platform: Platform
) -> tuple[LibraryVerdict, list[Undefined]]:
    """`scope`: the libraries (and system library names) the loader searches when `lib` is loaded: the
    closure of the extension module that loads it (its own closure when none does)."""
    order, system_libs = scope
    missing = [n for n in lib.info.needed if index.find(n, lib) is None and not _SYSTEM_LIB.match(n)]
    verdict = LibraryVerdict(lib, missing=missing)
    if m := _CPYTHON_TAG.search(lib.path.name):
        verdict.notes.append(f"built for CPython {m.group(1)}.{m.group(2)} (its file name says so)")
    where = _Scope(
        providers={id(p) for p in order if p is not lib},
        stems={_stem(n): n for n in system_libs},
        index=index,
        platform=platform,
    )
    return verdict, _bind(verdict, where)


def _bind(verdict: LibraryVerdict, where: _Scope) -> list[Undefined]:
    """Count where each undefined symbol of the verdict's library binds; the ones left unresolved (also set as
    its `unresolved`, with the platform's reason when it lacks their version)."""
    system: Counter[str] = Counter()
    left: list[Undefined] = []
    lacks: dict[str, str] = {}
    for u in verdict.lib.info.undefined:
        bound, detail = where.binding(u)
        if bound == "cell":
            verdict.resolved += 1
        elif bound == "python":
            verdict.python += 1
        elif bound == "system":
            system[detail] += 1
            if _stem(detail) == "libcuda":
                verdict.driver_symbols.append(u.name)
        elif bound == "left":
            left.append(u)
            if detail:
                lacks[u.name] = detail
    verdict.system = dict(sorted(system.items()))
    verdict.unresolved = [Unresolved(u.name, u.name, u.version, lacks.get(u.name, "")) for u in left]
    return left


def _is_extension(lib: NativeLib) -> bool:
    """A Python extension module: Python dlopens it by itself (it defines PyInit_<name>)."""
    return any(name.startswith("PyInit_") for name in lib.info.defined)


def _scopes(libs: Sequence[NativeLib], index: _Index) -> dict[int, tuple[list[NativeLib], set[str]]]:
    """Each library's lookup scope: the closure of the first extension module that loads it, else its own."""
    roots = [lib for lib in libs if _is_extension(lib)]
    closures = {id(lib): index.closure(lib) for lib in libs}
    out: dict[int, tuple[list[NativeLib], set[str]]] = {}
    for lib in libs:
        root = next((r for r in roots if any(x is lib for x in closures[id(r)][0])), lib)
        order, system, _missing = closures[id(root)]
        out[id(lib)] = (order, system)
    return out


def _torch_trees(cell: CellSpec) -> list[InstalledComponent]:
    """Other torch releases whose unpacked trees happen to lie in the artifact cache (a hint's neighbours)."""
    mine = next((c for c in cell.components if c.distribution == "torch"), None)
    roots = {default_root().parent / "trees"}
    if mine is not None and mine.root:
        roots.add(Path(mine.root).parent)
    found: dict[str, InstalledComponent] = {}
    for root in roots:
        for comp in _trees_under(root):
            if not _same_tree(comp, mine):
                found.setdefault(comp.version, comp)
    return [found[v] for v in sorted(found, key=_version_key)]


def _same_tree(comp: InstalledComponent, mine: InstalledComponent | None) -> bool:
    """The cell's own torch: its release, or its tree."""
    return mine is not None and (comp.version == mine.version or comp.root == str(Path(mine.root)))


def _trees_under(root: Path) -> list[InstalledComponent]:
    """Every unpacked torch tree one level under `root` (``<tree>/torch-<version>.dist-info``)."""
    if not root.is_dir():
        return []
    return [
        InstalledComponent(
            axis="torch",
            distribution="torch",
            version=info.name[len("torch-") : -len(".dist-info")],
            filename="",
            sha256="",
            source="cache",
            root=str(info.parent),
        )
        for info in sorted(root.glob("*/torch-*.dist-info"))
    ]


def _version_key(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


def _neighbours(
    cell: CellSpec, symbols: set[str], cache: JsonCache | None, compare: Sequence[InstalledComponent] | None
) -> str:
    """Which other torch releases define all of `symbols`: of `compare` (declared by the caller), else of the
    trees the artifact cache happens to hold, labelled so."""
    mine = next((c.version for c in cell.components if c.distribution == "torch"), None)
    trees = _torch_trees(cell) if compare is None else [c for c in compare if c.version != mine]
    have = [
        comp.version
        for comp in sorted(trees, key=lambda c: _version_key(c.version))
        if symbols <= _torch_defines(comp, cache)
    ]
    if compare is not None:
        return _compared(have, trees)
    return f"also cached here: defined in torch {', '.join(have)}" if have else ""


def _compared(have: Sequence[str], trees: Sequence[InstalledComponent]) -> str:
    """The hint against a declared comparison set: which of them define the symbols, and which were looked at."""
    compared = ", ".join(sorted({c.version for c in trees}, key=_version_key)) or "none"
    found = f"defined in torch {', '.join(have)}" if have else "defined in none of them"
    return f"{found} (of the torch releases compared: {compared})"


def _torch_defines(comp: InstalledComponent, cache: JsonCache | None) -> set[str]:
    """The symbols the libraries of one torch tree (``torch/lib/``) define."""
    libs = [lib for lib in native_libraries(comp, cache=cache) if lib.relpath.startswith("torch/lib/")]
    return {name for lib in libs for name in lib.info.defined}


def check_cell(
    cell: CellSpec,
    platform: Platform,
    *,
    cache: JsonCache | None = None,
    compare: Sequence[InstalledComponent] | None = None,
) -> CellAbi:
    """Judge every native library of the cell (see the module docstring). `compare`: the torch releases whose
    trees the hint of an unresolved torch symbol is computed from (None: whatever the cache holds, labelled)."""
    out = CellAbi()
    start = time.perf_counter()
    store = cache if cache is not None else JsonCache(default_root(), NAMESPACE)
    libs = [lib for comp in cell.components for lib in native_libraries(comp, out.errors, store)]
    out.timings["read"] = round(time.perf_counter() - start, 3)
    index = _Index(libs)
    _explain_all(cell, _judge_all(libs, index, platform, out), store, compare)
    out.shared = shared_sonames(libs)
    out.timings["total"] = round(time.perf_counter() - start, 3)
    return out


def _judge_all(
    libs: Sequence[NativeLib], index: _Index, platform: Platform, out: CellAbi
) -> list[tuple[LibraryVerdict, list[Undefined]]]:
    """Judge every library into `out`; the verdicts that left symbols unresolved, with those symbols."""
    pending: list[tuple[LibraryVerdict, list[Undefined]]] = []
    scopes = _scopes(libs, index)
    for lib in libs:
        verdict, left = _judge(lib, scopes[id(lib)], index, platform)
        out.libraries.append(verdict)
        if left:
            pending.append((verdict, left))
    return pending


def _explain_all(
    cell: CellSpec,
    pending: Sequence[tuple[LibraryVerdict, list[Undefined]]],
    store: JsonCache,
    compare: Sequence[InstalledComponent] | None,
) -> None:
    """Demangle (in one batch) and explain the unresolved symbols of every verdict that has some; the torch
    symbols among them get one hint, from the other torch releases that define them."""
    torch = next((c.version for c in cell.components if c.distribution == "torch"), "(none)")
    names = demangle(u.name for _, left in pending for u in left)
    torch_symbols = {u.name for _, left in pending for u in left if _TORCH_SYMBOL.match(u.name)}
    hint = _neighbours(cell, torch_symbols, store, compare) if torch_symbols else ""
    for verdict, left in pending:
        _explain(verdict, left, names, torch_symbols, torch=torch, hint=hint)


def _explain(
    verdict: LibraryVerdict,
    left: Sequence[Undefined],
    names: Mapping[str, str],
    torch_symbols: set[str],
    *,
    torch: str,
    hint: str,
) -> None:
    """Give one library's unresolved symbols their demangled `names`, and its `cause` line: built against
    another torch, a platform that lacks a version, or defined nowhere."""
    verdict.unresolved = [
        Unresolved(u.name, names.get(u.name, u.name), u.version, v.cause)
        for u, v in zip(left, verdict.unresolved, strict=True)
    ]
    causes = []
    ours = [u for u in left if u.name in torch_symbols]
    if ours:
        causes.append(f"built against another torch than torch {torch}")
        verdict.hint = hint
    causes.extend(dict.fromkeys(u.cause for u in verdict.unresolved if u.cause))
    if len(ours) + sum(1 for u in verdict.unresolved if u.cause) < len(left):
        causes.append("the rest is defined by no library of the cell nor of the system")
    verdict.cause = "; ".join(causes)


def loaded_at_import(libs: Sequence[NativeLib], index: _Index | None = None) -> list[NativeLib]:
    """The libraries an import of the cell's packages loads: every Python extension module and the libraries
    its DT_NEEDED closure reaches. A library no extension needs is dlopened later, if ever (a kernel loaded by
    Python code for one arch or one feature), so its symbols bind only when something asks for it."""
    index = index if index is not None else _Index(libs)
    out: dict[int, NativeLib] = {}
    for lib in libs:
        if _is_extension(lib):
            for reached in index.closure(lib)[0]:
                out.setdefault(id(reached), reached)
    return [lib for lib in libs if id(lib) in out]


def import_driver_symbols(
    components: Sequence[InstalledComponent], cache: JsonCache | None = None, *, every: bool = False
) -> dict[str, tuple[str, ...]]:
    """``<component>/<library>`` -> the driver-API (libcuda) symbols it links, for the libraries loaded at
    import (`loaded_at_import`; `every`: all of them, for suites that dlopen each library, as 05-import's GPU
    part does). The symbols decide a cell's driver floor (stackfarm.driver.symbol_floor), as 05-import's own
    judge resolves them; a library that links none is left out."""
    store = cache if cache is not None else JsonCache(default_root(), NAMESPACE)
    libs = [lib for comp in components for lib in native_libraries(comp, None, store)]
    index = _Index(libs)
    scopes = _scopes(libs, index)
    chosen = libs if every else loaded_at_import(libs, index)
    out: dict[str, tuple[str, ...]] = {}
    for lib in chosen:
        verdict, _left = _judge(lib, scopes[id(lib)], index, Platform("", None))
        if verdict.driver_symbols:
            out[f"{lib.component}/{lib.relpath}"] = tuple(sorted(set(verdict.driver_symbols)))
    return out


def shared_sonames(libs: Sequence[NativeLib]) -> list[SharedSoname]:
    """SONAMEs that more than one component ships (libnccl, libcudart, libnvrtc...), each copy's build-id."""
    by: dict[str, dict[tuple[str, str, str, str], None]] = {}
    for lib in libs:
        if lib.info.soname:
            copy = (lib.component, lib.version, lib.relpath, lib.info.build_id)
            by.setdefault(lib.info.soname, {})[copy] = None
    out = []
    for soname, copies in sorted(by.items()):
        if len({c for c, *_ in copies}) > 1:
            out.append(SharedSoname(soname, tuple(copies)))
    return out


#: The flashinfer distributions that must be one release.
FLASHINFER_TRIO = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")


def flashinfer_drift(versions: Mapping[str, str]) -> str | None:
    """A message when the present flashinfer distributions are not one release (local labels aside)."""
    present = {d: v for d, v in versions.items() if d in FLASHINFER_TRIO}
    releases = {}
    for dist, text in present.items():
        try:
            releases[dist] = Version(text).public.split("+")[0]
        except InvalidVersion:
            releases[dist] = text
    if len(set(releases.values())) <= 1:
        return None
    each = ", ".join(f"{d} {present[d]}" for d in FLASHINFER_TRIO if d in present)
    return (
        f"flashinfer components disagree: {each}; flashinfer checks they are one release at import, and stale "
        "precompiled kernels fail at run time (pin all of them to one version)"
    )


__all__ = [
    "FLASHINFER_TRIO",
    "CellAbi",
    "LibraryVerdict",
    "NativeLib",
    "Platform",
    "SharedSoname",
    "Unresolved",
    "check_cell",
    "flashinfer_drift",
    "import_driver_symbols",
    "loaded_at_import",
    "native_libraries",
    "shared_sonames",
]
