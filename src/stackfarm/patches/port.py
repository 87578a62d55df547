"""Port: carry a patch set to another upstream version by a three-way merge, and resolve its conflicts.

``port_set`` merges every patch of a set onto the new release (``git merge-file --diff3``) and writes the new
set; a patch that conflicts leaves its merged files under ``conflicts/<patch>/`` for a person to edit, and
``resolve_conflicts`` turns the edited files into the patch.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.specifiers import SpecifierSet

from ..errors import ConfigError, StackfarmError
from ..patchset import PatchSet
from .git import _format_headers, _git, make_patch
from .model import FilePatch, Patch, PatchResult, _parse_headers, load_series
from .status import check_sets
from .upstream import _text_in, upstream_evidence


@dataclass(frozen=True, kw_only=True)
class Conflict:
    patch: str
    path: str
    #: The hunks of the old patch the conflict comes from.
    hunks: tuple[str, ...]
    #: First and last line of the conflict block in the merged file; (0, 0) when the file is gone upstream.
    lines: tuple[int, int]
    reason: str


@dataclass(frozen=True, kw_only=True)
class PortedPatch:
    name: str
    status: Literal["ported", "upstreamed", "conflict"]
    headers: Mapping[str, str]
    #: (path, new upstream text, merged text) per file; the merged text holds markers where it conflicts.
    files: tuple[tuple[str, str, str], ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        """The regenerated patch: its headers, then a diff of every file the merge changed."""
        diffs = [make_patch(path, theirs, merged) for path, theirs, merged in self.files if merged != theirs]
        return _format_headers(self.headers) + "".join(diffs)


@dataclass(frozen=True, kw_only=True)
class PortResult:
    set: str
    from_version: str
    to_version: str
    patches: tuple[PortedPatch, ...]
    out: Path | None = None
    verify: tuple[PatchResult, ...] = ()

    @property
    def conflicts(self) -> list[Conflict]:
        return [c for p in self.patches for c in p.conflicts]


_MARKERS = ("<<<<<<< ", "||||||| ", "=======", ">>>>>>> ")


def _conflict_blocks(merged: str) -> list[tuple[int, int, list[str], list[str]]]:
    """(first line, last line, old-upstream section, patched section) of each diff3 block, 1-based."""
    blocks = []
    lines = merged.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith(_MARKERS[0]):
            i += 1
            continue
        start, section = i, "current"
        sections: dict[str, list[str]] = {"current": [], "base": [], "other": []}
        i += 1
        while i < len(lines) and not lines[i].startswith(_MARKERS[3]):
            if lines[i].startswith(_MARKERS[1]):
                section = "base"
            elif lines[i] == _MARKERS[2]:
                section = "other"
            else:
                sections[section].append(lines[i])
            i += 1
        blocks.append((start + 1, i + 1, sections["base"], sections["other"]))
        i += 1
    return blocks


def _hunks_for(fp: FilePatch, base: Sequence[str], patched: Sequence[str]) -> tuple[str, ...]:
    """The hunks a conflict block comes from: those whose removed, added or context lines it holds."""
    base_set = {t.strip() for t in base if t.strip()}
    patched_set = {t.strip() for t in patched if t.strip()}
    names = [
        h.header for h in fp.hunks if _changed(h.body, "-") & base_set or _changed(h.body, "+") & patched_set
    ]
    return tuple(names) or tuple(h.header for h in fp.hunks)


def _changed(body: Sequence[str], sign: str) -> set[str]:
    """The stripped, non-blank lines of a hunk body that `sign` ("-" or "+") marks."""
    return {t[1:].strip() for t in body if t[:1] == sign and t[1:].strip()}


def _merge_file(work: Path, current: str, base: str, other: str) -> tuple[str, int]:
    """``git merge-file --diff3``: base -> other merged into current; the text and the conflict count."""
    for name, text in (("current", current), ("base", base), ("other", other)):
        (work / name).write_text(text, encoding="utf-8")
    labels = ["-L", "new-upstream", "-L", "old-upstream", "-L", "patched"]
    out = _git(["merge-file", "-p", "--diff3", *labels, "current", "base", "other"], work)
    if out.returncode < 0 or out.returncode > 127:
        raise StackfarmError(f"git merge-file failed:\n{out.output}")
    return out.output, out.returncode


def _read(tree: Path, rel: str, state: Mapping[str, str]) -> str | None:
    return state[rel] if rel in state else _text_in(tree, rel)


def _apply_text(patch: Patch, fp: FilePatch, text: str, work: Path) -> str:
    """``text`` with one file's part of ``patch`` applied, by git apply on a scratch copy."""
    scratch = work / "apply"
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / fp.path).parent.mkdir(parents=True)
    (scratch / fp.path).write_text(text, encoding="utf-8")
    out = _git(["apply", "-p1", "--whitespace=nowarn", f"--include={fp.path}", patch.path.resolve()], scratch)
    if out.returncode != 0:
        raise StackfarmError(f"{patch.path} does not apply to the old upstream {fp.path}:\n{out.output}")
    return (scratch / fp.path).read_text(encoding="utf-8")


