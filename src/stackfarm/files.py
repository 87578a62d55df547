"""Atomic file writes: a reader sees the old file or the new one, never a mix (temp file in the same folder,
fsync, ``os.replace``, then an fsync of the folder where the platform allows it); and a file's sha256, read in
chunks."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from .errors import EnvironmentProblem

#: How much of a file `sha256_file` reads at a time.
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """The sha256 (hex) of a file's bytes, read in chunks (GB-sized wheels and libraries)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` atomically; a folder that cannot be written (read-only, full) is an EnvironmentProblem."""
    try:
        _write(path, data)
    except OSError as exc:
        raise EnvironmentProblem(
            f"{path}: cannot write it ({exc.strerror or exc}); nothing half-written was left there",
            fix="free space or fix the folder's permissions, or choose another folder (--reports DIR)",
        ) from None


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.chmod(path.stat().st_mode & 0o7777 if path.exists() else 0o644)  # mkstemp makes 0600
        tmp.replace(path)  # os.replace
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable; not possible everywhere, and not essential
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` so that readers see the old file or the new one, never a mix."""
    write_bytes_atomic(path, text.encode("utf-8"))


__all__ = ["sha256_file", "write_atomic", "write_bytes_atomic"]
