"""The NVIDIA driver a cell needs, and whether the runner kind it is routed to has it.

Two floors, the higher one wins:

- the CUDA major's minor-version-compatibility floor (NVIDIA's CUDA compatibility guide): CUDA 12.x runs on
  driver >= 525.60.13, CUDA 13.x on >= 580.65.06 (an older driver fails every CUDA call with "The NVIDIA driver
  on your system is too old");
- the driver-API symbols the cell's libraries link directly (libcuda.so.1 is the driver): a symbol that first
  appeared in CUDA 12.4 (the green-context API) is missing from an older libcuda, and the library fails to
  load with ``undefined symbol`` (sglang#8131). `DRIVER_API` lists the ones we know; unknown ones add nothing.

With ``[runners.<kind>] forward_compat = true`` the runner has NVIDIA's cuda-compat package (data-center GPUs
only): its user-mode libcuda is as new as the cell's CUDA, so only the kernel driver's branch must be one the
compat package supports (`FORWARD_COMPAT_MIN`).
"""

from __future__ import annotations

import fnmatch
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from packaging.version import InvalidVersion, Version

from .errors import StackfarmError
from .runnerkind import Runner

if TYPE_CHECKING:  # annotations only: the suites import this module, and stand on no configuration layer
    from .matrix import Matrix
from .proc import call

#: CUDA toolkit release -> the Linux driver it shipped with (CUDA release notes, table 3).
TOOLKIT_DRIVER: dict[str, str] = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
    "13.1": "590.44.01",
}
#: CUDA major -> the oldest driver its minor-version compatibility covers.
MAJOR_FLOOR: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
#: CUDA major -> the oldest kernel-driver branch the cuda-compat (forward compatibility) package supports.
FORWARD_COMPAT_MIN: dict[int, str] = {12: "470.57.02", 13: "535.54.03"}

#: Driver-API entry points -> the CUDA release that introduced them (CUDA driver API reference, per release).
DRIVER_API: dict[str, str] = {
    **dict.fromkeys(
        (
            "cuLaunchKernelEx",
            "cuTensorMapEncodeTiled",
            "cuTensorMapEncodeIm2col",
            "cuTensorMapReplaceAddress",
            "cuLibraryLoadData",
            "cuLibraryGetKernel",
            "cuKernelGetFunction",
            "cuGetProcAddress_v2",
        ),
        "12.0",
    ),
    **dict.fromkeys(
        (
            "cuMulticastCreate",
            "cuMulticastAddDevice",
            "cuMulticastBindMem",
            "cuMulticastBindAddr",
            "cuMulticastUnbind",
            "cuMulticastGetGranularity",
            "cuCoredumpGetAttribute",
        ),
        "12.1",
    ),
    **dict.fromkeys(("cuStreamBeginCaptureToGraph", "cuFuncGetName", "cuKernelGetName"), "12.3"),
    **dict.fromkeys(
        (
            "cuGreenCtxCreate",
            "cuGreenCtxDestroy",
            "cuGreenCtxRecordEvent",
            "cuGreenCtxWaitEvent",
            "cuGreenCtxGetDevResource",
            "cuCtxFromGreenCtx",
            "cuCtxGetDevResource",
            "cuDeviceGetDevResource",
            "cuDevSmResourceSplitByCount",
            "cuDevResourceGenerateDesc",
            "cuLibraryEnumerateKernels",
        ),
        "12.4",
    ),
    # sglang#8131: missing from the driver of a CUDA 12.4 machine; the API reference lists it from 12.5.
    **dict.fromkeys(("cuGreenCtxStreamCreate", "cuCtxRecordEvent", "cuCtxWaitEvent"), "12.5"),
    **dict.fromkeys(
        ("cuTensorMapEncodeIm2colWide", "cuMemcpyBatchAsync", "cuStreamGetDevice", "cuCheckpointProcessLock"),
        "12.8",
    ),
    **dict.fromkeys(
        ("cuCtxGetDevice_v2", "cuCtxSynchronize_v2", "cuDeviceGetHostAtomicCapabilities"), "13.0"
    ),
}


@dataclass(frozen=True)
class Floor:
    """The lowest driver that runs a cell, and why."""

    driver: str
    reason: str


