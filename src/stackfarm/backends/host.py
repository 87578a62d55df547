"""The host backend: the stack already installed in a given Python (qualify an existing server; GPU runners).

Nothing is fetched or installed: the cell's claims are checked against what that Python has, by the suites.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from ..artifacts import Artifact, Cache
from ..cellspec import InstalledComponent
from ..errors import CellError
from ..plan import Cell, Component
from ..proc import Outcome, call
from ..verdict import BackendFacts
from . import BACKENDS, BackendOptions, Progress, pytest_argv, suite_env

#: Run inside the host Python: where each distribution is installed, and its version.
_PROBE = """
import json, sys
from importlib import metadata
found = {}
for name in sys.argv[1:]:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    found[name] = {"version": dist.version, "root": str(dist.locate_file("")), "requires": dist.requires or []}
print(json.dumps(found))
"""

#: The stackfarm package's own source, put on the suites' path so they import it without installing it there.
_SRC = Path(__file__).resolve().parents[2]


class HostBackend:
    name = "host"
    kind = BACKENDS["host"]

    def __init__(self, python: str) -> None:
        self.python = python
        self._version: str | None = None

    def python_version(self) -> str:
        """The host Python's full version, as it says when run (e.g. 3.11.7): what the suites really ran on."""
        if self._version is None:
            outcome = call(
                [self.python, "-c", "import platform; print(platform.python_version())"], timeout=120
            )
            if outcome.returncode != 0:
                raise CellError(f"{self.python} could not be probed: {outcome.output.strip()[-300:]}")
            self._version = outcome.output.strip().splitlines()[-1]
        return self._version

    def installed_pins(self) -> dict[str, list[Requirement]]:
        """The installed sglang's own Requires-Dist (marker-filtered for this host), keyed by its version."""
        sglang = self.probe(["sglang"]).get("sglang")
        if sglang is None:
            return {}
        reqs = [Requirement(r) for r in sglang["requires"]]
        return {
            str(sglang["version"]): [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]
        }

    def probe(self, distributions: list[str]) -> dict[str, dict[str, Any]]:
        outcome = call([self.python, "-c", _PROBE, *distributions], timeout=120)
        if outcome.returncode != 0:
            raise CellError(f"{self.python} could not be probed: {outcome.output.strip()[-300:]}")
        found: dict[str, dict[str, Any]] = json.loads(outcome.output.strip().splitlines()[-1])
        return found

    def realise(
        self, cell: Cell, artifacts: Mapping[Component, Artifact], workdir: Path, progress: Progress
    ) -> tuple[InstalledComponent, ...]:
        del artifacts, workdir  # the host's own installation is the stack
        progress(f"probe {self.python}")
        found = self.probe([c.distribution for c in cell.components])
        if not found:
            raise CellError(
                f"{self.python} has none of {cell.id}'s components installed: it cannot realise that cell"
            )
        # Versions and missing components are not judged here on purpose: 00-stack reports each as a failing
        # check (root "" = not installed), and the later suites still run against what the host has.
        return tuple(
            InstalledComponent(
                axis=c.axis,
                distribution=c.distribution,
                version=c.version,
                filename="",
                sha256="",
                source=f"host:{self.python}",
                root=found[c.distribution]["root"] if c.distribution in found else "",
            )
            for c in cell.components
        )

    def facts(self, cell: Cell) -> BackendFacts:
        """The Python the suites ran under (its full version, its path); the cell's python axis is a claim
        about it, like its component versions."""
        del cell
        return BackendFacts(host_python=self.python_version(), host_python_path=self.python)

    def run_suite(self, suite_dir: Path, spec: Path, junit: Path, timeout: float, log: Path) -> Outcome:
        argv = pytest_argv(self.python, str(suite_dir), str(junit))
        path = os.pathsep.join(p for p in (str(_SRC), os.environ.get("PYTHONPATH", "")) if p)
        env = {**suite_env(spec, junit), "PYTHONPATH": path}
        return call(argv, cwd=suite_dir.parent.parent, env=env, timeout=timeout, log=log)


def make(_cache: Cache, options: BackendOptions) -> HostBackend:
    """The host backend over `options.python` (default: the Python running stackfarm); nothing is fetched."""
    return HostBackend(options.python or sys.executable)


__all__ = ["HostBackend", "make"]
