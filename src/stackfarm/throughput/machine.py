"""The machine a measurement runs on: its GPUs (nvidia-smi), free ports, and CPU placement by physical core.

- `query_gpus` / `parse_gpu_csv`: name, clocks, driver, power limit and memory of each GPU, for the record;
- `free_ports` / `ensure_port_free`: ports for the servers, below what SGLang 0.5.15 can use (`PORT_RANGE`);
- `physical_cores`, `cpu_placement`, `pinned`: the client on one core and each server on its own block.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import random
import shutil
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..proc import call
from .errors import MeasureError, PortInUseError

# ------------------------------------------------------------------------------------------ GPU facts

#: What nvidia-smi reports per GPU, in `GpuInfo` field order.
NVIDIA_SMI_FIELDS = (
    "index",
    "name",
    "driver_version",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "power.limit",
    "power.draw",
    "temperature.gpu",
    "pstate",
    "memory.total",
)


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    index: int
    name: str
    driver: str
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    max_sm_clock_mhz: float | None
    max_mem_clock_mhz: float | None
    power_limit_w: float | None
    power_draw_w: float | None
    temperature_c: float | None
    pstate: str
    memory_total_mib: float | None


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_gpu_csv(text: str) -> tuple[GpuInfo, ...]:
    """Parse ``nvidia-smi --query-gpu=<NVIDIA_SMI_FIELDS> --format=csv,noheader,nounits``."""
    gpus = []
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not row or not row[0].strip():
            continue
        if len(row) != len(NVIDIA_SMI_FIELDS):
            raise MeasureError(f"nvidia-smi gave {len(row)} fields, expected {len(NVIDIA_SMI_FIELDS)}: {row}")
        cells = [c.strip() for c in row]
        gpus.append(
            GpuInfo(
                index=int(cells[0]),
                name=cells[1],
                driver=cells[2],
                sm_clock_mhz=_num(cells[3]),
                mem_clock_mhz=_num(cells[4]),
                max_sm_clock_mhz=_num(cells[5]),
                max_mem_clock_mhz=_num(cells[6]),
                power_limit_w=_num(cells[7]),
                power_draw_w=_num(cells[8]),
                temperature_c=_num(cells[9]),
                pstate=cells[10],
                memory_total_mib=_num(cells[11]),
            )
        )
    return tuple(gpus)


def query_gpus() -> tuple[GpuInfo, ...]:
    if shutil.which("nvidia-smi") is None:
        raise MeasureError(
            "nvidia-smi not found: cannot record the GPU's name, clocks, driver and power limit"
        )
    outcome = call(
        ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader,nounits"],
        timeout=60,
    )
    if outcome.returncode != 0:
        raise MeasureError(f"nvidia-smi failed (exit {outcome.returncode}): {outcome.output.strip()[:300]}")
    return parse_gpu_csv(outcome.output)


# ------------------------------------------------------------------------------------------ ports

#: SGLang 0.5.15 derives a gRPC port as --port + 10000 and refuses ports above 65535 even when gRPC is off,
#: so a port from the kernel's ephemeral range (up to 60999) can stop it from starting: stay below 55535.
PORT_RANGE = (30000, 50000)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ensure_port_free(host: str, port: int) -> None:
    if not port_free(host, port):
        raise PortInUseError(
            f"port {port} on {host} is already in use (another server is listening there): leave "
            "settings.port unset to pick free ports, or stop what holds it"
        )


def free_ports(host: str, count: int, *, start: int | None = None) -> tuple[int, ...]:
    """`count` free ports: start, start + 1, ... when `start` is given (each must be free), else free ports
    searched from a random point of PORT_RANGE (so parallel runs rarely race for the same one)."""
    if start is not None:
        wanted = tuple(range(start, start + count))
        for port in wanted:
            ensure_port_free(host, port)
        return wanted
    low, high = PORT_RANGE
    candidate = random.Random(os.getpid() ^ time.time_ns()).randrange(low, high)
    found: list[int] = []
    for _ in range(high - low):
        if port_free(host, candidate):
            found.append(candidate)
            if len(found) == count:
                return tuple(found)
        candidate = low + (candidate + 1 - low) % (high - low)
    raise PortInUseError(f"fewer than {count} free ports on {host} in [{low}, {high})")


# ------------------------------------------------------------------------------------------ CPU placement

SYSFS_CPU = Path("/sys/devices/system/cpu")


def physical_cores(cpus: Iterable[int], sysfs: Path = SYSFS_CPU) -> tuple[tuple[int, ...], ...]:
    """`cpus` grouped by physical core (SMT siblings together), ordered by their first CPU. A CPU whose
    topology cannot be read counts as a core of its own."""
    groups: dict[tuple[str, str], list[int]] = {}
    for cpu in sorted(cpus):
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            package = (topology / "physical_package_id").read_text(encoding="ascii").strip()
            core = (topology / "core_id").read_text(encoding="ascii").strip()
        except OSError:
            package, core = "unknown", f"cpu{cpu}"
        groups.setdefault((package, core), []).append(cpu)
    return tuple(tuple(group) for group in groups.values())


@dataclass(frozen=True)
class CpuPlacement:
    client: tuple[int, ...]
    #: One CPU set per server, in start order.
    servers: tuple[tuple[int, ...], ...]


#: Physical cores a server needs at least: its HTTP/tokenizer process and its scheduler both stay busy.
MIN_SERVER_CORES = 2


def cpu_placement(cores: Sequence[Sequence[int]], servers: int) -> CpuPlacement | None:
    """The client on the first physical core, each server on an equal block of the rest (whole cores,
    so no two of them share SMT siblings); None when there are too few cores to give every server
    MIN_SERVER_CORES: then nothing is pinned, rather than starving a server."""
    if servers < 1 or len(cores) < 1 + servers * MIN_SERVER_CORES:
        return None
    share = (len(cores) - 1) // servers
    blocks = [cores[1 + i * share : 1 + (i + 1) * share] for i in range(servers)]
    return CpuPlacement(
        client=tuple(cores[0]),
        servers=tuple(tuple(cpu for core in block for cpu in core) for block in blocks),
    )


def available_cpus() -> tuple[int, ...]:
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


@contextlib.contextmanager
def pinned(cpus: Sequence[int] | None) -> Iterator[None]:
    """This process on `cpus` for the block's duration (nothing happens for None or off Linux)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


__all__ = [
    "MIN_SERVER_CORES",
    "NVIDIA_SMI_FIELDS",
    "PORT_RANGE",
    "SYSFS_CPU",
    "CpuPlacement",
    "GpuInfo",
    "available_cpus",
    "cpu_placement",
    "ensure_port_free",
    "free_ports",
    "parse_gpu_csv",
    "physical_cores",
    "pinned",
    "port_free",
    "query_gpus",
]
