"""docker.base: the cell's base image from the [docker] template, and making it exist in a real engine from a
registry name, a tarball (`docker load`, of an image `bundle` wrote) or a rootfs folder (`docker import`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stackfarm.artifacts import Cache
from stackfarm.backends import docker as dk
from stackfarm.backends.docker import DockerBackend, DockerError
from stackfarm.backends.docker.base import DEFAULT_BASE, base_for, hash_listing
from stackfarm.backends.docker.engine import DockerEngine
from stackfarm.dockergrammar import is_base_path
from test_docker_support import local_base, real_engine, tree


def test_base_for_fills_in_the_image_cuda_version() -> None:
    assert base_for(DEFAULT_BASE, {"cuda": "12.8"}) == "nvidia/cuda:12.8.1-devel-ubuntu24.04"
    assert base_for(DEFAULT_BASE, {"cuda": "13.0"}) == "nvidia/cuda:13.0.1-devel-ubuntu24.04"
    assert base_for(DEFAULT_BASE, {"cuda": "12.8.0"}) == "nvidia/cuda:12.8.0-devel-ubuntu24.04"
    assert base_for("stackfarm-base:bookworm", {"cuda": "12.8"}) == "stackfarm-base:bookworm"
    assert base_for("/srv/bases/cuda.tar", {"cuda": "12.8"}) == "/srv/bases/cuda.tar"
    with pytest.raises(DockerError, match=r"no nvidia/cuda image version known for CUDA 11\.2"):
        base_for(DEFAULT_BASE, {"cuda": "11.2"})
    with pytest.raises(DockerError, match="only placeholder"):
        base_for("nvidia/cuda:{torch}", {"cuda": "12.8"})


def test_base_paths_are_told_from_names() -> None:
    assert is_base_path("/srv/bases/cuda.tar")
    assert is_base_path("./rootfs")
    assert is_base_path("cuda.tgz")
    assert not is_base_path("nvidia/cuda:12.8.1-devel-ubuntu24.04")


def test_rootfs_identity_follows_its_listing(tmp_path: Path) -> None:
    root = tree(tmp_path / "rootfs", {"etc/a": "1\n"})
    before = hash_listing(root)
    assert hash_listing(root) == before
    (root / "etc" / "b").write_text("2\n")
    assert hash_listing(root) != before


@pytest.fixture(scope="module")
def engine() -> DockerEngine:
    return real_engine()


@pytest.fixture(scope="module")
def base(engine: DockerEngine) -> str:
    return local_base(engine)


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
    rootfs = tree(tmp_path / "rootfs", {"etc/stackfarm-test": "imported\n"})
    ref, image_id = backend._base(str(rootfs))
    try:
        assert ref.startswith("stackfarm-rootfs:")
        assert image_id.startswith("sha256:")
        assert backend._base(str(rootfs)) == (ref, image_id)
    finally:
        subprocess.run([engine.executable, "rmi", ref], capture_output=True, check=False)
