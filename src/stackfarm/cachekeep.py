"""Keeping the artifact cache honest: read-only trees with a manifest, verify/repair, prune, use records, locks.

A tree in ``trees/`` is shared by every cell (and hard-linked into their patched copies), so it is made
read-only once unpacked: files 0444 (0555 when the wheel marks them executable), folders 0555. Its marker file
holds a manifest (every file's size and sha256) written while it was unpacked: ``verify`` re-hashes against it
(older trees: against the wheel's RECORD), and a cheap look (every file there, with its size) runs before a
process first hands a tree out. Removing a tree makes its folders writable again first.

Runs record what they used (``runs/<run_id>.json``); ``prune`` keeps what the last N runs used.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import errno
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from .errors import ArtifactError, EnvironmentProblem

if TYPE_CHECKING:  # imported when a lock is taken: suites inside a container import this module without it
    import filelock

#: The file that says a tree is whole; it holds the tree's manifest.
MARKER = ".stackfarm-complete"
#: What every message about a damaged cache tells the user to do.
REPAIR = "run `stackfarm cache verify --repair`, then run again (what was damaged is fetched anew)"
#: How long Cache.lock waits for another run before refusing (seconds).
LOCK_TIMEOUT = float(os.environ.get("STACKFARM_LOCK_TIMEOUT", "300"))
#: Entries changed this recently are never pruned: a run may be using them before it recorded them.
RECENT = 600.0
_CHUNK = 1 << 20
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_AREAS = ("blobs", "trees", "lazy", "cells", "tmp")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def damaged(what: str, detail: str) -> ArtifactError:
    """The error for a damaged cache entry found while fetching or unpacking: an environment error."""
    return ArtifactError(f"the cache is damaged: {what}: {detail}\n  fix: {REPAIR}")


# --------------------------------------------------------------------------- read-only trees


def make_read_only(tree: Path, *, top: bool = True) -> None:
    """Files 0444 (0555 if executable), folders 0555; the top folder too unless ``top`` is false."""
    for top_down, dirs, files in os.walk(tree):
        folder = Path(top_down)
        for name in files:
            path = folder / name
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode):
                path.chmod(0o555 if mode & 0o111 else 0o444)
        for name in dirs:
            if not (folder / name).is_symlink():
                (folder / name).chmod(0o555)
    if top:
        tree.chmod(0o555)


def remove_tree(path: Path) -> None:
    """Remove a (possibly read-only) tree or file; nothing there is fine."""
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    if not path.exists():
        return
    path.chmod(0o755)
    for top_down, dirs, _files in os.walk(path):
        folder = Path(top_down)
        for name in dirs:
            if not (folder / name).is_symlink():
                (folder / name).chmod(0o755)
    shutil.rmtree(path)


# --------------------------------------------------------------------------- unpacking and manifests


def extract_wheel(blob: Path, dest: Path, filename: str) -> dict[str, tuple[int, str]]:
    """Unpack a wheel into ``dest`` as an installer lays it out (stackfarm.wheelunpack); returns its manifest."""
    from . import wheelunpack  # imported here: suites inside a container import this module without installer

    return wheelunpack.extract_wheel(blob, dest, filename)


def manifest_text(filename: str, files: dict[str, tuple[int, str]]) -> str:
    """The marker's content: the wheel's file name and {path: [size, sha256]} of every file unpacked."""
    return json.dumps({"filename": filename, "files": {k: list(v) for k, v in sorted(files.items())}}) + "\n"


def read_manifest(tree: Path) -> dict[str, tuple[int, str]] | None:
    """The tree's manifest; None for a tree unpacked before manifests existed. Raises ValueError if unreadable."""
    text = (tree / MARKER).read_text(encoding="utf-8", errors="replace")
    if not text.lstrip().startswith("{"):
        return None  # the old marker: just the wheel's file name
    data = json.loads(text)
    files = data["files"] if isinstance(data, dict) else None
    if not isinstance(files, dict):
        raise ValueError("no files in the manifest")
    return {str(k): (int(v[0]), str(v[1])) for k, v in files.items()}


def quick_problem(tree: Path) -> str | None:
    """Why a marked tree is damaged by a cheap look (every manifest file there, with its size), else None."""
    try:
        manifest = read_manifest(tree)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        return f"its manifest ({MARKER}) is unreadable: {exc}"
    for rel, (size, _sha) in (manifest or {}).items():
        try:
            st = os.lstat(tree / rel)
        except OSError:
            return f"{rel} is missing"
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return f"{rel} changed ({st.st_size} bytes, the wheel has {size})"
    return None


def _record(tree: Path) -> dict[str, tuple[int, str]] | None:
    """{path: (size, sha256 hex)} from the wheel's RECORD (entries without a hash are left out)."""
    records = list(tree.glob("*.dist-info/RECORD"))
    if len(records) != 1:
        return None
    out: dict[str, tuple[int, str]] = {}
    text = records[0].read_text(encoding="utf-8", errors="replace")
    for parts in csv.reader(io.StringIO(text)):  # RECORD is CSV: a path with a comma is quoted
        if len(parts) != 3 or not parts[1].startswith("sha256="):
            continue
        raw = parts[1].removeprefix("sha256=")
        digest = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
        out[parts[0]] = (int(parts[2]) if parts[2].isdigit() else -1, digest)
    return out


