"""What every module of the Docker backend shares: its errors, the paths inside a cell image, the labels it puts
on images and containers, and the validation of every value that reaches a `docker` command line (the grammar itself is
stackfarm.dockergrammar, which matrix.toml's schema reads too).

Pure: nothing here calls the engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ...dockergrammar import (
    ARG_NAME,
    IMAGE_REF,
    PYTHON,
    REGISTRY,
    SAFE_VALUE,
    SIZE,
    ULIMIT_VALUE,
    ULIMITS,
    normal_registry,
)
from ...errors import CellError, EnvironmentProblem

# Paths inside the image (docker/Dockerfile creates them).
VENV = "/opt/stackfarm/venv"
PROJECT = "/stackfarm/project"
SRC = "/stackfarm/src"
RUN_SPEC = "/stackfarm/run/cell.json"
OUT = "/stackfarm/out"
#: The image's unprivileged user (a fixed uid: Ubuntu 24.04 images already give 1000 to `ubuntu`).
USER = "10001"

IMAGE_REPOSITORY = "stackfarm"
LABEL_CELL = "org.stackfarm.cell"
LABEL_INPUTS = "org.stackfarm.inputs"
LABEL_RUN = "org.stackfarm.run"
#: The tag every pushed cell image also gets in the registry: the newest image of that cell, for --cache-from.
CACHE_TAG = "latest"
#: matrix.toml's [docker] registry can be overridden per runner (CI's own registry).
REGISTRY_ENV = "STACKFARM_REGISTRY"

#: /dev/shm for runs without --ipc=host: the size SGLang's own `docker run` example gives.
DEFAULT_SHM_SIZE = "32g"

# -- errors --------------------------------------------------------------------------------------------------


class DockerError(CellError):
    """The Docker backend could not build or run a cell; the message says which step and how to fix it."""


class EngineError(EnvironmentProblem):
    """No usable Docker engine: not installed, not answering, too old, without BuildKit, or the Docker SDK for
    Python missing. An environment problem (exit 4): nothing about the cell is known."""


class RegistryError(EnvironmentProblem):
    """The configured registry does not answer, refuses a push, or serves an image that is not what its tag
    claims. An environment problem: the cell may be fine, but the shared store is not."""


class BuildError(DockerError):
    """A build step failed; the message names the step and shows the last lines of its log."""


class DiskFullError(DockerError):
    """The engine's disk (or the cache's) is full."""


# -- validation ----------------------------------------------------------------------------------------------


def validate_image_ref(ref: str) -> str:
    if not IMAGE_REF.fullmatch(ref):
        raise DockerError(
            f"{ref!r} is not a valid image reference (like nvidia/cuda:12.8.1-devel-ubuntu24.04)"
        )
    return ref


def validate_registry(value: str, *, where: str = "[docker] registry") -> str:
    """`host[:port][/prefix]`, e.g. "127.0.0.1:5000" or "ghcr.io/my-org/stackfarm"; no scheme, no tag."""
    registry = normal_registry(value)
    if not REGISTRY.fullmatch(registry):
        raise DockerError(
            f'{where} = {value!r} is not a registry like "127.0.0.1:5000" or "ghcr.io/org/prefix" '
            "(host[:port][/path], lower-case path, no http:// and no tag)"
        )
    return registry


def validate_build_args(args: Mapping[str, str]) -> dict[str, str]:
    """Build args as given, once every name and value is plain: they go to `docker build` as list items, and
    the Dockerfile expands them in shell commands, so a metacharacter would be code."""
    for name, value in args.items():
        if not ARG_NAME.fullmatch(name):
            raise DockerError(f"build arg name {name!r} must be UPPER_CASE letters, digits and _")
        if not SAFE_VALUE.fullmatch(value):
            raise DockerError(f"build arg {name}={value!r} holds a character outside [A-Za-z0-9._:/@+=-]")
    if "BASE" in args:
        validate_image_ref(args["BASE"])
    if "PYTHON" in args and not PYTHON.fullmatch(args["PYTHON"]):
        raise DockerError(f"build arg PYTHON={args['PYTHON']!r} is not like 3.11")
    return dict(args)


def validate_shm_size(value: str) -> str:
    if not re.fullmatch(SIZE, value):
        raise DockerError(f"[docker] shm_size = {value!r}: use a size like 16g, 512m or 1073741824")
    return value


def validate_ulimits(ulimits: Mapping[str, str | int]) -> tuple[tuple[str, str], ...]:
    out = []
    for name, raw in sorted(ulimits.items()):
        value = str(raw)
        if name not in ULIMITS:
            raise DockerError(f"[docker] ulimits.{name}: unknown limit; use one of {', '.join(ULIMITS)}")
        if not re.fullmatch(ULIMIT_VALUE, value):
            raise DockerError(f"[docker] ulimits.{name} = {value!r}: use an integer, -1, or soft:hard")
        out.append((name, value))
    return tuple(out)


def site_packages(python: str) -> str:
    """The one site-packages every wheel of the cell is installed into."""
    if not PYTHON.fullmatch(python):
        raise DockerError(f"python axis value {python!r} is not like 3.11")
    return f"{VENV}/lib/python{python}/site-packages"


__all__ = [
    "CACHE_TAG",
    "DEFAULT_SHM_SIZE",
    "IMAGE_REPOSITORY",
    "LABEL_CELL",
    "LABEL_INPUTS",
    "LABEL_RUN",
    "OUT",
    "PROJECT",
    "REGISTRY_ENV",
    "RUN_SPEC",
    "SRC",
    "USER",
    "VENV",
    "BuildError",
    "DiskFullError",
    "DockerError",
    "EngineError",
    "RegistryError",
    "site_packages",
    "validate_build_args",
    "validate_image_ref",
    "validate_registry",
    "validate_shm_size",
    "validate_ulimits",
]