def driver_key(text: str) -> tuple[int, ...]:
    """``"570.86.15"`` -> (570, 86, 15); raises ValueError for something that is not a driver version."""
    if not re.fullmatch(r"\d+(\.\d+){0,2}", text.strip()):
        raise ValueError(f"{text!r} is not a driver version like 570.86.15")
    return tuple(int(x) for x in text.strip().split("."))


def _major(cuda: str) -> int | None:
    try:
        return Version(cuda).major
    except InvalidVersion:
        return None


def cuda_floor(cuda: str) -> Floor | None:
    """The minor-version-compatibility floor of a CUDA release, or None for a CUDA we do not know."""
    major = _major(cuda)
    if major is None or major not in MAJOR_FLOOR:
        return None
    return Floor(MAJOR_FLOOR[major], f"CUDA {cuda} needs driver >= {MAJOR_FLOOR[major]} (CUDA {major}.x)")


def symbol_floor(symbols: Iterable[str]) -> Floor | None:
    """The driver the newest known driver-API symbol among `symbols` needs, or None when none is known."""
    best: tuple[Version, str] | None = None
    for name in set(symbols):
        release = DRIVER_API.get(name)
        if release is not None and (best is None or Version(release) > best[0]):
            best = (Version(release), name)
    if best is None:
        return None
    release = f"{best[0].major}.{best[0].minor}"
    driver = TOOLKIT_DRIVER[release]
    return Floor(driver, f"{best[1]} is a CUDA {release} driver API: driver >= {driver}")


def cell_floor(cuda: str, symbols: Iterable[str] = ()) -> Floor | None:
    """The higher of the CUDA floor and the driver-API symbols' floor."""
    floors = [f for f in (cuda_floor(cuda), symbol_floor(symbols)) if f is not None]
    return max(floors, key=lambda f: driver_key(f.driver)) if floors else None


def runs_on(driver: str, floor: Floor, cuda: str, *, forward_compat: bool = False) -> str | None:
    """Why `driver` cannot run a cell with this floor, or None when it can."""
    if driver_key(driver) >= driver_key(floor.driver):
        return None
    major = _major(cuda)
    if forward_compat and major in FORWARD_COMPAT_MIN:
        least = FORWARD_COMPAT_MIN[major]
        if driver_key(driver) >= driver_key(least):
            return None
        return (
            f"driver {driver} is below {least}, the oldest branch CUDA {major} forward compatibility supports"
        )
    compat = "" if forward_compat else " (no forward_compat on this runner)"
    return f"driver {driver} < {floor.driver}: {floor.reason}{compat}"


#: Used when matrix.toml has no [runners] table: every cell on one generic GPU runner (no driver stated).
DEFAULT_RUNNER = Runner(
    name="gpu", labels=("self-hosted", "linux", "x64", "gpu"), arch=None, gpus=1, cells=("*",)
)


def runner_for(matrix: Matrix, cell_id: str) -> Runner | None:
    """The first [runners.<kind>] whose `cells` globs match the cell id, whatever its driver (the kind the
    matrix names for the cell; `route` is where it is dispatched)."""
    return route(cell_id, "", tuple(matrix.runners.values())).named


#: A route's status: "run" (dispatched to `runner`), "unrunnable" (some kind's globs match it, and no such
#: kind's driver can run it), "unrouted" (no kind's cells globs match it).
RouteStatus = Literal["run", "unrunnable", "unrouted"]


@dataclass(frozen=True)
class Route:
    """Where a cell is dispatched: the first runner kind whose cells globs match it and whose driver can run
    it (the CUDA floor and the driver-API symbols' floor), or none, with why each matching kind cannot."""

    status: RouteStatus
    runner: Runner | None
    #: The cell's driver floor (None: no floor known, e.g. a CUDA stackfarm has no table for).
    floor: Floor | None
    #: "runner <kind>: why its driver cannot run the cell", for every matching kind passed over, in order.
    passed_over: tuple[str, ...] = ()
    #: The first kind whose cells globs match, whatever its driver (None: unrouted): the kind a verdict of an
    #: unrunnable cell names, so that a verdict of it from elsewhere still matches.
    first_match: Runner | None = None

    @property
    def named(self) -> Runner | None:
        """The kind the cell's verdict names: the one it is dispatched to, else the first its globs match."""
        return self.runner if self.runner is not None else self.first_match

    @property
    def reason(self) -> str:
        """One line: why the cell runs nowhere (empty when it runs)."""
        if self.status == "unrouted":
            return "it matches no [runners.*] cells glob: no runner kind would run it"
        if self.status == "unrunnable":
            return "unrunnable on every runner kind whose cells globs match it: " + "; ".join(
                self.passed_over
            )
        return ""


