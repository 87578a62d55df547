"""Every error stackfarm raises on purpose, each with the exit code the CLI returns for it.

An error tells the user three things: where (file:line or key), what is wrong, and how to fix it.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Iterable
from pathlib import Path


class ExitCode(enum.IntEnum):
    """What a stackfarm command's exit status means; a CI gate can trust each value (see the README)."""

    #: Every cell passed: every enabled suite ran and every required testcase passed.
    OK = 0
    #: At least one cell failed: a suite failed or errored, a patch did not apply, or a planned cell conflicts.
    CELLS_FAILED = 1
    #: matrix.toml (or a command-line argument) is invalid; nothing ran.
    CONFIG = 2
    #: Nothing failed, but some cell is incomplete: a required testcase or a suite was skipped (no GPU, a gate).
    INCOMPLETE = 3
    #: The environment stood in the way (a package index unreachable, the container engine down, the cache
    #: unusable): nothing failed, but some cell has no verdict.
    ENVIRONMENT = 4
    #: The run was interrupted (Ctrl-C, SIGTERM); finished cells kept their reports, no half verdict is kept.
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


class UsageError(StackfarmError):
    """A command-line argument is invalid (it names nothing, or a value out of range); nothing ran."""

    exit_code = ExitCode.CONFIG

    def __init__(self, argument: str, message: str, *, fix: str) -> None:
        self.argument = argument
        self.fix = fix
        super().__init__(f"{argument}: {message}\n  fix: {fix}")


class ArtifactError(StackfarmError):
    """A wheel could not be found, fetched, verified or unpacked."""

    exit_code = ExitCode.ENVIRONMENT


class EnvironmentProblem(StackfarmError):
    """Something outside the stack under test stands in the way (an engine down, a read-only folder)."""

    exit_code = ExitCode.ENVIRONMENT

    def __init__(self, message: str, *, fix: str = "") -> None:
        self.fix = fix
        super().__init__(message + (f"\n  fix: {fix}" if fix else ""))


class IndexUnreachableError(ArtifactError):
    """The package index did not answer after retries."""


class CellError(StackfarmError):
    """One cell could not be realised; the other cells go on."""


class Unavailable(Exception):
    """What cannot be had here, with the reason as its message: a wheel a suite family's query asks for (an
    index unreachable, no such release; stackfarm.family.WheelQuery), or one the analysis needs. The finding
    that needed it is unanswered, never passed; the runner hands the reason to the suite where the family's
    `Needs.unresolved` says so."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A close-match suggestion, or an empty string when nothing is close."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean `{matches[0]}`?" if matches else ""


__all__ = [
    "ArtifactError",
    "CellError",
    "ConfigError",
    "EnvironmentProblem",
    "ExitCode",
    "IndexUnreachableError",
    "StackfarmError",
    "Unavailable",
    "UsageError",
    "did_you_mean",
]
