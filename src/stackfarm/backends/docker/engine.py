"""`DockerEngine`, the one door to the Docker engine: nothing else in stackfarm talks to it.

Containers go through the Docker SDK for Python (`docker` on PyPI): create, start, stream the logs into the
suite's log while the container runs, wait (with the suite's timeout, and `stackfarm.proc.STOP`: a stopped run
kills and removes its container), copy the reports out (`get_archive`), remove: whatever happens.

Builds stay on the CLI (`docker build` with DOCKER_BUILDKIT=1, through `stackfarm.proc.call`): the SDK's
`images.build()` drives the engine's legacy builder only, and docker/Dockerfile needs BuildKit (`RUN
--mount=type=cache|bind|secret`, and the inline registry cache). Image commands (inspect, tag, pull, push, load,
import, save, rm) are CLI calls too: the CLI reads the user's registry credentials and credential helpers
(`docker login`), and pull/push/save/load are what a user would type to redo them by hand.

The engine is checked once (version, BuildKit, an NVIDIA runtime, its data root). Engine errors map onto the
backend's error tree: no engine or no SDK is an EngineError, a registry that fails a RegistryError (both
environment problems), anything about the cell a DockerError.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from packaging.version import Version

from ... import proc
from ...errors import StackfarmError
from ...files import write_atomic, write_bytes_atomic
from ...proc import Outcome, call
from .commands import (
    ContainerSpec,
    build_argv,
    create_options,
    failure_text,
    parse_build_failure,
    parse_loaded_image,
)
from .common import BuildError, DiskFullError, DockerError, EngineError, RegistryError, validate_image_ref

if TYPE_CHECKING:  # the SDK is imported when a container is first made: suites inside one import this module
    from docker import DockerClient
    from docker.models.containers import Container

#: Oldest engine that works: BuildKit with RUN --mount in the built-in Dockerfile frontend (no `# syntax=`
#: line, which would pull a frontend image) came in 18.09, `--gpus` in 19.03; bookworm's docker.io is 20.10.
MIN_ENGINE = Version("20.10")


@dataclass(frozen=True, kw_only=True)
class EngineInfo:
    executable: str
    client: str
    server: str
    #: Whether `--gpus` can work: an NVIDIA runtime or hook is registered with the engine.
    gpu: bool
    #: The engine's data root (where images live), for disk-space checks.
    root_dir: str


@dataclass(frozen=True, kw_only=True)
class ImageIdentity:
    """What names an image's bytes: its content id, and the registry digests it was pulled or pushed as."""

    #: `docker image inspect --format {{.Id}}`: sha256 of the image's config, the same on every engine.
    id: str
    #: `repository@sha256:...` for each registry the image came from or went to; () for a local build.
    repo_digests: tuple[str, ...] = ()


#: How often a running container's state is looked at (seconds): the granularity of timeouts and stops.
POLL = 0.25
#: `docker pull` output that means "the registry answered: it has no such image" (not "it did not answer").
_NOT_THERE = re.compile(
    r"manifest unknown|not found|does not exist|no such manifest|repository name not known|name unknown", re.I
)


def _tail(text: str, n: int = 8) -> str:
    return "\n    ".join(line for line in text.strip().splitlines()[-n:])


def _docker_candidates() -> list[str]:
    """Every `docker` on PATH, first first, each binary once."""
    seen, found = set(), []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        exe = Path(folder or ".") / "docker"
        if exe.is_file() and os.access(exe, os.X_OK) and (real := exe.resolve()) not in seen:
            seen.add(real)
            found.append(str(exe))
    return found