def port_series(
    patches: Sequence[Patch], *, old_tree: Path, new_tree: Path, versions: tuple[str, str]
) -> list[PortedPatch]:
    """Carry each patch from ``old_tree`` to ``new_tree`` by a three-way merge, in series order.

    For patch i the merge base is the old upstream file with patches 1..i-1 applied; "patched" adds patch
    i to it; "new-upstream" is the new release's file with the ported patches 1..i-1. ``git merge-file``
    merges base -> patched into new-upstream: the new release plus our change, or conflict blocks.
    """
    old_state: dict[str, str] = {}
    new_state: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="stackfarm-port-") as tmp:
        return [
            _port_one(patch, (old_tree, old_state), (new_tree, new_state), Path(tmp), versions)
            for patch in patches
        ]


def _port_one(
    patch: Patch,
    old: tuple[Path, dict[str, str]],
    new: tuple[Path, dict[str, str]],
    work: Path,
    versions: tuple[str, str],
) -> PortedPatch:
    headers = {
        **patch.headers,
        "Stackfarm-Ported": f"from sglang {versions[0]} to {versions[1]} (three-way merge)",
    }
    bases = _bases(patch, old, work, versions[0])
    evidence = upstream_evidence(patch, lambda rel: _read(new[0], rel, new[1]))
    if evidence is not None:
        # Upstream wrote the same definitions its own way: merging ours would only conflict with them.
        return PortedPatch(name=patch.name, status="upstreamed", headers=headers, notes=(evidence,))
    files: list[tuple[str, str, str]] = []
    conflicts: list[Conflict] = []
    notes: list[str] = []
    for fp in patch.files:
        theirs = _read(new[0], fp.path, new[1])
        if theirs is None:
            reason = f"{fp.path} does not exist in sglang {versions[1]}"
            hunks = tuple(h.header for h in fp.hunks)
            conflicts.append(
                Conflict(patch=patch.name, path=fp.path, hunks=hunks, lines=(0, 0), reason=reason)
            )
            continue
        merged, count = _merge_file(work, theirs, bases[fp.path], old[1][fp.path])
        files.append((fp.path, theirs, merged))
        conflicts += _conflicts_in(patch, fp, merged, versions[1]) if count else []
        if not count:
            new[1][fp.path] = merged
            if merged == theirs:
                notes.append(f"{fp.path}: sglang {versions[1]} already has this change")
    return PortedPatch(
        name=patch.name,
        status=_port_status(conflicts, files),
        headers=headers,
        files=tuple(files),
        conflicts=tuple(conflicts),
        notes=tuple(notes),
    )


def _bases(patch: Patch, old: tuple[Path, dict[str, str]], work: Path, version: str) -> dict[str, str]:
    """Each file of the patch in the old release as the patches before it left it (the merge base); the
    patch applied to it goes into the old state ("patched")."""
    bases: dict[str, str] = {}
    for fp in patch.files:
        base = _read(old[0], fp.path, old[1])
        if base is None:
            raise StackfarmError(f"{patch.path}: {fp.path} is not in sglang {version}; is --from right?")
        bases[fp.path] = base
        old[1][fp.path] = _apply_text(patch, fp, base, work)
    return bases


