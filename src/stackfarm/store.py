"""The shared verdict store: a cell's verdict and its reports, keyed by the cell's input hash, so that a cell
whose inputs are unchanged costs nothing on any runner that can reach the store.

``--store`` takes a folder (a local disk, a shared mount) or an http(s) URL (a WebDAV folder: a server that
answers GET and PUT, e.g. nginx with ``dav_methods PUT``, as ``.ci/store-nginx.conf`` sets up). Both hold
the same layout; only the transport differs (FolderTransport, HttpTransport), every rule lives in Store:

    <base>/<input hash>/<cell id>/manifest.json         written last: what the entry holds
    <base>/<input hash>/<cell id>/<upload>/verdict.json  the verdict (stackfarm.verdict's record)
    <base>/<input hash>/<cell id>/<upload>/00-stack.xml  the cell's JUnit files, logs and report files,
    ...                                                  as ``reports/<cell>/`` holds them

``manifest.json`` is signed (stackfarm.storekeys): a DSSE envelope of an in-toto Statement whose subjects are
the entry's files and whose predicate is ``{"format": 2, "cell", "input_hash", "run_id", "status", "upload",
"files": {name: {"sha256", "size"}}}``, signed with the pushing runner's key. A reader believes an entry only
when a trusted runner key signed it; an unsigned entry (format 1), an unknown signer, a bad signature or a field
beside the envelope is UntrustedEntry: it counts as missing, with the reason. A push uploads every file into a
fresh ``<upload>`` folder, then writes the manifest:
an entry without one (a push cut short) is absent, and a re-push (``--force``) switches the manifest from one
complete upload to another, never mixing two. A fetch checks each file's sha256 against the manifest, then
lets stackfarm.verdict decide (verdict.read re-judges the status from the JUnit files and recomputes the key
from the recorded inputs; verdict.reusable: the same input hash, a cell that ran, its JUnit files the ones it
summarised) — the one rule the runner applies to its own ``reports/``; the signed status and run must be what
that gives. Only verdicts of cells that ran are pushed; errors, conflicts and exclusions are never reused, so
never stored.

A broken entry (a manifest that does not parse, a file missing or with other bytes) raises BrokenEntry: the
caller says so and runs the cell again (its push repairs the entry). A store that does not answer, after
bounded retries within its budget (stackfarm.httpclient), is an EnvironmentProblem (exit 4) naming its URL: never
a silent "not stored".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from . import httpclient, indexauth, proc, storekeys, verdict
from .errors import ConfigError, EnvironmentProblem, IndexUnreachableError, StackfarmError
from .files import write_bytes_atomic
from .storekeys import StoreKeys, Untrusted
from .verdict import VERDICT, CellReport, Stored

#: The entry's table of contents, written last.
MANIFEST = "manifest.json"
#: The manifest's format (inside its signed predicate).
FORMAT = storekeys.FORMAT
#: Pauses between attempts when the store does not answer (or answers 429/5xx); tests shrink them.
RETRY_DELAYS: tuple[float, ...] = (0.5, 1.0, 2.0)
_HEX64 = re.compile(r"[0-9a-f]{64}")
_UPLOAD = re.compile(r"[0-9a-f]{32}")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_USER_AGENT = "stackfarm/0.1 (verdict store)"
#: A bearer token for an http(s) store (sent to the store's origin only); netrc credentials work as for indexes.
STORE_TOKEN_ENV = "STACKFARM_STORE_TOKEN"


class BrokenEntry(StackfarmError):
    """A store entry that cannot stand for a verdict (its manifest or a file is wrong): run the cell again."""


class UntrustedEntry(BrokenEntry):
    """An entry no trusted runner key signed (or whose signature does not hold): it counts as missing."""


class Transport(Protocol):
    """Files of a store by key ("<hash>/<cell>/manifest.json"): where they live is the transport's business."""

    @property
    def where(self) -> str:
        """The store as the user named it (folder or URL), for messages."""
        ...

    def get(self, key: str) -> bytes | None:
        """The file's bytes, or None when there is none."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Write the file whole (a reader sees the old bytes or the new ones)."""
        ...

    def probe(self, *, create: bool) -> None:
        """Raise an EnvironmentProblem (or ConfigError) when the store cannot be used; `create`: a run may
        make it."""
        ...


