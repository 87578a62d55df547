"""`DockerEngine`, the one door to the Docker engine: every `docker` command stackfarm runs is a list through
`stackfarm.proc.call`, made here (or in `commands`, for the long ones).

It checks the engine once (version, BuildKit, an NVIDIA runtime, its data root), inspects, pulls, loads, imports
and saves images, builds one with BuildKit, and runs a container to completion, removing it whatever happens.
The engine is driven through its CLI, not the `docker` SDK: the SDK builds with the legacy builder only, and
docker/Dockerfile needs BuildKit (`RUN --mount=type=cache|bind|secret`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from ...proc import Outcome, call
from .commands import ContainerSpec, build_argv, create_argv, parse_build_failure, parse_loaded_image
from .common import BuildError, DiskFullError, DockerError, EngineError, validate_image_ref

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
    """The one door to the engine: version check, build, run with reports copied out, save/load/import.

    Every command is a list through `stackfarm.proc.call`; containers are always removed, also on a timeout, a
    failure or Ctrl-C (see `run`), and `remove_containers()` removes any this process still knows of."""

    def __init__(self, executable: str | None = None) -> None:
        self._explicit = executable or os.environ.get("STACKFARM_DOCKER")
        self._info: EngineInfo | None = None
        self._lock = threading.Lock()
        self._live: set[str] = set()

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

    def images_labelled(self, key: str, value: str) -> list[str]:
        """Tagged images with label key=value, newest first."""
        out = self._call(
            [
                self.executable,
                "images",
                "--filter",
                f"label={key}={value}",
                "--format",
                "{{.Repository}}:{{.Tag}}",
            ],
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
    ) -> Outcome:
        argv = build_argv(
            self.executable,
            dockerfile=dockerfile,
            context=context,
            tag=tag,
            build_args=build_args,
            labels=labels,
            secrets=secrets,
        )
        out = self._call(argv, timeout=timeout, log=log)
        if out.timed_out:
            raise BuildError(f"building {tag} took longer than {timeout:.0f}s; stopped (log: {log})")
        if out.returncode in (-2, 130) or (out.returncode != 0 and "context canceled" in out.output):
            raise BuildError(f"building {tag} was interrupted; nothing was tagged (log: {log})")
        if out.returncode != 0:
            failure = parse_build_failure(out.output)
            lines = "\n    ".join(failure.tail)
            text = f"building {tag} failed at {failure.step}\n  {failure.reason}\n    {lines}\n  log: {log}"
            if failure.disk_full:
                root = self.check().root_dir or "docker's data root"
                raise DiskFullError(
                    f"the disk is full ({root}) while {text}\n  fix: free space, e.g. `docker builder "
                    "prune` and `docker image prune`, or move docker's data-root to a larger disk"
                )
            raise BuildError(text)
        return out

    # -- containers

    def run(
        self,
        spec: ContainerSpec,
        *,
        timeout: float,
        log: Path,
        copy_out: Mapping[str, Path] = {},
    ) -> Outcome:
        """Create a container, run it attached (its output goes to `log`), copy `copy_out` (container path ->
        host path) out, and remove it: on success, failure, timeout and Ctrl-C alike."""
        exe = self.executable
        name = f"stackfarm-{uuid.uuid4().hex[:12]}"
        created = self._call(create_argv(exe, spec, name), timeout=120)
        if created.returncode != 0:
            self._call([exe, "rm", "--force", name], timeout=60)
            raise DockerError(
                f"could not create a container of {spec.image}:\n    {_tail(created.output, 4)}"
            )
        with self._lock:
            self._live.add(name)
        try:
            # `start --attach` passes signals on to the container, so Ctrl-C reaches pytest inside it.
            outcome = self._call([exe, "start", "--attach", name], timeout=timeout, log=log)
            for source, dest in copy_out.items():
                dest.parent.mkdir(parents=True, exist_ok=True)
                # A missing file (pytest died early) is the caller's to report: it finds no JUnit file.
                self._call([exe, "cp", f"{name}:{source}", str(dest)], timeout=300)
            return outcome
        finally:
            self._remove(name)

    def _remove(self, name: str) -> None:
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
    return None


__all__ = ["MIN_ENGINE", "DockerEngine", "EngineInfo", "ImageIdentity", "engine_unavailable_reason"]
