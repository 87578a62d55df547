"""Where `stackfarm run` runs its cells: here (``local``, the default: a thread pool of --jobs cells) or as
tasks of a Ray cluster (``ray[:ADDRESS]``, stackfarm.executors.ray; Ray is imported only then).

    stackfarm run --executor local                      # the default
    stackfarm run --executor ray --store URL            # the cluster $RAY_ADDRESS names, else a local Ray
    stackfarm run --executor ray:10.0.0.5:6379 --store URL
    stackfarm run --executor ray:ray://head:10001 --store URL   # through the Ray client
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

NAMES = ("local", "ray")


@dataclass(frozen=True)
class Executor:
    """An executor as `--executor` names it: its name and, for Ray, the cluster's address (None: Ray's own
    default, $RAY_ADDRESS or a local instance)."""

    name: str
    address: str | None = None

    def __str__(self) -> str:
        return self.name if self.address is None else f"{self.name}:{self.address}"


LOCAL = Executor("local")


def parse(text: str) -> Executor:
    """`--executor`'s value: ``local``, ``ray`` or ``ray:ADDRESS``; ValueError saying what it takes."""
    name, sep, address = text.strip().partition(":")
    if name == "local" and not sep:
        return LOCAL
    if name == "ray":
        if sep and not address.strip():
            raise ValueError("ray: needs an address after the colon (ray:HOST:PORT), or none at all (ray)")
        return Executor("ray", address.strip() or None)
    raise ValueError(
        f"{text!r} is not an executor: give local (the default), ray, or ray:ADDRESS (e.g. ray:10.0.0.5:6379)"
    )


def option(text: str) -> Executor:
    """`parse` as argparse's `type=`: its message becomes argparse's usage error."""
    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


__all__ = ["LOCAL", "NAMES", "Executor", "option", "parse"]
