"""The SGLang engine adapter's process protocol, on CPU: the real child code (`python -m
stackfarm.numerics.engines child`) runs against a stand-in `sglang` package written here.

The stand-in models the parts of SGLang 0.5.15 the adapter relies on: `sglang.Engine(**kwargs)` built from a
`ServerArgs` dataclass (unknown keyword -> TypeError), `generate(input_ids=..., return_logprob=True,
top_logprobs_num=2)` returning `output_ids` and `meta_info.output_top_logprobs` as (logprob, token_id, text)
triples, `spec_accept_length` for speculative runs; and its failure modes: a CUDA out-of-memory error, a start-up
failure that kills the whole process tree (SGLang's SIGQUIT handler), and a hang.
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from stackfarm.numerics.engines import (
    EAGLE3_CHAIN,
    EngineError,
    EngineOutOfMemory,
    SGLangEngine,
    cuda_toolchain_env,
    out_of_memory,
    run_child,
)

pytest.importorskip("torch")  # the child reads the GPU's size through torch first

FAKE_SERVER_ARGS = """
from dataclasses import dataclass
from typing import Optional


@dataclass
class ServerArgs:
    model_path: str
    dtype: str = "auto"
    attention_backend: Optional[str] = None
    sampling_backend: Optional[str] = None
    disable_cuda_graph: bool = False
    skip_tokenizer_init: bool = False
    mem_fraction_static: Optional[float] = None
    random_seed: Optional[int] = None
    log_level: str = "info"
    speculative_algorithm: Optional[str] = None
    speculative_draft_model_path: Optional[str] = None
    speculative_num_steps: Optional[int] = None
    speculative_eagle_topk: Optional[int] = None
    speculative_num_draft_tokens: Optional[int] = None
    tp_size: int = 1
"""

FAKE_SGLANG = """
import os
import signal
import time

from sglang.srt.server_args import ServerArgs

__version__ = "0.0.fake"


class Engine:
    def __init__(self, **kwargs):
        self.args = ServerArgs(**kwargs)
        mode = os.environ.get("FAKE_SGLANG_MODE", "ok")
        if mode == "oom":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 139 GiB")
        if mode == "kill":
            os.killpg(0, signal.SIGKILL)
        if mode == "hang":
            time.sleep(120)

    def generate(self, input_ids, sampling_params, return_logprob=False, top_logprobs_num=0):
        assert return_logprob and top_logprobs_num == 2 and sampling_params["temperature"] == 0.0
        outputs = []
        for prompt in input_ids:
            ids = [(sum(prompt) + i) % 50 for i in range(sampling_params["max_new_tokens"])]
            top = [[(-0.1, t, None), (-0.75, t + 1, None)] for t in ids]
            meta = {"output_top_logprobs": top, "completion_tokens": len(ids)}
            if self.args.speculative_algorithm:
                meta["spec_accept_length"] = 2.5
            outputs.append({"output_ids": ids, "meta_info": meta})
        return outputs

    def shutdown(self):
        pass
