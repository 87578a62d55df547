"""05-import: can every native library of the cell load with the cell's torch, platform and driver?

Static part (any machine, no import): one testcase per shared object of the cell's components (torch's own,
sgl_kernel's per-arch ops, deep_gemm, mscclpp...), its undefined dynamic symbols resolved against the libraries
the cell ships, the platform tag's glibc/libstdc++ and the CUDA libraries the system provides
(stackfarm.analysis.abicheck). A failing one says ``<lib> cannot load with torch X: N unresolved symbols: ...``
and the likely cause (a c10/at/torch symbol: built against another torch); which other torch defines those
symbols is the `hint` property, labelled "also cached here" (it depends on the cache, never on the verdict).
Besides: the flashinfer distributions are one release, and no SONAME is shipped as two different builds.
Every check reads what is installed (import_findings: each distribution's dist-info by importlib.metadata, along
the roots the backend made and the suite's sys.path), never the versions the cell claims.

GPU part (skipped with "needs GPU: ..." elsewhere): the machine's driver against the cell's driver floor
(stackfarm.driver: the CUDA major's floor, raised by the driver-API symbols the libraries link), and a real
``dlopen`` of every library in a fresh interpreter after ``import torch``, which must agree with the static verdict;
then the fingerprint of one real process of the cell (stackfarm.provenance: SONAME, path and build-id of every
library it maps, kept in the cell's verdict), where a SONAME loaded twice or a shipped library shadowed fails.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from import_findings import findings, installed

from stackfarm.analysis.abicheck import FLASHINFER_TRIO, LibraryVerdict, flashinfer_drift
from stackfarm.cellspec import CellSpec
from stackfarm.driver import installed_driver, runs_on
from stackfarm.errors import StackfarmError
from stackfarm.proc import call
from stackfarm.provenance import PROBE, fingerprint, native_packages, parse_probe_output, save
from stackfarm.suitekit import NA, cell_runner, check_installed, need_gpu, not_applicable

#: The type of pytest's record_property fixture.
RecordProperty = Callable[[str, object], None]


def test_analysis(record_property: RecordProperty) -> None:
    """The cell's libraries could be read (an unreadable or truncated .so fails here, naming it)."""
    found = findings()
    if found.error:
        pytest.fail(found.error, pytrace=False)
    record_property("libraries", len(found.abi.libraries))
    record_property("seconds", f"{found.seconds:.3f}")
    record_property("platform", found.platform.tag)
    assert not found.abi.errors, f"{len(found.abi.errors)} libraries cannot be read: {found.abi.errors[:5]}"


def test_library_loads(native: LibraryVerdict, record_property: RecordProperty) -> None:
    """Every non-weak undefined symbol of the library is defined by the cell, the interpreter or the system."""
    found = findings()
    record_property("library", native.lib.relpath)
    record_property("component", f"{native.lib.component} {native.lib.version}")
    record_property("soname", native.lib.info.soname)
    record_property("build_id", native.lib.info.build_id)
    record_property("resolved", native.resolved)
    record_property("unresolved", len(native.unresolved))
    record_property("first_symbols", "; ".join(u.demangled for u in native.unresolved[:5]))
    record_property("system", ", ".join(f"{k}:{v}" for k, v in native.system.items()))
    if native.missing:
        record_property("missing_libraries", ", ".join(native.missing))
    if native.cause:
        record_property("cause", native.cause)
    if native.hint:
        record_property("hint", native.hint)
    if native.notes:
        record_property("notes", "; ".join(native.notes))
    if not native.ok:
        pytest.fail(native.line(found.torch), pytrace=False)


def _flashinfer_versions() -> dict[str, str]:
    """The trio's installed versions: each of them installed along the suite's path (what an import loads),
    whatever the cell says it is."""
    path = findings().path
    found = {name: installed(name, path) for name in FLASHINFER_TRIO}
    return {name: inst.version for name, inst in found.items() if inst is not None}


def test_flashinfer_components_agree(cell: CellSpec, record_property: RecordProperty) -> None:
    """flashinfer-python, flashinfer-cubin and flashinfer-jit-cache (those installed) are one release."""
    versions = _flashinfer_versions()
    claimed = {c.distribution: c.version for c in cell.components if c.distribution in FLASHINFER_TRIO}
    for name, version in sorted(claimed.items()):
        record_property(f"claimed.{name}", version)
    if not versions:
        if not claimed:
            not_applicable(NA.COMPONENT_ABSENT, "the cell has no flashinfer")
        absent = {str(d.get("component", "")) for d in cell.deviations if d.get("absent")}
        if set(claimed) <= absent:
            not_applicable(
                NA.COMPONENT_ABSENT,
                f"{', '.join(sorted(claimed))} declared absent on this host ([[deviation]])",
            )
        each = ", ".join(f"{n} {v}" for n, v in sorted(claimed.items()))
        pytest.fail(
            f"the cell names {each}, but no flashinfer distribution is installed in the Python running this "
            f"suite (looked in {', '.join(findings().path[:4])}...)",
            pytrace=False,
        )
    for name, version in sorted(versions.items()):
        record_property(name, version)
    problem = flashinfer_drift(versions)
    if problem:
        pytest.fail(problem, pytrace=False)


def test_sonames_shipped_once(record_property: RecordProperty) -> None:
    """No library SONAME (libnccl, libcudart, libnvrtc...) is shipped by two components as different builds:
    which one a process loads would depend on import order."""
    shared = findings().abi.shared
    record_property("shared", " | ".join(s.describe() for s in shared))
    different = [s for s in shared if len({b for *_, b in s.copies}) > 1]
    if different:
        pytest.fail("; ".join(s.describe() for s in different), pytrace=False)


# --------------------------------------------------------------------------- GPU