def tree_problems(tree: Path) -> list[str]:
    """Everything wrong with a tree, hashing every file: missing, changed and (against a manifest) extra."""
    if not (tree / MARKER).is_file():
        return ["an unpack that never finished (no marker)"]
    try:
        manifest = read_manifest(tree)
        strict = manifest is not None
        expected = manifest if strict else _record(tree)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        return [f"its manifest ({MARKER}) is unreadable: {exc}"]
    if expected is None:
        return []  # an old tree of a wheel without a RECORD: nothing to check against
    problems = []
    for rel, (size, digest) in sorted(expected.items()):
        path = tree / rel
        if not path.is_file() or path.is_symlink():
            problems.append(f"{rel} is missing")
        elif (size >= 0 and path.stat().st_size != size) or sha256_file(path) != digest:
            problems.append(f"{rel} changed")
    if strict:
        for path in sorted(tree.rglob("*")):
            rel = path.relative_to(tree).as_posix()
            if path.is_dir() or rel == MARKER or "__pycache__" in PurePosixPath(rel).parts:
                continue
            if rel not in expected:
                problems.append(f"{rel} was added")
    return problems


# --------------------------------------------------------------------------- verify


@dataclass(frozen=True)
class Damage:
    path: Path
    problems: tuple[str, ...]