"""


@pytest.fixture(scope="module")
def fake_sglang(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fake-sglang")
    (root / "sglang" / "srt").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text(textwrap.dedent(FAKE_SGLANG))
    (root / "sglang" / "srt" / "__init__.py").write_text("")
    (root / "sglang" / "srt" / "server_args.py").write_text(textwrap.dedent(FAKE_SERVER_ARGS))
    return root


def _engine(tmp_path: Path, fake: Path, mode: str = "ok", **kw: object) -> SGLangEngine:
    return SGLangEngine(
        model=tmp_path / "model",
        workdir=tmp_path / "runs",
        env={"PYTHONPATH": str(fake), "FAKE_SGLANG_MODE": mode},
        timeout=60,
        **kw,  # type: ignore[arg-type]
    )


def test_engine_kwargs_are_the_verified_ones(tmp_path: Path) -> None:
    engine = SGLangEngine(model=tmp_path / "m", workdir=tmp_path, draft=tmp_path / "d", options=EAGLE3_CHAIN)
    kwargs = engine.engine_kwargs()
    assert kwargs["attention_backend"] == "triton"
    assert kwargs["sampling_backend"] == "pytorch"
    assert kwargs["disable_cuda_graph"] is True
    assert kwargs["skip_tokenizer_init"] is True
    assert kwargs["speculative_algorithm"] == "EAGLE3"
    assert kwargs["speculative_draft_model_path"] == str(tmp_path / "d")


def test_child_protocol_end_to_end(tmp_path: Path, fake_sglang: Path) -> None:
    engine = _engine(
        tmp_path, fake_sglang, draft=tmp_path / "draft", options={**EAGLE3_CHAIN, "enable_fp32_lm_head": True}
    )
    gens = engine.generate([(1, 5, 9), (1, 7)], 6)
    assert [g.tokens for g in gens] == [
        tuple((15 + i) % 50 for i in range(6)),
        tuple((8 + i) % 50 for i in range(6)),
    ]
    step = gens[0].steps[0]
    assert step.top == ((15, -0.1), (16, -0.75))
    assert step.gap == pytest.approx(0.65)
    assert gens[0].accept_length == 2.5
    summary = (tmp_path / "runs" / "sglang" / "summary.json").read_text()
    assert '"enable_fp32_lm_head"' in summary  # dropped (the stand-in lacks it) and reported
    assert "0.0.fake" in summary


def test_required_option_missing_stops_before_start(tmp_path: Path, fake_sglang: Path) -> None:
    engine = _engine(
        tmp_path, fake_sglang, options={"enable_torch_symm_mem": True}, required=("enable_torch_symm_mem",)
    )
    with pytest.raises(EngineError, match="has no option enable_torch_symm_mem"):
        engine.generate([(1, 2)], 2)


def test_out_of_memory_is_reported_with_the_size(tmp_path: Path, fake_sglang: Path) -> None:
    with pytest.raises(EngineOutOfMemory) as info:
        _engine(tmp_path, fake_sglang, mode="oom").generate([(1, 2)], 2)
    assert info.value.asked.startswith("2.50 GiB in one allocation")
    assert "GPU out of memory: asked for 2.50 GiB" in str(info.value)


def test_tree_killing_failure_leaves_the_parent_alive(tmp_path: Path, fake_sglang: Path) -> None:
    with pytest.raises(EngineError, match="exited -9 without a result") as info:
        _engine(tmp_path, fake_sglang, mode="kill").generate([(1, 2)], 2)
    assert "stackfarm.numerics.engines child" in info.value.log_tail


def test_timeout_kills_the_group(tmp_path: Path, fake_sglang: Path) -> None:
    engine = SGLangEngine(
        model=tmp_path / "m",
        workdir=tmp_path / "runs",
        timeout=5,
        env={"PYTHONPATH": str(fake_sglang), "FAKE_SGLANG_MODE": "hang"},
    )
    start = time.monotonic()
    with pytest.raises(EngineError, match="did not finish within 5 s"):
        engine.generate([(1, 2)], 2)
    assert time.monotonic() - start < 40


def test_run_child_reaps_grandchildren(tmp_path: Path) -> None:
    """A grandchild left running (as SGLang's scheduler would be) is killed with the group."""
    marker = tmp_path / "alive"
    late = tmp_path / "late.py"
    late.write_text(f"import pathlib, time\ntime.sleep(3)\npathlib.Path({str(marker)!r}).write_text('x')\n")
    parent = tmp_path / "parent.py"
    parent.write_text(
        f"import subprocess, sys\nsubprocess.Popen([sys.executable, {str(late)!r}])\nprint('parent done')\n"
    )
    code, timed_out, _ = run_child(
        [sys.executable, str(parent)], env={"PATH": "/usr/bin:/bin"}, timeout=30, log=tmp_path / "log"
    )
    assert (code, timed_out) == (0, False)
    time.sleep(4)
    assert not marker.exists()
    assert "parent done" in (tmp_path / "log").read_text()


@pytest.mark.parametrize(
    ("text", "asked", "want"),
    [
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
            None,
            "20.00 MiB in one allocation",
        ),
        (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
            "0.3 of 139 GiB",
            "0.3 of 139 GiB",
        ),
        ("CUDA error: out of memory", None, "an unknown amount (the log names none)"),
        ("ValueError: bad config", "0.3 of 139 GiB", None),
    ],
)
def test_out_of_memory_parsing(text: str, asked: str | None, want: str | None) -> None:
    assert out_of_memory(text, asked) == want


def test_toolchain_env_shims_libcudart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A toolkit whose lib64 has only libcudart.so.13 gets a shim folder with lib64/libcudart.so."""
    home = tmp_path / "cuda-13.0"
    for sub in ("bin", "include", "lib64"):
        (home / sub).mkdir(parents=True)
    (home / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (home / "include" / "cuda_runtime.h").write_text("")
    (home / "lib64" / "libcudart.so.13").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(home))
    env, note = cuda_toolchain_env(tmp_path / "scratch")
    shim = tmp_path / "scratch" / "cuda-home"
    assert env["CUDA_HOME"] == str(shim)
    assert (shim / "lib64" / "libcudart.so").resolve() == (home / "lib64" / "libcudart.so.13").resolve()
    assert (shim / "bin" / "nvcc").exists()
    assert env["PATH"].startswith(str(shim / "bin"))
    assert str(home) in note


def test_toolchain_env_follows_an_nvcc_wrapper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "opt" / "cuda"
    for sub in ("bin", "include", "lib64"):
        (real / sub).mkdir(parents=True)
    (real / "bin" / "nvcc").write_text("")
    (real / "include" / "cuda_runtime.h").write_text("")
    (real / "lib64" / "libcudart.so").write_text("")
    wrappers = tmp_path / "wrappers"
    wrappers.mkdir()
    wrapper = wrappers / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec {real}/bin/nvcc "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{wrappers}:/usr/bin:/bin")
    env, _ = cuda_toolchain_env(tmp_path / "scratch")
    assert env["CUDA_HOME"] == str(real)
