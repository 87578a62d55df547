"""A small on-disk JSON cache for analysis results, keyed by the hash of the input file.

Results are pure functions of a file's bytes (and the analyser's version), so the key is the file's sha256 and
an entry never goes stale: a changed file has a new key. Entries are written atomically; an unreadable entry is
treated as missing, so a cache can always be deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def default_root() -> Path:
    """``$STACKFARM_CACHE/analysis`` (``~/.cache/stackfarm/analysis`` by default), beside the artifact cache."""
    env = os.environ.get("STACKFARM_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "stackfarm") / "analysis"


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class JsonCache:
    """Entries under ``root/namespace/ab/abcdef....json``; bump the namespace when the analyser changes."""

    root: Path
    namespace: str

    def _path(self, key: str) -> Path:
        return self.root / self.namespace / key[:2] / f"{key}.json"

    def get(self, key: str) -> Any:
        """The stored value, or None when absent or unreadable."""
        try:
            return json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def put(self, key: str, value: Any) -> None:
        """Store `value` (JSON-serialisable); a cache that cannot be written is skipped, never fatal."""
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(value, separators=(",", ":")), encoding="utf-8")
            tmp.replace(path)


__all__ = ["JsonCache", "default_root", "digest_bytes"]
