"""docker.common: the validation of every value bound for a `docker` command line, and the image's paths."""

from __future__ import annotations

import re

import pytest

from stackfarm.backends.docker import DockerError
from stackfarm.backends.docker.common import (
    site_packages,
    validate_build_args,
    validate_image_ref,
    validate_shm_size,
    validate_ulimits,
)


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
    assert validate_image_ref(ref) == ref


@pytest.mark.parametrize(
    "ref", ["nvidia/cuda:12.8; rm -rf /", "Nvidia/cuda:1", "cuda:$(id)", "a b", "", "cuda:`id`", "-flag"]
)
def test_image_refs_rejected(ref: str) -> None:
    with pytest.raises(DockerError, match="not a valid image reference"):
        validate_image_ref(ref)


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
        validate_build_args(args)


def test_build_args_accepted_unchanged() -> None:
    args = {
        "BASE": "nvidia/cuda:12.8.1-devel-ubuntu24.04",
        "PYTHON": "3.12",
        "PYTHON_PPA": "ppa:deadsnakes/ppa",
    }
    assert validate_build_args(args) == args


def test_ulimits_and_shm_size() -> None:
    assert validate_ulimits({"stack": 67108864, "memlock": "-1"}) == (
        ("memlock", "-1"),
        ("stack", "67108864"),
    )
    assert validate_ulimits({"nofile": "1024:4096"}) == (("nofile", "1024:4096"),)
    with pytest.raises(DockerError, match="unknown limit"):
        validate_ulimits({"memlocks": "-1"})
    with pytest.raises(DockerError, match="soft:hard"):
        validate_ulimits({"stack": "64m"})
    assert validate_shm_size("16g") == "16g"
    for bad in ("16 g", "16gb", "-1", "0"):
        with pytest.raises(DockerError, match="shm_size"):
            validate_shm_size(bad)


def test_site_packages_is_the_venvs_for_the_cells_python() -> None:
    assert site_packages("3.12") == "/opt/stackfarm/venv/lib/python3.12/site-packages"
    with pytest.raises(DockerError, match=r"not like 3\.11"):
        site_packages("3.11/../..")
