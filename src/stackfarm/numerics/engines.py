"""Engine adapters behind one small interface: greedy generations with per-step top-2 logprobs.

- `HFEngine`: HF transformers on CPU, plain greedy or assisted generation with a draft model. It runs in CI, so
  the comparison logic runs end to end for real without a GPU.
- `SGLangEngine`: SGLang's offline `Engine`, each configuration in its own child process
  (``python -m stackfarm.numerics.engines child REQUEST RESULT``): SGLang kills its whole process tree when an
  engine fails to start, and a child keeps that (and its scheduler processes, reaped by process group) away from
  the pytest process. Nothing is downloaded: HF_HUB_OFFLINE is set and the models are local folders.

Smoke test on a GPU machine (writes tiny models, runs baseline + EAGLE-3, prints the comparison):

    python -m stackfarm.numerics.engines selftest --engine sglang --workdir /tmp/numerics-selftest
    python -m stackfarm.numerics.engines selftest --engine hf          # CPU, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import StackfarmError
from ..proc import register_group
from .compare import Generation, Step, compare, judge
from .tinymodels import SGLANG_OFFLINE_ENV

if TYPE_CHECKING:
    import torch

#: The package folder's parent: put on the child's PYTHONPATH so `-m stackfarm.numerics.engines` imports there.
_SRC = Path(__file__).resolve().parents[2]
#: Lines the child prints for the parent to parse (the rest of its output is SGLang's log).
_MARK = "STACKFARM-NUMERICS"


class EngineError(StackfarmError):
    """An engine could not produce generations; `log_tail` holds the end of its output."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        super().__init__(message)


class EngineOutOfMemory(EngineError):
    """The GPU ran out of memory; `asked` says how much the engine asked for."""

    def __init__(self, asked: str, log_tail: str = "") -> None:
        self.asked = asked
        super().__init__(f"GPU out of memory: asked for {asked}", log_tail)


class Engine(Protocol):
    """Greedy generation for a batch of token-id prompts, EOS ignored, `max_new_tokens` each."""

    @property
    def label(self) -> str: ...

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> tuple[Generation, ...]: ...


def make_prompts(count: int, length: int, vocab: int, seed: int = 0) -> tuple[tuple[int, ...], ...]:
    """Deterministic random prompts: BOS (1) then tokens from [3, vocab), i.e. never pad/BOS/EOS."""
    rng = random.Random(seed)
    return tuple((1, *(rng.randrange(3, vocab) for _ in range(length - 1))) for _ in range(count))


# --------------------------------------------------------------------------- HF transformers (CPU)


@dataclass(frozen=True, kw_only=True)
class Plant:
    """A deliberate divergence, to prove the comparison catches one: at generated `position` of the prompts in
    `prompts`, the engine emits the token its target ranks *last* (a logits processor, so in assisted generation
    it acts on the target's verify logits, i.e. on the speculative path only)."""

    position: int
    prompts: tuple[int, ...] = (0,)


