"""A file server on 127.0.0.1 that answers HTTP range requests (RFC 9110 single ranges, suffixes too), for the
lazy-read tests; ``no_ranges`` makes it ignore Range like a server without them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class Files:
    blobs: dict[str, bytes] = field(default_factory=dict)
    ranges: list[str | None] = field(default_factory=list)
    no_ranges: bool = False
    base: str = ""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        state = self.server.state
        data = state.blobs[self.path.strip("/")]
        rng = self.headers.get("Range")
        state.ranges.append(rng)
        if rng and not state.no_ranges:
            first, _, last = rng.removeprefix("bytes=").partition("-")
            if not first:
                start, end = max(0, len(data) - int(last)), len(data)
            else:
                start, end = int(first), min(len(data), int(last) + 1 if last else len(data))
            body, code = data[start:end], 206
            extra = {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
        else:
            body, code, extra = data, 200, {}
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    state: Files


@pytest.fixture
def files() -> Iterator[Files]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.state = Files(base=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server.state
    server.shutdown()
    server.server_close()
