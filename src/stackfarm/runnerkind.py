"""A kind of self-hosted runner as matrix.toml declares it ([runners.<name>]): a declaration on the ground
floor. The matrix reads it, and the one dispatch rule (stackfarm.driver.route) routes cells to it; the suites
ask the driver what their kind is asked (05-import) without standing on the configuration layer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Runner:
    """A kind of self-hosted CI runner ([runners.<name>]): the labels a job asks for, and which cells run there."""

    name: str
    labels: tuple[str, ...]
    arch: str | None
    gpus: int
    #: fnmatch globs on cell ids; the first kind (in file order) that matches a cell runs it.
    cells: tuple[str, ...]
    #: The NVIDIA driver the runner has ("570.86.15"), None when matrix.toml does not say (stackfarm.driver).
    driver: str | None = None
    #: The runner has the cuda-compat package: a CUDA newer than its driver runs (forward compatibility).
    forward_compat: bool = False


__all__ = ["Runner"]
