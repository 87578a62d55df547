"""What every suite's testcases need, in one place: skip without a GPU, say "does not apply" the one way the
verdict rule reads, import the cell's stack only after checking that the suite's Python holds the versions the
cell describes.

A plain skip is an unanswered question: it makes the cell *incomplete* (stackfarm.verdict). A testcase that
does not apply to this cell at all (a component the cell does not have, a feature a release does not carry)
calls `not_applicable`, whose skip message starts with `NOT_APPLICABLE`; only those skips leave a cell green.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

import pytest
from packaging.version import Version

from .cellspec import CellSpec
from .driver import runner_for
from .junit import NOT_APPLICABLE
from .matrix import Runner
from .matrix import load as load_matrix


def not_applicable(reason: str) -> NoReturn:
    """Skip a testcase that has no question to answer for this cell; the verdict does not count it missing."""
    pytest.skip(NOT_APPLICABLE + reason)


def need_gpu(cell: CellSpec) -> None:
    """Skip (never pass) where no GPU is usable, with the reason the runner found."""
    if cell.no_gpu_reason is not None:
        pytest.skip(f"needs GPU: {cell.no_gpu_reason}")


def need_gpus(cell: CellSpec, wanted: int, available: int, what: str) -> None:
    """Skip a testcase that needs `wanted` GPUs where only `available` are usable. Where the cell's runner kind
    ([runners.<kind>] of its matrix) has fewer GPUs than that, no run of this cell is asked the question:
    it does not apply (another runner kind answers it for the cells routed there). Otherwise it is unanswered."""
    if available >= wanted:
        return
    why = f"needs {wanted}+ GPUs, this machine has {available}: {what}"
    runner = cell_runner(cell)
    if runner is not None and runner.gpus < wanted:
        not_applicable(f"{why}; this cell's runner [runners.{runner.name}] has {runner.gpus} GPU(s)")
    pytest.skip(why)


def cell_runner(cell: CellSpec) -> Runner | None:
    """The [runners.<kind>] the cell is routed to (None without a readable matrix or a matching kind)."""
    if not cell.matrix:
        return None
    try:
        matrix = load_matrix(cell.matrix)
    except Exception:  # an unreadable matrix is not the suite's question: no runner is known
        return None
    return runner_for(matrix, cell.id)


def check_installed(cell: CellSpec, distributions: Sequence[str]) -> str:
    """The installed version of the first of `distributions` the cell has; fail unless it is the cell's."""
    comp = next((c for c in cell.components if c.distribution in distributions), None)
    if comp is None:
        not_applicable(f"the cell has no {' / '.join(distributions)}")
    installed = None
    for dist in distributions:
        try:
            installed = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    if installed is None:
        pytest.fail(
            f"{comp.distribution} is not installed in the Python running this suite: install "
            f"{comp.distribution}=={comp.version} there (or put its tree on PYTHONPATH)",
            pytrace=False,
        )
    # Local labels (+cu130) are builds of one release: the release is what the cell names.
    if Version(Version(installed).base_version) != Version(Version(comp.version).base_version):
        pytest.fail(
            f"the suite's Python has {comp.distribution} {installed}, the cell is {comp.version}: "
            "the GPU checks would describe another stack",
            pytrace=False,
        )
    return installed


def stack_module(cell: CellSpec, module: str, distributions: Sequence[str]) -> ModuleType:
    """Import `module` from the suite's Python, after `check_installed`."""
    check_installed(cell, distributions)
    return importlib.import_module(module)


__all__ = ["NOT_APPLICABLE", "check_installed", "need_gpu", "not_applicable", "stack_module"]
