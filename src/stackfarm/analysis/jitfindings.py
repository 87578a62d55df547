"""15-toolchain's analysis: for each target arch, what Triton and flashinfer will ask their compilers for at
first use, read from their own source, and whether the cell's compilers accept it (`toolchain.probe`).

Triton (the version the cell's torch pins): ``sm_arch_from_capability`` names the ``--gpu-name``, ``get_ptxas``
picks the bundled binary (3.6 adds ``ptxas-blackwell`` for capability >= 100), ``ptx_get_version`` the PTX ISA;
all three are run as the release wrote them (`relexec`) with the arch's capability. flashinfer: its
``CompilationContext`` (flashinfer/compilation_context.py) is built the two ways flashinfer builds it: at JIT
time from the device's capability ("jit"), and from ``FLASHINFER_CUDA_ARCH_LIST="<major>.<minor>"`` as an AOT
build of flashinfer-jit-cache is told ("aot"); ``get_nvcc_flags_list()`` gives the ``-gencode`` flags, which
the toolkit (`toolchain.toolkit_in`) compiles: nvcc with exactly that flag where the toolkit has nvcc, else its
ptxas for the code target. A Blackwell target also assembles the FP4 conversion flashinfer's kernels emit.

Outcomes: pass (every compile accepted), fail (a compile rejected, or flashinfer's own arch logic gives no
target: the finding names the compiler and version, the target, the deciding source line, the command and its
first error line), skip (the compile cannot be attempted: no wheel, no compiler, unreadable source), n/a (the
cell has no such component).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from stackfarm.analysis.arch import Arch, ArchError, parse_target
from stackfarm.analysis.relexec import Unresolvable, Warnings, fake_os, fake_torch, load_definitions
from stackfarm.analysis.toolchain import (
    FP4_BODY,
    Compiler,
    ToolchainError,
    Toolkit,
    compiler_at,
    machine_toolkit,
    probe,
    probe_ptx,
    ptx_isa,
    toolkit_in,
    wheel_bin_dir,
)
from stackfarm.cellspec import CellSpec, InstalledComponent, dist_info
from stackfarm.errors import Unavailable  # a wheel the analysis needs cannot be had here: unanswered

Outcome = Literal["pass", "fail", "skip", "n/a"]
#: Fetches an unpacked wheel (distribution, version) -> root; raises `Unavailable` when it cannot.
Fetch = Callable[[str, str], Path]
#: Reads a distribution's metadata Requires-Dist (distribution, version) -> requirements.
Requires = Callable[[str, str], list[str]]
#: How 15-toolchain may ask flashinfer for its kernels: JIT at first use, and the AOT build.
MODES = ("jit", "aot")
_ENV = {"platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux", "os_name": "posix"}


#: torch's pin on NVRTC names the CUDA release; the nvcc wheel of that release has the same version.
_NVRTC_TO_NVCC = {
    "nvidia-cuda-nvrtc-cu12": "nvidia-cuda-nvcc-cu12",
    "nvidia-cuda-nvrtc-cu11": "nvidia-cuda-nvcc-cu11",
    "nvidia-cuda-nvrtc": "nvidia-cuda-nvcc",
}


class NoTarget(RuntimeError):
    """flashinfer's own arch logic gives nvcc no target for the arch (its message, and the deciding line)."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class ToolFinding:
    kind: str  # "triton" | "flashinfer-jit" | "flashinfer-aot" | "toolkit"
    arch: str
    component: str  # "triton 3.5.1", "flashinfer-python 0.6.3"
    compiler: str  # Compiler.describe(), "" when none was found
    target: str  # what the compiler is asked for ("sm_120a", "compute_120f/sm_120f")
    file: str
    line: int
    outcome: Outcome
    message: str
    command: str = ""
    error: str = ""
    #: Which toolkit was used and why (a stand-in wheel says so).
    note: str = ""
    #: What else tells findings of one kind and arch apart ("<selector>-<backend>" for a selection).
    name: str = ""

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.name}-{self.arch}" if self.name else f"{self.kind}-{self.arch}"


def requirement_pin(requires: list[str], names: tuple[str, ...], extras: tuple[str, ...] = ()) -> str | None:
    """The version a ``==`` requirement on one of `names` pins (markers for Linux x86_64; ``==V.*`` -> V)."""
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.lower() not in names or not _applies(req, extras):
            continue
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if pins:
            return pins[0].removesuffix(".*")
    return None