class DockerEngine:
    """The one door to the engine: version check, build, run with reports copied out, registry, save/load/import.

    Every CLI command is a list through `stackfarm.proc.call`; containers (through the SDK) are always removed,
    also on a timeout, a failure, a stop or Ctrl-C (see `run`), and `remove_containers()` removes any this
    process still knows of."""

    def __init__(self, executable: str | None = None) -> None:
        self._explicit = executable or os.environ.get("STACKFARM_DOCKER")
        self._info: EngineInfo | None = None
        self._lock = threading.Lock()
        self._live: set[str] = set()
        self._client: DockerClient | None = None

    # -- checks

    def check(self) -> EngineInfo:
        """The engine's versions and abilities, checked once: raises EngineError with what to do otherwise."""
        with self._lock:
            if self._info is None:
                self._info = self._probe()
            return self._info

    @property
    def executable(self) -> str:
        return self.check().executable

    def _probe(self) -> EngineInfo:
        candidates = [self._explicit] if self._explicit else _docker_candidates()
        if not candidates:
            raise EngineError("no `docker` command on PATH: install docker.io (Debian) or Docker Engine")
        problems = []
        for exe in candidates:
            if shutil.which(exe) is None:
                raise EngineError(f"docker command {exe!r} not found (STACKFARM_DOCKER or PATH)")
            out = call([exe, "version", "--format", "{{json .}}"], timeout=30)
            try:
                data = json.loads(out.output.strip().splitlines()[0]) if out.output.strip() else {}
            except json.JSONDecodeError:
                data = {}
            server = (data.get("Server") or {}).get("Version")
            if out.returncode != 0 or not server:
                said = [line for line in out.output.splitlines() if line.strip() and not line.startswith("{")]
                raise EngineError(
                    f"the Docker engine does not answer: {said[-1] if said else 'no reply'} "
                    f"({exe} version exited {out.returncode})\n  fix: start dockerd (systemctl start docker, "
                    "or .ci/docker.sh) or point DOCKER_HOST at a running engine"
                )
            client = str((data.get("Client") or {}).get("Version", "0"))
            if _version(server) < MIN_ENGINE:
                raise EngineError(
                    f"the Docker engine is {server}; stackfarm needs {MIN_ENGINE} or newer (BuildKit "
                    "RUN --mount and --gpus)\n  fix: upgrade docker.io / Docker Engine"
                )
            if self._has_buildkit(exe, client):
                return self._describe(exe, client, server)
            problems.append(f"{exe} (client {client}) has no buildx plugin")
        raise EngineError(
            "BuildKit is needed (RUN --mount=type=cache) but no docker client can use it: "
            + "; ".join(problems)
            + "\n  fix: install the buildx plugin (docker-buildx-plugin / docker-buildx), or set "
            "STACKFARM_DOCKER to a client older than 23 (BuildKit built in, e.g. Debian's /usr/bin/docker)"
        )

    @staticmethod
    def _has_buildkit(exe: str, client: str) -> bool:
        # Clients from 23 on hand BuildKit builds to the buildx plugin and fail without it; older ones have
        # BuildKit inside.
        if _version(client) < Version("23"):
            return True
        return call([exe, "buildx", "version"], timeout=30).returncode == 0

    @staticmethod
    def _describe(exe: str, client: str, server: str) -> EngineInfo:
        out = call([exe, "info", "--format", "{{json .}}"], timeout=30)
        try:
            info: dict[str, Any] = (
                json.loads(out.output.strip().splitlines()[0]) if out.returncode == 0 else {}
            )
        except (json.JSONDecodeError, IndexError):
            info = {}
        runtimes = info.get("Runtimes") or {}
        gpu = "nvidia" in runtimes or shutil.which("nvidia-container-runtime-hook") is not None
        return EngineInfo(
            executable=exe, client=client, server=server, gpu=gpu, root_dir=str(info.get("DockerRootDir", ""))
        )

    def _call(self, args: Sequence[str | Path], **kwargs: Any) -> Outcome:
        # DOCKER_BUILDKIT=1 selects the built-in BuildKit of pre-23 clients; newer ones ignore it.
        return call(args, env={"DOCKER_BUILDKIT": "1", "DOCKER_CLI_HINTS": "false"}, **kwargs)

    # -- images

    def image_id(self, ref: str) -> str | None:
        """The image's content id (`sha256:...`), or None when the engine has no image `ref`."""
        out = self._call([self.executable, "image", "inspect", "--format", "{{.Id}}", ref], timeout=60)
        return out.output.strip() if out.returncode == 0 else None

    def image_identity(self, ref: str) -> ImageIdentity | None:
        """The image's content id and registry digests (one `docker image inspect`), or None without it."""
        out = self._call(
            [self.executable, "image", "inspect", "--format", "{{.Id}} {{json .RepoDigests}}", ref],
            timeout=60,
        )
        if out.returncode != 0:
            return None
        image_id, _, digests = out.output.strip().partition(" ")
        try:
            repo_digests = json.loads(digests) or []
        except json.JSONDecodeError:
            repo_digests = []
        return ImageIdentity(id=image_id, repo_digests=tuple(str(d) for d in repo_digests))

    def image_size(self, ref: str) -> int:
        out = self._call([self.executable, "image", "inspect", "--format", "{{.Size}}", ref], timeout=60)
        if out.returncode != 0:
            raise DockerError(f"no image {ref}: {_tail(out.output, 2)}")
        return int(out.output.strip())

    def images_labelled(self, key: str, value: str | None = None) -> list[str]:
        """Tagged images with label key=value (any value when None), newest first."""
        label = key if value is None else f"{key}={value}"
        out = self._call(
            [self.executable, "images", "--filter", f"label={label}", "--format", "{{.Repository}}:{{.Tag}}"],
            timeout=60,
        )
        return (
            [line for line in out.output.split() if not line.endswith(":<none>")]
            if out.returncode == 0
            else []
        )

    def pull(self, ref: str) -> None:
        out = self._call([self.executable, "pull", ref], timeout=3600)
        if out.returncode != 0:
            raise DockerError(
                f"base image {ref} is not in the engine and could not be pulled:\n"
                f"    {_tail(out.output, 3)}\n"
                "  fix: without a registry, give [docker] base as a tarball (`docker save` elsewhere; "
                "stackfarm runs `docker load`), a rootfs folder (stackfarm runs `docker import`), or "
                "build one with docker/make-base.sh and name it"
            )

    def labels(self, ref: str) -> dict[str, str] | None:
        """The image's labels, or None when the engine has no image `ref`."""
        out = self._call(
            [self.executable, "image", "inspect", "--format", "{{json .Config.Labels}}", ref], timeout=60
        )
        if out.returncode != 0:
            return None
        try:
            found = json.loads(out.output.strip() or "null") or {}
        except json.JSONDecodeError:
            found = {}
        return {str(k): str(v) for k, v in found.items()}

    def tag(self, source: str, target: str) -> None:
        out = self._call([self.executable, "tag", source, validate_image_ref(target)], timeout=60)
        if out.returncode != 0:
            raise DockerError(f"`docker tag {source} {target}` failed:\n    {_tail(out.output, 3)}")

    def remove_image(self, ref: str) -> str | None:
        """Untag `ref` (`docker image rm`, never forced: an image a container uses stays); None when it went
        (or was not there), else what the engine said."""
        out = self._call([self.executable, "image", "rm", ref], timeout=300)
        if out.returncode == 0 or "No such image" in out.output:
            return None
        return _tail(out.output, 2)

    def pull_if_present(self, ref: str) -> tuple[bool, str]:
        """Pull `ref` from its registry: (True, output) when pulled, (False, output) when the registry answered
        that it has no such image. A registry that does not answer (or refuses us) is a RegistryError."""
        out = self._call([self.executable, "pull", validate_image_ref(ref)], timeout=3600)
        if out.returncode == 0:
            return True, out.output
        if out.timed_out or not _NOT_THERE.search(out.output):
            raise RegistryError(
                f"could not pull {ref}: {_tail(out.output, 3)}",
                fix=_registry_fix(ref),
            )
        return False, out.output

    def push(self, ref: str) -> tuple[str | None, str]:
        """Push `ref`; (its registry digest `repository@sha256:...` when the CLI printed it, the output)."""
        out = self._call([self.executable, "push", validate_image_ref(ref)], timeout=3600)
        if out.returncode != 0:
            raise RegistryError(f"could not push {ref}: {_tail(out.output, 3)}", fix=_registry_fix(ref))
        found = re.search(r"digest: (sha256:[0-9a-f]{64})", out.output)
        repository = ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref
        return (f"{repository}@{found[1]}" if found else None), out.output

    def load(self, tarball: Path) -> str:
        out = self._call([self.executable, "load", "--input", str(tarball)], timeout=3600)
        ref = parse_loaded_image(out.output) if out.returncode == 0 else None
        if ref is None:
            raise DockerError(f"`docker load` of {tarball} failed:\n    {_tail(out.output, 4)}")
        return ref

    def import_rootfs(self, rootfs: Path, name: str, scratch: Path) -> str:
        """`docker import` a root filesystem folder as `name` (through a tarball in `scratch`)."""
        tarball = scratch / f"rootfs-{uuid.uuid4().hex}.tar"
        scratch.mkdir(parents=True, exist_ok=True)
        try:
            with tarfile.open(tarball, "w") as tar:
                for child in sorted(rootfs.iterdir()):
                    tar.add(child, arcname=child.name)
            out = self._call(
                [
                    self.executable,
                    "import",
                    "--change",
                    'CMD ["/bin/sh"]',
                    str(tarball),
                    validate_image_ref(name),
                ],
                timeout=3600,
            )
        finally:
            tarball.unlink(missing_ok=True)
        if out.returncode != 0:
            raise DockerError(f"`docker import` of {rootfs} failed:\n    {_tail(out.output, 4)}")
        return name

    def save(self, ref: str, out_path: Path) -> Path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        part = out_path.with_name(f".{out_path.name}.part")
        try:
            out = self._call([self.executable, "save", "--output", str(part), ref], timeout=3600)
            if out.returncode != 0:
                raise DockerError(f"`docker save {ref}` failed:\n    {_tail(out.output, 4)}")
            part.replace(out_path)
        finally:
            part.unlink(missing_ok=True)
        return out_path

    def build(
        self,
        *,
        dockerfile: Path,
        context: Path,
        tag: str,
        build_args: Mapping[str, str],
        labels: Mapping[str, str],
        secrets: Mapping[str, Path],
        log: Path,
        timeout: float,
        cache_from: Sequence[str] = (),
        notes: Sequence[str] = (),
    ) -> Outcome:
        """`docker build` (BuildKit) of `tag`. The log (`notes`, the command line, BuildKit's output) is written
        atomically to `log` however the build ends; a failure raises BuildError naming the step."""
        argv = build_argv(
            self.executable,
            dockerfile=dockerfile,
            context=context,
            tag=tag,
            build_args=build_args,
            labels=labels,
            secrets=secrets,
            cache_from=cache_from,
        )
        out = self._call(argv, timeout=timeout)
        write_atomic(log, "".join(f"{line}\n" for line in notes) + f"+ {' '.join(argv)}\n{out.output}")
        if out.timed_out:
            raise BuildError(f"building {tag} took longer than {timeout:.0f}s; stopped (log: {log})")
        if out.returncode in (-2, 130) or (out.returncode != 0 and "context canceled" in out.output):
            raise BuildError(f"building {tag} was interrupted; nothing was tagged (log: {log})")
        if out.returncode != 0:
            failure = parse_build_failure(out.output)
            text = failure_text(tag, failure, log)
            if failure.disk_full:
                root = self.check().root_dir or "docker's data root"
                raise DiskFullError(
                    f"the disk is full ({root}) while {text}\n  fix: free space, e.g. `docker builder "
                    "prune` and `docker image prune`, or move docker's data-root to a larger disk"
                )
            raise BuildError(text)
        return out

    # -- containers (the Docker SDK)

    def sdk(self) -> DockerClient:
        """The Docker SDK's client, made once: the engine DOCKER_HOST or the CLI's current context names."""
        with self._lock:
            if self._client is None:
                self._client = _connect()
            return self._client

    def run(
        self,
        spec: ContainerSpec,
        *,
        timeout: float,
        log: Path,
        copy_out: Mapping[str, Path] = {},
    ) -> Outcome:
        """Create a container, start it, stream its output into `log` while it runs, wait for it (at most
        `timeout` seconds: then it is killed and the Outcome says timed_out), copy `copy_out` (container path ->
        host path; "DIR/." copies the folder's contents) out, and remove it: on success, failure, timeout, a
        stop and Ctrl-C alike. A stop (`proc.STOP`, the run's Ctrl-C/SIGTERM) kills it and raises
        `proc.Stopped`."""
        if proc.STOP.is_set():
            raise proc.Stopped(f"not started, the run is stopping: a container of {spec.image}")
        client = self.sdk()
        name = f"stackfarm-{uuid.uuid4().hex[:12]}"
        args = ("docker", "run", spec.image, *spec.argv)  # what the Outcome says ran (the SDK has no argv)
        start = time.monotonic()
        with self._lock:
            self._live.add(name)
        try:
            try:
                container = client.containers.create(**create_options(spec, name))
                container.start()
            except Exception as exc:
                raise _mapped(exc, f"could not start a container of {spec.image}") from exc
            with _Stream(log, f"+ {' '.join(args)}\n") as stream:
                reader = threading.Thread(
                    target=stream.follow, args=(container,), name=f"logs-{name}", daemon=True
                )
                reader.start()
                returncode, timed_out = self._wait(client, container, reader, deadline=start + timeout)
                reader.join(timeout=proc.GRACE)
            for source, dest in copy_out.items():
                # A missing path (pytest died early) is the caller's to report: it finds no JUnit file.
                _copy_out(container, source, dest)
            return Outcome(
                args=args,
                returncode=returncode,
                output=stream.text(),
                elapsed=time.monotonic() - start,
                timed_out=timed_out,
            )
        finally:
            self._remove(name)

    def _wait(
        self, client: DockerClient, container: Container, reader: threading.Thread, *, deadline: float
    ) -> tuple[int, bool]:
        """(exit code, timed out) of a started container; a stop kills it and raises proc.Stopped."""
        name = str(container.name)
        while True:
            try:
                state = client.api.inspect_container(name)["State"]
            except Exception as exc:
                raise _mapped(exc, f"lost container {name}") from exc
            if state.get("Status") in ("exited", "dead"):
                return int(state.get("ExitCode", -1)), False
            if proc.STOP.is_set():
                self._kill(container)
                raise proc.Stopped(f"stopped: container {name} was killed and removed")
            if time.monotonic() >= deadline:
                self._kill(container)
                return 124, True
            if reader.is_alive():
                reader.join(POLL)
            else:
                time.sleep(POLL / 5)

    @staticmethod
    def _kill(container: Container) -> None:
        # It may have exited meanwhile; removing it (run's finally) ends it either way.
        with contextlib.suppress(Exception):
            container.kill()

    def _remove(self, name: str) -> None:
        try:
            client = self.sdk()
            client.api.remove_container(name, v=True, force=True)
        except Exception as exc:
            if not _is_not_found(exc):  # never created, or gone already: nothing to remove
                # The SDK could not: the CLI may (its own connection); a container left behind is a leak.
                # (Never raising here: this runs in `run`'s finally, where the first error is the one to tell.)
                with contextlib.suppress(StackfarmError):
                    self._call([self.executable, "rm", "--force", "--volumes", name], timeout=120)
        with self._lock:
            self._live.discard(name)

    def remove_containers(self) -> int:
        """Remove every container this process created and still holds (for a signal handler or atexit)."""
        with self._lock:
            names = sorted(self._live)
        for name in names:
            self._remove(name)
        return len(names)


