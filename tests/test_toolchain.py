"""15-toolchain on synthetic trees (fast): release definitions run with stand-ins (relexec), the pins that name a
cell's toolchain, compile probes against a scripted ptxas, and the suite end to end with its JUnit read back.

The scripted ptxas stands in for NVIDIA's binary here only (the real wheels' ptxas run in
tests/test_toolchain_wheels.py): it prints a release like the real one and rejects what ptxas 12.8 rejects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import asdict, replace
from pathlib import Path
from xml.etree import ElementTree

import pytest

from stackfarm.analysis.arch import parse_target
from stackfarm.analysis.jitfindings import Unavailable, analyse, flashinfer_targets, requirement_pin
from stackfarm.analysis.relexec import Unresolvable, load_definitions
from stackfarm.analysis.toolchain import compiler_at, probe, probe_ptx, toolkit_in
from stackfarm.cellspec import CellSpec, InstalledComponent

REPO = Path(__file__).resolve().parents[1]

#: ptxas 12.8's answers on the inputs these tests give it: sm_121a is unknown, e2m1x2 needs an arch-specific target.
PTXAS = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release {release}, V{version}"; exit 0; fi
echo run >> "$(dirname "$0")/calls"
[ "{release}" = "12.8" ] && for a in "$@"; do case "$a" in *sm_121a*) echo "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'" >&2; exit 255;; esac; done
for a in "$@"; do case "$a" in *.ptx)
  if grep -q e2m1x2 "$a" && grep -q '^.target sm_120$' "$a"; then
    echo "ptxas $a, line 11; error   : Instruction 'cvt with .e2m1x2' not supported on .target 'sm_120'" >&2
    echo "ptxas fatal   : Ptx assembly aborted due to errors" >&2; exit 255; fi;;
esac; done
exit 0
"""


def _ptxas(bin_dir: Path, release: str = "12.8", version: str = "12.8.93", name: str = "ptxas") -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(PTXAS.format(release=release, version=version))
    path.chmod(0o755)
    return path


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKFARM_CACHE", str(tmp_path / "cache"))