def _port_status(
    conflicts: Sequence[Conflict], files: Sequence[tuple[str, str, str]]
) -> Literal["ported", "upstreamed", "conflict"]:
    """Conflicting, else upstreamed when every merged file is the new release's as it is, else ported."""
    if conflicts:
        return "conflict"
    if all(merged == theirs for _, theirs, merged in files):
        return "upstreamed"
    return "ported"


def _conflicts_in(patch: Patch, fp: FilePatch, merged: str, version: str) -> list[Conflict]:
    """One conflict per diff3 block of the merged file, with the hunks it comes from."""
    return [
        Conflict(
            patch=patch.name,
            path=fp.path,
            hunks=_hunks_for(fp, base_part, ours_part),
            lines=(first, last),
            reason=f"sglang {version} changed the lines this hunk changes",
        )
        for first, last, base_part, ours_part in _conflict_blocks(merged)
    ]


_CONFLICTS = "conflicts"
_HEADERS = "HEADERS"


def write_ported(result: Sequence[PortedPatch], out: Path, *, source: str, force: bool = False) -> None:
    """Write the new set: series and patch files; a conflicting patch leaves its merged files to resolve.

    A patch upstream already has is retired (commented out in series). A conflicting one is commented out
    too, and ``conflicts/<patch>/`` holds its DEP-3 headers and every file it touches as merged (conflict
    markers included): edit them, then ``resolve`` turns them into the patch.
    """
    if out.exists():
        if not force:
            raise ConfigError(out, "the output folder exists", fix="remove it, pass --force, or choose --out")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    lines = [f"# {source}"]
    for p in result:
        if p.status == "ported":
            (out / p.name).write_text(p.text(), encoding="utf-8")
            lines.append(p.name)
        elif p.status == "upstreamed":
            lines.append(f"# {p.name}  (retired: upstream has it)")
        else:
            lines.append(f"# {p.name}  (CONFLICT: edit {_CONFLICTS}/{p.name}/, then run resolve)")
            folder = out / _CONFLICTS / p.name
            folder.mkdir(parents=True)
            (folder / _HEADERS).write_text(_format_headers(p.headers), encoding="utf-8")
            for path, _theirs, merged in p.files:
                (folder / path).parent.mkdir(parents=True, exist_ok=True)
                (folder / path).write_text(merged, encoding="utf-8")
    (out / "series").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _headers_from(text: str, path: Path) -> dict[str, str]:
    return _parse_headers(text.split("\n"), path)


def resolve_conflicts(folder: Path, new_tree: Path) -> list[str]:
    """Turn every resolved ``conflicts/<patch>/`` of a ported set into its patch; returns the patch names.

    A file that still holds a conflict marker raises ConfigError naming its line.
    """
    done = []
    conflicts = folder / _CONFLICTS
    series_path = folder / "series"
    series = series_path.read_text(encoding="utf-8").splitlines()
    for patch_dir in sorted(p for p in conflicts.iterdir() if p.is_dir()) if conflicts.is_dir() else []:
        headers = _headers_from((patch_dir / _HEADERS).read_text(encoding="utf-8"), patch_dir / _HEADERS)
        if "Stackfarm-Ported" in headers:
            headers["Stackfarm-Ported"] += "; its conflicts resolved by hand"
        diffs = _resolved_diffs(patch_dir, new_tree)
        name = patch_dir.name
        if diffs:
            (folder / name).write_text(_format_headers(headers) + "".join(diffs), encoding="utf-8")
        series = _series_after(series, name, resolved=bool(diffs))
        shutil.rmtree(patch_dir)
        done.append(name)
    if conflicts.is_dir() and not any(conflicts.iterdir()):
        conflicts.rmdir()
    series_path.write_text("\n".join(series) + "\n", encoding="utf-8")
    return done


def _series_after(series: Sequence[str], name: str, *, resolved: bool) -> list[str]:
    """The series with the patch's commented-out line back on (`resolved`: it still changes something), or
    marked retired."""
    return [
        (name if resolved else f"# {name}  (retired: resolved to no change)")
        if _commented(line, name)
        else line
        for line in series
    ]


