"""`DockerBackend`: the backend protocol (`stackfarm.backends.Backend`) over a Docker engine.

realise:    base image ─▶ patch overlay ─▶ build context (no wheels yet) ─▶ input hash ─▶ tag
            ──in the engine?──▶ done (a no-op costs one `docker image inspect`)
            ──in the registry ([docker] registry / STACKFARM_REGISTRY)?──▶ pull, check its inputs label: done
            └─ neither ──▶ the wheels from stackfarm's cache into the context ─▶ `docker build` (BuildKit,
               docker/Dockerfile, --cache-from the registry's newest image of the cell) ─▶ push (tag + latest)
            The build log (or what happened instead: "pulled <ref>, nothing built") is
            reports/<cell>/docker-build.log; the image's use is recorded in the cell's work dir
            (docker-image.json), which is what `stackfarm cache prune` reads to remove unused images.
run_suite:  create a container (project, stackfarm's src, cell.json: all read-only) ─▶ start, logs streamed
            ─▶ copy the JUnit file out ─▶ remove the container, whatever happened (engine.run)
properties: the image a cell ran in: its tag, its content id, and its registry digest when it has one
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import InvalidMarker, Marker

from ...artifacts import Artifact, Cache, Source, Target, find_artifact
from ...cellspec import CellSpec, InstalledComponent, load
from ...files import write_atomic
from ...plan import Cell, Component
from ...proc import Outcome
from ...verdict import BackendFacts
from .. import BACKENDS, PATCHED_SGLANG, SUITE_OUT_ENV, BackendOptions, Progress, pytest_argv, realised
from .base import DEFAULT_BASE, BaseImages, base_for, check_base_python
from .commands import ContainerSpec, Mount
from .common import (
    CACHE_TAG,
    DEFAULT_SHM_SIZE,
    LABEL_CELL,
    LABEL_INPUTS,
    OUT,
    PROJECT,
    REGISTRY_ENV,
    RUN_SPEC,
    SRC,
    DiskFullError,
    DockerError,
    RegistryError,
    site_packages,
    validate_build_args,
    validate_registry,
    validate_shm_size,
    validate_ulimits,
)
from .context import (
    DOCKERFILE,
    context_digest,
    context_wheels,
    image_name,
    make_overlay,
    place_wheels,
    write_context,
)
from .engine import DockerEngine, EngineInfo, ImageIdentity
from .images import BUILD_LOG, CellImage, ImageRecord, write_record

#: stackfarm's own sources, mounted into every container so suites import the same code as on the host.
STACKFARM_SRC = Path(__file__).resolve().parents[3]
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
    "junitparser==5.0.3",
    # Suites read matrix.toml (stackfarm.tomlread): the standard library's tomllib, tomli on Python 3.10.
    "tomli==2.5.0; python_version < '3.11'",
)
TOOLS_INDEX = "https://pypi.org/simple"

#: The keys `DockerBackend.properties` reports (the cell report's and the qualification record's).


@dataclass(frozen=True, kw_only=True)
class _Job:
    """One realise's image: its names, its inputs, and the log of what was done to make it exist."""

    cell: str
    tag: str
    digest: str
    build_args: Mapping[str, str]
    remote: str | None
    log: Path
    #: The log's lines so far (stackfarm's own, before the build's output).
    notes: list[str]