@dataclass(frozen=True)
class FolderTransport:
    """A store in a folder: each key a file under it, written atomically (stackfarm.files)."""

    root: Path

    @property
    def where(self) -> str:
        return str(self.root)

    def get(self, key: str) -> bytes | None:
        path = self.root / key
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise EnvironmentProblem(
                f"verdict store {self.root}: cannot read {path} ({exc.strerror or exc})",
                fix="fix the folder's permissions or choose another --store",
            ) from None

    def put(self, key: str, data: bytes) -> None:
        write_bytes_atomic(self.root / key, data)

    def probe(self, *, create: bool) -> None:
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise EnvironmentProblem(
                    f"verdict store {self.root}: cannot make the folder ({exc.strerror or exc})",
                    fix="choose another --store DIR (or an http(s) URL)",
                ) from None
        elif not self.root.is_dir():
            raise EnvironmentProblem(
                f"verdict store {self.root}: no such folder",
                fix="give the folder `stackfarm run --store DIR` fills (or an http(s) URL)",
            )
        if next(self.root.glob(f"*/{VERDICT}"), None) is not None:
            raise ConfigError(
                "--store",
                f"{self.root} is a reports folder (<cell>/{VERDICT}), not a verdict store",
                fix="give the store a folder of its own: `stackfarm run --store DIR` fills it by input hash",
            )


def _sleep(seconds: float) -> None:
    """Wait between retries, but not past a stop (Ctrl-C / SIGTERM)."""
    if proc.STOP.wait(seconds):
        raise proc.Stopped("verdict store retries stopped: the run is stopping")


_HINT = "start the store (as root: .ci/servers.sh) or check --store"


def _client() -> httpclient.Client:
    """The store's client (stackfarm.httpclient): retries within the origin's budget, pausing RETRY_DELAYS."""
    return httpclient.Client(role="verdict store", hint=_HINT, delays=RETRY_DELAYS, sleep=_sleep)


@dataclass(frozen=True)
class HttpTransport:
    """A store on an HTTP server that answers GET and PUT under a base URL (a WebDAV folder)."""

    base: str

    @property
    def where(self) -> str:
        return self.base

    def url(self, key: str) -> str:
        return self.base + "/" + "/".join(urllib.parse.quote(part, safe="") for part in key.split("/"))

    def _request(
        self, method: str, url: str, data: bytes | None = None, absent: frozenset[int] = frozenset()
    ) -> bytes | None:
        # stackfarm.httpclient: netrc, inline credentials, a bearer token (STACKFARM_STORE_TOKEN), retries.
        try:
            answer = _client().fetch(
                url, {"User-Agent": _USER_AGENT}, method=method, data=data, absent=absent
            )
        except IndexUnreachableError as exc:
            raise EnvironmentProblem(
                f"verdict store {self.base} is unreachable: {method} {url}: {str(exc).splitlines()[0]}",
                fix=f"{_HINT}; without a store, drop --store",
            ) from None
        except httpclient.HttpStatusError as exc:
            what = (
                "accept PUT (nginx: dav_methods PUT; create_full_put_path on)"
                if method == "PUT"
                else "serve it"
            )
            if exc.code in (401, 403):
                what = f"take this runner's credentials ({STORE_TOKEN_ENV}, netrc, or user:token@ in --store)"
            raise EnvironmentProblem(
                f"verdict store {self.base}: {exc}", fix=f"the server must {what} under {self.base}/"
            ) from None
        return None if answer is None else answer.body

    def get(self, key: str) -> bytes | None:
        return self._request("GET", self.url(key), absent=frozenset({404, 410}))

    def put(self, key: str, data: bytes) -> None:
        self._request("PUT", self.url(key), data)

    def probe(self, *, create: bool) -> None:
        del create  # a WebDAV server makes the folders a PUT needs
        # Any HTTP answer means the server is there (a folder listing, or none: 403, 404).
        self._request("GET", self.base + "/", absent=frozenset({401, 403, 404, 405}))


