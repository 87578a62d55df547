"""A real first-use compile: one representative flashinfer JIT module, built with the cell's CUDA toolkit for a
target arch, the way flashinfer's JIT builds it (15-toolchain's "flashinfer-compile" findings).

The module is flashinfer's rope (``gen_rope_module``: ``flashinfer/data/csrc/rope.cu``), the smallest JIT module
whose sources need only the CUDA toolkit and flashinfer's own headers (norm, sampling and the attention modules
include ``cublasLt.h``: the nvidia-cublas wheel, ~500 MB). Its nvcc command line comes from flashinfer's own
``flashinfer/jit/cpp_ext.py`` (``build_common_cflags``, ``build_cuda_cflags``, run as the release wrote them with
`relexec`: the include folders its ``jit/env.py`` names, the vendored CCCL it puts first, and the ``-gencode``
targets its ``CompilationContext`` gives on the arch), and the toolkit is the one the cell's torch pins: the
wheels (nvcc, nvvm, crt, cudart, cccl) of the ``cuda-toolkit`` release torch requires, put together as one
CUDA_HOME, as pip installs them into one ``nvidia/cu13`` folder. CUDA 12.x on PyPI has no nvcc wheel
(nvidia-cuda-nvcc-cu12 ships ptxas only), so a CUDA 12 cell's compile is unanswered, with that reason.

The object file is not kept: the result (accepted, or the first error line) is cached under the analysis cache by
the content of everything it depends on (the wheels' trees, the flags, the arch).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackfarm.analysis.arch import Arch
from stackfarm.analysis.cache import JsonCache, default_root
from stackfarm.analysis.relexec import Unresolvable, Warnings, fake_os, fake_torch, load_definitions
from stackfarm.analysis.toolchain import first_error

#: The representative module: its source, relative to the flashinfer wheel (``gen_rope_module``'s first source).
MODULE = "rope"
SOURCE = "flashinfer/data/csrc/rope.cu"
#: The cuda-toolkit extras whose wheels make a compiler: nvcc and its cicc (nvvm), host headers (crt), the runtime
#: headers (cudart), CCCL.
TOOLKIT_EXTRAS = ("nvcc", "nvvm", "crt", "cudart", "cccl")
TIMEOUT = 900


class CannotCompile(Exception):
    """The compile cannot be attempted here (no nvcc for the cell's CUDA, a wheel that cannot be had...)."""


@dataclass(frozen=True)
class CompileResult:
    ok: bool
    command: str
    error: str
    targets: tuple[str, ...]
    cached: bool


def _cache() -> JsonCache:
    return JsonCache(default_root(), "jitcompile")


def toolkit_home(wheels: list[Path], work: Path) -> Path:
    """One CUDA_HOME from the toolkit's wheels: each wheel's ``nvidia/<folder>/`` tree, linked file by file into
    one folder (hard links where the cache's filesystem allows, else copies: nvcc finds cicc beside itself)."""
    key = hashlib.sha256("\0".join(sorted(w.name for w in wheels)).encode()).hexdigest()[:24]
    home = work / f"home-{key}"
    if (home / ".complete").is_file():
        return home
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="home-", dir=work))
    for root in wheels:
        for top in sorted(p for p in (root / "nvidia").glob("*") if p.is_dir()):
            _link_tree(top, tmp)
    (tmp / ".complete").write_text("\n".join(str(w) for w in wheels), encoding="utf-8")
    try:
        tmp.rename(home)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return home


def _link_tree(top: Path, dest_root: Path) -> None:
    """Every file under `top` (``__init__.py`` aside) at the same place under `dest_root`, hard-linked (else
    copied); a file already there (from an earlier wheel) is kept."""
    for path in sorted(top.rglob("*")):
        if path.is_dir() or path.name == "__init__.py":
            continue
        dest = dest_root / path.relative_to(top)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            continue
        try:
            os.link(path, dest)
        except OSError:
            shutil.copy2(path, dest)


def _jit_env(fi_root: Path) -> SimpleNamespace:
    """flashinfer/jit/env.py's include folders (module-level ``_package_root / "data" / ...`` paths), evaluated."""
    path = fi_root / "flashinfer" / "jit" / "env.py"
    try:
        module = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError) as exc:
        raise Unresolvable(f"cannot read {path}: {exc}") from exc
    package = fi_root / "flashinfer"
    found: dict[str, Any] = {}
    for node in module.body:
        target: ast.expr
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value_node = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value_node = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id.endswith(("_DIR", "_DIRS")):
            value = _path_expr(value_node, package)
            if value is not None:
                found[target.id] = value
    return SimpleNamespace(**found)


