"""Measure the cell's SGLang: servers, health checks, warm-up, interleaved repeats, GPU facts.

The flow the 40-throughput suite drives:

1. `Settings.from_mapping` reads ``[suites.40-throughput.settings]`` (unknown keys are errors);
2. `server_configs` gives one `ServerConfig` per configuration, baseline first, then EAGLE-3;
3. `launch` starts each as ``python -m sglang.launch_server`` on a free port in its own process session
   (SGLang kills its whole process tree when it fails), polls ``/health`` until it answers 200, and on a
   timeout or an early exit raises `ServerStartError` with the tail of the server's log;
4. `Measurement.warm_up` repeats single-stream requests until the last `warmup_window` rates agree within
   `warmup_tolerance` (one warm-up request is not enough: the H200 reference run kept rising for 7);
5. `Measurement.run_rounds` measures A B A B: every batch size, baseline then EAGLE-3, `repeats` times, so
   drift of the machine hits both configurations alike;
6. `Measurement.figures` turns the requests into samples per figure (see `thresholds` for the names).

Requests go to SGLang's native ``/generate`` with ``input_ids`` and ``stream: true`` (the protocol
``sglang.bench_one_batch_server`` speaks): the client notes when each item's first token and last token
arrive. SGLang's own bench tools need a tokenizer, which the tiny random test model does not have; where a
model has one, `stackfarm.throughput.benchjson` runs them and reads their JSON.

Only the standard library is used, so this runs in whatever Python holds the cell's SGLang.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import http.client
import io
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import StackfarmError, did_you_mean
from ..numerics.tinymodels import SGLANG_OFFLINE_ENV
from ..proc import call
from ._tiny import SHAPES
from .thresholds import figure_batch

BASELINE = "baseline"
EAGLE3 = "eagle3"

# ------------------------------------------------------------------------------------------ errors


class MeasureError(StackfarmError):
    """A measurement could not be made; the message says why (and shows the server's log where it helps)."""


class PortInUseError(MeasureError):
    pass


class ServerStartError(MeasureError):
    pass


class BenchError(MeasureError):
    """A request or a bench tool gave no usable figures."""


class ZeroTokensError(BenchError):
    pass


# ------------------------------------------------------------------------------------------ settings


@dataclass(frozen=True, kw_only=True)
class Settings:
    """``[suites.40-throughput.settings]``; every key is optional."""

    #: Interleaved rounds per figure (each round: every batch size, baseline then EAGLE-3).
    repeats: int = 5
    #: Extra rounds of `repeats` a check may take while its interval straddles the threshold.
    max_remeasures: int = 2
    batch_sizes: tuple[int, ...] = (1, 8)
    #: New tokens per request (ignore_eos, so every request decodes exactly this many).
    output_tokens: int = 128
    input_tokens: int = 16
    #: Prompt token ids are drawn from [3, vocab_limit): inside the tiny model's vocabulary of 1024.
    vocab_limit: int = 1000
    confidence: float = 0.95
    resamples: int = 10_000
    seed: int = 0
    warmup_window: int = 3
    warmup_tolerance: float = 0.02
    warmup_max_runs: int = 30
    #: Requests per batch size > 1 before measuring (new shapes may JIT-compile).
    warmup_batches: int = 2
    eagle3: bool = True
    #: A model to serve; unset: a random Llama (+ EAGLE-3 draft) with dummy weights, written per run.
    model_path: str | None = None
    #: The dummy Llama's dimensions when model_path is unset (throughput._tiny.SHAPES): "llama-3-8b" decodes
    #: GPU-bound (CV 0.1-1.5 % on the H200; 16 GB of weights per server, so it wants >= 48 GB GPUs); "tiny"
    #: fits anywhere but measures the scheduler (CV 12-22 %).
    model_shape: str = "llama-3-8b"
    draft_model_path: str | None = None
    attention_backend: str = "triton"
    sampling_backend: str = "pytorch"
    #: Configurations run with CUDA graphs. EAGLE-3's graph capture imports nvidia-cutlass-dsl (absent on
    #: the H200 reference machine), so EAGLE-3 runs without graphs unless named here.
    cuda_graph: tuple[str, ...] = (BASELINE,)
    #: --mem-fraction-static per configuration, in start order. Both servers share the GPU: SGLang 0.5.9 sizes
    #: the KV pool as free - total x (1 - f), so the second must ask for more than the first one holds; from
    #: 0.5.10 it is a share of the memory free at its start (0.45 of what the baseline left).
    mem_fraction_static: tuple[float, ...] = (0.2, 0.45)
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 4
    #: --sleep-on-idle (SGLang 0.5.9+): the idle server's scheduler blocks on its sockets instead of
    #: spinning a core, so the one being measured does not share the host with a busy loop.
    sleep_on_idle: bool = True
    #: Each server on its own physical cores and the client on another (Linux affinity, inherited by
    #: SGLang's scheduler and detokenizer), so that the busy Python processes of one server never take the
    #: cores of the other or of the client. (It did not calm the tiny model on the H200 VM: CV 22 % pinned
    #: vs 13 % unpinned, both within that shape's run-to-run spread; the 8B shape is what brought CV < 2 %.)
    pin_cpus: bool = True
    extra_server_args: tuple[str, ...] = ()
    #: Seconds until /health must answer 200 (the first start JIT-compiles kernels: ~70 s on an H200).
    health_timeout: float = 600.0
    #: Seconds one request may stay silent.
    request_timeout: float = 300.0
    #: The first server's port (the next ones count up); unset: free ports in [30000, 50000).
    port: int | None = None
    log_level: str = "info"
    #: "one_batch_server": also run sglang.bench_one_batch_server against the baseline (needs a tokenizer).
    bench_tool: str | None = None
    #: The last qualified run, for `max_regression_pct`: a qualification record or a throughput.json
    #: ($STACKFARM_THROUGHPUT_BASELINE wins over this).
    baseline_record: str | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Settings:
        names = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in names:
                hint = did_you_mean(key, names)
                raise MeasureError(
                    f"[suites.40-throughput.settings] {key}: unknown setting" + (f"; {hint}" if hint else "")
                )
            default = getattr(cls, key)
            values[key] = tuple(value) if isinstance(default, tuple) and isinstance(value, list) else value
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        where = "[suites.40-throughput.settings]"
        problems = []
        if self.repeats < 2:
            problems.append(f"repeats = {self.repeats}: an interval needs at least 2 samples")
        if self.max_remeasures < 0:
            problems.append(f"max_remeasures = {self.max_remeasures}: must be >= 0")
        if not self.batch_sizes or any(not isinstance(b, int) or b < 1 for b in self.batch_sizes):
            problems.append(f"batch_sizes = {list(self.batch_sizes)}: positive integers")
        if self.output_tokens < 2:
            problems.append(f"output_tokens = {self.output_tokens}: decode needs at least 2 tokens")
        if self.input_tokens < 1 or self.vocab_limit <= 3:
            problems.append("input_tokens must be >= 1 and vocab_limit > 3")
        if self.warmup_window < 2 or self.warmup_max_runs < self.warmup_window:
            problems.append("warmup_window must be >= 2 and <= warmup_max_runs")
        if len(self.mem_fraction_static) < len(self.configs()):
            problems.append(f"mem_fraction_static needs one value per configuration {self.configs()}")
        unknown = [c for c in self.cuda_graph if c not in (BASELINE, EAGLE3)]
        if unknown:
            problems.append(
                f"cuda_graph names unknown configurations {unknown}: use {BASELINE!r}, {EAGLE3!r}"
            )
        if self.model_shape not in SHAPES:
            hint = did_you_mean(self.model_shape, SHAPES)
            problems.append(
                f"model_shape = {self.model_shape!r}: known shapes are {', '.join(SHAPES)}"
                + (f"; {hint}" if hint else "")
            )
        if self.bench_tool not in (None, "one_batch_server"):
            problems.append(f"bench_tool = {self.bench_tool!r}: only 'one_batch_server' is supported")
        if self.model_path and self.eagle3 and not self.draft_model_path:
            problems.append("model_path is set with eagle3 on: set draft_model_path too (or eagle3 = false)")
        if problems:
            raise MeasureError(f"{where}: " + "; ".join(problems))

    def configs(self) -> tuple[str, ...]:
        return (BASELINE, EAGLE3) if self.eagle3 else (BASELINE,)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


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


# ------------------------------------------------------------------------------------------ servers


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    label: str
    #: sglang.launch_server arguments, host and port excluded.
    args: tuple[str, ...]
    cuda_graph: bool
    #: Anything a reader of the figures must know about this configuration.
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class ModelPaths:
    target: str
    draft: str | None
    #: "dummy" for the tiny test model (SGLang fills the weights itself), None for real checkpoints.
    load_format: str | None


def server_configs(settings: Settings, model: ModelPaths) -> tuple[ServerConfig, ...]:
    max_batch = max(settings.batch_sizes)
    configs = []
    for label, fraction in zip(settings.configs(), settings.mem_fraction_static, strict=False):
        args = [
            "--model-path", model.target,
            "--attention-backend", settings.attention_backend,
            "--sampling-backend", settings.sampling_backend,
            "--skip-tokenizer-init",
            "--mem-fraction-static", str(fraction),
            "--random-seed", str(settings.seed),
            "--log-level", settings.log_level,
        ]  # fmt: skip
        if model.load_format:
            args += ["--load-format", model.load_format]
        if settings.sleep_on_idle:
            args.append("--sleep-on-idle")
        graphs = label in settings.cuda_graph
        # --cuda-graph-max-bs exists from 0.5.9 to 0.5.15 (an alias there): capture only what is measured.
        args += ["--cuda-graph-max-bs", str(max_batch)] if graphs else ["--disable-cuda-graph"]
        note = ""
        if label == EAGLE3:
            if model.draft is None:
                raise MeasureError("EAGLE-3 is on but no draft model is known: set settings.draft_model_path")
            args += [
                "--speculative-algorithm", "EAGLE3",
                "--speculative-draft-model-path", model.draft,
                "--speculative-num-steps", str(settings.speculative_num_steps),
                "--speculative-eagle-topk", str(settings.speculative_eagle_topk),
                "--speculative-num-draft-tokens", str(settings.speculative_num_draft_tokens),
            ]  # fmt: skip
            if model.load_format:
                args += ["--speculative-draft-load-format", model.load_format]
            if not graphs:
                note = (
                    "EAGLE-3 ran without CUDA graphs (its graph capture imports nvidia-cutlass-dsl); "
                    + ("the baseline ran with them, so eagle3_over_baseline is not like for like"
                       if BASELINE in settings.cuda_graph else "like the baseline")
                )  # fmt: skip
        args += list(settings.extra_server_args)
        configs.append(ServerConfig(label=label, args=tuple(args), cuda_graph=graphs, note=note))
    return tuple(configs)


def cuda_home() -> str | None:
    """A CUDA toolkit folder holding bin/nvcc and include/cuda_runtime.h, for SGLang's JIT kernels.

    tvm-ffi (SGLang's JIT) guesses the toolkit as the folder above `which nvcc`; on the H200 machines nvcc
    is a wrapper script in /usr/local/bin, so also look at the nvcc the wrapper names, /usr/local/cuda*,
    and the toolkit pip installs (nvidia/cu13 in site-packages).
    """
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc is not None:
        candidates.append(str(Path(nvcc).resolve().parents[1]))
        with contextlib.suppress(OSError):
            script = Path(nvcc).read_bytes()[:4096].decode("utf-8", errors="ignore")
            words = (w.strip("'\"") for w in script.split())
            candidates += [str(Path(w).parents[1]) for w in words if w.endswith("/bin/nvcc")]
    candidates += sorted((str(p) for p in Path("/usr/local").glob("cuda*")), reverse=True)
    candidates += [str(Path(entry or ".") / "nvidia" / "cu13") for entry in sys.path]
    for candidate in candidates:
        if candidate and all((Path(candidate) / f).is_file() for f in ("bin/nvcc", "include/cuda_runtime.h")):
            return candidate
    return None


def _cudart_shim(home: Path, scratch: Path) -> Path:
    """`home` itself when it has lib64/libcudart.so; else a folder of links that adds one (tvm-ffi links it)."""
    if any((home / d / "libcudart.so").exists() for d in ("lib64", "lib")):
        return home
    versioned = sorted(
        p for d in ("lib64", "lib", "targets/x86_64-linux/lib") for p in (home / d).glob("libcudart.so.*")
    )
    if not versioned:
        return home
    shim = scratch / "cuda-home"
    (shim / "lib64").mkdir(parents=True, exist_ok=True)
    for name in ("bin", "include", "nvvm"):
        if (home / name).exists() and not (shim / name).exists():
            (shim / name).symlink_to((home / name).resolve())
    link = shim / "lib64" / "libcudart.so"
    if not link.exists():
        link.symlink_to(versioned[0].resolve())
    return shim


def server_env(sglang_root: str | None, scratch: Path) -> dict[str, str]:
    """The environment a server runs in: offline, JIT caches shared across runs, the toolkit found."""
    env = {**SGLANG_OFFLINE_ENV, **os.environ}
    home = cuda_home()
    path = [str(Path(sys.executable).parent)]  # ninja from the pip package, for tvm-ffi
    if home is not None:
        shim = _cudart_shim(Path(home), scratch)
        env["CUDA_HOME"] = str(shim)
        path.insert(0, str(shim / "bin"))
    env["PATH"] = os.pathsep.join([*path, env.get("PATH", "")])
    if sglang_root:  # the cell's (patched) SGLang first, so the code under test is what the server imports
        env["PYTHONPATH"] = os.pathsep.join(p for p in (sglang_root, env.get("PYTHONPATH", "")) if p)
    return env


@dataclass(frozen=True, kw_only=True)
class ServerSpec:
    label: str
    #: The whole command line, port included.
    argv: tuple[str, ...]
    host: str
    port: int
    env: Mapping[str, str] | None = None
    log: Path
    #: CPUs the server and every process it starts run on; None: wherever the kernel puts them.
    cpus: tuple[int, ...] | None = None
    health_path: str = "/health"
    health_timeout: float = 600.0
    #: Seconds one health request may take (a hung server must not stall the deadline).
    probe_timeout: float = 5.0
    poll_interval: float = 0.5

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def sglang_server_argv(python: str, config: ServerConfig, host: str, port: int) -> tuple[str, ...]:
    return (python, "-m", "sglang.launch_server", *config.args, "--host", host, "--port", str(port))


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _status(url: str, timeout: float) -> int | None:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", parts.path or "/")
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):  # refused, reset, timed out: not up yet
        return None
    finally:
        conn.close()


