"""15-toolchain: will the compilers this cell JIT-compiles with at first use accept each target arch? Static on
any machine (CPU only): the compilers come from the cell's wheels (stackfarm.analysis.toolchain), what they are
asked for from Triton's and flashinfer's own source (stackfarm.analysis.jitfindings).

One testcase per finding, id ``<kind>-<arch>``, with the properties arch, component, compiler, target, file,
line, command, error, detail (and toolkit: which CUDA toolkit was used and why).

Settings ([suites.15-toolchain.settings], optional): flashinfer_modes = ["jit"] (default) or ["jit", "aot"]
(also what an AOT build of flashinfer-jit-cache with FLASHINFER_CUDA_ARCH_LIST="<major>.<minor>" asks for);
environ = { NAME = "value" }: the deployment's environment (TRITON_PTXAS_PATH, FLASHINFER_CUDA_ARCH_LIST...);
compile = true: the real first-use compile of flashinfer's rope module with the cell's toolkit per arch
(stackfarm.analysis.jitcompile); selectors.<name>, families, platform: backend auto-selection checked per arch
and model family (stackfarm.analysis.backendsel). Each finding and the per-arch verdicts go into the suite's
record (``15-toolchain.json``, family.py: what the report renders); the per-arch verdicts also into the testsuite
properties ``toolchain.<arch>.toolchain`` and ``toolchain.<arch>.selection`` (conftest), for JUnit readers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stackfarm import families
from stackfarm.analysis.jitfindings import ToolFinding
from stackfarm.cellspec import RecordProperty
from stackfarm.family import Results
from stackfarm.suitekit import NA, not_applicable

#: This folder's family.py: the record's classes.
FAMILY = families.module(Path(__file__).with_name(families.FAMILY_FILE))


def test_finding(
    finding: ToolFinding,
    record_property: RecordProperty,
    results: Results[Any],
    request: pytest.FixtureRequest,
) -> None:
    """triton: Triton's bundled ptxas accepts the --gpu-name Triton builds for the arch; flashinfer-jit /
    flashinfer-aot: the CUDA toolkit accepts every -gencode target flashinfer's CompilationContext gives;
    flashinfer-compile: the cell's nvcc compiles flashinfer's rope module for the arch with flashinfer's flags;
    selection: a backend the release's auto-selection can pick on the arch is admitted there by its gate;
    error: an input the analysis could not use."""
    record_property("kind", finding.kind)
    for key in ("arch", "component", "compiler", "target", "file", "line", "command", "error"):
        record_property(key, str(getattr(finding, key)))
    record_property("detail", finding.message)
    if finding.note:
        record_property("toolkit", finding.note)
    results.add(
        "findings",
        FAMILY.Finding(
            testcase=request.node.name,
            kind=finding.kind,
            arch=finding.arch,
            component=finding.component,
            compiler=finding.compiler,
            target=finding.target,
            file=finding.file,
            line=finding.line,
            command=finding.command,
            error=finding.error,
            detail=finding.message,
            toolkit=finding.note,
        ),
    )
    if finding.outcome == "n/a":  # a selected backend with no gate declared: the matrix does not ask
        not_applicable(
            NA.NOT_CONFIGURED if finding.kind == "selection" and finding.target else NA.COMPONENT_ABSENT,
            finding.message,
        )
    if finding.outcome == "skip":
        pytest.skip(finding.message)
    if finding.outcome == "fail":
        pytest.fail(finding.message, pytrace=False)