def _path_expr(node: ast.expr, package: Path) -> Any:
    if isinstance(node, ast.Name) and node.id == "_package_root":
        return package
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _joined(node, package)
    if isinstance(node, ast.List):
        return _paths(node, package)
    return None


def _joined(node: ast.BinOp, package: Path) -> Path | None:
    """``<path> / "<name>"``, when the left side is a path and the right a string."""
    left, right = _path_expr(node.left, package), _path_expr(node.right, package)
    return left / right if isinstance(left, Path) and isinstance(right, str) else None


def _paths(node: ast.List, package: Path) -> list[Path] | None:
    """A list of paths, when every item is one."""
    items = [_path_expr(e, package) for e in node.elts]
    return items if all(isinstance(i, Path) for i in items) else None


def nvcc_flags(
    fi_root: Path,
    arch: Arch,
    release: str,
    *,
    cuda_home: Path,
    tvm_ffi_root: Path,
    environ: Mapping[str, str],
) -> tuple[list[str], tuple[str, ...]]:
    """The nvcc flags flashinfer's cpp_ext gives its JIT modules on `arch` (with $common_cflags and $cuda_home
    expanded), and the ``-gencode`` targets among them; raises `Unresolvable` when its code reads what no stand-in has."""
    version = Version(release)
    torch = fake_torch((arch.major, arch.minor))
    torch._C = SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True)  # type: ignore[attr-defined]  # PyPI torch >= 2.7: the CXX11 ABI
    os_stub = fake_os(environ)
    cpp_ext = ModuleType("flashinfer.jit.cpp_ext")
    cpp_ext.is_cuda_version_at_least = lambda v: version >= Version(v)  # type: ignore[attr-defined]
    cpp_ext.get_cuda_version = lambda: version  # type: ignore[attr-defined]
    stubs = {"flashinfer.jit.cpp_ext": cpp_ext, "os": os_stub}
    ctx_ns: dict[str, Any] = {"os": os_stub, "torch": torch, "logger": Warnings(), "__stubs__": stubs}
    ctx = load_definitions(fi_root / "flashinfer" / "compilation_context.py", ("CompilationContext",), ctx_ns)
    include = tvm_ffi_root / "tvm_ffi" / "include"
    dlpack = next(iter(sorted(tvm_ffi_root.glob("tvm_ffi/3rdparty/dlpack/include"))), include)
    tvm_ffi = SimpleNamespace(
        libinfo=SimpleNamespace(
            find_include_path=lambda: str(include), find_dlpack_include_path=lambda: str(dlpack)
        )
    )
    namespace: dict[str, Any] = {
        "os": os_stub,
        "torch": torch,
        "sysconfig": sysconfig,
        "tvm_ffi": tvm_ffi,
        "jit_env": _jit_env(fi_root),
        "Version": Version,
        "CompilationContext": ctx.get("CompilationContext"),
        "get_cuda_version": lambda: version,
        "logger": Warnings(),
        "__stubs__": stubs,
    }
    names = (
        "get_cccl_includes",
        "get_system_includes",
        "build_common_cflags",
        "build_cuda_cflags",
        "_get_glibcxx_abi_build_flags",
        "parse_env_flags",
        "is_cuda_version_at_least",
    )
    defs = load_definitions(fi_root / "flashinfer" / "jit" / "cpp_ext.py", names, namespace)
    namespace.update(defs.values)
    try:
        common = defs.get("build_common_cflags")(str(cuda_home))
        cuda = defs.get("build_cuda_cflags")(common, None)
    except Unresolvable:
        raise
    except Exception as exc:  # the release's code on a stand-in it does not accept
        raise Unresolvable(
            f"flashinfer/jit/cpp_ext.py build_cuda_cflags: {type(exc).__name__}: {exc}"
        ) from exc
    flags: list[str] = []
    for flag in cuda:
        for part in common if flag == "$common_cflags" else [flag]:
            flags += str(part).replace("$cuda_home", str(cuda_home)).split()
    return flags, tuple(f for f in flags if f.startswith("-gencode="))


