"""Cell images shared through a registry ([docker] registry / STACKFARM_REGISTRY): the setting's validation,
and behind `@pytest.mark.docker` two runners (two stackfarm caches, one engine, one real registry) sharing one
cell: runner 1 builds and pushes, its local image is removed, runner 2 pulls it and builds nothing, fetching no
wheel. The registry is the one STACKFARM_TEST_REGISTRY names (.ci/servers.sh starts Debian's docker-registry);
without one that answers, these tests skip and say why."""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fakestack import OLD, FakeProject, cell_id, make_project
from stackfarm import schema, verdict
from stackfarm.artifacts import Cache
from stackfarm.backends.docker import DockerBackend, DockerError
from stackfarm.backends.docker.common import CACHE_TAG, LABEL_INPUTS, REGISTRY_ENV, validate_registry
from stackfarm.backends.docker.engine import DockerEngine
from stackfarm.backends.docker.images import BUILD_LOG
from stackfarm.errors import ConfigError, ExitCode
from stackfarm.matrix import load as load_matrix
from stackfarm.matrix_tables import DOCKER
from test_docker_support import local_base, real_engine

pytest_plugins = ("fakestack",)

CELL = cell_id(OLD)

# -- the setting ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "127.0.0.1:5000",
        "localhost:5000/team",
        "localhost",
        "ghcr.io/my-org/stackfarm",
        "registry.example.org",
        "registry:5000/a/b",
        "127.0.0.1:5000/",
        "http://127.0.0.1:5000",
        "127.0.0.1:5000/Upper",
        "registry",
        "127.0.0.1:5000/cell:tag",
        "reg.example.org/a b",
        "",
    ],
)
def test_the_schema_accepts_exactly_what_the_backend_accepts(value: str) -> None:
    try:
        validate_registry(value)
        backend_ok = True
    except DockerError:
        backend_ok = False
    assert (schema.first_problem({"registry": value}, DOCKER) is None) == backend_ok


def test_a_bad_registry_in_matrix_toml_names_the_key(fake_project: FakeProject) -> None:
    fake_project.suite("00-suite", "pass")
    path = fake_project.write_matrix(extra='\n[docker]\nregistry = "https://127.0.0.1:5000"\n')
    with pytest.raises(
        ConfigError,
        match=r"matrix.toml:\d+: `registry` in \[docker\] = 'https://127.0.0.1:5000' is not a registry like",
    ) as info:
        load_matrix(path)
    assert info.value.exit_code == ExitCode.CONFIG
    assert str(path) in str(info.value)


def test_the_runners_registry_wins_over_the_matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REGISTRY_ENV, raising=False)
    cache = Cache(tmp_path)
    engine = DockerEngine("docker")
    assert DockerBackend(cache, engine=engine).registry is None
    assert DockerBackend(cache, engine=engine).remote_ref("stackfarm/c:1") is None
    backend = DockerBackend(cache, engine=engine, registry="ghcr.io/org/")
    assert backend.remote_ref("stackfarm/c:0123456789abcdef") == "ghcr.io/org/stackfarm/c:0123456789abcdef"
    monkeypatch.setenv(REGISTRY_ENV, "127.0.0.1:5000")
    assert DockerBackend(cache, engine=engine, registry="ghcr.io/org").registry == "127.0.0.1:5000"
    monkeypatch.setenv(REGISTRY_ENV, "http://127.0.0.1:5000")
    with pytest.raises(DockerError, match=r"STACKFARM_REGISTRY = 'http://127.0.0.1:5000' is not a registry"):
        DockerBackend(cache, engine=engine)


# -- a real registry -----------------------------------------------------------------------------------------


def registry_under_test() -> str:
    """The registry STACKFARM_TEST_REGISTRY names, once it answers `GET /v2/`; else the test skips."""
    where = os.environ.get("STACKFARM_TEST_REGISTRY", "").strip()
    if not where:
        pytest.skip(
            "STACKFARM_TEST_REGISTRY is not set: no registry to share images through (.ci/servers.sh)"
        )
    try:
        with urllib.request.urlopen(f"http://{where}/v2/", timeout=10) as answer:
            answer.read()
    except urllib.error.HTTPError as exc:
        pytest.skip(f"the registry {where} wants credentials or is broken: GET /v2/ gave {exc.code}")
    except (urllib.error.URLError, OSError) as exc:
        pytest.skip(f"the registry {where} does not answer: {exc}")
    return where


