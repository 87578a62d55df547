"""What every suite's GPU testcases need, in one place: skip without a GPU, import the cell's stack only after
checking that the suite's Python holds the versions the cell describes."""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Sequence
from types import ModuleType

import pytest
from packaging.version import Version

from .cellspec import CellSpec


def need_gpu(cell: CellSpec) -> None:
    """Skip (never pass) where no GPU is usable, with the reason the runner found."""
    if cell.no_gpu_reason is not None:
        pytest.skip(f"needs GPU: {cell.no_gpu_reason}")


def check_installed(cell: CellSpec, distributions: Sequence[str]) -> str:
    """The installed version of the first of `distributions` the cell has; fail unless it is the cell's."""
    comp = next((c for c in cell.components if c.distribution in distributions), None)
    if comp is None:
        pytest.skip(f"the cell has no {' / '.join(distributions)}")
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


__all__ = ["check_installed", "need_gpu", "stack_module"]
