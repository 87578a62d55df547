"""What every suite's testcases need, in one place: skip without a GPU, say "does not apply" the one way the
verdict rule reads, import the cell's stack only after checking that the suite's Python holds the versions the
cell describes.

A plain skip is an unanswered question: it makes the cell *incomplete* (stackfarm.verdict). A testcase that
does not apply to this cell at all calls ``not_applicable(NA.<class>, text)`` with one of the reason classes
`NA` (a component the cell does not have, a feature the release does not carry, an arch the component does not
target, a runner kind with fewer GPUs, a question the matrix does not ask). It raises `NotApplicableSkip`;
this module's `pytest_runtest_makereport` hook (suites/conftest.py loads it into every suite run) marks that
testcase in the JUnit file with the property ``stackfarm.not_applicable = <class>``, and only marked skips of a
known class leave a cell green. A skip whose text merely starts ``n/a: `` (``pytest.skip("n/a: ...")``) is an
unanswered question like any other; so is a property of that name a suite records itself (the hook drops it).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Generator, Sequence
from types import ModuleType
from typing import NoReturn

import pytest
from packaging.version import Version

from .cellspec import CellSpec
from .junit import NA, NA_PROPERTY, NOT_APPLICABLE
from .runnerkind import Runner


class NotApplicableSkip(pytest.skip.Exception):  # type: ignore[name-defined,misc]  # pytest: untyped alias
    """The skip `not_applicable` raises: a testcase with no question to answer for this cell, and why (`na`)."""

    def __init__(self, na: NA, text: str) -> None:
        super().__init__(NOT_APPLICABLE + text)
        self.na = na
        self.text = text


def not_applicable(na: NA, text: str = "") -> NoReturn:
    """Skip a testcase that has no question to answer for this cell, for the reason class `na`; the verdict
    does not count it missing (the hook below marks it in the JUnit file).

    Called the old way, with a text alone (``not_applicable("the cell has no X")``), it is a plain skip with
    that text: an unanswered question, since nothing says which reason it is."""
    __tracebackhide__ = True  # the skip's location is the caller's line
    if not isinstance(na, NA):
        pytest.skip(NOT_APPLICABLE + (str(na) if not text else f"{na}: {text}"))
    raise NotApplicableSkip(na, text)


_MARKED = pytest.StashKey[NA]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Mark a testcase that `not_applicable` skipped: testcase property `NA_PROPERTY` = its class (pytest's
    JUnit writer takes a testcase's properties from its teardown report). Only this hook writes that property:
    one a suite records itself is dropped. The skip message reads "n/a: text", as a plain skip's would."""
    report = yield
    exc = call.excinfo.value if call.excinfo is not None else None
    if isinstance(exc, NotApplicableSkip) and report.skipped and isinstance(exc.na, NA):
        item.stash[_MARKED] = exc.na
        # pytest's text is "stackfarm.suitekit.NotApplicableSkip: n/a: ...": make it read as a skip's.
        if isinstance(report.longrepr, tuple):
            path, line, _ = report.longrepr
            report.longrepr = (path, line, f"Skipped: {exc.msg}")
    kept = [(name, value) for name, value in item.user_properties if name != NA_PROPERTY]
    marked = item.stash.get(_MARKED, None)
    if marked is not None:
        kept.append((NA_PROPERTY, marked.value))
    item.user_properties[:] = kept
    report.user_properties = list(kept)
    return report


def need_gpu(cell: CellSpec) -> None:
    """Skip (never pass) where no GPU is usable, with the reason the runner found."""
    if cell.no_gpu_reason is not None:
        pytest.skip(f"needs GPU: {cell.no_gpu_reason}")


def need_gpus(cell: CellSpec, wanted: int, available: int, what: str) -> None:
    """Skip a testcase that needs `wanted` GPUs where only `available` are usable (this machine's detected
    count). Where the cell's runner kind ([runners.<kind>] of its matrix) has fewer GPUs than that and this
    machine is that kind (`available` is the kind's gpus), no run of this cell is asked the question: it does
    not apply. A machine of another count is not the kind the cell is routed to: what it lacks says nothing
    about the kind, so the question stays unanswered here, like every other case."""
    if available >= wanted:
        return
    why = f"needs {wanted}+ GPUs, this machine has {available}: {what}"
    runner = cell_runner(cell)
    if runner is not None and runner.gpus < wanted:
        kind = f"this cell's runner [runners.{runner.name}] has {runner.gpus} GPU(s)"
        if available == runner.gpus:
            not_applicable(NA.RUNNER_GPUS, f"{why}; {kind}")
        pytest.skip(
            f"{why}; {kind}, but this machine ({available} GPU(s)) is not that kind: unanswered here, "
            f"run the cell on a [runners.{runner.name}] machine"
        )
    pytest.skip(why)


def cell_runner(cell: CellSpec) -> Runner | None:
    """The [runners.<kind>] the cell is dispatched to, as the runner handed it over (CellSpec.runner_kind: the
    kind its verdict's inputs hash, the one its CUDA floor routes it to unless a plan's worker adopted another);
    None where the matrix declares no kind for it."""
    kind = cell.runner_kind
    if not kind:
        return None
    return Runner(
        name=str(kind["name"]),
        labels=tuple(kind.get("labels", ())),
        arch=kind.get("arch"),
        gpus=int(kind.get("gpus", 1)),
        cells=tuple(kind.get("cells", ())),
        driver=kind.get("driver"),
        forward_compat=bool(kind.get("forward_compat", False)),
    )


def check_installed(cell: CellSpec, distributions: Sequence[str]) -> str:
    """The installed version of the first of `distributions` the cell has; fail unless it is the cell's."""
    comp = next((c for c in cell.components if c.distribution in distributions), None)
    if comp is None:
        not_applicable(NA.COMPONENT_ABSENT, f"the cell has no {' / '.join(distributions)}")
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


__all__ = [
    "NA",
    "NOT_APPLICABLE",
    "NotApplicableSkip",
    "cell_runner",
    "check_installed",
    "need_gpu",
    "need_gpus",
    "not_applicable",
    "pytest_runtest_makereport",
    "stack_module",
]
