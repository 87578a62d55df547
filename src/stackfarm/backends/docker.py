"""The Docker backend: one image per cell, built in layers from the exact wheels, tagged by its inputs' hash.

    cell + artifacts ──write_context──▶ per-stage requirements, patch overlay, cell record
        ──context_digest──▶ tag ──exists?──▶ done (a no-op costs one `docker image inspect`)
                                  └─ no ──▶ `docker build` (BuildKit, docker/Dockerfile)
    run_suite: create a container (project, stackfarm's src, cell.json: all read-only) ─▶ start --attach
               ─▶ copy the JUnit file out ─▶ remove the container, whatever happened

The engine is driven through its CLI, behind `DockerEngine`, not through the `docker` SDK: the SDK builds with
the legacy builder only, and the Dockerfile needs BuildKit (`RUN --mount=type=cache|bind|secret`).
"""

from __future__ import annotations

import dataclasses
import filecmp
import hashlib
import json
import os
import re
import shutil
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ..artifacts import Artifact, Cache, Source, Target, find_artifact
from ..cellspec import CellSpec, InstalledComponent, load
from ..errors import CellError, StackfarmError
from ..plan import Cell, Component
from ..proc import Outcome, call
from . import PATCHED_SGLANG, SUITE_OUT_ENV, Progress, pytest_argv

#: The repository root, where docker/Dockerfile lives next to src/.
_REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = _REPO / "docker" / "Dockerfile"
#: stackfarm's own sources, mounted into every container so suites import the same code as on the host.
STACKFARM_SRC = Path(__file__).resolve().parents[2]

#: Oldest engine that works: BuildKit with RUN --mount in the built-in Dockerfile frontend (no `# syntax=`
#: line, which would pull a frontend image) came in 18.09, `--gpus` in 19.03; bookworm's docker.io is 20.10.
MIN_ENGINE = Version("20.10")
#: The default base: `{cuda}` becomes the cell's CUDA with its patch level (nvidia/cuda tags carry one).
DEFAULT_BASE = "nvidia/cuda:{cuda}-devel-ubuntu24.04"
#: nvidia/cuda image tag for each CUDA minor a cell may name.
CUDA_IMAGE_VERSIONS = {
    "12.4": "12.4.1",
    "12.6": "12.6.3",
    "12.8": "12.8.1",
    "12.9": "12.9.1",
    "13.0": "13.0.1",
}
#: /dev/shm for runs without --ipc=host: the size SGLang's own `docker run` example gives.
DEFAULT_SHM_SIZE = "32g"
#: NVIDIA's advice for its framework containers (pinned memory, deep stacks); given to GPU runs only, since
#: raising memlock needs a host that allows it.
DEFAULT_ULIMITS: Mapping[str, str] = {"memlock": "-1", "stack": "67108864"}
#: The suites' tools inside the image, pinned (their hashes come from the index) so a verdict does not drift
#: with whatever pytest is newest: pytest and its dependencies, plus what suites import besides the stack.
DEFAULT_TOOLS = (
    "pytest==9.0.3",
    "iniconfig==2.3.0",
    "pluggy==1.6.0",
    "pygments==2.20.0",
    "packaging==26.4",
    "pyelftools==0.33",
    "tomlkit==0.15.2",
    "junitparser==5.0.3",
)
TOOLS_INDEX = "https://pypi.org/simple"

# Paths inside the image (docker/Dockerfile creates them).
VENV = "/opt/stackfarm/venv"
PROJECT = "/stackfarm/project"
SRC = "/stackfarm/src"
RUN_SPEC = "/stackfarm/run/cell.json"
OUT = "/stackfarm/out"
#: The image's unprivileged user (a fixed uid: Ubuntu 24.04 images already give 1000 to `ubuntu`).
USER = "10001"

#: The install stages of docker/Dockerfile, in build order, and the cell axes each one installs.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", ("torch",)),
    ("kernels", ("sgl_kernel", "flashinfer")),
    ("sglang", ("sglang",)),
)
IMAGE_REPOSITORY = "stackfarm"
LABEL_CELL = "org.stackfarm.cell"
LABEL_INPUTS = "org.stackfarm.inputs"
LABEL_RUN = "org.stackfarm.run"

