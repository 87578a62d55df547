"""Patch series per SGLang version: validate, check, apply, detect drift and obsolescence, port forward.

A patch set is a quilt-style folder ``patches/<set>/`` holding ``series`` (one patch file name per line, in
order) and ``NNNN-<name>.patch`` files: DEP-3 headers (Description, Origin, Forwarded, optionally
Applied-Upstream), then a git-format diff against the unpacked wheel tree (``a/sglang/srt/...``, applied
with -p1 at the wheel root). matrix.toml's ``[patches.<set>]`` gives the versions it applies to.

Every patch gets one status on a tree, decided in this order:

* ``target-missing`` -- a file it patches is not in the tree (where its functions went is named, if found);
* ``already-applied`` -- it reverse-applies and stackfarm applied it to this tree before (the tree's marker),
  or the tree holds it although the release predates the patch's Applied-Upstream version;
* ``upstreamed`` -- the release already holds the change: it reverse-applies on a pristine tree, or it only
  adds definitions (methods, classes, table keys) and upstream defines every one of them;
* ``applied`` -- ``git apply --check`` passed, and the patch was applied (on a dry run: to a scratch copy);
* ``drift`` -- a hunk's context is not in the file: the file, the hunk, the first differing line and the
  upstream lines around it are named.

``git apply`` never fuzzes: a hunk applies where its whole context matches, or not at all. The command line
(``python -m stackfarm.patches check|port|resolve``) previews upgrades and carries sets forward.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .artifacts import Cache, Target, find_artifact, list_versions
from .errors import ConfigError, StackfarmError, did_you_mean
from .matrix import Matrix, PatchSet, load
from .proc import Outcome, call

Status = Literal["applied", "already-applied", "upstreamed", "drift", "target-missing"]

#: The distribution whose unpacked wheel the patches are written against.
DISTRIBUTION = "sglang"
#: Written at a tree's root by apply_sets: which patches (by sha256) stackfarm applied there.
MARKER = ".stackfarm-patches.json"
#: DEP-3 fields every patch must carry (Applied-Upstream only once upstream has the change).
REQUIRED_HEADERS = ("Description", "Origin", "Forwarded")

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
_DIFF_GIT = re.compile(r"^diff --git (\S+) (\S+)$")
_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):\s?(.*)$")
_SERIES_LINE = re.compile(r"^(\S+)(?:\s+(-p\d))?\s*$")
# Git runs with no user or system configuration, so diff.noprefix, color.ui and the like change nothing.
_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}


# ----------------------------------------------------------------------------------------------------------
# The model: a patch parsed into files and hunks.


@dataclass(frozen=True, kw_only=True)
class Hunk:
    """One ``@@`` hunk: its header, where it sits in the patch file, and its body lines (prefix kept)."""

    header: str
    #: 1-based line of the ``@@`` header inside the patch file.
    line: int
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    #: The section heading git printed after the second ``@@`` (the enclosing top-level line), maybe empty.
    heading: str
    body: tuple[str, ...]

    @property
    def old_lines(self) -> list[str]:
        """The lines the hunk expects in the file: context and removed lines."""
        return [text[1:] for text in self.body if text[:1] in (" ", "-")]

    @property
    def new_lines(self) -> list[str]:
        """The lines the hunk leaves in the file: context and added lines."""
        return [text[1:] for text in self.body if text[:1] in (" ", "+")]

    @property
    def old_range(self) -> range:
        start = max(self.old_start, 1)
        return range(start, start + max(self.old_count, 1))


@dataclass(frozen=True, kw_only=True)
class FilePatch:
    """The part of a patch that changes one file, paths relative to the wheel root (``sglang/srt/...``)."""

    old_path: str | None  # None: the patch creates the file
    new_path: str | None  # None: the patch deletes the file
    line: int
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        path = self.old_path or self.new_path
        assert path is not None  # the parser refuses a file section without paths
        return path


@dataclass(frozen=True, kw_only=True)
class Patch:
    set: str
    name: str
    path: Path
    sha256: str
    headers: Mapping[str, str]
    files: tuple[FilePatch, ...]

    @property
    def description(self) -> str:
        text = self.headers.get("Description", self.headers.get("Subject", ""))
        return (text.splitlines() or [""])[0]

    @property
    def upstream_version(self) -> Version | None:
        """The first upstream version with the change, when the Applied-Upstream header starts with one."""
        value = self.headers.get("Applied-Upstream", "").strip()
        if not value:
            return None
        head = re.split(r"[\s,;]+", value, maxsplit=1)[0].removeprefix("v")
        try:
            return Version(head)
        except InvalidVersion:
            return None


@dataclass(frozen=True, kw_only=True)
class PatchResult:
    set: str
    patch: str
    sha256: str
    status: Status
    detail: str
    optional: bool

    @property
    def ok(self) -> bool:
        """Whether the cell's patch step may go on: the patch applied, or its set is optional."""
        return self.status == "applied" or self.optional


# ----------------------------------------------------------------------------------------------------------
# Reading and validating patch files.


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _error(path: Path, message: str, line: int | None = None, fix: str = "") -> ConfigError:
    return ConfigError(path, message, line=line, fix=fix)


