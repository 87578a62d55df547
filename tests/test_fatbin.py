"""Arch spellings, compatibility rules, fatbin/cubin header reading, the kernel inventory and sgl-kernel's loader.

Real inputs: tiny CUDA objects built here with ``nvcc -gencode`` (skipped without nvcc), checked against
``cuobjdump`` (skipped without it), and real libraries from the wheels in the stackfarm cache (skipped when the
cache does not hold them). Bad inputs are made from the built ones: truncated, stripped, overwritten.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stackfarm.analysis.arch import Arch, ArchError, parse_arch, parse_target, ptx_jits_on, sass_runs_on
from stackfarm.analysis.fatbin import (
    Binary,
    Code,
    FatbinError,
    Unit,
    coverage,
    cuobjdump_codes,
    find_cuobjdump,
    listing,
    read_binary,
)
from stackfarm.analysis.kernels import inventory, sgl_kernel_loader
from stackfarm.proc import call

NVCC = shutil.which("nvcc")
CUOBJDUMP = find_cuobjdump()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found: cannot build CUDA test objects")
needs_cuobjdump = pytest.mark.skipif(
    CUOBJDUMP is None, reason="cuobjdump not found (pip install nvidia-cuda-cuobjdump)"
)

SM90, SM90A, SM100, SM120, SM121 = Arch(9, 0), Arch(9, 0, "a"), Arch(10, 0), Arch(12, 0), Arch(12, 1)


# --------------------------------------------------------------------------- arch names and rules


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("sm_120", SM120),
        ("sm120", SM120),
        ("SM_120", SM120),
        ("12.0", SM120),
        ("120", SM120),
        (120, SM120),
        (12.0, SM120),
        ("(12, 0)", SM120),
        ((12, 0), SM120),
        ("sm_90a", SM90A),
        ("compute_90a", SM90A),
        ("sm_100f", Arch(10, 0, "f")),
        ("86", Arch(8, 6)),
        (" sm_121 ", SM121),
    ],
)
def test_parse_arch_spellings(text: object, want: Arch) -> None:
    assert parse_arch(text) == want


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("12", "a bare major is ambiguous, write sm_120 or 12.0"),
        ("sm_12", "a bare major is ambiguous"),
        ("9", "not a CUDA architecture"),
        ("1200", "not understood"),
        ("hopper", "not understood"),
        ("", "not understood"),
        (None, "expected a string"),
        (True, "expected a string"),
    ],
)
def test_parse_arch_rejects_clearly(text: object, message: str) -> None:
    with pytest.raises(ArchError, match=message):
        parse_arch(text)


def test_target_drops_the_build_suffix() -> None:
    assert parse_target("sm_90a") == SM90
    assert str(parse_target("12.0")) == "sm_120"


@pytest.mark.parametrize(
    ("code", "gpu", "sass", "ptx"),
    [
        ("sm_90", "sm_90", True, True),
        ("sm_80", "sm_86", True, True),  # same major, higher minor
        ("sm_86", "sm_80", False, False),
        ("sm_90", "sm_120", False, True),  # SASS never crosses majors; plain PTX JITs upwards
        ("sm_90a", "sm_90", True, True),
        ("sm_120a", "sm_120", True, True),
        ("sm_120a", "sm_121", False, False),  # arch-specific: exactly that arch
        ("sm_90a", "sm_100", False, False),
        ("sm_120f", "sm_121", True, True),  # family: same major, minor at or above
        ("sm_100f", "sm_120", False, False),
        ("sm_120", "sm_90", False, False),
    ],
)
def test_compatibility_rules(code: str, gpu: str, sass: bool, ptx: bool) -> None:
    assert sass_runs_on(parse_arch(code), parse_target(gpu)) is sass
    assert ptx_jits_on(parse_arch(code), parse_target(gpu)) is ptx


def test_coverage_judges_every_unit() -> None:
    both = Unit((Code("sass", SM120), Code("sass", SM90A)))
    hopper = Unit((Code("sass", SM90A),))
    ptx = Unit((Code("ptx", Arch(8, 0), (9, 0)),))
    binary = Binary("x.so", 1, "fatbin", (both, hopper, ptx))
    on_120 = coverage(binary, SM120)
    assert (on_120.verdict, on_120.sass_units, on_120.ptx_units, on_120.missing_units) == ("no-code", 1, 1, 1)
    assert "no code for sm_120 in 1 of 3 units" in on_120.explain(binary)
    assert coverage(Binary("y.so", 1, "fatbin", (both, ptx)), SM120).verdict == "ptx-jit"
    assert coverage(Binary("z.so", 1, "fatbin", (both,)), SM90).verdict == "ok"
    assert coverage(Binary("e.so", 1, "fatbin", ()), SM90).verdict == "no-code"


# --------------------------------------------------------------------------- objects built with nvcc

KERNEL_A = "__global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }\n"
KERNEL_B = "__global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n"


def _nvcc(*args: str | Path, cwd: Path) -> None:
    assert NVCC is not None
    done = call([NVCC, *args], cwd=cwd, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"nvcc {' '.join(map(str, args))} failed:\n{done.output[-2000:]}")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny real CUDA objects, each with a known set of SASS / PTX entries."""
    if NVCC is None:
        pytest.skip("nvcc not found: cannot build CUDA test objects")
    d = tmp_path_factory.mktemp("cuda")
    (d / "a.cu").write_text(KERNEL_A)
    (d / "b.cu").write_text(KERNEL_B)
    fpic = ("-Xcompiler", "-fPIC")
    jobs: list[Callable[[], None]] = [
        # unit a: SASS sm_90a and sm_120, PTX compute_80; unit b: SASS sm_90a only
        lambda: _nvcc(
            "-c",
            *fpic,
            "-o",
            "a.o",
            "a.cu",
            "-gencode",
            "arch=compute_90a,code=sm_90a",
            "-gencode",
            "arch=compute_120,code=sm_120",
            "-gencode",
            "arch=compute_80,code=compute_80",
            cwd=d,
        ),
        lambda: _nvcc("-c", *fpic, "-o", "b.o", "b.cu", "-gencode", "arch=compute_90a,code=sm_90a", cwd=d),
        lambda: _nvcc("-c", "-o", "ptx90a.o", "a.cu", "-gencode", "arch=compute_90a,code=compute_90a", cwd=d),
        lambda: _nvcc("-cubin", "-arch=sm_90a", "-o", "k90a.cubin", "a.cu", cwd=d),
        lambda: _nvcc("-cubin", "-arch=sm_120f", "-o", "k120f.cubin", "a.cu", cwd=d),
        lambda: _nvcc("-cubin", "-arch=sm_120", "-o", "k120.cubin", "a.cu", cwd=d),
    ]
    with ThreadPoolExecutor(max_workers=3) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()
    # link with the host compiler: `nvcc -shared` would add a device-link unit built for its default arch
    cxx = shutil.which("g++") or shutil.which("gcc")
    if cxx is None:
        pytest.skip("no host C++ compiler to link the test libraries")
    for out, objs in (("libab.so", ("a.o", "b.o")), ("liba.so", ("a.o",))):
        done = call([cxx, "-shared", "-o", out, *objs], cwd=d, timeout=120)
        assert done.returncode == 0, done.output
    return {p.name: p for p in d.iterdir()}