class _Stream:
    """A container's output as it comes: into its log file (flushed per chunk, so a long run can be followed
    with `tail -f`) and kept for the Outcome."""

    def __init__(self, log: Path, header: str) -> None:
        self.log = log
        self.header = header
        self._chunks: list[bytes] = []
        self._out: BinaryIO | None = None

    def __enter__(self) -> _Stream:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self.log, "wb")
        self._out.write(self.header.encode())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._out is not None:
            self._out.close()

    def follow(self, container: Container) -> None:
        try:
            for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                self._chunks.append(chunk)
                if self._out is not None and not self._out.closed:
                    self._out.write(chunk)
                    self._out.flush()
        except Exception:  # the container was killed or removed under the stream: what came is kept
            return

    def text(self) -> str:
        return b"".join(self._chunks).decode("utf-8", errors="replace")


def sdk_missing_reason() -> str | None:
    """None when the Docker SDK for Python imports, else why not. (A folder named docker/ on sys.path, like
    this repository's, imports as an empty namespace package: that is no SDK either.)"""
    try:
        import docker
    except ImportError as exc:
        return f"the Docker SDK for Python is missing ({exc})"
    if not hasattr(docker, "from_env"):
        return f"the Docker SDK for Python is missing (`import docker` found {list(docker.__path__)[:1]})"
    return None