def _clean_path(raw: str, prefix: str, patch: Path, line: int) -> str | None:
    """A diff path (``a/sglang/x.py``) made tree-relative, refusing anything that could leave the tree."""
    if raw == "/dev/null":
        return None
    if raw.startswith("/"):
        raise _error(patch, f"path `{raw}` is absolute", line, fix="patch files inside the wheel tree only")
    if not raw.startswith(prefix):
        raise _error(
            patch,
            f"path `{raw}` does not start with `{prefix}`",
            line,
            fix="write git-format paths relative to the wheel root: a/sglang/srt/... and b/sglang/srt/...",
        )
    rel = raw[len(prefix) :]
    pure = PurePosixPath(rel)
    if not rel or rel.startswith("/") or pure.is_absolute():
        raise _error(patch, f"path `{raw}` is absolute", line, fix="patch files inside the wheel tree only")
    if ".." in pure.parts or "." in pure.parts or "\\" in rel:
        raise _error(
            patch,
            f"path `{raw}` leaves the wheel tree (`..`)",
            line,
            fix="patch files inside the wheel tree only",
        )
    return str(pure)


def _parse_headers(text_lines: list[str], path: Path) -> dict[str, str]:
    """DEP-3 fields from the text before the first diff: ``Key: value`` with indented continuation lines."""
    headers: dict[str, str] = {}
    key: str | None = None
    for line in text_lines:
        if line.strip() in ("---", ""):
            if line.strip() == "---":
                break
            key = None
            continue
        if line[:1] in (" ", "\t") and key is not None:
            more = line.strip()
            headers[key] += "\n" + ("" if more == "." else more)  # DEP-3 (like Debian control): " ." is empty
            continue
        match = _FIELD.match(line)
        if match:
            key = match[1]
            headers[key] = match[2].strip()
        else:
            key = None
    missing = [
        name
        for name in REQUIRED_HEADERS
        if name not in headers and not (name == "Description" and "Subject" in headers)
    ]
    if missing:
        raise _error(
            path,
            f"DEP-3 header(s) missing: {', '.join(missing)}",
            1,
            fix="start it with Description:, Origin:, Forwarded: (Applied-Upstream: once upstream has it)",
        )
    return headers