@needs_nvcc
def test_object_units_and_coverage(built: dict[str, Path]) -> None:
    a = read_binary(built["a.o"])
    assert a is not None
    assert a.container == "fatbin"
    assert a.sass == (SM90A, SM120)
    assert a.ptx == (Arch(8, 0),)
    assert coverage(a, SM120).verdict == "ok"
    assert coverage(a, SM90).verdict == "ok"
    assert coverage(a, Arch(8, 6)).verdict == "ptx-jit"  # no sm_86 SASS, compute_80 PTX JITs
    assert coverage(a, SM100).verdict == "ptx-jit"
    assert a.units[0].codes[-1].version >= (8, 0)  # PTX ISA version, 9.0 from CUDA 13


@needs_nvcc
def test_library_with_one_unit_lacking_the_arch(built: dict[str, Path]) -> None:
    lib = read_binary(built["libab.so"])
    assert lib is not None
    on_120 = coverage(lib, SM120)
    # b.cu has SASS for sm_90a only: its kernel cannot launch on sm_120, whatever a.cu carries
    assert on_120.verdict == "no-code"
    assert on_120.missing_units >= 1
    assert on_120.sass_units >= 1
    assert coverage(lib, SM90).verdict == "ok"


@needs_nvcc
def test_arch_specific_ptx_only(built: dict[str, Path]) -> None:
    ptx = read_binary(built["ptx90a.o"])
    assert ptx is not None
    assert ptx.sass == ()
    assert ptx.ptx == (SM90A,)
    assert coverage(ptx, SM90).verdict == "ptx-jit"
    assert coverage(ptx, SM120).verdict == "no-code"  # compute_90a PTX is not forward compatible