class DockerBackend:
    """Realises a cell as an image (built once per set of inputs) and runs each suite in a fresh container."""

    name = "docker"
    kind = BACKENDS["docker"]

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
        ca_bundle: Path | None = None,
        network: str | None = None,
        build_timeout: float = 3600,
        registry: str | None = None,
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
        #: Where cell images are shared: `host[:port][/prefix]`; STACKFARM_REGISTRY (a runner's) wins over
        #: matrix.toml's [docker] registry.
        env_registry = os.environ.get(REGISTRY_ENV, "").strip()
        chosen = env_registry or registry
        self.registry = (
            validate_registry(chosen, where=REGISTRY_ENV if env_registry else "[docker] registry")
            if chosen
            else None
        )
        #: Extra CAs the build trusts (a TLS-intercepting proxy's); STACKFARM_CA_BUNDLE names one too.
        env_ca = os.environ.get("STACKFARM_CA_BUNDLE")
        self.ca_bundle = ca_bundle or (Path(env_ca) if env_ca else None)
        if self.ca_bundle is not None and not self.ca_bundle.is_file():
            raise DockerError(f"CA bundle {self.ca_bundle} does not exist")
        self.network = network
        self.build_timeout = build_timeout
        #: The image of each cell realised by this backend, for run_suite (which is given only the spec path).
        self.images: dict[str, CellImage] = {}
        #: The reports folder (reports/<cell>/ gets docker-build.log at realise); None until a runner says:
        #: then the log is placed beside the cell's first suite report instead.
        self.reports: Path | None = None
        self._logs_placed: set[str] = set()
        self._bases = BaseImages(self.engine, cache.root / "tmp")

    # -- realise

    def realise(
        self, cell: Cell, artifacts: Mapping[Component, Artifact], workdir: Path, progress: Progress
    ) -> tuple[InstalledComponent, ...]:
        start = time.monotonic()
        info = self.engine.check()
        installed = self._installed(cell, artifacts)
        progress("docker: base image")
        wanted = base_for(self.base, cell.as_dict())
        check_base_python(wanted, cell["python"])  # the image's Python is the cell's, or nothing is built
        base, base_id = self._base(wanted)
        wheels = context_wheels(self._tools(cell["python"]), cell.as_dict(), artifacts)
        context = self._context(
            cell, artifacts=artifacts, installed=installed, wheels=wheels, workdir=workdir, progress=progress
        )
        build_args = validate_build_args({"BASE": base, "PYTHON": cell["python"]})
        digest = context_digest(self.dockerfile.read_bytes(), context, build_args, base_id)
        tag = image_name(cell.id, digest)
        job = _Job(
            cell=cell.id,
            tag=tag,
            digest=digest,
            build_args=build_args,
            remote=self.remote_ref(tag),
            log=workdir / BUILD_LOG,
            notes=[f"stackfarm: cell {cell.id}: image {tag} (inputs sha256:{digest})"],
        )
        self.images.pop(cell.id, None)
        self._logs_placed.discard(cell.id)
        try:
            found, pulled = self._provide(job, info, artifacts, progress, context=context, wheels=wheels)
            image = self._image(tag, digest, found, time.monotonic() - start)
            if job.remote is not None and not self._in_registry(tag, job.remote):
                # Built here, or built before the registry was configured: other runners pull it from now on.
                image = dataclasses.replace(image, repo_digest=self._push(tag, job.remote, job.log, progress))
        finally:
            if self.reports is not None and job.log.is_file():  # a failed build's log too
                write_atomic(self.reports / cell.id / BUILD_LOG, job.log.read_text(encoding="utf-8"))
                self._logs_placed.add(cell.id)
        self.images[cell.id] = dataclasses.replace(image, pulled=pulled, remote=job.remote, log=job.log)
        record = ImageRecord.of(cell.id, self.images[cell.id], local_tags=self._local_tags(tag, job.remote))
        write_record(workdir, record)
        return installed

    def _provide(
        self,
        job: _Job,
        info: EngineInfo,
        artifacts: Mapping[Component, Artifact],
        progress: Progress,
        *,
        context: Path,
        wheels: Mapping[str, list[Artifact]],
    ) -> tuple[ImageIdentity | None, bool]:
        """Make the image exist: found in the engine, pulled from the registry, or built. (The identity when it
        was found or pulled, None when built; whether it was pulled.)"""
        found = self.engine.image_identity(job.tag)
        if found is not None:
            self._say(progress, job, f"{job.tag} is in the engine already, nothing built")
            return found, False
        if job.remote is not None and self._pull(job):
            self._say(progress, job, f"pulled {job.remote}, nothing built")
            return self.engine.image_identity(job.tag), True
        self._check_space(info, artifacts)
        self._place_wheels(context, wheels, progress, job.notes)
        if job.remote is not None:
            job.notes.append(
                f"stackfarm: --cache-from {self._latest(job.remote)}: the layers of the newest image of this cell "
                "in the registry (a first build finds none, and BuildKit says it cannot import that manifest)"
            )
        progress(f"docker: build {job.tag}")
        self.engine.build(
            dockerfile=self.dockerfile,
            context=context,
            tag=job.tag,
            build_args=job.build_args,
            labels={LABEL_CELL: job.cell, LABEL_INPUTS: job.digest},
            secrets={},
            log=job.log,
            timeout=self.build_timeout,
            cache_from=(self._latest(job.remote),) if job.remote is not None else (),
            notes=job.notes,
        )
        return None, False

    # -- the registry

    def remote_ref(self, tag: str) -> str | None:
        """The cell image's name in the registry (the local tag under the registry's prefix), or None."""
        return f"{self.registry}/{tag}" if self.registry else None

    @staticmethod
    def _latest(remote: str) -> str:
        """The registry tag of the cell's newest image: the layers a changed input does not touch."""
        return f"{remote.rsplit(':', 1)[0]}:{CACHE_TAG}"

    def _in_registry(self, tag: str, remote: str) -> bool:
        """Whether the engine knows the image as pushed to (or pulled from) `remote`'s repository."""
        repository = remote.rsplit(":", 1)[0]
        identity = self.engine.image_identity(tag)
        return identity is not None and any(d.startswith(f"{repository}@") for d in identity.repo_digests)

    def _local_tags(self, tag: str, remote: str | None) -> tuple[str, ...]:
        if remote is None:
            return (tag,)
        return tuple(t for t in (tag, remote, self._latest(remote)) if self.engine.image_id(t) is not None)

    def _pull(self, job: _Job) -> bool:
        """Pull the cell's image when the registry has it; check it is what its tag says, tag it locally."""
        if job.remote is None:
            return False
        got, output = self.engine.pull_if_present(job.remote)
        if not got:
            job.notes.append(f"stackfarm: {job.remote} is not in the registry: building it (then pushing it)")
            return False
        labels = self.engine.labels(job.remote) or {}
        if labels.get(LABEL_INPUTS) != job.digest:
            raise RegistryError(
                f"{job.remote} in the registry is not the image of these inputs: its {LABEL_INPUTS} label is "
                f"{labels.get(LABEL_INPUTS)!r}, the cell's inputs hash to {job.digest}",
                fix="remove that tag from the registry (something else pushed it); stackfarm pushes it anew",
            )
        self.engine.tag(job.remote, job.tag)
        job.notes.extend(f"docker pull: {line}" for line in output.splitlines()[-2:] if line.strip())
        return True

    def _push(self, tag: str, remote: str, log: Path, progress: Progress) -> str | None:
        """Push a built image as `remote` and as the cell's latest; its registry digest."""
        progress(f"docker: push {remote}")
        pushed: str | None = None
        for ref in (remote, self._latest(remote)):
            self.engine.tag(tag, ref)
            try:
                digest, _ = self.engine.push(ref)
            except RegistryError as exc:
                self._append(log, f"stackfarm: push failed: {str(exc).splitlines()[0]}")
                raise
            pushed = pushed or digest
        self._append(log, f"stackfarm: pushed {remote} ({pushed or 'digest not reported'})")
        return pushed

    # -- the build log

    @staticmethod
    def _say(progress: Progress, job: _Job, line: str) -> None:
        progress(f"docker: {line}")
        job.notes.append(f"stackfarm: {line}")
        write_atomic(job.log, "".join(f"{n}\n" for n in job.notes))

    @staticmethod
    def _append(log: Path, line: str) -> None:
        before = log.read_text(encoding="utf-8") if log.is_file() else ""
        write_atomic(log, f"{before}{line}\n")

    def _place_log(self, cell_id: str, folder: Path) -> None:
        """reports/<cell>/docker-build.log: this realise's log, written there once (atomically)."""
        image = self.images.get(cell_id)
        if cell_id in self._logs_placed or image is None or image.log is None or not image.log.is_file():
            return
        write_atomic(folder / BUILD_LOG, image.log.read_text(encoding="utf-8", errors="replace"))
        self._logs_placed.add(cell_id)

    def _place_wheels(
        self, context: Path, wheels: Mapping[str, list[Artifact]], progress: Progress, notes: list[str]
    ) -> None:
        """Every wheel from stackfarm's cache (fetched only when the cache lacks it), into the context."""

        def blob(art: Artifact) -> Path:
            def report(done: int, total: int | None) -> None:
                name = art.distribution
                progress(
                    f"fetch {name} {100 * done // total}%" if total else f"fetch {name} {done >> 20} MiB"
                )

            path = self.cache.fetch(art, report)
            notes.append(f"stackfarm: wheel {art.filename} from the cache (sha256:{art.sha256})")
            return path

        progress("docker: wheels from the cache")
        place_wheels(context, wheels, blob)

    def _installed(
        self, cell: Cell, artifacts: Mapping[Component, Artifact]
    ) -> tuple[InstalledComponent, ...]:
        site = site_packages(cell["python"])
        return tuple(realised(comp, art, site) for comp, art in artifacts.items())

    def _context(
        self,
        cell: Cell,
        *,
        artifacts: Mapping[Component, Artifact],
        installed: tuple[InstalledComponent, ...],
        wheels: Mapping[str, list[Artifact]],
        workdir: Path,
        progress: Progress,
    ) -> Path:
        """Write the cell's build context (with its cell record and patch overlay) under workdir."""
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
        write_context(context, wheels=wheels, record=record, overlay=overlay, ca_bundle=self.ca_bundle)
        return context

    def _image(self, tag: str, digest: str, found: ImageIdentity | None, seconds: float) -> CellImage:
        identity = found or self.engine.image_identity(tag)
        if identity is None:
            raise DockerError(f"image {tag} is missing from the engine after building it")
        return CellImage(
            tag=tag,
            input_hash=digest,
            image_id=identity.id,
            repo_digest=identity.repo_digests[0] if identity.repo_digests else None,
            built=found is None,
            seconds=seconds,
        )

    def _base(self, base: str) -> tuple[str, str]:
        """(name, image id) of the base, loading a tarball or importing a rootfs folder once per process."""
        return self._bases.get(base)

    def _tools(self, python: str) -> list[Artifact]:
        """The suites' tools as exact wheels, looked up on the index once and remembered."""
        key = hashlib.sha256(json.dumps([self.tools_index, python, self.tools]).encode()).hexdigest()[:32]
        memo = self.cache.root / "resolved" / f"docker-tools-{key}.json"
        if memo.is_file():
            return [Artifact(**a) for a in json.loads(memo.read_text(encoding="utf-8"))]
        source = Source(name="pypi", url=self.tools_index)
        # The tools are pure-Python wheels; any manylinux target accepts py3-none-any.
        target = Target(python=python, platform="manylinux_2_17_x86_64")
        found = [find_artifact(source, *_pin(pin), target) for pin in self.tools if _applies(pin, python)]
        write_atomic(memo, json.dumps([dataclasses.asdict(a) for a in found]))
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

    # -- report

    def installed_pins(self) -> None:
        return None  # the stack is made from wheels: the plan reads sglang's pins from the index

    def facts(self, cell: Cell) -> BackendFacts:
        """The image the cell ran in, for its report and qualification record: its tag, its content id
        (`sha256:...`) and, for an image in a registry, its repo digest. Nothing for a cell this backend did
        not realise."""
        image = self.images.get(cell.id)
        if image is None:
            return BackendFacts()
        return BackendFacts(
            docker_image=image.tag, docker_image_digest=image.image_id, docker_repo_digest=image.repo_digest
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

    def run_suite(self, suite_dir: Path, spec: Path, junit: Path, timeout: float, log: Path) -> Outcome:
        host = load(spec)
        image = self.images.get(host.id)
        if image is None:
            raise DockerError(f"cell {host.id} was not realised by this Docker backend")
        self._place_log(host.id, junit.parent)  # the runner writes every suite's report to reports/<cell>/
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


def _applies(pin: str, python: str) -> bool:
    """Whether a tool's environment marker (``name==version; python_version < '3.11'``) holds in the cell."""
    marker = pin.partition(";")[2].strip()
    if not marker:
        return True
    try:
        return Marker(marker).evaluate({"python_version": python, "python_full_version": f"{python}.0"})
    except InvalidMarker as exc:
        raise DockerError(f"tool {pin!r}: {exc}") from None


def _pin(pin: str) -> tuple[str, str]:
    name, sep, version = pin.partition(";")[0].strip().partition("==")
    if not sep:
        raise DockerError(f"tool {pin!r} is not pinned like name==version")
    return name, version


def make(cache: Cache, options: BackendOptions) -> DockerBackend:
    """The Docker backend for matrix.toml's [docker] table (`options.docker`); STACKFARM_DOCKER_BASE overrides its
    base (CI's local image); the image's own tools come from the matrix's default index (`options.index_url`);
    each cell's build log is kept in the run's reports folder (`options.reports`: a failed build's too, which no
    suite report would carry)."""
    table = dict(options.docker or {})
    base = os.environ.get("STACKFARM_DOCKER_BASE") or str(table.pop("base", DEFAULT_BASE))
    table.pop("base", None)
    if "ca_bundle" in table:
        table["ca_bundle"] = Path(table["ca_bundle"])
    if options.index_url:
        table["tools_index"] = options.index_url
    backend = DockerBackend(cache, base=base, **table)
    backend.reports = options.reports
    return backend


__all__ = [
    "DEFAULT_TOOLS",
    "DEFAULT_ULIMITS",
    "STACKFARM_SRC",
    "TOOLS_INDEX",
    "CellImage",
    "DockerBackend",
    "make",
    "run_as",
]
