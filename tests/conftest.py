"""Fixtures shared by the tests of matrix loading and planning."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import pytest

from stackfarm import verdict
from stackfarm.verdict import CellReport, SuiteResult

#: One value per axis: the seeds' starting cell.
BASE_AXES: dict[str, list[str]] = {
    "cuda": ["12.8"],
    "torch": ["2.9.1"],
    "sgl_kernel": ["0.3.21"],
    "flashinfer": ["0.6.3"],
    "sglang": ["0.5.9"],
    "python": ["3.11"],
}

WriteMatrix = Callable[..., Path]


@pytest.fixture
def write_matrix(tmp_path: Path) -> WriteMatrix:
    """Write tmp_path/matrix.toml: a valid [axes] table (line 1 is its header), then `body`.

    `axes` replaces axis values (None drops the axis); `body` is dedented and appended right after the
    axes' keys, so a body that starts without a header adds keys to [axes].
    """

    def write(body: str = "", *, axes: dict[str, list[str] | None] | None = None) -> Path:
        values = {**BASE_AXES, **(axes or {})}
        lines = ["[axes]"] + [f"{k} = {json.dumps(v)}" for k, v in values.items() if v is not None]
        path = tmp_path / "matrix.toml"
        path.write_text("\n".join(lines) + "\n" + textwrap.dedent(body), encoding="utf-8")
        return path

    return write


def cell_report(
    *,
    cell: str,
    status: str,
    reason: str = "",
    properties: Mapping[str, str] | None = None,
    suites: Sequence[SuiteResult] = (),
) -> CellReport:
    """A CellReport from the flat form earlier runs stored (status "ran"/"reused"/a plan status, a bag of
    properties): read through the verdict store's own reader of that format, so it is judged by the rule."""
    return verdict.from_json(
        {
            "cell": cell,
            "status": status,
            "reason": reason,
            "properties": dict(properties or {}),
            "suites": [{**asdict(s), "xml": str(s.xml) if s.xml else None} for s in suites],
        }
    )


@pytest.fixture(scope="session")
def runner_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One runner key pair for the session: (private key, public key), made by stackfarm's own keygen."""
    from stackfarm import attest

    private, public, _ = attest.generate(tmp_path_factory.mktemp("runner-keys") / "runner")
    return private, public


@pytest.fixture
def signing_runner(runner_keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """This process is a runner that signs what it pushes (and trusts its own key, as every runner does)."""
    monkeypatch.setenv("STACKFARM_RUNNER_KEY", str(runner_keys[0]))
    monkeypatch.delenv("STACKFARM_TRUSTED_RUNNER_KEYS", raising=False)
    return runner_keys
