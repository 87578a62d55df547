"""cxxgate: a kernel library's C++ arch check, read from the header it ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackfarm.analysis.arch import parse_target
from stackfarm.analysis.cxxgate import check

RUNNER = """\
#include "../common.h"
class TllmGenFmhaRunner {
 public:
  explicit TllmGenFmhaRunner(Data_type dtypeQ)
      : mSM(getSMVersion()), mDtypeQ(dtypeQ) {
    FLASHINFER_CHECK(mDtypeQ == DATA_TYPE_E4M3, "Unsupported dtype");
    FLASHINFER_CHECK(mSM == kSM_100 || mSM == kSM_103, "Unsupported architecture");
  }
};
"""


@pytest.fixture
def include(tmp_path: Path) -> Path:
    root = tmp_path / "include"
    (root / "lib" / "fmha").mkdir(parents=True)
    (root / "lib" / "common.h").write_text(
        "constexpr int32_t kSM_100 = 100;\nconstexpr int32_t kSM_103 = 103;\n"
    )
    (root / "lib" / "fmha" / "runner.cuh").write_text(RUNNER)
    return root


@pytest.mark.parametrize(
    ("arch", "state"), [("sm_100", "on"), ("sm_103", "on"), ("sm_120", "off"), ("sm_90", "off")]
)
def test_the_check_on_the_sm_version_decides(include: Path, arch: str, state: str) -> None:
    gate = check(include / "lib/fmha/runner.cuh", "TllmGenFmhaRunner", parse_target(arch), include)
    assert gate.state == state
    assert gate.line == 7  # the dtype check before it does not read the SM version
    assert gate.condition == "mSM == kSM_100 || mSM == kSM_103"


def test_unknown_constant_or_symbol_is_unknown_never_on(include: Path) -> None:
    (include / "lib" / "common.h").write_text("")  # kSM_100 no longer defined anywhere
    gate = check(include / "lib/fmha/runner.cuh", "TllmGenFmhaRunner", parse_target("sm_100"), include)
    assert gate.state == "unknown"
    assert check(include / "lib/fmha/runner.cuh", "Other", parse_target("sm_100"), include).state == "unknown"


def test_ranges_and_negation(include: Path) -> None:
    (include / "lib" / "fmha" / "runner.cuh").write_text(
        'int f() { int sm = getSMVersion(); TORCH_CHECK(sm >= 90 && !(sm == 120), "no"); }\n'
    )
    path = include / "lib/fmha/runner.cuh"
    assert check(path, "f", parse_target("sm_100"), include).state == "on"
    assert check(path, "f", parse_target("sm_120"), include).state == "off"
    assert check(path, "f", parse_target("sm_80"), include).state == "off"
