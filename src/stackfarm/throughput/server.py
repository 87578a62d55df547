"""SGLang servers for a measurement: their command lines, their environment, and their lives.

`server_configs` turns the settings into one `ServerConfig` per configuration (baseline first, then EAGLE-3);
`server_env` gives them an offline environment with a CUDA toolkit for SGLang's JIT kernels; `launch` starts
one as ``python -m sglang.launch_server`` on a free port in its own process session (SGLang kills its whole
process tree when it fails), polls ``/health`` until it answers 200, and on a timeout or an early exit raises
`ServerStartError` with the tail of the server's log. `RunningServer.stop` ends the whole process group.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..numerics.tinymodels import SGLANG_OFFLINE_ENV
from ..proc import register_group
from .errors import MeasureError, ServerStartError
from .machine import ensure_port_free
from .settings import BASELINE, EAGLE3, Settings


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
            "--model-path",
            model.target,
            "--attention-backend",
            settings.attention_backend,
            "--sampling-backend",
            settings.sampling_backend,
            "--skip-tokenizer-init",
            "--mem-fraction-static",
            str(fraction),
            "--random-seed",
            str(settings.seed),
            "--log-level",
            settings.log_level,
        ]
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
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-draft-model-path",
                model.draft,
                "--speculative-num-steps",
                str(settings.speculative_num_steps),
                "--speculative-eagle-topk",
                str(settings.speculative_eagle_topk),
                "--speculative-num-draft-tokens",
                str(settings.speculative_num_draft_tokens),
            ]
            if model.load_format:
                args += ["--speculative-draft-load-format", model.load_format]
            if not graphs:
                note = "EAGLE-3 ran without CUDA graphs (its graph capture imports nvidia-cutlass-dsl); " + (
                    "the baseline ran with them, so eagle3_over_baseline is not like for like"
                    if BASELINE in settings.cuda_graph
                    else "like the baseline"
                )
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
    register_group(process.pid)  # the runner reaps it if the suite ends (or times out) before it does
    server = RunningServer(spec, process)
    try:
        server.wait_healthy()
    except BaseException:
        server.stop(grace=5.0)
        raise
    return server


__all__ = [
    "ModelPaths",
    "RunningServer",
    "ServerConfig",
    "ServerSpec",
    "cuda_home",
    "launch",
    "server_configs",
    "server_env",
    "sglang_server_argv",
    "tail",
]