def _registry_json(where: str, path: str, accept: str) -> dict[str, object]:
    request = urllib.request.Request(f"http://{where}/v2/{path}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=30) as answer:
        data: dict[str, object] = json.loads(answer.read())
    return data


@dataclass(frozen=True)
class Shared:
    """One cell run by two runners through one registry."""

    registry: str
    remote: str
    tag: str
    first: FakeProject
    first_code: int
    first_log: str
    second_reports: Path
    second_cache: Path
    second_code: int
    second_log: str


def _run(project: FakeProject, reports: Path) -> int:
    from stackfarm.cli import main

    argv = [
        "run",
        "--matrix",
        str(project.matrix),
        "--reports",
        str(reports),
        "--backend",
        "docker",
        "--jobs",
        "1",
    ]
    return main(argv)


def _build_log(reports: Path) -> str:
    log = reports / CELL / BUILD_LOG
    assert log.is_file(), f"no {BUILD_LOG} in {log.parent}"
    return log.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    where = registry_under_test()
    engine = real_engine()
    base = local_base(engine)
    root = tmp_path_factory.mktemp("runners")
    run = uuid.uuid4().hex[:12]
    with pytest.MonkeyPatch.context() as mp:
        project = make_project(root, mp)
        project.suite("00-suite", "pass")
        project.write_matrix()
        # Inputs of this test run alone (an extra CA line is part of the image's inputs): removing the image
        # from the engine between the runners cannot touch an image another test or run uses.
        ca = root / "extra.pem"
        ca.write_text(f"# stackfarm registry test {run}\n", encoding="utf-8")
        mp.setenv("STACKFARM_CA_BUNDLE", str(ca))
        mp.setenv("STACKFARM_DOCKER_BASE", base)
        mp.setenv(REGISTRY_ENV, f"{where}/stackfarm-test-{run}")
        mp.setenv("STACKFARM_CACHE", str(root / "cache-1"))
        first_code = _run(project, project.reports)
        first_log = _build_log(project.reports)
        report = verdict.read(verdict.path_of(project.reports, CELL)).report
        tag = report.backend_facts.docker_image
        assert tag is not None
        remote = f"{where}/stackfarm-test-{run}/{tag}"
        tags = (tag, remote, f"{remote.rsplit(':', 1)[0]}:{CACHE_TAG}")
        for ref in tags:  # runner 2's engine has never seen the image
            assert engine.remove_image(ref) is None
        assert engine.image_id(tag) is None
        mp.setenv("STACKFARM_CACHE", str(root / "cache-2"))
        second_reports = root / "reports-2"
        second_code = _run(project, second_reports)
        yield Shared(
            registry=where,
            remote=remote,
            tag=tag,
            first=project,
            first_code=first_code,
            first_log=first_log,
            second_reports=second_reports,
            second_cache=root / "cache-2",
            second_code=second_code,
            second_log=_build_log(second_reports),
        )
        for ref in tags:
            engine.remove_image(ref)


@pytest.mark.docker
def test_runner_one_builds_and_pushes(shared: Shared) -> None:
    assert shared.first_code == ExitCode.OK
    log = shared.first_log
    assert "+ " in log
    assert " build " in log
    assert "BUILDKIT_INLINE_CACHE=1" in log
    assert f"--cache-from {shared.remote.rsplit(':', 1)[0]}:{CACHE_TAG}" in log
    assert f"stackfarm: {shared.remote} is not in the registry: building it" in log
    assert f"stackfarm: pushed {shared.remote} (" in log
    # Every wheel came from stackfarm's cache: nothing was downloaded inside the build.
    assert re.search(r"stackfarm: wheel sglang-0\.5\.9-py3-none-any\.whl from the cache", log)
    assert "Downloading" not in log


@pytest.mark.docker
def test_runner_two_pulls_and_builds_nothing(shared: Shared) -> None:
    assert shared.second_code == ExitCode.OK
    log = shared.second_log
    assert f"pulled {shared.remote}, nothing built" in log
    assert " build " not in log
    assert "pushed" not in log
    first = verdict.read(verdict.path_of(shared.first.reports, CELL)).report
    second = verdict.read(verdict.path_of(shared.second_reports, CELL)).report
    # Nothing to build, so the backend fetched no wheel: runner 2's cache holds at most sglang's, which the
    # plan reads its pins from (the fake find_links index serves no PEP 658 metadata file).
    blobs = {p.name.removesuffix(".whl") for p in (shared.second_cache / "blobs").rglob("*.whl")}
    sglang = {w.sha256 for w in second.wheels if w.distribution == "sglang"}
    assert blobs <= sglang, blobs - sglang
    assert len({w.sha256 for w in first.wheels}) == 5
    assert second.status == first.status
    assert [(s.suite, s.outcome, s.tests) for s in second.suites] == [
        (s.suite, s.outcome, s.tests) for s in first.suites
    ]
    # The very image runner 1 built (same content id), known by its registry digest.
    assert second.backend_facts.docker_image == shared.tag
    assert second.backend_facts.docker_image_digest == first.backend_facts.docker_image_digest
    assert str(second.backend_facts.docker_repo_digest).startswith(
        shared.remote.rsplit(":", 1)[0] + "@sha256:"
    )


@pytest.mark.docker
def test_the_pushed_image_carries_buildkits_inline_cache(shared: Shared) -> None:
    """What --cache-from reads on a runner that lacks layers: the cache metadata in the image's config."""
    name, _, reference = shared.remote.removeprefix(f"{shared.registry}/").rpartition(":")
    manifest = _registry_json(
        shared.registry,
        f"{name}/manifests/{reference}",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
    config = manifest["config"]
    assert isinstance(config, dict)
    blob = _registry_json(shared.registry, f"{name}/blobs/{config['digest']}", "application/octet-stream")
    assert "moby.buildkit.cache.v0" in blob
    assert blob["config"]["Labels"][LABEL_INPUTS]  # type: ignore[index]


@pytest.mark.docker
def test_a_build_imports_the_registrys_cache(tmp_path: Path) -> None:
    """A build given --cache-from reads the pushed image's cache manifest (the log shows the import done)."""
    where = registry_under_test()
    engine = real_engine()
    base = local_base(engine)
    run = uuid.uuid4().hex[:12]
    ref = f"{where}/stackfarm-test-{run}/layers:{CACHE_TAG}"
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\nRUN echo {run} > /first\n")
    build = {"context": tmp_path, "build_args": {}, "labels": {}, "secrets": {}, "timeout": 300.0}
    try:
        engine.build(dockerfile=tmp_path / "Dockerfile", tag=ref, log=tmp_path / "a.log", **build)  # type: ignore[arg-type]
        engine.push(ref)
        (tmp_path / "Dockerfile.b").write_text(
            f"FROM {base}\nRUN echo {run} > /first\nRUN echo b > /second\n"
        )
        engine.build(
            dockerfile=tmp_path / "Dockerfile.b",
            tag=f"stackfarm-test/layers-{run}:b",
            log=tmp_path / "b.log",
            cache_from=(ref,),
            **build,  # type: ignore[arg-type]
        )
    finally:
        engine.remove_image(ref)
        engine.remove_image(f"stackfarm-test/layers-{run}:b")
    log = (tmp_path / "b.log").read_text()
    assert f"--cache-from {ref}" in log
    step = re.search(rf"^#(\d+) importing cache manifest from {re.escape(ref)}$", log, re.MULTILINE)
    assert step, log
    assert re.search(rf"^#{step[1]} DONE", log, re.MULTILINE), log
    assert re.search(rf"RUN echo {run} > /first\n(?:#\d+ .*\n)*?#\d+ CACHED", log), log


@pytest.mark.docker
def test_a_realise_only_build_step_pushes_the_image_the_test_step_pulls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Build once, test many (the Buildkite build step, stackfarm.emit.buildkite): `run --realise-only` builds
    the cell's image and pushes it, runs no suite, writes no verdict; a runner with another cache and without
    the image (the test step on another agent) pulls it, builds nothing, and runs the suites."""
    from stackfarm.cli import main

    where = registry_under_test()
    engine = real_engine()
    base = local_base(engine)
    run = uuid.uuid4().hex[:12]
    project = make_project(tmp_path, monkeypatch)
    project.suite("00-suite", "pass")
    project.write_matrix()
    ca = tmp_path / "extra.pem"  # inputs of this test alone: removing the image touches no other test's
    ca.write_text(f"# stackfarm realise-only test {run}\n", encoding="utf-8")
    monkeypatch.setenv("STACKFARM_CA_BUNDLE", str(ca))
    monkeypatch.setenv("STACKFARM_DOCKER_BASE", base)
    monkeypatch.setenv(REGISTRY_ENV, f"{where}/stackfarm-test-{run}")
    monkeypatch.setenv("STACKFARM_CACHE", str(tmp_path / "cache-build"))
    where_to = ["--matrix", str(project.matrix), "--reports", str(project.reports), "--backend", "docker"]
    capsys.readouterr()
    assert main(["run", "--realise-only", *where_to, "--jobs", "1"]) == ExitCode.OK
    out = capsys.readouterr().out
    found = re.search(
        rf"realised {re.escape(CELL)}: image (\S+) \(sha256:[0-9a-f]+\); in the registry as (\S+)", out
    )
    assert found, out
    tag, pushed = found[1], found[2]
    remote = f"{where}/stackfarm-test-{run}/{tag}"
    assert pushed.startswith(remote.rsplit(":", 1)[0] + "@sha256:")
    assert not list(project.reports.rglob("verdict.json")), "a realised image is not a verdict"
    assert not list(project.reports.rglob("*.xml")), "no suite ran"
    assert f"stackfarm: pushed {remote} (" in _build_log(project.reports)
    tags = (tag, remote, f"{remote.rsplit(':', 1)[0]}:{CACHE_TAG}")
    try:
        for ref in tags:  # the test step's agent has never seen the image
            assert engine.remove_image(ref) is None
        monkeypatch.setenv("STACKFARM_CACHE", str(tmp_path / "cache-test"))
        assert main(["run", *where_to, "--jobs", "1"]) == ExitCode.OK
        assert f"pulled {remote}, nothing built" in _build_log(project.reports)
        report = verdict.read(verdict.path_of(project.reports, CELL)).report
        assert report.backend_facts.docker_image == tag
        assert [(s.suite, s.outcome) for s in report.suites] == [("00-suite", "passed")]
    finally:
        for ref in tags:
            engine.remove_image(ref)