def entry(input_hash: str, cell: str) -> str:
    """The key of a cell's entry for an input hash (checked: each becomes one path segment)."""
    if not _HEX64.fullmatch(input_hash):
        raise StackfarmError(f"input hash {input_hash!r} is not a sha256 (64 hex digits)")
    if not cell or cell.startswith(".") or any(c in cell for c in "/\\\0"):
        raise StackfarmError(f"cell id {cell!r} cannot name a store entry (a '/', '\\' or a leading '.')")
    return f"{input_hash}/{cell}"


class Store:
    """Verdicts keyed by input hash, over one transport (see the module's docstring)."""

    def __init__(self, transport: Transport, keys: StoreKeys | None = None) -> None:
        self.transport = transport
        #: Who this reader trusts and who it signs as (none: every entry is untrusted, nothing is pushed).
        self.keys = keys if keys is not None else StoreKeys(signer=None, trusted=())

    @property
    def where(self) -> str:
        return self.transport.where

    def __repr__(self) -> str:
        return f"Store({self.where!r})"

    def probe(self, *, create: bool = False) -> None:
        self.transport.probe(create=create)

    # -- reading ----------------------------------------------------------------------------------------------

    def manifest(self, cell: str, input_hash: str) -> dict[str, Any] | None:
        """The entry's manifest, its signature and contents checked; None when the store holds no (complete)
        entry. UntrustedEntry when no trusted runner key signed it, BrokenEntry when it is not this entry's."""
        key = f"{entry(input_hash, cell)}/{MANIFEST}"
        raw = self.transport.get(key)
        if raw is None:
            return None
        where = f"{self.where}: {key}"
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise BrokenEntry(f"{where}: not a manifest ({exc})") from None
        try:
            data, signer = storekeys.unseal(doc, self.keys)
        except Untrusted as exc:
            raise UntrustedEntry(f"{where}: not trusted: {exc}") from None
        problem = _manifest_problem(data, cell, input_hash)
        if problem:
            raise BrokenEntry(f"{where}: {problem} (signed by {signer.key_id[:16]}…)")
        return dict(data)

    def _files(
        self, cell: str, input_hash: str, manifest: Mapping[str, Any], names: list[str]
    ) -> dict[str, bytes]:
        """The named files of an entry, each checked against the manifest's sha256."""
        found: dict[str, bytes] = {}
        key = entry(input_hash, cell)
        for name in names:
            data = self.transport.get(f"{key}/{manifest['upload']}/{name}")
            if data is None:
                raise BrokenEntry(
                    f"{self.where}: {key}: {manifest['upload']}/{name} is listed in the manifest but missing"
                )
            want = manifest["files"][name]["sha256"]
            actual = hashlib.sha256(data).hexdigest()
            if actual != want:
                raise BrokenEntry(
                    f"{self.where}: {key}: {name}: sha256 {actual[:16]}…, the manifest says {want[:16]}…"
                )
            found[name] = data
        return found

    @contextlib.contextmanager
    def _staged(
        self, cell: str, input_hash: str, everything: bool
    ) -> Iterator[tuple[Stored, dict[str, bytes]] | None]:
        """The entry's verdict, judged by stackfarm.verdict on a private copy; None when there is no entry.

        `everything`: every file of the entry, else only the verdict and its JUnit files."""
        manifest = self.manifest(cell, input_hash)
        if manifest is None:
            yield None
            return
        files = self._files(cell, input_hash, manifest, [VERDICT])
        where = f"{self.where}: {entry(input_hash, cell)}"
        with tempfile.TemporaryDirectory(prefix="stackfarm-store-") as tmp:
            folder = Path(tmp) / cell
            try:  # which JUnit files it binds: the record as written, judged below once they are here
                claimed = verdict.parse(files[VERDICT], folder / VERDICT)
            except ValueError as exc:
                raise BrokenEntry(f"{where}: {exc}") from None
            rest = _wanted(manifest, claimed, everything)
            files |= self._files(cell, input_hash, manifest, rest)
            for name in [*rest, VERDICT]:
                write_bytes_atomic(folder / name, files[name])
            try:
                stored = verdict.read(folder / VERDICT)  # re-judged, its key recomputed
            except ValueError as exc:
                raise BrokenEntry(f"{where}: {exc}") from None
            why = verdict.reusable(stored, input_hash) or _signed_problem(manifest, stored)
            if why is not None:
                raise BrokenEntry(f"{where}: its verdict cannot be reused ({why})")
            yield stored, files

    def holds(self, cell: str, input_hash: str) -> bool:
        """Whether the store holds a verdict of the cell that may stand for a run with these inputs (the
        runner's own rule, on the verdict and its JUnit files). Raises BrokenEntry for a broken entry."""
        with self._staged(cell, input_hash, everything=False) as found:
            return found is not None

    def fetch(self, cell: str, input_hash: str, reports: Path) -> Stored | None:
        """Download the cell's verdict and reports into ``reports/<cell>/`` when the store holds a reusable one
        (verdict.json last, its JUnit paths pointing there); None when it holds none. BrokenEntry when the
        entry is broken: nothing of it is kept as a verdict."""
        with self._staged(cell, input_hash, everything=True) as found:
            if found is None:
                return None
            stored, files = found
            dest = reports / cell
            verdict.path_of(reports, cell).unlink(missing_ok=True)  # the old verdict no longer describes it
            for name, data in files.items():
                if name != VERDICT:
                    write_bytes_atomic(dest / name, data)
            suites = tuple(replace(s, xml=dest / s.xml.name if s.xml else None) for s in stored.report.suites)
            verdict.save(reports, replace(stored.report, suites=suites), stored.inputs)
        return verdict.read(verdict.path_of(reports, cell))

    # -- writing ----------------------------------------------------------------------------------------------

    def push(self, reports: Path, report: CellReport) -> str | None:
        """Upload ``reports/<cell>/`` as the entry of the report's input hash, manifest last and signed with
        the runner key. Returns the entry's key, or None when the verdict is not one a later run may reuse
        (nothing is uploaded). ConfigError when this runner has no key to sign with."""
        signer = self.keys.signer
        if signer is None:
            raise ConfigError(
                storekeys.RUNNER_KEY_ENV,
                f"no runner key: an entry pushed to {self.where} must be signed (readers trust only signed ones)",
                fix=storekeys.SETUP_HINT,
            )
        folder = reports / report.cell
        try:
            stored = verdict.read(folder / VERDICT)
        except ValueError:
            return None
        if not report.input_hash or verdict.reusable(stored, report.input_hash) is not None:
            return None
        key = entry(report.input_hash, report.cell)
        upload = uuid.uuid4().hex
        files: dict[str, dict[str, object]] = {}
        for path in sorted(folder.rglob("*")):
            name = path.relative_to(folder).as_posix()
            if not path.is_file() or any(part.startswith(".") for part in name.split("/")):
                continue  # temp files of writes in flight
            data = path.read_bytes()
            self.transport.put(f"{key}/{upload}/{name}", data)
            files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        manifest = {
            "format": FORMAT,
            "cell": report.cell,
            "input_hash": report.input_hash,
            "run_id": stored.report.run_id,
            "status": str(stored.report.status),
            "upload": upload,
            "files": files,
        }
        envelope = storekeys.seal(manifest, signer)
        self.transport.put(f"{key}/{MANIFEST}", json.dumps(envelope, indent=1).encode())
        return key


