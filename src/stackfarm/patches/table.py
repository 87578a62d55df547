"""The check table: every patch of every set on a row of SGLang releases, in and past each set's range.

``pick_versions`` chooses the releases, ``check_versions`` computes the statuses on their unpacked trees, and
``format_table`` prints patches down and versions across, then why each failing patch fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..patchset import PatchSet
from .model import Status, validate_sets
from .status import check_sets


@dataclass(frozen=True, kw_only=True)
class CheckRow:
    set: str
    patch: str
    sha256: str
    version: str
    in_range: bool
    status: Status
    detail: str
    optional: bool
    since: str | None = None


_SHORT = {
    "applied": "applies",
    "already-applied": "already",
    "upstreamed": "upstream",
    "drift": "DRIFT",
    "target-missing": "MISSING",
}


def pick_versions(
    available: Sequence[str], specs: Sequence[SpecifierSet], newer: int, include_newest: bool
) -> list[str]:
    """Final releases in any range, the next ``newer`` releases past each range, and the newest one."""
    finals = sorted(
        (v for v in available if not Version(v).is_prerelease and not Version(v).is_devrelease), key=Version
    )
    picked: set[str] = set()
    for spec in specs:
        inside = [v for v in finals if spec.contains(v)]
        picked.update(inside)
        if inside:
            after = [v for v in finals if Version(v) > Version(inside[-1]) and Version(v).post is None]
        else:
            lows = [Version(c.version) for c in spec if c.operator in (">=", ">", "==", "~=")]
            low = max(lows) if lows else Version("0")
            after = [v for v in finals if Version(v) >= low and Version(v).post is None]
        picked.update(after[:newer])
    releases = [v for v in finals if Version(v).post is None]
    if include_newest and releases:
        picked.add(releases[-1])
    return sorted(picked, key=Version)


def _since(rows: Sequence[CheckRow]) -> dict[tuple[str, str], str]:
    """Per patch: the first checked version from which every later checked version says upstreamed."""
    out: dict[tuple[str, str], str] = {}
    by_patch: dict[tuple[str, str], list[CheckRow]] = {}
    for row in rows:
        by_patch.setdefault((row.set, row.patch), []).append(row)
    for key, group in by_patch.items():
        since = None
        for row in sorted(group, key=lambda r: Version(r.version)):
            since = (since or row.version) if row.status == "upstreamed" else None
        if since is not None:
            out[key] = since
    return out


def below_range(spec: SpecifierSet, version: str) -> bool:
    """Whether ``version`` is older than every version ``spec`` holds (a set is never checked there)."""
    v = Version(version)
    for clause in spec:
        bound = Version(clause.version.replace(".*", ""))
        if clause.operator in (">=", "~=", "==") and v < bound:
            return True
        if clause.operator == ">" and v <= bound:
            return True
    return False


def check_versions(sets: Sequence[PatchSet], trees: Mapping[str, Path]) -> list[CheckRow]:
    """The status of every patch of every set on every tree (version -> unpacked wheel) not below its range.

    Versions past a set's range preview an upgrade: they are checked, marked ``in_range=False``.
    """
    rows: list[CheckRow] = []
    validate_sets(sets, list(trees))
    for ps in sets:
        for version in sorted(trees, key=Version):
            if below_range(ps.applies_to, version):
                continue
            rows.extend(
                CheckRow(
                    set=ps.name,
                    patch=res.patch,
                    sha256=res.sha256,
                    version=version,
                    in_range=ps.applies(version),
                    status=res.status,
                    detail=res.detail,
                    optional=res.optional,
                )
                for res in check_sets([ps], trees[version])
            )
    since = _since(rows)
    return [CheckRow(**{**asdict(r), "since": since.get((r.set, r.patch))}) for r in rows]


def _table_cells(
    rows: Sequence[CheckRow],
) -> tuple[list[tuple[str, str]], list[str], dict[tuple[str, str], list[str]]]:
    """Patches in order, versions in order, and each patch's cell text per version."""
    versions = sorted({r.version for r in rows}, key=Version)
    patches = list(dict.fromkeys((r.set, r.patch) for r in rows))
    cell = {(r.set, r.patch, r.version): r for r in rows}
    tried = {(r.set, r.version) for r in rows}
    texts: dict[tuple[str, str], list[str]] = {}
    for s, p in patches:
        line = []
        for v in versions:
            found = cell.get((s, p, v))
            if found is None:
                line.append("-" if (s, v) in tried else ".")
            else:
                line.append(_SHORT[found.status] + ("" if found.in_range else "*"))
        texts[(s, p)] = line
    return patches, versions, texts


def format_table(rows: Sequence[CheckRow]) -> str:
    """Patches down, versions across (neighbouring versions with the same column share one), then details.

    ``*`` marks a version past the set's applies_to (a preview of an upgrade).
    """
    if not rows:
        return "no release was checked (none in or past the sets' ranges, or --max-mb skipped them all)"
    patches, versions, texts = _table_cells(rows)
    groups: list[tuple[int, int]] = []  # runs of versions whose whole column is the same
    for i in range(len(versions)):
        if groups and all(texts[key][i] == texts[key][groups[-1][0]] for key in patches):
            groups[-1] = (groups[-1][0], i)
        else:
            groups.append((i, i))
    heads = [versions[a] if a == b else f"{versions[a]}..{versions[b]}" for a, b in groups]
    widths = [max(9, len(h) + 2) for h in heads]
    name_w = max(len(f"{s}/{p}") for s, p in patches)
    head = f"{'set/patch':<{name_w}}  " + "".join(f"{h:<{w}}" for h, w in zip(heads, widths, strict=True))
    out = [head.rstrip(), "-" * len(head.rstrip())]
    for key in patches:
        cells = "".join(f"{texts[key][a]:<{w}}" for (a, _), w in zip(groups, widths, strict=True))
        out.append(f"{f'{key[0]}/{key[1]}':<{name_w}}  {cells}".rstrip())
    out.append("")
    out.append(
        "applies = git apply --check passes; upstream = the release has the change; * = past applies_to"
    )
    out.append(
        ". = older than the set's range (not checked); - = not tried: an earlier patch of the set failed"
    )
    for (s, p), v in {(r.set, r.patch): r.since for r in rows if r.since}.items():
        out.append(f"{s}/{p}: upstreamed from {v} on")
    seen: set[tuple[str, str]] = set()
    for r in rows:
        if r.status in ("drift", "target-missing") and (r.set, r.patch) not in seen:
            seen.add((r.set, r.patch))
            detail = r.detail.replace("\n", "\n    ")
            out.append(f"\n{r.set}/{r.patch} first fails on sglang {r.version} ({r.status}):\n    {detail}")
    return "\n".join(out)


def download_order(versions: Sequence[str], specs: Sequence[SpecifierSet]) -> list[str]:
    """The order to fetch in, so a download cap drops the least telling versions: the newest release and
    both ends of every range first, then the rest, oldest first."""
    ordered = sorted(versions, key=Version)
    first = ordered[-1:]
    for spec in specs:
        inside = [v for v in ordered if spec.contains(v, prereleases=True)]
        first += inside[:1] + inside[-1:]
    return list(dict.fromkeys([*first, *ordered]))


__all__ = [
    "CheckRow",
    "below_range",
    "check_versions",
    "download_order",
    "format_table",
    "pick_versions",
]
