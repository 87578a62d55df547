"""docker.engine: DockerEngine against stand-in `docker` commands (the checks, a failing build, inspect, pulls),
the copy-out archive rules and the SDK's errors without an engine, and against the real engine behind
`@pytest.mark.docker` (container runs through the Docker SDK: logs streamed, reports copied out, timeouts and
stops that leave no container; a failing build step)."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
import tarfile
import textwrap
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stackfarm import proc
from stackfarm.backends import docker as dk
from stackfarm.backends.docker import engine as engine_module
from stackfarm.backends.docker.commands import ContainerSpec, Mount
from stackfarm.backends.docker.common import BuildError, DiskFullError, EngineError, RegistryError
from stackfarm.backends.docker.context import DOCKERFILE
from stackfarm.backends.docker.engine import MIN_ENGINE, DockerEngine, ImageIdentity, _extract, _version
from stackfarm.errors import EnvironmentProblem, ExitCode
from test_docker_commands import BUILDKIT_20_10, BUILDKIT_BUILDX
from test_docker_support import TEST_LABEL, leftovers, local_base, real_engine

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
        dockerfile=DOCKERFILE,
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
    assert not isinstance(info.value, DiskFullError)
    assert "executor failed running" in (tmp_path / "build.log").read_text()


def test_full_disk_during_build_says_how_to_free_space(tmp_path: Path) -> None:
    with pytest.raises(DiskFullError, match=r"disk is full \(/var/lib/docker\)[\s\S]*docker builder prune"):
        _build(_fake_build(tmp_path, BUILDKIT_BUILDX, 1), tmp_path)


def test_interrupted_build_is_not_reported_as_a_failing_step(tmp_path: Path) -> None:
    canceled = "#9 [kernels 1/1] RUN pip install\n#9 7.9 Downloading sglang_kernel (352.1 MB)\n#9 CANCELED\n"
    with pytest.raises(BuildError, match="was interrupted; nothing was tagged"):
        _build(_fake_build(tmp_path, canceled + "context canceled\n", 1), tmp_path)


def test_image_identity_reads_the_id_and_the_repo_digests(tmp_path: Path) -> None:
    fake = _fake_docker(tmp_path / "bin", client="20.10.24", server="20.10.24")
    pulled = f'sha256:{"1" * 64} ["nvidia/cuda@sha256:{"2" * 64}"]'
    script = fake.read_text().replace(
        "esac",
        f"""  image) case "$5" in
      pulled) echo '{pulled}' ;;
      built) echo 'sha256:{"3" * 64} []' ;;
      *) echo "Error: No such image: $5" >&2; exit 1 ;;
    esac ;;
esac""",
    )
    fake.write_text(script)
    engine = DockerEngine(str(fake))
    assert engine.image_identity("pulled") == ImageIdentity(
        id=f"sha256:{'1' * 64}", repo_digests=(f"nvidia/cuda@sha256:{'2' * 64}",)
    )
    assert engine.image_identity("built") == ImageIdentity(id=f"sha256:{'3' * 64}")
    assert engine.image_identity("missing") is None


def test_registry_answers_are_told_apart(tmp_path: Path) -> None:
    """`pull_if_present`: a registry that has no such image means "build it"; one that does not answer is an
    environment error naming the registry and what to check."""
    fake = _fake_docker(tmp_path / "bin", client="20.10.24", server="20.10.24")
    script = fake.read_text().replace(
        "esac",
        """  pull) case "$2" in
      */missing:*) echo 'Error response from daemon: manifest for x not found: manifest unknown' >&2; exit 1 ;;
      */there:*) echo 'Status: Downloaded newer image'; exit 0 ;;
      *) echo 'Error response from daemon: Get "http://10.0.0.1:5000/v2/": dial tcp: connection refused' >&2
         exit 1 ;;
    esac ;;
esac""",
    )
    fake.write_text(script)
    engine = DockerEngine(str(fake))
    assert engine.pull_if_present("127.0.0.1:5000/stackfarm/there:1")[0]
    assert not engine.pull_if_present("127.0.0.1:5000/stackfarm/missing:1")[0]
    with pytest.raises(RegistryError, match=r"could not pull .*connection refused") as info:
        engine.pull_if_present("10.0.0.1:5000/stackfarm/cell:1")
    assert isinstance(info.value, EnvironmentProblem)
    assert info.value.exit_code == ExitCode.ENVIRONMENT
    assert "curl http://10.0.0.1:5000/v2/" in str(info.value)


def test_engine_errors_are_environment_problems(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No engine behind DOCKER_HOST: the SDK's failure is an EngineError (exit 4) saying how to fix it."""
    pytest.importorskip("docker", reason="the Docker SDK for Python (a stackfarm dependency) is missing")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(EngineError, match=r"cannot reach the engine[\s\S]*start dockerd") as info:
        DockerEngine("docker").sdk()
    assert info.value.exit_code == ExitCode.ENVIRONMENT


