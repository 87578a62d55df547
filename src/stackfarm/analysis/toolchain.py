"""The compilers a cell JIT-compiles with at first use, found in its wheels, and whether each accepts a target.

Two toolchains run when a cell first meets a GPU: Triton's bundled ``ptxas`` (in the triton wheel that the
cell's torch pins) and the CUDA toolkit's ``nvcc``/``ptxas`` that flashinfer's JIT calls. `toolkit_for`
finds the toolkit: a real one on the machine for the docker and host backends ($CUDA_HOME, /usr/local/cuda),
else the cell's own nvcc wheel, else the ``nvidia-cuda-nvcc`` wheel of the CUDA release the cell's torch pins
(``nvidia-cuda-nvrtc-cu12==V`` -> ``nvidia-cuda-nvcc-cu12==V``; ``cuda-toolkit==V`` -> its ``nvcc`` extra).
That wheel is a stand-in for the image's toolkit of the same release on a machine that has none: its ptxas is
the release's ptxas (the cu12 wheels carry ptxas only; the cu13 ones nvcc as well).

`probe` assembles a tiny PTX kernel for one target with one compiler, exactly the way the requester invokes
it (the argv it builds), and keeps the answer in the analysis cache keyed by the compiler's bytes, the argv
and the PTX text: a warm run assembles nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from stackfarm.analysis.cache import JsonCache, default_root

#: The newest PTX ISA each CUDA release's ptxas reads (NVIDIA's PTX ISA release notes, "PTX ISA version").
PTX_ISA = {
    "11.8": "7.8",
    "12.0": "8.0",
    "12.1": "8.1",
    "12.2": "8.2",
    "12.3": "8.3",
    "12.4": "8.4",
    "12.5": "8.5",
    "12.6": "8.5",
    "12.8": "8.7",
    "12.9": "8.8",
    "13.0": "9.0",
    "13.1": "9.1",
    "13.2": "9.2",
}

_CACHE_NAMESPACE = "toolchain-probe-1"
_RELEASE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")


class ToolchainError(Exception):
    """A compiler that cannot be run or read: the compile cannot be attempted (unanswered)."""


@dataclass(frozen=True)
class Compiler:
    """One compiler binary: ``ptxas`` or ``nvcc``, its release ("12.8") and full version ("12.8.93")."""

    name: str
    path: Path
    #: Where it comes from, for the finding ("triton 3.5.1 wheel", "nvidia-cuda-nvcc-cu12 12.8.93 wheel").
    origin: str
    release: str
    version: str

    def describe(self) -> str:
        return f"{self.name} {self.version} ({self.origin})"


@functools.cache
def _file_digest(path: Path, size: int, mtime_ns: int) -> str:
    del size, mtime_ns  # the memo key: a replaced file is hashed again
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_digest(path: Path) -> str:
    st = path.stat()
    return _file_digest(path, st.st_size, st.st_mtime_ns)


def _cache() -> JsonCache:
    return JsonCache(default_root(), _CACHE_NAMESPACE)


def compiler_at(path: Path, origin: str) -> Compiler:
    """The compiler at `path`, its version read from ``--version`` (cached by the binary's content)."""
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ToolchainError(f"{path} is not an executable file")
    key = hashlib.sha256(f"version\0{file_digest(path)}".encode()).hexdigest()
    text = _cache().get(key)
    if not isinstance(text, str):
        try:
            done = subprocess.run(
                [str(path), "--version"], capture_output=True, text=True, timeout=60, check=False
            )
        except OSError as exc:
            raise ToolchainError(f"cannot run {path} --version: {exc}") from exc
        text = done.stdout + done.stderr
        if _RELEASE.search(text):
            _cache().put(key, text)
    found = _RELEASE.search(text)
    if found is None:
        raise ToolchainError(f"{path} --version does not name a CUDA release: {text.strip()[:200]!r}")
    return Compiler(path.name, path, origin, found.group(1), found.group(2))


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    #: The command as the requester runs it (the PTX file named ``probe.ptx``).
    command: str
    #: The first error line the compiler printed ("" when it accepted the target).
    error: str


#: A PTX conversion flashinfer's FP4 (e2m1) kernels emit on Blackwell (CUTLASS's numeric_conversion.h in its
#: wheel): ptxas accepts it on arch-specific and family targets only (flashinfer#1966 on plain sm_120).
FP4_BODY = """  .reg .f32 %f<3>;
  .reg .b8 %c;
  ld.param.f32 %f1, [a];
  ld.param.f32 %f2, [b];
  cvt.rn.satfinite.e2m1x2.f32 %c, %f1, %f2;
"""


def probe_ptx(isa: str, target: str, body: str = "") -> str:
    """A one-kernel PTX module for `target` (the ``.target`` directive) at ISA `isa`."""
    return (
        f".version {isa}\n.target {target}\n.address_size 64\n\n"
        f".visible .entry stackfarm_probe(.param .f32 a, .param .f32 b)\n{{\n{body}  ret;\n}}\n"
    )


def first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    marked = [ln for ln in lines if "error" in ln.lower() or "fatal" in ln.lower()]
    return (marked or lines or ["(no output)"])[0]


def probe(compiler: Compiler, args: tuple[str, ...], ptx: str) -> ProbeResult:
    """Compile `ptx` with ``compiler *args probe.ptx -o probe.cubin`` (cached by content)."""
    command = " ".join([str(compiler.path), *args, "probe.ptx", "-o", "probe.cubin"])
    digests = [file_digest(compiler.path)]
    sibling = compiler.path.with_name("ptxas")
    if compiler.name != "ptxas" and sibling.is_file():  # nvcc runs the ptxas beside it
        digests.append(file_digest(sibling))
    key = hashlib.sha256(json.dumps([digests, list(args), ptx]).encode()).hexdigest()
    cached = _cache().get(key)
    if isinstance(cached, dict) and isinstance(cached.get("ok"), bool):
        return ProbeResult(cached["ok"], command, str(cached.get("error", "")))
    with tempfile.TemporaryDirectory(prefix="stackfarm-probe-") as tmp:
        src = Path(tmp) / "probe.ptx"
        src.write_text(ptx, encoding="utf-8")
        try:
            done = subprocess.run(
                [str(compiler.path), *args, str(src), "-o", str(Path(tmp) / "probe.cubin")],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                cwd=tmp,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ToolchainError(f"cannot run {command}: {exc}") from exc
    ok = done.returncode == 0
    error = "" if ok else first_error(done.stderr + "\n" + done.stdout).replace(str(src), "probe.ptx")
    _cache().put(key, {"ok": ok, "error": error})
    return ProbeResult(ok, command, error)


@dataclass(frozen=True)
class Toolkit:
    """The CUDA toolkit flashinfer's JIT would call: its ptxas, and nvcc where the toolkit carries it."""

    ptxas: Compiler
    nvcc: Compiler | None
    #: How it was chosen (a real toolkit, the cell's wheel, or the stand-in wheel for the image's).
    why: str


def toolkit_in(bin_dir: Path, origin: str, why: str) -> Toolkit:
    """The toolkit whose binaries are in `bin_dir` (ptxas required, nvcc optional)."""
    ptxas = compiler_at(bin_dir / "ptxas", origin)
    nvcc_path = bin_dir / "nvcc"
    nvcc = compiler_at(nvcc_path, origin) if nvcc_path.is_file() else None
    return Toolkit(ptxas, nvcc, why)


def wheel_bin_dir(root: Path) -> Path | None:
    """The bin folder of an unpacked nvidia-cuda-nvcc wheel (nvidia/cuda_nvcc/bin in cu12, nvidia/cu13/bin)."""
    found = sorted(root.glob("nvidia/*/bin/ptxas"))
    return found[0].parent if found else None


def machine_toolkit() -> Path | None:
    """The bin folder of a CUDA toolkit installed on this machine ($CUDA_HOME, then /usr/local/cuda)."""
    for home in (os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "ptxas").is_file():
            return Path(home) / "bin"
    return None


def ptx_isa(release: str) -> str:
    if release not in PTX_ISA:
        raise ToolchainError(
            f"no PTX ISA version known for CUDA {release}: add it to stackfarm.analysis.toolchain.PTX_ISA"
        )
    return PTX_ISA[release]


__all__ = [
    "FP4_BODY",
    "PTX_ISA",
    "Compiler",
    "ProbeResult",
    "ToolchainError",
    "Toolkit",
    "compiler_at",
    "file_digest",
    "first_error",
    "machine_toolkit",
    "probe",
    "probe_ptx",
    "ptx_isa",
    "toolkit_in",
    "wheel_bin_dir",
]
