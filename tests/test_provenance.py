"""stackfarm.provenance: the loaded-library fingerprint of a real process, its duplicate and shadowing flags,
and its way into the cell's verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stackfarm import provenance, verdict
from stackfarm.analysis.elfsyms import read_elf
from stackfarm.verdict import CellReport, Status
from test_elfsyms import build_so, needs_cc

_LOADER = "import ctypes, sys\nfor p in sys.argv[1:]: ctypes.CDLL(p)\nsys.argv[1:] = []\n"


def _probe(*load: Path) -> dict[str, Any]:
    """Run the real probe in a fresh interpreter that first dlopens `load` (by path)."""
    done = subprocess.run(
        [sys.executable, "-c", _LOADER + provenance.PROBE, *map(str, load)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return provenance.parse_probe_output(done.stdout)


@pytest.fixture
def two_builds(tmp_path: Path) -> tuple[Path, Path]:
    """Two different builds of one SONAME, in two folders."""
    a = build_so(tmp_path / "cell" / "libdup.so.1", "int f(void){return 1;}", soname="libdup.so.1")
    b = build_so(
        tmp_path / "sys" / "libdup.so.1",
        "int f(void){return 2;} int g(void){return 3;}",
        soname="libdup.so.1",
    )
    assert read_elf(a).build_id != read_elf(b).build_id
    return a, b


@needs_cc
def test_a_real_process_lists_its_libraries_with_build_ids(two_builds: tuple[Path, Path]) -> None:
    cell_copy, _ = two_builds
    data = _probe(cell_copy)
    fp = provenance.fingerprint(data["paths"], {"libdup.so.1": [("kernels", cell_copy)]}, [cell_copy.parent])
    by_soname = {lib.soname: lib for lib in fp.libraries}
    assert by_soname["libdup.so.1"].origin == "kernels"
    assert by_soname["libdup.so.1"].build_id == read_elf(cell_copy).build_id
    assert by_soname["libc.so.6"].origin == "system"
    assert by_soname["libc.so.6"].build_id
    assert fp.problems == ()


@needs_cc
def test_one_soname_loaded_as_two_builds_is_a_duplicate(two_builds: tuple[Path, Path]) -> None:
    a, b = two_builds
    data = _probe(a, b)
    fp = provenance.fingerprint(data["paths"], {"libdup.so.1": [("kernels", a)]}, [a.parent])
    assert len(fp.duplicates) == 1
    assert "libdup.so.1 is loaded twice" in fp.duplicates[0]
    assert str(a) in fp.duplicates[0]
    assert str(b) in fp.duplicates[0]
    assert fp.shadowed == ()  # the cell's copy is loaded too: reported once, as the duplicate


@needs_cc
def test_a_shipped_library_loaded_from_elsewhere_is_shadowed(two_builds: tuple[Path, Path]) -> None:
    a, b = two_builds
    data = _probe(b)
    fp = provenance.fingerprint(data["paths"], {"libdup.so.1": [("kernels", a)]}, [a.parent])
    assert fp.duplicates == ()
    assert len(fp.shadowed) == 1
    assert f"ships libdup.so.1 at {a}" in fp.shadowed[0]
    assert str(b) in fp.shadowed[0]


def test_an_unreadable_mapping_is_an_error_not_dropped(tmp_path: Path) -> None:
    bogus = tmp_path / "libnot.so"
    bogus.write_bytes(b"not an elf")
    fp = provenance.fingerprint([str(bogus)], {})
    assert fp.libraries == ()
    assert str(bogus) in fp.errors


def test_probe_output_without_its_line_is_an_error() -> None:
    with pytest.raises(ValueError, match="STACKFARM-LOADED"):
        provenance.parse_probe_output("Traceback ...\nImportError: x\n")


def test_native_packages_are_the_libraries_top_folders() -> None:
    rel = [
        "sgl_kernel/sm90/common_ops.abi3.so",
        "torch/lib/libtorch.so",
        "nvidia/nccl/lib/libnccl.so.2",
        "flashinfer_cubin/x.so",
        "torch.libs/libgomp.so",
        "top.so",
    ]
    assert provenance.native_packages(rel) == ["torch", "flashinfer_cubin", "sgl_kernel"]


@needs_cc
def test_the_record_travels_into_the_verdict(two_builds: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = two_builds
    data = _probe(a)
    fp = provenance.fingerprint(data["paths"], {"libdup.so.1": [("kernels", a)]}, [a.parent])
    folder = tmp_path / "reports" / "c1"
    provenance.save(folder, fp)
    loaded = provenance.read_libraries(folder)
    assert {lib.soname for lib in loaded} >= {"libdup.so.1", "libc.so.6"}
    report = CellReport(cell="c1", status=Status.PASSED, loaded_libraries=loaded)
    back = verdict.from_json(json.loads(json.dumps(verdict.to_json(report))))
    assert back.loaded_libraries == loaded
    assert back.properties["provenance.loaded_libraries"] == str(len(loaded))


def test_no_record_means_no_libraries(tmp_path: Path) -> None:
    assert provenance.read_libraries(tmp_path) == ()


@needs_cc
def test_a_duplicate_outside_the_cells_libraries_is_a_note(two_builds: tuple[Path, Path]) -> None:
    a, b = two_builds  # e.g. a wheel's vendored libz beside the system's: neither is the cell's
    fp = provenance.fingerprint(_probe(a, b)["paths"], {})
    assert fp.duplicates == ()
    assert len(fp.notes) == 1
    assert "libdup.so.1 is loaded twice" in fp.notes[0]


@needs_cc
def test_extension_modules_without_a_soname_never_collide(tmp_path: Path) -> None:
    """Python extension modules have no DT_SONAME and are opened by path: same file names are no duplicate."""
    a = build_so(tmp_path / "pkg_a" / "_speedups.so", "int f(void){return 1;}")
    b = build_so(tmp_path / "pkg_b" / "_speedups.so", "int f(void){return 2;}")
    fp = provenance.fingerprint(_probe(a, b)["paths"], {})
    assert {lib.path for lib in fp.libraries if not lib.soname} >= {str(a), str(b)}
    assert fp.problems == ()
    assert fp.notes == ()


@needs_cc
def test_an_extension_module_of_a_component_is_attributed_to_it(tmp_path: Path) -> None:
    ops = build_so(tmp_path / "sgl_kernel" / "common_ops.abi3.so", "int f(void){return 1;}")
    fp = provenance.fingerprint(_probe(ops)["paths"], {}, [tmp_path], owners={ops: "sglang-kernel"})
    assert {lib.path: lib.origin for lib in fp.libraries}[str(ops)] == "sglang-kernel"
