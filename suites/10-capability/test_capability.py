"""10-capability: does this stack know each target GPU? Binaries, tables, gates; found, not hand-listed.

Static part (any machine): one testcase per finding of `capability_findings.analyse` (see its docstring for the
verdicts and the pass/fail policy), each carrying the properties arch, component, file, line, symbol, verdict.

GPU part (skipped with "needs GPU: ..." elsewhere): the device's real capability, sgl-kernel's real choice of
ops library checked against the static prediction, and one real kernel call per library (torch, sgl-kernel,
flashinfer) against a float32 reference. It imports the stack from the Python that runs the suite, and first
checks that those are the versions the cell describes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from capability_findings import Finding

from stackfarm import families, stack
from stackfarm.analysis.arch import Arch, parse_target
from stackfarm.analysis.fatbin import read_binary
from stackfarm.analysis.kernels import sgl_kernel_loader
from stackfarm.cellspec import CellSpec
from stackfarm.family import Results
from stackfarm.suitekit import NA, need_gpu, not_applicable, stack_module

#: The type of pytest's record_property fixture.
RecordProperty = Callable[[str, object], None]
#: sgl-kernel's distribution names from the stack table, the current one first (the table lists them oldest first):
#: check_installed tries them in this order.
_KERNELS = tuple(reversed(stack.BY_AXIS["sgl_kernel"].names))
#: This folder's family.py: the record's classes.
FAMILY = families.module(Path(__file__).with_name(families.FAMILY_FILE))


class _Recorder:
    """What a testcase found, twice: the record's finding (the report's) and JUnit properties (JUnit readers')."""

    def __init__(self, record_property: RecordProperty, results: Results[Any], testcase: str) -> None:
        self.record_property, self.results, self.testcase = record_property, results, testcase

    def __call__(self, key: str, value: object) -> None:
        self.record_property(key, value)

    def finding(self, **values: Any) -> None:
        keys = ("arch", "component", "verdict", "file", "line", "symbol", "detail", "feature")
        facts = {k: (int(values.get(k) or 0) if k == "line" else str(values.get(k, ""))) for k in keys}
        self.results.add("findings", FAMILY.Finding(testcase=self.testcase, **facts))


@pytest.fixture
def record_property(
    record_property: RecordProperty, results: Results[Any], request: pytest.FixtureRequest
) -> _Recorder:
    """pytest's record_property (this fixture overrides it and wraps it), and the record's findings."""
    return _Recorder(record_property, results, request.node.name)


def _judge(finding: Finding, record_property: _Recorder) -> None:
    for key in ("arch", "component", "file", "line", "symbol", "verdict"):
        record_property(key, str(getattr(finding, key)))
    if finding.feature:
        record_property("feature", finding.feature)
    record_property("detail", finding.message)
    record_property.finding(
        arch=finding.arch,
        component=finding.component,
        verdict=finding.verdict,
        file=finding.file,
        line=finding.line,
        symbol=finding.symbol,
        detail=finding.message,
        feature=finding.feature,
    )
    if finding.outcome == "n/a":
        na = _na_class(finding)
        if na is None:  # a finding says n/a for a reason no class names: the question is not settled
            pytest.skip(
                f"{finding.message} (n/a of a {finding.kind} finding has no reason class: unanswered)"
            )
        not_applicable(na, finding.message)
    if finding.outcome == "skip":
        pytest.skip(finding.message)
    if finding.outcome == "fail":
        pytest.fail(finding.message, pytrace=False)


def _na_class(finding: Finding) -> NA | None:
    """Why an n/a finding does not apply (capability_findings' two n/a): a flashinfer-cubin family with no code
    for the arch (it loads a family only on the GPUs it was built for), or a configured gate the release lacks,
    decided there by its other gates or the conditions that read the feature's flags."""
    if finding.kind in ("binary", "loader"):
        return NA.ARCH_NOT_TARGETED
    if finding.kind == "gate" and finding.verdict == "absent":
        return NA.FEATURE_ABSENT
    return None


def test_finding(finding: Finding, record_property: _Recorder) -> None:
    """One static finding: its id starts with its kind.

    binary / loader: a CUDA library (or the one sgl-kernel's loader picks) has code that runs on the arch;
    table: a capability-keyed dict lookup in SGLang finds the arch's key;
    gate / flag / expectation: a wanted feature's gate lets it on for the arch, or it is declared off there and is;
    auto: the release's own switching-on of a feature's flag agrees with the feature's use-gate on the arch;
    error: an input the analysis could not use (a bad arch name, an unreadable cell, a failed step).
    """
    _judge(finding, record_property)


# --------------------------------------------------------------------------- GPU


def _props(record_property: _Recorder, **values: Any) -> None:
    for key in ("arch", "component", "file", "line", "symbol", "verdict"):
        record_property(key, str(values.get(key, 0 if key == "line" else "")))
    record_property.finding(**values)


def _kernel_distribution(cell: CellSpec) -> str:
    return next((c.distribution for c in cell.components if c.distribution in _KERNELS), "sglang-kernel")


@pytest.fixture(scope="module")
def device(cell: CellSpec) -> Arch:
    need_gpu(cell)
    torch = stack_module(cell, "torch", ("torch",))
    if not torch.cuda.is_available():
        pytest.fail(
            f"a GPU was reported ({cell.no_gpu_reason=}) but torch.cuda.is_available() is False",
            pytrace=False,
        )
    major, minor = torch.cuda.get_device_capability()
    return Arch(major, minor)


def test_gpu_device_is_a_target(cell: CellSpec, device: Arch, record_property: _Recorder) -> None:
    """The GPU is one of matrix.toml's target archs, so the static findings above describe it."""
    targets = [parse_target(a) for a in cell.archs]
    ok = device in targets
    _props(
        record_property,
        arch=device,
        component="torch",
        file="torch.cuda",
        symbol="get_device_capability",
        verdict="ok" if ok else "",
    )
    assert ok, (
        f"the GPU is {device}, not one of the cell's targets {list(cell.archs)}: add it to [targets] archs"
    )


def test_gpu_torch_kernel(cell: CellSpec, device: Arch, record_property: _Recorder) -> None:
    """torch runs a kernel on the GPU, and every arch torch says it was built for is in libtorch_cuda's fatbin."""
    import torch

    comp = cell.component("torch")
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    static = read_binary(lib)
    assert static is not None, f"{lib} has no device code"
    built = {parse_target(a) for a in torch.cuda.get_arch_list() if a.startswith("sm_")}
    sass = {a.device for a in static.sass}
    assert built <= sass, (
        f"torch.cuda.get_arch_list() names {sorted(map(str, built - sass))} missing from {lib}"
    )
    a = torch.randn(64, 64, device="cuda", dtype=torch.float32)
    b = torch.randn(64, 64, device="cuda", dtype=torch.float32)
    got = (a @ b).cpu().double()
    want = a.cpu().double() @ b.cpu().double()
    assert torch.allclose(got, want, rtol=1e-3, atol=1e-3), "torch.matmul on the GPU differs from the CPU"
    # recorded once the checks passed: a failing case carries no verdict
    _props(
        record_property,
        arch=device,
        component=comp.distribution,
        file="torch/lib/libtorch_cuda.so",
        symbol="torch.matmul",
        verdict="ok",
    )


def test_gpu_sgl_kernel_loader(cell: CellSpec, device: Arch, record_property: _Recorder) -> None:
    """sgl_kernel loads the ops library that the static evaluation of its loader predicts for this GPU."""
    sgl_kernel = stack_module(cell, "sgl_kernel", _KERNELS)
    import torch

    package = Path(str(sgl_kernel.__file__)).parent
    loaded = Path(str(sgl_kernel.common_ops.__file__)).resolve()
    actual = loaded.relative_to(package.parent.resolve()).as_posix()
    predicted = sgl_kernel_loader(package.parent, device, torch.version.cuda or "")
    _props(
        record_property,
        arch=device,
        component=_kernel_distribution(cell),
        file=actual,
        symbol="loader",
        verdict="ok" if actual == predicted.chosen else "",
    )
    record_property("predicted", str(predicted.chosen))
    assert actual == predicted.chosen, (
        f"sgl_kernel loaded {actual} on {device}, the static loader evaluation predicted {predicted.chosen} "
        f"(patterns {predicted.patterns}): fix stackfarm.analysis.kernels or the evaluator"
    )


def _rmsnorm_reference(x: Any, w: Any, eps: float) -> Any:
    import torch

    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def test_gpu_sgl_kernel_rmsnorm(cell: CellSpec, device: Arch, record_property: _Recorder) -> None:
    """One real sgl-kernel call: rmsnorm against a float32 reference."""
    sgl_kernel = stack_module(cell, "sgl_kernel", _KERNELS)
    import torch

    torch.manual_seed(0)
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    got = sgl_kernel.rmsnorm(x, w, 1e-6)
    torch.testing.assert_close(got, _rmsnorm_reference(x, w, 1e-6), rtol=2e-2, atol=2e-2)
    _props(
        record_property,
        arch=device,
        component=_kernel_distribution(cell),
        file="sgl_kernel/elementwise.py",
        symbol="rmsnorm",
        verdict="ok",
    )


def test_gpu_flashinfer_rmsnorm(cell: CellSpec, device: Arch, record_property: _Recorder) -> None:
    """One real flashinfer call (JIT-compiled for this GPU on first use): rmsnorm against a float32 reference."""
    flashinfer = stack_module(cell, "flashinfer", ("flashinfer-python",))
    import torch

    torch.manual_seed(0)
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    got = flashinfer.norm.rmsnorm(x, w, 1e-6)
    torch.testing.assert_close(got, _rmsnorm_reference(x, w, 1e-6), rtol=2e-2, atol=2e-2)
    _props(
        record_property,
        arch=device,
        component="flashinfer-python",
        file="flashinfer/norm",
        symbol="rmsnorm",
        verdict="ok",
    )
