"""suites/05-import run as stackfarm runs it (pytest in a subprocess, JUnit read back): on tiny cc-built cells
(fast) and on the default matrix's real cells from the artifact cache (integration)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from xml.etree import ElementTree

import pytest

from stackfarm.cellspec import CellSpec, InstalledComponent
from stackfarm.matrix import load as load_matrix
from stackfarm.suitekit import NOT_APPLICABLE
from test_elfsyms import (
    C10_CHECK,
    C10_ERROR,
    build_so,
    c10_source,
    component,
    needs_cc,
    real_component,
    uses_source,
)

REPO = Path(__file__).resolve().parents[1]
Cases = dict[str, dict[str, str]]


def run_suite(
    tmp_path: Path, cell: CellSpec, *, cache: Path | None = None, pythonpath: Path | None = None
) -> Cases:
    """Run the suite on `cell`; `pythonpath` is put on the suite's sys.path (a host's site-packages)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "cell.json"
    spec.write_text(json.dumps(asdict(cell)))
    junit = tmp_path / "junit.xml"
    env = {**os.environ, "STACKFARM_CELL": str(spec)}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH", "")) if p)
    if cache is not None:
        env["STACKFARM_CACHE"] = str(cache)
    else:
        env.pop("STACKFARM_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(REPO / "suites" / "05-import"), f"--junitxml={junit}",
         "-q", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestWarning"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    cases: Cases = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        failure = case.find("failure")
        skipped = case.find("skipped")
        result = failure if failure is not None else skipped
        props["outcome"] = "failed" if failure is not None else "skipped" if skipped is not None else "passed"
        message = result.get("message", "") if result is not None else ""
        props["message"] = message.removeprefix("Failed: ")
        cases[case.get("name", "")] = props
    return cases


def _cell(
    components: tuple[InstalledComponent, ...], torch: str, cuda: str = "12.8", backend: str = "local"
) -> CellSpec:
    return CellSpec(id="synthetic", values={"torch": torch, "cuda": cuda}, backend=backend, components=components,
                    no_gpu_reason="no GPU in unit tests")  # fmt: skip


def _dist_info(root: Path, name: str, version: str) -> None:
    """An installed distribution as pip leaves it (METADATA; no RECORD: its root is scanned for libraries)."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@needs_cc
def test_suite_on_a_tiny_cell(tmp_path: Path) -> None:
    torch = tmp_path / "torch"
    c10 = build_so(torch / "torch/lib/libc10.so", c10_source(C10_ERROR), soname="libc10.so")
    kern = tmp_path / "kern"
    build_so(kern / "sgl_kernel/good.abi3.so", uses_source(C10_ERROR), links=(c10,))
    build_so(kern / "sgl_kernel/bad.abi3.so", uses_source(C10_ERROR, C10_CHECK), links=(c10,))
    _dist_info(torch, "torch", "2.11.0")
    _dist_info(kern, "sgl-kernel", "0.3.21")
    fi, cubin = tmp_path / "fi", tmp_path / "cubin"
    _dist_info(fi, "flashinfer-python", "0.6.11")
    _dist_info(cubin, "flashinfer-cubin", "0.6.11")
    _dist_info(
        fi, "flashinfer-jit-cache", "0.6.9+cu129"
    )  # installed beside flashinfer-python, not a component
    # The cell claims other torch and kernel versions than its trees hold: the checks name the installed ones.
    cell = _cell((component(torch, "torch", "2.12.0"), component(kern, "sgl-kernel", "0.3.22", "sgl_kernel"),
                  component(fi, "flashinfer-python", "0.6.11", "flashinfer"),
                  component(cubin, "flashinfer-cubin", "0.6.11", "flashinfer")), "2.12.0")  # fmt: skip
    cases = run_suite(tmp_path / "run", cell, cache=tmp_path / "cache")

    good = cases["test_library_loads[sgl-kernel-sgl_kernel/good.abi3.so]"]
    assert good["outcome"] == "passed"
    assert good["unresolved"] == "0"
    bad = cases["test_library_loads[sgl-kernel-sgl_kernel/bad.abi3.so]"]
    assert bad["outcome"] == "failed"
    assert bad["library"] == "sgl_kernel/bad.abi3.so"
    assert bad["component"] == "sgl-kernel 0.3.21"
    assert bad["unresolved"] == "1"
    assert bad["message"].startswith(
        "sgl_kernel/bad.abi3.so cannot load with torch 2.11.0: 1 unresolved symbol: "
    )
    assert "built against another torch than torch 2.11.0" in bad["message"]
    assert "\n" not in bad["message"]

    trio = cases["test_flashinfer_components_agree"]
    assert trio["outcome"] == "failed"
    assert "flashinfer-jit-cache 0.6.9+cu129" in trio["message"]
    assert cases["test_analysis"]["outcome"] == "passed"
    assert cases["test_sonames_shipped_once"]["outcome"] == "passed"
    gpu = [c for name, c in cases.items() if "gpu" in name]
    assert gpu
    assert all(c["outcome"] == "skipped" and "needs GPU: no GPU in unit tests" in c["message"] for c in gpu)


def _host_cell(site: Path, claims: dict[str, str]) -> CellSpec:
    """A host cell: every component's root is the host's site-packages, its version what the cell claims."""
    return _cell(tuple(component(site, name, version, "flashinfer") for name, version in claims.items()),
                 "2.9.1", backend="host")  # fmt: skip


def test_host_trio_judges_the_installed_versions(tmp_path: Path) -> None:
    """A host whose site-packages holds flashinfer-python 0.6.7.post2 beside flashinfer-cubin 0.6.3, for a
    cell that claims 0.6.3 for both: the trio check fails naming what is installed (it used to pass on the
    cell's claims)."""
    site = tmp_path / "site-packages"
    _dist_info(site, "flashinfer-python", "0.6.7.post2")
    _dist_info(site, "flashinfer-cubin", "0.6.3")
    cell = _host_cell(site, {"flashinfer-python": "0.6.3", "flashinfer-cubin": "0.6.3"})
    trio = run_suite(tmp_path / "run", cell, cache=tmp_path / "c")["test_flashinfer_components_agree"]
    assert trio["outcome"] == "failed"
    assert "flashinfer-python 0.6.7.post2, flashinfer-cubin 0.6.3" in trio["message"]
    assert (trio["flashinfer-python"], trio["flashinfer-cubin"]) == ("0.6.7.post2", "0.6.3")
    assert trio["claimed.flashinfer-python"] == "0.6.3"


def test_host_trio_reads_the_suites_sys_path(tmp_path: Path) -> None:
    """A distribution installed in the suite's Python (its sys.path), not under any root of the cell, is read
    too; one release installed everywhere passes, whatever the cell claims."""
    site, other = tmp_path / "site-packages", tmp_path / "user-site"
    _dist_info(site, "flashinfer-python", "0.6.12")
    _dist_info(site, "flashinfer-cubin", "0.6.12")
    cell = _host_cell(site, {"flashinfer-python": "0.6.3", "flashinfer-cubin": "0.6.3"})
    cases = run_suite(tmp_path / "ok", cell, cache=tmp_path / "c")
    assert cases["test_flashinfer_components_agree"]["outcome"] == "passed"
    _dist_info(other, "flashinfer-jit-cache", "0.6.9+cu129")
    trio = run_suite(tmp_path / "run", cell, cache=tmp_path / "c", pythonpath=other)
    assert trio["test_flashinfer_components_agree"]["outcome"] == "failed"
    assert "flashinfer-jit-cache 0.6.9+cu129" in trio["test_flashinfer_components_agree"]["message"]


def test_claimed_flashinfer_installed_nowhere_fails(tmp_path: Path) -> None:
    """The cell names flashinfer, nothing of it is installed: not "does not apply" (which leaves a cell green)
    but a failure saying so."""
    site = tmp_path / "site-packages"
    site.mkdir()
    cell = _host_cell(site, {"flashinfer-python": "0.6.3"})
    trio = run_suite(tmp_path / "run", cell, cache=tmp_path / "c")["test_flashinfer_components_agree"]
    assert trio["outcome"] == "failed"
    assert "no flashinfer distribution is installed" in trio["message"]


def test_suite_without_flashinfer_is_not_applicable(tmp_path: Path) -> None:
    empty = tmp_path / "torch"
    empty.mkdir()
    cases = run_suite(
        tmp_path / "run", _cell((component(empty, "torch", "2.9.1"),), "2.9.1"), cache=tmp_path / "c"
    )
    assert cases["test_flashinfer_components_agree"]["outcome"] == "skipped"
    assert cases["test_flashinfer_components_agree"]["message"].startswith(NOT_APPLICABLE)


# --------------------------------------------------------------------------- the default matrix's real cells

_FLASHINFER = {"0.6.3", "0.6.7.post2", "0.6.12"}


def _real_cell(
    torch: str, kernel: tuple[str, str], flashinfer: tuple[str, str], sglang: str, cuda: str
) -> CellSpec:
    comps = (real_component("torch", torch), real_component(*kernel),
             real_component("flashinfer-python", flashinfer[0]), real_component("flashinfer-cubin", flashinfer[1]),
             real_component("sglang", sglang))  # fmt: skip
    return CellSpec(id=f"cu{cuda}-torch{torch}-sk{kernel[1]}-fi{flashinfer[0]}-sgl{sglang}",
                    values={"torch": torch, "cuda": cuda, "sglang": sglang}, backend="local", components=comps,
                    no_gpu_reason="no GPU in the integration tests", platform=load_matrix(REPO / "matrix.toml").platform)  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize(
    ("torch", "kernel", "flashinfer", "sglang", "cuda"),
    [
        ("2.9.1", ("sgl-kernel", "0.3.21"), ("0.6.3", "0.6.3"), "0.5.9", "12.8"),
        ("2.9.1", ("sglang-kernel", "0.4.1"), ("0.6.7.post2", "0.6.7.post2"), "0.5.10", "12.8"),
        ("2.9.1", ("sgl-kernel", "0.3.21"), ("0.6.3", "0.6.3"), "0.5.10", "12.8"),  # the [[include]] cell
        ("2.11.0", ("sglang-kernel", "0.4.4"), ("0.6.12", "0.6.12"), "0.5.15", "13.0"),  # the H200 stack
    ],
)  # fmt: skip
def test_default_cells_pass(
    tmp_path: Path, torch: str, kernel: tuple[str, str], flashinfer: tuple[str, str], sglang: str, cuda: str
) -> None:
    """The default matrix's cells that the artifact cache holds (its cu130 torch 2.9.1 cells come from the
    PyTorch index) pass 05-import: SGLang's pins are ABI-consistent."""
    cell = _real_cell(torch, kernel, flashinfer, sglang, cuda)
    cases = run_suite(tmp_path, cell)
    failed = {n: c["message"] for n, c in cases.items() if c["outcome"] == "failed"}
    assert not failed, failed
    libs = [c for n, c in cases.items() if n.startswith("test_library_loads[")]
    assert len(libs) >= 18
    assert any(c["library"] == "sgl_kernel/sm90/common_ops.abi3.so" for c in libs)
    assert float(cases["test_analysis"]["seconds"]) < 5.0


@pytest.mark.integration
def test_mismatched_kernel_fails_in_the_suite(tmp_path: Path) -> None:
    cell = _real_cell("2.11.0", ("sgl-kernel", "0.3.21"), ("0.6.12", "0.6.12"), "0.5.15", "13.0")
    cases = run_suite(tmp_path, cell)
    case = cases["test_library_loads[sgl-kernel-sgl_kernel/sm90/common_ops.abi3.so]"]
    assert case["outcome"] == "failed"
    assert case["unresolved"] == "2"
    assert case["message"].startswith(
        "sgl_kernel/sm90/common_ops.abi3.so cannot load with torch 2.11.0: 2 unresolved symbols: "
    )
    assert "c10_cuda_check_implementation" in case["message"]
    # The cause does not depend on what else lies in the cache: which other torch defines the symbols is a hint
    # of its own (from a declared comparison set, else labelled "also cached here"), never in the failure line.
    assert case["message"].rstrip().endswith("(built against another torch than torch 2.11.0)")
    assert "defined in torch" not in case["message"]


@pytest.mark.integration
def test_flashinfer_trio_mismatch_fails_in_the_suite(tmp_path: Path) -> None:
    cell = _real_cell("2.11.0", ("sglang-kernel", "0.4.4"), ("0.6.12", "0.6.7.post2"), "0.5.15", "13.0")
    case = run_suite(tmp_path, cell)["test_flashinfer_components_agree"]
    assert case["outcome"] == "failed"
    assert "flashinfer-python 0.6.12, flashinfer-cubin 0.6.7.post2" in case["message"]