def parse_patch(path: Path, set_name: str = "") -> Patch:
    """Read and validate one patch file; every defect raises ConfigError naming the file and line."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _error(path, "no such patch file", fix="create it or remove it from the series") from None
    if b"\r" in data:
        line = data[: data.index(b"\r")].count(b"\n") + 1
        raise _error(path, "CRLF line endings", line, fix="convert the patch to LF line endings (dos2unix)")
    if b"\0" in data:
        line = data[: data.index(b"\0")].count(b"\n") + 1
        raise _error(path, "binary content in the patch file", line, fix="patches must be text diffs")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise _error(path, "the patch is not UTF-8 text", line, fix="patches must be text diffs") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    first_diff = next((i for i, line in enumerate(lines) if line.startswith("diff --git ")), None)
    if first_diff is None:
        raise _error(
            path,
            "the patch is empty: it holds no `diff --git` section",
            fix="generate it with `git diff` (or `stackfarm.patches port`), or remove it from the series",
        )
    headers = _parse_headers(lines[:first_diff], path)
    files = _parse_files(lines, first_diff, path)
    return Patch(set=set_name, name=path.name, path=path, sha256=_sha256(data), headers=headers, files=files)


def _parse_files(lines: list[str], start: int, path: Path) -> tuple[FilePatch, ...]:
    files: list[FilePatch] = []
    i = start
    while i < len(lines):
        line = lines[i]
        match = _DIFF_GIT.match(line)
        if not match:
            if line.strip():
                raise _error(
                    path, f"unexpected line outside a diff: {line[:60]!r}", i + 1, fix="regenerate the patch"
                )
            i += 1
            continue
        file_patch, i = _parse_file(lines, i, path)
        files.append(file_patch)
    seen: dict[str, int] = {}
    for fp in files:
        if fp.path in seen:
            raise _error(
                path,
                f"{fp.path} appears twice in the patch",
                fp.line,
                fix="merge its hunks into one diff section",
            )
        seen[fp.path] = fp.line
    return tuple(files)


def _parse_file(lines: list[str], i: int, path: Path) -> tuple[FilePatch, int]:
    """One ``diff --git`` section starting at ``lines[i]``; returns it and the index after it."""
    header_line = i + 1
    match = _DIFF_GIT.match(lines[i])
    assert match is not None
    _clean_path(match[1], "a/", path, header_line)
    _clean_path(match[2], "b/", path, header_line)
    old: str | None = None
    new: str | None = None
    saw_minus = saw_plus = False
    i += 1
    while i < len(lines) and not lines[i].startswith("@@") and not lines[i].startswith("diff --git "):
        line = lines[i]
        if line.startswith("GIT binary patch") or line.startswith("Binary files "):
            raise _error(
                path, "binary patch", i + 1, fix="binary files cannot be patched; ship them another way"
            )
        if line.startswith(("new file mode 120000", "new mode 120000", "deleted file mode 120000")):
            raise _error(
                path, "the patch creates or changes a symlink", i + 1, fix="patch regular files only"
            )
        if line.startswith(("rename ", "copy ", "similarity index", "dissimilarity index")):
            raise _error(
                path, "renames and copies are not supported", i + 1, fix="express it as a delete and an add"
            )
        if line.startswith("--- "):
            old, saw_minus = _clean_path(line[4:].split("\t")[0], "a/", path, i + 1), True
        elif line.startswith("+++ "):
            new, saw_plus = _clean_path(line[4:].split("\t")[0], "b/", path, i + 1), True
        i += 1
    if not (saw_minus and saw_plus):
        raise _error(
            path,
            "a diff section without ---/+++ lines (a mode change or an empty diff)",
            header_line,
            fix="remove the section or regenerate the patch",
        )
    if old is None and new is None:
        raise _error(path, "both sides of a diff are /dev/null", header_line, fix="regenerate the patch")
    if old is not None and new is not None and old != new:
        raise _error(path, f"--- {old} and +++ {new} differ", header_line, fix="one diff section per file")
    hunks: list[Hunk] = []
    while i < len(lines) and lines[i].startswith("@@"):
        hunk, i = _parse_hunk(lines, i, path)
        hunks.append(hunk)
    if i < len(lines) and not lines[i].startswith("diff --git "):
        raise _error(
            path, f"unexpected line after the hunks: {lines[i][:60]!r}", i + 1, fix="regenerate the patch"
        )
    if not hunks:
        raise _error(
            path, "a diff section with no hunks", header_line, fix="remove it or regenerate the patch"
        )
    return FilePatch(old_path=old, new_path=new, line=header_line, hunks=tuple(hunks)), i


def _parse_hunk(lines: list[str], i: int, path: Path) -> tuple[Hunk, int]:
    match = _HUNK.match(lines[i])
    if not match:
        raise _error(path, f"malformed hunk header {lines[i]!r}", i + 1, fix="regenerate the patch")
    old_start, new_start = int(match[1]), int(match[3])
    old_count = int(match[2]) if match[2] is not None else 1
    new_count = int(match[4]) if match[4] is not None else 1
    start = i
    i += 1
    body: list[str] = []
    want_old, want_new = old_count, new_count
    while (want_old > 0 or want_new > 0) and i < len(lines):
        text = lines[i]
        kind = text[:1]
        if kind == " " or text == "":
            want_old, want_new = want_old - 1, want_new - 1
            text = text or " "  # some editors strip the space of an empty context line
        elif kind == "-":
            want_old -= 1
        elif kind == "+":
            want_new -= 1
        elif kind == "\\":
            body.append(text)
            i += 1
            continue
        else:
            break
        body.append(text)
        i += 1
    if want_old != 0 or want_new != 0:
        raise _error(
            path,
            f"hunk {lines[start]!r} is truncated or its line counts are wrong",
            start + 1,
            fix="regenerate the patch (hand edits must keep the @@ counts right)",
        )
    while i < len(lines) and lines[i].startswith("\\"):
        body.append(lines[i])
        i += 1
    if not any(text[:1] in "+-" for text in body):
        raise _error(path, f"hunk {lines[start]!r} changes nothing", start + 1, fix="remove the hunk")
    hunk = Hunk(
        header=lines[start],
        line=start + 1,
        old_start=old_start,
        old_count=old_count,
        new_start=new_start,
        new_count=new_count,
        heading=match[5],
        body=tuple(body),
    )
    return hunk, i


def read_series(ps: PatchSet) -> tuple[Path, ...]:
    """The patch files named by ``<set>/series``, in order; comments (#) and blank lines are skipped."""
    series = ps.path / "series"
    try:
        text = series.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _error(
            series, f"patch set `{ps.name}` has no series file", fix="list its patches in series"
        ) from None
    paths: list[Path] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _SERIES_LINE.match(line)
        if not match or (match[2] not in (None, "-p1")):
            raise _error(
                series, f"cannot read series entry {raw!r}", number, fix="one patch file name per line (-p1)"
            )
        name = match[1]
        if "/" in name or name in (".", ".."):
            raise _error(
                series, f"series entry `{name}` is not a file in {ps.path}", number, fix="name files only"
            )
        path = ps.path / name
        if not path.is_file():
            raise _error(
                series,
                f"series names `{name}`, which does not exist in {ps.path}",
                number,
                fix=f"create {path} or remove the line",
            )
        if path in paths:
            raise _error(series, f"series names `{name}` twice", number, fix="remove the repeat")
        paths.append(path)
    if not paths:
        raise _error(
            series, f"the series of `{ps.name}` lists no patch", fix="list its patches, one per line"
        )
    return tuple(paths)


def load_series(ps: PatchSet) -> tuple[Patch, ...]:
    """Every patch of a set, parsed and validated, in series order."""
    return tuple(parse_patch(path, ps.name) for path in read_series(ps))


def set_hash(ps: PatchSet) -> str:
    """sha256 over the series file and every patch it names (names and bytes), in series order."""
    digest = hashlib.sha256()
    digest.update(b"series\0" + (ps.path / "series").read_bytes() + b"\0")
    for path in read_series(ps):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def sets_for(sets: Sequence[PatchSet], version: str) -> tuple[PatchSet, ...]:
    """The sets whose applies_to holds ``version``, in matrix order (the order they are applied in)."""
    return tuple(ps for ps in sets if ps.applies_to.contains(version, prereleases=True))


def _candidate_versions(specs: Iterable[SpecifierSet]) -> list[str]:
    """Versions near every bound of the specifiers: enough to tell whether two ranges intersect."""
    out: set[str] = set()
    for spec in specs:
        for clause in spec:
            try:
                base = Version(clause.version.replace(".*", ""))
            except InvalidVersion:
                continue
            release = base.release
            bumped = (*release[:-1], release[-1] + 1)
            out.update(
                {
                    str(base),
                    f"{base.public}.post1",
                    ".".join(map(str, (*release, 1))),
                    ".".join(map(str, bumped)),
                }
            )
    return sorted(out, key=Version)


def _ranges_meet(a: SpecifierSet, b: SpecifierSet, versions: Sequence[str]) -> str | None:
    for version in (*versions, *_candidate_versions((a, b))):
        if a.contains(version, prereleases=True) and b.contains(version, prereleases=True):
            return version
    return None


def validate_sets(sets: Sequence[PatchSet], versions: Sequence[str] = ()) -> dict[str, tuple[Patch, ...]]:
    """Parse every set and refuse two sets that may apply to one version and touch the same hunk."""
    loaded = {ps.name: load_series(ps) for ps in sets}
    for i, first in enumerate(sets):
        for second in sets[i + 1 :]:
            version = _ranges_meet(first.applies_to, second.applies_to, versions)
            if version is None:
                continue
            _refuse_overlap(first, loaded[first.name], second, loaded[second.name], version)
    return loaded


def _hunks_of(patches: Sequence[Patch]) -> list[tuple[Patch, FilePatch, Hunk]]:
    return [(patch, fp, hunk) for patch in patches for fp in patch.files for hunk in fp.hunks]


def _refuse_overlap(
    first: PatchSet,
    first_patches: Sequence[Patch],
    second: PatchSet,
    second_patches: Sequence[Patch],
    version: str,
) -> None:
    for p, fp, hp in _hunks_of(first_patches):
        for q, fq, hq in _hunks_of(second_patches):
            common = range(
                max(hp.old_range.start, hq.old_range.start), min(hp.old_range.stop, hq.old_range.stop)
            )
            if fp.path != fq.path or not common:
                continue
            raise _error(
                q.path,
                f"sets `{first.name}` ({p.name}, `{hp.header}`) and `{second.name}` "
                f"({q.name}, `{hq.header}`) both touch {fp.path} lines {common.start}-{common.stop - 1}, "
                f"and both apply to sglang {version}",
                hq.line,
                fix="merge the two changes into one set, or make the sets' applies_to ranges disjoint",
            )


# ----------------------------------------------------------------------------------------------------------
# Running git.


def _git(args: Sequence[str | Path], cwd: Path) -> Outcome:
    # The ceiling keeps git from discovering a repository above the tree: paths stay relative to `cwd`.
    env = {**_GIT_ENV, "GIT_CEILING_DIRECTORIES": str(cwd.resolve().parent)}
    return call(["git", *args], cwd=cwd, env=env, timeout=120)


def _git_apply(patch: Path, root: Path, *, reverse: bool = False, check: bool = False) -> Outcome:
    args: list[str | Path] = ["apply", "-p1", "--whitespace=nowarn"]
    if reverse:
        args.append("--reverse")
    if check:
        args.append("--check")
    args.append(patch.resolve())
    return _git(args, root)


def make_patch(path: str, old: str, new: str, headers: Mapping[str, str] | None = None) -> str:
    """A git-format diff of one file (``a/<path>`` -> ``b/<path>``), with DEP-3 headers when given."""
    with tempfile.TemporaryDirectory(prefix="stackfarm-diff-") as tmp:
        root = Path(tmp)
        (root / "old" / path).parent.mkdir(parents=True)
        (root / "new" / path).parent.mkdir(parents=True)
        (root / "old" / path).write_text(old, encoding="utf-8")
        (root / "new" / path).write_text(new, encoding="utf-8")
        out = _git(
            [
                "diff",
                "--no-index",
                "--no-prefix",
                "--no-color",
                "--no-ext-diff",
                "-U3",
                f"old/{path}",
                f"new/{path}",
            ],
            root,
        )
    if out.returncode not in (0, 1):
        raise StackfarmError(f"git diff --no-index failed for {path}:\n{out.output}")
    body = _rewrite_diff(out.output, path)
    return (_format_headers(headers) if headers else "") + body


def _rewrite_diff(text: str, path: str) -> str:
    """git's --no-index output, renamed from old/ new/ to the a/ b/ wheel paths; the index line dropped."""
    out = []
    for line in text.splitlines():
        if line.startswith("index "):
            continue  # blob ids of scratch files mean nothing to a reader and git apply does not need them
        if line.startswith("diff --git "):
            out.append(f"diff --git a/{path} b/{path}")
        elif line.startswith("--- old/"):
            out.append(f"--- a/{path}")
        elif line.startswith("+++ new/"):
            out.append(f"+++ b/{path}")
        else:
            out.append(line)
    return "\n".join(out) + "\n" if out else ""


def _format_headers(headers: Mapping[str, str]) -> str:
    lines = []
    for key, value in headers.items():
        first, *rest = value.splitlines() or [""]
        lines.append(f"{key}: {first}".rstrip())
        lines.extend(f" {more}" if more.strip() else " ." for more in rest)
    return "\n".join(lines) + "\n---\n"


# ----------------------------------------------------------------------------------------------------------
# What a tree holds.


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


# ----------------------------------------------------------------------------------------------------------
# Drift: where a hunk's context stopped matching, in the words of the upstream file.


@dataclass(frozen=True, kw_only=True)
class Drift:
    path: str
    hunk: str
    patch_line: int
    expected: str | None  # the first line of the hunk that upstream does not have (None: upstream has more)
    found: str | None  # what upstream has there (None: the file ends)
    upstream_line: int  # 1-based line in the upstream file where they part
    around: tuple[tuple[int, str], ...]
    note: str = ""

    def describe(self) -> str:
        lines = [f"{self.path}: hunk `{self.hunk}` (patch line {self.patch_line}) does not match upstream"]
        if self.expected is not None:
            lines.append(f"  patch expects: {self.expected.strip()}")
        if self.found is not None:
            lines.append(f"  upstream has:  {self.found.strip()}  (line {self.upstream_line})")
        else:
            lines.append(f"  upstream has:  nothing more (line {self.upstream_line})")
        if self.note:
            lines.append(f"  {self.note}")
        lines.append("  upstream around it:")
        for number, text in self.around:
            mark = ">" if number == self.upstream_line else " "
            lines.append(f"  {mark}{number:6d} | {text}")
        return "\n".join(lines)


def _exact_at(needle: Sequence[str], hay: Sequence[str]) -> list[int]:
    if not needle:
        return []
    first = needle[0]
    return [
        p
        for p in range(len(hay) - len(needle) + 1)
        if hay[p] == first and list(hay[p : p + len(needle)]) == list(needle)
    ]


#: Extra upstream lines after a candidate position that a drifted hunk may still reach (lines inserted).
_SLACK = 3


def locate_drift(path: str, hunk: Hunk, upstream: Sequence[str], expected_at: int) -> Drift | None:
    """None when the hunk's old side is in ``upstream`` verbatim; else where and how it differs."""
    old = hunk.old_lines
    if _exact_at(old, upstream):
        return None
    # Every distinctive hunk line found upstream proposes where the hunk would start; the proposal whose
    # window shares the most lines with the hunk wins, the nearest to where git expected it on a tie.
    index: dict[str, list[int]] = {}
    for number, text in enumerate(upstream):
        index.setdefault(text.strip(), []).append(number)
    starts = {
        n - i for i, text in enumerate(old) if len(text.strip()) >= 4 for n in index.get(text.strip(), ())
    }
    note = "" if starts else "no line of this hunk occurs in the upstream file any more"
    starts.add(min(max(expected_at, 0), max(len(upstream) - 1, 0)))

    def fit(start: int) -> tuple[int, int, int]:
        window = upstream[max(start, 0) : max(start, 0) + len(old) + _SLACK]
        matcher = difflib.SequenceMatcher(None, old, window, autojunk=False)
        return sum(block.size for block in matcher.get_matching_blocks()), -abs(start - expected_at), start

    matched, _, start = max(fit(s) for s in starts)
    if matched <= 1 and len(old) > 2 and not note:
        note = "at most one line of this hunk is still together upstream: the code moved or was rewritten"
    lo = max(start, 0)
    window = list(upstream[lo : lo + len(old) + _SLACK])
    matcher = difflib.SequenceMatcher(None, old, window, autojunk=False)
    i_diff, j_diff = len(old), min(max(start - lo, 0) + len(old), len(window))
    for tag, i1, _i2, j1, _j2 in matcher.get_opcodes():
        # Window lines before the hunk's first line or after its last are not part of the comparison.
        if tag == "equal" or (tag == "insert" and i1 in (0, len(old))):
            continue
        i_diff, j_diff = i1, j1
        break
    expected = old[i_diff] if i_diff < len(old) else None
    upstream_index = lo + j_diff
    found = upstream[upstream_index] if upstream_index < len(upstream) else None
    if expected is not None and found is not None and expected.strip() == found.strip() and expected != found:
        note = note or "the lines differ only in whitespace"
    elif expected is not None and not note and len(expected.strip()) >= 4:
        elsewhere = [n + 1 for n in index.get(expected.strip(), []) if abs(n - upstream_index) > 0]
        if elsewhere:
            note = f"the expected line occurs upstream at line(s) {', '.join(map(str, elsewhere[:5]))}"
        else:
            note = "the expected line occurs nowhere upstream"
    first = max(upstream_index - 3, 0)
    around = tuple((n + 1, upstream[n]) for n in range(first, min(upstream_index + 4, len(upstream))))
    return Drift(
        path=path,
        hunk=hunk.header,
        patch_line=hunk.line + 1 + _body_offset(hunk, i_diff),
        expected=expected,
        found=found,
        upstream_line=upstream_index + 1,
        around=around,
        note=note,
    )


def _body_offset(hunk: Hunk, old_index: int) -> int:
    """The index in hunk.body of the ``old_index``-th old-side line (for pointing into the patch file)."""
    seen = -1
    for k, text in enumerate(hunk.body):
        if text[:1] in (" ", "-"):
            seen += 1
            if seen == old_index:
                return k
    return len(hunk.body)


# ----------------------------------------------------------------------------------------------------------
# Upstreamed: the definitions a patch adds, and whether a release defines them itself.

_DEF = re.compile(r"^(\s*)(?:async\s+)?(def|class)\s+([A-Za-z_]\w*)")
_ASSIGN = re.compile(r"^(\s*)([A-Za-z_]\w*)\s*(?::[^=]+)?=\s*[\[{(]\s*$")
_KEY = re.compile(r"^(\s*)(-?\d+|'[^']*'|\"[^\"]*\")\s*:")

#: One step of a path to a definition: ("class"|"def"|"assign"|"key", name or literal key).
Step = tuple[str, str]


def _definition(line: str) -> tuple[int, Step] | None:
    for pattern, kind in ((_DEF, ""), (_ASSIGN, "assign"), (_KEY, "key")):
        match = pattern.match(line)
        if match:
            if kind == "":
                return len(match[1]), (match[2], match[3])
            return len(match[1]), (kind, match[2])
    return None


def added_definitions(hunk: Hunk) -> tuple[tuple[Step, ...], ...] | None:
    """The definitions (paths like class/def, or assign/key for table entries) that the hunk adds.

    None when the hunk changes anything besides whole added definitions -- an edited condition, a removed
    line -- because then "the names exist upstream" says nothing about whether upstream made the change.
    Indentation gives the nesting (SGLang is black-formatted); the hunk heading seeds the outer scope.
    """
    stack: list[tuple[int, Step]] = []
    seed = _definition(hunk.heading) if hunk.heading else None
    if seed is not None and seed[0] == 0:
        stack.append(seed)
    added: list[tuple[Step, ...]] = []
    inside: int | None = None  # indentation of the added definition we are in
    pending_decorator = False
    for raw in hunk.body:
        kind, text = raw[:1], raw[1:]
        if kind == "\\":
            continue
        if kind == "-":
            if text.strip():
                return None
            continue
        indent = len(text) - len(text.lstrip())
        blank = not text.strip()
        if not blank:
            closing = text.strip()[:1] in ")]}"
            if inside is not None and (indent > inside or (indent == inside and closing)):
                if kind == "+":
                    continue
                inside = None  # a context line in the middle of an added block: the block ended
            elif inside is not None:
                inside = None
            while stack and stack[-1][0] >= indent and not (closing and stack[-1][0] == indent):
                stack.pop()
        definition = None if blank else _definition(text)
        if kind == "+":
            if blank or text.strip().startswith("#"):
                continue
            if text.strip().startswith("@"):
                pending_decorator = True
                continue
            if definition is None:
                return None
            added.append((*(step for _, step in stack), definition[1]))
            inside = definition[0]
            pending_decorator = False
            continue
        if pending_decorator:
            return None
        if definition is not None:
            stack.append(definition)
    return tuple(added) if added else None


def _find(nodes: Iterable[ast.AST], step: Step) -> ast.AST | None:
    kind, name = step
    for node in nodes:
        if kind == "class" and isinstance(node, ast.ClassDef) and node.name == name:
            return node
        if kind == "def" and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
        if kind == "assign":
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if kind == "key" and isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                with contextlib.suppress(ValueError, TypeError, SyntaxError):
                    if key is not None and ast.literal_eval(key) == ast.literal_eval(name):
                        return value
    return None


def _children(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Dict):
        return [node]
    body = getattr(node, "body", None)
    return list(body) if isinstance(body, list) else [node]


def defined_in(source: str, path: Sequence[Step]) -> int | None:
    """The line where ``source`` defines ``path`` (looking through nested scopes), or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    current: list[ast.AST] = list(tree.body)
    found: ast.AST | None = None
    for step in path:
        found = _find(current, step)
        if found is None:
            # The hunk heading names only the outermost scope: look one level deeper for the next step.
            for node in ast.walk(
                ast.Module(body=[n for n in current if isinstance(n, ast.stmt)], type_ignores=[])
            ):
                found = _find(_children(node), step) if node is not tree else None
                if found is not None:
                    break
        if found is None:
            return None
        current = _children(found)
    return getattr(found, "lineno", None)


def _name(path: Sequence[Step]) -> str:
    out = ""
    for kind, name in path:
        out += f"[{name}]" if kind == "key" else (f".{name}" if out else name)
    return out


def upstream_evidence(patch: Patch, tree: Path | Callable[[str], str | None]) -> str | None:
    """Why the release at ``tree`` already has this patch's change, or None when that cannot be shown.

    ``tree`` is an unpacked wheel, or a function from a tree-relative path to the file's text (or None).
    """
    read = tree if callable(tree) else functools.partial(_text_in, tree)
    found: list[str] = []
    for fp in patch.files:
        source = read(fp.path) if fp.old_path is not None and fp.path.endswith(".py") else None
        if source is None:
            return None
        for hunk in fp.hunks:
            paths = added_definitions(hunk)
            if paths is None:
                return None
            for path in paths:
                line = defined_in(source, path)
                if line is None:
                    return None
                found.append(f"{fp.path}:{line} {_name(path)}")
    return "upstream defines everything it adds: " + "; ".join(found) if found else None


# ----------------------------------------------------------------------------------------------------------
# Check and apply.


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
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:  # another file system, or links not allowed: a plain copy
            shutil.copy2(src, dst)

    shutil.copytree(source, dest, symlinks=True, copy_function=link)
    return apply_sets(sets, dest)


def failures(results: Iterable[PatchResult]) -> list[PatchResult]:
    return [r for r in results if not r.ok]


def failure_message(results: Sequence[PatchResult]) -> str:
    """A message for a failed patch step: every failing patch with its status and detail."""
    bad = failures(results)
    parts = [f"{len(bad)} patch(es) did not apply:"]
    for r in bad:
        detail = r.detail.replace("\n", "\n    ")
        parts.append(f"  {r.set}/{r.patch}: {r.status}\n    {detail}")
    parts.append(
        "  fix: port the set (python -m stackfarm.patches port SET --from OLD --to NEW), or narrow applies_to"
    )
    return "\n".join(parts)


def junit_properties(results: Iterable[PatchResult]) -> dict[str, str]:
    """``patch.<set>/<patch>.status`` and ``.sha256`` for each result: what the reports record."""
    props: dict[str, str] = {}
    for r in results:
        props[f"patch.{r.set}/{r.patch}.status"] = r.status
        props[f"patch.{r.set}/{r.patch}.sha256"] = r.sha256
    return props


# ----------------------------------------------------------------------------------------------------------
# Port: three-way merge of a series onto another upstream version.


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
    names = []
    for hunk in fp.hunks:
        removed = {t[1:].strip() for t in hunk.body if t[:1] == "-" and t[1:].strip()}
        added = {t[1:].strip() for t in hunk.body if t[:1] == "+" and t[1:].strip()}
        if removed & base_set or added & patched_set:
            names.append(hunk.header)
    return tuple(names) or tuple(h.header for h in fp.hunks)


def _merge_file(work: Path, current: str, base: str, other: str) -> tuple[str, int]:
    """``git merge-file --diff3``: base -> other merged into current; the text and the conflict count."""
    for name, text in (("current", current), ("base", base), ("other", other)):
        (work / name).write_text(text, encoding="utf-8")
    labels = ["-L", "new-upstream", "-L", "old-upstream", "-L", "patched"]
    out = _git(["merge-file", "-p", "--diff3", *labels, "current", "base", "other"], work)
    if out.returncode < 0 or out.returncode > 127:
        raise StackfarmError(f"git merge-file failed:\n{out.output}")
    return out.output, out.returncode


def _text_in(tree: Path, rel: str) -> str | None:
    path = tree / rel
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


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
    bases: dict[str, str] = {}
    for fp in patch.files:
        base = _read(old[0], fp.path, old[1])
        if base is None:
            raise StackfarmError(f"{patch.path}: {fp.path} is not in sglang {versions[0]}; is --from right?")
        bases[fp.path] = base
        old[1][fp.path] = _apply_text(patch, fp, base, work)
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
        for first, last, base_part, ours_part in _conflict_blocks(merged) if count else ():
            conflicts.append(
                Conflict(
                    patch=patch.name,
                    path=fp.path,
                    hunks=_hunks_for(fp, base_part, ours_part),
                    lines=(first, last),
                    reason=f"sglang {versions[1]} changed the lines this hunk changes",
                )
            )
        if not count:
            new[1][fp.path] = merged
            if merged == theirs:
                notes.append(f"{fp.path}: sglang {versions[1]} already has this change")
    status: Literal["ported", "upstreamed", "conflict"] = "ported"
    if conflicts:
        status = "conflict"
    elif all(merged == theirs for _, theirs, merged in files):
        status = "upstreamed"
    return PortedPatch(
        name=patch.name,
        status=status,
        headers=headers,
        files=tuple(files),
        conflicts=tuple(conflicts),
        notes=tuple(notes),
    )


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
        diffs = []
        for file in sorted(p for p in patch_dir.rglob("*") if p.is_file() and p.name != _HEADERS):
            rel = file.relative_to(patch_dir).as_posix()
            text = file.read_text(encoding="utf-8")
            for number, line in enumerate(text.splitlines(), 1):
                if line.startswith((_MARKERS[0], _MARKERS[1], _MARKERS[3])) or line == _MARKERS[2]:
                    raise ConfigError(
                        file, "a conflict marker is still there", line=number, fix="resolve the block"
                    )
            upstream = new_tree / rel
            if not upstream.is_file():
                raise ConfigError(
                    file, f"{rel} is not in the new release", fix="drop the file or move the change"
                )
            theirs = upstream.read_text(encoding="utf-8")
            if text != theirs:
                diffs.append(make_patch(rel, theirs, text))
        name = patch_dir.name
        if diffs:
            (folder / name).write_text(_format_headers(headers) + "".join(diffs), encoding="utf-8")
        series = [
            (name if diffs else f"# {name}  (retired: resolved to no change)")
            if _commented(line, name)
            else line
            for line in series
        ]
        shutil.rmtree(patch_dir)
        done.append(name)
    if conflicts.is_dir() and not any(conflicts.iterdir()):
        conflicts.rmdir()
    series_path.write_text("\n".join(series) + "\n", encoding="utf-8")
    return done


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
    verify = _verify(out, new_tree, to_version) if any(p.status == "ported" for p in ported) else []
    return PortResult(
        set=ps.name,
        from_version=from_version,
        to_version=to_version,
        patches=tuple(ported),
        out=out,
        verify=tuple(verify),
    )


def _verify(folder: Path, tree: Path, version: str) -> list[PatchResult]:
    return check_sets(
        [PatchSet(name=folder.name, applies_to=SpecifierSet(f"=={version}"), path=folder)], tree
    )


def _toml_key(name: str) -> str:
    """A set name as a TOML key: bare when it can be, quoted when it holds dots (``sm120-x-0.5.16``)."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def format_port(result: PortResult) -> str:
    lines = [f"port {result.set}: sglang {result.from_version} -> {result.to_version}"]
    for p in result.patches:
        lines.append(f"  {p.name}: {p.status}")
        lines.extend(f"    {note}" for note in p.notes)
        for c in p.conflicts:
            where = f"merged lines {c.lines[0]}-{c.lines[1]}" if c.lines != (0, 0) else "file gone"
            lines.append(f"    CONFLICT {c.path} ({where}): {c.reason}")
            lines.extend(f"      from hunk {h}" for h in c.hunks)
    if result.out is not None:
        count = sum(p.status == "ported" for p in result.patches)
        lines.append(f"wrote {result.out}/ (series and {count} patch(es))")
    lines.extend(f"  verify on sglang {result.to_version}: {r.patch} {r.status}" for r in result.verify)
    if result.conflicts and result.out is not None:
        lines.append(
            f"resolve: edit the files under {result.out}/{_CONFLICTS}/, then run\n"
            f"  python -m stackfarm.patches resolve {result.out} --to {result.to_version}"
        )
    elif result.out is not None and result.verify:
        lines.append(
            f"add to matrix.toml:\n  [patches.{_toml_key(result.out.name)}]\n"
            f'  applies_to = "sglang>={result.to_version}"'
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# The command line: check and port.


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
                    in_range=ps.applies_to.contains(version, prereleases=True),
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


def _resolve_trees(
    versions: Sequence[str], matrix: Matrix, max_mb: float, echo: Callable[[str], None]
) -> dict[str, Path]:
    """Unpacked sglang wheels for ``versions`` (fetched in that order); new downloads capped at ``max_mb``."""
    cache = Cache()
    target = Target(python=matrix.axes["python"][0], platform=matrix.platform)
    budget = max_mb * 1024 * 1024
    todo = []
    for version in versions:
        source = matrix.indexes[matrix.index_for(DISTRIBUTION, version)]
        artifact = find_artifact(source, DISTRIBUTION, version, target)
        cached = cache.blob_path(artifact).is_file() or (cache.root / "trees" / artifact.sha256).is_dir()
        cost = 0 if cached else (artifact.size or 0)
        if cost > budget:
            echo(f"skipping sglang {version}: {cost / 2**20:.0f} MB more would pass --max-mb {max_mb:.0f}")
            continue
        budget -= cost
        todo.append((version, artifact))
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(lambda item: (item[0], cache.unpack(item[1])), todo))


def _cmd_check(args: argparse.Namespace) -> int:

    matrix = load(args.matrix)
    sets = [ps for ps in matrix.patch_sets if not args.set or ps.name in args.set]
    if not sets:
        print(f"no patch sets in {args.matrix}", file=sys.stderr)
        return 0
    specs = [ps.applies_to for ps in sets]
    available = list_versions(matrix.indexes[matrix.index_for(DISTRIBUTION, "0")], DISTRIBUTION)
    versions = args.version or pick_versions(available, specs, args.newer, not args.no_newest)
    trees = _resolve_trees(
        download_order(versions, specs), matrix, args.max_mb, lambda text: print(text, file=sys.stderr)
    )
    rows = check_versions(sets, trees)
    print(json.dumps([asdict(r) for r in rows], indent=2) if args.json else format_table(rows))
    return 1 if any(r.in_range and not (r.status == "applied" or r.optional) for r in rows) else 0


def _set_named(matrix_path: Path, name: str) -> PatchSet:
    by_name = {ps.name: ps for ps in load(matrix_path).patch_sets}
    if name not in by_name:
        hint = did_you_mean(name, by_name)
        raise ConfigError(
            matrix_path,
            f"no patch set `{name}`" + (f"; {hint}" if hint else ""),
            fix=f"use one of {', '.join(by_name)}",
        )
    return by_name[name]


def _cmd_port(args: argparse.Namespace) -> int:
    ps = _set_named(args.matrix, args.set)
    trees = _resolve_trees([args.from_version, args.to_version], load(args.matrix), float("inf"), print)
    out = args.out or ps.path.parent / f"{ps.name}-{args.to_version}"
    result = port_set(
        ps,
        old_tree=trees[args.from_version],
        new_tree=trees[args.to_version],
        from_version=args.from_version,
        to_version=args.to_version,
        out=out,
        force=args.force,
    )
    print(format_port(result))
    return 1 if result.conflicts or any(not r.ok for r in result.verify) else 0


def _cmd_resolve(args: argparse.Namespace) -> int:
    tree = _resolve_trees([args.to_version], load(args.matrix), float("inf"), print)[args.to_version]
    for name in resolve_conflicts(args.folder, tree):
        print(f"resolved {name}")
    verify = _verify(args.folder, tree, args.to_version)
    for r in verify:
        print(f"  verify on sglang {args.to_version}: {r.patch} {r.status}")
        if not r.ok:
            print("    " + r.detail.replace("\n", "\n    "))
    return 0 if all(r.ok for r in verify) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stackfarm.patches", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--matrix", type=Path, default=Path("matrix.toml"), help="the matrix file (matrix.toml)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser(
        "check", help="status of every patch on the releases in and past each set's range"
    )
    p_check.add_argument("--json", action="store_true", help="one record per (set, patch, version)")
    p_check.add_argument("--set", action="append", help="only this set (repeatable)")
    p_check.add_argument("--version", action="append", help="only these sglang versions (repeatable)")
    p_check.add_argument("--newer", type=int, default=3, help="releases past each range to preview (3)")
    p_check.add_argument("--no-newest", action="store_true", help="do not add the newest release")
    p_check.add_argument("--max-mb", type=float, default=250.0, help="cap on new downloads, in MB (250)")
    p_port = sub.add_parser("port", help="carry a set to another sglang version by a three-way merge")
    p_port.add_argument("set")
    p_port.add_argument(
        "--from", dest="from_version", required=True, help="the version the set is written for"
    )
    p_port.add_argument("--to", dest="to_version", required=True, help="the version to port it to")
    p_port.add_argument("--out", type=Path, default=None, help="where the new set goes (patches/<set>-<to>/)")
    p_port.add_argument("--force", action="store_true", help="replace --out when it exists")
    p_resolve = sub.add_parser("resolve", help="turn the edited conflicts/ of a ported set into its patches")
    p_resolve.add_argument("folder", type=Path, help="the ported set (what port wrote)")
    p_resolve.add_argument("--to", dest="to_version", required=True, help="the version it was ported to")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        commands = {"check": _cmd_check, "port": _cmd_port, "resolve": _cmd_resolve}
        return commands[args.command](args)
    except StackfarmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(exc.exit_code)


__all__ = [
    "DISTRIBUTION",
    "MARKER",
    "REQUIRED_HEADERS",
    "CheckRow",
    "Conflict",
    "Drift",
    "FilePatch",
    "Hunk",
    "Patch",
    "PatchResult",
    "PortResult",
    "PortedPatch",
    "Status",
    "added_definitions",
    "apply_sets",
    "below_range",
    "check_sets",
    "check_versions",
    "defined_in",
    "download_order",
    "failure_message",
    "failures",
    "format_port",
    "format_table",
    "junit_properties",
    "load_series",
    "locate_drift",
    "main",
    "make_patch",
    "parse_patch",
    "patched_copy",
    "pick_versions",
    "port_series",
    "port_set",
    "read_series",
    "resolve_conflicts",
    "set_hash",
    "sets_for",
    "tree_version",
    "upstream_evidence",
    "validate_sets",
    "write_ported",
]

if __name__ == "__main__":
    sys.exit(main())
