"""Every error stackfarm raises on purpose, each with the exit code the CLI returns for it.

An error tells the user three things: where (file:line or key), what is wrong, and how to fix it.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Iterable
from pathlib import Path


class ExitCode(enum.IntEnum):
    #: Every cell that ran passed (or was reused from a passing run).
    OK = 0
    #: At least one cell failed a suite, hit a conflict or an error.
    CELLS_FAILED = 1
    #: matrix.toml (or a command-line argument) is invalid; nothing ran.
    CONFIG = 2
    #: A package index or the artifact cache could not be used; nothing ran.
    ARTIFACTS = 3
    #: The run was interrupted (Ctrl-C); finished cells kept their reports.
    INTERRUPTED = 130


class StackfarmError(Exception):
    """Base of all expected failures: the message is shown as is, without a traceback."""

    exit_code: ExitCode = ExitCode.CELLS_FAILED


class ConfigError(StackfarmError):
    """matrix.toml is malformed or inconsistent."""

    exit_code = ExitCode.CONFIG

    def __init__(self, path: Path | str, message: str, *, line: int | None = None, fix: str = "") -> None:
        self.path = Path(path)
        self.line = line
        self.fix = fix
        where = f"{self.path}:{line}" if line else str(self.path)
        text = f"{where}: {message}"
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)


class ArtifactError(StackfarmError):
    """A wheel could not be found, fetched, verified or unpacked."""

    exit_code = ExitCode.ARTIFACTS


class IndexUnreachableError(ArtifactError):
    """The package index did not answer after retries."""


class CellError(StackfarmError):
    """One cell could not be realised; the other cells go on."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A close-match suggestion, or an empty string when nothing is close."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean `{matches[0]}`?" if matches else ""


__all__ = [
    "ArtifactError",
    "CellError",
    "ConfigError",
    "ExitCode",
    "IndexUnreachableError",
    "StackfarmError",
    "did_you_mean",
]
