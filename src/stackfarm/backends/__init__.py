"""Backends realise a cell's stack and run a suite in it. Suites never know which backend runs them."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from packaging.requirements import Requirement

from ..artifacts import Artifact, Cache
from ..cellspec import InstalledComponent
from ..plan import Cell, Component
from ..proc import GROUPS_ENV, Outcome

#: progress(text) — a short status line for the cell, e.g. "fetch torch 41%".
Progress = Callable[[str], None]


class Backend(Protocol):
    name: str
    #: False where the stack already exists (host): nothing is resolved on an index or fetched.
    needs_artifacts: bool

    def realise(
        self, cell: Cell, artifacts: Mapping[Component, Artifact], workdir: Path, progress: Progress
    ) -> tuple[InstalledComponent, ...]:
        """Make the cell's stack exist; return where each component's files lie."""
        ...

    def run_suite(self, suite_dir: Path, spec: Path, junit: Path, timeout: float, log: Path) -> Outcome:
        """Run one pytest suite against the realised cell, writing JUnit XML to `junit`."""
        ...

    def properties(self, cell: Cell) -> dict[str, str]:
        """What the backend adds to the cell's report (e.g. the image it built)."""
        ...

    def installed_pins(self) -> Mapping[str, list[Requirement]] | None:
        """SGLang's own Requires-Dist where the stack is already installed (host), keyed by its version; None
        where the plan reads the pins from the index (the stack is made from wheels)."""
        ...


#: Where the runner leaves the cell's patched sglang tree in its work dir; backends install that one instead.
PATCHED_SGLANG = "sglang-patched"

#: The folder a suite may write extra files to (figures, contracts): the cell's reports folder.
SUITE_OUT_ENV = "STACKFARM_SUITE_OUT"


def groups_file(junit: Path) -> Path:
    """Where the process groups a suite starts in sessions of their own are listed (proc.register_group)."""
    return junit.parent / f".{junit.name}.pgids"


def suite_env(spec: Path, junit: Path) -> dict[str, str]:
    """The environment every backend gives a suite: the cell, where its extra files go, where its
    long-lived process groups are registered."""
    return {
        "STACKFARM_CELL": str(spec),
        SUITE_OUT_ENV: str(junit.parent),
        GROUPS_ENV: str(groups_file(junit)),
    }


def pytest_argv(python: str, suite: str, junit: str) -> list[str]:
    """How every backend runs a suite: its own pytest process, JUnit XML to `junit`, no cache in the tree."""
    return [python, "-m", "pytest", suite, f"--junitxml={junit}", "-q", "-p", "no:cacheprovider"]


#: The backends `--backend` accepts.
NAMES = ("local", "host", "docker")


def get_backend(
    name: str,
    cache: Cache,
    *,
    python: str | None = None,
    docker: Mapping[str, Any] | None = None,
    index_url: str | None = None,
    reports: Path | None = None,
) -> Backend:
    """`docker` is matrix.toml's [docker] table; STACKFARM_DOCKER_BASE overrides its base (CI's local image).
    `index_url` is the matrix's default index: the Docker image's own tools (pytest, ...) come from there.
    `reports`: the run's reports folder, where the Docker backend keeps each cell's build log (a failed build's
    too, which no suite report would carry)."""
    from .docker import DEFAULT_BASE, DockerBackend  # imported here: each backend's engine stays optional
    from .host import HostBackend
    from .local import LocalBackend

    if name == "local":
        return LocalBackend(cache)
    if name == "host":
        return HostBackend(python or sys.executable)
    if name == "docker":
        options = dict(docker or {})
        base = os.environ.get("STACKFARM_DOCKER_BASE") or str(options.pop("base", DEFAULT_BASE))
        options.pop("base", None)
        if "ca_bundle" in options:
            options["ca_bundle"] = Path(options["ca_bundle"])
        if index_url:
            options["tools_index"] = index_url
        backend = DockerBackend(cache, base=base, **options)
        backend.reports = reports
        return backend
    raise ValueError(f"unknown backend {name!r}; use one of {', '.join(NAMES)}")


__all__ = [
    "NAMES",
    "PATCHED_SGLANG",
    "SUITE_OUT_ENV",
    "Backend",
    "Progress",
    "get_backend",
    "groups_file",
    "pytest_argv",
    "suite_env",
]