def test_definitions_run_as_written_with_stand_ins(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(textwrap.dedent("""\
        import sys
        raise SystemExit("module statements never run")
        def arch(cap):
            return f"sm_{cap}{'a' if cap >= 90 else ''}"
        def reads():
            from other.module import thing
            return thing
        """))  # fmt: skip
    defs = load_definitions(src, ("arch", "reads", "missing"), {})
    assert defs.get("arch")(120) == "sm_120a"
    assert defs.lines == {"arch": 3, "reads": 5}
    with pytest.raises(Unresolvable, match=r"imports other\.module, which no stand-in provides"):
        defs.get("reads")()
    with pytest.raises(Unresolvable, match="defines no top-level missing"):
        defs.get("missing")


def test_pins_name_the_toolchain() -> None:
    torch = ["nvidia-cuda-nvrtc-cu12==12.8.93; platform_system == 'Linux' and platform_machine == 'x86_64'",
             'triton==3.5.1; platform_system == "Linux"', "triton==9.9; platform_system == 'Windows'"]  # fmt: skip
    assert requirement_pin(torch, ("triton",)) == "3.5.1"
    assert requirement_pin(torch, ("nvidia-cuda-nvrtc-cu12",)) == "12.8.93"
    kit = ["nvidia-cuda-nvcc==13.0.88.*; sys_platform == 'linux' and extra == 'nvcc'"]
    assert requirement_pin(kit, ("nvidia-cuda-nvcc",)) is None  # only with the extra asked for
    assert requirement_pin(kit, ("nvidia-cuda-nvcc",), ("nvcc",)) == "13.0.88"


def test_probe_reports_the_first_error_and_caches(tmp_path: Path) -> None:
    ptxas = compiler_at(_ptxas(tmp_path / "bin"), "test wheel")
    assert (ptxas.release, ptxas.version) == ("12.8", "12.8.93")
    bad = probe(ptxas, ("--gpu-name=sm_121a",), probe_ptx("8.7", "sm_121"))
    assert not bad.ok
    assert bad.error == "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'"
    assert bad.command.endswith("ptxas --gpu-name=sm_121a probe.ptx -o probe.cubin")
    again = probe(ptxas, ("--gpu-name=sm_121a",), probe_ptx("8.7", "sm_121"))
    assert again == bad
    assert (tmp_path / "bin" / "calls").read_text().count("run") == 1  # the second answer came from the cache
    assert probe(ptxas, ("--gpu-name=sm_120a",), probe_ptx("8.7", "sm_120")).ok


# flashinfer 0.6.3's CompilationContext (its shape: suffix "a" from major 9 at JIT time, the list as given).
FI_063 = """
import os
import torch
import logging
logger = logging.getLogger(__name__)
class CompilationContext:
    COMMON_NVCC_FLAGS = ["-DFLASHINFER_ENABLE_FP4_E2M1"]
    def __init__(self):
        self.TARGET_CUDA_ARCHS = set()
        if "FLASHINFER_CUDA_ARCH_LIST" in os.environ:
            for arch in os.environ["FLASHINFER_CUDA_ARCH_LIST"].split(" "):
                major, minor = arch.split(".")
                self.TARGET_CUDA_ARCHS.add((int(major), str(minor)))
        else:
            try:
                for device in range(torch.cuda.device_count()):
                    major, minor = torch.cuda.get_device_capability(device)
                    if major >= 9:
                        minor = str(minor) + "a"
                    self.TARGET_CUDA_ARCHS.add((int(major), str(minor)))
            except Exception as e:
                logger.warning(f"Failed to get device capability: {e}.")
    def get_nvcc_flags_list(self, supported_major_versions=None):
        archs = self.TARGET_CUDA_ARCHS
        if len(archs) == 0:
            raise RuntimeError(f"No supported CUDA architectures found for major versions {supported_major_versions}.")
        return [f"-gencode=arch=compute_{a}{b},code=sm_{a}{b}" for a, b in archs] + self.COMMON_NVCC_FLAGS
"""
# 0.6.7's normalisation: SM 12.x -> "0f", refused below CUDA 12.9 (the error is swallowed at JIT time).
FI_067 = FI_063.replace('''                    if major >= 9:
                        minor = str(minor) + "a"
                    self.TARGET_CUDA_ARCHS.add((int(major), str(minor)))''', '''                    self.TARGET_CUDA_ARCHS.add(self._normalize_cuda_arch(major, minor))''').replace(
    "                self.TARGET_CUDA_ARCHS.add((int(major), str(minor)))",
    "                self.TARGET_CUDA_ARCHS.add(self._normalize_cuda_arch(int(major), int(minor)))",
).replace(
    "    def get_nvcc_flags_list", '''    @staticmethod
    def _normalize_cuda_arch(major, minor):
        if major == 12:
            from flashinfer.jit.cpp_ext import is_cuda_version_at_least
            if is_cuda_version_at_least("12.9"):
                return (major, "0f")
            raise RuntimeError("SM 12.x requires CUDA >= 12.9")
        return (major, str(minor) + "a") if major >= 9 else (major, str(minor))
    def get_nvcc_flags_list''')  # fmt: skip


def _flashinfer(root: Path, source: str, version: str) -> InstalledComponent:
    (root / "flashinfer").mkdir(parents=True)
    (root / "flashinfer" / "compilation_context.py").write_text(source)
    return InstalledComponent(axis="flashinfer", distribution="flashinfer-python", version=version, filename="",
                              sha256="", source="", root=str(root))  # fmt: skip


def test_flashinfer_targets_per_mode(tmp_path: Path) -> None:
    kit128 = toolkit_in(_ptxas(tmp_path / "k128" / "bin").parent, "kit", "test")
    kit130 = toolkit_in(_ptxas(tmp_path / "k130" / "bin", "13.0", "13.0.88").parent, "kit", "test")
    old = Path(_flashinfer(tmp_path / "063", FI_063, "0.6.3").root)
    new = Path(_flashinfer(tmp_path / "067", FI_067, "0.6.7").root)
    sm120 = parse_target("sm_120")
    assert flashinfer_targets(old, sm120, "jit", kit128, {})[0] == [("compute_120a", "sm_120a")]
    assert flashinfer_targets(old, sm120, "aot", kit128, {})[0] == [("compute_120", "sm_120")]
    assert flashinfer_targets(new, sm120, "aot", kit130, {})[0] == [("compute_120f", "sm_120f")]
    with pytest.raises(
        RuntimeError, match=r"No supported CUDA .*logged: Failed to get device capability: SM 12"
    ):
        flashinfer_targets(new, sm120, "jit", kit128, {})


def _triton(root: Path, blackwell: bool) -> None:
    """A triton tree: compiler.py's three deciding functions as 3.5 / 3.6 write them, and the bundled bin/."""
    nvidia = root / "triton" / "backends" / "nvidia"
    get = ("def get_ptxas(arch):\n    return knobs.nvidia.ptxas_blackwell if arch >= 100 else knobs.nvidia.ptxas\n"
           if blackwell else "def get_ptxas():\n    return knobs.nvidia.ptxas\n")  # fmt: skip
    nvidia.mkdir(parents=True)
    (nvidia / "compiler.py").write_text("from triton import knobs\n" + get + textwrap.dedent("""\
        @functools.lru_cache()
        def ptx_get_version(cuda_version):
            major, minor = map(int, cuda_version.split('.'))
            return 80 + minor - 1 if major == 12 and minor >= 6 else 90 + minor
        def sm_arch_from_capability(capability: int):
            suffix = "a" if capability >= 90 else ""
            return f"sm_{capability}{suffix}"
        """))  # fmt: skip
    _ptxas(nvidia / "bin")
    if blackwell:
        _ptxas(nvidia / "bin", "12.9", "12.9.86", name="ptxas-blackwell")


def _cell(
    tmp_path: Path, triton_blackwell: bool, fi_source: str, fi_version: str, nvcc: bool = True
) -> CellSpec:
    comps = [_flashinfer(tmp_path / "fi", fi_source, fi_version)]
    _triton(tmp_path / "triton", triton_blackwell)
    comps.append(InstalledComponent(axis="triton", distribution="triton", version="3.x", filename="", sha256="",
                                    source="", root=str(tmp_path / "triton")))  # fmt: skip
    if nvcc:
        _ptxas(tmp_path / "nvcc" / "nvidia" / "cuda_nvcc" / "bin")
        comps.append(InstalledComponent(axis="toolchain", distribution="nvidia-cuda-nvcc-cu12", version="12.8.93",
                                        filename="", sha256="", source="", root=str(tmp_path / "nvcc")))  # fmt: skip
    return CellSpec(id="synthetic", values={"cuda": "12.8"}, backend="local", components=tuple(comps),
                    archs=("sm_121", "sm_120", "sm_90"))  # fmt: skip


def _no_fetch(distribution: str, version: str) -> Path:
    raise Unavailable(f"{distribution}=={version}: offline in this test")


def test_analyse_outcomes(tmp_path: Path) -> None:
    cell = _cell(tmp_path, triton_blackwell=False, fi_source=FI_063, fi_version="0.6.3")
    found = {f.id: f for f in analyse(cell, _no_fetch, lambda d, v: [], {"flashinfer_modes": ["jit", "aot"]})}
    assert found["triton-sm_121"].outcome == "fail"
    assert "rejects sm_121a, which triton 3.x asks for on sm_121 (triton/backends/nvidia/compiler.py:" in (
        found["triton-sm_121"].message
    )
    assert found["triton-sm_120"].outcome == "pass"
    assert found["flashinfer-jit-sm_120"].outcome == "pass"
    aot = found["flashinfer-aot-sm_120"]
    assert (aot.outcome, aot.target) == ("fail", "compute_120/sm_120")
    assert (
        aot.error
        == "ptxas probe.ptx, line 11; error   : Instruction 'cvt with .e2m1x2' not supported on .target 'sm_120'"
    )
    assert found["flashinfer-aot-sm_90"].outcome == "pass"
    fixed = _cell(tmp_path / "fixed", triton_blackwell=True, fi_source=FI_063, fi_version="0.6.3")
    assert {f.id: f.outcome for f in analyse(fixed, _no_fetch, lambda d, v: [], {})}[
        "triton-sm_121"
    ] == "pass"


def test_no_toolkit_is_unanswered(tmp_path: Path) -> None:
    """Without an nvcc wheel and without a torch to name one, flashinfer's compiles are not attempted: skip."""
    cell = _cell(tmp_path, triton_blackwell=False, fi_source=FI_063, fi_version="0.6.3", nvcc=False)
    found = {f.id: f for f in analyse(cell, _no_fetch, lambda d, v: [], {})}
    assert found["flashinfer-jit-sm_120"].outcome == "skip"
    assert "no CUDA toolkit for flashinfer-python 0.6.3's JIT" in found["flashinfer-jit-sm_120"].message


def run_suite(tmp_path: Path, cell: CellSpec) -> dict[str, dict[str, str]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "cell.json"
    spec.write_text(json.dumps(asdict(cell)))
    junit = tmp_path / "junit.xml"
    env = {**os.environ, "STACKFARM_CELL": str(spec)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(REPO / "suites" / "15-toolchain"), f"--junitxml={junit}", "-q",
         "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestWarning"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    cases = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        failure, skipped = case.find("failure"), case.find("skipped")
        props["outcome"] = "failed" if failure is not None else "skipped" if skipped is not None else "passed"
        cases[case.get("name", "")] = props
    return cases


def test_suite_end_to_end(tmp_path: Path) -> None:
    cell = _cell(tmp_path, triton_blackwell=False, fi_source=FI_067, fi_version="0.6.7")
    cell = replace(cell, settings={"15-toolchain": {"compile": True}})
    cases = run_suite(tmp_path / "run", cell)
    # the first-use compile runs through the suite: this cell has no torch, so no toolkit release: unanswered
    compile_case = cases["test_finding[flashinfer-compile-sm_120]"]
    assert compile_case["outcome"] == "skipped"
    assert "the cell has no torch" in compile_case["detail"]
    assert cases["test_finding[triton-sm_121]"]["outcome"] == "failed"
    assert cases["test_finding[triton-sm_121]"]["target"] == "sm_121a"
    assert cases["test_finding[triton-sm_90]"]["outcome"] == "passed"
    jit = cases["test_finding[flashinfer-jit-sm_120]"]
    assert jit["outcome"] == "failed"
    assert "SM 12.x requires CUDA >= 12.9" in jit["detail"]
    assert jit["toolkit"] == "the cell's nvcc wheel"
    assert cases["test_finding[flashinfer-jit-sm_90]"]["outcome"] == "passed"
    suite = ElementTree.parse(tmp_path / "run" / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    props = {
        str(p.get("name")): str(p.get("value"))
        for p in suite.iter("property")
        if (p.get("name") or "").startswith("toolchain.")
    }
    assert props["toolchain.sm_121.toolchain"].startswith("failed (")
    # sm_90's compilers accept it, but the unanswered compile keeps its toolchain verdict from "passed"
    assert props["toolchain.sm_90.toolchain"] == "unanswered (1 of 3)"
    # the suite's record (family.py), beside its JUnit file: what the report renders, the same verdicts
    record = json.loads((tmp_path / "run" / "15-toolchain.json").read_text())
    assert (record["schema"], record["family"]) == (1, "15-toolchain")
    archs = {a["arch"]: a for a in record["record"]["archs"]}
    assert archs["sm_121"]["toolchain"] == props["toolchain.sm_121.toolchain"]
    assert archs["sm_90"]["toolchain"] == "unanswered (1 of 3)"
    found = {f["testcase"]: f for f in record["record"]["findings"]}
    assert set(found) == set(cases), "one finding per testcase, named as JUnit names it"
    assert found["test_finding[triton-sm_121]"]["target"] == "sm_121a"
    assert found["test_finding[flashinfer-jit-sm_120]"]["toolkit"] == "the cell's nvcc wheel"


# sglang#37105's shape: a selector written as `device_sm_major >= 10` routes every Blackwell to an sm100-only
# kernel, whose generator (flashinfer's, by its supported majors) refuses sm_120.
SELECTION_TREE = {
    "sel/__init__.py": "",
    "sel/args.py": """\
        import torch
        from sel.support import is_sm90
        from elsewhere import is_flashinfer_available
        class ServerArgs:
            def pick_backend(self, use_mla):
                device_sm_major = torch.cuda.get_device_capability()[0]
                if device_sm_major >= 10:
                    return "trtllm_mla"
                if is_sm90():
                    return "fa3"
                return "flashinfer" if is_flashinfer_available() else "triton"
        """,
    "sel/support.py": """\
        import torch
        def is_sm90():
            return torch.cuda.get_device_capability()[0] == 9
        """,
    "sel/gen.py": """\
        import torch
        def gen_trtllm_module():
            major = torch.cuda.get_device_capability()[0]
            if major not in [10, 11]:
                raise RuntimeError(f"No supported CUDA architectures found for major versions [10, 11].")
            return "spec"
        """,
}


def _selection_cell(tmp_path: Path) -> CellSpec:
    root = tmp_path / "tree"
    for rel, text in SELECTION_TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    comp = InstalledComponent(axis="sglang", distribution="sglang", version="0.0", filename="", sha256="",
                              source="", root=str(root))  # fmt: skip
    return CellSpec(id="sel", values={"cuda": "12.8"}, backend="local", components=(comp,),
                    archs=("sm_120", "sm_100", "sm_90", "sm_80"))  # fmt: skip


SELECTORS = {"attention": {"selector": "sel.args:ServerArgs.pick_backend",
                           "admits": {"trtllm_mla": "sel.gen:gen_trtllm_module"}}}  # fmt: skip


def test_selection_names_the_selector_and_the_refusing_gate(tmp_path: Path) -> None:
    from stackfarm.analysis.backendsel import cell_choices

    found = {f.id: f for f in cell_choices(_selection_cell(tmp_path), SELECTORS)}
    bad = found["selection-attention-trtllm_mla-sm_120"]
    assert bad.outcome == "fail"
    assert bad.message.startswith(
        "sel.args:ServerArgs.pick_backend can choose 'trtllm_mla' on sm_120 (sel/args.py:8: returns), but "
        "sel.gen:gen_trtllm_module does not admit sm_120 (sel/gen.py:"
    )
    assert found["selection-attention-trtllm_mla-sm_100"].outcome == "pass"
    assert found["selection-attention-fa3-sm_90"].outcome == "n/a"  # no gate declared for fa3: not asked
    assert "selection-attention-trtllm_mla-sm_90" not in found  # the selector cannot pick it there
    assert "selection-attention-fa3-sm_120" not in found
    # A choice of literals on an unknown condition: both are possible (none is dropped as unknown).
    assert found["selection-attention-flashinfer-sm_80"].outcome == "n/a"
    assert found["selection-attention-triton-sm_80"].line == 11


def test_toolkit_from_torchs_cuda_pins(tmp_path: Path) -> None:
    """No nvcc in the cell: the nvcc wheel of the release torch's NVRTC pin names (cu13 naming here), fetched;
    a cell whose CUDA differs from that release says so in the toolkit note."""
    from stackfarm.analysis.jitfindings import find_toolkit

    info = tmp_path / "torch" / "torch-2.9.1+cu130.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text("Name: torch\nRequires-Dist: nvidia-cuda-nvrtc==13.0.48; "
                                         "platform_system == 'Linux'\n")  # fmt: skip
    torch = InstalledComponent(axis="torch", distribution="torch", version="2.9.1+cu130", filename="", sha256="",
                               source="", root=str(tmp_path / "torch"))  # fmt: skip
    asked = []

    def fetch(distribution: str, version: str) -> Path:
        asked.append((distribution, version))
        _ptxas(tmp_path / "nvcc" / "nvidia" / "cu13" / "bin", "13.0", "13.0.48")
        return tmp_path / "nvcc"

    cell = CellSpec(id="c", values={"cuda": "12.8"}, backend="local", components=(torch,))
    kit = find_toolkit(cell, fetch, lambda d, v: [])
    assert asked == [("nvidia-cuda-nvcc", "13.0.48")]
    assert kit.ptxas.version == "13.0.48"
    assert kit.why.endswith("NOTE: the cell's CUDA is 12.8, this toolkit is 13.0")


def test_triton_installed_beside_torch_is_the_one_judged(tmp_path: Path) -> None:
    """A site-packages root (docker, host) holding the pinned triton: that copy is judged, nothing is fetched."""
    site = tmp_path / "site"
    (site / "torch-2.9.1.dist-info").mkdir(parents=True)
    (site / "torch-2.9.1.dist-info" / "METADATA").write_text("Name: torch\nRequires-Dist: triton==3.5.1\n")
    (site / "triton-3.5.1.dist-info").mkdir()
    _triton(site, blackwell=False)
    torch = InstalledComponent(axis="torch", distribution="torch", version="2.9.1", filename="", sha256="",
                               source="", root=str(site))  # fmt: skip
    cell = CellSpec(id="c", values={}, backend="docker", components=(torch,), archs=("sm_120", "sm_121"))
    found = {f.id: f for f in analyse(cell, _no_fetch, lambda d, v: [], {}) if f.kind == "triton"}
    assert found["triton-sm_120"].outcome == "pass"
    assert found["triton-sm_121"].outcome == "fail"
    assert found["triton-sm_121"].component == "triton 3.5.1"


@pytest.mark.parametrize(
    ("metadata", "outcome"),
    [
        (None, "skip"),  # torch's METADATA unreadable: which Triton it brings is unknown
        ("Name: torch\nRequires-Dist: triton>=3.5\n", "skip"),  # a range, not one release
        ("Name: torch\nRequires-Dist: filelock\n", "n/a"),  # read, and no Triton at all
    ],
)
def test_an_unreadable_triton_pin_is_unanswered_not_absent(
    tmp_path: Path, metadata: str | None, outcome: str
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    if metadata is not None:
        (site / "torch-2.9.1.dist-info").mkdir()
        (site / "torch-2.9.1.dist-info" / "METADATA").write_text(metadata)
    torch = InstalledComponent(axis="torch", distribution="torch", version="2.9.1", filename="", sha256="",
                               source="", root=str(site))  # fmt: skip
    cell = CellSpec(id="c", values={}, backend="local", components=(torch,), archs=("sm_120",))
    found = [f for f in analyse(cell, _no_fetch, lambda d, v: [], {}) if f.kind == "triton"]
    assert [f.outcome for f in found] == [outcome]
