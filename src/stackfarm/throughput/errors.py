"""The errors of a throughput measurement: each message says why, with the server's log where it helps."""

from __future__ import annotations

from ..errors import StackfarmError


class MeasureError(StackfarmError):
    """A measurement could not be made; the message says why (and shows the server's log where it helps)."""


class PortInUseError(MeasureError):
    """A port the servers need is taken."""


class ServerStartError(MeasureError):
    """A server exited, or never answered /health with 200, before its deadline."""


class BenchError(MeasureError):
    """A request or a bench tool gave no usable figures."""


class ZeroTokensError(BenchError):
    """The server streamed no tokens for a request (or for some of its items)."""


__all__ = ["BenchError", "MeasureError", "PortInUseError", "ServerStartError", "ZeroTokensError"]