def verify(
    root: Path, *, repair: bool = False, progress: Callable[[str], None] | None = None
) -> list[Damage]:
    """Every blob against its sha256, every tree against its manifest, every index answer readable.
    ``repair`` removes what is damaged (the next run fetches or unpacks it again)."""
    found: list[Damage] = []
    blobs = root / "blobs" / "sha256"
    for blob in sorted(blobs.iterdir()) if blobs.is_dir() else ():
        if progress:
            progress(f"blob {blob.name}")
        name = blob.name.removesuffix(".whl")
        if not blob.is_file() or blob.is_symlink():
            found.append(Damage(blob, ("not a file",)))
        elif (actual := sha256_file(blob)) != name:
            found.append(Damage(blob, (f"its sha256 is {actual} ({blob.stat().st_size} bytes)",)))
    trees = root / "trees"
    for tree in sorted(trees.iterdir()) if trees.is_dir() else ():
        if progress:
            progress(f"tree {tree.name}")
        if not tree.is_dir() or tree.is_symlink():
            found.append(Damage(tree, ("not a folder",)))
        elif problems := tree_problems(tree):
            found.append(Damage(tree, tuple(problems)))
    answers = root / "resolved"
    for answer in sorted(answers.glob("*.json")) if answers.is_dir() else ():
        try:
            json.loads(answer.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            found.append(Damage(answer, (f"an unreadable index answer: {exc}",)))
    if repair:
        for entry in found:
            remove_tree(entry.path)
    return found


# --------------------------------------------------------------------------- use records and prune


def entry_of(root: Path, path: Path) -> str | None:
    """The cache entry (e.g. "trees/<sha>", "blobs/sha256/<sha>.whl") ``path`` is in, or None outside them."""
    try:
        parts = path.absolute().relative_to(root.absolute()).parts
    except ValueError:
        return None
    depth = 3 if parts[:1] == ("blobs",) else 2
    if len(parts) < depth or parts[0] not in _AREAS:
        return None
    return "/".join(parts[:depth])


def _run_file(root: Path, run_id: str) -> Path:
    safe = _SAFE.sub("_", run_id).strip("._") or "run"
    if safe != run_id:
        safe += "-" + hashlib.sha256(run_id.encode()).hexdigest()[:8]
    return root / "runs" / f"{safe}.json"


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold an flock on `path` (made if absent): it excludes threads and processes alike."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def record_use(root: Path, run_id: str, paths: Iterable[Path]) -> Path:
    """Add ``paths`` (blobs, trees, cell work dirs; anything inside them) to ``runs/<run_id>.json``."""
    target = _run_file(root, run_id)
    entries = {e for p in paths if (e := entry_of(root, Path(p))) is not None}
    with flocked(root / "locks" / f"run-{target.stem}.lock"):
        try:
            old = json.loads(target.read_text(encoding="utf-8"))
            started = float(old["time"])
            entries |= set(old["paths"])
        except (OSError, ValueError, KeyError, TypeError):
            started = time.time()
        tmp = target.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(
            json.dumps({"run_id": run_id, "time": started, "updated": time.time(), "paths": sorted(entries)}),
            encoding="utf-8",
        )
        tmp.replace(target)
    return target


def _runs(root: Path) -> list[tuple[float, Path, set[str]]]:
    """(started, file, entries) of every recorded run, newest first; unreadable records count as oldest."""
    out = []
    for path in (root / "runs").glob("*.json") if (root / "runs").is_dir() else ():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            out.append((float(data["time"]), path, {str(p) for p in data["paths"]}))
        except (OSError, ValueError, KeyError, TypeError):
            out.append((0.0, path, set()))
    return sorted(out, key=lambda r: r[0], reverse=True)


def _busy(root: Path, entry: Path) -> bool:
    """Whether a download or unpack holds this tmp/ entry right now (artifacts.Cache's per-sha locks)."""
    name = entry.name
    key = name.removesuffix(".part") if name.endswith(".part") else name.split(".unpack-")[0] + ".unpack"
    lock = root / "locks" / f"{key}.lock"
    if not lock.is_file():
        return False
    with open(lock, "ab") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return True
            raise
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


@dataclass(frozen=True)
class Pruned:
    removed: tuple[Path, ...]
    freed: int
    kept_runs: tuple[str, ...]
    note: str = ""


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def prune(root: Path, *, keep_runs: int, dry_run: bool = False) -> Pruned:
    """Remove the blobs, trees, lazy trees, cells and tmp/ entries none of the last ``keep_runs`` runs used."""
    runs = _runs(root)
    if not runs:
        return Pruned((), 0, (), note="no run has recorded what it used yet: nothing removed")
    kept, dropped = runs[:keep_runs], runs[keep_runs:]
    keep = set().union(*(entries for _t, _p, entries in kept))
    # A lazy tree (stackfarm.lazytree) stands for the wheel of the same sha256: runs record its blob and tree.
    keep |= {f"lazy/{Path(e).name.removesuffix('.whl')}" for e in keep if e.startswith(("blobs/", "trees/"))}
    now = time.time()
    doomed: list[Path] = []
    for area in _AREAS:
        folder = root / area / ("sha256" if area == "blobs" else "")
        for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
            if area == "tmp":  # a part or an unpack no lock covers is a crashed run's leftover
                if not _busy(root, entry):
                    doomed.append(entry)
            elif entry_of(root, entry) not in keep and now - entry.lstat().st_mtime > RECENT:
                doomed.append(entry)
    freed = 0
    for entry in doomed:
        freed += _size(entry)
        if not dry_run:
            remove_tree(entry)
    if not dry_run:
        for _t, path, _e in dropped:
            path.unlink(missing_ok=True)
    return Pruned(tuple(doomed), freed, tuple(p.stem for _t, p, _e in kept))


def forget_answers(root: Path, sha256: str) -> list[Path]:
    """Drop the remembered index answers (``resolved/*.json``) that name this sha256; returns them."""
    gone = []
    for answer in (root / "resolved").glob("*.json") if (root / "resolved").is_dir() else ():
        try:
            if sha256 in answer.read_text(encoding="utf-8", errors="replace"):
                answer.unlink(missing_ok=True)
                gone.append(answer)
        except OSError:
            continue
    return gone


# --------------------------------------------------------------------------- locks


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Locks:
    """Named inter-process locks under ``<cache>/locks/held/`` (filelock: flock, released when a process dies)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks: dict[Path, filelock.FileLock] = {}
        self._guard = threading.Lock()

    def path_for(self, name: str | os.PathLike[str]) -> Path:
        key = str(Path(name).absolute()) if isinstance(name, os.PathLike) else str(name)
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        tail = _SAFE.sub("_", Path(key).name or "root")[:60]
        return self.root / "locks" / "held" / f"{tail}-{digest}.lock"

    @contextlib.contextmanager
    def hold(
        self,
        name: str | os.PathLike[str],
        *,
        timeout: float | None = LOCK_TIMEOUT,
        notify: Callable[[str], None] | None = None,
    ) -> Iterator[Path]:
        import filelock

        path = self.path_for(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._guard:
            lock = self._locks.setdefault(path, filelock.FileLock(str(path)))
        what = str(name)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            if timeout == 0:
                raise self._refused(what, 0) from None
            wait = "" if timeout is None else f" (up to {timeout:g} s)"
            (notify or _stderr)(f"waiting for another stackfarm run holding {what}…{wait}")
            try:
                lock.acquire(timeout=-1 if timeout is None else timeout)
            except filelock.Timeout:
                raise self._refused(what, timeout or 0) from None
        try:
            yield path
        finally:
            lock.release()

    @staticmethod
    def _refused(what: str, timeout: float) -> EnvironmentProblem:
        return EnvironmentProblem(
            f"another stackfarm run holds {what}"
            + (f" for more than {timeout:g} s" if timeout else "")
            + "\n  fix: wait for it to finish, or give this run its own --reports folder or STACKFARM_CACHE"
        )


__all__ = [
    "LOCK_TIMEOUT",
    "MARKER",
    "REPAIR",
    "Damage",
    "Locks",
    "Pruned",
    "damaged",
    "entry_of",
    "forget_answers",
    "make_read_only",
    "manifest_text",
    "prune",
    "quick_problem",
    "read_manifest",
    "record_use",
    "remove_tree",
    "sha256_file",
    "tree_problems",
    "verify",
]
