"""Capture real `sglang.bench_serving` output files against fake_sglang (how the captured_* fixtures were made).

Not a test: run it by hand with a Python in which SGLang's bench client imports (on CPU that needs torch,
transformers == SGLang's pin, aiohttp, psutil, pyzmq... see the README beside it) and SGLANG_TREE naming an
unpacked sglang wheel:

    SGLANG_TREE=~/.cache/stackfarm/trees/<hash> python capture_bench_serving.py OUT_DIR

The bench client is SGLang's own code, unmodified; only the server is the fake (no GPU here). It writes
OUT_DIR/captured_bench_serving_{baseline,eagle3,zero_tokens}.jsonl.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: (name, extra fake-server arguments, FAKE_SGLANG_MODE)
RUNS = (
    ("baseline", (), "ok"),
    ("eagle3", ("--speculative-algorithm", "EAGLE3"), "ok"),
    ("zero_tokens", (), "zero-tokens"),
)


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer over "t0" ... "t1020": the fake server streams such words as its text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i + 3 for i in range(1021)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    # Typed as Any: newer transformers alias the class to an unannotated backend (mypy: no-untyped-call).
    fast_class: Any = PreTrainedTokenizerFast
    fast = fast_class(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(folder))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the fake server at {url} did not become ready")


def capture(out: Path, sglang_tree: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        write_tokenizer(Path(scratch) / "tokenizer")
        for name, extra, mode in RUNS:
            port = free_port()
            env = {**os.environ, "PYTHONPATH": str(HERE / "fake_sglang"), "FAKE_SGLANG_MODE": mode}
            env["FAKE_SGLANG_TOKEN_S"] = "0.004"
            server = subprocess.Popen(
                [sys.executable, "-m", "sglang.launch_server", "--port", str(port), *extra], env=env
            )
            try:
                wait_ready(f"http://127.0.0.1:{port}/health")
                target = out / f"captured_bench_serving_{name}.jsonl"
                target.unlink(missing_ok=True)
                bench_env = {**os.environ, "PYTHONPATH": sglang_tree, "HF_HUB_OFFLINE": "1"}
                argv = [
                    sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang",
                    "--base-url", f"http://127.0.0.1:{port}", "--dataset-name", "random-ids",
                    "--random-input-len", "16", "--random-output-len", "32", "--random-range-ratio", "1",
                    "--num-prompts", "8", "--tokenizer", str(Path(scratch) / "tokenizer"),
                    "--tokenize-prompt", "--seed", "0", "--disable-tqdm", "--output-file", str(target),
                ]  # fmt: skip
                subprocess.run(argv, env=bench_env, check=True)
            finally:
                server.terminate()
                server.wait(timeout=10)


if __name__ == "__main__":
    capture(Path(sys.argv[1]), os.environ["SGLANG_TREE"])