@dataclass(frozen=True, kw_only=True)
class HFEngine:
    """HF transformers on CPU: greedy, or assisted generation when `assistant` is a draft model folder."""

    model: Path
    assistant: Path | None = None
    dtype: str = "float32"
    #: Draft tokens proposed per assisted step (a constant schedule, so runs are reproducible).
    num_assistant_tokens: int = 4
    plant: Plant | None = None
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or ("hf-assisted" if self.assistant else "hf-greedy")

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> tuple[Generation, ...]:
        try:
            import torch
            import transformers
        except ImportError as exc:
            raise EngineError(f"the HF engine needs torch and transformers: {exc}") from exc
        hf_logging: Any = transformers.utils.logging  # untyped
        hf_logging.set_verbosity_error()  # one deprecation line per assisted call otherwise
        hf_logging.disable_progress_bar()
        dtype = getattr(torch, self.dtype)
        torch.manual_seed(0)
        target: Any = self._load(transformers, self.model, dtype)
        draft: Any = None
        if self.assistant is not None:
            draft = self._load(transformers, self.assistant, dtype)
            draft.generation_config.num_assistant_tokens = self.num_assistant_tokens
            draft.generation_config.num_assistant_tokens_schedule = "constant"
        calls = [0]
        hook = target.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            return tuple(
                self._one(
                    torch,
                    target,
                    draft,
                    index=index,
                    prompt=prompt,
                    max_new_tokens=max_new_tokens,
                    calls=calls,
                )
                for index, prompt in enumerate(prompts)
            )
        finally:
            hook.remove()

    def _load(self, transformers: Any, folder: Path, dtype: Any) -> Any:
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
        except (OSError, ValueError) as exc:
            raise EngineError(f"{self.label}: cannot load the model at {folder}: {exc}") from exc
        model.eval()
        return model

    def _one(
        self,
        torch: Any,
        target: Any,
        draft: Any,
        *,
        index: int,
        prompt: Sequence[int],
        max_new_tokens: int,
        calls: list[int],
    ) -> Generation:
        from transformers import LogitsProcessorList

        ids = torch.tensor([list(prompt)], dtype=torch.long)
        processors = LogitsProcessorList()
        if self.plant is not None and index in self.plant.prompts:
            processors.append(_planted_processor(len(prompt) + self.plant.position))
        calls[0] = 0
        with torch.no_grad():
            out = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                eos_token_id=None,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
                logits_processor=processors,
                assistant_model=draft,
            )
        tokens = out.sequences[0, len(prompt) :].tolist()
        logprobs = torch.log_softmax(torch.stack(out.logits)[:, 0].float(), dim=-1)
        top = torch.topk(logprobs, 2, dim=-1)
        steps = tuple(
            Step(token=int(tok), top=tuple(zip(top.indices[i].tolist(), top.values[i].tolist(), strict=True)))
            for i, tok in enumerate(tokens)
        )
        accept = len(tokens) / calls[0] if draft is not None and calls[0] else None
        return Generation(prompt=tuple(prompt), steps=steps, accept_length=accept)


def _planted_processor(length: int) -> Any:
    """A logits processor that, when the sequence is `length` long, keeps only the least likely token."""
    import torch
    from transformers import LogitsProcessor

    class _ForceLeastLikely(LogitsProcessor):  # type: ignore[misc,unused-ignore]  # Any without transformers
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if input_ids.shape[-1] != length:
                return scores
            worst = scores.argmin(dim=-1, keepdim=True)
            forced = torch.full_like(scores, float("-inf"))
            return forced.scatter(-1, worst, 0.0)

    return _ForceLeastLikely()


# --------------------------------------------------------------------------- SGLang (GPU, child process)

#: EAGLE-3 chain drafting (topk 1), as measured on the H200: 3 draft steps, 4 tokens verified per step.
EAGLE3_CHAIN: Mapping[str, Any] = {
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}
#: EAGLE-3 tree drafting (topk 4): exercises build_tree_kernel_efficient and the sibling walk of the verify.
EAGLE3_TREE: Mapping[str, Any] = {
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 4,
    "speculative_num_draft_tokens": 8,
}


