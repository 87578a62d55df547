"""Keeping the artifact cache honest: read-only trees with a manifest, verify/repair, prune, use records, locks.

A tree in ``trees/`` is shared by every cell (and hard-linked into their patched copies), so it is made
read-only once unpacked: files 0444 (0555 when the wheel marks them executable), folders 0555. Its marker file
holds a manifest (every file's size and sha256) written while it was unpacked: ``verify`` re-hashes against it
(older trees: against the wheel's RECORD), and a cheap look (every file there, with its size) runs before a
process first hands a tree out. Removing a tree makes its folders writable again first.

Runs record what they used (``runs/<run_id>.json``); ``prune`` keeps what the last N runs used. A run that is
still going holds a lease on its record (a shared flock on ``locks/leases/<run>.lease``, taken by its first
``record_use`` and held until its process exits or its Cache is closed): ``prune`` and ``verify --repair`` keep
everything a leased run recorded, whatever ``--keep-runs`` says, skip any entry whose lock a run holds (a work
dir being built, a download, an unpack), and say so. Both hold the cache's maintenance lock (exclusive) while
they decide and remove; ``record_use`` holds it shared, so a run that starts meanwhile waits for them to end.
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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING

from .errors import ArtifactError, EnvironmentProblem
from .files import sha256_file

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
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_AREAS = ("blobs", "trees", "lazy", "cells", "tmp")
#: The lock prune and verify --repair hold exclusively, and record_use shared (under ``locks/``).
MAINTENANCE = "maintenance.lock"


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
    for rel, want in sorted(expected.items()):
        if why := _file_problem(tree / rel, want):
            problems.append(f"{rel} {why}")
    return problems + (_added(tree, expected) if strict else [])


def _file_problem(path: Path, want: tuple[int, str]) -> str | None:
    """ "is missing" or "changed" (its size, when known (>= 0), or its sha256), or None when it is as listed."""
    size, digest = want
    if not path.is_file() or path.is_symlink():
        return "is missing"
    if (size >= 0 and path.stat().st_size != size) or sha256_file(path) != digest:
        return "changed"
    return None


def _added(tree: Path, expected: Mapping[str, object]) -> list[str]:
    """The files of the tree its manifest does not list (its marker and __pycache__ aside)."""
    problems = []
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
    #: Why ``repair`` left it in place ("of live run <id>", "whose lock a running stackfarm holds"); "" when
    #: it was removed (or when nothing was repaired).
    kept: str = ""


def verify(
    root: Path, *, repair: bool = False, progress: Callable[[str], None] | None = None
) -> list[Damage]:
    """Every blob against its sha256, every tree against its manifest, every index answer readable.
    ``repair`` removes what is damaged (the next run fetches or unpacks it again), except what a live run
    recorded or a run holds the lock of: those come back with ``kept`` saying why."""
    found = _damage(root, progress)
    if not repair or not found:
        return found
    out = []
    with flocked(root / "locks" / MAINTENANCE):  # a run starting now waits: nothing it records is removed
        live = _live_entries(root)
        for entry in found:
            rel = entry_of(root, entry.path) or _relative(root, entry.path)
            owner = next((run_id for run_id, used in live if rel in used), None)
            if owner is not None:
                out.append(replace(entry, kept=f"of live run {owner}"))
                continue
            with _holding(_locks_of(root, entry.path)) as free:
                if not free:
                    out.append(replace(entry, kept="whose lock a running stackfarm holds"))
                    continue
                remove_tree(entry.path)
            out.append(entry)
    return out


def _relative(root: Path, path: Path) -> str:
    try:
        return path.absolute().relative_to(root.absolute()).as_posix()
    except ValueError:
        return str(path)


def _damage(root: Path, progress: Callable[[str], None] | None) -> list[Damage]:
    return [*_blob_damage(root, progress), *_tree_damage(root, progress), *_answer_damage(root)]


def _blob_damage(root: Path, progress: Callable[[str], None] | None) -> list[Damage]:
    """Every blob that is not a file, or whose sha256 is not its name."""
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
    return found


def _tree_damage(root: Path, progress: Callable[[str], None] | None) -> list[Damage]:
    """Every tree that is not a folder, or has `tree_problems`."""
    found: list[Damage] = []
    trees = root / "trees"
    for tree in sorted(trees.iterdir()) if trees.is_dir() else ():
        if progress:
            progress(f"tree {tree.name}")
        if not tree.is_dir() or tree.is_symlink():
            found.append(Damage(tree, ("not a folder",)))
        elif problems := tree_problems(tree):
            found.append(Damage(tree, tuple(problems)))
    return found


def _answer_damage(root: Path) -> list[Damage]:
    """Every remembered index answer that cannot be read as JSON."""
    found: list[Damage] = []
    answers = root / "resolved"
    for answer in sorted(answers.glob("*.json")) if answers.is_dir() else ():
        try:
            json.loads(answer.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            found.append(Damage(answer, (f"an unreadable index answer: {exc}",)))
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
def flocked(path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold an flock on `path` (made if absent): it excludes threads and processes alike (``shared``: only
    those that want it exclusively)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:
        fcntl.flock(fh, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def lease_path(root: Path, run_id: str) -> Path:
    """The lease file of a run: a run holds a shared flock on it while it is going."""
    return root / "locks" / "leases" / f"{_run_file(root, run_id).stem}.lease"


def take_lease(root: Path, run_id: str) -> IO[bytes]:
    """Hold ``run_id``'s lease (a shared flock, so several processes of one run may hold it) for as long as the
    returned file stays open; closing it, or the process ending, gives it back. Not inherited by children that
    exec (Python opens files non-inheritable): a suite's pytest holds no lease of its own."""
    path = lease_path(root, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "ab")  # noqa: SIM115 - held open on purpose: the lease lasts as long as the file is open
    try:
        fcntl.flock(fh, fcntl.LOCK_SH)
    except BaseException:
        fh.close()
        raise
    return fh


