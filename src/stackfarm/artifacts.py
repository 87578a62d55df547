"""Find wheels on an index or on disk, and keep them in a content-addressed cache.

The cache never holds a partial file: downloads land in ``tmp/`` and are renamed into
``blobs/`` only once their sha256 matches; unpacked trees appear in ``trees/`` the same way, read-only and
with a manifest (stackfarm.cachekeep). Every request goes through stackfarm.httpclient: its retries, bounded per
index (stackfarm.indexwait), its credentials and its errors (no secret in them).
"""

from __future__ import annotations

import bisect
import contextlib
import email.message
import email.policy
import errno
import functools
import hashlib
import http.client
import os
import re
import threading
import urllib.error
import urllib.request
import weakref
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from email.parser import BytesParser
from pathlib import Path, PurePosixPath
from typing import IO, Protocol, TypeVar
from urllib.parse import urlparse

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from stackfarm import cachekeep, httpclient, indexauth, indexwait, lazyzip, proc
from stackfarm.errors import ArtifactError, IndexUnreachableError, did_you_mean
from stackfarm.files import sha256_file, write_bytes_atomic
from stackfarm.listing import File, parse_listing
from stackfarm.requires import INSTALLED_EXTRAS, requires_dist
from stackfarm.wheelsource import Source  # the matrix declares its sources too: see stackfarm.wheelsource

#: Pauses between attempts on network errors; tests shrink them.
RETRY_DELAYS: tuple[float, ...] = (0.5, 1.0, 2.0)


def _sleep(seconds: float) -> None:
    """Wait between retries, but not past a stop (Ctrl-C / SIGTERM)."""
    if proc.STOP.wait(seconds):
        raise proc.Stopped("index retries stopped: the run is stopping")


_CHUNK = 1 << 20
_HINT = "check the index URL in matrix.toml [indexes] or your network"
_USER_AGENT = "stackfarm/0.1"
# Prefer PEP 691 JSON but accept the PEP 503 HTML page from servers that only have that.
_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
_MARKER = cachekeep.MARKER
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_(\w+)")
_LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
_T = TypeVar("_T")
_Progress = Callable[[int, int | None], None] | None


@dataclass(frozen=True, kw_only=True)
class Target:
    """Which wheels fit: python "3.11" and a manylinux platform tag like "manylinux_2_39_x86_64"."""

    python: str
    platform: str


@dataclass(frozen=True, kw_only=True)
class Artifact:
    """One wheel file, pinned by its sha256."""

    distribution: str
    version: str
    filename: str
    url: str
    sha256: str
    size: int | None
    source: str
    #: The sha256 of its PEP 658 ``<url>.metadata`` file, where the index serves one with a hash.
    metadata_sha256: str | None = None


@dataclass(frozen=True)
class _Wheel:
    file: File
    version: Version
    tags: frozenset[Tag]


def _index() -> httpclient.Client:
    """The index's client (stackfarm.httpclient): retries within the index's budget, pausing RETRY_DELAYS."""
    return httpclient.Client(role="index", hint=_HINT, delays=RETRY_DELAYS, sleep=_sleep)


def _retrying(url: str, attempt: Callable[[float], _T]) -> _T:
    """Run ``attempt(timeout)`` through the index's client (its retries, budget and errors)."""
    return _index().call(url, attempt)


_LISTINGS: dict[tuple[str, str], tuple[File, ...]] = {}
_LISTINGS_LOCK = threading.Lock()


class _Unreadable(http.client.HTTPException):
    """An index page that does not parse (cut short, a proxy's error page): retried like silence."""