def _resolved_diffs(patch_dir: Path, new_tree: Path) -> list[str]:
    """The diff of every resolved file of one ``conflicts/<patch>/`` against the new release (none for a
    file left as upstream has it)."""
    diffs = []
    for file in sorted(p for p in patch_dir.rglob("*") if p.is_file() and p.name != _HEADERS):
        rel = file.relative_to(patch_dir).as_posix()
        text = file.read_text(encoding="utf-8")
        _no_marker_left(file, text)
        upstream = new_tree / rel
        if not upstream.is_file():
            raise ConfigError(
                file, f"{rel} is not in the new release", fix="drop the file or move the change"
            )
        theirs = upstream.read_text(encoding="utf-8")
        if text != theirs:
            diffs.append(make_patch(rel, theirs, text))
    return diffs


def _no_marker_left(file: Path, text: str) -> None:
    """Raise ConfigError at the first diff3 conflict marker line of `text`."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith((_MARKERS[0], _MARKERS[1], _MARKERS[3])) or line == _MARKERS[2]:
            raise ConfigError(file, "a conflict marker is still there", line=number, fix="resolve the block")


def _commented(line: str, name: str) -> bool:
    return line.startswith("#") and line.lstrip("# ").split(" ", 1)[0] == name


def port_set(
    ps: PatchSet,
    *,
    old_tree: Path,
    new_tree: Path,
    from_version: str,
    to_version: str,
    out: Path,
    force: bool = False,
) -> PortResult:
    """Port a whole set, write it under ``out``, and check that what was written applies to the new tree."""
    ported = port_series(
        load_series(ps), old_tree=old_tree, new_tree=new_tree, versions=(from_version, to_version)
    )
    write_ported(
        ported, out, source=f"{ps.name} ported from sglang {from_version} to {to_version}", force=force
    )
    verify = verify_ported(out, new_tree, to_version) if any(p.status == "ported" for p in ported) else []
    return PortResult(
        set=ps.name,
        from_version=from_version,
        to_version=to_version,
        patches=tuple(ported),
        out=out,
        verify=tuple(verify),
    )


def verify_ported(folder: Path, tree: Path, version: str) -> list[PatchResult]:
    """The statuses of a ported set's patches (the folder ``port`` wrote) on the release it was ported to."""
    return check_sets(
        [PatchSet(name=folder.name, applies_to=SpecifierSet(f"=={version}"), path=folder)], tree
    )


def _toml_key(name: str) -> str:
    """A set name as a TOML key: bare when it can be, quoted when it holds dots (``sm120-x-0.5.16``)."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def format_port(result: PortResult) -> str:
    lines = [f"port {result.set}: sglang {result.from_version} -> {result.to_version}"]
    for p in result.patches:
        lines += _ported_lines(p)
    if result.out is not None:
        count = sum(p.status == "ported" for p in result.patches)
        lines.append(f"wrote {result.out}/ (series and {count} patch(es))")
    lines.extend(f"  verify on sglang {result.to_version}: {r.patch} {r.status}" for r in result.verify)
    lines += _next_step(result)
    return "\n".join(lines)


def _ported_lines(p: PortedPatch) -> list[str]:
    """One patch of `format_port`: its status, notes and conflicts (each with the hunks it comes from)."""
    lines = [f"  {p.name}: {p.status}"]
    lines.extend(f"    {note}" for note in p.notes)
    for c in p.conflicts:
        where = f"merged lines {c.lines[0]}-{c.lines[1]}" if c.lines != (0, 0) else "file gone"
        lines.append(f"    CONFLICT {c.path} ({where}): {c.reason}")
        lines.extend(f"      from hunk {h}" for h in c.hunks)
    return lines


def _next_step(result: PortResult) -> list[str]:
    """What to do next: resolve the conflicts, or add the ported set to matrix.toml."""
    if result.conflicts and result.out is not None:
        return [
            f"resolve: edit the files under {result.out}/{_CONFLICTS}/, then run\n"
            f"  stackfarm patches resolve {result.out} --to {result.to_version}"
        ]
    if result.out is not None and result.verify:
        return [
            f"add to matrix.toml:\n  [patches.{_toml_key(result.out.name)}]\n"
            f'  applies_to = "sglang>={result.to_version}"'
        ]
    return []
