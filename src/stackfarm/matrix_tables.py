"""The declared schemas of matrix.toml's tables that no suite library owns: [runners], [features], [docker] and
the keys of each [suites.<NN-name>] (its settings are declared per suite: its family.py, stackfarm.family).

matrix.load checks every table against these (stackfarm.schema) before any work starts. Each declaration
mirrors what its reader accepts:

- [runners.<kind>]: stackfarm.qualify (the GitHub Actions job matrix: runs-on labels, GPU count, cell globs) and
  stackfarm.driver (the runner's NVIDIA driver and forward compatibility, against each cell's driver floor);
- [features.<name>]: stackfarm.analysis.captables.parse_features, read by 10-capability;
- [docker]: the grammar stackfarm.backends.docker's validators apply too (stackfarm.dockergrammar, a ground-floor
  module both import: the backend is imported only when it is used; tests/test_schema.py and
  tests/test_docker_registry.py check that the two accept the same values).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from .archspec import ArchError, parse_target
from .dockergrammar import IMAGE_REF, SIZE, ULIMIT_VALUE, ULIMITS, fill_base, is_base_path, is_registry
from .errors import did_you_mean
from .schema import Bool, Either, Enum, Int, List, Map, Number, Problem, Str, Table

# --------------------------------------------------------------------------- [suites.<NN-name>]


def suite(settings: Table) -> Table:
    """[suites.<name>]: its keys, and its `settings` as the suite declares them (matrix.settings_schema)."""
    return Table(
        {
            "needs_gpu": Bool("true or false: the suite needs a GPU (skipped, not failed, without one)"),
            "gate": Bool("true or false: a failure stops the cell's later suites"),
            "timeout": Number("a number of seconds, e.g. timeout = 900", positive=True),
            "enabled": Bool("true or false: false drops the suite"),
            "settings": settings,
            "wheels": List(
                Str("a requirement", check=_requirement),
                "wheels the suite needs beyond the cell's stack, carried by a host's offline bundle (stackfarm "
                'bundle --wheelhouse); {cuda_major} is the cell\'s CUDA major, e.g. wheels = ["cuda-tile"]',
                unique=True,
            ),
        },
    )


def _requirement(text: str) -> str | None:
    """A PEP 508 requirement once {cuda_major} is filled in (stackfarm.wheelhouse reads it so)."""
    try:
        Requirement(text.replace("{cuda_major}", "13"))
    except InvalidRequirement as exc:
        return f"= {text!r} is not a requirement ({exc})"
    return None


# --------------------------------------------------------------------------- [runners.<kind>]

_KIND_COUNT = re.compile(r"^(\d+)x-")
_DRIVER = re.compile(r"^\d{3,4}(\.\d+){0,2}$")


def _driver_version(text: str) -> str | None:
    """Mirrors stackfarm.driver.driver_key: 570, 570.86 or 570.86.15."""
    if _DRIVER.fullmatch(text.strip()):
        return None
    return f'= {text!r} is not an NVIDIA driver version like "570.86.15"'


def runner(archs: Sequence[str]) -> Table:
    """One [runners.<kind>] table; its arch must be one of the [targets] `archs`."""
    return Table(
        {
            "labels": List(
                Str("a runner label"),
                'the runs-on labels, e.g. labels = ["self-hosted", "linux", "x64", "sm_120", "gpus-8"]',
                min_len=1,
            ),
            "arch": Enum(
                tuple(archs),
                f"one of [targets] archs ({', '.join(archs)}), or add it there",
                noun="target arch",
            ),
            "gpus": Int("a whole number >= 1: the GPUs the runner has", min=1),
            "cells": Either(
                (Str("a cell-id glob"), List(Str("a cell-id glob"), "")),
                'cell-id globs the runner takes, e.g. cells = ["*-sgl0.5.9"] (default ["*"])',
            ),
            "driver": Str(
                'the NVIDIA driver the runner has, quoted, e.g. driver = "570.86.15" (stackfarm.driver)',
                check=_driver_version,
            ),
            "forward_compat": Bool(
                "true or false: the runner has NVIDIA's cuda-compat package (data-center GPUs), so a newer CUDA "
                "than its driver runs"
            ),
        },
        required=("labels",),
    )


def runner_count_rule(kind: str, entry: Mapping[str, Any]) -> Problem | None:
    """A kind named `<count>x-<gpu>` has `count` GPUs: gpus must not say otherwise."""
    named = _KIND_COUNT.match(kind)
    gpus = entry.get("gpus", 1)
    if named and isinstance(gpus, int) and int(named.group(1)) != gpus:
        return Problem(
            ("gpus",),
            f"= {gpus} but the kind's name says {named.group(1)} GPUs",
            f"set gpus = {named.group(1)} or rename the kind",
            gpus,
        )
    return None


# --------------------------------------------------------------------------- [features.<name>]

_GATE = r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*"


def _strings(what: str, item: Str) -> Either:
    return Either((item, List(item, "", min_len=1)), f"{what}: a string or a non-empty list of strings")


def _off_arch(archs: Sequence[str]) -> Callable[[str], str | None]:
    targets = {}
    for arch in archs:
        try:
            targets[parse_target(arch)] = arch
        except ArchError:
            continue

    def check(key: str) -> str | None:
        try:
            arch = parse_target(key)
        except ArchError as exc:
            return f"is not a GPU arch ({exc})"
        if arch in targets:
            return None
        hint = did_you_mean(key, archs)
        return f"is not one of [targets] archs ({', '.join(archs)}): it is never checked" + (
            f"; {hint}" if hint else ""
        )

    return check


def _checks_something(entry: Mapping[str, Any]) -> list[Problem]:
    if not any(key in entry for key in ("gate", "flags", "libs")):
        return [Problem((), "names no gate, flags or libs: nothing to check", "add gate, flags or libs")]
    return []


def feature(archs: Sequence[str]) -> Table:
    """One [features.<name>] table, as captables.parse_features reads it; off's archs are [targets] archs."""
    return Table(
        {
            "gate": _strings(
                "the deciding function(s), 'module:qualname', e.g. "
                '"sglang.srt.layers.communicator:apply_flashinfer_allreduce_fusion"',
                Str("'module:qualname'", pattern=_GATE),
            ),
            "flags": _strings("server arguments that switch it on", Str("a server argument")),
            "libs": _strings("globs of the binaries it needs", Str("a glob inside a wheel")),
            "off": Map(
                Str('why it is off there, e.g. off = { sm_120 = "Hopper-only" }'),
                'where it is expected off: off = { <arch> = "why" }',
                keys=_off_arch(archs),
                noun="arch",
            ),
            "description": Str("what the feature is"),
        },
        rules=(_checks_something,),
    )


