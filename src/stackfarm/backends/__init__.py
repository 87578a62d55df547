"""Backends realise a cell's stack and run a suite in it. Suites never know which backend runs them.

Every backend is one entry of BACKENDS (what it is, declared before its module is imported) and its module,
which defines the backend class and `make(cache, options)`. The harness asks the entry, never the name: whether
the wheels are resolved (`resolves`), a verdict reused (`reusable`), patch sets applied (`patchable`), a plan's
input hash checked (`planned`), or a Docker engine needed (`needs_engine`). Before the registry one flag,
`needs_artifacts`, decided the first four (five places in the runner), and a new backend was 8 edits: its
module, NAMES, get_backend's branch, `qualify --backend`'s choices, and the `== "host"` / `== "docker"` tests in
bisect, the merge, the worker and the Kubernetes emitter. Now it is 2: the entry and the module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from packaging.requirements import Requirement

from ..artifacts import Artifact, Cache
from ..cellspec import InstalledComponent
from ..plan import Cell, Component
from ..proc import GROUPS_ENV, Outcome
from ..verdict import BackendFacts

#: progress(text) — a short status line for the cell, e.g. "fetch torch 41%".
Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class BackendKind:
    """One backend as the harness knows it without importing it: its name, its module and what it can do."""

    name: str
    #: Its module, relative to this package: it defines `make(cache, options) -> Backend` and is imported only
    #: when the backend is used (each backend's engine stays optional).
    module: str
    #: The harness resolves the cell's wheels on an index and downloads them (False: the stack already exists
    #: where it runs, as on a host, and nothing is fetched).
    resolves: bool
    #: A stored verdict of it stands for a later run of the same inputs, here or from the shared store, and its
    #: verdicts are pushed there (False: what it tests can change without any input that is hashed cheaply).
    reusable: bool
    #: The runner applies the cell's patch sets to the sglang tree it installs (False: it tests an
    #: installation as it is).
    patchable: bool
    #: Its input hash is the one `plan --json` computes for the cell, so a plan's worker checks it and the merge
    #: compares it (False: it hashes what it finds where it runs, never the plan's).
    planned: bool
    #: It needs a Docker engine on the machine (a Kubernetes pod has none; a worker without one runs local).
    needs_engine: bool = False


#: The backends, in `--backend`'s order: a new backend is one entry here and its module.
BACKENDS: Mapping[str, BackendKind] = {
    kind.name: kind
    for kind in (
        BackendKind(
            name="local", module=".local", resolves=True, reusable=True, patchable=True, planned=True
        ),
        BackendKind(
            name="host", module=".host", resolves=False, reusable=False, patchable=False, planned=False
        ),
        BackendKind(
            name="docker",
            module=".docker",
            resolves=True,
            reusable=True,
            patchable=True,
            planned=True,
            needs_engine=True,
        ),
    )
}

#: The backends `--backend` accepts.
NAMES = tuple(BACKENDS)


@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """What `get_backend` hands a backend's `make`; each takes what it uses."""

    #: The host backend's Python (the one the stack is installed in; None: the one running stackfarm).
    python: str | None = None
    #: matrix.toml's [docker] table.
    docker: Mapping[str, Any] | None = None
    #: The matrix's default index: the Docker image's own tools (pytest, ...) come from there.
    index_url: str | None = None
    #: The run's reports folder, where the Docker backend keeps each cell's build log.
    reports: Path | None = None


def realised(comp: Component, art: Artifact, root: Path | str) -> InstalledComponent:
    """A component realised from its wheel, its files under `root` (what a backend's `realise` returns)."""
    return InstalledComponent(
        axis=comp.axis,
        distribution=comp.distribution,
        version=comp.version,
        filename=art.filename,
        sha256=art.sha256,
        source=art.source,
        root=str(root),
    )


class Backend(Protocol):
    name: str
    #: What it can do (its entry of BACKENDS).
    kind: BackendKind

    def realise(
        self, cell: Cell, artifacts: Mapping[Component, Artifact], workdir: Path, progress: Progress
    ) -> tuple[InstalledComponent, ...]:
        """Make the cell's stack exist; return where each component's files lie."""
        ...

    def run_suite(self, suite_dir: Path, spec: Path, junit: Path, timeout: float, log: Path) -> Outcome:
        """Run one pytest suite against the realised cell, writing JUnit XML to `junit`."""
        ...

    def facts(self, cell: Cell) -> BackendFacts:
        """What the backend says of the stack it realised for the cell's report (e.g. the image it built)."""
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


class _Make(Protocol):
    def __call__(self, cache: Cache, options: BackendOptions, /) -> Backend: ...


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
    kind = BACKENDS.get(name)
    if kind is None:
        raise ValueError(f"unknown backend {name!r}; use one of {', '.join(NAMES)}")
    make = cast(_Make, importlib.import_module(kind.module, __name__).make)
    return make(cache, BackendOptions(python=python, docker=docker, index_url=index_url, reports=reports))


__all__ = [
    "BACKENDS",
    "NAMES",
    "PATCHED_SGLANG",
    "SUITE_OUT_ENV",
    "Backend",
    "BackendKind",
    "BackendOptions",
    "Progress",
    "get_backend",
    "groups_file",
    "pytest_argv",
    "realised",
    "suite_env",
]