@needs_nvcc
def test_standalone_cubins(built: dict[str, Path]) -> None:
    k90a, k120f, k120 = (read_binary(built[n]) for n in ("k90a.cubin", "k120f.cubin", "k120.cubin"))
    assert k90a is not None
    assert k90a.container == "cubin"
    assert k90a.sass == (SM90A,)
    assert k120 is not None
    assert k120.sass == (SM120,)
    # an f cubin's ELF header reads like the plain arch (cuobjdump says sm_120 too): same compatibility
    assert k120f is not None
    assert k120f.sass == (SM120,)
    assert coverage(k90a, SM90).verdict == "ok"
    assert coverage(k90a, SM120).verdict == "no-code"
    assert coverage(k120, SM121).verdict == "ok"


@needs_nvcc
@needs_cuobjdump
@pytest.mark.parametrize(
    "name", ["a.o", "b.o", "ptx90a.o", "libab.so", "k90a.cubin", "k120f.cubin", "k120.cubin"]
)
def test_matches_cuobjdump(built: dict[str, Path], name: str) -> None:
    binary = read_binary(built[name])
    assert binary is not None
    assert Counter(listing(binary)) == Counter(cuobjdump_codes(built[name], CUOBJDUMP))


# --------------------------------------------------------------------------- bad input


