"""Where wheels come from: one index of matrix.toml's [indexes], a find-links folder or one wheel file.

A declaration, on the ground floor: the matrix declares its sources and the artifacts layer reads them, so both
import it here. It lived in stackfarm.artifacts, which made the matrix (a configuration reader) stand on the
HTTP client, the index waits and the zip reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where artifacts come from: exactly one of url / find_links / wheel is set."""

    name: str
    url: str | None = None
    find_links: Path | None = None
    wheel: Path | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.url, self.find_links, self.wheel)) != 1:
            raise ValueError(f"source {self.name!r}: set exactly one of url, find_links, wheel")


__all__ = ["Source"]
