"""The grammar of every value that reaches a `docker` command line: image references, registries, sizes,
ulimits, build args and the `{cuda}`/`{python}` placeholders of matrix.toml's [docker] base.

Ground floor: imports nothing of the harness. Both readers import it, so they cannot drift apart:
stackfarm.matrix_tables checks [docker] at load (before any work starts, without importing the backend) and
stackfarm.backends.docker.common checks each value again before it goes to the engine. Each reader words its
own errors (a schema problem names the key; a DockerError names the step); the rule is here only.

Before this module the schema kept a mirror of these patterns, and the mirror had already drifted: it refused
`{python}` in [docker] base, which the backend and the README accept.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping

# One path component of an image name, as docker's reference grammar has it.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"

#: An image reference: [host[:port]/]path[:tag][@sha256:digest]. A first part is a registry host only with a
#: dot, a port, or as localhost (docker's own rule).
IMAGE_REF = re.compile(
    r"^(?:(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::[0-9]+)?/|[A-Za-z0-9-]+:[0-9]+/)?"
    rf"{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
#: A registry with an optional path prefix: host[:port][/path], the host a name with a dot, a port, or
#: localhost; no scheme, no tag.
REGISTRY = re.compile(
    r"^(?:localhost(?::[0-9]+)?|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+(?::[0-9]+)?|[A-Za-z0-9-]+:[0-9]+)"
    rf"(?:/{_COMPONENT})*$"
)
#: A size for --shm-size: bytes, or a number with b, k, m or g (the pattern, for stackfarm.schema's Str).
SIZE = r"[1-9][0-9]*[bkmg]?"
#: A --ulimit value: an integer, -1, or soft:hard (the pattern, for stackfarm.schema's Str).
ULIMIT_VALUE = r"-?[0-9]+(?::-?[0-9]+)?"
#: The limits --ulimit knows, sorted.
ULIMITS = tuple(
    sorted(
        {"core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss"}
        | {"rtprio", "rttime", "sigpending", "stack"}
    )
)
#: A build-arg name.
ARG_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
#: Build-arg and option values: no whitespace, quotes or shell metacharacters (`;|&$<>()` and backticks).
SAFE_VALUE = re.compile(r"^[A-Za-z0-9._:/@+=-]*$")
#: The PYTHON build arg: like 3.11.
PYTHON = re.compile(r"^3\.\d{1,2}$")
#: A python axis value as `{python}` fills it in: like 3.11.
PYTHON_AXIS = re.compile(r"^\d+\.\d+$")
#: The placeholders [docker] base may hold.
BASE_PLACEHOLDERS = ("cuda", "python")


def is_base_path(base: str) -> bool:
    """A base given as a path (a tarball for `docker load`, a rootfs for `docker import`), not a name."""
    return base.startswith(("/", "./", "../", "~")) or base.endswith((".tar", ".tar.gz", ".tgz"))


def base_fields(template: str) -> frozenset[str] | None:
    """The placeholders a [docker] base template holds; None when it does not parse or holds any other than
    BASE_PLACEHOLDERS (`{torch}`, `{cuda.x}`, `{0}`)."""
    try:
        fields = frozenset(name for _, name, _, _ in string.Formatter().parse(template) if name is not None)
    except ValueError:
        return None
    return fields if fields <= set(BASE_PLACEHOLDERS) else None


def fill_base(template: str, values: Mapping[str, str]) -> str | None:
    """The template with its placeholders filled in from `values`; None when it is not a valid template (the
    reference itself is not checked: IMAGE_REF)."""
    if base_fields(template) is None:
        return None
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError):  # a conversion or format spec docker names cannot take
        return None


def is_registry(value: str) -> bool:
    """`value` names a registry (after normal_registry)."""
    return REGISTRY.fullmatch(normal_registry(value)) is not None


def normal_registry(value: str) -> str:
    """A registry setting as used: surrounding blanks and a trailing slash dropped."""
    return value.strip().rstrip("/")


__all__ = [
    "ARG_NAME",
    "BASE_PLACEHOLDERS",
    "IMAGE_REF",
    "PYTHON",
    "PYTHON_AXIS",
    "REGISTRY",
    "SAFE_VALUE",
    "SIZE",
    "ULIMITS",
    "ULIMIT_VALUE",
    "base_fields",
    "fill_base",
    "is_base_path",
    "is_registry",
    "normal_registry",
]