def test_a_docker_folder_is_no_sdk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This repository's docker/ folder imports as a namespace package where the SDK is not installed:
    `--backend auto` then says the SDK is missing instead of failing later."""
    fake = types.ModuleType("docker")
    fake.__path__ = [str(tmp_path / "docker")]
    monkeypatch.setitem(sys.modules, "docker", fake)
    reason = engine_module.sdk_missing_reason()
    assert reason is not None
    assert reason.startswith("the Docker SDK for Python is missing")
    with pytest.raises(EngineError, match="pip install docker"):
        DockerEngine("docker").sdk()


def _archive(members: dict[str, bytes | str | None]) -> io.BytesIO:
    """A tar like the engine's GET /archive: bytes are files, None a folder, a str a symlink to it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def test_copy_out_follows_docker_cp_and_refuses_what_climbs_out(tmp_path: Path) -> None:
    _extract(_archive({"junit.xml": b"<x/>"}), "junit.xml", tmp_path / "out" / "j.xml", "/o/junit.xml")
    assert (tmp_path / "out" / "j.xml").read_bytes() == b"<x/>"
    archive = _archive(
        {
            "files": None,
            "files/a.json": b"{}",
            "files/sub": None,
            "files/sub/b": b"b",
            "files/link": "/etc/shadow",
        }
    )
    _extract(archive, "files", tmp_path / "reports", "/o/files/.")
    assert (tmp_path / "reports" / "a.json").read_bytes() == b"{}"
    assert (tmp_path / "reports" / "sub" / "b").read_bytes() == b"b"
    assert not (tmp_path / "reports" / "link").exists()  # a link a suite left is not followed, not copied
    for bad in ("files/../../escape", "/abs", "other/x"):
        with pytest.raises(dk.DockerError, match="outside it"):
            _extract(_archive({"files": None, bad: b"x"}), "files", tmp_path / "r2", "/o/files/.")
    assert not (tmp_path / "escape").exists()


@pytest.fixture(scope="module")
def engine() -> DockerEngine:
    return real_engine()


@pytest.fixture(scope="module")
def base(engine: DockerEngine) -> str:
    return local_base(engine)


@pytest.mark.docker
def test_real_engine_is_new_enough(engine: DockerEngine) -> None:
    info = engine.check()
    assert _version(info.server) >= MIN_ENGINE


@pytest.mark.docker
def test_run_copies_reports_out_and_removes_the_container(
    engine: DockerEngine, base: str, tmp_path: Path
) -> None:
    spec = ContainerSpec(
        image=base,
        argv=("sh", "-c", "id -u > /tmp/junit.xml; echo ran; exit 3"),
        user="4321",
        labels=(TEST_LABEL,),
    )
    out = engine.run(
        spec, timeout=120, log=tmp_path / "log", copy_out={"/tmp/junit.xml": tmp_path / "junit.xml"}
    )
    assert out.returncode == 3
    assert "ran" in out.output
    assert (tmp_path / "junit.xml").read_text().strip() == "4321"
    assert "ran" in (tmp_path / "log").read_text()
    assert leftovers(engine) == []


@pytest.mark.docker
def test_a_folder_is_copied_out_with_its_contents(engine: DockerEngine, base: str, tmp_path: Path) -> None:
    spec = ContainerSpec(
        image=base,
        argv=(
            "sh",
            "-c",
            "mkdir -p /tmp/o/files/sub && echo 1 > /tmp/o/files/a.json && echo 2 > /tmp/o/files/sub/b",
        ),
        labels=(TEST_LABEL,),
    )
    out = engine.run(
        spec,
        timeout=120,
        log=tmp_path / "log",
        copy_out={"/tmp/o/files/.": tmp_path / "reports", "/tmp/o/missing.xml": tmp_path / "missing.xml"},
    )
    assert out.returncode == 0, out.output
    assert (tmp_path / "reports" / "a.json").read_text() == "1\n"
    assert (tmp_path / "reports" / "sub" / "b").read_text() == "2\n"
    assert not (tmp_path / "missing.xml").exists()  # not there: the caller sees no file and says so
    assert leftovers(engine) == []