def _applies(req: Requirement, extras: tuple[str, ...]) -> bool:
    """The requirement's marker holds on Linux x86_64 with one of `extras` (none: no extra)."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**_ENV, "extra": e}) for e in (extras or ("",)))


def _metadata_requires(comp: InstalledComponent) -> list[str]:
    info = dist_info(comp)
    if info is None or not (info / "METADATA").is_file():
        return []
    text = (info / "METADATA").read_text(encoding="utf-8", errors="replace")
    return [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist:")]


def _triton_unknown(torch: InstalledComponent) -> str | None:
    """Why torch's Triton cannot be told (its METADATA unreadable, or a Triton requirement without an == pin), or
    None when torch's metadata is read and requires no Triton at all (then Triton is absent: n/a)."""
    info = dist_info(torch)
    if info is None or not (info / "METADATA").is_file():
        return f"torch {torch.version}'s METADATA cannot be read here, so which Triton it brings is unknown"
    named = [r for r in _metadata_requires(torch) if r.split(";")[0].strip().lower().startswith("triton")]
    if named:
        return f"torch {torch.version} requires {named[0]!r}, not one Triton release: which ptxas JITs is unknown"
    return None


def _find(cell: CellSpec, names: tuple[str, ...]) -> InstalledComponent | None:
    return next((c for c in cell.components if c.distribution.lower() in names), None)


def find_toolkit(cell: CellSpec, fetch: Fetch, requires: Requires) -> Toolkit:
    """The toolkit flashinfer's JIT uses in this cell (module docstring of `toolchain`); raises `Unavailable`."""
    present = _present_toolkit(cell)
    if present is not None:
        return present
    torch = _find(cell, ("torch",))
    if torch is None:
        raise Unavailable("the cell has no torch to read its CUDA release from, and no nvcc wheel")
    dist, version = _nvcc_of(_metadata_requires(torch), requires)
    if version is None:
        raise Unavailable(
            f"torch {torch.version}'s metadata pins no nvidia-cuda-nvrtc(-cu12/-cu11) / cuda-toolkit release"
        )
    root = fetch(dist, version)
    bin_dir = wheel_bin_dir(root)
    if bin_dir is None:
        raise Unavailable(f"the {dist} {version} wheel has no nvidia/*/bin/ptxas")
    why = (
        f"stand-in for the image's CUDA toolkit: the {dist} wheel of the CUDA release torch {torch.version} "
        "pins (this machine has no toolkit of the cell's)"
    )
    return _noted(toolkit_in(bin_dir, f"{dist} {version} wheel", why), cell, why)