# --------------------------------------------------------------------------- [[deviation]]


def _missing_or_absent(entry: Mapping[str, Any]) -> list[Problem]:
    has_missing, absent = bool(entry.get("missing")), entry.get("absent") is True
    if has_missing == absent:
        return [
            Problem(
                (),
                "needs exactly one of missing (globs of the files left out) or absent = true (the whole wheel)",
                'e.g. missing = ["sgl_kernel/sm100/**"], or absent = true',
            )
        ]
    return []


#: One [[deviation]]: a component a host's stack deliberately lacks, wholly (absent) or in part (missing files).
#: 00-stack reports it as passed with a note (`deviation.<component>`); any other difference still fails.
DEVIATION = Table(
    {
        "component": Str('a distribution of the stack, e.g. "sglang-kernel"'),
        "missing": List(
            Str("a glob relative to the wheel's root, ** for any depth"),
            'files left out, e.g. missing = ["sgl_kernel/flash_ops*.so", "sgl_kernel/sm100/**"]',
            min_len=1,
        ),
        "absent": Bool("true: the whole wheel is left out"),
        "reason": Str('why, e.g. "FA3 is 1.7 GB, not carried to the H200"'),
    },
    required=("component", "reason"),
    rules=(_missing_or_absent,),
)


# --------------------------------------------------------------------------- [docker]