def _connect() -> DockerClient:
    missing = sdk_missing_reason()
    if missing is not None:
        raise EngineError(
            f"{missing}\n  fix: pip install docker (a stackfarm dependency: reinstall stackfarm)"
        )
    import docker

    try:
        return docker.from_env(timeout=120)
    except docker.errors.DockerException as exc:
        raise EngineError(
            f"the Docker SDK cannot reach the engine: {exc}\n  fix: start dockerd (systemctl start docker, "
            "or .ci/docker.sh) or point DOCKER_HOST at a running engine"
        ) from None


def _is_not_found(exc: BaseException) -> bool:
    import docker.errors

    return isinstance(exc, docker.errors.NotFound)


def _mapped(exc: BaseException, doing: str) -> StackfarmError:
    """An SDK or transport exception as the backend's error: the cell's (DockerError) or the engine's."""
    import docker.errors
    import requests

    if isinstance(exc, StackfarmError):
        return exc
    if isinstance(exc, docker.errors.ImageNotFound):
        return DockerError(f"{doing}: the engine has no such image ({exc.explanation})")
    if isinstance(exc, docker.errors.APIError):
        said = str(exc.explanation or exc)
        if "no space left on device" in said.lower():
            return DiskFullError(f"{doing}: the engine's disk is full: {said}\n  fix: `docker image prune`")
        if "capabilities: [[gpu]]" in said:
            return DockerError(
                f"{doing}: the engine cannot hand a GPU to it ({said})\n  fix: install nvidia-container-toolkit"
            )
        return DockerError(f"{doing}: the engine said: {said}")
    if isinstance(exc, (docker.errors.DockerException, requests.exceptions.RequestException, OSError)):
        return EngineError(
            f"{doing}: the Docker engine stopped answering: {exc}\n  fix: check dockerd (its log, its disk)"
        )
    raise exc


