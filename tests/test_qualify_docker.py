"""A Docker run's qualification record carries the image it ran in: the real engine, the synthetic stack of
tests/fakestack.py (tiny wheels, so the image builds in a minute), a real signed sign-off."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fakestack import OLD, FakeProject, cell_id
from stackfarm import attest, qualify, verdict
from stackfarm.errors import ExitCode
from test_docker_support import local_base, real_engine

pytest_plugins = ("fakestack",)

CELL = cell_id(OLD)


@pytest.mark.docker
def test_a_docker_runs_record_names_its_image_digest(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = real_engine()
    monkeypatch.setenv("STACKFARM_DOCKER_BASE", local_base(engine))
    fake_project.suite("00-suite", "pass")
    fake_project.write_matrix()
    from stackfarm.cli import main

    argv = [*fake_project.argv()]
    argv[argv.index("local")] = "docker"
    assert main(argv) == ExitCode.OK
    report = verdict.read(verdict.path_of(fake_project.reports, CELL)).report
    assert report.backend == "docker"
    image = report.backend_facts.docker_image
    assert image is not None
    inspect = subprocess.run(
        [engine.executable, "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True,
        text=True,
        check=True,
    )
    assert report.image_digest == inspect.stdout.strip()

    private, _, key_id = attest.generate(tmp_path / "keys")
    done = qualify.qualify(
        cell_id=CELL,
        release="r1",
        approver="Ana Approver",
        reports=fake_project.reports,
        matrix_path=fake_project.matrix,
        key=attest.load_signing_key(private),
        backend="docker",
        gpu=False,
    )
    assert done.key_id == key_id
    assert done.predicate["image_digest"] == inspect.stdout.strip()
    assert done.predicate["image_tag"] == image
