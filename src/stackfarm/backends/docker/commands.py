"""What stackfarm asks of the engine for a container and a build, and what it reads back from its output.

Pure: `create_options` returns the Docker SDK's `containers.create` arguments for a suite run, `build_argv` the
`docker build` argument list (never a shell string; every value validated first), `parse_build_failure` and
`parse_loaded_image` read text. `engine.DockerEngine` uses them.
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

_STEP = re.compile(r"^#(\d+) (\[.+)$")
_STEP_LINE = re.compile(r"^#(\d+) (?:\d+\.\d+ )?(.*)$")
_STEP_ERROR = re.compile(r"^#(\d+) ERROR: (.*)$")
_STEP_STATUS = re.compile(r"^(?:sha256:[0-9a-f]+|DONE [0-9.]+s|CACHED)$")
_DISK_FULL = re.compile(r"no space left on device", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class BuildFailure:
    #: The failing instruction as BuildKit names it, e.g. "[torch 1/1] RUN ... pip install ...".
    step: str
    #: BuildKit's one-line reason, e.g. "executor failed running [...]: exit code: 1".
    reason: str
    #: The last lines that step printed.
    tail: tuple[str, ...]
    disk_full: bool


def parse_build_failure(output: str) -> BuildFailure:
    """Which step of a `docker build --progress=plain` failed, why, and the last lines it printed."""
    lines = output.splitlines()
    titles: dict[str, str] = {}
    failed: tuple[str, str] | None = None
    for line in lines:
        if m := _STEP.match(line):
            titles.setdefault(m[1], m[2])
        elif (m := _STEP_ERROR.match(line)) and failed is None:
            failed = (m[1], m[2])
    disk_full = bool(_DISK_FULL.search(output))
    if failed is None:
        tail = tuple(line for line in lines if line.strip())[-_TAIL:]
        reason = next((line for line in reversed(lines) if line.lower().startswith(("error", "failed"))), "")
        return BuildFailure(step="(before any build step)", reason=reason, tail=tail, disk_full=disk_full)
    number, reason = failed
    own = []
    for line in lines:
        if _STEP.match(line) or _STEP_ERROR.match(line):
            continue
        m = _STEP_LINE.match(line)
        if m and m[1] == number and not _STEP_STATUS.match(m[2]):
            own.append(m[2])
    title = titles.get(number, f"step #{number}")
    return BuildFailure(step=title[:200], reason=reason, tail=tuple(own[-_TAIL:]), disk_full=disk_full)


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
    "parse_build_failure",
    "parse_loaded_image",
]
