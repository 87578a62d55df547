"""The local backend: each wheel unpacked once into the content-addressed cache; a cell is a list of trees.

Nothing is installed into any Python: the user's site-packages are never touched. With ``lazy`` (or
``STACKFARM_LAZY=1``) remote wheels become lazy trees instead (what the static suites read, by range requests).

A cell's suites run under the cell's own Python (its `python` axis, stackfarm.interpreters): the running
interpreter when it is that X.Y, else ``pythonX.Y`` found on PATH, by uv or under pyenv, in a cached venv with
stackfarm's requirements. A cell whose interpreter this machine lacks is an environment error naming it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..artifacts import Artifact, Cache
from ..cellspec import InstalledComponent, load
from ..errors import UsageError
from ..interpreters import Interpreter, SuitePythons
from ..lazytree import STATIC_SUITES, lazy_tree
from ..plan import Cell, Component
from ..proc import Outcome, call
from ..verdict import BackendFacts
from . import BACKENDS, PATCHED_SGLANG, BackendOptions, Progress, pytest_argv, realised, suite_env

#: Set to 1: the local backend realises lazy trees (for runs of the static suites only).
LAZY_ENV = "STACKFARM_LAZY"


class LocalBackend:
    name = "local"
    kind = BACKENDS["local"]

    def __init__(
        self, cache: Cache, *, lazy: bool | None = None, pythons: SuitePythons | None = None
    ) -> None:
        self.cache = cache
        #: The Python each python axis value runs its suites under (found and built once per backend).
        self.pythons = pythons or SuitePythons(cache.root)
        #: Realise components as lazy trees (stackfarm.lazytree): for runs of the static suites only (00-stack,
        #: 05-import, 10-capability, 20-eagle3), which read sources, metadata and ELF/fatbin headers; a suite that
        #: imports the stack (30-numerics, the GPU suites) needs full trees. Default: $STACKFARM_LAZY == "1".
        self.lazy = os.environ.get(LAZY_ENV) == "1" if lazy is None else lazy
        if self.lazy:  # its own name: a verdict on lazy trees is never reused as one on full trees
            self.name = "local-lazy"

    def realise(
        self, cell: Cell, artifacts: Mapping[Component, Artifact], workdir: Path, progress: Progress
    ) -> tuple[InstalledComponent, ...]:
        # The cell's interpreter first: a machine without it fetches nothing for the cell (EnvironmentProblem).
        progress(f"python {cell['python']}")
        self.pythons.python(cell["python"], progress)
        installed = []
        for comp in cell.components:
            art = artifacts[comp]

            def report(done: int, total: int | None, name: str = comp.distribution) -> None:
                progress(
                    f"fetch {name} {100 * done // total}%" if total else f"fetch {name} {done >> 20} MiB"
                )

            patched = workdir / PATCHED_SGLANG
            if comp.distribution == "sglang" and patched.is_dir():
                installed.append(self._component(comp, art, patched))
                continue
            if self.lazy and comp.distribution != "sglang":  # sglang's own tree is the patched copy's source
                progress(f"lazy {comp.distribution}")
                installed.append(self._component(comp, art, self.cache.lazy_tree(art, lazy_tree)))
                continue
            root = self.cache.unpacked(art)
            if root is None:  # an extracted tree is re-verified by 00-stack's RECORD check, not by re-hashing
                self.cache.fetch(art, report)
                progress(f"unpack {comp.distribution}")
                root = self.cache.unpack(art)
            installed.append(self._component(comp, art, root))
        return tuple(installed)

    @staticmethod
    def _component(comp: Component, art: Artifact, root: Path) -> InstalledComponent:
        return realised(comp, art, root)

    def installed_pins(self) -> None:
        return None  # the stack is made from wheels: the plan reads sglang's pins from the index

    def interpreter(self, cell: Cell) -> Interpreter:
        """The interpreter of the cell's python axis (EnvironmentProblem where this machine has none)."""
        return self.pythons.interpreter(cell["python"])

    def facts(self, cell: Cell) -> BackendFacts:
        """The interpreter the cell's suites really ran under: its full version (e.g. 3.11.7), its executable,
        and where it was found (running, PATH, uv or pyenv)."""
        interp = self.interpreter(cell)
        return BackendFacts(
            local_python=interp.version,
            local_python_path=self.pythons.python(cell["python"]),
            local_python_source=interp.source,
        )

    def suite_python(self, spec: Path) -> str:
        """The executable a suite of the cell described by `spec` runs under (run_suite is given no cell): its
        python axis value's; the running one for a cell record without that axis."""
        wanted = load(spec).values.get("python")
        return self.pythons.python(wanted) if wanted else sys.executable

    def check_suites(self, suites: Sequence[str]) -> None:
        """Before any work: a lazy run of a suite that needs full trees is a usage error (exit 2), nothing
        fetched, run or stored."""
        full = [name for name in suites if name not in STATIC_SUITES]
        if self.lazy and full:
            raise UsageError(
                f"{LAZY_ENV}=1",
                f"{', '.join(full)} {'needs' if len(full) == 1 else 'need'} full trees, and this run realises "
                "lazy ones (only the static suites read lazy trees): nothing ran",
                fix=f"run the static suites alone lazily (--suites '{','.join(STATIC_SUITES)}'), or run "
                f"{', '.join(full)} without {LAZY_ENV}",
            )

    def run_suite(self, suite_dir: Path, spec: Path, junit: Path, timeout: float, log: Path) -> Outcome:
        if self.lazy and suite_dir.name not in STATIC_SUITES:
            # check_suites refuses such a run before it starts; a caller that did not ask gets no verdict
            # either: a usage error (pytest's exit 4), so the runner makes the cell a harness error, never a
            # verdict on the stack, never reused.
            text = (
                f"{suite_dir.name} needs full trees, and this run realises lazy ones (STACKFARM_LAZY=1): "
                f"run only {', '.join(STATIC_SUITES)} lazily (--suites), or without STACKFARM_LAZY"
            )
            log.write_text(text + "\n", encoding="utf-8")
            return Outcome(args=("pytest", str(suite_dir)), returncode=4, output=text, elapsed=0.0)
        argv = pytest_argv(self.suite_python(spec), str(suite_dir), str(junit))
        return call(
            argv,
            cwd=suite_dir.parent.parent,
            env=suite_env(spec, junit),
            timeout=timeout,
            log=log,
        )


def make(cache: Cache, _options: BackendOptions) -> LocalBackend:
    """The local backend over the cache (lazy trees when $STACKFARM_LAZY is 1)."""
    return LocalBackend(cache)


__all__ = ["LAZY_ENV", "LocalBackend", "make"]