_ARG_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Build-arg and option values: no whitespace, quotes or shell metacharacters (`;|&$<>()` and backticks).
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9._:/@+=-]*$")
# An image reference: [host[:port]/]path[:tag][@sha256:digest], as docker's reference grammar has it.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REF = re.compile(
    # A first part is a registry host only with a dot, a port, or as localhost (docker's own rule).
    r"^(?:(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::[0-9]+)?/|[A-Za-z0-9-]+:[0-9]+/)?"
    rf"{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
_PYTHON = re.compile(r"^3\.\d{1,2}$")
_SIZE = re.compile(r"^[1-9][0-9]*[bkmg]?$")
_ULIMIT_VALUE = re.compile(r"^-?[0-9]+(?::-?[0-9]+)?$")
_ULIMITS = frozenset(
    {"core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss"}
    | {"rtprio", "rttime", "sigpending", "stack"}
)
_WHEEL_FILENAME = re.compile(r"^[A-Za-z0-9_.+-]+\.whl$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MARKER = ".stackfarm-complete"  # artifacts.Cache's "this tree is whole" file, not part of the wheel
_TAIL = 25


# -- errors --------------------------------------------------------------------------------------------------


class DockerError(CellError):
    """The Docker backend could not build or run a cell; the message says which step and how to fix it."""


class EngineError(StackfarmError):
    """No usable Docker engine: not installed, not answering, too old, or without BuildKit."""


class BuildError(DockerError):
    """A build step failed; the message names the step and shows the last lines of its log."""


class DiskFullError(DockerError):
    """The engine's disk (or the cache's) is full."""


# -- validation (pure) ---------------------------------------------------------------------------------------


def validate_image_ref(ref: str) -> str:
    if not _IMAGE_REF.fullmatch(ref):
        raise DockerError(
            f"{ref!r} is not a valid image reference (like nvidia/cuda:12.8.1-devel-ubuntu24.04)"
        )
    return ref


def validate_build_args(args: Mapping[str, str]) -> dict[str, str]:
    """Build args as given, once every name and value is plain: they go to `docker build` as list items, and
    the Dockerfile expands them in shell commands, so a metacharacter would be code."""
    for name, value in args.items():
        if not _ARG_NAME.fullmatch(name):
            raise DockerError(f"build arg name {name!r} must be UPPER_CASE letters, digits and _")
        if not _SAFE_VALUE.fullmatch(value):
            raise DockerError(f"build arg {name}={value!r} holds a character outside [A-Za-z0-9._:/@+=-]")
    if "BASE" in args:
        validate_image_ref(args["BASE"])
    if "PYTHON" in args and not _PYTHON.fullmatch(args["PYTHON"]):
        raise DockerError(f"build arg PYTHON={args['PYTHON']!r} is not like 3.11")
    return dict(args)


def validate_shm_size(value: str) -> str:
    if not _SIZE.fullmatch(value):
        raise DockerError(f"[docker] shm_size = {value!r}: use a size like 16g, 512m or 1073741824")
    return value


def validate_ulimits(ulimits: Mapping[str, str | int]) -> tuple[tuple[str, str], ...]:
    out = []
    for name, raw in sorted(ulimits.items()):
        value = str(raw)
        if name not in _ULIMITS:
            raise DockerError(
                f"[docker] ulimits.{name}: unknown limit; use one of {', '.join(sorted(_ULIMITS))}"
            )
        if not _ULIMIT_VALUE.fullmatch(value):
            raise DockerError(f"[docker] ulimits.{name} = {value!r}: use an integer, -1, or soft:hard")
        out.append((name, value))
    return tuple(out)


def cuda_image_version(cuda: str) -> str:
    """The nvidia/cuda tag version for a cell's CUDA axis value: "12.8" -> "12.8.1"; "12.8.0" stays."""
    try:
        release = Version(cuda).release
    except InvalidVersion as exc:
        raise DockerError(f"cuda axis value {cuda!r} is not a version") from exc
    if len(release) >= 3:
        return ".".join(map(str, release[:3]))
    key = ".".join(map(str, (*release, 0)[:2]))
    if key not in CUDA_IMAGE_VERSIONS:
        raise DockerError(
            f"no nvidia/cuda image version known for CUDA {cuda}; name it in full (e.g. {key}.0) in the "
            f"[docker] base of matrix.toml, or add it to CUDA_IMAGE_VERSIONS"
        )
    return CUDA_IMAGE_VERSIONS[key]


def base_for(template: str, cell_values: Mapping[str, str]) -> str:
    """The base for a cell: the template with `{cuda}` filled in (a tarball or rootfs path stays as is)."""
    if is_base_path(template):
        return template
    try:
        ref = template.format(cuda=cuda_image_version(cell_values["cuda"]))
    except (KeyError, IndexError, ValueError) as exc:
        raise DockerError(f"[docker] base = {template!r}: the only placeholder allowed is {{cuda}}") from exc
    return validate_image_ref(ref)


def is_base_path(base: str) -> bool:
    """A base given as a path (a tarball for `docker load`, a rootfs for `docker import`), not a name."""
    return base.startswith(("/", "./", "../", "~")) or base.endswith((".tar", ".tar.gz", ".tgz"))


def site_packages(python: str) -> str:
    """The one site-packages every wheel of the cell is installed into."""
    if not _PYTHON.fullmatch(python):
        raise DockerError(f"python axis value {python!r} is not like 3.11")
    return f"{VENV}/lib/python{python}/site-packages"


def image_name(cell_id: str, digest: str) -> str:
    """`stackfarm/<cell id>:<first 16 hex of the input hash>`: readable, and unique per set of inputs."""
    repo = re.sub(r"[^a-z0-9._-]+", "-", cell_id.lower()).strip("._-")
    return validate_image_ref(f"{IMAGE_REPOSITORY}/{repo}:{digest[:16]}")


# -- the build context (files only, no engine) ---------------------------------------------------------------


def stage_of(axis: str) -> str:
    for stage, axes in STAGES:
        if axis in axes:
            return stage
    raise DockerError(f"no Dockerfile stage installs the {axis!r} axis; stages: {dict(STAGES)}")


def requirement_line(distribution: str, url: str, sha256: str) -> str:
    """One hash-pinned direct-URL requirement; pip refuses anything whose hash differs."""
    parsed = urlparse(url)
    if parsed.scheme not in ("https", "http", "file"):
        raise DockerError(f"{distribution}: cannot install from {url!r} (not an http(s) or file URL)")
    if parsed.username or parsed.password:
        raise DockerError(
            f"{distribution}: its URL carries credentials; they would be written into the build context. "
            "Put them in ~/.netrc and pass netrc= to the Docker backend (a BuildKit secret)"
        )
    if any(c.isspace() or c in "\"'\\" for c in url):
        raise DockerError(f"{distribution}: URL {url!r} holds whitespace or quotes")
    if not _SHA256.fullmatch(sha256):
        raise DockerError(f"{distribution}: {sha256!r} is not a sha256 hex digest")
    return f"{canonicalize_name(distribution)} @ {url} --hash=sha256:{sha256}"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _place_local_wheel(blob: Path, dest: Path) -> None:
    # A hard link costs nothing when the cache and the context share a disk; a copy otherwise.
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(blob, dest)
    except OSError:
        shutil.copyfile(blob, dest)


def write_context(
    context: Path,
    *,
    artifacts: Mapping[Component, Artifact],
    tools: Sequence[Artifact],
    record: CellSpec,
    overlay: Path | None,
    local_blob: Callable[[Artifact], Path],
    ca_bundle: Path | None = None,
) -> None:
    """Lay out the build context docker/Dockerfile expects. Each stage gets its own folder, bind-mounted into
    its RUN step alone, so a stage's cache key is its own wheels and nothing else."""
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    groups: dict[str, list[str]] = {"tools": [], **{stage: [] for stage, _ in STAGES}}
    placed: list[tuple[str, Artifact]] = [("tools", a) for a in tools]
    placed += [(stage_of(comp.axis), art) for comp, art in artifacts.items()]
    for stage, art in placed:
        url = art.url
        if url.startswith("file:"):
            # A wheel from a local folder: the build cannot see the host's path, so it travels in the context.
            if not _WHEEL_FILENAME.fullmatch(art.filename):
                raise DockerError(f"unsafe wheel file name {art.filename!r}")
            _place_local_wheel(local_blob(art), context / stage / art.filename)
            url = f"file:///tmp/stackfarm/{stage}/{art.filename}"
        groups[stage].append(requirement_line(art.distribution, url, art.sha256))
    for stage, lines in groups.items():
        _write(context / stage / "requirements.txt", "".join(f"{line}\n" for line in sorted(lines)))
    files = context / "patch" / "files"
    files.mkdir(parents=True)
    deleted = ""
    if overlay is not None:
        shutil.copytree(overlay / "files", files, dirs_exist_ok=True)
        deleted = (overlay / "deleted").read_text(encoding="utf-8")
    _write(context / "patch" / "deleted", deleted)
    _write(context / "ca" / "extra.pem", ca_bundle.read_text(encoding="utf-8") if ca_bundle else "")
    _write(context / "cell.json", json.dumps(dataclasses.asdict(record), indent=2, sort_keys=True) + "\n")


def context_digest(dockerfile: bytes, context: Path, build_args: Mapping[str, str], base_id: str) -> str:
    """sha256 over everything the image depends on: the Dockerfile, the base image's id, the build args and
    every context file. Local wheels are skipped: their sha256 is in the requirements file that names them."""
    digest = hashlib.sha256()
    digest.update(b"dockerfile\0" + hashlib.sha256(dockerfile).hexdigest().encode() + b"\0")
    digest.update(f"base\0{base_id}\0".encode())
    for name in sorted(build_args):
        digest.update(f"arg\0{name}={build_args[name]}\0".encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file() and p.suffix != ".whl"):
        digest.update(b"file\0" + str(path.relative_to(context)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\0")
    return digest.hexdigest()


def make_overlay(pristine: Path, patched: Path, dest: Path) -> tuple[list[str], list[str]]:
    """Copy the files of `patched` that differ from `pristine` under dest/files; list the removed ones in
    dest/deleted (paths relative to the tree: for a wheel, to site-packages). Returns both lists."""

    def files(root: Path) -> set[str]:
        return {
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.name != _MARKER
        }

    before, after = files(pristine), files(patched)
    changed = sorted(
        f for f in after if f not in before or not filecmp.cmp(pristine / f, patched / f, shallow=False)
    )
    deleted = sorted(before - after)
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "files").mkdir(parents=True)
    for rel in changed:
        target = dest / "files" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(patched / rel, target)
    (dest / "deleted").write_text("".join(f"{f}\n" for f in deleted), encoding="utf-8")
    return changed, deleted


# -- reading the engine's output (pure) ----------------------------------------------------------------------

_STEP = re.compile(r"^#(\d+) (\[.+)$")
_STEP_LINE = re.compile(r"^#(\d+) (?:\d+\.\d+ )?(.*)$")
_STEP_ERROR = re.compile(r"^#(\d+) ERROR: (.*)$")
_STEP_STATUS = re.compile(r"^(?:sha256:[0-9a-f]+|DONE [0-9.]+s|CACHED)$")
_DISK_FULL = re.compile(r"no space left on device", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class BuildFailure:
    #: The failing instruction as BuildKit names it, e.g. "[torch 1/1] RUN ... pip install ...".
    step: str
    #: BuildKit's one-line reason, e.g. "executor failed running [...]: exit code: 1".
    reason: str
    #: The last lines that step printed.
    tail: tuple[str, ...]
    disk_full: bool


def parse_build_failure(output: str) -> BuildFailure:
    """Which step of a `docker build --progress=plain` failed, why, and the last lines it printed."""
    lines = output.splitlines()
    titles: dict[str, str] = {}
    failed: tuple[str, str] | None = None
    for line in lines:
        if m := _STEP.match(line):
            titles.setdefault(m[1], m[2])
        elif (m := _STEP_ERROR.match(line)) and failed is None:
            failed = (m[1], m[2])
    disk_full = bool(_DISK_FULL.search(output))
    if failed is None:
        tail = tuple(line for line in lines if line.strip())[-_TAIL:]
        reason = next((line for line in reversed(lines) if line.lower().startswith(("error", "failed"))), "")
        return BuildFailure(step="(before any build step)", reason=reason, tail=tail, disk_full=disk_full)
    number, reason = failed
    own = []
    for line in lines:
        if _STEP.match(line) or _STEP_ERROR.match(line):
            continue
        m = _STEP_LINE.match(line)
        if m and m[1] == number and not _STEP_STATUS.match(m[2]):
            own.append(m[2])
    title = titles.get(number, f"step #{number}")
    return BuildFailure(step=title[:200], reason=reason, tail=tuple(own[-_TAIL:]), disk_full=disk_full)


def parse_loaded_image(output: str) -> str | None:
    """The image `docker load` printed: "Loaded image: name:tag" or "Loaded image ID: sha256:..."."""
    found = None
    for line in output.splitlines():
        if line.startswith("Loaded image: "):
            return line.removeprefix("Loaded image: ").strip()
        if line.startswith("Loaded image ID: "):
            found = line.removeprefix("Loaded image ID: ").strip()
    return found


# -- the engine ----------------------------------------------------------------------------------------------


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
class Mount:
    source: Path
    target: str
    read_only: bool = True


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """What one container gets. GPU runs add --gpus all, --ipc=host (docker then ignores --shm-size: the
    host's /dev/shm is used) and the ulimits; other runs get a private /dev/shm of `shm_size`."""

    image: str
    argv: tuple[str, ...]
    mounts: tuple[Mount, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    gpus: bool = False
    ipc_host: bool = True
    shm_size: str = DEFAULT_SHM_SIZE
    ulimits: tuple[tuple[str, str], ...] = ()
    network: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    #: uid[:gid] to run as; None keeps the image's unprivileged user.
    user: str | None = None


def _mount_arg(mount: Mount) -> str:
    for part in (str(mount.source), mount.target):
        # `--mount` is comma-separated key=value: a comma or newline in a path would add keys.
        if "," in part or "\n" in part:
            raise DockerError(f"cannot mount {part!r}: a path with a comma or newline; move it")
    arg = f"type=bind,source={mount.source},target={mount.target}"
    return arg + (",readonly" if mount.read_only else "")


def create_argv(executable: str, spec: ContainerSpec, name: str) -> list[str]:
    """`docker create` for a suite run. No --privileged and no engine socket, ever; no new privileges."""
    argv = [executable, "create", "--name", name, "--init", "--security-opt", "no-new-privileges"]
    for key, value in (*spec.labels, (LABEL_RUN, name)):
        argv += ["--label", f"{key}={value}"]
    for mount in spec.mounts:
        argv += ["--mount", _mount_arg(mount)]
    for key, value in spec.env:
        argv += ["--env", f"{key}={value}"]
    if spec.network is not None:
        argv += ["--network", spec.network]
    if spec.user is not None:
        if not re.fullmatch(r"[0-9]+(?::[0-9]+)?", spec.user):
            raise DockerError(f"user {spec.user!r} is not uid or uid:gid")
        argv += ["--user", spec.user]
    if spec.gpus:
        argv += ["--gpus", "all"]
        argv += ["--ipc=host"] if spec.ipc_host else ["--shm-size", validate_shm_size(spec.shm_size)]
        for key, value in spec.ulimits:
            argv += ["--ulimit", f"{key}={value}"]
    else:
        argv += ["--shm-size", validate_shm_size(spec.shm_size)]
    return [*argv, validate_image_ref(spec.image), *spec.argv]


def build_argv(
    executable: str,
    *,
    dockerfile: Path,
    context: Path,
    tag: str,
    build_args: Mapping[str, str],
    labels: Mapping[str, str],
    secrets: Mapping[str, Path] = {},
    target: str | None = None,
) -> list[str]:
    argv = [
        executable,
        "build",
        "--progress=plain",
        "--file",
        str(dockerfile),
        "--tag",
        validate_image_ref(tag),
    ]
    for key, value in validate_build_args(build_args).items():
        argv += ["--build-arg", f"{key}={value}"]
    for key, value in sorted(labels.items()):
        argv += ["--label", f"{key}={value}"]
    for key, path in sorted(secrets.items()):
        # Credentials reach RUN steps as BuildKit secrets: never in a layer, an ARG or the image's history.
        argv += ["--secret", f"id={key},src={path}"]
    if target is not None:
        argv += ["--target", target]
    return [*argv, str(context)]


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
        out = self._call([self.executable, "image", "inspect", "--format", "{{.Id}}", ref], timeout=60)
        return out.output.strip() if out.returncode == 0 else None

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


def _pin(pin: str) -> tuple[str, str]:
    name, sep, version = pin.partition("==")
    if not sep:
        raise DockerError(f"tool {pin!r} is not pinned like name==version")
    return name, version


def _version(text: str) -> Version:
    # Debian's "20.10.24+dfsg1" is a valid local version; "28.2.2-rd" style suffixes are cut off first.
    match = re.match(r"\d+(?:\.\d+)*", text)
    return Version(match[0]) if match else Version("0")


# -- the backend ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CellImage:
    tag: str
    digest: str
    built: bool
    seconds: float


class DockerBackend:
    """Realises a cell as an image (built once per set of inputs) and runs each suite in a fresh container."""

    name = "docker"
    needs_artifacts = True

    def __init__(
        self,
        cache: Cache,
        *,
        base: str = DEFAULT_BASE,
        shm_size: str = DEFAULT_SHM_SIZE,
        ulimits: Mapping[str, str | int] = DEFAULT_ULIMITS,
        ipc_host: bool = True,
        engine: DockerEngine | None = None,
        dockerfile: Path = DOCKERFILE,
        stackfarm_src: Path = STACKFARM_SRC,
        tools: Sequence[str] = DEFAULT_TOOLS,
        tools_index: str = TOOLS_INDEX,
        netrc: Path | None = None,
        ca_bundle: Path | None = None,
        network: str | None = None,
        build_timeout: float = 3600,
    ) -> None:
        self.cache = cache
        self.base = base
        self.shm_size = validate_shm_size(shm_size)
        self.ulimits = validate_ulimits(ulimits)
        self.ipc_host = ipc_host
        self.engine = engine or DockerEngine()
        self.dockerfile = dockerfile
        self.stackfarm_src = stackfarm_src
        self.tools = tuple(tools)
        self.tools_index = tools_index
        self.netrc = netrc
        #: Extra CAs the build trusts (a TLS-intercepting proxy's); STACKFARM_CA_BUNDLE names one too.
        env_ca = os.environ.get("STACKFARM_CA_BUNDLE")
        self.ca_bundle = ca_bundle or (Path(env_ca) if env_ca else None)
        if self.ca_bundle is not None and not self.ca_bundle.is_file():
            raise DockerError(f"CA bundle {self.ca_bundle} does not exist")
        self.network = network
        self.build_timeout = build_timeout
        #: The image of each cell realised by this backend, for run_suite (which is given only the spec path).
        self.images: dict[str, CellImage] = {}
        self._bases: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    # -- realise

    def realise(
        self, cell: Cell, artifacts: Mapping[Component, Artifact], workdir: Path, progress: Progress
    ) -> tuple[InstalledComponent, ...]:
        start = time.monotonic()
        info = self.engine.check()
        python = cell["python"]
        site = site_packages(python)
        installed = tuple(
            InstalledComponent(
                axis=comp.axis,
                distribution=comp.distribution,
                version=comp.version,
                filename=art.filename,
                sha256=art.sha256,
                source=art.source,
                root=site,
            )
            for comp, art in artifacts.items()
        )
        progress("docker: base image")
        base, base_id = self._base(base_for(self.base, cell.as_dict()))
        overlay, changed = self._overlay(artifacts, workdir, progress)
        record = CellSpec(
            id=cell.id,
            values=cell.as_dict(),
            backend=self.name,
            components=installed,
            patch_sets=tuple({"name": name} for name in cell.patch_sets),
            patched_files=tuple(f for f in changed if not f.startswith(".")),
        )
        context = workdir / "docker-context"
        write_context(
            context,
            artifacts=artifacts,
            tools=self._tools(python),
            record=record,
            overlay=overlay,
            local_blob=self.cache.fetch,
            ca_bundle=self.ca_bundle,
        )
        build_args = validate_build_args({"BASE": base, "PYTHON": python})
        digest = context_digest(self.dockerfile.read_bytes(), context, build_args, base_id)
        tag = image_name(cell.id, digest)
        if self.engine.image_id(tag) is not None:
            self.images[cell.id] = CellImage(
                tag=tag, digest=digest, built=False, seconds=time.monotonic() - start
            )
            progress(f"docker: {tag} exists")
            return installed
        self._check_space(info, artifacts)
        progress(f"docker: build {tag}")
        self.engine.build(
            dockerfile=self.dockerfile,
            context=context,
            tag=tag,
            build_args=build_args,
            labels={LABEL_CELL: cell.id, LABEL_INPUTS: digest},
            secrets={"netrc": self.netrc} if self.netrc else {},
            log=workdir / "docker-build.log",
            timeout=self.build_timeout,
        )
        self.images[cell.id] = CellImage(tag=tag, digest=digest, built=True, seconds=time.monotonic() - start)
        return installed

    def _base(self, base: str) -> tuple[str, str]:
        """(name, image id) of the base, loading a tarball or importing a rootfs folder once per process."""
        with self._lock:
            if base in self._bases:
                return self._bases[base]
            if is_base_path(base):
                path = Path(base).expanduser().resolve()
                if path.is_dir():
                    stamp = hash_listing(path)
                    ref = f"stackfarm-rootfs:{stamp[:16]}"
                    if self.engine.image_id(ref) is None:
                        self.engine.import_rootfs(path, ref, self.cache.root / "tmp")
                elif path.is_file():
                    ref = self.engine.load(path)
                else:
                    raise DockerError(f"[docker] base {base}: no such file or folder")
            else:
                ref = base
                if self.engine.image_id(ref) is None:
                    self.engine.pull(ref)
            image_id = self.engine.image_id(ref)
            if image_id is None:
                raise DockerError(f"base image {ref} is missing from the engine after loading it")
            self._bases[base] = (ref, image_id)
            return ref, image_id

    def _tools(self, python: str) -> list[Artifact]:
        """The suites' tools as exact wheels, looked up on the index once and remembered."""
        key = hashlib.sha256(json.dumps([self.tools_index, python, self.tools]).encode()).hexdigest()[:32]
        memo = self.cache.root / "resolved" / f"docker-tools-{key}.json"
        if memo.is_file():
            return [Artifact(**a) for a in json.loads(memo.read_text(encoding="utf-8"))]
        source = Source(name="pypi", url=self.tools_index)
        # The tools are pure-Python wheels; any manylinux target accepts py3-none-any.
        target = Target(python=python, platform="manylinux_2_17_x86_64")
        found = [find_artifact(source, *_pin(pin), target) for pin in self.tools]
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps([dataclasses.asdict(a) for a in found]), encoding="utf-8")
        tmp.replace(memo)
        return found

    def _overlay(
        self, artifacts: Mapping[Component, Artifact], workdir: Path, progress: Progress
    ) -> tuple[Path | None, list[str]]:
        """The files the runner's patch step changed in the cell's sglang tree (workdir/PATCHED_SGLANG, made by
        the same `patches` code the local backend relies on), as an overlay for the image's patch layer."""
        patched = workdir / PATCHED_SGLANG
        if not patched.is_dir():
            return None, []
        sglang = next((a for c, a in artifacts.items() if c.distribution == "sglang"), None)
        if sglang is None:
            raise DockerError(f"{patched} exists but the cell has no sglang component")
        progress("docker: patch layer")
        pristine = self.cache.unpacked(sglang) or self.cache.unpack(sglang)
        # The patched tree hard-links every file it did not change, so comparing is mostly stat calls (~0.4 s).
        # Its marker file comes along: site-packages then records what was applied, as the local tree does.
        changed, _ = make_overlay(pristine, patched, workdir / "docker-patch-overlay")
        return workdir / "docker-patch-overlay", changed

    def _check_space(self, info: EngineInfo, artifacts: Mapping[Component, Artifact]) -> None:
        """Refuse a build that cannot fit before spending minutes on it: wheels unpack to about twice their
        size, and pip keeps a copy in its cache."""
        root = Path(info.root_dir)
        if not info.root_dir or not root.is_dir():
            return  # a remote engine: its disk is not ours to measure
        need = 3 * sum(a.size or 0 for a in artifacts.values())
        free = shutil.disk_usage(root).free
        if need and free < need:
            raise DiskFullError(
                f"docker's data root {root} has {free / 2**30:.1f} GiB free; this cell's build needs "
                f"about {need / 2**30:.1f} GiB\n  fix: `docker builder prune`, `docker image prune`, "
                "or a larger disk"
            )

    # -- run

    def container_spec(self, host: CellSpec) -> CellSpec:
        """The spec the suites see inside the container: every root in the image's site-packages, and GPU
        suites told why they cannot run when the host has a GPU but the engine cannot hand it over."""
        site = site_packages(host.values["python"])
        components = tuple(dataclasses.replace(c, root=site) for c in host.components)
        reason = host.no_gpu_reason
        if reason is None and not self.engine.check().gpu:
            reason = "the Docker engine has no NVIDIA runtime (install nvidia-container-toolkit)"
        return dataclasses.replace(host, components=components, backend=self.name, no_gpu_reason=reason)

    def properties(self, cell: Cell) -> dict[str, str]:
        """The image the cell ran in: `nox -s bundle` and qualification records name it."""
        image = self.images.get(cell.id)
        return {} if image is None else {"docker.image": image.tag, "docker.image_digest": image.digest}

    def run_suite(self, suite_dir: Path, spec: Path, junit: Path, timeout: float, log: Path) -> Outcome:
        host = load(spec)
        image = self.images.get(host.id)
        if image is None:
            raise DockerError(f"cell {host.id} was not realised by this Docker backend")
        inside = self.container_spec(host)
        container_spec = spec.parent / "docker" / "cell.json"
        container_spec.parent.mkdir(parents=True, exist_ok=True)
        inside.dump(container_spec)
        project = suite_dir.resolve().parent.parent
        suite = f"{PROJECT}/{suite_dir.resolve().relative_to(project)}"
        user = run_as()
        run = ContainerSpec(
            image=image.tag,
            argv=tuple(pytest_argv("python", suite, f"{OUT}/junit.xml")),
            mounts=(
                Mount(source=project, target=PROJECT),
                Mount(source=self.stackfarm_src, target=SRC),
                Mount(source=container_spec, target=RUN_SPEC),
            ),
            # A host uid has no home in the image: caches (pytest's, flashinfer's JIT) then go to /tmp.
            env=(
                ("STACKFARM_CELL", RUN_SPEC),
                ("PYTHONPATH", SRC),
                (SUITE_OUT_ENV, f"{OUT}/files"),
                *((("HOME", "/tmp"),) if user else ()),
            ),
            gpus=inside.no_gpu_reason is None,
            ipc_host=self.ipc_host,
            shm_size=self.shm_size,
            ulimits=self.ulimits,
            network=self.network,
            labels=((LABEL_CELL, host.id),),
            user=user,
        )
        # `cp DIR/.` copies the folder's contents (a suite's figures, e.g. throughput.json) beside the JUnit file.
        copy_out = {f"{OUT}/junit.xml": junit, f"{OUT}/files/.": junit.parent}
        return self.engine.run(run, timeout=timeout, log=log, copy_out=copy_out)


def run_as() -> str | None:
    """The host's uid:gid when it is not root, so mounted files the user can read are readable inside too;
    None (the image's unprivileged user) when stackfarm runs as root. Never root in a suite container."""
    uid = os.getuid()
    return None if uid == 0 else f"{uid}:{os.getgid()}"


def hash_listing(root: Path) -> str:
    """A cheap identity for a rootfs folder: names, sizes and mtimes of its entries (not their bytes)."""
    digest = hashlib.sha256(str(root).encode())
    for path in sorted(root.rglob("*")):
        try:
            st = path.lstat()
        except OSError:
            continue
        digest.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def engine_unavailable_reason(engine: DockerEngine | None = None) -> str | None:
    """None when a usable engine answers, else why not: for `--backend auto` to fall back with one line."""
    try:
        (engine or DockerEngine()).check()
    except EngineError as exc:
        return str(exc).splitlines()[0]
    return None


def bundle(cell_image_tag: str, out_path: Path, *, engine: DockerEngine | None = None) -> Path:
    """Write a cell's image as a tarball (`docker save`) for a runner without network; `docker load` reads it.

    `cell_image_tag` is the image tag (`DockerBackend.images[cell_id].tag` after realise), or a cell id when the
    engine holds exactly one stackfarm image of that cell: with several (another patch series, another
    Dockerfile) guessing would ship the wrong one, so they are listed instead."""
    engine = engine or DockerEngine()
    ref = cell_image_tag
    if engine.image_id(ref) is None:
        tagged = engine.images_labelled(LABEL_CELL, cell_image_tag)
        if not tagged:
            raise DockerError(
                f"no image {cell_image_tag!r} and no stackfarm image of a cell with that id; build it first: "
                f"nox -s matrix -- --backend docker --cells {cell_image_tag}"
            )
        if len(tagged) > 1:
            raise DockerError(
                f"{len(tagged)} images of cell {cell_image_tag}; name the one to bundle:\n    "
                + "\n    ".join(tagged)
            )
        ref = tagged[0]
    return engine.save(ref, out_path)


__all__ = [
    "CUDA_IMAGE_VERSIONS",
    "DEFAULT_BASE",
    "DEFAULT_SHM_SIZE",
    "DEFAULT_TOOLS",
    "DEFAULT_ULIMITS",
    "DOCKERFILE",
    "MIN_ENGINE",
    "STAGES",
    "BuildError",
    "BuildFailure",
    "CellImage",
    "ContainerSpec",
    "DiskFullError",
    "DockerBackend",
    "DockerEngine",
    "DockerError",
    "EngineError",
    "EngineInfo",
    "Mount",
    "base_for",
    "build_argv",
    "bundle",
    "context_digest",
    "create_argv",
    "cuda_image_version",
    "engine_unavailable_reason",
    "image_name",
    "is_base_path",
    "make_overlay",
    "parse_build_failure",
    "parse_loaded_image",
    "requirement_line",
    "site_packages",
    "validate_build_args",
    "validate_image_ref",
    "validate_shm_size",
    "validate_ulimits",
    "write_context",
]
