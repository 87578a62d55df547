"""Declared deviations ([[deviation]]): matrix.toml's table, CellSpec.deviations, and 00-stack on a synthetic host
install that lacks parts of sglang-kernel (flash_ops, sm100/) and the whole flashinfer-cubin wheel."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import WriteMatrix
from stackfarm.cellspec import CellSpec, InstalledComponent, load
from stackfarm.errors import ConfigError
from stackfarm.matrix import Deviation
from stackfarm.matrix import load as load_matrix

REPO = Path(__file__).resolve().parents[1]
STRIPPED: dict[str, Any] = {
    "component": "sglang-kernel",
    "missing": ["sgl_kernel/flash_ops*.so", "sgl_kernel/sm100/**"],
    "absent": False,
    "reason": "FA3 is 1.7 GB, not carried to the H200",
}
CUBIN: dict[str, Any] = {
    "component": "flashinfer-cubin",
    "missing": [],
    "absent": True,
    "reason": "447 MB, not carried",
}


def _wheel_tree(root: Path, distribution: str, version: str, files: dict[str, bytes]) -> None:
    """An installed wheel: its files and a *.dist-info with METADATA and a RECORD of sha256 digests."""
    info = root / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    rows = []
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{len(data)}")
    rows += [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")


@dataclass(frozen=True)
class Case:
    outcome: str
    message: str
    properties: dict[str, str]


def _run_stack_suite(
    tmp_path: Path, deviations: tuple[dict[str, Any], ...], *, also_remove: tuple[str, ...] = ()
) -> tuple[dict[str, Case], dict[str, str]]:
    site = tmp_path / "site"
    _wheel_tree(site, "sglang-kernel", "0.4.4", {
        "sgl_kernel/__init__.py": b"# kernels\n",
        "sgl_kernel/common_ops.abi3.so": b"\x7fELF common",
        "sgl_kernel/flash_ops.abi3.so": b"\x7fELF fa3" * 100,
        "sgl_kernel/sm100/common_ops.abi3.so": b"\x7fELF blackwell",
        "sgl_kernel/sm100/deep/x.py": b"x = 1\n",
    })  # fmt: skip
    # The host's stack, stripped: what the bundle for the H200 leaves out.
    for name in (
        "sgl_kernel/flash_ops.abi3.so",
        "sgl_kernel/sm100/common_ops.abi3.so",
        "sgl_kernel/sm100/deep/x.py",
    ):
        (site / name).unlink()
    for name in also_remove:
        (site / name).unlink()

    def comp(distribution: str, root: str) -> InstalledComponent:
        return InstalledComponent(axis="x", distribution=distribution, version="0.4.4", filename="", sha256="",
                                  source="host:/usr/bin/python3", root=root)  # fmt: skip

    cell = CellSpec(
        id="host-cell",
        values={"cuda": "13.0"},
        backend="host",
        components=(comp("sglang-kernel", str(site)), comp("flashinfer-cubin", "")),
        deviations=deviations,
    )
    spec = tmp_path / "cell.json"
    cell.dump(spec)
    assert load(spec).deviations == deviations, "the cell file carries them to the suite"
    junit = tmp_path / "00-stack.xml"
    env = {**os.environ, "STACKFARM_CELL": str(spec)}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/00-stack", "-k", "metadata or files", f"--junitxml={junit}",
         "-q", "-p", "no:cacheprovider"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert junit.is_file(), done.stdout + done.stderr
    root = ET.parse(junit).getroot()
    cases = {}
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome, message = kind, (found.get("message") or "") + (found.text or "")
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        cases[case.get("name", "")] = Case(outcome, message, props)
    suite_props = {
        p.get("name", ""): p.get("value", "")
        for s in root.iter("testsuite")
        for p in s.findall("properties/property")
    }
    return cases, suite_props


def test_declared_deviations_pass_with_a_note(tmp_path: Path) -> None:
    cases, suite = _run_stack_suite(tmp_path, (STRIPPED, CUBIN))
    assert {n: c.outcome for n, c in cases.items()} == {
        "test_metadata_matches_claim[sglang-kernel]": "passed",
        "test_metadata_matches_claim[flashinfer-cubin]": "passed",
        "test_files_match_record[sglang-kernel]": "passed",
        "test_files_match_record[flashinfer-cubin]": "passed",
    }
    files = cases["test_files_match_record[sglang-kernel]"].properties
    assert files["deviation.sglang-kernel"] == (
        "3 files missing as declared (sgl_kernel/flash_ops*.so, sgl_kernel/sm100/**): "
        "FA3 is 1.7 GB, not carried to the H200"
    )
    cubin = cases["test_files_match_record[flashinfer-cubin]"].properties
    assert cubin["deviation.flashinfer-cubin"] == "absent (declared): 447 MB, not carried"
    assert '"component": "sglang-kernel"' in suite["deviations"], "the record shows every declared deviation"


def test_undeclared_differences_still_fail(tmp_path: Path) -> None:
    cases, _ = _run_stack_suite(tmp_path, ())
    files = cases["test_files_match_record[sglang-kernel]"]
    assert files.outcome == "failure"
    assert "3 of 5 files differ from RECORD" in files.message
    assert "sgl_kernel/flash_ops.abi3.so: missing" in files.message
    assert cases["test_metadata_matches_claim[flashinfer-cubin]"].outcome == "failure"
    assert "is not installed" in cases["test_metadata_matches_claim[flashinfer-cubin]"].message


def test_a_declared_deviation_excuses_only_what_it_names(tmp_path: Path) -> None:
    cases, _ = _run_stack_suite(tmp_path, (STRIPPED, CUBIN), also_remove=("sgl_kernel/common_ops.abi3.so",))
    files = cases["test_files_match_record[sglang-kernel]"]
    assert files.outcome == "failure"
    assert "1 of 5 files differ from RECORD" in files.message
    assert "sgl_kernel/common_ops.abi3.so: missing" in files.message
    assert "flash_ops" not in files.message
    assert "3 files missing as declared" in files.properties["deviation.sglang-kernel"]


def test_matrix_declares_deviations(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [[deviation]]
        component = "sglang-kernel"
        missing = ["sgl_kernel/flash_ops*.so", "sgl_kernel/sm100/**"]
        reason = "FA3 is 1.7 GB, not carried to the H200"

        [[deviation]]
        component = "flashinfer-cubin"
        absent = true
        reason = "447 MB"
        """
    )
    matrix = load_matrix(path)
    assert matrix.deviations == (
        Deviation(component="sglang-kernel", missing=("sgl_kernel/flash_ops*.so", "sgl_kernel/sm100/**"),
                  absent=False, reason="FA3 is 1.7 GB, not carried to the H200"),
        Deviation(component="flashinfer-cubin", missing=(), absent=True, reason="447 MB"),
    )  # fmt: skip
    assert matrix.deviations[0].as_dict() == STRIPPED
    assert load_matrix(write_matrix()).deviations == ()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('component = "sglang-kernal"\nabsent = true\nreason = "x"', "is not a distribution of the stack"),
        ('component = "torch"\nabsent = true\nmissing = ["a"]\nreason = "x"', "needs exactly one of missing"),
        ('component = "torch"\nreason = "x"', "needs exactly one of missing"),
        ('component = "torch"\nabsent = true', "reason"),
        ('component = "torch"\nabsent = true\nreason = "x"\nwhy = "y"', "`why`"),
    ],
)
def test_bad_deviations_are_config_errors(write_matrix: WriteMatrix, body: str, message: str) -> None:
    path = write_matrix("\n[[deviation]]\n" + body + "\n")
    with pytest.raises(ConfigError, match=message):
        load_matrix(path)