@dataclass(frozen=True, kw_only=True)
class SGLangEngine:
    """One SGLang offline-Engine configuration, run in a child process per `generate` call."""

    model: Path
    workdir: Path
    draft: Path | None = None
    dtype: str = "bfloat16"
    #: More sglang.Engine keyword arguments (ServerArgs fields); unknown ones are dropped and reported...
    options: Mapping[str, Any] = field(default_factory=dict)
    #: ...except these: the configuration means nothing without them, so the child stops before starting.
    required: tuple[str, ...] = ()
    attention_backend: str = "triton"
    mem_fraction_static: float = 0.3
    timeout: float = 600.0
    name: str = "sglang"
    #: Extra environment for the child (CUDA_HOME and PATH from `cuda_toolchain_env`, say).
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name

    def engine_kwargs(self) -> dict[str, Any]:
        """The sglang.Engine arguments (before the child drops the ones its SGLang does not know)."""
        kwargs: dict[str, Any] = {
            "model_path": str(self.model),
            "dtype": self.dtype,
            # The H200's default for Llama is fa3, whose library the offline bundle leaves out; triton runs anywhere.
            "attention_backend": self.attention_backend,
            "sampling_backend": "pytorch",
            # CUDA graphs would make EAGLE-3 import cutlass (nvidia-cutlass-dsl) at capture; the comparison does
            # not need them, and without them the first generate is the only JIT wait.
            "disable_cuda_graph": True,
            "skip_tokenizer_init": True,
            "mem_fraction_static": self.mem_fraction_static,
            "random_seed": 0,
            "log_level": "warning",
        }
        if self.draft is not None:
            kwargs["speculative_draft_model_path"] = str(self.draft)
        kwargs.update(self.options)
        return kwargs

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> tuple[Generation, ...]:
        folder = self.workdir / re.sub(r"[^A-Za-z0-9_.-]+", "-", self.label)
        folder.mkdir(parents=True, exist_ok=True)
        request, result, log = folder / "request.json", folder / "result.json", folder / "child.log"
        result.unlink(missing_ok=True)
        payload = {
            "kwargs": self.engine_kwargs(),
            "required": list(self.required),
            "prompts": [list(p) for p in prompts],
            "max_new_tokens": max_new_tokens,
        }
        request.write_text(json.dumps(payload, indent=2), encoding="utf-8")
        argv = [sys.executable, "-m", "stackfarm.numerics.engines", "child", str(request), str(result)]
        code, timed_out, elapsed = run_child(argv, env=self._child_env(), timeout=self.timeout, log=log)
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        data = _result_of(result)
        if data.get("ok"):
            self._note(folder, data, elapsed)
            return tuple(_generation(p, o) for p, o in zip(prompts, data["outputs"], strict=True))
        raise self._failure(text, data, code, timed_out=timed_out, log=log)

    def _child_env(self) -> dict[str, str]:
        """The child's environment: offline, this process's, the engine's own, and this package importable."""
        env = {
            **SGLANG_OFFLINE_ENV,
            **os.environ,
            **self.env,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SRC), env.get("PYTHONPATH", "")) if p)
        return env

    def _failure(
        self, text: str, data: Mapping[str, Any], code: int, *, timed_out: bool, log: Path
    ) -> EngineError:
        """Why a child gave no result: out of memory (with what it asked for), too slow, or its own error."""
        tail = text[-4000:]
        asked = out_of_memory(text + "\n" + str(data.get("error", "")), data.get("asked"))
        if asked is not None:
            return EngineOutOfMemory(asked, tail)
        if timed_out:
            return EngineError(
                f"{self.label}: the engine did not finish within {self.timeout:.0f} s (log {log})", tail
            )
        reason = (
            data.get("error")
            or f"the child exited {code} without a result (SGLang kills its tree on failure)"
        )
        return EngineError(f"{self.label}: {reason} (log {log})", tail)

    @staticmethod
    def _note(folder: Path, data: Mapping[str, Any], elapsed: float) -> None:
        summary = {k: data.get(k) for k in ("timings", "versions", "ignored_options")} | {
            "wall_s": round(elapsed, 1)
        }
        (folder / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")


def _result_of(result: Path) -> dict[str, Any]:
    """The child's result JSON; empty where it wrote none or an unreadable one."""
    data: dict[str, Any] = {}
    if result.is_file():
        with contextlib.suppress(ValueError):
            data = json.loads(result.read_text(encoding="utf-8"))
    return data


def _generation(prompt: Sequence[int], output: Mapping[str, Any]) -> Generation:
    steps = tuple(
        Step(token=int(tok), top=tuple((int(t), float(lp)) for t, lp in (top or ())))
        for tok, top in zip(output["output_ids"], output["top"], strict=True)
    )
    accept = output.get("accept_length")
    return Generation(
        prompt=tuple(prompt), steps=steps, accept_length=None if accept is None else float(accept)
    )


_OOM = re.compile(
    r"out of memory|OutOfMemoryError|Not enough memory|CUBLAS_STATUS_ALLOC_FAILED", re.IGNORECASE
)
_TRIED = re.compile(r"Tried to allocate ([\d.]+ [KMGT]?i?B)")


def out_of_memory(text: str, asked: str | None = None) -> str | None:
    """When `text` (an engine's log) reports a GPU out-of-memory, the size that was asked for; else None."""
    if not _OOM.search(text):
        return None
    tried = _TRIED.search(text)
    parts = [p for p in (f"{tried.group(1)} in one allocation" if tried else None, asked) if p]
    return "; ".join(parts) or "an unknown amount (the log names none)"


def run_child(
    argv: Sequence[str], *, env: Mapping[str, str], timeout: float, log: Path
) -> tuple[int, bool, float]:
    """Run `argv` in a new process group, output to `log`; always kill the group afterwards.

    stackfarm.proc.call cannot be used here: it waits on the direct child only, while SGLang leaves scheduler
    and detokenizer processes behind (and on failure sends signals to its whole tree), so the group must go.
    """
    start = time.monotonic()
    timed_out = False
    with log.open("w", encoding="utf-8") as out:
        out.write(f"+ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(
            list(argv), env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        register_group(proc.pid)  # reaped by the runner should the suite end first
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out, code = True, 124
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
    return code, timed_out, time.monotonic() - start


def cuda_toolchain_env(scratch: Path) -> tuple[dict[str, str], str]:
    """CUDA_HOME and PATH for SGLang's JIT kernels (tvm-ffi runs $CUDA_HOME/bin/nvcc and links -lcudart).

    Without CUDA_HOME, tvm-ffi takes dirname(dirname(which nvcc)), which is wrong when nvcc is a wrapper script
    (as on the lent H200 machines): the wrapper's text names the real nvcc, so that is searched too. A toolkit
    whose lib64 has only libcudart.so.N gets a shim folder of symlinks with lib64/libcudart.so.
    Returns (environment additions, a one-line description).
    """
    home = next((Path(c) for c in _toolkit_candidates() if c and _is_toolkit(Path(c))), None)
    if home is None:
        return {}, "no CUDA toolkit (bin/nvcc + include/cuda_runtime.h) found: SGLang's JIT kernels will fail"
    root = _cudart_shim(home, scratch)
    path = os.pathsep.join((str(root / "bin"), str(Path(sys.executable).parent), os.environ.get("PATH", "")))
    return {"CUDA_HOME": str(root), "PATH": path}, f"CUDA_HOME={root} (toolkit {home})"


def _toolkit_candidates() -> list[str | None]:
    """Where a CUDA toolkit may be, best first: $CUDA_HOME, $CUDA_PATH, nvcc's (and its wrapper's), /usr/local."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parents[1]))
        with contextlib.suppress(OSError):
            text = Path(nvcc).read_bytes()[:8192].decode("utf-8", errors="ignore")
            candidates += [str(Path(m).parents[1]) for m in re.findall(r"(/[^\s'\"]+/bin/nvcc)\b", text)]
    candidates += sorted((str(p) for p in Path("/usr/local").glob("cuda*")), reverse=True)
    return candidates


def _is_toolkit(home: Path) -> bool:
    return (home / "bin/nvcc").is_file() and (home / "include/cuda_runtime.h").is_file()


def _cudart_shim(home: Path, scratch: Path) -> Path:
    """`home`, or a folder of symlinks to it with lib64/libcudart.so where the toolkit has only libcudart.so.N."""
    if any((home / d / "libcudart.so").exists() for d in ("lib64", "lib")):
        return home
    found = sorted(
        p for d in ("lib64", "lib", "targets/x86_64-linux/lib") for p in (home / d).glob("libcudart.so.*")
    )
    if not found:
        return home
    root = scratch / "cuda-home"
    (root / "lib64").mkdir(parents=True, exist_ok=True)
    for name in ("bin", "include", "nvvm"):
        if (home / name).exists() and not (root / name).exists():
            (root / name).symlink_to((home / name).resolve())
    if not (root / "lib64/libcudart.so").exists():
        (root / "lib64/libcudart.so").symlink_to(found[0].resolve())
    return root


# --------------------------------------------------------------------------- the child process


def _say(**values: Any) -> None:
    print(f"{_MARK} {json.dumps(values)}", flush=True)


def _gpu_memory() -> tuple[int, int] | None:
    """(free, total) bytes of GPU 0 from nvidia-smi, or None. Not through torch: a CUDA context in this process
    would sit beside the ones SGLang's scheduler processes create, for nothing."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = [smi, "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits", "--id=0"]
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
        free, total = (int(float(v)) * 2**20 for v in out.strip().splitlines()[0].split(","))
        return free, total
    return None


def _child(request_path: Path, result_path: Path) -> int:
    """Inside the child: start the engine, generate, write the result JSON (also on a Python-level failure)."""
    request = json.loads(request_path.read_text(encoding="utf-8"))
    kwargs: dict[str, Any] = dict(request["kwargs"])
    result: dict[str, Any] = {"ok": False, "timings": {}}
    start = time.monotonic()
    try:
        import torch

        _note_memory(kwargs, result)
        # Imported by name: sglang is only on the GPU machine, and has no type information.
        sglang = importlib.import_module("sglang")
        kwargs = _known_options(sglang, kwargs, request.get("required", ()), result)
        result["versions"] = {"sglang": getattr(sglang, "__version__", "?"), "torch": torch.__version__}
        _say(stage="engine", kwargs=kwargs, ignored=result["ignored_options"])
        engine = sglang.Engine(**kwargs)
        result["timings"]["start_s"] = round(time.monotonic() - start, 1)
        outputs = _generate_once(engine, request, result)
        result["outputs"] = [_sglang_output(o) for o in outputs]
        result["ok"] = True
    except BaseException as exc:  # reported to the parent, which decides; then the child exits non-zero
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-6000:]
        print(result["traceback"], file=sys.stderr, flush=True)
    result_path.write_text(json.dumps(result), encoding="utf-8")
    return 0 if result["ok"] else 1


def _note_memory(kwargs: Mapping[str, Any], result: dict[str, Any]) -> None:
    """What the engine asks of GPU 0 (its static fraction of the total), for an out-of-memory message."""
    memory = _gpu_memory()
    if memory is None:
        return
    free, total = memory
    fraction = float(kwargs.get("mem_fraction_static", 0.3))
    result["asked"] = (
        f"mem_fraction_static={fraction:g} of {total / 2**30:.1f} GiB = {fraction * total / 2**30:.1f} GiB "
        f"({free / 2**30:.1f} GiB free at start)"
    )
    _say(asked=result["asked"])


def _known_options(
    sglang: Any, kwargs: Mapping[str, Any], required: Sequence[str], result: dict[str, Any]
) -> dict[str, Any]:
    """The options this SGLang's ServerArgs has (the others are noted as ignored); a required one it lacks raises."""
    server_args = importlib.import_module("sglang.srt.server_args")
    known = {f.name for f in dataclasses.fields(server_args.ServerArgs)}
    result["ignored_options"] = sorted(k for k in kwargs if k not in known)
    missing = sorted(k for k in required if k not in known)
    if missing:
        raise ValueError(f"SGLang {getattr(sglang, '__version__', '?')} has no option {', '.join(missing)}")
    return {k: v for k, v in kwargs.items() if k in known}


def _generate_once(engine: Any, request: Mapping[str, Any], result: dict[str, Any]) -> Any:
    """Greedy generation with the top-2 log-probabilities per step, timed; the engine is shut down after."""
    try:
        t0 = time.monotonic()
        outputs = engine.generate(
            input_ids=request["prompts"],
            sampling_params={
                "temperature": 0.0,
                "max_new_tokens": request["max_new_tokens"],
                "ignore_eos": True,
            },
            return_logprob=True,
            top_logprobs_num=2,
        )
        result["timings"]["generate_s"] = round(time.monotonic() - t0, 1)
    finally:
        with contextlib.suppress(Exception):
            engine.shutdown()
    return outputs


def _sglang_output(output: Mapping[str, Any]) -> dict[str, Any]:
    meta = output.get("meta_info", {})
    ids = output.get("output_ids")
    if ids is None:
        ids = output.get("token_ids", [])
    # output_top_logprobs: per step, a list of (logprob, token_id, text) or None.
    top = [
        [(int(t), float(lp)) for lp, t, *_ in (step or ())] for step in meta.get("output_top_logprobs", [])
    ]
    top += [[] for _ in range(len(ids) - len(top))]
    accept = meta.get("spec_accept_length")
    if accept is None and meta.get("spec_verify_ct"):
        accept = meta.get("completion_tokens", len(ids)) / meta["spec_verify_ct"]
    return {"output_ids": [int(t) for t in ids], "top": top[: len(ids)], "accept_length": accept}


# --------------------------------------------------------------------------- selftest


def _selftest(args: argparse.Namespace) -> int:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    base, cand, vocab = _selftest_engines(args, work)
    prompts = make_prompts(args.prompts, args.prompt_len, vocab)
    try:
        runs = []
        for engine in (base, cand):
            t0 = time.monotonic()
            runs.append(engine.generate(prompts, args.max_new_tokens))
            print(f"{engine.label}: {len(prompts)} prompts in {time.monotonic() - t0:.1f} s", flush=True)
    except EngineError as exc:
        print(f"ENGINE ERROR: {exc}\n--- log tail ---\n{exc.log_tail}", flush=True)
        return 2
    comparison = compare(runs[0], runs[1], near_tie_tol=args.near_tie_tol, drift_factor=args.drift_factor)
    verdict = judge(comparison, max_near_tie_rate=args.max_near_tie_rate, max_drift=args.max_drift)
    for key, value in comparison.properties().items():
        print(f"  {key}: {value}")
    print(
        f"RESULT {'PASS' if verdict.ok else 'FAIL'} in {time.monotonic() - started:.0f} s: {verdict.message}"
    )
    return 0 if verdict.ok else 1


def _selftest_engines(args: argparse.Namespace, work: Path) -> tuple[Engine, Engine, int]:
    """The tiny target and its draft written under `work`, and the baseline / speculative engines over them."""
    from .tinymodels import CPU_TARGET, GPU_TARGET, write_assistant, write_eagle3_draft, write_target

    if args.engine == "hf":
        target = write_target(work / "target", CPU_TARGET, logit_std=args.logit_std, dtype="float32")
        draft = write_assistant(work / "assistant", target)
        vocab = CPU_TARGET.vocab
        base: Engine = HFEngine(model=target, dtype=args.dtype or "float32")
        cand: Engine = HFEngine(model=target, assistant=draft, dtype=args.dtype or "float32")
    else:
        target = write_target(work / "target", GPU_TARGET, logit_std=args.logit_std)
        draft = write_eagle3_draft(work / "eagle3", GPU_TARGET, logit_std=args.logit_std)
        vocab = GPU_TARGET.vocab
        env, note = cuda_toolchain_env(work)
        print(f"toolchain: {note}", flush=True)
        common = {
            "workdir": work / "runs",
            "timeout": args.timeout,
            "env": env,
            "dtype": args.dtype or "bfloat16",
        }
        lm_head = {"enable_fp32_lm_head": True} if args.fp32_lm_head else {}
        base = SGLangEngine(model=target, name="baseline", options=lm_head, **common)
        spec = EAGLE3_TREE if args.tree else EAGLE3_CHAIN
        cand = SGLangEngine(model=target, draft=draft, name="eagle3", options={**spec, **lm_head}, **common)
    return base, cand, vocab


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stackfarm.numerics.engines",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    child = sub.add_parser("child", help="(internal) run one SGLang engine configuration")
    child.add_argument("request", type=Path)
    child.add_argument("result", type=Path)
    test = sub.add_parser("selftest", help="tiny models, baseline vs speculative, compared")
    test.add_argument("--engine", choices=("sglang", "hf"), default="sglang")
    test.add_argument("--workdir", default="/tmp/stackfarm-numerics-selftest")
    test.add_argument("--dtype", default=None, help="default: bfloat16 (sglang), float32 (hf)")
    test.add_argument("--prompts", type=int, default=4)
    test.add_argument("--prompt-len", type=int, default=16)
    test.add_argument("--max-new-tokens", type=int, default=32)
    test.add_argument("--logit-std", type=float, default=2.0)
    test.add_argument("--no-fp32-lm-head", dest="fp32_lm_head", action="store_false")
    test.add_argument("--tree", action="store_true", help="EAGLE-3 tree drafting (topk 4) instead of a chain")
    test.add_argument("--near-tie-tol", type=float, default=1e-2)
    test.add_argument("--max-near-tie-rate", type=float, default=0.25)
    test.add_argument("--drift-factor", type=float, default=2.0)
    test.add_argument("--max-drift", type=float, default=0.1)
    test.add_argument("--timeout", type=float, default=600.0, help="seconds per engine child")
    args = parser.parse_args(argv)
    if args.command == "child":
        return _child(args.request, args.result)
    return _selftest(args)


__all__ = [
    "EAGLE3_CHAIN",
    "EAGLE3_TREE",
    "Engine",
    "EngineError",
    "EngineOutOfMemory",
    "HFEngine",
    "Plant",
    "SGLangEngine",
    "cuda_toolchain_env",
    "make_prompts",
    "out_of_memory",
    "run_child",
]


if __name__ == "__main__":
    sys.exit(main())