def route(cell_id: str, cuda: str, runners: Sequence[Runner], symbols: Iterable[str] = ()) -> Route:
    """The one dispatch rule (`plan`, `gha matrix`, the emitters and the runner's input hash all call it): the
    first kind of `runners` (file order) whose cells globs match `cell_id` and whose stated driver runs the
    cell's floor (`cuda`, raised by `symbols`: the driver-API symbols its libraries loaded at import link, see
    stackfarm.analysis.abicheck.import_driver_symbols); a kind stating no driver runs any cell."""
    floor = cell_floor(cuda, symbols)
    passed: list[str] = []
    first: Runner | None = None
    for kind in runners:
        if not any(fnmatch.fnmatchcase(cell_id, g) for g in kind.cells):
            continue
        first = first or kind
        why = None
        if kind.driver is not None and floor is not None:
            why = runs_on(kind.driver, floor, cuda, forward_compat=kind.forward_compat)
        if why is None:
            return Route("run", kind, floor, tuple(passed), first)
        passed.append(f"runner {kind.name}: {why}")
    return Route("unrunnable" if first else "unrouted", None, floor, tuple(passed), first)


def matrix_runners(matrix: Matrix) -> tuple[Runner, ...]:
    """The matrix's runner kinds in file order; the generic GPU kind when it declares none."""
    return tuple(matrix.runners.values()) or (DEFAULT_RUNNER,)


def routed_runner(matrix: Matrix, cell_id: str, cuda: str, symbols: Iterable[str] = ()) -> Runner | None:
    """The kind a cell's input hash names (`route`'s `named`): the one its floor (`cuda`, raised by `symbols`
    where the plan knows them) dispatches it to, else the first its globs match. None for a matrix without
    [runners]: the generic kind is no input, since a runner names none there."""
    if not matrix.runners:
        return None
    return route(cell_id, cuda, matrix_runners(matrix), symbols).named


class _PlanCell(Protocol):
    @property
    def id(self) -> str: ...

    def as_dict(self) -> dict[str, str]: ...


def driver_problems(
    matrix: Matrix, cells: Sequence[_PlanCell], symbols: Mapping[str, Iterable[str]] | None = None
) -> dict[str, str]:
    """cell id -> why no runner kind its globs match can run it (`route`'s reason), for the cells some kind
    would otherwise take; a cell routed past a kind is not a problem (it runs on the next one).

    `symbols` (cell id -> the driver-API symbols its libraries loaded at import link) raises the floor."""
    out: dict[str, str] = {}
    if not matrix.runners:
        return out
    for cell in cells:
        found = route(
            cell.id, cell.as_dict().get("cuda", ""), matrix_runners(matrix), (symbols or {}).get(cell.id, ())
        )
        if found.status == "unrunnable":
            out[cell.id] = found.reason
    return out


def installed_driver() -> str | None:
    """The driver version nvidia-smi reports on this machine, or None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = call(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout=60)
    except StackfarmError:
        return None
    lines = [line.strip() for line in done.output.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        return None
    try:
        driver_key(lines[0])
    except ValueError:
        return None
    return lines[0]


__all__ = [
    "DEFAULT_RUNNER",
    "DRIVER_API",
    "FORWARD_COMPAT_MIN",
    "MAJOR_FLOOR",
    "TOOLKIT_DRIVER",
    "Floor",
    "Route",
    "RouteStatus",
    "cell_floor",
    "cuda_floor",
    "driver_key",
    "driver_problems",
    "installed_driver",
    "matrix_runners",
    "route",
    "routed_runner",
    "runner_for",
    "runs_on",
    "symbol_floor",
]
