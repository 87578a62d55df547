"""docker.engine: DockerEngine against stand-in `docker` commands (the checks, a failing build, inspect), and
against the real engine behind `@pytest.mark.docker` (runs, timeouts, a failing build step)."""

from __future__ import annotations

import json
import os
import stat
import textwrap
from pathlib import Path

import pytest

from stackfarm.backends import docker as dk
from stackfarm.backends.docker import BuildError, ContainerSpec, DockerEngine, EngineError
from stackfarm.backends.docker.engine import _version
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
    assert engine.image_identity("pulled") == dk.ImageIdentity(
        id=f"sha256:{'1' * 64}", repo_digests=(f"nvidia/cuda@sha256:{'2' * 64}",)
    )
    assert engine.image_identity("built") == dk.ImageIdentity(id=f"sha256:{'3' * 64}")
    assert engine.image_identity("missing") is None


@pytest.fixture(scope="module")
def engine() -> DockerEngine:
    return real_engine()


@pytest.fixture(scope="module")
def base(engine: DockerEngine) -> str:
    return local_base(engine)


@pytest.mark.docker
def test_real_engine_is_new_enough(engine: DockerEngine) -> None:
    info = engine.check()
    assert _version(info.server) >= dk.MIN_ENGINE


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
def test_timed_out_run_leaves_no_container(engine: DockerEngine, base: str, tmp_path: Path) -> None:
    spec = ContainerSpec(image=base, argv=("sleep", "60"), labels=(TEST_LABEL,))
    out = engine.run(spec, timeout=3, log=tmp_path / "log")
    assert out.timed_out
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