class RunningServer:
    """A server process in its own session; `stop` ends the whole group (SGLang's scheduler children too)."""

    def __init__(self, spec: ServerSpec, process: subprocess.Popen[bytes]) -> None:
        self.spec = spec
        self.process = process

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.spec.log, lines)

    def _error(self, what: str) -> ServerStartError:
        return ServerStartError(
            f"{self.spec.label} server {what}\n  command: {' '.join(self.spec.argv)}\n"
            f"--- last lines of {self.spec.log} ---\n{self.log_tail()}"
        )

    def wait_healthy(self) -> float:
        """Seconds until ``health_path`` answered 200; ServerStartError on an exit or at the deadline."""
        start = time.monotonic()
        url = self.spec.base_url + self.spec.health_path
        while True:
            code = self.process.poll()
            if code is not None:
                raise self._error(f"exited with code {code} before it became healthy")
            left = self.spec.health_timeout - (time.monotonic() - start)
            if _status(url, max(0.1, min(self.spec.probe_timeout, left))) == 200:
                return time.monotonic() - start
            if time.monotonic() - start > self.spec.health_timeout:
                raise self._error(
                    f"not healthy after {self.spec.health_timeout:g} s ({self.spec.health_path} never answered 200)"
                )
            time.sleep(self.spec.poll_interval)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace: float = 15.0) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace)
        # Whatever the group left behind (SGLang's scheduler and detokenizer processes) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _child_setup(cpus: tuple[int, ...] | None) -> None:
    """In the server's child process, before exec: its CPUs (inherited by SGLang's children), and death
    with its parent."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    _die_with_parent()


def _die_with_parent() -> None:
    """In the server's child process: SIGKILL it when its parent (pytest) dies.

    The runner kills a suite that overruns its timeout with SIGKILL, which runs no cleanup; without this the
    servers (in their own sessions) would hold the GPU on. SGLang's scheduler and detokenizer already die
    with the server (they set the same flag on themselves).
    """
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def launch(spec: ServerSpec) -> RunningServer:
    """Start `spec` and wait until it is healthy. The port must be free before anything starts."""
    ensure_port_free(spec.host, spec.port)
    spec.log.parent.mkdir(parents=True, exist_ok=True)
    with spec.log.open("wb") as log:
        # Popen, not proc.call: a server must outlive the call that starts it. Its own session, so SGLang's
        # tree-kill on failure cannot reach pytest and `stop` can end every process it spawned.
        process = subprocess.Popen(
            list(spec.argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(spec.env) if spec.env is not None else None,
            start_new_session=True,
            preexec_fn=functools.partial(_child_setup, spec.cpus),  # noqa: PLW1509 - pytest's main thread starts no other threads first
        )
    server = RunningServer(spec, process)
    try:
        server.wait_healthy()
    except BaseException:
        server.stop(grace=5.0)
        raise
    return server


# ------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True, kw_only=True)
class RequestResult:
    """One /generate request of `batch_size` prompts, timed from the client's side."""

    batch_size: int
    input_len: int
    output_len: int
    #: Per item: completion tokens, seconds to the first chunk with a token, to the last chunk, and how
    #: many tokens the first chunk held (EAGLE-3 may accept several at once).
    tokens: tuple[int, ...]
    first_s: tuple[float, ...]
    last_s: tuple[float, ...]
    first_tokens: tuple[int, ...]
    #: Mean of the items' spec_accept_length (completion tokens / verify steps), None without speculation.
    accept_length: float | None = None

    @property
    def latency_s(self) -> float:
        return max(self.last_s)

    @property
    def last_ttft_s(self) -> float:
        return max(self.first_s)

    @property
    def output_tok_s(self) -> float:
        """Decode throughput: the sum over items of tokens after the first chunk / time after it."""
        return sum(
            (n - f) / (last - first)
            for n, f, first, last in zip(
                self.tokens, self.first_tokens, self.first_s, self.last_s, strict=True
            )
        )

    @property
    def itl_ms(self) -> float:
        """Mean inter-token latency after the first chunk, over the items, in ms."""
        per_item = [
            (last - first) / (n - f) * 1000
            for n, f, first, last in zip(
                self.tokens, self.first_tokens, self.first_s, self.last_s, strict=True
            )
        ]
        return sum(per_item) / len(per_item)