def _running(
    engine: DockerEngine, spec: ContainerSpec, log: Path, timeout: float
) -> tuple[threading.Thread, dict[str, object]]:
    """engine.run in a thread; its Outcome or exception lands in the dict."""
    result: dict[str, object] = {}

    def target() -> None:
        try:
            result["outcome"] = engine.run(spec, log=log, timeout=timeout)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def _wait_for(predicate: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


@pytest.mark.docker
def test_logs_stream_into_the_log_while_the_container_runs(
    engine: DockerEngine, base: str, tmp_path: Path
) -> None:
    """A long suite can be followed: its first line is in the log while it still runs (it waits for a file
    this test writes only after reading that line)."""
    gate = tmp_path / "gate"
    gate.mkdir()
    spec = ContainerSpec(
        image=base,
        argv=("sh", "-c", "echo first-line; while [ ! -e /gate/go ]; do sleep 0.1; done; echo second-line"),
        mounts=(Mount(source=gate, target="/gate"),),
        labels=(TEST_LABEL,),
    )
    log = tmp_path / "suite.log"
    thread, result = _running(engine, spec, log, timeout=120)

    def body() -> list[str]:  # the log after its "+ docker run ..." line
        return log.read_text().splitlines()[1:] if log.is_file() else []

    try:
        _wait_for(lambda: "first-line" in body(), "the first line in the log")
        assert thread.is_alive()
        assert body() == ["first-line"]
    finally:
        (gate / "go").write_text("")
        thread.join(120)
    outcome = result["outcome"]
    assert isinstance(outcome, proc.Outcome)
    assert outcome.returncode == 0
    assert outcome.output.split() == ["first-line", "second-line"]
    assert log.read_text().splitlines()[0].startswith(f"+ docker run {base} sh -c")
    assert leftovers(engine) == []


@pytest.fixture
def stop_flag() -> Iterator[None]:
    """proc.STOP is the process's: cleared again whatever the test did."""
    yield
    proc.STOP.clear()


@pytest.mark.docker
def test_a_stopped_run_kills_and_removes_its_container(
    engine: DockerEngine, base: str, tmp_path: Path, stop_flag: None
) -> None:
    spec = ContainerSpec(image=base, argv=("sh", "-c", "echo started; sleep 300"), labels=(TEST_LABEL,))
    log = tmp_path / "log"
    thread, result = _running(engine, spec, log, timeout=600)
    _wait_for(lambda: log.is_file() and "started" in log.read_text(), "the container to start")
    assert len(leftovers(engine)) == 1
    proc.STOP.set()  # what the run's Ctrl-C / SIGTERM handler sets (proc.stop)
    thread.join(60)
    assert not thread.is_alive()
    assert isinstance(result.get("error"), proc.Stopped)
    assert "killed and removed" in str(result["error"])
    assert leftovers(engine) == []
    with pytest.raises(proc.Stopped):  # and no new container starts while the run stops
        engine.run(spec, timeout=10, log=log)
    assert leftovers(engine) == []


@pytest.mark.docker
def test_timed_out_run_leaves_no_container(engine: DockerEngine, base: str, tmp_path: Path) -> None:
    spec = ContainerSpec(image=base, argv=("sh", "-c", "echo before; sleep 60"), labels=(TEST_LABEL,))
    out = engine.run(spec, timeout=3, log=tmp_path / "log")
    assert out.timed_out
    assert out.returncode == 124
    assert "before" in out.output
    assert leftovers(engine) == []


@pytest.mark.docker
def test_engine_errors_name_the_image(engine: DockerEngine, tmp_path: Path) -> None:
    spec = ContainerSpec(image="stackfarm-test/no-such-image:1", argv=("true",), labels=(TEST_LABEL,))
    with pytest.raises(
        dk.DockerError, match=r"could not start a container of stackfarm-test/no-such-image:1"
    ):
        engine.run(spec, timeout=30, log=tmp_path / "log")
    assert leftovers(engine) == []


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
    assert engine.remove_containers() == 0  # a build creates no container of ours


@pytest.mark.docker
def test_real_image_identity_is_what_inspect_says(engine: DockerEngine, base: str) -> None:
    identity = engine.image_identity(base)
    assert identity is not None
    assert identity.id == engine.image_id(base)
    assert identity.id.startswith("sha256:")
    assert engine.image_identity("stackfarm-test/no-such-image:1") is None
