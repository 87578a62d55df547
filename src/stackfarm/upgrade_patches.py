"""The upgrade planner's patch look-ahead: every patch of every set on one release, and which sets it carries.

A *lineage* is one local change in its successive shapes: a set and its forward ports (``sm120-capability``
and ``sm120-capability-0.5.16``), told by a shared patch file name or a ``<set>-<version>`` name. For a release
the planner picks, per lineage, the member to apply:

1. the members whose ``applies_to`` holds the release (what a cell of it gets in the farm), else every member
   whose range starts at or below it, nearest first (a set carried past its range);
2. the first of them whose every patch applies there (``applied``; an optional set may fail).

Each lineage then gets one verdict on the release: ``carry`` (a member in range applies), ``widen`` (a member
applies outside its ``applies_to``: widen it), ``retire`` (upstream holds every patch of the nearest member),
``partial`` (some patches are upstream, the others apply: a set of the rest is needed) or ``port`` (it
drifts or misses its target: ``stackfarm patches port``). Statuses come from ``stackfarm.patches`` (the same
engine as ``stackfarm patches check``), patch by patch: a set's check stops at its first failing patch, so the
patches after an upstreamed one are checked on their own.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from packaging.version import InvalidVersion, Version

from .patches import check_sets, load_series
from .patchset import PatchSet

Verdict = Literal["carry", "widen", "retire", "partial", "port"]
_PORT_SUFFIX = re.compile(r"^(?P<base>.+)-\d+(?:\.\d+)+(?:\.?post\d+)?$")


@dataclass(frozen=True, kw_only=True)
class PatchStatus:
    """One patch of a set on one release's pristine tree."""

    set: str
    patch: str
    status: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class LineageChoice:
    """What the planner does with one lineage on one release."""

    lineage: str
    verdict: Verdict
    #: The member applied to the release ("" when none is).
    chosen: str
    #: The member the verdict is about (the chosen one, or the nearest one that failed).
    member: str
    in_range: bool
    statuses: tuple[PatchStatus, ...]
    #: The patches a partial member would keep (those that apply).
    keep: tuple[str, ...] = ()
    note: str = ""


def touched_files(ps: PatchSet) -> frozenset[str]:
    """The tree paths (``sglang/srt/...``) the set's patches change."""
    return frozenset(fp.path for patch in load_series(ps) for fp in patch.files)