def _installed(cell: CellSpec) -> CellSpec:
    """The cell as installed (import_findings.installed_cell): the real imports below must load exactly the
    installation the static checks judged, or fail saying which one the suite's Python has instead."""
    return findings().cell or cell


def test_gpu_driver_floor(cell: CellSpec, record_property: RecordProperty) -> None:
    """The machine's NVIDIA driver is at least the cell's floor (its CUDA, and the driver API it links)."""
    need_gpu(cell)
    found = findings()
    floor = found.floor()
    if floor is None:
        if found.torch == "(not installed)":
            pytest.fail(
                "torch is not installed: the CUDA it was built for, hence the driver floor, is unknown",
                pytrace=False,
            )
        # stackfarm lacks the data: an unanswered question, not one that does not apply.
        pytest.skip(f"no driver floor is known for CUDA {found.cuda!r} (the installed torch {found.torch})")
    driver = installed_driver()
    if driver is None:
        pytest.fail("a GPU was reported but nvidia-smi gives no driver version", pytrace=False)
    runner = cell_runner(cell)  # the kind the cell is dispatched to (stackfarm.driver.route)
    forward = bool(runner and runner.forward_compat)
    record_property("driver", driver)
    record_property("cuda", found.cuda or "")
    record_property("floor", floor.driver)
    record_property("floor_reason", floor.reason)
    record_property("forward_compat", str(forward).lower())
    if runner is not None and runner.driver and runner.driver != driver:
        record_property("declared_driver", f"[runners.{runner.name}] driver = {runner.driver!r}")
    why = runs_on(driver, floor, found.cuda or "", forward_compat=forward)
    if why:
        pytest.fail(f"this machine cannot run the cell: {why}", pytrace=False)


_PROBE = """
import ctypes, os, sys
import torch
try:
    ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW | os.RTLD_LOCAL)
except OSError as exc:
    print("LOAD-FAILED:", exc)
    sys.exit(3)
print("LOADED")
"""


def test_gpu_real_import(cell: CellSpec, native: LibraryVerdict, record_property: RecordProperty) -> None:
    """dlopen the library (RTLD_NOW, as Python imports an extension) in a fresh interpreter that imported
    torch: it loads exactly when the static verdict says it does."""
    need_gpu(cell)
    check_installed(_installed(cell), ("torch",))
    try:
        done = call([sys.executable, "-c", _PROBE, str(native.lib.path)], timeout=600)
    except StackfarmError as exc:
        pytest.fail(f"cannot start {sys.executable}: {exc}", pytrace=False)
    loaded = done.returncode == 0 and "LOADED" in done.output
    record_property("library", native.lib.relpath)
    record_property("static", "loads" if native.ok else "cannot load")
    record_property("real", "loads" if loaded else "cannot load")
    tail = done.output.strip().splitlines()[-1:] or ["(no output)"]
    if loaded and not native.ok:
        pytest.fail(
            f"{native.lib.relpath} loads, but the static check says: {native.line(findings().torch)}: "
            "fix stackfarm.analysis.abicheck",
            pytrace=False,
        )
    if not loaded and native.ok:
        if done.returncode != 3:
            pytest.fail(f"probing {native.lib.relpath} failed before the load: {tail[0]}", pytrace=False)
        pytest.fail(
            f"{native.lib.relpath} does not load ({tail[0]}), the static check said it does: "
            "fix stackfarm.analysis.abicheck",
            pytrace=False,
        )


def test_gpu_loaded_libraries(cell: CellSpec, record_property: RecordProperty) -> None:
    """A fresh interpreter imports the cell's native packages and initialises CUDA: every shared library it
    maps is recorded (SONAME, path, build-id) for the verdict; one SONAME mapped as two builds, or a library
    the cell ships shadowed by another copy, fails."""
    need_gpu(cell)
    check_installed(_installed(cell), ("torch",))
    found = findings()
    if found.error:
        pytest.fail(found.error, pytrace=False)
    packages = native_packages(v.lib.relpath for v in found.abi.libraries)
    try:
        done = call([sys.executable, "-c", PROBE, *packages], timeout=600)
        data = parse_probe_output(done.output)
    except (StackfarmError, ValueError) as exc:
        pytest.fail(f"the loaded-library probe gave no answer: {exc}", pytrace=False)
    shipped: dict[str, list[tuple[str, Path]]] = {}
    for v in found.abi.libraries:
        if v.lib.info.soname:  # an extension module without one is opened by its path: it cannot be shadowed
            shipped.setdefault(v.lib.info.soname, []).append((v.lib.component, v.lib.path))
    roots = sorted({Path(c.root) for c in _installed(cell).components if c.root})
    owners = {v.lib.path: v.lib.component for v in found.abi.libraries}  # extension modules too
    fp = fingerprint(
        data["paths"], shipped, roots, errors=data["errors"], device=data["device"], owners=owners
    )
    out = os.environ.get("STACKFARM_SUITE_OUT")
    if out:
        save(Path(out), fp)
    origins: dict[str, int] = {}
    for lib in fp.libraries:
        origins[lib.origin] = origins.get(lib.origin, 0) + 1
    record_property("imported", " ".join(packages))
    record_property("device", fp.device)
    record_property("loaded", len(fp.libraries))
    record_property("origins", ", ".join(f"{k}:{n}" for k, n in sorted(origins.items())))
    if fp.notes:
        record_property("notes", "; ".join(fp.notes)[:4000])
    if fp.errors:
        record_property("errors", "; ".join(f"{k}: {v}" for k, v in sorted(fp.errors.items()))[:2000])
    problems = list(fp.problems) + [
        f"import {k} failed: {v}" for k, v in sorted(fp.errors.items()) if k in packages
    ]
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)
