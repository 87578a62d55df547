"""stackfarm.analysis.elfsyms and .abicheck: ELF dynamic facts and the cell's symbol resolution.

The fast tests build tiny shared objects with the system C compiler (a "torch" that defines c10 symbols, an
extension that needs them, versioned and weak references); the integration ones read the real wheels the
default matrix's runs left in the artifact cache.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from stackfarm.analysis import elfsyms
from stackfarm.analysis.abicheck import (
    LibraryVerdict,
    Platform,
    check_cell,
    flashinfer_drift,
    native_libraries,
)
from stackfarm.analysis.cache import JsonCache
from stackfarm.analysis.elfsyms import ElfError, Undefined, demangle, read_elf
from stackfarm.cellspec import CellSpec, InstalledComponent

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler (cc/gcc) on PATH")

#: A c10 function, by its mangled name: c10::error().
C10_ERROR = "_ZN3c105errorEv"
#: c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool): torch 2.9's spelling.
C10_CHECK = "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib"


def build_so(
    out: Path,
    source: str,
    *,
    soname: str | None = None,
    links: tuple[Path, ...] = (),
    rpath: str | None = None,
    version_script: str | None = None,
) -> Path:
    """Compile `source` (C) into the shared object `out`, with a GNU build-id."""
    assert CC is not None
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_name(out.name.replace(".", "_") + ".c")
    src.write_text(source, encoding="utf-8")
    args = [CC, "-shared", "-fPIC", "-O0", "-Wl,--build-id", "-o", str(out), str(src)]
    if soname:
        args.append(f"-Wl,-soname,{soname}")
    if rpath:
        args.append(f"-Wl,-rpath,{rpath}")
    if version_script:
        script = out.with_name(out.name + ".map")
        script.write_text(version_script, encoding="utf-8")
        args.append(f"-Wl,--version-script={script}")
    for lib in links:
        args += [f"-L{lib.parent}", f"-l:{lib.name}"]
    subprocess.run(args, check=True, capture_output=True, text=True)
    src.unlink()
    return out


def c10_source(*names: str) -> str:
    """C that defines each (mangled) name as a function."""
    return "".join(f'void f{i}(void) __asm__("{n}");\nvoid f{i}(void) {{}}\n' for i, n in enumerate(names))


def uses_source(*names: str, weak: str | None = None) -> str:
    """C that calls each (mangled) name, and optionally a weak one."""
    decls = "".join(f'void u{i}(void) __asm__("{n}");\n' for i, n in enumerate(names))
    calls = "".join(f"u{i}();" for i in range(len(names)))
    if weak:
        decls += f"void {weak}(void) __attribute__((weak));\n"
        calls += f"if ({weak}) {weak}();"
    return f"{decls}int PyInit_ext(void) {{ {calls} return 0; }}\n"


def component(root: Path, distribution: str, version: str, axis: str = "torch") -> InstalledComponent:
    return InstalledComponent(axis=axis, distribution=distribution, version=version, filename="x.whl",
                              sha256="0" * 64, source="test", root=str(root))  # fmt: skip


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKFARM_CACHE", str(tmp_path / "sfcache"))
    elfsyms._MEMO.clear()


# --------------------------------------------------------------------------- reading


@needs_cc
def test_reads_needed_soname_rpath_build_id_and_versions(tmp_path: Path) -> None:
    base = build_so(tmp_path / "lib" / "libbase.so.1", "int base_fn(void) { return 1; }\nint other(void) { return 2; }\n",
                    soname="libbase.so.1", version_script="BASE_1.0 { global: base_fn; local: *; };")  # fmt: skip
    user = build_so(tmp_path / "lib" / "libuser.so",
                    '#include <stdio.h>\nint base_fn(void);\nvoid maybe(void) __attribute__((weak));\n'
                    'int user_fn(int n) { if (maybe) maybe(); printf("%d", n); return base_fn(); }\n',
                    soname="libuser.so", links=(base,), rpath="$ORIGIN")  # fmt: skip
    info = read_elf(user)
    assert info.soname == "libuser.so"
    assert "libbase.so.1" in info.needed
    assert "libc.so.6" in info.needed
    assert (info.rpath or info.runpath) == ("$ORIGIN",)
    assert len(info.build_id) == 40
    undefined = {u.name: u for u in info.undefined}
    assert undefined["base_fn"] == Undefined("base_fn", "BASE_1.0", "libbase.so.1", False)
    assert undefined["maybe"].weak
    assert undefined["printf"].version.startswith("GLIBC_")
    assert undefined["printf"].file == "libc.so.6"
    assert "user_fn" in info.defined
    assert info.version_needs["libbase.so.1"] == ("BASE_1.0",)

    binfo = read_elf(base)
    assert binfo.defined["base_fn"] == ("BASE_1.0",)
    assert "other" not in binfo.defined  # local: * hides it
    assert binfo.versions == ("BASE_1.0",)


@needs_cc
def test_symbols_agree_with_pyelftools(tmp_path: Path) -> None:
    lib = build_so(tmp_path / "libc10.so", c10_source(C10_ERROR, C10_CHECK) + "extern int printf(const char*, ...);\n"
                   "void g(void) { printf(\"\"); }\n", soname="libc10.so")  # fmt: skip
    info = read_elf(lib)
    with lib.open("rb") as fh:
        dynsym = ELFFile(fh).get_section_by_name(".dynsym")
        assert isinstance(dynsym, SymbolTableSection)
        rows = [(s.name, s["st_shndx"], s["st_info"]["bind"]) for s in dynsym.iter_symbols() if s.name]
    want_undefined = {n for n, ndx, bind in rows if ndx == "SHN_UNDEF" and bind != "STB_LOCAL"}
    want_defined = {n for n, ndx, bind in rows if ndx != "SHN_UNDEF" and bind != "STB_LOCAL"}
    assert {u.name for u in info.undefined} == want_undefined
    assert set(info.defined) == want_defined
    assert {C10_ERROR, C10_CHECK} <= set(info.defined)


@needs_cc
def test_cached_by_file_hash(tmp_path: Path) -> None:
    lib = build_so(tmp_path / "liba.so", "int a(void) { return 0; }\n", soname="liba.so")
    cache = JsonCache(tmp_path / "c", elfsyms.NAMESPACE)
    first = read_elf(lib, cache=cache)
    key = elfsyms.file_sha256(lib)
    assert cache.get(key)["soname"] == "liba.so"
    elfsyms._MEMO.clear()
    stored = cache.get(key)
    stored["soname"] = "from-the-cache.so"
    cache.put(key, stored)
    assert (
        read_elf(lib, cache=cache).soname == "from-the-cache.so"
    )  # the cache answered, the file was not read
    assert {k: list(v) for k, v in first.defined.items()} == dict(read_elf(lib, cache=cache).defined)


def test_not_a_shared_object(tmp_path: Path) -> None:
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"/* GNU ld script */ INPUT(libfoo.so.1)")
    assert not elfsyms.is_shared_object(junk)
    with pytest.raises(ElfError, match="not an ELF file"):
        read_elf(junk)
    truncated = tmp_path / "libcut.so"
    truncated.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x03\x00" + b"\0" * 30)
    with pytest.raises(ElfError):
        read_elf(truncated)


def test_record_hash_is_the_file_sha256(tmp_path: Path) -> None:
    f = tmp_path / "x"
    f.write_bytes(b"hello")
    import base64
    import hashlib

    b64 = base64.urlsafe_b64encode(hashlib.sha256(b"hello").digest()).rstrip(b"=").decode()
    assert elfsyms.record_sha256(f"sha256={b64}") == elfsyms.file_sha256(f)
    assert elfsyms.record_sha256("md5=abc") is None


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="no c++filt (binutils)")
def test_demangle_with_cxxfilt() -> None:
    out = demangle([C10_CHECK, "plain_c"])
    assert (
        out[C10_CHECK] == "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool)"
    )
    assert out["plain_c"] == "plain_c"


def test_demangle_without_cxxfilt_leaves_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda _name: None)
    assert demangle([C10_CHECK]) == {C10_CHECK: C10_CHECK}


# --------------------------------------------------------------------------- resolving a cell


def _cell(*components: InstalledComponent, torch: str = "2.9.1") -> CellSpec:
    return CellSpec(id="synthetic", values={"torch": torch, "cuda": "12.8"}, backend="local",
                    components=components)  # fmt: skip


def _verdicts(cell: CellSpec, tag: str = "manylinux_2_39_x86_64") -> dict[str, LibraryVerdict]:
    return {v.lib.relpath: v for v in check_cell(cell, Platform.from_tag(tag)).libraries}


@needs_cc
def test_extension_resolves_against_the_cell_torch(tmp_path: Path) -> None:
    torch = tmp_path / "torch"
    c10 = build_so(torch / "torch/lib/libc10.so", c10_source(C10_ERROR, C10_CHECK), soname="libc10.so")
    libcuda = build_so(
        tmp_path / "driver/libcuda.so.1", "int cuInit(int f){return f;}\n", soname="libcuda.so.1"
    )
    kern = tmp_path / "kern"
    build_so(kern / "sgl_kernel/common_ops.abi3.so", uses_source(C10_ERROR, C10_CHECK, "cuInit", weak="absent"),
             links=(c10, libcuda))  # fmt: skip
    verdicts = _verdicts(
        _cell(component(torch, "torch", "2.9.1"), component(kern, "sgl-kernel", "0.3.21", "sgl_kernel"))
    )
    ext = verdicts["sgl_kernel/common_ops.abi3.so"]
    assert ext.ok, ext.line("2.9.1")
    assert ext.resolved == 2
    assert ext.system == {"libcuda.so.1": 1}
    assert ext.driver_symbols == ["cuInit"]  # the driver floor reads these
    assert ext.lib.component == "sgl-kernel"


@needs_cc
def test_extension_built_against_another_torch_fails_naming_the_symbols(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = tmp_path / "torch"
    c10 = build_so(torch / "torch/lib/libc10.so", c10_source(C10_ERROR), soname="libc10.so")
    other = (
        tmp_path / "sfcache" / "trees" / "abc"
    )  # another torch in the artifact cache, which has the symbol
    build_so(other / "torch/lib/libc10.so", c10_source(C10_ERROR, C10_CHECK), soname="libc10.so")
    (other / "torch-2.10.0.dist-info").mkdir()
    kern = tmp_path / "kern"
    build_so(kern / "sgl_kernel/common_ops.abi3.so", uses_source(C10_ERROR, C10_CHECK), links=(c10,))
    ext = _verdicts(_cell(component(torch, "torch", "2.11.0"), component(kern, "sgl-kernel", "0.3.21")))[
        "sgl_kernel/common_ops.abi3.so"
    ]
    assert not ext.ok
    assert [u.name for u in ext.unresolved] == [C10_CHECK]
    line = ext.line("2.11.0")
    assert line.startswith(
        "sgl_kernel/common_ops.abi3.so cannot load with torch 2.11.0: 1 unresolved symbol: "
    )
    if shutil.which("c++filt"):
        assert "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool)" in line
    # The cause is the cell's alone; the other cached torch is a hint, labelled as such, outside cause and line.
    assert ext.cause == "built against another torch than torch 2.11.0"
    assert ext.hint == "also cached here: defined in torch 2.10.0"
    assert "2.10.0" not in line


@needs_cc
def test_a_verdict_does_not_change_with_what_else_lies_in_the_cache(tmp_path: Path) -> None:
    """The same cell judged with an empty cache, then with another torch tree unpacked beside it: the same
    cause and line (only the labelled hint differs); a declared comparison set gives the same hint whatever
    the cache holds."""
    torch = tmp_path / "torch"
    c10 = build_so(torch / "torch/lib/libc10.so", c10_source(C10_ERROR), soname="libc10.so")
    kern = tmp_path / "kern"
    build_so(kern / "sgl_kernel/common_ops.abi3.so", uses_source(C10_ERROR, C10_CHECK), links=(c10,))
    declared = tmp_path / "declared"  # a torch the caller names, outside the cache
    build_so(declared / "torch/lib/libc10.so", c10_source(C10_ERROR, C10_CHECK), soname="libc10.so")
    cell = _cell(component(torch, "torch", "2.11.0"), component(kern, "sgl-kernel", "0.3.21"))
    compare = [component(declared, "torch", "2.9.1")]

    def judged(compare: list[InstalledComponent] | None = None) -> LibraryVerdict:
        elfsyms._MEMO.clear()
        libs = check_cell(cell, Platform.from_tag("manylinux_2_39_x86_64"), compare=compare).libraries
        return next(v for v in libs if v.lib.relpath == "sgl_kernel/common_ops.abi3.so")

    empty, declared_empty = judged(), judged(compare=compare)
    other = tmp_path / "sfcache" / "trees" / "def"  # then an earlier run leaves torch 2.10.0 in the cache
    build_so(other / "torch/lib/libc10.so", c10_source(C10_ERROR, C10_CHECK), soname="libc10.so")
    (other / "torch-2.10.0.dist-info").mkdir()
    cached, declared_cached = judged(), judged(compare=compare)
    assert (
        empty.cause == cached.cause == declared_empty.cause == "built against another torch than torch 2.11.0"
    )
    assert empty.line("2.11.0") == cached.line("2.11.0")
    assert (empty.hint, cached.hint) == ("", "also cached here: defined in torch 2.10.0")
    expected = "defined in torch 2.9.1 (of the torch releases compared: 2.9.1)"
    assert declared_empty.hint == declared_cached.hint == expected


@needs_cc
def test_system_python_and_missing_libraries(tmp_path: Path) -> None:
    root = tmp_path / "comp"
    # cuInit / cudaMalloc come from libcuda / libcudart, which the system provides (never in the cell)
    cuda = build_so(tmp_path / "sys/libcudart.so.12", "int cudaMalloc(void){return 0;}\nint cuInit(void){return 0;}\n",
                    soname="libcudart.so.12")  # fmt: skip
    nowhere = build_so(
        tmp_path / "sys/libnowhere.so.3", "int nowhere_fn(void){return 0;}\n", soname="libnowhere.so.3"
    )
    build_so(root / "pkg/ext.abi3.so", uses_source("PyModule_Create2", "cudaMalloc", "nowhere_fn"),
             links=(cuda, nowhere))  # fmt: skip
    ext = _verdicts(_cell(component(root, "sglang-kernel", "0.4.4")))["pkg/ext.abi3.so"]
    assert ext.python == 1
    assert ext.system.get("libcudart.so.12") == 1
    assert ext.missing == ["libnowhere.so.3"]
    assert [u.name for u in ext.unresolved] == ["nowhere_fn"]
    assert "no library libnowhere.so.3 in the cell or the system" in ext.line("2.9.1")


@needs_cc
def test_a_library_finds_its_dependency_through_rpath_origin(tmp_path: Path) -> None:
    root = tmp_path / "comp"
    dep = build_so(root / "pkg/libs/libdep.so", "int dep_fn(void){return 0;}\n", soname="libdep.so")
    build_so(root / "pkg/ext.abi3.so", uses_source("dep_fn"), links=(dep,), rpath="$ORIGIN/libs")
    assert _verdicts(_cell(component(root, "x", "1")))["pkg/ext.abi3.so"].ok


def test_platform_versions() -> None:
    p = Platform.from_tag("manylinux_2_28_x86_64")
    assert p.glibc == (2, 28)
    assert p.lacks("GLIBC_2.28") is None
    assert "glibc 2.28" in (p.lacks("GLIBC_2.34") or "")
    assert p.lacks("GLIBCXX_3.4.25") is None
    assert "GCC 8" in (p.lacks("GLIBCXX_3.4.30") or "")
    assert Platform.from_tag("manylinux_2_39_x86_64").lacks("GLIBCXX_3.4.33") is None
    assert Platform.from_tag("manylinux_2_39_x86_64").lacks("GLIBC_2.40")
    assert Platform.from_tag("manylinux2014_x86_64").glibc == (2, 17)
    assert Platform.from_tag("linux_x86_64").lacks("GLIBC_2.99") is None  # no promise: nothing to check


@needs_cc
def test_glibc_newer_than_the_platform_is_unresolved(tmp_path: Path) -> None:
    root = tmp_path / "comp"
    build_so(root / "ext.abi3.so", '#include <stdio.h>\nint PyInit_ext(void){ printf("x"); return 0; }\n')
    needs = {u.version for u in read_elf(root / "ext.abi3.so").undefined if u.version.startswith("GLIBC_")}
    ext = _verdicts(_cell(component(root, "x", "1")), "manylinux_2_1_x86_64")["ext.abi3.so"]
    assert needs
    assert not ext.ok
    assert "the platform manylinux_2_1_x86_64 has glibc 2.1" in ext.cause


@needs_cc
def test_sonames_shipped_by_two_components(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    build_so(
        a / "nvidia/nccl/lib/libnccl.so.2",
        "int ncclGetVersion(int*v){*v=1;return 0;}\n",
        soname="libnccl.so.2",
    )
    build_so(b / "lib/libnccl.so.2", "int ncclGetVersion(int*v){*v=2;return 0;}\n", soname="libnccl.so.2")
    cell = _cell(component(a, "nvidia-nccl-cu12", "2.27.5", "nccl"), component(b, "sgl-kernel", "0.3.21"))
    (shared,) = check_cell(cell, Platform.from_tag("manylinux_2_39_x86_64")).shared
    assert shared.soname == "libnccl.so.2"
    assert {c for c, *_ in shared.copies} == {"nvidia-nccl-cu12", "sgl-kernel"}
    assert "as different builds" in shared.describe()
    assert "2.27.5" in shared.describe()


def test_flashinfer_drift() -> None:
    assert flashinfer_drift({"flashinfer-python": "0.6.3", "flashinfer-cubin": "0.6.3"}) is None
    assert flashinfer_drift({"flashinfer-python": "0.6.3", "flashinfer-jit-cache": "0.6.3+cu128"}) is None
    problem = flashinfer_drift({"flashinfer-python": "0.6.11", "flashinfer-cubin": "0.6.11",
                                "flashinfer-jit-cache": "0.6.9+cu129"})  # fmt: skip
    assert problem is not None
    assert "flashinfer-jit-cache 0.6.9+cu129" in problem


@needs_cc
def test_native_libraries_follow_the_record(tmp_path: Path) -> None:
    root = tmp_path / "comp"
    build_so(root / "pkg/listed.abi3.so", "int a(void){return 0;}\n")
    build_so(root / "pkg/unlisted.abi3.so", "int b(void){return 0;}\n")
    info = root / "comp-1.dist-info"
    info.mkdir()
    digest = elfsyms.file_sha256(root / "pkg/listed.abi3.so")
    import base64

    b64 = base64.urlsafe_b64encode(bytes.fromhex(digest)).rstrip(b"=").decode()
    size = (root / "pkg/listed.abi3.so").stat().st_size
    (info / "RECORD").write_text(f"pkg/listed.abi3.so,sha256={b64},{size}\ncomp-1.dist-info/RECORD,,\n")
    libs = native_libraries(component(root, "comp", "1"))
    assert [lib.relpath for lib in libs] == ["pkg/listed.abi3.so"]


# --------------------------------------------------------------------------- real wheels (the artifact cache)

REPO = Path(__file__).resolve().parents[1]
_AXIS = {"torch": "torch", "sgl-kernel": "sgl_kernel", "sglang-kernel": "sgl_kernel", "sglang": "sglang",
         "flashinfer-python": "flashinfer", "flashinfer-cubin": "flashinfer"}  # fmt: skip


def real_component(distribution: str, version: str) -> InstalledComponent:
    """A wheel of the default matrix's indexes, unpacked in the real artifact cache (~/.cache/stackfarm, which
    the default matrix's runs fill: nothing is downloaded when it is there)."""
    from stackfarm.artifacts import Cache
    from stackfarm.matrix import load
    from stackfarm.plan import Component
    from stackfarm.resolve import Resolver

    matrix = load(REPO / "matrix.toml")
    resolver = Resolver(matrix, Cache())
    comp = Component(axis=_AXIS[distribution], distribution=distribution, version=version,
                     index=matrix.index_for(distribution, version))  # fmt: skip
    art = resolver.artifact(comp, "3.11")
    tree = resolver.cache.unpack(art)
    return InstalledComponent(axis=comp.axis, distribution=distribution, version=version, filename=art.filename,
                              sha256=art.sha256, source=art.source, root=str(tree))  # fmt: skip