def lineages(sets: Sequence[PatchSet]) -> dict[str, str]:
    """Set name -> its lineage's name (the oldest-named member): sets sharing a patch file name, or named
    ``<other>-<version>``, are one lineage."""
    parent = {ps.name: ps.name for ps in sets}

    def root(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    def join(a: str, b: str) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:
            first, second = sorted((ra, rb), key=lambda n: (len(n), n))
            parent[second] = first

    names = {ps.name for ps in sets}
    files: dict[str, str] = {}
    for ps in sets:
        match = _PORT_SUFFIX.match(ps.name)
        if match and match["base"] in names:
            join(ps.name, match["base"])
        for patch in sorted(p.name for p in ps.path.glob("*.patch")):
            if patch in files:
                join(ps.name, files[patch])
            files.setdefault(patch, ps.name)
    return {ps.name: root(ps.name) for ps in sets}


def _lower_bound(ps: PatchSet) -> Version:
    lows = []
    for clause in ps.applies_to:
        if clause.operator in (">=", ">", "==", "~=", "==="):
            try:
                lows.append(Version(clause.version.replace(".*", "")))
            except InvalidVersion:
                continue
    return max(lows) if lows else Version("0")


def statuses(ps: PatchSet, tree: Path) -> tuple[PatchStatus, ...]:
    """Every patch of `ps` on `tree` (not written): the set checked in order, and where its check stopped at
    an upstreamed patch, the patches after it checked as a set of their own."""
    every = [p.name for p in load_series(ps)]
    found: dict[str, PatchStatus] = {}
    todo = list(every)
    while todo:
        folder = None if todo == every else Path(tempfile.mkdtemp(prefix="stackfarm-upgrade-set-"))
        try:
            part = ps if folder is None else trimmed(ps, todo, folder)
            results = check_sets([part], tree)
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        for res in results:
            found[res.patch] = PatchStatus(set=ps.name, patch=res.patch, status=res.status, detail=res.detail)
        rest = todo[len(results) :]
        if not results or results[-1].status != "upstreamed" or not rest:
            for name in rest:
                found[name] = PatchStatus(
                    set=ps.name,
                    patch=name,
                    status="not-tried",
                    detail="not checked: an earlier patch of the set failed",
                )
            break
        todo = rest
    return tuple(found[name] for name in every)


def trimmed(ps: PatchSet, keep: Sequence[str], folder: Path) -> PatchSet:
    """A copy of `ps` holding only the patches `keep`, under `folder/<name>` (for a partial lineage)."""
    path = folder / ps.name
    path.mkdir(parents=True, exist_ok=True)
    for name in keep:
        shutil.copyfile(ps.path / name, path / name)
    (path / "series").write_text("".join(f"{n}\n" for n in keep), encoding="utf-8")
    return replace(ps, path=path)


def _applies(found: Iterable[PatchStatus], optional: bool) -> bool:
    found = list(found)
    return bool(found) and (optional or all(s.status == "applied" for s in found))


def _choose(
    lineage: str, members: Sequence[PatchSet], version: str, found: Mapping[str, tuple[PatchStatus, ...]]
) -> LineageChoice | None:
    """The lineage's choice on `version`, or None when no member is meant for it or older releases."""
    in_range = [ps for ps in members if ps.applies(version)]
    below = sorted(
        (ps for ps in members if _lower_bound(ps) <= Version(version)), key=_lower_bound, reverse=True
    )
    candidates = in_range or below
    if not candidates:
        return None
    for ps in candidates:
        if _applies(found[ps.name], ps.optional):
            verdict: Verdict = "carry" if ps in in_range else "widen"
            note = "" if verdict == "carry" else f"applies outside its applies_to ({ps.applies_to}): widen it"
            return LineageChoice(
                lineage=lineage,
                verdict=verdict,
                chosen=ps.name,
                member=ps.name,
                in_range=ps in in_range,
                statuses=found[ps.name],
                note=note,
            )
    nearest = candidates[0]
    have = found[nearest.name]
    kinds = {s.status for s in have}
    base = LineageChoice(
        lineage=lineage,
        verdict="port",
        chosen="",
        member=nearest.name,
        in_range=nearest in in_range,
        statuses=have,
    )
    if kinds <= {"upstreamed", "already-applied"}:
        return replace(base, verdict="retire", note="upstream holds every patch of it")
    if kinds <= {"upstreamed", "already-applied", "applied"}:
        keep = tuple(s.patch for s in have if s.status == "applied")
        note = f"upstream holds {', '.join(s.patch for s in have if s.status != 'applied')}; carry the rest"
        return replace(base, verdict="partial", keep=keep, note=note)
    bad = next(s for s in have if s.status not in ("applied", "upstreamed", "already-applied"))
    note = (
        f"{bad.patch}: {bad.status}; port it (stackfarm patches port {nearest.name} --from V --to {version})"
    )
    return replace(base, note=note)


def choose(
    sets: Sequence[PatchSet],
    version: str,
    start: str,
    found: Mapping[str, tuple[PatchStatus, ...]],
) -> tuple[LineageChoice, ...]:
    """Per lineage that the start release carries or that has a member meant for `version`: its choice."""
    of = lineages(sets)
    out = []
    for lineage in dict.fromkeys(of.values()):
        members = [ps for ps in sets if of[ps.name] == lineage]
        carried = any(ps.applies(start) for ps in members)
        meant = any(ps.applies(version) for ps in members)
        if not (carried or meant):
            continue
        picked = _choose(lineage, members, version, found)
        if picked is not None:
            out.append(picked)
    return tuple(out)


__all__ = [
    "LineageChoice",
    "PatchStatus",
    "Verdict",
    "choose",
    "lineages",
    "statuses",
    "touched_files",
    "trimmed",
]
