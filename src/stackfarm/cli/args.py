"""Argument types the subcommands share: a value out of range is argparse's usage error (exit 2, the usage
line and the fix), before any work, never a run that silently does something else."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole(minimum: int, example: int) -> Callable[[str], int]:
    """An argparse `type` for a whole number of `minimum` or more (`--jobs 0` names no cell to run)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number of {minimum} or more (fix: give one, e.g. {example})"
            )
        return value

    parse.__name__ = f"whole number >= {minimum}"  # what argparse names the type by
    return parse


__all__ = ["whole"]