def _wanted(manifest: Mapping[str, Any], claimed: Stored, everything: bool) -> list[str]:
    """The entry's files to fetch besides the verdict: all (`everything`), else the JUnit files (and family
    records) that the verdict binds."""
    if everything:
        return sorted(set(manifest["files"]) - {VERDICT})
    names = {f"{s.suite}.xml" for s in claimed.report.suites}
    names |= {f"{s.suite}.json" for s in claimed.report.suites if s.record_sha256}  # stackfarm.family
    return sorted(names & set(manifest["files"]))


def _signed_problem(manifest: Mapping[str, Any], stored: Stored) -> str | None:
    """Why the verdict is not the one the runner signed for (another run, another status), or None."""
    if manifest.get("run_id") != stored.report.run_id:
        return f"the signed run is {manifest.get('run_id')!r}, the verdict's {stored.report.run_id!r}"
    if manifest.get("status") != str(stored.report.status):
        return f"signed as {manifest.get('status')}, re-judged from its JUnit files: {stored.report.status}"
    return None


def _manifest_problem(data: object, cell: str, input_hash: str) -> str | None:
    """Why a manifest cannot be read as this entry's, or None."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return f"not a manifest of format {FORMAT}"
    if data.get("cell") != cell or data.get("input_hash") != input_hash:
        return f"the manifest is of {data.get('cell')!r} / {data.get('input_hash')!r}, not of this entry"
    files = data.get("files")
    if not isinstance(data.get("upload"), str) or not _UPLOAD.fullmatch(data["upload"]):
        return "the manifest names no upload folder"
    if not isinstance(files, dict) or VERDICT not in files:
        return f"the manifest lists no {VERDICT}"
    return _files_problem(files)


def _files_problem(files: Mapping[object, object]) -> str | None:
    """Why a file the manifest lists cannot be taken: a name that leaves the entry or hides, no sha256."""
    for name, meta in files.items():
        parts = str(name).split("/")
        if any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            return f"the manifest lists a file named {name!r}"
        if not isinstance(meta, dict) or not _HEX64.fullmatch(str(meta.get("sha256", ""))):
            return f"the manifest gives {name!r} no sha256"
    return None


def open_store(location: str | Path, keys: StoreKeys | None = None) -> Store:
    """The store at `location`: an http(s) URL, a file:// URL or a folder; `keys`: who it trusts and signs as
    (default: stackfarm.storekeys.load(), from the environment)."""
    text = str(location)
    scheme = _SCHEME.match(text)
    keys = keys if keys is not None else storekeys.load()
    if scheme is None:
        return Store(FolderTransport(Path(text).expanduser().resolve()), keys)
    name = scheme.group(1).lower()
    if name in ("http", "https"):
        base = indexauth.take_credentials(text.rstrip("/"))  # user:pw@ kept in memory, never shown
        token = os.environ.get(STORE_TOKEN_ENV, "").strip()
        if token:
            indexauth.bearer_for(base, token)
        return Store(HttpTransport(base), keys)
    if name == "file":
        path = Path(urllib.request.url2pathname(urllib.parse.urlparse(text).path))
        return Store(FolderTransport(path), keys)
    raise ConfigError(
        "--store",
        f"{text!r}: a {name}:// store is not supported",
        fix="give a folder or an http(s) URL of a WebDAV folder (e.g. nginx with dav_methods PUT)",
    )


__all__ = [
    "FORMAT",
    "MANIFEST",
    "RETRY_DELAYS",
    "STORE_TOKEN_ENV",
    "BrokenEntry",
    "FolderTransport",
    "HttpTransport",
    "Store",
    "Transport",
    "UntrustedEntry",
    "entry",
    "open_store",
]
