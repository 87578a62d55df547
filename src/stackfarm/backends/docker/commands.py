"""The `docker` command lines stackfarm runs, and what it reads back from the engine's output.

Pure: `create_argv` and `build_argv` return argument lists (never a shell string; every value validated first),
`parse_build_failure` and `parse_loaded_image` read text. `engine.DockerEngine` runs them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

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


def _mount_arg(mount: Mount) -> str:
    for part in (str(mount.source), mount.target):
        # `--mount` is comma-separated key=value: a comma or newline in a path would add keys.
        if "," in part or "\n" in part:
            raise DockerError(f"cannot mount {part!r}: a path with a comma or newline; move it")
    arg = f"type=bind,source={mount.source},target={mount.target}"
    return arg + (",readonly" if mount.read_only else "")


def create_argv(executable: str, spec: ContainerSpec, name: str) -> list[str]:
    """`docker create` for a suite run. No --privileged and no engine socket, ever; no new privileges."""
    argv = [executable, "create", "--name", name, "--init", "--security-opt", "no-new-privileges"]
    for key, value in (*spec.labels, (LABEL_RUN, name)):
        argv += ["--label", f"{key}={value}"]
    for mount in spec.mounts:
        argv += ["--mount", _mount_arg(mount)]
    for key, value in spec.env:
        argv += ["--env", f"{key}={value}"]
    if spec.network is not None:
        argv += ["--network", spec.network]
    if spec.user is not None:
        if not re.fullmatch(r"[0-9]+(?::[0-9]+)?", spec.user):
            raise DockerError(f"user {spec.user!r} is not uid or uid:gid")
        argv += ["--user", spec.user]
    if spec.gpus:
        argv += ["--gpus", "all"]
        argv += ["--ipc=host"] if spec.ipc_host else ["--shm-size", validate_shm_size(spec.shm_size)]
        for key, value in spec.ulimits:
            argv += ["--ulimit", f"{key}={value}"]
    else:
        argv += ["--shm-size", validate_shm_size(spec.shm_size)]
    return [*argv, validate_image_ref(spec.image), *spec.argv]


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
) -> list[str]:
    argv = [
        executable,
        "build",
        "--progress=plain",
        "--file",
        str(dockerfile),
        "--tag",
        validate_image_ref(tag),
    ]
    for key, value in validate_build_args(build_args).items():
        argv += ["--build-arg", f"{key}={value}"]
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
    "create_argv",
    "parse_build_failure",
    "parse_loaded_image",
]
