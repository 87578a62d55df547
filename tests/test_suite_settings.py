"""15-toolchain's selection settings, as matrix.load checks them: the schema its family.py declares."""

from __future__ import annotations

from pathlib import Path

import tomllib

from stackfarm.schema import Table, first_problem
from stackfarm.suite_config import settings_schema

REPO = Path(__file__).resolve().parents[1]


def schema_for(suite: str) -> Table:
    return settings_schema(REPO / "suites" / suite)


def _settings() -> dict[str, object]:
    settings: dict[str, object] = tomllib.loads((REPO / "matrix.toml").read_text())["suites"]["15-toolchain"][
        "settings"
    ]
    return settings


def test_the_default_selection_settings_fit() -> None:
    assert first_problem(_settings(), schema_for("15-toolchain")) is None


def test_bad_gates_and_binds_are_named() -> None:
    bad = _settings()
    bad["selectors"] = {"x": {"selector": ["m:f"], "admits": {"trtllm": "fmhaRunner.cuh"}}}
    problem = first_problem(bad, schema_for("15-toolchain"))
    assert problem is not None
    assert "lib:<distribution>:<glob>" in problem.fix or "lib:<distribution>:<glob>" in problem.message
    bad["selectors"] = {"x": {"selector": "m:f", "bind": {"major": "gpu.major"}}}
    problem = first_problem(bad, schema_for("15-toolchain"))
    assert problem is not None
    assert "arch.major" in problem.message + problem.fix
    ok = {
        "selectors": {
            "x": {"selector": "m:f", "admits": {"flashmla": "lib:sgl-kernel|sglang-kernel:sgl_kernel/x.*"}}
        }
    }
    assert first_problem(ok, schema_for("15-toolchain")) is None
