"""A fake `python -m sglang.launch_server` for tests without a GPU (see ../../README.md).

Like the real server, it streams "text" (the decoded completion so far) unless started with
--skip-tokenizer-init, and takes "text" prompts too (one token per word). GET /server_info answers with
SGLang's `internal_states` (avg_spec_accept_length under --speculative-algorithm) and GET /v1/models
lists one model: both are what sglang.bench_serving reads.

A draft folder with a planted.json (stackfarm.numerics.planted) makes it play the planted models: a single
prompt ending in the draft's wrong range accepts 1 token per verify, any other steps + 1; a verify step costs
FAKE_SGLANG_VERIFY_COST decode steps (default 2), so EAGLE-3 breaks even between the planted rates.

Environment: FAKE_SGLANG_MODE = ok | never-healthy | crash | zero-tokens (default ok);
FAKE_SGLANG_TOKEN_S = seconds per decode step (default 0.002); FAKE_SGLANG_START_S = seconds of "loading"
before /health answers 200 (default 0.3).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODE = os.environ.get("FAKE_SGLANG_MODE", "ok")
STEP_S = float(os.environ.get("FAKE_SGLANG_TOKEN_S", "0.002"))
VERIFY_COST = float(os.environ.get("FAKE_SGLANG_VERIFY_COST", "2"))
START_S = float(os.environ.get("FAKE_SGLANG_START_S", "0.3"))
READY = threading.Event()


def log(text: str) -> None:
    print(f"[fake sglang] {text}", flush=True)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    speculative = False
    #: --skip-tokenizer-init: token ids only, no "text" in the events.
    ids_only = False
    #: The planted draft's description (planted.json beside its config), or None.
    planted: dict[str, Any] | None = None

    def log_message(self, format: str, *args: Any) -> None:
        log(format % args)

    def _plain(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path in ("/health", "/health_generate"):
            if MODE == "never-healthy":
                log("health check received; the scheduler is stuck")
                time.sleep(3600)  # never answers
            self._plain(200 if READY.is_set() else 503)
        elif self.path == "/v1/models":  # what sglang.bench_serving polls until the server is ready
            if not READY.is_set():
                self._plain(503)
                return
            model = {"id": "fake-sglang", "object": "model", "owned_by": "sglang"}
            self._plain(200, json.dumps({"object": "list", "data": [model]}).encode())
        elif self.path == "/server_info":
            state = {"avg_spec_accept_length": 2.0} if self.speculative else {}
            self._plain(200, json.dumps({"internal_states": [state]}).encode())
        else:
            self._plain(404)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, payload: Any) -> None:
        self._chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")

    def do_POST(self) -> None:
        if self.path != "/generate":
            self._plain(404)
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids = body["input_ids"] if "input_ids" in body else body["text"]
        if isinstance(ids, str) or (ids and isinstance(ids[0], str)):  # words stand for tokens
            ids = [t.split() for t in ids] if isinstance(ids, list) else ids.split()
        batched = bool(ids) and isinstance(ids[0], list)
        prompts = ids if batched else [ids]
        new = int(body["sampling_params"]["max_new_tokens"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if MODE != "zero-tokens":
            # EAGLE-3 accepts 2 tokens per verify step here, so its chunks carry 2 tokens after the first.
            step = 2 if self.speculative else 1
            pause = STEP_S
            if self.speculative and self.planted is not None:
                lo, hi = self.planted["wrong"] or (0, 0)
                wrong = any(lo <= int(p[-1]) < hi for p in prompts)  # a batch runs at its slowest pace
                step = 1 if wrong else int(self.planted.get("steps", 3)) + 1
                pause = STEP_S * VERIFY_COST
            produced = 0
            time.sleep(STEP_S * 2)  # prefill
            while produced < new:
                produced = min(new, produced + (1 if produced == 0 else step))
                for index, prompt in enumerate(prompts):
                    done = produced >= new
                    meta: dict[str, Any] = {
                        "id": f"req-{index}",
                        "prompt_tokens": len(prompt),
                        "completion_tokens": produced,
                        "finish_reason": {"type": "length", "length": new} if done else None,
                    }
                    if done and self.speculative:
                        verify_steps = 1 + (new - 1 + step - 1) // step
                        if self.planted is not None:  # as SGLang counts: the prefill token, no verify
                            verify_steps = (new - 1 + step - 1) // step
                        meta["spec_accept_length"] = new / verify_steps
                        meta["spec_verify_ct"] = verify_steps
                    event: dict[str, Any] = {"output_ids": list(range(produced)), "meta_info": meta}
                    if not self.ids_only:
                        event["text"] = "".join(f" t{i}" for i in range(produced))
                    if batched:
                        event["index"] = index
                    self._event(event)
                time.sleep(pause)
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--speculative-algorithm", default=None)
    parser.add_argument("--skip-tokenizer-init", action="store_true")
    parser.add_argument("--speculative-draft-model-path", default=None)
    args, _rest = parser.parse_known_args()
    log(f"argv {sys.argv[1:]}")
    if MODE == "crash":
        log("loading model")
        print("Traceback (most recent call last):", flush=True)
        print('  File "sglang/srt/layers/quantization/fp8.py", line 1, in <module>', flush=True)
        print("ImportError: cannot import name 'fp8_kernel' from 'sgl_kernel'", flush=True)
        sys.exit(1)
    Handler.speculative = args.speculative_algorithm is not None
    Handler.ids_only = args.skip_tokenizer_init
    if args.speculative_draft_model_path:
        sidecar = Path(args.speculative_draft_model_path) / "planted.json"
        if sidecar.is_file():
            Handler.planted = json.loads(sidecar.read_text(encoding="utf-8"))
            log(f"planted draft: wrong after {Handler.planted['wrong']}")
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    log(f"listening on {args.host}:{args.port}; loading weights")

    def ready() -> None:
        time.sleep(START_S)
        READY.set()
        log("The server is fired up and ready to roll!")

    threading.Thread(target=ready, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