def compile_module(
    fi_root: Path,
    arch: Arch,
    release: str,
    *,
    cuda_home: Path,
    tvm_ffi_root: Path,
    environ: Mapping[str, str],
) -> CompileResult:
    """nvcc (from `cuda_home`) compiles flashinfer's rope.cu for `arch` with flashinfer's own flags, cached."""
    flags, targets = nvcc_flags(
        fi_root, arch, release, cuda_home=cuda_home, tvm_ffi_root=tvm_ffi_root, environ=environ
    )
    source = fi_root / SOURCE
    nvcc = cuda_home / "bin" / "nvcc"
    command = " ".join([str(nvcc), *flags, "-c", SOURCE, "-o", f"{MODULE}.cuda.o"])
    # Keyed by what the compile reads, not by where it lies: a host's site-packages keeps its path across
    # flashinfer upgrades, so the release (its dist-info) and the source's bytes are in the key, never a folder name.
    releases = sorted(
        p.name for p in [*fi_root.glob("flashinfer*.dist-info"), *tvm_ffi_root.glob("*.dist-info")]
    )
    read = [str(fi_root), str(tvm_ffi_root), releases, hashlib.sha256(source.read_bytes()).hexdigest()]
    key = hashlib.sha256(json.dumps([*read, cuda_home.name, flags, str(arch)]).encode())
    cached = _cache().get(key.hexdigest())
    if isinstance(cached, dict) and isinstance(cached.get("ok"), bool):
        return CompileResult(cached["ok"], command, str(cached.get("error", "")), targets, True)
    if not targets:
        return CompileResult(False, command, "flashinfer's flags name no -gencode target", targets, False)
    with tempfile.TemporaryDirectory(prefix="stackfarm-jit-") as tmp:
        try:
            done = subprocess.run(
                [str(nvcc), *flags, "-c", str(source), "-o", str(Path(tmp) / "m.o")],
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                check=False,
                cwd=tmp,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CannotCompile(f"cannot run nvcc: {exc}") from exc
    ok = done.returncode == 0
    error = "" if ok else first_error(done.stderr + "\n" + done.stdout).replace(str(fi_root) + "/", "")
    _cache().put(key.hexdigest(), {"ok": ok, "error": error})
    return CompileResult(ok, command, error, targets, False)


def newest(versions: list[str], specifier: str) -> str | None:
    """The newest final release of `versions` that `specifier` admits."""
    try:
        spec = SpecifierSet(specifier)
    except InvalidSpecifier:
        return None
    good = []
    for v in versions:
        try:
            parsed = Version(v)
        except InvalidVersion:
            continue
        if not parsed.is_prerelease and parsed in spec:
            good.append(parsed)
    return str(max(good)) if good else None


Fetch = Callable[[str, str], Path]
Requires = Callable[[str, str], list[str]]
Versions = Callable[[str], list[str]]
KIND = "flashinfer-compile"


def _pin(requires: list[str], names: tuple[str, ...], extras: tuple[str, ...] = ()) -> str | None:
    from stackfarm.analysis.jitfindings import requirement_pin

    return requirement_pin(requires, names, extras)


def toolkit_wheels(torch: str, requires: Requires) -> tuple[str, list[tuple[str, str]]]:
    """The cuda-toolkit release torch `torch` pins and (distribution, version) of the wheel of each of its
    extras nvcc, nvvm, crt, cudart, cccl (`TOOLKIT_EXTRAS`); raises `CannotCompile` with the reason."""
    pinned = _pin(requires("torch", torch), ("cuda-toolkit",))
    if pinned is None:
        raise CannotCompile(
            f"torch {torch} pins no cuda-toolkit release: CUDA 12.x on PyPI has no nvcc wheel (nvidia-cuda-nvcc-cu12 "
            "ships ptxas only), so no nvcc can compile a module here (the docker backend's image CUDA has one)"
        )
    kit = requires("cuda-toolkit", pinned)
    wheels = []
    for extra in TOOLKIT_EXTRAS:
        dists = [
            r.split(";")[0].split("=")[0].strip()
            for r in kit
            if f'extra == "{extra}"' in r or f"extra == '{extra}'" in r
        ]
        version = _pin(kit, tuple(d.lower() for d in dists), (extra,)) if dists else None
        if not dists or version is None:
            raise CannotCompile(f"cuda-toolkit {pinned} names no wheel for its {extra!r} extra")
        wheels.append((dists[0], version))
    return pinned, wheels


def cell_toolkit(torch: str, fetch: Fetch, requires: Requires, work: Path) -> tuple[Path, str, str]:
    """CUDA_HOME from the wheels of the cuda-toolkit release torch `torch` pins (`toolkit_wheels`), its release
    ("13.0"), and how it was made; raises `CannotCompile` with the reason."""
    pinned, wheels = toolkit_wheels(torch, requires)
    roots = [fetch(dist, version) for dist, version in wheels]
    release = ".".join(pinned.split(".")[:2])
    return (
        toolkit_home(roots, work),
        release,
        f"cuda-toolkit {pinned} wheels ({', '.join(TOOLKIT_EXTRAS)}) as CUDA_HOME",
    )


def tvm_ffi_pin(fi_requires: list[str], versions: Versions) -> str | None:
    """The apache-tvm-ffi release flashinfer's bindings are compiled against: the newest final release the
    index has that flashinfer's requirement (`fi_requires`, its Requires-Dist) admits; None without one."""
    spec = next(
        (
            r.split(";")[0].strip()[len("apache-tvm-ffi") :]
            for r in fi_requires
            if r.lower().startswith("apache-tvm-ffi")
        ),
        None,
    )
    return newest(versions("apache-tvm-ffi"), spec or "") if spec is not None else None


# --------------------------------------------------------------------------- the wheels the runner hands over

#: The nvcc wheels a cell may carry itself (then `jitfindings.find_toolkit` fetches none).
_OWN_NVCC = ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc-cu13", "nvidia-cuda-nvcc")


class _Asked:
    """`requires`, noting each release beyond the stack whose metadata is read: the suite reads it from that
    wheel's METADATA, so it is a wheel to hand over too (noted before the index is asked: one it cannot
    answer is handed over as unavailable, with the index's reason)."""

    def __init__(self, requires: Requires, stack: Mapping[str, str]) -> None:
        self.requires, self.stack, self.asked = requires, {canonicalize_name(d) for d in stack}, list[str]()

    def __call__(self, distribution: str, version: str) -> list[str]:
        if canonicalize_name(distribution) not in self.stack:
            self.asked.append(f"{distribution}=={version}")
        return self.requires(distribution, version)


def wheels_needed(
    stack: Mapping[str, str], requires: Requires, versions: Versions, *, first_use_compile: bool
) -> tuple[str, ...]:
    """Every "name==version" 15-toolchain's analysis reads beyond the cell's `stack` (distribution -> version),
    chosen by the rules the analysis applies (`jitfindings.triton_pin`, `jitfindings.nvcc_pin`,
    `toolkit_wheels`, `tvm_ffi_pin`), with `requires` / `versions` asking the index: the Triton torch pins, the
    nvcc wheel of its CUDA release, and for the first-use compile the cuda-toolkit release with its component
    wheels and apache-tvm-ffi. What the index cannot answer (`Unavailable`) leaves that branch out; the suite
    reports it unanswered."""
    from stackfarm.analysis.jitfindings import Unavailable

    torch = stack.get("torch")
    if torch is None:
        return ()
    asked = _Asked(requires, stack)
    flashinfer = next((d for d in ("flashinfer-python", "flashinfer") if d in stack), None)
    fetched: list[str] = []
    with contextlib.suppress(Unavailable):  # the index could not answer: the suite says so, unanswered
        fetched += _jit_wheels(torch, asked, stack, flashinfer is not None)
    if first_use_compile and flashinfer is not None:
        try:
            _, kit = toolkit_wheels(torch.split("+")[0], asked)
            fetched += [f"{d}=={v}" for d, v in kit]
            if (tvm := tvm_ffi_pin(asked(flashinfer, stack[flashinfer]), versions)) is not None:
                fetched.append(f"apache-tvm-ffi=={tvm}")
        except (Unavailable, CannotCompile):
            pass
    return tuple(dict.fromkeys([*fetched, *asked.asked]))


def _jit_wheels(torch: str, requires: Requires, stack: Mapping[str, str], flashinfer: bool) -> list[str]:
    """The Triton torch pins (unless the cell has one) and, for flashinfer's JIT, the nvcc wheel of torch's
    CUDA release (unless the cell has one); raises `Unavailable`."""
    from stackfarm.analysis.jitfindings import nvcc_pin, triton_pin

    names = {canonicalize_name(d) for d in stack}
    torch_requires = requires("torch", torch)
    out = []
    if "triton" not in names and (triton := triton_pin(torch_requires)) is not None:
        out.append(f"triton=={triton}")
    if flashinfer and not names & set(_OWN_NVCC):
        out.append("==".join(nvcc_pin(torch, torch_requires, requires)))
    return out


def compile_findings(
    cell: Any,
    archs: list[Arch],
    *,
    fetch: Fetch,
    requires: Requires,
    versions: Versions,
    environ: Mapping[str, str],
) -> list[Any]:
    """One finding per arch: flashinfer's rope module compiled with the cell's toolkit for the arch."""
    from stackfarm.analysis.jitfindings import ToolFinding, Unavailable

    fi, torch = _flashinfer_and_torch(cell)
    if fi is None or not fi.root:
        return [
            ToolFinding(KIND, str(a), "flashinfer", "", MODULE, "", 0, "n/a", "the cell has no flashinfer")
            for a in archs
        ]
    component = f"{fi.distribution} {fi.version}"
    fi_root = Path(fi.root)
    if torch is None:
        return _unanswered(archs, component, "the cell has no torch, so no CUDA toolkit release is named")
    if not (fi_root / SOURCE).is_file():
        return _unanswered(archs, component, f"{SOURCE} is not in this flashinfer")
    work = default_root() / "jitcompile-homes"
    work.mkdir(parents=True, exist_ok=True)
    try:
        home, release, how = cell_toolkit(torch.version.split("+")[0], fetch, requires, work)
        tvm_root = _tvm_ffi_root(fi, fetch, requires, versions)
    except (CannotCompile, Unavailable) as exc:
        return _unanswered(archs, component, str(exc))
    if tvm_root is None:
        return _unanswered(
            archs,
            component,
            f"{component} requires no apache-tvm-ffi release this index has (its bindings' headers)",
        )
    out = []
    for arch in archs:
        try:
            result = compile_module(
                fi_root, arch, release, cuda_home=home, tvm_ffi_root=tvm_root, environ=environ
            )
        except (Unresolvable, CannotCompile) as exc:
            out.append(
                ToolFinding(
                    KIND,
                    str(arch),
                    component,
                    "",
                    MODULE,
                    SOURCE,
                    0,
                    "skip",
                    f"the first-use compile of {component}'s {MODULE} module on {arch} cannot be "
                    f"attempted: {exc}",
                )
            )
            continue
        out.append(_compiled(arch, component, result, f"nvcc {release} ({how})", how))
    return out


def _flashinfer_and_torch(cell: Any) -> tuple[Any, Any]:
    """The cell's flashinfer and torch components (None for one it lacks)."""
    fi = next((c for c in cell.components if c.distribution in ("flashinfer-python", "flashinfer")), None)
    torch = next((c for c in cell.components if c.distribution == "torch"), None)
    return fi, torch


def _unanswered(archs: list[Arch], component: str, why: str) -> list[Any]:
    """One skip per arch: the compile cannot be attempted."""
    from stackfarm.analysis.jitfindings import ToolFinding

    return [
        ToolFinding(
            KIND,
            str(a),
            component,
            "",
            MODULE,
            SOURCE,
            0,
            "skip",
            f"the first-use compile of {component}'s {MODULE} module cannot be attempted: {why}",
        )
        for a in archs
    ]


def _tvm_ffi_root(fi: Any, fetch: Fetch, requires: Requires, versions: Versions) -> Path | None:
    """The apache-tvm-ffi wheel flashinfer requires (its bindings' headers), fetched: the newest release the
    index has in its range; None when flashinfer requires none the index has."""
    tvm_version = tvm_ffi_pin(requires(fi.distribution, fi.version), versions)
    if tvm_version is None:
        return None
    return fetch("apache-tvm-ffi", tvm_version)


def _compiled(arch: Arch, component: str, result: CompileResult, nvcc: str, how: str) -> Any:
    """The finding of one compile that ran: pass, or fail with nvcc's error."""
    from stackfarm.analysis.jitfindings import ToolFinding

    what = f"{MODULE} ({SOURCE}) for {', '.join(t.removeprefix('-gencode=') for t in result.targets) or 'no target'}"
    if result.ok:
        return ToolFinding(
            KIND,
            str(arch),
            component,
            nvcc,
            what,
            SOURCE,
            0,
            "pass",
            f"{nvcc} compiles {component}'s {what} with flashinfer's own flags "
            f"(flashinfer/jit/cpp_ext.py build_cuda_cflags){' (cached)' if result.cached else ''}",
            result.command,
            note=how,
        )
    return ToolFinding(
        KIND,
        str(arch),
        component,
        nvcc,
        what,
        SOURCE,
        0,
        "fail",
        f"{nvcc} fails to compile {component}'s {what} at first use on {arch}: {result.error}",
        result.command,
        result.error,
        note=how,
    )


__all__ = [
    "KIND",
    "MODULE",
    "SOURCE",
    "TOOLKIT_EXTRAS",
    "CannotCompile",
    "CompileResult",
    "cell_toolkit",
    "compile_findings",
    "compile_module",
    "newest",
    "nvcc_flags",
    "toolkit_home",
    "toolkit_wheels",
    "tvm_ffi_pin",
    "wheels_needed",
]
