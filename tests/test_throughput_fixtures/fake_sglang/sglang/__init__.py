"""A stand-in for the `sglang` package in tests: only `python -m sglang.launch_server` exists."""

__version__ = "0.0.0+fake"
