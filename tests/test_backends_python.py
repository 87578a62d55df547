"""Each backend runs a cell's suites under the cell's Python, and says which: the Docker image's Python is the
cell's python axis (base choice, refusal of a base without it: no engine needed), the host's is recorded."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from stackfarm.backends.docker import DockerError
from stackfarm.backends.docker.base import base_for, check_base_python, rootfs_pythons
from stackfarm.backends.host import HostBackend
from stackfarm.plan import Cell
from stackfarm.verdict import BackendFacts

REPO = Path(__file__).resolve().parents[1]


def test_the_python_axis_can_choose_the_base_image() -> None:
    template = "python:{python}-slim-bookworm"
    assert base_for(template, {"cuda": "12.8", "python": "3.12"}) == "python:3.12-slim-bookworm"
    assert base_for(template, {"cuda": "12.8", "python": "3.10"}) == "python:3.10-slim-bookworm"
    both = "registry.local/cuda-py:{cuda}-py{python}"
    assert base_for(both, {"cuda": "12.8", "python": "3.11"}) == "registry.local/cuda-py:12.8.1-py3.11"
    with pytest.raises(DockerError, match=r"not like 3\.11"):
        base_for(template, {"cuda": "12.8", "python": "3"})
    with pytest.raises(DockerError, match="only placeholders allowed are"):
        base_for("python:{torch}", {"cuda": "12.8", "python": "3.12"})


def _rootfs(root: Path, os_id: str, *pythons: str) -> Path:
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "os-release").write_text(f'PRETTY_NAME="x"\nID={os_id}\n')
    for version in pythons:
        (root / "usr" / "bin" / f"python{version}").write_text("")
    (root / "usr" / "bin" / "python3.11-config").write_text("")  # not an interpreter
    return root


def test_a_rootfs_base_without_the_cells_python_is_refused_before_any_build(tmp_path: Path) -> None:
    debian = _rootfs(tmp_path / "bookworm", "debian", "3.11")
    assert rootfs_pythons(debian) == ["3.11"]
    check_base_python(str(debian), "3.11")
    with pytest.raises(DockerError) as caught:
        check_base_python(str(debian), "3.12")
    text = str(caught.value)
    assert f"the base image {debian} has no python3.12 (it has python3.11)" in text
    assert "fix: a base with python3.12" in text
    # Ubuntu gets another Python from the deadsnakes PPA (docker/Dockerfile); names and tarballs are not opened.
    check_base_python(str(_rootfs(tmp_path / "noble", "ubuntu", "3.12")), "3.11")
    check_base_python("stackfarm-base:bookworm", "3.12")
    check_base_python(str(tmp_path / "base.tar"), "3.12")


def test_the_dockerfile_builds_the_cells_python_or_fails_saying_so() -> None:
    text = (REPO / "docker" / "Dockerfile").read_text(encoding="utf-8")
    assert '"python${PYTHON}" -m venv "${VENV}"' in text
    assert """print("%d.%d" % sys.version_info[:2])')" = "${PYTHON}\"""" in text
    assert "stackfarm: the base image has no python${PYTHON}" in text
    assert "grep -qi '^ID=ubuntu' /etc/os-release || nopython" in text


def test_the_host_backend_records_the_python_it_ran() -> None:
    cell = Cell(id="h", values=(("python", "3.12"),), components=(), patch_sets=())
    assert HostBackend(sys.executable).facts(cell) == BackendFacts(
        host_python=platform.python_version(), host_python_path=sys.executable
    )
