"""jitcompile: the first-use compile of a flashinfer JIT module with the cell's toolkit (a stand-in nvcc here; the
real one in test_toolchain_wheels)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from stackfarm.analysis.arch import parse_target
from stackfarm.analysis.jitcompile import CannotCompile, cell_toolkit, compile_module, newest, toolkit_home

# flashinfer's shapes, cut down: env.py's include folders, cpp_ext.py's flag builders, the CompilationContext.
ENV = """\
import pathlib
_package_root = pathlib.Path(__file__).parent.parent
FLASHINFER_INCLUDE_DIR: pathlib.Path = _package_root / "data" / "include"
CCCL_INCLUDE_DIRS: list[pathlib.Path] = [_package_root / "data" / "cccl" / "cub"]
"""
CPP_EXT = """\
def get_system_includes(cuda_home):
    return ["$cuda_home/include", tvm_ffi.libinfo.find_include_path(), jit_env.FLASHINFER_INCLUDE_DIR]

def build_common_cflags(cuda_home, extra_include_dirs=None):
    flags = ["-D_GLIBCXX_USE_CXX11_ABI=" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI))]
    flags += [f"-I{p}" for p in jit_env.CCCL_INCLUDE_DIRS]
    return flags + [f"-isystem {d}" for d in get_system_includes(cuda_home)]

def build_cuda_cflags(common_cflags, extra_cuda_cflags=None):
    flags = ["$common_cflags", "--expt-relaxed-constexpr"]
    if get_cuda_version() >= Version("12.8"):
        flags += ["-static-global-template-stub=false"]
    return flags + CompilationContext().get_nvcc_flags_list()
"""
CONTEXT = """\
class CompilationContext:
    def __init__(self):
        major, minor = torch.cuda.get_device_capability()
        self.target = f"{major}{minor}a"

    def get_nvcc_flags_list(self):
        return [f"-gencode=arch=compute_{self.target},code=sm_{self.target}"]
"""
NVCC = """\
#!/bin/sh
# a stand-in nvcc: refuses sm_120a the way a toolkit that does not know it would
for a in "$@"; do case "$a" in *sm_120a*) echo "nvcc fatal   : Unsupported gpu architecture 'compute_120a'" >&2; exit 1;; esac; done
echo "$@" > "$(dirname "$0")/../last-call"
"""


def _flashinfer(tmp_path: Path) -> Path:
    root = tmp_path / "fi"
    for rel, text in {"flashinfer/jit/env.py": ENV, "flashinfer/jit/cpp_ext.py": CPP_EXT,
                      "flashinfer/compilation_context.py": CONTEXT, "flashinfer/data/csrc/rope.cu": "// rope\\n"}.items():  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


def _home(tmp_path: Path) -> Path:
    nvcc = tmp_path / "home" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(NVCC)
    nvcc.chmod(0o755)
    return tmp_path / "home"


def test_flashinfers_own_flags_and_the_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKFARM_CACHE", str(tmp_path / "cache"))
    fi, home, tvm = _flashinfer(tmp_path), _home(tmp_path), tmp_path / "tvm"
    ok = compile_module(fi, parse_target("sm_90"), "13.0", cuda_home=home, tvm_ffi_root=tvm, environ={})
    assert ok.ok, ok.error
    assert ok.targets == ("-gencode=arch=compute_90a,code=sm_90a",)
    call = (home / "last-call").read_text()
    assert f"-I{fi}/flashinfer/data/cccl/cub" in call
    assert f"-isystem {home}/include" in call  # $cuda_home expanded
    assert "-D_GLIBCXX_USE_CXX11_ABI=1 " in call
    assert "-static-global-template-stub=false" in call
    bad = compile_module(fi, parse_target("sm_120"), "13.0", cuda_home=home, tvm_ffi_root=tvm, environ={})
    assert not bad.ok
    assert bad.error == "nvcc fatal   : Unsupported gpu architecture 'compute_120a'"
    again = compile_module(fi, parse_target("sm_120"), "13.0", cuda_home=home, tvm_ffi_root=tvm, environ={})
    assert (again.cached, again.ok, again.error) == (True, False, bad.error)


def test_a_cached_compile_is_never_another_releases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same folder (a host's site-packages) holding another flashinfer, or another rope.cu: compiled again,
    never the cached verdict of what lay there before."""
    monkeypatch.setenv("STACKFARM_CACHE", str(tmp_path / "cache"))
    fi, home, tvm = _flashinfer(tmp_path), _home(tmp_path), tmp_path / "tvm"
    (fi / "flashinfer_python-0.6.11.dist-info").mkdir()
    first = compile_module(fi, parse_target("sm_90"), "13.0", cuda_home=home, tvm_ffi_root=tvm, environ={})
    assert not first.cached
    assert compile_module(
        fi, parse_target("sm_90"), "13.0", cuda_home=home, tvm_ffi_root=tvm, environ={}
    ).cached
    (fi / "flashinfer_python-0.6.11.dist-info").rename(fi / "flashinfer_python-0.6.12.dist-info")
    upgraded = compile_module(fi, parse_target("sm_90"), "13.0", cuda_home=home, tvm_ffi_root=tvm, environ={})
    assert not upgraded.cached
    (fi / "flashinfer/data/csrc/rope.cu").write_text("// rope, edited\n")
    edited = compile_module(fi, parse_target("sm_90"), "13.0", cuda_home=home, tvm_ffi_root=tvm, environ={})
    assert not edited.cached


def test_cuda_12_has_no_nvcc_wheel(tmp_path: Path) -> None:
    def requires(dist: str, version: str) -> list[str]:
        return ["nvidia-cuda-nvrtc-cu12==12.8.93; platform_system == 'Linux'"]

    with pytest.raises(CannotCompile, match=r"CUDA 12\.x on PyPI has no nvcc wheel"):
        cell_toolkit("2.9.1", lambda d, v: tmp_path, requires, tmp_path)


def test_the_toolkit_wheels_become_one_home(tmp_path: Path) -> None:
    wheels = []
    for name, rel in (("nvcc", "bin/nvcc"), ("nvvm", "nvvm/bin/cicc"), ("cudart", "include/cuda_runtime.h")):
        root = tmp_path / name
        (root / "nvidia" / "cu13" / rel).parent.mkdir(parents=True)
        (root / "nvidia" / "cu13" / rel).write_text(name)
        wheels.append(root)
    home = toolkit_home(wheels, tmp_path / "work")
    assert (home / "bin" / "nvcc").read_text() == "nvcc"
    assert (home / "nvvm" / "bin" / "cicc").is_file()
    assert (home / "include" / "cuda_runtime.h").is_file()
    assert toolkit_home(wheels, tmp_path / "work") == home  # made once


def test_newest_admitted_release() -> None:
    assert (
        newest(["0.1.5", "0.1.7", "0.1.8", "0.1.9", "0.2.0", "0.1.10rc1"], ">=0.1.6,<0.2,!=0.1.8") == "0.1.9"
    )
    assert newest(["0.2.0"], ">=0.1.6,<0.2") is None
