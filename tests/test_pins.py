"""sglang's pins under extras: `requires_dist` evaluates markers with the extras the farm installs.

SGLang up to 0.5.2 declares its stack (torch, sgl-kernel, flashinfer) only under ``extra == "srt"`` (the wheel's
``pip install "sglang[srt]"``); from 0.5.3 the same pins are unconditional. A cell installs exactly that stack,
so the planner must read those pins, or every ≤ 0.5.2 cell would be planned unchecked.
"""

from __future__ import annotations

import email.message
from email.parser import Parser

import pytest
from packaging.requirements import Requirement

from conftest import WriteMatrix
from stackfarm import matrix
from stackfarm.artifacts import Cache, requires_dist
from stackfarm.plan import contradictions, plan
from stackfarm.resolve import Resolver

#: The shape of sglang 0.5.2's METADATA (its real lines, a few of the runtime_common ones left out).
METADATA_052 = """\
Metadata-Version: 2.4
Name: sglang
Version: 0.5.2
Requires-Dist: aiohttp
Requires-Dist: requests
Provides-Extra: runtime-common
Requires-Dist: blobfile==3.0.0; extra == "runtime-common"
Requires-Dist: torchao==0.9.0; extra == "runtime-common"
Requires-Dist: transformers==4.56.1; extra == "runtime-common"
Provides-Extra: srt
Requires-Dist: sglang[runtime_common]; extra == "srt"
Requires-Dist: sgl-kernel==0.3.9.post2; extra == "srt"
Requires-Dist: torch==2.8.0; extra == "srt"
Requires-Dist: flashinfer_python==0.3.1; extra == "srt"
Provides-Extra: test
Requires-Dist: pytest; extra == "test"
Provides-Extra: blackwell
Requires-Dist: sglang[runtime_common]; extra == "blackwell"
Requires-Dist: torch==2.8.0+cu129; extra == "blackwell"

"""


def _meta(text: str) -> email.message.Message:
    return Parser().parsestr(text)


def test_srt_extra_is_what_the_farm_installs() -> None:
    reqs = {str(r) for r in requires_dist(_meta(METADATA_052), python="3.11")}
    # the srt pins, the runtime_common ones srt pulls in through `sglang[runtime_common]`, the base ones
    assert {
        'sgl-kernel==0.3.9.post2; extra == "srt"',
        'torch==2.8.0; extra == "srt"',
        'flashinfer_python==0.3.1; extra == "srt"',
        'torchao==0.9.0; extra == "runtime-common"',
        "aiohttp",
    } <= reqs
    # neither an extra the farm does not install (test, blackwell) nor the self-requirement
    assert not any(r.startswith(("pytest", "torch==2.8.0+cu129", "sglang")) for r in reqs)


def test_explicit_extras_and_none() -> None:
    names = [r.name for r in requires_dist(_meta(METADATA_052), python="3.11", extras=())]
    assert names == ["aiohttp", "requests"]
    blackwell = {str(r.specifier) for r in requires_dist(_meta(METADATA_052), python="3.11", extras=["blackwell"])
                 if r.name == "torch"}  # fmt: skip
    assert blackwell == {"==2.8.0+cu129"}


def test_undeclared_default_extra_is_not_assumed() -> None:
    # sglang >= 0.5.3 declares no srt extra: its pins are unconditional, nothing else switches on
    text = METADATA_052.replace("Provides-Extra: srt\n", "")
    names = {r.name for r in requires_dist(_meta(text), python="3.11")}
    assert "torch" not in names
    assert "aiohttp" in names


def test_extra_pins_make_conflicts(write_matrix: WriteMatrix) -> None:
    m = matrix.load(write_matrix(axes={"sglang": ["0.5.2"]}))
    p = plan(m, {"0.5.2": requires_dist(_meta(METADATA_052), python="3.11")})
    assert not p.cells
    (conflict,) = p.conflicts
    text = "\n".join(conflict.problems)
    assert "torch==2.8.0" in text
    assert "sgl-kernel==0.3.9.post2" in text
    assert "flashinfer_python==0.3.1" in text


@pytest.mark.integration
def test_real_sglang_0_5_2_pins_under_srt(write_matrix: WriteMatrix) -> None:
    """The real 0.5.2 wheel's METADATA: `Requires-Dist: torch==2.8.0; extra == "srt"` (and sgl-kernel
    0.3.9.post2, flashinfer_python 0.3.1, the same way) are the pins; a cell of 0.5.2 with torch 2.9.1 and
    sgl-kernel 0.3.21 contradicts them."""
    m = matrix.load(write_matrix(axes={"sglang": ["0.5.2"]}, body=""))
    resolver = Resolver(m, Cache())
    pins = resolver.pins(["0.5.2"])
    by_name = {r.name.lower().replace("_", "-"): r for r in pins["0.5.2"]}
    assert str(by_name["torch"].specifier) == "==2.8.0"
    assert str(by_name["sgl-kernel"].specifier) == "==0.3.9.post2"
    assert str(by_name["flashinfer-python"].specifier) == "==0.3.1"
    cell = plan(m, {}).cells[0]
    axes = {c.axis for c in contradictions(cell, pins["0.5.2"])}
    assert {"torch", "sgl_kernel", "flashinfer"} <= axes
    # 0.5.3 has the same kind of pins without a marker: read as before
    newer = resolver.pins(["0.5.3"])["0.5.3"]
    assert any(r.name == "torch" and r.marker is None for r in newer)
    assert not any(isinstance(r, Requirement) and r.name == "sglang" for r in newer)
