"""`stackfarm bench`'s Ray rows (stackfarm.cli.raybench): each reason it cannot time the clusters is a skipped
row saying why (no ray, no tests/fakestack.py, no store server). The timed rows themselves are read in
`nox -s bench` (no timing is asserted here); the Ray executor's own test runs a real cluster."""

from __future__ import annotations

import builtins
import math
from pathlib import Path
from typing import Any

import pytest

from stackfarm.cli import bench, raybench


def _never(argv: list[str]) -> tuple[float, int]:
    raise AssertionError(f"nothing may run: {argv}")


def test_no_store_is_a_skipped_row_with_the_reason() -> None:
    [(name, seconds, note)] = raybench.two_nodes_vs_one(
        _never, None, "no verdict store answers at X", bench.ROOT
    )
    assert name == "ray: 6 fake cells (3 s suite each), 1 node vs 2 nodes"
    assert math.isnan(seconds)
    assert note == "skipped: no verdict store answers at X"


def test_an_installed_stackfarm_says_it_has_no_fake_stack(tmp_path: Path) -> None:
    [(_, seconds, note)] = raybench.two_nodes_vs_one(_never, "http://s", "", tmp_path)
    assert math.isnan(seconds)
    assert note == f"skipped: {tmp_path} has no tests/fakestack.py (stackfarm is installed)"


def test_no_ray_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = builtins.__import__

    def without_ray(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_ray)
    [(_, seconds, note)] = raybench.two_nodes_vs_one(_never, "http://s", "", bench.ROOT)
    assert math.isnan(seconds)
    assert note == "skipped: ray is not installed (pip install 'stackfarm[ray]')"