def _index_files(index: str, name: str, fresh: bool = False) -> tuple[File, ...]:
    """The files of one project on a simple index, listed once per process (``fresh``: listed again)."""
    key = (index.rstrip("/"), name)
    with _LISTINGS_LOCK:
        if fresh:
            _LISTINGS.pop(key, None)
        elif key in _LISTINGS:
            return _LISTINGS[key]
    page = f"{key[0]}/{name}/"

    def get(timeout: float) -> tuple[File, ...]:
        headers = {"Accept": _ACCEPT, "User-Agent": _USER_AGENT}
        try:
            with httpclient.send(page, headers, timeout=timeout) as resp:
                where, ctype, body = resp.geturl(), resp.headers.get_content_type(), resp.read()
        except httpclient.HttpStatusError as exc:
            if exc.code == 404:  # an unknown project simply has no versions
                return ()
            raise
        try:
            return parse_listing(where, ctype, body)
        except (ValueError, AttributeError, KeyError, TypeError) as exc:
            raise _Unreadable(f"unreadable answer ({ctype}, {len(body)} bytes: {exc})") from exc

    try:
        files = _retrying(page, get)
    except httpclient.HttpStatusError as exc:
        raise _http_error(page, exc, hint=_HINT) from exc
    with _LISTINGS_LOCK:
        _LISTINGS[key] = files
    return files


#: What an index's 401 / 403 / 407 answer means (the first word of the error; `plan` shows it per cell).
REFUSED = {401: "unauthorized", 403: "forbidden", 407: "proxy authentication required"}


def _http_error(url: str, exc: urllib.error.HTTPError, *, hint: str = "") -> ArtifactError:
    """The error of an index's HTTP answer: credentials or a proxy in the way are the environment (exit 4),
    named as such with the index (never its credentials) and how to give it credentials; any other answer
    is the artifact's."""
    shown = indexauth.redact(url)
    text = f"{shown} answered {httpclient.answer_text(exc)}"
    if exc.code not in REFUSED:
        return ArtifactError(text + (f"\n  hint: {hint}" if hint else ""))
    host = urlparse(shown).hostname or "HOST"
    sent = indexauth.credentials(url) is not None
    if sent:
        fix = (
            f"correct the credentials for {host}: those written into the index URL in matrix.toml [indexes], "
            f"else the `machine {host}` line of ~/.netrc (or of the file $NETRC names), else the keyring's"
        )
    else:
        fix = (
            f"put `machine {host} login USER password TOKEN` in ~/.netrc (or the file $NETRC names; mode 600), "
            "or write them into the index URL in matrix.toml [indexes]"
        )
    if exc.code == 403:
        fix += "; a 403 means these credentials may not read it: check the token's scope"
    elif exc.code == 407:
        fix = "give the proxy's credentials in HTTPS_PROXY / HTTP_PROXY (http://user:token@proxy:port)"
    return IndexUnreachableError(
        f"{REFUSED[exc.code]}: {text} (index {indexwait.index_of(url)}; "
        f"{'credentials were sent and refused' if sent else 'no credentials were sent'})\n  fix: {fix}"
    )


def _local_file(path: Path) -> File:
    return File(
        filename=path.name, url=path.resolve().as_uri(), sha256="", size=path.stat().st_size, path=path
    )


def _files(source: Source, name: str, fresh: bool = False) -> tuple[File, ...]:
    if source.url is not None:
        return _index_files(source.url, name, fresh)
    if source.find_links is not None:
        if not source.find_links.is_dir():
            raise ArtifactError(f"source {source.name}: find_links folder {source.find_links} does not exist")
        return tuple(_local_file(p) for p in sorted(source.find_links.glob("*.whl")))
    assert source.wheel is not None  # Source.__post_init__ guarantees one is set
    if not source.wheel.is_file():
        raise ArtifactError(f"source {source.name}: wheel {source.wheel} does not exist")
    return (_local_file(source.wheel),)


def _where(source: Source) -> str:
    return str(source.url or source.find_links or source.wheel)


