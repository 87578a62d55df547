"""The stack's components, listed once: which axes a matrix has, which wheels each axis value stands for, how a
cell id spells it, which Docker stage installs it, and what the suites may assume of its files.

Everything that needs to know about an axis reads it here (plan, resolve, matrix validation, the Docker stages,
00-stack, 10-capability). Adding a component is one `Part` below plus its tests.

The suite-facing flags (`SUITE_FLAGS`: ``cuda_libraries``, ``scanned``) have one owner, this table: the suites read
them through `with_property` (00-stack the CUDA libraries whose cudart it checks, 10-capability the binaries it
scans) and a family names the ones it reads in ``Needs.stack_flags``; a suite keeps no list of its own (two lists
had drifted apart over flashinfer-jit-cache).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version


def _same(version: str) -> str:
    return version


def _public(version: str) -> str:
    try:
        return Version(version).public
    except InvalidVersion:
        return version


def _no_dots(version: str) -> str:
    return version.replace(".", "")


def _cuda_major(values: Mapping[str, str]) -> str:
    return values.get("cuda", "12").split(".")[0]


@dataclass(frozen=True, kw_only=True)
class Part:
    """One axis of the matrix and what it stands for."""

    #: The axis name in matrix.toml (`[axes] <axis> = [...]`).
    axis: str
    #: How the cell id spells a value: prefix + id_version(value), e.g. "sk" + "0.4.4".
    id_prefix: str
    id_version: Callable[[str], str] = _same
    #: The wheels a value installs: f(value, the cell's other values). () for axes that are not wheels.
    distributions: Callable[[str, Mapping[str, str]], tuple[str, ...]] = lambda _v, _c: ()
    #: Every distribution name the axis has had (renames included): how a pin is mapped back to its axis.
    names: tuple[str, ...] = ()
    #: The Docker stage (docker/Dockerfile) that installs the axis' wheels; None when nothing is installed.
    docker_stage: str | None = None
    #: Its native libraries link a CUDA runtime: 00-stack checks they link the cell's `libcudart.so.N`.
    cuda_libraries: bool = False
    #: Its binaries are scanned for SASS/PTX per target arch (10-capability).
    scanned: bool = False
    #: sglang's own Requires-Dist may pin it, and an [[override]] may accept a departure.
    pinned_by_sglang: bool = False
    #: A matrix may leave this axis out; required axes must be in every matrix.
    optional: bool = False
    #: The value used when a matrix leaves a required axis out (None: the axis must be given).
    default: tuple[str, ...] | None = None

    def wheels(self, value: str, values: Mapping[str, str]) -> tuple[str, ...]:
        return self.distributions(value, values)


def _kernel(version: str, _values: Mapping[str, str]) -> tuple[str, ...]:
    """sgl-kernel was renamed sglang-kernel at 0.4.0."""
    try:
        renamed = Version(version) >= Version("0.4")
    except InvalidVersion:
        renamed = True
    return ("sglang-kernel",) if renamed else ("sgl-kernel",)


PARTS: tuple[Part, ...] = (
    Part(axis="cuda", id_prefix="cu", id_version=_no_dots),
    Part(
        axis="torch",
        id_prefix="torch",
        id_version=_public,
        distributions=lambda _v, _c: ("torch",),
        names=("torch",),
        docker_stage="torch",
        cuda_libraries=True,
        scanned=True,
        pinned_by_sglang=True,
    ),
    Part(
        axis="nccl",
        id_prefix="nccl",
        distributions=lambda _v, c: (f"nvidia-nccl-cu{_cuda_major(c)}",),
        names=("nvidia-nccl-cu12", "nvidia-nccl-cu13"),
        docker_stage="torch",
        optional=True,
    ),
    Part(
        axis="sgl_kernel",
        id_prefix="sk",
        distributions=_kernel,
        names=("sgl-kernel", "sglang-kernel"),
        docker_stage="kernels",
        cuda_libraries=True,
        scanned=True,
        pinned_by_sglang=True,
    ),
    Part(
        axis="flashinfer",
        id_prefix="fi",
        distributions=lambda _v, _c: ("flashinfer-python", "flashinfer-cubin"),
        names=("flashinfer-python", "flashinfer-cubin"),
        docker_stage="kernels",
        scanned=True,
        pinned_by_sglang=True,
    ),
    Part(
        axis="flashinfer_jit_cache",
        id_prefix="fijc",
        distributions=lambda _v, _c: ("flashinfer-jit-cache",),
        names=("flashinfer-jit-cache",),
        docker_stage="kernels",
        # Not scanned: its AOT modules (jit_cache/<module>/<module>.so) are built per GPU family (fa3's for
        # sm_90a only, the SM100 CUTLASS ones for sm_100a) and flashinfer picks them per GPU, so 10-capability's
        # every-unit rule would fail modules never loaded there. 10-capability never scanned it (its list had
        # torch, sgl-kernel and flashinfer-python/-cubin); what the JIT fallback compiles is 15-toolchain's.
        # Not a CUDA library for 00-stack either (its list had torch and sgl-kernel only).
        optional=True,
    ),
    Part(
        axis="sglang",
        id_prefix="sgl",
        distributions=lambda _v, _c: ("sglang",),
        names=("sglang",),
        docker_stage="sglang",
    ),
    Part(axis="python", id_prefix="py", default=("3.11",)),
)

#: The CPython feature releases a cell's python axis may name: those stackfarm runs under (its Requires-Python,
#: >=3.10: the suites import it in the cell's interpreter) that have been released. A new CPython is one more
#: entry here once it is out.
PYTHONS: tuple[str, ...] = ("3.10", "3.11", "3.12", "3.13", "3.14")
#: Released CPython feature versions before PYTHONS: real, but no suite can run under them.
_OLD_PYTHONS = ("2.7", *(f"3.{minor}" for minor in range(10)))


def python_problem(value: str) -> tuple[str, str] | None:
    """(what is wrong, the fix) for a python axis value that is not a supported CPython release; None if it is."""
    supported = f"one of {', '.join(PYTHONS)}"
    if value in PYTHONS:
        return None
    parts = value.split(".")
    if value in _OLD_PYTHONS:
        return (
            f"CPython {value} is not supported: stackfarm (and so every suite) needs Python {PYTHONS[0]} or newer",
            f"use {supported}",
        )
    if len(parts) > 2 and ".".join(parts[:2]) in PYTHONS:
        return (
            f"`{value}` is a patch release: the python axis names a feature release (major.minor)",
            f'write "{".".join(parts[:2])}"',
        )
    return (
        f"`{value}` is not a CPython release stackfarm knows ({PYTHONS[0]} to {PYTHONS[-1]})",
        f"use {supported} (a CPython released since is added to stackfarm.stack.PYTHONS)",
    )


BY_AXIS: dict[str, Part] = {p.axis: p for p in PARTS}
#: Every axis a matrix may declare, in cell-value order.
AXES: tuple[str, ...] = tuple(p.axis for p in PARTS)
#: The axes every matrix must have (python has a default).
REQUIRED_AXES: tuple[str, ...] = tuple(p.axis for p in PARTS if not p.optional)
#: The axes whose values are wheels.
WHEEL_AXES: tuple[str, ...] = tuple(p.axis for p in PARTS if p.names)
#: The axes an [[override]] may name.
PINNED_AXES: tuple[str, ...] = tuple(p.axis for p in PARTS if p.pinned_by_sglang)
#: Axes that are always in a cell id (python only when the matrix has several).
ID_AXES: tuple[str, ...] = tuple(p.axis for p in PARTS if p.axis != "python")

#: Which axis each distribution belongs to (every name it has had).
DISTRIBUTION_AXIS: dict[str, str] = {name: p.axis for p in PARTS for name in p.names}


def axis_of(distribution: str) -> str | None:
    """The axis of a distribution (by its canonical name), or None when it is not a stack component."""
    return DISTRIBUTION_AXIS.get(canonicalize_name(distribution))


def distributions(axis: str, value: str, values: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The wheels an axis value installs in a cell with these values."""
    return BY_AXIS[axis].wheels(value, values or {})