def _registry_fix(ref: str) -> str:
    host = ref.split("/", 1)[0]
    return (
        f"check that the registry {host} answers (curl http://{host}/v2/), that `docker login {host}` was done "
        f"if it needs credentials, and that dockerd trusts it (an http registry off 127.0.0.0/8 goes in "
        "daemon.json's insecure-registries); or unset [docker] registry / STACKFARM_REGISTRY"
    )


def _safe_member(name: str, top: str) -> PurePosixPath | None:
    """The member's path below the archive's top entry (`top` itself: "."), or None when it is not below it
    or would climb out of it."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts or path.parts[0] != top:
        return None
    return PurePosixPath(*path.parts[1:]) if len(path.parts) > 1 else PurePosixPath(".")


def _copy_out(container: Container, source: str, dest: Path) -> None:
    """`docker cp`'s semantics for the two forms the backend uses: a file to `dest`, a folder ("DIR" or "DIR/.")
    into the folder `dest`. Each file is written atomically; links, devices and climbing paths are refused."""
    import docker.errors

    path = source[:-2] if source.endswith("/.") else source
    try:
        chunks, stat = container.get_archive(path)
        with tempfile.SpooledTemporaryFile(max_size=64 << 20) as spool:
            for chunk in chunks:
                spool.write(chunk)
            spool.seek(0)
            _extract(spool, str((stat or {}).get("name") or PurePosixPath(path).name), dest, source)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        raise _mapped(exc, f"could not copy {source} out of {container.name}") from exc


def _extract(archive: IO[bytes], top: str, dest: Path, source: str) -> None:
    with tarfile.open(fileobj=archive, mode="r|") as tar:
        for member in tar:
            rel = _safe_member(member.name, top)
            if rel is None:
                raise DockerError(f"copying {source} out: the archive holds {member.name!r}, outside it")
            target = dest if rel == PurePosixPath(".") else dest.joinpath(*rel.parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                data = tar.extractfile(member)
                write_bytes_atomic(target, data.read() if data is not None else b"")
            # links and devices a suite left in its output folder are not copied: they could point anywhere


def _version(text: str) -> Version:
    # Debian's "20.10.24+dfsg1" is a valid local version; "28.2.2-rd" style suffixes are cut off first.
    match = re.match(r"\d+(?:\.\d+)*", text)
    return Version(match[0]) if match else Version("0")


def engine_unavailable_reason(engine: DockerEngine | None = None) -> str | None:
    """None when a usable engine answers, else why not: for `--backend auto` to fall back with one line."""
    try:
        (engine or DockerEngine()).check()
    except EngineError as exc:
        return str(exc).splitlines()[0]
    return sdk_missing_reason()


__all__ = ["MIN_ENGINE", "DockerEngine", "EngineInfo", "ImageIdentity", "engine_unavailable_reason"]
