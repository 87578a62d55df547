"""The status engine: check, apply, and patch a copy of an unpacked wheel tree.

Every patch gets one status on a tree, decided in this order:

* ``target-missing`` -- a file it patches is not in the tree (where its functions went is named, if found);
* ``already-applied`` -- it reverse-applies and stackfarm applied it to this tree before (the tree's marker),
  or the tree holds it although the release predates the patch's Applied-Upstream version;
* ``upstreamed`` -- the release already holds the change: it reverse-applies on a pristine tree, or it only
  adds definitions (methods, classes, table keys) and upstream defines every one of them;
* ``applied`` -- ``git apply --check`` passed, and the patch was applied (on a dry run: to a scratch copy);
* ``drift`` -- a hunk's context is not in the file: the file, the hunk, the first differing line and the
  upstream lines around it are named.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath

from packaging.version import Version

from ..cachekeep import remove_tree
from ..errors import StackfarmError
from ..patchset import PatchSet
from .drift import locate_drift
from .git import _git_apply
from .model import DISTRIBUTION, MARKER, FilePatch, Patch, PatchResult, Status, _error, validate_sets
from .upstream import _DEF, upstream_evidence


def tree_version(tree: Path, distribution: str = DISTRIBUTION) -> str | None:
    """The version of ``distribution`` unpacked at ``tree``, read from its dist-info folder."""
    prefix = distribution.replace("-", "_")
    for info in sorted(tree.glob(f"{prefix}-*.dist-info")):
        metadata = info / "METADATA"
        if metadata.is_file():
            for line in metadata.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line:
                    break
        return info.name[len(prefix) + 1 : -len(".dist-info")]
    return None


def _read_marker(tree: Path) -> dict[str, str]:
    try:
        data = json.loads((tree / MARKER).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_marker(tree: Path, applied: Mapping[str, str]) -> None:
    tmp = tree / f"{MARKER}.tmp"
    tmp.write_text(json.dumps(dict(applied), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(tree / MARKER)


def _target(tree: Path, patch: Patch, fp: FilePatch) -> Path:
    """The file a diff section touches; a path that leaves the tree through a symlink is refused."""
    target = tree / fp.path
    root = tree.resolve()
    probe = tree
    for part in PurePosixPath(fp.path).parts:
        probe = probe / part
        if probe.is_symlink():
            resolved = probe.resolve()
            where = "outside the tree" if not resolved.is_relative_to(root) else "inside the tree"
            raise _error(
                patch.path,
                f"{fp.path} reaches a symlink ({probe.relative_to(tree)} -> {probe.readlink()}, {where})",
                fp.line,
                fix="patch regular files of the unpacked wheel only; a patch must not follow symlinks",
            )
    return target


@contextlib.contextmanager
def _scratch(tree: Path, patches: Iterable[Patch]) -> Iterator[Path]:
    """A temporary copy of the files the patches touch, so a dry run sees each patch on top of the last."""
    with tempfile.TemporaryDirectory(prefix="stackfarm-patch-") as tmp:
        root = Path(tmp)
        for patch in patches:
            for fp in patch.files:
                source = _target(tree, patch, fp)
                if fp.old_path is not None and source.is_file() and not (root / fp.path).exists():
                    (root / fp.path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, root / fp.path)
        yield root


def _evaluate(
    patch: Patch, *, optional: bool, tree: Path, work: Path, marker: Mapping[str, str], write: bool
) -> PatchResult:
    """One patch on ``work``: the tree itself, or (``write`` false) a scratch copy of the files it touches."""

    def result(status: Status, detail: str) -> PatchResult:
        return PatchResult(
            set=patch.set,
            patch=patch.name,
            sha256=patch.sha256,
            status=status,
            detail=detail,
            optional=optional,
        )

    missing = [fp.path for fp in patch.files if fp.old_path is not None and not (work / fp.path).is_file()]
    if missing:
        moved = [hint for fp in patch.files if fp.path in missing for hint in _moved_hints(tree, fp)]
        return result("target-missing", "; ".join([f"not in the tree: {', '.join(missing)}", *moved]))
    version = tree_version(tree)
    since = patch.upstream_version
    # Presence first: an additive patch often applies a second time on top of itself (its added block ends
    # with the lines of its own context), so a passing forward check does not prove the change is absent.
    if _git_apply(patch.path, work, reverse=True, check=True).returncode == 0:
        if patch.sha256 in marker:
            return result("already-applied", "stackfarm applied it to this tree before")
        if since is not None and version is not None and Version(version) < since:
            return result(
                "already-applied",
                f"the tree already holds it (it reverse-applies), though upstream has it only from {since}",
            )
        return result(
            "upstreamed",
            _since_text(since, "the release holds the change verbatim (it reverse-applies)"),
        )
    # Upstream may define what the patch adds in its own words; applying ours would define it twice.
    evidence = upstream_evidence(patch, work)
    if evidence is not None:
        return result("upstreamed", _since_text(since, evidence))
    if _git_apply(patch.path, work, check=True).returncode == 0:
        # Applied to the scratch copy too, on a dry run: the next patch of the series builds on this one.
        done = _git_apply(patch.path, work)
        if done.returncode != 0:
            raise StackfarmError(f"git apply failed after its check passed for {patch.path}:\n{done.output}")
        return result("applied", "applied cleanly" if write else "applies cleanly")
    drift = _first_drift(patch, work)
    if since is not None and version is not None and Version(version) >= since:
        return result("upstreamed", _since_text(since, "per its Applied-Upstream header; " + drift))
    return result("drift", drift)


def _moved_hints(tree: Path, fp: FilePatch) -> list[str]:
    """Where the functions and classes named in a missing file's hunk headings are defined now."""
    wanted = {m[3]: m[2] for h in fp.hunks if (m := _DEF.match(h.heading)) and not m[1]}
    if not wanted:
        return []
    pattern = re.compile(
        r"^\s*(?:async\s+)?(def|class)\s+(" + "|".join(map(re.escape, wanted)) + r")\b", re.MULTILINE
    )
    hints = []
    for path in sorted((tree / DISTRIBUTION).rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if not any(f"{kind} {name}" in text for name, kind in wanted.items()):
            continue  # the cheap test first: the regex over every file of a release takes seconds
        for match in pattern.finditer(text):
            if wanted.get(match[2]) == match[1]:
                hints.append(f"{match[1]} {match[2]} is now in {path.relative_to(tree).as_posix()}")
    return hints


def _since_text(since: Version | None, why: str) -> str:
    return f"upstream from {since} (Applied-Upstream); {why}" if since is not None else why


def _first_drift(patch: Patch, work: Path) -> str:
    """The first hunk (in patch order) whose context upstream lacks, described; or git's own words."""
    for fp in patch.files:
        target = work / fp.path
        if fp.old_path is None:
            if target.exists():
                return f"{fp.path} should be created, but the tree has it already"
            continue
        upstream = target.read_text(encoding="utf-8", errors="replace").splitlines()
        offset = 0
        for hunk in fp.hunks:
            drift = locate_drift(fp.path, hunk, upstream, hunk.old_start - 1 + offset)
            if drift is not None:
                return drift.describe()
            offset += hunk.new_count - hunk.old_count
    out = _git_apply(patch.path, work, check=True)
    return "every hunk's context is present, yet git apply refuses it:\n" + out.output.strip()


def _run(sets: Sequence[PatchSet], tree: Path, write: bool) -> list[PatchResult]:
    if not tree.is_dir():
        raise StackfarmError(f"{tree} is not a directory (expected an unpacked {DISTRIBUTION} wheel)")
    version = tree_version(tree)
    loaded = validate_sets(sets, [version] if version else [])
    marker = _read_marker(tree)
    results: list[PatchResult] = []
    every = [patch for ps in sets for patch in loaded[ps.name]]
    for patch in every:  # refuse symlinks before anything is touched
        for fp in patch.files:
            _target(tree, patch, fp)
    with contextlib.ExitStack() as stack:
        work = tree if write else stack.enter_context(_scratch(tree, every))
        for ps in sets:
            for patch in loaded[ps.name]:
                res = _evaluate(patch, optional=ps.optional, tree=tree, work=work, marker=marker, write=write)
                results.append(res)
                if write and res.status == "applied":
                    marker = {**marker, patch.sha256: f"{ps.name}/{patch.name}"}
                    _write_marker(tree, marker)
                # Later patches of a set build on earlier ones: after a failure there is nothing to build on.
                if res.status in ("drift", "target-missing") or not res.ok:
                    break
    return results


def apply_sets(sets: Sequence[PatchSet], tree: Path) -> list[PatchResult]:
    """Apply the sets in order into ``tree`` (a writable copy of the unpacked wheel).

    Each patch is checked before it is applied (git apply is all-or-nothing per patch, and never fuzzes);
    a set stops at its first patch that drifts, misses its target, or is not ``ok``. Files are replaced,
    not written in place, so a tree of hard links to the cache is safe.
    """
    return _run(sets, tree, write=True)


def check_sets(sets: Sequence[PatchSet], tree: Path) -> list[PatchResult]:
    """The statuses apply_sets would give, computed on a scratch copy: ``tree`` is not written."""
    return _run(sets, tree, write=False)


def patched_copy(sets: Sequence[PatchSet], source: Path, dest: Path) -> list[PatchResult]:
    """Copy ``source`` (an unpacked wheel, e.g. in the cache) to ``dest`` and apply the sets there.

    The copy hard-links files where it can (the sglang tree has ~2000), which is safe because git apply
    replaces each file it patches instead of writing into it: the source tree is never modified.
    """
    if dest.exists():
        remove_tree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:  # another file system, or links not allowed: a plain copy
            shutil.copy2(src, dst)

    shutil.copytree(source, dest, symlinks=True, copy_function=link)
    # The cache's trees are read-only (folders 0555) and copytree copies folder modes: git apply must be able
    # to replace files in the copy. The hard-linked files stay 0444, so the cache's bytes stay untouched.
    for top, _dirs, _files in os.walk(dest):
        Path(top).chmod(0o755)
    return apply_sets(sets, dest)


def failures(results: Iterable[PatchResult]) -> list[PatchResult]:
    return [r for r in results if not r.ok]


__all__ = [
    "apply_sets",
    "check_sets",
    "failures",
    "patched_copy",
    "tree_version",
]
