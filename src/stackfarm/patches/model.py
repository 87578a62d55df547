"""The model of a patch set: patches parsed into files and hunks, DEP-3 headers, series files, validation.

A patch set is a quilt-style folder ``patches/<set>/`` holding ``series`` (one patch file name per line, in
order) and ``NNNN-<name>.patch`` files: DEP-3 headers (Description, Origin, Forwarded, optionally
Applied-Upstream), then a git-format diff against the unpacked wheel tree (``a/sglang/srt/...``, applied
with -p1 at the wheel root). Every defect of a file raises ConfigError naming the file and line.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from ..errors import ConfigError
from ..patchset import PatchSet

Status = Literal["applied", "already-applied", "upstreamed", "drift", "target-missing"]


def fine(status: str) -> bool:
    """The one patch rule, asked by the runner's patch step and by the report: a patch is fine only when it
    applied. An `upstreamed` or `already-applied` one means the set's applies_to still claims a change the
    release already holds (retire or narrow the set), so the step fails on it unless its set is optional."""
    return status == "applied"


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
#: Header lines of a diff section that stackfarm refuses: their prefixes, the message, the fix.
_UNSUPPORTED = (
    (
        ("GIT binary patch", "Binary files "),
        "binary patch",
        "binary files cannot be patched; ship them another way",
    ),
    (
        ("new file mode 120000", "new mode 120000", "deleted file mode 120000"),
        "the patch creates or changes a symlink",
        "patch regular files only",
    ),
    (
        ("rename ", "copy ", "similarity index", "dissimilarity index"),
        "renames and copies are not supported",
        "express it as a delete and an add",
    ),
)
#: What one hunk body line takes from the hunk's (old, new) line counts, by its first character; any other
#: line ends the body. "" is an empty context line (some editors strip its space).
_TAKES = {" ": (1, 1), "": (1, 1), "-": (1, 0), "+": (0, 1), "\\": (0, 0)}


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
        return fine(self.status) or self.optional


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
    missing = _missing_headers(headers)
    if missing:
        raise _error(
            path,
            f"DEP-3 header(s) missing: {', '.join(missing)}",
            1,
            fix="start it with Description:, Origin:, Forwarded: (Applied-Upstream: once upstream has it)",
        )
    return headers


def _missing_headers(headers: Mapping[str, str]) -> list[str]:
    """The required DEP-3 fields the headers lack (Subject stands in for Description)."""
    return [
        name
        for name in REQUIRED_HEADERS
        if name not in headers and not (name == "Description" and "Subject" in headers)
    ]


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
            fix="generate it with `git diff` (or `stackfarm patches port`), or remove it from the series",
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
    old, new, i = _file_paths(lines, i + 1, path, header_line)
    if old is None and new is None:
        raise _error(path, "both sides of a diff are /dev/null", header_line, fix="regenerate the patch")
    if old is not None and new is not None and old != new:
        raise _error(path, f"--- {old} and +++ {new} differ", header_line, fix="one diff section per file")
    hunks, i = _parse_hunks(lines, i, path, header_line)
    return FilePatch(old_path=old, new_path=new, line=header_line, hunks=hunks), i


def _file_paths(lines: list[str], i: int, path: Path, header_line: int) -> tuple[str | None, str | None, int]:
    """The ---/+++ paths of the header lines from ``lines[i]`` to the section's first hunk (None: /dev/null),
    and the index after them; a header line stackfarm cannot patch is refused."""
    old: str | None = None
    new: str | None = None
    saw_minus = saw_plus = False
    while i < len(lines) and not lines[i].startswith("@@") and not lines[i].startswith("diff --git "):
        line = lines[i]
        for prefixes, message, fix in _UNSUPPORTED:
            if line.startswith(prefixes):
                raise _error(path, message, i + 1, fix=fix)
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
    return old, new, i


def _parse_hunks(lines: list[str], i: int, path: Path, header_line: int) -> tuple[tuple[Hunk, ...], int]:
    """The hunks of a section from ``lines[i]``, and the index after them (the next section or the end)."""
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
    return tuple(hunks), i


def _parse_hunk(lines: list[str], i: int, path: Path) -> tuple[Hunk, int]:
    match = _HUNK.match(lines[i])
    if not match:
        raise _error(path, f"malformed hunk header {lines[i]!r}", i + 1, fix="regenerate the patch")
    old_start, new_start = int(match[1]), int(match[3])
    old_count = int(match[2]) if match[2] is not None else 1
    new_count = int(match[4]) if match[4] is not None else 1
    start = i
    body, i = _hunk_body(lines, i, (old_count, new_count), path)
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


def _hunk_body(lines: list[str], start: int, counts: tuple[int, int], path: Path) -> tuple[list[str], int]:
    """The body of the hunk whose header is ``lines[start]``, as many lines as its @@ (old, new) counts take
    (``\\ No newline`` notes included), and the index after it."""
    i = start + 1
    body: list[str] = []
    want_old, want_new = counts
    while (want_old > 0 or want_new > 0) and i < len(lines):
        takes = _TAKES.get(lines[i][:1])
        if takes is None:
            break
        want_old, want_new = want_old - takes[0], want_new - takes[1]
        body.append(lines[i] or " ")  # some editors strip the space of an empty context line
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
    return body, i


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
        path = _series_entry(ps, raw, line, number)
        if path in paths:
            raise _error(series, f"series names `{path.name}` twice", number, fix="remove the repeat")
        paths.append(path)
    if not paths:
        raise _error(
            series, f"the series of `{ps.name}` lists no patch", fix="list its patches, one per line"
        )
    return tuple(paths)


def _series_entry(ps: PatchSet, raw: str, line: str, number: int) -> Path:
    """The patch file one series line names (`line`: it without its comment), checked to be a file of the set."""
    series = ps.path / "series"
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
    return path


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
