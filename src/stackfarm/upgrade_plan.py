"""The upgrade planner's answer as records: the candidates it judged, their blockers, the recommendation.

Plain frozen data (what stackfarm.upgrade computes, stackfarm.upgrade_report renders and the command line
prints): the report reads these without standing on the planner, which stands on the resolver, the index and the
static analysis. See stackfarm.upgrade's docstring for what a blocker and a candidate's status mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .matrix import Model
from .patchset import PatchSet
from .upgrade_patches import LineageChoice

Status = str  # pass | open | fail | unavailable


@dataclass(frozen=True, kw_only=True)
class Options:
    """What the planner is asked: the arch and driver of the server, its GPUs, the models, the patch sets."""

    arch: str
    reference: str | None = None
    driver: str | None = None
    forward_compat: bool = False
    gpus: int = 1
    models: tuple[Model, ...] = ()
    sets: tuple[PatchSet, ...] = ()
    #: The newest release to look at (None: the newest on the index).
    to: str | None = None
    strict: bool = False
    #: Read flashinfer-python's sources too (its JIT gates decide features).
    flashinfer_sources: bool = True
    jobs: int = 0
    #: Where stored GPU verdicts of the candidate cells are looked up (reports/<cell>/verdict.json).
    reports: Path | None = None


@dataclass(frozen=True, kw_only=True)
class Blocker:
    """One reason a candidate stack does not run (see the module docstring)."""

    key: str
    kind: str  # capability | eagle3 | patch | driver | unavailable | python | cuda | error
    outcome: str  # fail | open
    title: str
    sites: tuple[str, ...]
    message: str
    #: The patch sets that touch it, each with what it does on this release.
    fixes: tuple[str, ...] = ()
    #: The start cell has it too.
    current: bool = False


@dataclass(frozen=True, kw_only=True)
class Fixed:
    """A finding of the pristine release that the chosen patches fix."""

    key: str
    title: str
    sites: tuple[str, ...]
    by: tuple[str, ...]
    #: The [features] entry the finding belongs to ("" for none): what a moved gate still shares.
    feature: str = ""


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One release as a whole stack, judged."""

    sglang: str
    values: Mapping[str, str]
    cell: str
    #: How the stack was formed: the release's pins, where the CUDA came from.
    notes: tuple[str, ...]
    floor: str
    status: Status
    blockers: tuple[Blocker, ...]
    fixed: tuple[Fixed, ...] = ()
    patches: tuple[LineageChoice, ...] = ()
    #: A GPU verdict of this cell stored in the reports folder (re-judged), "" when none.
    stored: str = ""
    #: The static row came from the cache.
    cached: bool = False
    seconds: float = 0.0

    @property
    def new_failures(self) -> tuple[Blocker, ...]:
        return tuple(b for b in self.blockers if b.outcome == "fail" and not b.current)


@dataclass(frozen=True, kw_only=True)
class Span:
    """Where one blocker appears and goes away along the walk."""

    key: str
    kind: str
    outcome: str
    title: str
    appears: str
    #: The first release after `appears` without it; None: it is in every later release looked at.
    gone: str | None
    releases: tuple[str, ...]
    current: bool


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    release: str | None
    cell: str | None
    values: Mapping[str, str]
    carry: tuple[str, ...] = ()
    retire: tuple[str, ...] = ()
    open: tuple[str, ...] = ()
    accepted: tuple[str, ...] = ()
    proof: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class UpgradePlan:
    start: Candidate
    options: Options
    candidates: tuple[Candidate, ...]
    spans: tuple[Span, ...]
    recommendation: Recommendation
    #: Static rows computed in this run, and read from the cache.
    computed: int
    reused: int
    seconds: float
    matrix: str = ""


__all__ = ["Blocker", "Candidate", "Fixed", "Options", "Recommendation", "Span", "Status", "UpgradePlan"]