def real_cell(torch: str, kernel: tuple[str, str], cuda: str) -> CellSpec:
    return CellSpec(id=f"torch{torch}-sk{kernel[1]}", values={"torch": torch, "cuda": cuda}, backend="local",
                    components=(real_component("torch", torch), real_component(*kernel)))  # fmt: skip


@pytest.fixture
def real_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real analysis cache beside the real artifact cache (warm runs are the timing that matters)."""
    monkeypatch.delenv("STACKFARM_CACHE", raising=False)


@pytest.mark.integration
@pytest.mark.usefixtures("real_cache")
@pytest.mark.parametrize(
    ("torch", "kernel", "cuda", "symbols", "neighbour"),
    [
        # sgl-kernel 0.3.21 was built against torch 2.9.1: torch 2.11 changed c10_cuda_check_implementation's
        # line number from int to unsigned int and MessageLogger's constructor (sglang#18203, kvcache-ai PR #33)
        ("2.11.0", ("sgl-kernel", "0.3.21"), "13.0",
         {"c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool)",
          "c10::MessageLogger::MessageLogger(char const*, int, int)"}, "2.9.1"),
        # and sglang-kernel 0.4.4 (built against torch 2.11) on torch 2.9.1: the other way round, plus the
        # 2.10+ TensorImpl pyobject refcounting and CUDAStream query/synchronize that 2.9.1 does not export
        ("2.9.1", ("sglang-kernel", "0.4.4"), "12.8",
         {"c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, unsigned int, bool)",
          "c10::MessageLogger::MessageLogger(c10::SourceLocation, int, bool)",
          "c10::MessageLogger::stream[abi:cxx11]()", "c10::TensorImpl::incref_pyobject() const",
          "c10::TensorImpl::decref_pyobject() const", "c10::cuda::CUDAStream::query() const",
          "c10::cuda::CUDAStream::synchronize() const"}, "2.11.0"),
    ],
)  # fmt: skip
def test_real_mismatched_kernel_and_torch(
    torch: str, kernel: tuple[str, str], cuda: str, symbols: set[str], neighbour: str
) -> None:
    # The test sets up what it asserts on: the torch the kernel was built against is fetched and declared as
    # the comparison set, whatever else an earlier run left in the cache.
    compare = [real_component("torch", neighbour)]
    result = check_cell(
        real_cell(torch, kernel, cuda), Platform.from_tag("manylinux_2_39_x86_64"), compare=compare
    )
    failed = {v.lib.relpath: v for v in result.libraries if not v.ok}
    assert set(failed) == {"sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so",
                           "sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so"}  # fmt: skip
    common = failed["sgl_kernel/sm90/common_ops.abi3.so"]
    if shutil.which("c++filt"):
        assert {u.demangled for u in common.unresolved} == symbols
    assert common.cause == f"built against another torch than torch {torch}"
    assert common.hint == f"defined in torch {neighbour} (of the torch releases compared: {neighbour})"
    assert common.line(torch).startswith(
        f"sgl_kernel/sm90/common_ops.abi3.so cannot load with torch {torch}: {len(symbols)} unresolved symbols: "
    )
    assert not [v for v in result.libraries if v.lib.component == "torch" and not v.ok]


@pytest.mark.integration
@pytest.mark.usefixtures("real_cache")
@pytest.mark.parametrize(
    ("torch", "kernel", "cuda"),
    [("2.9.1", ("sgl-kernel", "0.3.21"), "12.8"), ("2.9.1", ("sglang-kernel", "0.4.1"), "12.8"),
     ("2.11.0", ("sglang-kernel", "0.4.4"), "13.0")],
)  # fmt: skip
def test_real_pinned_pairs_load(torch: str, kernel: tuple[str, str], cuda: str) -> None:
    """The pairs SGLang's own pins choose: every library of torch and the kernels resolves, warm in < 5 s."""
    cell = real_cell(torch, kernel, cuda)
    check_cell(cell, Platform.from_tag("manylinux_2_39_x86_64"))  # warm the analysis cache
    elfsyms._MEMO.clear()
    result = check_cell(cell, Platform.from_tag("manylinux_2_39_x86_64"))
    bad = [v.line(torch) for v in result.libraries if not v.ok]
    assert not bad, bad
    assert not result.errors
    assert len(result.libraries) >= 18
    assert set(result.timings) == {"read", "total"}  # measured, not asserted: speed is `nox -s bench`'s
    spatial = next(v for v in result.libraries if v.lib.relpath == "sgl_kernel/spatial_ops.abi3.so")
    assert "cuGreenCtxCreate" in spatial.driver_symbols  # the CUDA 12.4 green-context API: driver >= 550


@needs_cc
def test_a_wheel_whose_record_lists_no_library_has_none_in_a_shared_site_packages(tmp_path: Path) -> None:
    """In an installed stack (Docker, a host) every component's root is the one site-packages: a wheel with a
    RECORD and no library (sglang, flashinfer-python) must not claim the other wheels' libraries."""
    site = tmp_path / "site-packages"
    build_so(site / "torch/lib/libc10.so", c10_source(C10_ERROR), soname="libc10.so")
    info = site / "sglang-0.5.9.dist-info"
    info.mkdir(parents=True)
    (info / "RECORD").write_text("sglang/__init__.py,sha256=AAAA,1\nsglang-0.5.9.dist-info/RECORD,,\n")
    sglang = component(site, "sglang", "0.5.9", "sglang")
    assert native_libraries(sglang) == []