def summarise(
    events: Sequence[tuple[float, Mapping[str, Any]]], *, batch_size: int, input_len: int, output_len: int
) -> RequestResult:
    """A RequestResult from the streamed events: (seconds since the request was sent, decoded event)."""
    tokens = [0] * batch_size
    first: list[float | None] = [None] * batch_size
    first_tokens = [0] * batch_size
    last = [0.0] * batch_size
    accept: list[float | None] = [None] * batch_size
    for when, event in events:
        if "error" in event:
            raise BenchError(f"the server reported an error: {event['error']}")
        index = int(event.get("index", 0))
        if not 0 <= index < batch_size:
            raise BenchError(f"an event for item {index} of a batch of {batch_size}")
        meta = event.get("meta_info") or {}
        count = meta.get("completion_tokens")
        if count is None:
            count = len(event.get("output_ids") or ())
        count = int(count)
        if count > 0 and first[index] is None:
            first[index], first_tokens[index] = when, count
        if count > tokens[index]:
            tokens[index], last[index] = count, when
        if meta.get("spec_accept_length") is not None:
            accept[index] = float(meta["spec_accept_length"])
    where = f"a request of {batch_size} x {output_len} new tokens"
    if not events or not any(tokens):
        raise ZeroTokensError(f"the server returned 0 tokens for {where}")
    empty = [i for i, n in enumerate(tokens) if n == 0]
    if empty:
        raise ZeroTokensError(f"items {empty} of {where} received 0 tokens")
    short = {i: n for i, n in enumerate(tokens) if n < output_len}
    if short:
        raise BenchError(f"{where} (ignore_eos) came back short: item -> tokens {short}")
    firsts = [f for f in first if f is not None]
    no_decode = [i for i in range(batch_size) if tokens[i] <= first_tokens[i] or last[i] <= firsts[i]]
    if no_decode:
        raise BenchError(f"items {no_decode} of {where} arrived in one chunk: no decode time to measure")
    accepts = [a for a in accept if a is not None]
    return RequestResult(
        batch_size=batch_size,
        input_len=input_len,
        output_len=output_len,
        tokens=tuple(tokens),
        first_s=tuple(firsts),
        last_s=tuple(last),
        first_tokens=tuple(first_tokens),
        accept_length=sum(accepts) / len(accepts) if accepts else None,
    )