@needs_nvcc
def test_truncated_library(built: dict[str, Path], tmp_path: Path) -> None:
    data = built["liba.so"].read_bytes()
    for cut in (40, 64 + 10, len(data) // 2, len(data) - 100):
        short = tmp_path / f"cut{cut}.so"
        short.write_bytes(data[:cut])
        with pytest.raises(FatbinError, match="truncated"):
            read_binary(short)


@needs_nvcc
def test_library_stripped_of_its_fatbin(built: dict[str, Path], tmp_path: Path) -> None:
    objcopy = shutil.which("objcopy")
    if objcopy is None:
        pytest.skip("objcopy not found")
    stripped = tmp_path / "stripped.so"
    done = call([objcopy, "--remove-section", ".nv_fatbin", built["liba.so"], stripped])
    assert done.returncode == 0, done.output
    with pytest.raises(FatbinError, match=r"no \.nv_fatbin section .*cuobjdump"):
        read_binary(stripped)


@needs_nvcc
def test_corrupt_fatbin_header(built: dict[str, Path], tmp_path: Path) -> None:
    data = bytearray(built["a.o"].read_bytes())
    at = data.find(b"\x50\xed\x55\xba")  # the first fatbin header, little-endian magic
    assert at > 0
    data[at + 8 : at + 16] = (1 << 40).to_bytes(8, "little")  # claims a terabyte of entries
    bad = tmp_path / "bad.o"
    bad.write_bytes(bytes(data))
    with pytest.raises(FatbinError, match="truncated fatbin"):
        read_binary(bad)


def test_not_an_elf_and_unreadable(tmp_path: Path) -> None:
    text = tmp_path / "lib.so"
    text.write_text("this is a linker script, not ELF\n")
    with pytest.raises(FatbinError, match="not an ELF file"):
        read_binary(text)
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    with pytest.raises(FatbinError, match="not an ELF file"):
        read_binary(empty)
    with pytest.raises(FatbinError, match="cannot read"):
        read_binary(tmp_path / "missing.so")
    with pytest.raises(FatbinError, match="cannot read"):
        read_binary(tmp_path)


def test_host_only_elf_has_no_device_code() -> None:
    host = Path(shutil.which("ls") or "/bin/ls")
    assert read_binary(host) is None


# --------------------------------------------------------------------------- inventory


@needs_nvcc
def test_inventory_groups_copies_and_cubin_families(built: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "wheel"
    (root / "pkg" / "lib").mkdir(parents=True)
    for name in ("libx.so", "libx.so.1", "libx.so.1.2.3"):
        shutil.copy(built["liba.so"], root / "pkg" / "lib" / name)
    family = root / "pkg" / "cubins" / ("ab" * 20) / "fmha"
    family.mkdir(parents=True)
    shutil.copy(built["k90a.cubin"], family / "one.cubin")
    shutil.copy(built["k120.cubin"], family / "two.cubin")
    (root / "pkg" / "broken.so").write_bytes(b"\x7fELF" + b"\0" * 10)
    libs = {lib.relpath: lib for lib in inventory(root, "pkg")}
    assert set(libs) == {"pkg/lib/libx.so", "pkg/cubins/*/fmha", "pkg/broken.so"}
    assert libs["pkg/lib/libx.so"].aliases == ("pkg/lib/libx.so.1", "pkg/lib/libx.so.1.2.3")
    assert "truncated" in (libs["pkg/broken.so"].error or "")
    fam = libs["pkg/cubins/*/fmha"]
    # a cubin family is usable where any cubin runs: sm_90a and sm_120 cubins cover both GPUs
    assert fam.spread == "any-unit"
    verdicts = {arch: cov.verdict for arch in (SM90, SM120, SM100) if (cov := fam.coverage(arch))}
    assert verdicts == {SM90: "ok", SM120: "ok", SM100: "no-code"}


def test_loader_of_a_synthetic_sgl_kernel(tmp_path: Path) -> None:
    """A loader written like sgl-kernel's (by capability, with a fallback), evaluated for several GPUs."""
    pkg = tmp_path / "sgl_kernel"
    (pkg / "hopper").mkdir(parents=True)
    (pkg / "generic").mkdir()
    (pkg / "hopper" / "common_ops.abi3.so").write_bytes(b"")
    (pkg / "generic" / "common_ops.abi3.so").write_bytes(b"")
    (pkg / "__init__.py").write_text("from sgl_kernel.load import pick\ncommon_ops = pick()\n")
    (pkg / "load.py").write_text(
        "import glob\nfrom pathlib import Path\nimport torch\n\n"
        "def _cc():\n    major, minor = torch.cuda.get_device_capability()\n    return major * 10 + minor\n\n"
        "def pick():\n    cc = _cc()\n    sub = 'hopper' if cc in (90, 91) else 'generic'\n"
        "    found = glob.glob(str(Path(__file__).parent / sub / 'common_ops.*'))\n"
        "    return found[0] if found else None\n"
    )
    assert sgl_kernel_loader(tmp_path, SM90, "12.8").chosen == "sgl_kernel/hopper/common_ops.abi3.so"
    chosen_120 = sgl_kernel_loader(tmp_path, SM120, "12.8")
    assert chosen_120.chosen == "sgl_kernel/generic/common_ops.abi3.so"
    assert chosen_120.patterns == ("sgl_kernel/generic/common_ops.*",)
    (pkg / "generic" / "common_ops.abi3.so").unlink()
    assert sgl_kernel_loader(tmp_path, SM120, "12.8").chosen is None


# --------------------------------------------------------------------------- real wheels in the cache


def _cached_tree(dist_info_prefix: str) -> Path:
    trees = Path.home() / ".cache" / "stackfarm" / "trees"
    for tree in sorted(trees.glob("*")) if trees.is_dir() else []:
        if any(tree.glob(f"{dist_info_prefix}.dist-info")):
            return tree
    pytest.skip(f"{dist_info_prefix} is not unpacked in {trees} (run a cell that uses it first)")


def test_real_sglang_kernel_044() -> None:
    root = _cached_tree("sglang_kernel-0.4.4")
    spatial = read_binary(root / "sgl_kernel" / "spatial_ops.abi3.so")
    assert spatial is not None
    assert {str(a) for a in spatial.sass} == {
        "sm_80",
        "sm_89",
        "sm_90",
        "sm_90a",
        "sm_100a",
        "sm_103a",
        "sm_120a",
    }
    # FA3 (1.7 GB): headers only, well under a second; it carries no code an sm_120 GPU can run
    start = time.perf_counter()
    flash = read_binary(root / "sgl_kernel" / "flash_ops.abi3.so")
    elapsed = time.perf_counter() - start
    assert flash is not None
    assert {str(a) for a in flash.sass} == {"sm_80", "sm_86", "sm_90a"}
    assert flash.ptx == ()
    assert coverage(flash, SM120).verdict == "no-code"
    assert coverage(flash, SM90).verdict == "ok"
    assert elapsed < 5.0, f"reading flash_ops headers took {elapsed:.1f}s"
    assert sgl_kernel_loader(root, SM90, "13.0").chosen == "sgl_kernel/sm90/common_ops.abi3.so"
    assert sgl_kernel_loader(root, SM120, "13.0").chosen == "sgl_kernel/sm100/common_ops.abi3.so"


@needs_cuobjdump
def test_real_library_matches_cuobjdump() -> None:
    root = _cached_tree("sglang_kernel-0.4.4")
    path = root / "sgl_kernel" / "spatial_ops.abi3.so"
    binary = read_binary(path)
    assert binary is not None
    assert Counter(listing(binary)) == Counter(cuobjdump_codes(path, CUOBJDUMP))


def test_real_flashinfer_cubins_sample() -> None:
    root = _cached_tree("flashinfer_cubin-0.6.12")
    cubins = sorted((root / "flashinfer_cubin" / "cubins").rglob("*.cubin"))[:200]
    assert cubins
    archs = Counter(str(a) for path in cubins for a in (read_binary(path) or Binary("", 0, "cubin", ())).sass)
    assert set(archs) <= {"sm_100", "sm_100a", "sm_103a"}, archs
    if CUOBJDUMP is not None:
        for path in cubins[:: max(1, len(cubins) // 8)]:
            binary = read_binary(path)
            assert binary is not None
            assert Counter(listing(binary)) == Counter(cuobjdump_codes(path, CUOBJDUMP)), path
