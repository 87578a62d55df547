"""selrun: a release's selection run for one arch, its choices by return, assignment and kernel call."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from stackfarm.analysis.arch import parse_target
from stackfarm.analysis.pysource import UNKNOWN
from stackfarm.analysis.pyvalues import Budget
from stackfarm.analysis.selrun import SelectionRun
from stackfarm.analysis.sourcetree import SourceTree

TREE = {
    "rel/__init__.py": "",
    "rel/args.py": """\
        import torch

        class Args:
            kv_cache_dtype = "auto"
            decode_backend = None

            def set_dtype(self, major):
                if self.kv_cache_dtype == "auto":
                    self.kv_cache_dtype = "fp8" if major >= 10 else "bf16"

            def set_backends(self, kv_cache_dtype, major):
                if kv_cache_dtype == "fp8":
                    self.decode_backend = "trtllm" if major >= 10 else "fa3"
                else:
                    self.decode_backend = "fa3"
        """,
    "rel/backend.py": """\
        import torch
        import kernels

        class Backend:
            def __init__(self, runner):
                self.major = torch.cuda.get_device_capability()[0]

            def prefill(self, q):
                if self.major >= 10:
                    return kernels.ragged(q)
                return q
        """,
}


def _tree(tmp_path: Path) -> SourceTree:
    for rel, text in TREE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))
    return SourceTree([tmp_path])


def test_assignments_follow_the_steps_before(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    # sm_120: the dtype step picks fp8, then `major >= 10` picks trtllm; sm_90: bf16, so the else branch's fa3.
    for arch, backend, line in (("sm_120", "trtllm", 13), ("sm_90", "fa3", 15)):
        run = SelectionRun(tree, parse_target(arch), "12.8", sets=["decode_backend"])
        ends, missing = run.run_steps(
            ["rel.args.Args.set_dtype", "rel.args.Args.set_backends", "rel.args.Args.absent"],
            {"major": "arch.major", "kv_cache_dtype": "self.kv_cache_dtype"}, init=False,
        )  # fmt: skip
        assert missing == ["rel.args.Args.absent"]
        assert ends
        assert {(p.backend, p.line, p.how) for p in run.picks} == {(backend, line, "sets decode_backend")}


def test_unbound_arch_parameter_keeps_every_branch(tmp_path: Path) -> None:
    run = SelectionRun(_tree(tmp_path), parse_target("sm_90"), "12.8", sets=["decode_backend"])
    run.run_steps(["rel.args.Args.set_backends"], {}, init=False)
    assert {p.backend for p in run.picks} == {"trtllm", "fa3"}  # major unknown: both literals are possible


def test_kernel_calls_after_init(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    calls = {"kernels.ragged": "ragged"}
    hot = SelectionRun(tree, parse_target("sm_120"), "12.8", calls=calls)
    hot.run_steps(["rel.backend.Backend.prefill"], {}, init=True)
    assert [(p.backend, p.line) for p in hot.picks] == [("ragged", 10)]
    cold = SelectionRun(tree, parse_target("sm_90"), "12.8", calls=calls)
    cold.run_steps(["rel.backend.Backend.prefill"], {}, init=True)
    assert cold.picks == []
    blind = SelectionRun(tree, parse_target("sm_90"), "12.8", calls=calls)
    blind.run_steps(["rel.backend.Backend.prefill"], {}, init=False)  # self.major unknown: both paths
    assert [p.backend for p in blind.picks] == ["ragged"]


def test_a_step_out_of_budget_is_recorded_not_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = SelectionRun(_tree(tmp_path), parse_target("sm_90"), "12.8", calls={"kernels.ragged": "ragged"})

    def out_of_budget(*args: object, **kwargs: object) -> None:
        raise Budget

    monkeypatch.setattr(
        run, "_run_function", out_of_budget
    )  # the step's body runs past the evaluator's budget
    ends, _ = run.run_steps(["rel.backend.Backend.prefill"], {}, init=False)
    assert run.exhausted == ["rel.backend.Backend.prefill"]  # backendsel: undecidable, never "not routed"
    assert ends == []


def test_a_defined_step_the_evaluator_cannot_reach_is_undecided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = SelectionRun(_tree(tmp_path), parse_target("sm_90"), "12.8")
    monkeypatch.setattr(run, "_getattr", lambda *_: UNKNOWN)  # as when loading its module runs out of budget
    _, missing = run.run_steps(["rel.backend.Backend.prefill", "rel.backend.Backend.absent"], {}, init=False)
    assert missing == ["rel.backend.Backend.absent"]
    assert run.exhausted == ["rel.backend.Backend.prefill (its module could not be evaluated)"]