def _wheels(source: Source, name: str, fresh: bool = False) -> list[_Wheel]:
    """Usable wheels of ``name``: sdists, yanked files and unparsable names are left out."""
    out = []
    for f in _files(source, name, fresh):
        if f.yanked or not f.filename.endswith(".whl"):
            continue
        try:
            wheel_name, version, _build, tags = parse_wheel_filename(f.filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if wheel_name == name:
            out.append(_Wheel(file=f, version=version, tags=tags))
    return out


def list_versions(source: Source, distribution: str) -> list[str]:
    """Versions of ``distribution`` with at least one usable wheel, oldest first."""
    return [str(v) for v in sorted({w.version for w in _wheels(source, canonicalize_name(distribution))})]


def _platforms(platform: str) -> list[str]:
    """Every platform tag a manylinux target accepts, best first (newest glibc first)."""
    m = _MANYLINUX.fullmatch(platform)
    if not m or m[1] != "2":
        return [platform]
    arch = m[3]
    plats = []
    for minor in range(int(m[2]), 4, -1):
        plats.append(f"manylinux_2_{minor}_{arch}")
        if minor in _LEGACY:
            plats.append(f"{_LEGACY[minor]}_{arch}")
    return plats


@functools.lru_cache(maxsize=64)
def _tag_ranks(target: Target) -> dict[Tag, int]:
    try:
        major, minor = Version(target.python).release[:2]
    except (InvalidVersion, ValueError) as exc:
        raise ArtifactError(f"target python {target.python!r} is not like '3.11'") from exc
    plats = _platforms(target.platform)
    tags = [
        *cpython_tags(python_version=(major, minor), platforms=plats),
        *compatible_tags(python_version=(major, minor), interpreter=f"cp{major}{minor}", platforms=plats),
    ]
    ranks: dict[Tag, int] = {}
    for i, tag in enumerate(tags):
        ranks.setdefault(tag, i)
    return ranks


def _missing(name: str, version: str, want: Version, wheels: list[_Wheel], where: str) -> str:
    versions = sorted({w.version for w in wheels})
    text = f"{name} {version} is not on {where}"
    if not versions:
        return f"{text}: it has no wheels of {name} at all"
    i = bisect.bisect_left(versions, want)
    start = max(0, min(i - 2, len(versions) - 5))
    near = ", ".join(str(v) for v in reversed(versions[start : start + 5]))
    text += f"\n  versions nearby (newest first): {near}"
    # The local label (after '+') must match exactly, so name the variants that differ only there.
    same_public = [str(v) for v in versions if v.public == want.public]
    if same_public:
        return (
            text
            + f"\n  only these differ from it just by the +label, which must match: {', '.join(same_public)}"
        )
    hint = did_you_mean(version, [str(v) for v in versions])
    return text + (f"\n  {hint}" if hint else "")


def find_artifact(
    source: Source, distribution: str, version: str, target: Target, *, fresh: bool = False
) -> Artifact:
    """The best wheel of ``distribution==version`` for ``target`` (``fresh``: not from this process's listing)."""
    name = canonicalize_name(distribution)
    try:
        want = Version(version)
    except InvalidVersion as exc:
        raise ArtifactError(f"{name}: {version!r} is not a valid version") from exc
    wheels = _wheels(source, name, fresh)
    same = [w for w in wheels if w.version == want]
    if not same:
        raise ArtifactError(_missing(name, version, want, wheels, _where(source)))
    ranks = _tag_ranks(target)
    scored = [
        (min(ranks[t] for t in w.tags if t in ranks), w.file.filename, w)
        for w in same
        if any(t in ranks for t in w.tags)
    ]
    if not scored:
        listed = "\n    ".join(sorted(w.file.filename for w in same))
        raise ArtifactError(
            f"{name} {version} is on {_where(source)} but no wheel fits python {target.python} "
            f"on {target.platform}; its wheels are:\n    {listed}"
        )
    best = min(scored, key=lambda s: (s[0], s[1]))[2]
    sha = _sha256_file(best.file.path) if best.file.path is not None else best.file.sha256
    if not sha:
        raise ArtifactError(f"{_where(source)} gives no sha256 for {best.file.filename}; cannot verify it")
    return Artifact(
        distribution=name,
        version=str(best.version),
        filename=best.file.filename,
        url=best.file.url,
        sha256=sha,
        size=best.file.size,
        source=source.name,
        metadata_sha256=best.file.metadata_sha256 or None,  # one served without a hash cannot be verified
    )


_sha256_file = sha256_file


class ShaMismatchError(ArtifactError):
    """A download's bytes do not hash to the sha256 its index gave (Resolver.fetch asks the index again)."""

    def __init__(self, message: str, *, artifact: Artifact, actual: str) -> None:
        super().__init__(message)
        self.artifact = artifact
        self.actual = actual


def _is_metadata(name: str) -> bool:
    parts = PurePosixPath(name).parts
    return len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "METADATA"


_BAD_ZIP = (zipfile.BadZipFile, EOFError, zlib.error)


class TreeBuilder(Protocol):
    """What makes a wheel's lazy tree in a cache root (stackfarm.lazytree.lazy_tree): the tree and what it built."""

    def __call__(
        self, root: Path, sha256: str, url: str, size: int | None, filename: str, **kw: object
    ) -> tuple[Path, object]: ...


class Cache:
    """Content-addressed store of wheels (``blobs/``) and their unpacked, read-only trees (``trees/``)."""

    root: Path

    def __init__(self, root: Path | None = None) -> None:
        if root is None:
            env = os.environ.get("STACKFARM_CACHE")
            root = Path(env) if env else Path.home() / ".cache" / "stackfarm"
        self.root = root.expanduser()
        # Blobs hashed in this process, by (size, mtime): re-hashing a 900 MB torch wheel on every
        # fetch/unpack/metadata call would cost seconds, while any rewrite changes the stat.
        self._verified: dict[Path, tuple[int, int]] = {}
        self._metadata: dict[str, email.message.Message] = {}
        self._trees_ok: set[Path] = set()  # trees whose files were all seen once in this process
        self._locks = cachekeep.Locks(self.root)
        # The leases of the runs this Cache recorded (cachekeep.take_lease), held until close() or until the
        # Cache is collected; a process that ends gives them back too.
        self._leases: dict[str, IO[bytes]] = {}
        self._leases_guard = threading.Lock()
        self._release = weakref.finalize(self, _close_leases, self._leases, self._leases_guard)

    #: The cache's folders and what each holds (`stackfarm cache info` lists them in this order).
    AREAS = (
        ("blobs", "wheels, by sha256"),
        ("trees", "unpacked wheels, by sha256 (read-only)"),
        ("lazy", "lazy trees: what the static suites read of a wheel, by sha256"),
        ("cells", "per-cell work dirs (patched trees, cell.json)"),
        ("resolved", "index answers"),
        ("metadata", "PEP 658 METADATA files, by wheel sha256"),
        ("analysis", "analysis results, by file hash"),
        ("runs", "what each run used (for `stackfarm cache prune`)"),
        ("tmp", "partial downloads and unpacks"),
    )

    def usage(self) -> list[tuple[str, str, int, int]]:
        """(area, what it holds, files, bytes) per folder; a hard-linked file counts once, where first seen."""
        seen: set[tuple[int, int]] = set()
        rows = []
        for area, what in self.AREAS:
            files = size = 0
            folder = self.root / area
            for path in folder.rglob("*") if folder.is_dir() else ():
                try:
                    st = path.lstat()
                except OSError:
                    continue
                if not path.is_file() or (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                files, size = files + 1, size + st.st_size
            rows.append((area, what, files, size))
        return rows

    def blob_path(self, artifact: Artifact) -> Path:
        """Where the wheel with this sha256 lives once fetched."""
        return self.root / "blobs" / "sha256" / f"{_checked_sha(artifact)}.whl"

    def tree_path(self, artifact: Artifact) -> Path:
        """Where the wheel's tree lives once unpacked."""
        return self.root / "trees" / _checked_sha(artifact)

    def lock(
        self,
        name: str | os.PathLike[str],
        *,
        timeout: float | None = cachekeep.LOCK_TIMEOUT,
        notify: Callable[[str], None] | None = None,
    ) -> contextlib.AbstractContextManager[Path]:
        """Hold ``name`` (a path such as a reports folder or a cell's work dir, or any string) against other
        processes and threads. When another holds it, ``notify`` (default: stderr) gets "waiting for another
        stackfarm run holding <name>…" and this waits up to ``timeout`` seconds (None: for ever; 0: refuse at
        once), then raises EnvironmentProblem. Yields the lock file; re-entrant in one thread."""
        return self._locks.hold(name, timeout=timeout, notify=notify)

    def record_use(self, run_id: str, paths: Iterable[Path]) -> Path:
        """Add the cache entries ``paths`` lie in (blobs, trees, cells work dirs) to ``runs/<run_id>.json``;
        call it as often as wanted (once per cell), `stackfarm cache prune --keep-runs N` keeps their union.

        The first call for a run id takes the run's lease (cachekeep.take_lease) and holds it until ``close()``
        (or until this Cache is collected, or the process ends): while it is held, `cache prune` and
        `cache verify --repair` in any process keep everything the run recorded, whatever --keep-runs says."""
        return cachekeep.record_use(self.root, run_id, paths, lease=self._lease)

    def _lease(self, run_id: str) -> None:
        with self._leases_guard:
            if run_id not in self._leases:
                self._leases[run_id] = cachekeep.take_lease(self.root, run_id)

    def close(self) -> None:
        """Give back the leases of the runs this Cache recorded: they count as finished (prunable) from now on.
        The Cache stays usable; a later record_use takes a lease again."""
        _close_leases(self._leases, self._leases_guard)

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _locked(self, key: str) -> contextlib.AbstractContextManager[None]:
        # flock locks belong to an open file description, so this excludes threads and processes.
        return cachekeep.flocked(self.root / "locks" / f"{key}.lock")

    def _stat_key(self, path: Path) -> tuple[int, int] | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return st.st_size, st.st_mtime_ns

    def _known_good(self, blob: Path) -> bool:
        key = self._stat_key(blob)
        return key is not None and self._verified.get(blob) == key

    def _valid(self, blob: Path, sha: str) -> bool:
        if self._known_good(blob):
            return True
        if not blob.is_file() or _sha256_file(blob) != sha:
            return False
        self._remember(blob)
        return True

    def _remember(self, blob: Path) -> None:
        if key := self._stat_key(blob):
            self._verified[blob] = key

    def _unusable(self, what: str, exc: OSError) -> ArtifactError:
        if exc.errno == errno.ENOSPC:
            return ArtifactError(
                f"disk full while {what}: free space or set STACKFARM_CACHE to a larger disk"
            )
        return cachekeep.damaged(
            f"{what} ({self.root})", f"{exc}; if the folder is read-only, set STACKFARM_CACHE elsewhere"
        )

    def fetch(self, artifact: Artifact, progress: Callable[[int, int | None], None] | None = None) -> Path:
        """The verified blob of ``artifact``, downloading (or resuming) it when missing or corrupt."""
        blob = self.blob_path(artifact)
        sha = _checked_sha(artifact)
        if self._known_good(blob):
            return blob
        part = self.root / "tmp" / f"{sha}.part"
        try:
            with self._locked(sha):
                return self._fetch_locked(artifact, blob, part, progress)
        except OSError as exc:  # the network's errors are handled inside: these are the cache's own files
            if exc.errno == errno.ENOSPC:
                with contextlib.suppress(OSError):
                    part.unlink(missing_ok=True)
            raise self._unusable(f"fetching {artifact.filename} into {part.parent}", exc) from exc

    def _fetch_locked(self, artifact: Artifact, blob: Path, part: Path, progress: _Progress) -> Path:
        sha = _checked_sha(artifact)
        if self._valid(blob, sha):
            return blob
        cachekeep.remove_tree(blob)  # corrupt (or absent, or not even a file): fetch it again
        if part.is_dir():
            cachekeep.remove_tree(part)
        part.parent.mkdir(parents=True, exist_ok=True)
        blob.parent.mkdir(parents=True, exist_ok=True)
        resumed = part.is_file() and part.stat().st_size > 0
        actual = self._download(artifact, part, progress)
        if actual != sha and resumed:
            # The old .part may be stale or damaged; only a fresh download's hash is conclusive.
            part.unlink()
            actual = self._download(artifact, part, progress)
        if actual != sha:
            part.unlink(missing_ok=True)
            dropped = cachekeep.forget_answers(self.root, sha)
            text = (
                f"sha256 mismatch for {artifact.filename} from {artifact.url}: expected {sha}, got {actual}"
            )
            if dropped:
                text += "\n  the remembered index answer was dropped: the next run asks the index again"
            raise ShaMismatchError(text, artifact=artifact, actual=actual)
        part.chmod(0o444)  # shared by every cell (and hard-linked into build contexts): nobody writes to it
        part.replace(blob)  # atomic: readers see no blob or a whole one
        self._remember(blob)
        return blob

    def _download(self, artifact: Artifact, part: Path, progress: _Progress) -> str:
        """Complete ``part`` from the artifact's URL and return its sha256."""
        if artifact.url.startswith("file:"):
            src = Path(urllib.request.url2pathname(urlparse(artifact.url).path))
            try:
                with open(src, "rb") as fh:
                    _copy(fh.read, part, 0, src.stat().st_size, progress)
            except FileNotFoundError as exc:
                raise ArtifactError(f"{src} (for {artifact.filename}) no longer exists") from exc
        else:
            try:
                _retrying(artifact.url, lambda timeout: _download_once(artifact, part, progress, timeout))
            except httpclient.HttpStatusError as exc:
                raise _http_error(artifact.url, exc) from exc
        return _sha256_file(part)

    def unpacked(self, artifact: Artifact) -> Path | None:
        """The tree if it was already extracted completely, else None (no hashing, no network). A tree
        missing a file, or with one of another size, raises ArtifactError (the fix: cache verify --repair)."""
        final = self.tree_path(artifact)
        if not (final / _MARKER).is_file():
            return None
        if final not in self._trees_ok:
            if problem := cachekeep.quick_problem(final):
                raise cachekeep.damaged(f"the tree of {artifact.filename} ({final})", problem)
            self._trees_ok.add(final)
        return final

    def unpack(self, artifact: Artifact) -> Path:
        """The root of the wheel's unpacked tree, extracted once, atomically, and made read-only."""
        if (done := self.unpacked(artifact)) is not None:
            return done
        final = self.tree_path(artifact)
        blob = self.fetch(artifact)
        with self._locked(f"{artifact.sha256}.unpack"):
            if (done := self.unpacked(artifact)) is not None:
                return done
            tmp = self.root / "tmp" / f"{artifact.sha256}.unpack-{os.getpid()}"
            try:
                cachekeep.remove_tree(tmp)
                tmp.mkdir(parents=True)
                files = cachekeep.extract_wheel(blob, tmp, artifact.filename)
                (tmp / _MARKER).write_text(
                    cachekeep.manifest_text(artifact.filename, files), encoding="utf-8"
                )
                cachekeep.make_read_only(tmp, top=False)  # the top stays writable until it is renamed
                cachekeep.remove_tree(final)  # an unmarked leftover of a crash from before atomic renames
                final.parent.mkdir(parents=True, exist_ok=True)
                tmp.replace(final)
                final.chmod(0o555)
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    cachekeep.remove_tree(tmp)
                if isinstance(exc, _BAD_ZIP):
                    raise ArtifactError(
                        f"{artifact.filename} is not a valid wheel: {exc}\n  fix: {cachekeep.REPAIR}"
                    ) from exc
                if isinstance(exc, OSError):
                    raise self._unusable(f"unpacking {artifact.filename} into {final}", exc) from exc
                raise
        self._trees_ok.add(final)
        return final

    def lazy_tree(self, artifact: Artifact, build: TreeBuilder) -> Path:
        """The wheel's lazy tree, made once by `build` (stackfarm.lazytree.lazy_tree: sources and dist-info whole,
        libraries as sparse copies of what the static readers read) with range requests, under this cache's lock;
        the full tree where the wheel is local or its server answers no ranges. The caller hands the builder in:
        lazytree stands on the analysis readers, and the cache stays below them."""
        if (done := self.unpacked(artifact)) is not None or urlparse(artifact.url).scheme not in (
            "http",
            "https",
        ):
            return done or self.unpack(artifact)
        sha = _checked_sha(artifact)
        with self._locked(f"{sha}.lazy"):
            try:
                tree, _built = build(
                    self.root, sha, artifact.url, artifact.size, artifact.filename, retrying=_retrying
                )
            except lazyzip.NoRanges:
                return self.unpack(artifact)
            except OSError as exc:
                raise self._unusable(f"making the lazy tree of {artifact.filename}", exc) from exc
        return tree

    def metadata(self, artifact: Artifact) -> email.message.Message:
        """The wheel's ``*.dist-info/METADATA``, parsed: from the wheel when it is in the cache, else from the
        index's PEP 658 ``<wheel url>.metadata`` (checked against the listing's sha256, kept in ``metadata/``),
        else read out of the remote wheel with range requests (stackfarm.lazyzip: its central directory and the
        one member, CRC-checked, the archive's size checked against the listing), else from the whole wheel."""
        if artifact.sha256 in self._metadata:
            return self._metadata[artifact.sha256]
        blob = self.blob_path(artifact)
        if not blob.is_file() and (raw := self._core_metadata(artifact) or self._ranged_metadata(artifact)):
            message = BytesParser(policy=email.policy.compat32).parsebytes(raw)
            self._metadata[artifact.sha256] = message
            return message
        blob = self.fetch(artifact)
        try:
            with zipfile.ZipFile(blob) as zf:
                names = [n for n in zf.namelist() if _is_metadata(n)]
                if len(names) != 1:
                    raise ArtifactError(f"{artifact.filename} has {len(names)} dist-info/METADATA, not 1")
                raw = zf.read(names[0])
        except _BAD_ZIP as exc:
            raise ArtifactError(
                f"{artifact.filename} is not a valid wheel: {exc}\n  fix: {cachekeep.REPAIR}"
            ) from exc
        except OSError as exc:
            raise self._unusable(f"reading {artifact.filename}", exc) from exc
        message = BytesParser(policy=email.policy.compat32).parsebytes(raw)
        self._metadata[artifact.sha256] = message
        return message

    def _ranged_metadata(self, artifact: Artifact) -> bytes | None:
        """METADATA read out of the remote wheel by range requests (kept in ``metadata/``); None where the server
        answers no ranges (the whole wheel is fetched instead)."""
        if urlparse(artifact.url).scheme not in ("http", "https"):
            return None
        path = self.root / "metadata" / f"{_checked_sha(artifact)}.zip.METADATA"
        with contextlib.suppress(OSError):
            return path.read_bytes()
        try:
            remote = lazyzip.RemoteZip(artifact.url, artifact.size, retrying=_retrying)
            names = [n for n in remote.members if _is_metadata(n)]
            if len(names) != 1:
                raise ArtifactError(f"{artifact.filename} has {len(names)} dist-info/METADATA, not 1")
            raw = remote.read(names[0])
        except lazyzip.NoRanges:
            return None
        except httpclient.HttpStatusError as exc:
            raise _http_error(artifact.url, exc) from exc
        write_bytes_atomic(path, raw)
        return raw

    def _core_metadata(self, artifact: Artifact) -> bytes | None:
        """The PEP 658 metadata file's bytes, verified (cached by the wheel's sha256); None where the index
        serves none with a hash (or the file turns out to be missing: the wheel is read instead)."""
        want = (artifact.metadata_sha256 or "").lower()
        if not _SHA256.fullmatch(want) or urlparse(artifact.url).scheme not in ("http", "https"):
            return None
        path = self.root / "metadata" / f"{_checked_sha(artifact)}.METADATA"
        with contextlib.suppress(OSError):
            raw = path.read_bytes()
            if hashlib.sha256(raw).hexdigest() == want:
                return raw
        url = artifact.url + ".metadata"
        try:
            answer = _index().fetch(url, {"User-Agent": _USER_AGENT}, absent=(404, 410))
        except httpclient.HttpStatusError as exc:
            raise _http_error(url, exc) from exc
        if answer is None:
            return None  # listed but not there: the wheel itself still says it
        raw = answer.body
        if (actual := hashlib.sha256(raw).hexdigest()) != want:
            dropped = cachekeep.forget_answers(self.root, artifact.sha256)
            text = (
                f"sha256 mismatch for {artifact.filename}.metadata from {url}: expected {want}, got {actual}"
            )
            if dropped:
                text += "\n  the remembered index answer was dropped: the next run asks the index again"
            raise ShaMismatchError(text, artifact=artifact, actual=actual)
        write_bytes_atomic(path, raw)
        return raw


def _close_leases(leases: dict[str, IO[bytes]], guard: threading.Lock) -> None:
    """Close every lease file: the flock goes with the last open copy of it (never LOCK_UN: a forked child's
    copy must not give back its parent's lease)."""
    with guard:
        files = list(leases.values())
        leases.clear()
    for fh in files:
        with contextlib.suppress(OSError):
            fh.close()


def _checked_sha(artifact: Artifact) -> str:
    # The hash names files in the cache, so it must be plain hex and nothing else.
    sha = artifact.sha256.lower()
    if not _SHA256.fullmatch(sha):
        raise ArtifactError(f"{artifact.filename}: {artifact.sha256!r} is not a sha256 hex digest")
    return sha


def _copy(read: Callable[[int], bytes], part: Path, done: int, total: int | None, progress: _Progress) -> int:
    """Append chunks from ``read`` to ``part`` (after ``done`` bytes), reporting progress."""
    with open(part, "ab" if done else "wb") as out:
        if progress:
            progress(done, total)
        while chunk := read(_CHUNK):
            if proc.STOP.is_set():  # Ctrl-C / SIGTERM: stop within a chunk; the part file resumes next time
                raise proc.Stopped(f"download of {part.name} stopped: the run is stopping")
            out.write(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)
    return done


def _download_once(artifact: Artifact, part: Path, progress: _Progress, timeout: float) -> None:
    start = part.stat().st_size if part.is_file() else 0
    headers = {"User-Agent": _USER_AGENT}
    if start:
        headers["Range"] = f"bytes={start}-"
    try:
        resp = httpclient.send(artifact.url, headers, timeout=timeout)
    except httpclient.HttpStatusError as exc:
        if exc.code == 416 and start:  # the .part is no prefix of this file: start over
            part.unlink()
            _download_once(artifact, part, progress, timeout)
            return
        raise
    with resp:
        if start and resp.status != 206:
            start = 0  # the server ignored Range and sends the whole file
        length = resp.headers.get("Content-Length")
        total = start + int(length) if length else artifact.size
        done = _copy(resp.read1, part, start, total, progress)  # read1: what has arrived, so a stop is seen
    if total is not None and done < total:
        # A dropped connection may look like a short body; retrying resumes from here.
        raise http.client.IncompleteRead(b"", total - done)


__all__ = [
    "INSTALLED_EXTRAS",
    "REFUSED",
    "RETRY_DELAYS",
    "Artifact",
    "Cache",
    "ShaMismatchError",
    "Source",
    "Target",
    "TreeBuilder",
    "find_artifact",
    "list_versions",
    "requires_dist",
]