def _held(path: Path) -> bool:
    """Whether another open file (of this or another process) holds an flock on ``path``; absent: no."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return False
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return True
            raise
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


@contextlib.contextmanager
def _holding(paths: Iterable[Path]) -> Iterator[bool]:
    """Hold every existing lock file of ``paths`` exclusively, without waiting; yields False (holding none)
    when a run holds one of them. A lock file that does not exist is held by nobody."""
    with contextlib.ExitStack() as stack:
        for path in paths:
            try:
                fh = stack.enter_context(open(path, "rb"))
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    yield False
                    return
                raise
            stack.callback(fcntl.flock, fh, fcntl.LOCK_UN)
        yield True


def _locks_of(root: Path, path: Path) -> list[Path]:
    """The lock files a run holds while it writes or uses ``path``: Cache.lock's (a cell's work dir), and the
    download / unpack / lazy-tree locks of a blob or tree."""
    found = [Locks(root).path_for(path)]
    name = path.name.removesuffix(".whl")
    area = entry_of(root, path) or ""
    if _SHA256.fullmatch(name):
        if area.startswith("blobs/"):
            found.append(root / "locks" / f"{name}.lock")
        elif area.startswith("trees/"):
            found.append(root / "locks" / f"{name}.unpack.lock")
        elif area.startswith("lazy/"):
            found.append(root / "locks" / f"{name}.lazy.lock")
    return found


def record_use(
    root: Path, run_id: str, paths: Iterable[Path], *, lease: Callable[[str], object] | None = None
) -> Path:
    """Add ``paths`` (blobs, trees, cell work dirs; anything inside them) to ``runs/<run_id>.json``.
    ``lease(run_id)`` is called first (Cache.record_use takes the run's lease there), under the maintenance
    lock: a prune or repair going on finishes before anything is recorded, and sees the run as live after."""
    target = _run_file(root, run_id)
    entries = {e for p in paths if (e := entry_of(root, Path(p))) is not None}
    with (
        flocked(root / "locks" / MAINTENANCE, shared=True),
        flocked(root / "locks" / f"run-{target.stem}.lock"),
    ):
        if lease is not None:
            lease(run_id)
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


@dataclass(frozen=True)
class _Run:
    started: float
    path: Path
    entries: set[str]
    run_id: str


def _runs(root: Path) -> list[_Run]:
    """Every recorded run, newest first; unreadable records count as oldest."""
    out = []
    for path in (root / "runs").glob("*.json") if (root / "runs").is_dir() else ():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            entries = {str(p) for p in data["paths"]}
            out.append(_Run(float(data["time"]), path, entries, str(data.get("run_id") or path.stem)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            out.append(_Run(0.0, path, set(), path.stem))
    return sorted(out, key=lambda r: r.started, reverse=True)


def _live(root: Path, run: _Run) -> bool:
    """Whether the run is still going: some process holds its lease."""
    return _held(root / "locks" / "leases" / f"{run.path.stem}.lease")


def _live_entries(root: Path) -> list[tuple[str, set[str]]]:
    """(run id, entries it recorded) of every live run, newest first."""
    return [(run.run_id, run.entries) for run in _runs(root) if _live(root, run)]


def _busy(root: Path, entry: Path) -> bool:
    """Whether a download or unpack holds this tmp/ entry right now (artifacts.Cache's per-sha locks)."""
    name = entry.name
    key = name.removesuffix(".part") if name.endswith(".part") else name.split(".unpack-")[0] + ".unpack"
    return _held(root / "locks" / f"{key}.lock")


@dataclass(frozen=True)
class Pruned:
    removed: tuple[Path, ...]
    freed: int
    kept_runs: tuple[str, ...]
    note: str = ""
    #: (run id, how many of its entries are in the cache) of every live run: all of them were kept.
    live: tuple[tuple[str, int], ...] = ()
    #: Entries that would have gone but a run holds their lock (a work dir being built, a download): kept.
    busy: tuple[Path, ...] = ()


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def prune(root: Path, *, keep_runs: int, dry_run: bool = False) -> Pruned:
    """Remove the blobs, trees, lazy trees, cells and tmp/ entries none of the last ``keep_runs`` runs used,
    nor any live run (one whose lease is held), nor any whose lock a run holds."""
    if not (root / "runs").is_dir() or not any((root / "runs").glob("*.json")):
        return Pruned((), 0, (), note="no run has recorded what it used yet: nothing removed")
    with flocked(root / "locks" / MAINTENANCE):  # a run starting now waits in record_use until this is done
        return _prune(root, keep_runs=keep_runs, dry_run=dry_run)


def _prune(root: Path, *, keep_runs: int, dry_run: bool) -> Pruned:
    runs = _runs(root)
    if not runs:
        return Pruned((), 0, (), note="no run has recorded what it used yet: nothing removed")
    kept, dropped = runs[:keep_runs], runs[keep_runs:]
    live = [run for run in runs if _live(root, run)]
    removed, busy, freed = _remove(root, _doomed(root, _kept_entries([*kept, *live])), dry_run=dry_run)
    if not dry_run:
        _forget_runs(root, [run for run in dropped if run not in live])
    return Pruned(
        tuple(removed),
        freed,
        tuple(run.path.stem for run in kept),
        live=_live_counts(root, live),
        busy=tuple(busy),
    )


def _live_counts(root: Path, live: Sequence[_Run]) -> tuple[tuple[str, int], ...]:
    """(run id, how many of its entries are in the cache now) of each live run."""
    present = {e for e in (entry_of(root, p) for p in _entries(root)) if e is not None}
    return tuple((run.run_id, len(run.entries & present)) for run in live)


def _kept_entries(runs: Sequence[_Run]) -> set[str]:
    """The entries the runs recorded, and the lazy tree of each wheel among them."""
    keep: set[str] = set().union(*(run.entries for run in runs))
    # A lazy tree (stackfarm.lazytree) stands for the wheel of the same sha256: runs record its blob and tree.
    keep |= {f"lazy/{Path(e).name.removesuffix('.whl')}" for e in keep if e.startswith(("blobs/", "trees/"))}
    return keep


def _doomed(root: Path, keep: set[str]) -> list[Path]:
    """The entries to remove: tmp/ leftovers no lock covers, and every other entry not in `keep` that was
    not touched within RECENT seconds."""
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
    return doomed


def _remove(root: Path, doomed: Sequence[Path], *, dry_run: bool) -> tuple[list[Path], list[Path], int]:
    """Remove each doomed entry whose locks are free (`dry_run`: only count it): (removed, busy, bytes freed)."""
    removed: list[Path] = []
    busy: list[Path] = []
    freed = 0
    for entry in doomed:
        # Its locks are held while it goes: a run that wants it meanwhile waits, then makes it again.
        locks = [] if entry.parent.name == "tmp" else _locks_of(root, entry)
        with _holding(locks) as free:
            if not free:
                busy.append(entry)
                continue
            freed += _size(entry)
            removed.append(entry)
            if not dry_run:
                remove_tree(entry)
    return removed, busy, freed


def _forget_runs(root: Path, runs: Sequence[_Run]) -> None:
    """Delete the use records (and lease files) of runs no longer kept."""
    for run in runs:
        run.path.unlink(missing_ok=True)
        (root / "locks" / "leases" / f"{run.path.stem}.lease").unlink(missing_ok=True)


def _entries(root: Path) -> Iterator[Path]:
    """Every entry of the areas a run records (what is there now)."""
    for area in _AREAS:
        folder = root / area / ("sha256" if area == "blobs" else "")
        if area != "tmp" and folder.is_dir():
            yield from folder.iterdir()


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
    "MAINTENANCE",
    "MARKER",
    "REPAIR",
    "Damage",
    "Locks",
    "Pruned",
    "damaged",
    "entry_of",
    "forget_answers",
    "lease_path",
    "make_read_only",
    "manifest_text",
    "prune",
    "quick_problem",
    "read_manifest",
    "record_use",
    "remove_tree",
    "sha256_file",
    "take_lease",
    "tree_problems",
    "verify",
]