def _base(template: str) -> str | None:
    """backends.docker.base_for: a path stays as is; a name may hold {cuda} and {python} and must then be an
    image reference."""
    if is_base_path(template):
        return None
    ref = fill_base(template, {"cuda": "12.8.1", "python": "3.12"})
    if ref is None:
        return f"= {template!r}: the only placeholders allowed are {{cuda}} and {{python}}"
    if not IMAGE_REF.fullmatch(ref):
        return f"= {template!r} is not an image reference (like nvidia/cuda:{{cuda}}-devel-ubuntu24.04)"
    return None


def _registry(value: str) -> str | None:
    """backends.docker.validate_registry: host[:port][/path], no scheme, no tag."""
    if is_registry(value):
        return None
    return (
        f'= {value!r} is not a registry like "127.0.0.1:5000" or "ghcr.io/org/prefix" '
        "(host[:port][/path], lower-case path, no http:// and no tag)"
    )


DOCKER = Table(
    {
        "base": Str(
            'an image name (may hold {cuda}), a tarball or a rootfs folder, e.g. "nvidia/cuda:{cuda}-devel-ubuntu24.04"',
            check=_base,
        ),
        "shm_size": Str('a size like "16g", "512m" or "1073741824" (quoted)', pattern=SIZE),
        "ulimits": Map(
            Either(
                (Int("an integer"), Str("soft:hard", pattern=ULIMIT_VALUE)),
                'an integer, -1, or "soft:hard", e.g. ulimits = { memlock = -1 }',
            ),
            "ulimits = { <limit> = value }",
            keys=ULIMITS,
            noun="limit",
        ),
        "ipc_host": Bool("true or false: GPU runs share the host's IPC namespace (--ipc=host)"),
        "ca_bundle": Str('a PEM file of extra CAs the build trusts, e.g. "certs/proxy.pem"'),
        "network": Str('a docker network for the suite containers, e.g. "none" or "host"'),
        "registry": Str(
            "a registry (host[:port][/prefix], no scheme) that cell images are pushed to and pulled from, e.g. "
            '"127.0.0.1:5000" or "ghcr.io/my-org/stackfarm"; STACKFARM_REGISTRY overrides it',
            check=_registry,
        ),
    },
)

#: The keys of [docker].
DOCKER_KEYS = tuple(DOCKER.fields)

STORE = Table(
    {
        "trusted_keys": List(
            Str('a path to a runner\'s public key file (or a folder of them), e.g. "keys/runners"'),
            "the runner public keys whose signed store entries are believed, relative to matrix.toml, e.g. "
            'trusted_keys = ["keys/runners"] (stackfarm.storekeys; STACKFARM_TRUSTED_RUNNER_KEYS adds more)',
            unique=True,
        ),
    },
)

# --------------------------------------------------------------------------- a host profile, as loaded


@dataclass(frozen=True, kw_only=True)
class HostProfile:
    """A host profile as loaded: who it is, and what its bundle carries (stackfarm.wheelhouse)."""

    name: str
    path: Path
    #: sha256 of the file's bytes: an input of every cell run under it.
    sha256: str
    runner: str
    python: str
    platform: str
    #: canonical distribution name -> the version the host has installed.
    provides: Mapping[str, str] = field(default_factory=dict)
    pins: tuple[str, ...] = ()
    #: Carried as they are (`pip --no-deps`), outside the resolution: what else asks for them is not looked at.
    nodeps: tuple[str, ...] = ()
    leave_out: Mapping[str, str] = field(default_factory=dict)


__all__ = [
    "DEVIATION",
    "DOCKER",
    "DOCKER_KEYS",
    "STORE",
    "HostProfile",
    "feature",
    "runner",
    "runner_count_rule",
    "suite",
]
