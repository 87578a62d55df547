"""What stackfarm asks of the engine for a container and a build, and what it reads back from its output.

Pure: `create_options` returns the Docker SDK's `containers.create` arguments for a suite run, `build_argv` the
`docker build` argument list (never a shell string; every value validated first), `parse_build_failure` and
`parse_loaded_image` read text, `failure_text` says what failed. `engine.DockerEngine` uses them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import (
    DEFAULT_SHM_SIZE,
    LABEL_RUN,
    DockerError,
    validate_build_args,
    validate_image_ref,
    validate_shm_size,
)

_TAIL = 25
#: How much of a step's name a build error's first line keeps (a RUN line can be long).
_STEP_SHOWN = 120

# -- containers ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Mount:
    source: Path
    target: str
    read_only: bool = True


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """What one container gets. GPU runs add --gpus all, --ipc=host (docker then ignores --shm-size: the
    host's /dev/shm is used) and the ulimits; other runs get a private /dev/shm of `shm_size`."""

    image: str
    argv: tuple[str, ...]
    mounts: tuple[Mount, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    gpus: bool = False
    ipc_host: bool = True
    shm_size: str = DEFAULT_SHM_SIZE
    ulimits: tuple[tuple[str, str], ...] = ()
    network: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    #: uid[:gid] to run as; None keeps the image's unprivileged user.
    user: str | None = None


def _ulimit(name: str, value: str) -> dict[str, int | str]:
    """`--ulimit`'s "N" (soft = hard = N) or "soft:hard" as the API's {name, soft, hard}."""
    soft, _, hard = value.partition(":")
    return {"name": name, "soft": int(soft), "hard": int(hard or soft)}


def create_options(spec: ContainerSpec, name: str) -> dict[str, Any]:
    """The keyword arguments of the Docker SDK's `containers.create` for a suite run (plain values: the SDK
    turns the dicts into its Mount/DeviceRequest/Ulimit types). What `docker create` would get: --init, no new
    privileges, never --privileged, never the engine's socket; bind mounts read-only unless a Mount says not."""
    if spec.user is not None and not re.fullmatch(r"[0-9]+(?::[0-9]+)?", spec.user):
        raise DockerError(f"user {spec.user!r} is not uid or uid:gid")
    for mount in spec.mounts:
        if not str(mount.source).startswith("/") or not mount.target.startswith("/"):
            raise DockerError(f"cannot mount {mount.source} at {mount.target}: both must be absolute paths")
    options: dict[str, Any] = {
        "image": validate_image_ref(spec.image),
        "command": list(spec.argv),
        "name": name,
        "init": True,
        "security_opt": ["no-new-privileges"],
        "labels": {**dict(spec.labels), LABEL_RUN: name},
        "mounts": [
            {"Type": "bind", "Source": str(m.source), "Target": m.target, "ReadOnly": m.read_only}
            for m in spec.mounts
        ],
        "environment": [f"{key}={value}" for key, value in spec.env],
        "detach": True,
    }
    if spec.network is not None:
        options["network_mode"] = spec.network
    if spec.user is not None:
        options["user"] = spec.user
    if spec.gpus:
        options["device_requests"] = [{"count": -1, "capabilities": [["gpu"]]}]  # --gpus all
        if spec.ipc_host:
            options["ipc_mode"] = "host"  # the host's /dev/shm: a --shm-size would be ignored
        else:
            options["shm_size"] = validate_shm_size(spec.shm_size)
        options["ulimits"] = [_ulimit(key, value) for key, value in spec.ulimits]
    else:
        options["shm_size"] = validate_shm_size(spec.shm_size)
    return options


def build_argv(
    executable: str,
    *,
    dockerfile: Path,
    context: Path,
    tag: str,
    build_args: Mapping[str, str],
    labels: Mapping[str, str],
    secrets: Mapping[str, Path] = {},
    target: str | None = None,
    cache_from: Sequence[str] = (),
) -> list[str]:
    """`docker build` with BuildKit's plain progress. Every image carries BuildKit's inline cache metadata
    (BUILDKIT_INLINE_CACHE=1: no layer of its own), so once pushed it can be another runner's `cache_from`."""
    argv = [
        executable,
        "build",
        "--progress=plain",
        "--file",
        str(dockerfile),
        "--tag",
        validate_image_ref(tag),
    ]
    for key, value in validate_build_args({**build_args, "BUILDKIT_INLINE_CACHE": "1"}).items():
        argv += ["--build-arg", f"{key}={value}"]
    for ref in cache_from:
        argv += ["--cache-from", validate_image_ref(ref)]
    for key, value in sorted(labels.items()):
        argv += ["--label", f"{key}={value}"]
    for key, path in sorted(secrets.items()):
        # Credentials reach RUN steps as BuildKit secrets: never in a layer, an ARG or the image's history.
        argv += ["--secret", f"id={key},src={path}"]
    if target is not None:
        argv += ["--target", target]
    return [*argv, str(context)]


# -- reading the engine's output -----------------------------------------------------------------------------
#
# BuildKit's plain progress (docker 20.10's built-in BuildKit and buildx alike; 20.10's client has no
# --progress=rawjson) is one block per vertex: "#N <name>", then "#N <seconds> <line>" for what it printed, and
# "#N DONE|CACHED|CANCELED|ERROR: <why>". Several vertices may say ERROR: the import of a --cache-from manifest
# that is not in the registry yet (BuildKit carries on without it) and steps cancelled because another failed.
# The failing step is the one whose error is the build's own last word (20.10: the last line; buildx:
# "ERROR: failed to solve: <why>"), which ends with that vertex's error.

_VERTEX = re.compile(r"^#(\d+) (.*)$")
_LOGGED = re.compile(r"^(?:\d+\.\d+(?: |$))?(.*)$")
_STATUS = re.compile(r"^(?:sha256:[0-9a-f]+|DONE [0-9.]+s|CACHED|CANCELED|\.\.\.)$")
_SOLVE = re.compile(r"^(?:ERROR: )?failed to solve(?: with frontend [^:]+)?: (.*)$")
#: A line that says what went wrong: a compiler's or pip's "error"/"fatal", a Python exception's "XError:".
_ERROR_LINE = re.compile(r"(?i:\berror\b|\bfatal\b)|[a-z]Error:|\w+Exception:")
_DISK_FULL = re.compile(r"no space left on device", re.IGNORECASE)
#: Vertices whose error does not fail a build: a --cache-from manifest BuildKit could not import.
_BENIGN = ("importing cache manifest from ",)


@dataclass(frozen=True, kw_only=True)
class BuildFailure:
    #: The failing instruction as BuildKit names it, e.g. "[torch 1/1] RUN ... pip install ...".
    step: str
    #: BuildKit's one-line reason, e.g. "executor failed running [...]: exit code: 1".
    reason: str
    #: The first line the step printed that says error (a compiler's, pip's, Python's), "" when none did.
    error_line: str
    #: The last lines that step printed.
    tail: tuple[str, ...]
    disk_full: bool


@dataclass
class _Vertex:
    title: str
    errors: list[str]
    lines: list[str]


def _vertices(lines: Sequence[str]) -> dict[str, _Vertex]:
    """Every "#N" block of the output, in the order BuildKit first named them."""
    found: dict[str, _Vertex] = {}
    for line in lines:
        m = _VERTEX.match(line)
        if m is None:
            continue
        number, text = m[1], m[2]
        vertex = found.get(number)
        if vertex is None:
            found[number] = _Vertex(title=text, errors=[], lines=[])
        elif text.startswith("ERROR: "):
            vertex.errors.append(text.removeprefix("ERROR: "))
        elif text != vertex.title and not _STATUS.match(text):
            own = _LOGGED.match(text)
            vertex.lines.append(own[1] if own else text)
    return found


def _last_word(lines: Sequence[str]) -> str:
    """What the build said last about why it failed: buildx's "failed to solve: ..." line, else (20.10) the
    last line outside the vertex blocks and the error summary."""
    solved = [m[1] for line in lines if (m := _SOLVE.match(line))]
    if solved:
        return solved[-1]
    loose = [
        line
        for line in lines
        if line.strip() and not _VERTEX.match(line) and not line.startswith((" > ", "------"))
    ]
    return loose[-1] if loose else ""


def _failing(vertices: Mapping[str, _Vertex], last: str) -> _Vertex | None:
    """The vertex that failed the build: its error is the build's last word; else the first real error."""
    real = [
        v
        for v in vertices.values()
        if v.errors and not v.title.startswith(_BENIGN) and v.errors[-1] != "context canceled"
    ]
    said = [v for v in real if last and v.errors[-1] in last]
    return next(iter(said or real), None)


def parse_build_failure(output: str) -> BuildFailure:
    """Which step of a `docker build --progress=plain` failed, why, its first error line and its last lines;
    never a --cache-from import that missed nor a step cancelled because another failed."""
    lines = output.splitlines()
    last = _last_word(lines)
    vertex = _failing(_vertices(lines), last)
    disk_full = bool(_DISK_FULL.search(output))
    if vertex is None:
        tail = tuple(line for line in lines if line.strip())[-_TAIL:]
        reason = next(
            (line for line in reversed(lines) if line.lower().startswith(("error", "failed"))), last
        )
        return BuildFailure(
            step="(before any build step)", reason=reason, error_line="", tail=tail, disk_full=disk_full
        )
    own = [line for line in vertex.lines if line.strip()]
    return BuildFailure(
        step=vertex.title[:200],
        reason=vertex.errors[-1],
        error_line=next((line.strip() for line in own if _ERROR_LINE.search(line)), ""),
        tail=tuple(own[-_TAIL:]),
        disk_full=disk_full,
    )


def failure_text(tag: str, failure: BuildFailure, log: Path) -> str:
    """The build error's text. Its first line (what the terminal and a report's one-liner show) names the
    failing step and its first error line; then BuildKit's reason, the step's last lines and the log."""
    step = failure.step if len(failure.step) <= _STEP_SHOWN else f"{failure.step[: _STEP_SHOWN - 1]}…"
    said = failure.error_line or failure.reason
    head = f"building {tag} failed at {step}" + (f": {said}" if said else "")
    lines = "".join(f"\n    {line}" for line in failure.tail)
    reason = f"\n  {failure.reason}" if failure.reason and failure.reason != said else ""
    return f"{head}{reason}{lines}\n  log: {log}"


def parse_loaded_image(output: str) -> str | None:
    """The image `docker load` printed: "Loaded image: name:tag" or "Loaded image ID: sha256:..."."""
    found = None
    for line in output.splitlines():
        if line.startswith("Loaded image: "):
            return line.removeprefix("Loaded image: ").strip()
        if line.startswith("Loaded image ID: "):
            found = line.removeprefix("Loaded image ID: ").strip()
    return found


__all__ = [
    "BuildFailure",
    "ContainerSpec",
    "Mount",
    "build_argv",
    "create_options",
    "failure_text",
    "parse_build_failure",
    "parse_loaded_image",
]