def generate(
    base_url: str, prompts: Sequence[Sequence[int]], output_len: int, *, timeout: float
) -> RequestResult:
    """POST /generate (input_ids, greedy, ignore_eos, streamed) and time every item's tokens."""
    parts = urllib.parse.urlsplit(base_url)
    batch = len(prompts)
    payload = {
        "input_ids": [list(p) for p in prompts] if batch > 1 else list(prompts[0]),
        "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True},
        "stream": True,
    }
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    events: list[tuple[float, Mapping[str, Any]]] = []
    try:
        start = time.perf_counter()
        conn.request(
            "POST", "/generate", body=json.dumps(payload), headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        if response.status != 200:
            body = response.read()[:500].decode("utf-8", errors="replace")
            raise BenchError(f"{base_url}/generate answered HTTP {response.status}: {body}")
        for raw in response:  # server-sent events: "data: {...}" lines, then "data: [DONE]"
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            events.append((time.perf_counter() - start, json.loads(data)))
    except TimeoutError as exc:
        raise BenchError(f"{base_url}/generate timed out: no data for {timeout:g} s") from exc
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
        raise BenchError(f"{base_url}/generate failed: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    return summarise(
        events, batch_size=batch, input_len=len(prompts[0]) if prompts else 0, output_len=output_len
    )


# ------------------------------------------------------------------------------------------ noise


@dataclass(frozen=True, kw_only=True)
class Warmup:
    rates: tuple[float, ...]
    stable: bool
    window: int
    tolerance: float


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: how far apart the values are, relative to their middle."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else float("inf")


def warm_up(run: Callable[[], float], *, window: int, tolerance: float, max_runs: int) -> Warmup:
    """Call `run` until its last `window` results lie within `tolerance` (relative spread), or `max_runs`."""
    rates: list[float] = []
    while len(rates) < max_runs:
        rates.append(run())
        if len(rates) >= window and spread(rates[-window:]) <= tolerance:
            return Warmup(rates=tuple(rates), stable=True, window=window, tolerance=tolerance)
    return Warmup(rates=tuple(rates), stable=False, window=window, tolerance=tolerance)


def schedule(configs: Sequence[str], batch_sizes: Sequence[int], rounds: int) -> list[tuple[int, int, str]]:
    """(round, batch, config) in measuring order: per round and batch size, every configuration in turn.

    With configs (A, B) that is A B A B ...: a slow drift of clocks or temperature lands on both alike,
    and the i-th A and B of a batch size form a pair (their ratio cancels the drift).
    """
    return [(r, b, c) for r in range(rounds) for b in batch_sizes for c in configs]


#: How Measurement sends one request: (base URL, prompts, new tokens) -> result (tests pass a fake).
Send = Callable[[str, Sequence[Sequence[int]], int], RequestResult]


class Measurement:
    """Requests against running servers, kept per (configuration, batch size) in measuring order."""

    def __init__(self, endpoints: Mapping[str, str], settings: Settings, *, run: Send | None = None) -> None:
        self.endpoints = dict(endpoints)
        self.settings = settings
        self._run: Send = run or (lambda url, p, n: generate(url, p, n, timeout=settings.request_timeout))
        self._rng = random.Random(settings.seed)
        self.results: dict[tuple[str, int], list[RequestResult]] = {}
        self.warmups: dict[str, Warmup] = {}
        self.rounds = 0

    def _prompts(self, batch: int) -> list[list[int]]:
        # Fresh ids for every request: a repeated prompt would hit the radix cache and shorten its TTFT.
        limit, length = self.settings.vocab_limit, self.settings.input_tokens
        return [[self._rng.randrange(3, limit) for _ in range(length)] for _ in range(batch)]

    def request(self, config: str, batch: int) -> RequestResult:
        return self._run(self.endpoints[config], self._prompts(batch), self.settings.output_tokens)

    def sizes(self) -> list[int]:
        """The batch sizes a round measures: 1 (single-stream decode, the seeds' figure) and the configured."""
        return sorted({1, *self.settings.batch_sizes})

    def warm_up(self) -> dict[str, Warmup]:
        s = self.settings
        for config in self.endpoints:
            self.warmups[config] = warm_up(
                functools.partial(self._decode_rate, config),
                window=s.warmup_window,
                tolerance=s.warmup_tolerance,
                max_runs=s.warmup_max_runs,
            )
        for batch in sorted(set(s.batch_sizes) - {1}):
            for _ in range(s.warmup_batches):
                for config in self.endpoints:
                    self.request(config, batch)
        return self.warmups

    def _decode_rate(self, config: str) -> float:
        return self.request(config, 1).output_tok_s

    def run_rounds(self, rounds: int, batch_sizes: Sequence[int] | None = None) -> None:
        sizes = list(batch_sizes) if batch_sizes is not None else self.sizes()
        for _, batch, config in schedule(tuple(self.endpoints), sizes, rounds):
            self.results.setdefault((config, batch), []).append(self.request(config, batch))
        self.rounds += rounds

    def figures(self) -> dict[str, list[float]]:
        return figures(self.results)

    def remeasure(self, figure: str) -> Callable[[], list[float]]:
        """A function that measures `repeats` more rounds at `figure`'s batch size and returns its new samples."""
        batch = figure_batch(figure) or 1

        def more() -> list[float]:
            before = len(self.figures().get(figure, []))
            self.run_rounds(self.settings.repeats, [batch])
            return self.figures()[figure][before:]

        return more


def figures(results: Mapping[tuple[str, int], Sequence[RequestResult]]) -> dict[str, list[float]]:
    """Samples per figure name (see stackfarm.throughput.thresholds) from requests per (config, batch)."""
    out: dict[str, list[float]] = {}
    for (config, batch), runs in sorted(results.items()):
        prefix = "" if config == BASELINE else f"{config}_"
        if batch == 1:
            out[f"{prefix}decode_tok_s"] = [r.output_tok_s for r in runs]
            out[f"{prefix}ttft_ms"] = [r.last_ttft_s * 1000 for r in runs]
            out[f"{prefix}itl_ms"] = [r.itl_ms for r in runs]
            accepts = [r.accept_length for r in runs if r.accept_length is not None]
            if config == EAGLE3 and accepts:
                out["eagle3_accept_length"] = accepts
        else:
            out[f"{prefix}batch{batch}_tok_s"] = [r.output_tok_s for r in runs]
            out[f"{prefix}batch{batch}_ttft_ms"] = [r.last_ttft_s * 1000 for r in runs]
    base, spec = results.get((BASELINE, 1), ()), results.get((EAGLE3, 1), ())
    if base and spec:  # the i-th A and the i-th B ran back to back: their ratio cancels slow drift
        out["eagle3_over_baseline"] = [
            s.output_tok_s / b.output_tok_s for b, s in zip(base, spec, strict=False)
        ]
    return out


__all__ = [
    "BASELINE",
    "EAGLE3",
    "NVIDIA_SMI_FIELDS",
    "PORT_RANGE",
    "BenchError",
    "CpuPlacement",
    "GpuInfo",
    "MeasureError",
    "Measurement",
    "ModelPaths",
    "PortInUseError",
    "RequestResult",
    "RunningServer",
    "ServerConfig",
    "ServerSpec",
    "ServerStartError",
    "Settings",
    "Warmup",
    "ZeroTokensError",
    "available_cpus",
    "cpu_placement",
    "cuda_home",
    "ensure_port_free",
    "figures",
    "free_ports",
    "generate",
    "launch",
    "parse_gpu_csv",
    "physical_cores",
    "pinned",
    "port_free",
    "query_gpus",
    "schedule",
    "server_configs",
    "server_env",
    "sglang_server_argv",
    "spread",
    "summarise",
    "tail",
    "warm_up",
]