def _present_toolkit(cell: CellSpec) -> Toolkit | None:
    """The toolkit the cell already has: the machine's (docker, host backends), else its own nvcc wheel's."""
    if cell.backend in ("docker", "host"):
        found = machine_toolkit()
        if found is not None:
            return toolkit_in(
                found, f"toolkit at {found.parent}", f"the {cell.backend} backend's CUDA toolkit"
            )
    own = _find(cell, ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc-cu13", "nvidia-cuda-nvcc"))
    if own is not None and own.root and (bin_dir := wheel_bin_dir(Path(own.root))) is not None:
        return toolkit_in(bin_dir, f"{own.distribution} {own.version} wheel", "the cell's nvcc wheel")
    return None


def _nvcc_of(pins: list[str], requires: Requires) -> tuple[str, str | None]:
    """The nvcc wheel (distribution, version) of the CUDA release torch pins: by its nvrtc pin, else through
    its cuda-toolkit pin's own nvcc requirement."""
    for nvrtc, nvcc in _NVRTC_TO_NVCC.items():  # nvrtc and nvcc of one CUDA release share the version
        if (version := requirement_pin(pins, (nvrtc,))) is not None:
            return nvcc, version
    if (kit := requirement_pin(pins, ("cuda-toolkit",))) is not None:
        return "nvidia-cuda-nvcc", requirement_pin(
            requires("cuda-toolkit", kit), ("nvidia-cuda-nvcc",), ("nvcc",)
        )
    return "", None


def _noted(toolkit: Toolkit, cell: CellSpec, why: str) -> Toolkit:
    """The stand-in toolkit, its `why` noting when its CUDA is not the cell's."""
    cuda = cell.values.get("cuda", "")
    if (
        cuda and cuda != toolkit.ptxas.release
    ):  # the image carries the cell's CUDA: the stand-in is another one
        note = f"{why}; NOTE: the cell's CUDA is {cuda}, this toolkit is {toolkit.ptxas.release}"
        toolkit = replace(toolkit, why=note)
    return toolkit


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- Triton


class _Tool:
    """Triton's ``knobs.NvidiaTool`` as its env_nvidia_tool builds it: TRITON_<NAME>_PATH, else the bundled bin/."""

    def __init__(self, knob: str, root: Path, environ: Mapping[str, str]) -> None:
        binary = knob.replace("_", "-")
        env = environ.get(f"TRITON_{knob.upper()}_PATH")
        self.path = env if env else str(root / "triton" / "backends" / "nvidia" / "bin" / binary)
        self.compiler = compiler_at(
            Path(self.path), f"triton {binary}" if not env else f"TRITON_{knob.upper()}_PATH"
        )
        self.version = self.compiler.release


def _triton_knobs(root: Path, environ: Mapping[str, str]) -> SimpleNamespace:
    class _Nvidia:
        mock_ptx_version = None

        def __getattr__(self, knob: str) -> _Tool:
            return _Tool(knob, root, environ)

    return SimpleNamespace(nvidia=_Nvidia())


def triton_finding(arch: Arch, root: Path, version: str, environ: Mapping[str, str]) -> ToolFinding:
    """What Triton `version` (unpacked at `root`) runs ptxas with on `arch`, and whether that ptxas accepts it."""
    import functools

    path = root / "triton" / "backends" / "nvidia" / "compiler.py"
    rel = _rel(path, root)
    cap = arch.major * 10 + arch.minor
    component = f"triton {version}"
    names = ("get_ptxas", "ptx_get_version", "sm_arch_from_capability")
    try:
        defs = load_definitions(path, names, {"knobs": _triton_knobs(root, environ), "functools": functools})
        gpu_name = str(defs.get("sm_arch_from_capability")(cap))
        get_ptxas = defs.get("get_ptxas")
        tool = get_ptxas(cap) if get_ptxas.__code__.co_argcount else get_ptxas()
        isa_int = int(defs.get("ptx_get_version")(tool.version))
    except (Unresolvable, ToolchainError) as exc:
        return ToolFinding("triton", str(arch), component, "", "", rel, 0, "skip", f"{component}: {exc}")
    except Exception as exc:  # the release's own code raised for this arch: what Triton does at first use
        return ToolFinding(
            "triton",
            str(arch),
            component,
            "",
            "",
            rel,
            0,
            "fail",
            f"{component} raises before compiling for {arch}: {type(exc).__name__}: {exc}",
        )
    line = defs.lines["sm_arch_from_capability"]
    compiler: Compiler = tool.compiler
    isa = f"{isa_int // 10}.{isa_int % 10}"
    # Triton's make_ptx writes `.target sm_<capability>` and make_cubin runs `ptxas --gpu-name=<gpu_name>`.
    try:
        result = probe(compiler, (f"--gpu-name={gpu_name}",), probe_ptx(isa, f"sm_{cap}"))
    except ToolchainError as exc:
        return ToolFinding(
            "triton", str(arch), component, compiler.describe(), gpu_name, rel, line, "skip", str(exc)
        )
    where = f"{rel}:{line}"
    if result.ok:
        msg = f"{compiler.describe()} accepts {gpu_name} (PTX ISA {isa}), which {component} asks for on {arch} ({where})"
        return ToolFinding(
            "triton",
            str(arch),
            component,
            compiler.describe(),
            gpu_name,
            rel,
            line,
            "pass",
            msg,
            result.command,
        )
    msg = (
        f"{compiler.describe()} rejects {gpu_name}, which {component} asks for on {arch} ({where}): "
        f"`{result.command}`: {result.error}"
    )
    return ToolFinding(
        "triton",
        str(arch),
        component,
        compiler.describe(),
        gpu_name,
        rel,
        line,
        "fail",
        msg,
        result.command,
        result.error,
    )


# --------------------------------------------------------------------------- flashinfer

_GENCODE = re.compile(r"-gencode=arch=(compute_\w+),code=(sm_\w+)")


def _cpp_ext(toolkit: Toolkit) -> ModuleType:
    """flashinfer.jit.cpp_ext's ``is_cuda_version_at_least``: nvcc's "release X.Y" against the version, as its
    get_cuda_version reads it (the toolkit's ptxas gives the same release where the wheel has no nvcc)."""
    mod = ModuleType("flashinfer.jit.cpp_ext")
    release = (toolkit.nvcc or toolkit.ptxas).release
    mod.is_cuda_version_at_least = lambda v: Version(release) >= Version(v)  # type: ignore[attr-defined]
    mod.get_cuda_version = lambda: Version(release)  # type: ignore[attr-defined]
    return mod


def flashinfer_targets(
    root: Path, arch: Arch, mode: str, toolkit: Toolkit, environ: Mapping[str, str]
) -> tuple[list[tuple[str, str]], list[str], int]:
    """The (compute, sm) pairs flashinfer's CompilationContext gives nvcc on `arch` in `mode`, its warnings and
    the deciding line; raises `Unresolvable`, or `NoTarget` with flashinfer's own message when it gives none."""
    path = root / "flashinfer" / "compilation_context.py"
    env = {k: v for k, v in environ.items() if k != "FLASHINFER_CUDA_ARCH_LIST"}
    if mode == "aot":
        env["FLASHINFER_CUDA_ARCH_LIST"] = f"{arch.major}.{arch.minor}"
    warnings = Warnings()
    stubs = {"flashinfer.jit.cpp_ext": _cpp_ext(toolkit), "os": fake_os(env)}
    namespace: dict[str, Any] = {
        "os": stubs["os"],
        "torch": fake_torch((arch.major, arch.minor)),
        "logger": warnings,
        "__stubs__": stubs,
    }
    if not path.is_file():
        raise Unresolvable(f"{_rel(path, root)} is not in this flashinfer: its arch list is not read here")
    defs = load_definitions(path, ("CompilationContext",), namespace)
    # The deciding line: the arch normalisation where the release has one (0.6.7+), else the constructor.
    lines = defs.lines
    line = lines.get("CompilationContext._normalize_cuda_arch") or lines.get("CompilationContext.__init__", 0)
    try:
        flags = defs.get("CompilationContext")().get_nvcc_flags_list()
    except RuntimeError as exc:
        raise NoTarget("; ".join([str(exc), *(f"logged: {w}" for w in warnings.messages)]), line) from exc
    return [(m.group(1), m.group(2)) for f in flags if (m := _GENCODE.fullmatch(f))], warnings.messages, line


def _compile(toolkit: Toolkit, compute: str, sm: str, fp4: bool) -> tuple[Compiler, Any]:
    code = sm.removeprefix("sm_")
    compiler = toolkit.nvcc or toolkit.ptxas
    isa = ptx_isa(compiler.release)
    ptx = probe_ptx(isa, sm, FP4_BODY if fp4 else "")
    if toolkit.nvcc is not None:  # flashinfer's own flag, through nvcc (which checks compute_X itself)
        return compiler, probe(compiler, (f"-gencode=arch={compute},code={sm}", "-cubin"), ptx)
    return compiler, probe(compiler, (f"-arch=sm_{code}",), ptx)


def _asked(mode: str, arch: Arch) -> str:
    """How flashinfer is asked for `arch`, as a finding says it."""
    if mode == "jit":
        return "at JIT time"
    return f'with FLASHINFER_CUDA_ARCH_LIST="{arch.major}.{arch.minor}" (AOT)'


def _with_fp4(sm: str) -> bool:
    """Blackwell targets: flashinfer compiles its FP4 kernels for every target (-DFLASHINFER_ENABLE_FP4_E2M1
    in COMMON_NVCC_FLAGS), and they emit the e2m1x2 conversion there (our reading; flashinfer#1966)."""
    return int(re.sub(r"\D", "", sm)[:-1] or 0) >= 10


def flashinfer_finding(
    comp: InstalledComponent, arch: Arch, mode: str, toolkit: Toolkit, environ: Mapping[str, str]
) -> ToolFinding:
    root = Path(comp.root)
    kind, component = f"flashinfer-{mode}", f"{comp.distribution} {comp.version}"
    rel = "flashinfer/compilation_context.py"
    asked = _asked(mode, arch)
    try:
        targets, _, line = flashinfer_targets(root, arch, mode, toolkit, environ)
    except Unresolvable as exc:
        return ToolFinding(kind, str(arch), component, "", "", rel, 0, "skip", f"{component}: {exc}")
    except NoTarget as exc:
        msg = (
            f"{component} {asked} on {arch} gives nvcc no target with {toolkit.ptxas.describe()} "
            f"({rel}:{exc.line}): {exc}"
        )
        return ToolFinding(
            kind, str(arch), component, toolkit.ptxas.describe(), "", rel, exc.line, "fail", msg
        )
    where = f"{rel}:{line}"
    done = []
    for compute, sm in targets:
        fp4 = _with_fp4(sm)
        try:
            compiler, result = _compile(toolkit, compute, sm, fp4)
        except ToolchainError as exc:
            return ToolFinding(
                kind, str(arch), component, toolkit.ptxas.describe(), sm, rel, line, "skip", str(exc)
            )
        what = f"{compute}/{sm}" + (" with the FP4 e2m1x2 conversion" if fp4 else "")
        if not result.ok:
            msg = (
                f"{compiler.describe()} rejects {what}, which {component} asks for {asked} on {arch} ({where}): "
                f"`{result.command}`: {result.error}"
            )
            return ToolFinding(
                kind,
                str(arch),
                component,
                compiler.describe(),
                f"{compute}/{sm}",
                rel,
                line,
                "fail",
                msg,
                result.command,
                result.error,
            )
        done.append((compiler, what, result.command))
    if not done:
        return ToolFinding(
            kind,
            str(arch),
            component,
            toolkit.ptxas.describe(),
            "",
            rel,
            line,
            "fail",
            f"{component} {asked} on {arch} gives no -gencode target ({where})",
        )
    compiler = done[0][0]
    msg = f"{compiler.describe()} accepts {', '.join(w for _, w, _ in done)}: what {component} asks for {asked} on {arch} ({where})"
    return ToolFinding(
        kind,
        str(arch),
        component,
        compiler.describe(),
        ", ".join(w for _, w, _ in done),
        rel,
        line,
        "pass",
        msg,
        done[0][2],
    )


# --------------------------------------------------------------------------- the cell


def _archs(cell: CellSpec) -> tuple[list[Arch], list[ToolFinding]]:
    archs, errors = [], []
    for name in cell.archs:
        try:
            archs.append(parse_target(name))
        except ArchError as exc:
            errors.append(
                ToolFinding(
                    "error", str(name), "", "", "", "matrix.toml", 0, "fail", f"[targets] archs: {exc}"
                )
            )
    return archs, errors


def analyse(
    cell: CellSpec, fetch: Fetch, requires: Requires, settings: Mapping[str, Any]
) -> list[ToolFinding]:
    """Every finding of the cell: per target arch, Triton's ptxas and flashinfer's JIT (and AOT) targets."""
    archs, out = _archs(cell)
    environ = {str(k): str(v) for k, v in dict(settings.get("environ", {})).items()}
    modes = [str(m) for m in settings.get("flashinfer_modes", ["jit"])]
    bad = [m for m in modes if m not in MODES]
    if bad:
        out.append(
            ToolFinding(
                "error",
                "all",
                "",
                "",
                "",
                "matrix.toml",
                0,
                "fail",
                f"[suites.15-toolchain.settings] flashinfer_modes: {bad} not in {list(MODES)}",
            )
        )
        modes = [m for m in modes if m in MODES]
    out += _triton(cell, archs, fetch, environ)
    out += _flashinfer(cell, archs, modes=modes, fetch=fetch, requires=requires, environ=environ)
    return out


def _installed_beside(comp: InstalledComponent | None, distribution: str, version: str) -> Path | None:
    """`comp`'s root where it is a site-packages that also holds `distribution` `version` (docker, host): the
    installed copy is the one that runs."""
    if comp is None or not comp.root:
        return None
    info = Path(comp.root) / f"{distribution}-{version}.dist-info"
    return Path(comp.root) if info.is_dir() else None


def _triton_version(own: InstalledComponent | None, torch: InstalledComponent | None) -> str | None:
    """The cell's Triton release: its own triton's, else the one its torch pins."""
    if own is not None:
        return own.version
    return requirement_pin(_metadata_requires(torch), ("triton",)) if torch else None


def _no_triton(
    own: InstalledComponent | None, torch: InstalledComponent | None, archs: list[Arch]
) -> list[ToolFinding]:
    """The findings when no Triton release can be named: unanswered (skip) when torch's pin cannot be read,
    else not applicable."""
    unknown = _triton_unknown(torch) if torch and not own else None
    if unknown is not None:  # torch is there but what it pins cannot be read: unanswered, never n/a
        return [ToolFinding("triton", str(a), "triton", "", "", "", 0, "skip", unknown) for a in archs]
    why = (
        "the cell has no triton, and its torch requires none" if torch else "the cell has no torch or triton"
    )
    return [ToolFinding("triton", str(a), "triton", "", "", "", 0, "n/a", why) for a in archs]


def _triton_root(
    own: InstalledComponent | None, torch: InstalledComponent | None, version: str, fetch: Fetch
) -> Path:
    """Where the Triton that runs lies: the cell's own, an installed copy beside torch, else a fetched wheel."""
    if own and own.root:
        return Path(own.root)
    return _installed_beside(torch, "triton", version) or fetch("triton", version)


def _triton(cell: CellSpec, archs: list[Arch], fetch: Fetch, environ: Mapping[str, str]) -> list[ToolFinding]:
    own = _find(cell, ("triton",))
    torch = _find(cell, ("torch",))
    version = _triton_version(own, torch)
    if version is None:
        return _no_triton(own, torch, archs)
    try:
        root = _triton_root(own, torch, version, fetch)
    except Unavailable as exc:
        return [
            ToolFinding(
                "triton",
                str(a),
                f"triton {version}",
                "",
                "",
                "",
                0,
                "skip",
                f"triton {version} (pinned by the cell's torch) cannot be had here: {exc}",
            )
            for a in archs
        ]
    return [triton_finding(a, root, version, environ) for a in archs]


def _flashinfer(
    cell: CellSpec,
    archs: list[Arch],
    *,
    modes: list[str],
    fetch: Fetch,
    requires: Requires,
    environ: Mapping[str, str],
) -> list[ToolFinding]:
    comp = _find(cell, ("flashinfer-python", "flashinfer"))
    if comp is None:
        return [
            ToolFinding(
                f"flashinfer-{m}", str(a), "flashinfer", "", "", "", 0, "n/a", "the cell has no flashinfer"
            )
            for m in modes
            for a in archs
        ]
    component = f"{comp.distribution} {comp.version}"
    try:
        toolkit = find_toolkit(cell, fetch, requires)
    except (Unavailable, ToolchainError) as exc:
        return [
            ToolFinding(
                f"flashinfer-{m}",
                str(a),
                component,
                "",
                "",
                "",
                0,
                "skip",
                f"no CUDA toolkit for {component}'s JIT: {exc}",
            )
            for m in modes
            for a in archs
        ]
    return [
        replace(flashinfer_finding(comp, a, m, toolkit, environ), note=toolkit.why)
        for m in modes
        for a in archs
    ]


# --------------------------------------------------------------------------- the wheels it reads


def metadata_requires(comp: InstalledComponent) -> list[str]:
    """The Requires-Dist of an unpacked or installed wheel's METADATA; raises `Unavailable` when it has none here."""
    info = dist_info(comp)
    if info is None or not (info / "METADATA").is_file():
        raise Unavailable(
            f"{comp.distribution}=={comp.version}: its METADATA cannot be read here ({comp.root or 'no root'})"
        )
    return _metadata_requires(comp)


def triton_pin(torch_requires: list[str]) -> str | None:
    """The Triton release torch's Requires-Dist pins (None: it pins none)."""
    return requirement_pin(torch_requires, ("triton",))


def nvcc_pin(torch: str, torch_requires: list[str], requires: Requires) -> tuple[str, str]:
    """(distribution, version) of the nvcc wheel of the CUDA release torch `torch` pins (its Requires-Dist), as
    `find_toolkit` chooses it; raises `Unavailable` when it cannot be told."""
    dist, version = _nvcc_of(torch_requires, requires)
    if version is None:
        raise Unavailable(
            f"torch {torch}'s metadata pins no nvidia-cuda-nvrtc(-cu12/-cu11) / cuda-toolkit release"
        )
    return dist, version


__all__ = [
    "MODES",
    "Fetch",
    "Requires",
    "ToolFinding",
    "Unavailable",
    "analyse",
    "find_toolkit",
    "flashinfer_finding",
    "flashinfer_targets",
    "metadata_requires",
    "nvcc_pin",
    "requirement_pin",
    "triton_finding",
    "triton_pin",
]