#: The flags of `Part` that suites read (`with_property`), the values of a family's ``Needs.stack_flags``.
SUITE_FLAGS: tuple[str, ...] = ("cuda_libraries", "scanned")


def with_property(flag: str) -> tuple[str, ...]:
    """Every distribution name (renames included) of the parts that have this suite-facing flag, in table order;
    raises KeyError for a name that is not one of `SUITE_FLAGS`."""
    if flag not in SUITE_FLAGS:
        raise KeyError(f"{flag!r} is not a suite-facing flag of the stack table ({', '.join(SUITE_FLAGS)})")
    return tuple(name for p in PARTS if getattr(p, flag) for name in p.names)


def docker_stages() -> dict[str, tuple[str, ...]]:
    """Docker stage -> the axes it installs, in stage order."""
    stages: dict[str, list[str]] = {}
    for p in PARTS:
        if p.docker_stage is not None:
            stages.setdefault(p.docker_stage, []).append(p.axis)
    return {stage: tuple(axes) for stage, axes in stages.items()}


def cell_id(values: Mapping[str, str], *, with_python: bool = False) -> str:
    """A cell's id: each present axis' prefix and value, e.g. cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9."""
    parts = [
        p.id_prefix + p.id_version(values[p.axis]) for p in PARTS if p.axis in ID_AXES and p.axis in values
    ]
    if with_python:
        parts.append(BY_AXIS["python"].id_prefix + values["python"])
    return "-".join(parts)


__all__ = [
    "AXES",
    "BY_AXIS",
    "DISTRIBUTION_AXIS",
    "ID_AXES",
    "PARTS",
    "PINNED_AXES",
    "PYTHONS",
    "REQUIRED_AXES",
    "SUITE_FLAGS",
    "WHEEL_AXES",
    "Part",
    "axis_of",
    "cell_id",
    "distributions",
    "docker_stages",
    "python_problem",
    "with_property",
]
