"""A cell whose image fails to build, through a registry, on the real engine (`@pytest.mark.docker`): the
first build of a cell with a registry finds no cache manifest to import (BuildKit says ERROR for that import and
carries on) and a later RUN step fails compiling; the terminal, verdict.json and the cell page name that RUN step
and its error line, never the cache import. The patch series breaks sglang's __init__.py, so the Dockerfile's
`python -m compileall -q sglang` fails. The registry is STACKFARM_TEST_REGISTRY (.ci/servers.sh)."""

from __future__ import annotations

import html
import uuid
from pathlib import Path

import pytest

from fakestack import OLD, cell_id, make_project
from stackfarm import verdict
from stackfarm.backends.docker.common import REGISTRY_ENV
from stackfarm.backends.docker.images import BUILD_LOG
from stackfarm.errors import ExitCode
from stackfarm.patches.git import make_patch
from test_docker_registry import registry_under_test
from test_docker_support import local_base, real_engine

CELL = cell_id(OLD)
INIT = "sglang/__init__.py"
FAKE_INIT = (
    '"""Fake sglang 0.5.9 (stackfarm tests)."""\n\n__version__ = "0.5.9"\n__distribution__ = "sglang"\n'
)
HEADERS = {"Description": "a syntax error", "Origin": "stackfarm tests", "Forwarded": "not-needed"}


@pytest.mark.docker
def test_a_failing_run_step_is_named_not_the_cache_import_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    where = registry_under_test()
    engine = real_engine()
    base = local_base(engine)
    run = uuid.uuid4().hex[:12]
    project = make_project(tmp_path, monkeypatch)
    project.suite("00-suite", "pass")
    folder = project.root / "patches" / "broken"
    folder.mkdir(parents=True)
    broken = FAKE_INIT + f"\n\ndef broken_{run}(:\n    pass\n"
    (folder / "0001-broken.patch").write_text(make_patch(INIT, FAKE_INIT, broken, HEADERS), encoding="utf-8")
    (folder / "series").write_text("0001-broken.patch\n", encoding="utf-8")
    project.write_matrix(extra='\n[patches.broken]\napplies_to = "sglang>=0.5.9,<0.5.10"\n')
    monkeypatch.setenv("STACKFARM_DOCKER_BASE", base)
    monkeypatch.setenv(REGISTRY_ENV, f"{where}/stackfarm-test-{run}")
    from stackfarm.cli import main

    argv = ["run", "--matrix", str(project.matrix), "--reports", str(project.reports), "--backend", "docker"]
    code = main([*argv, "--jobs", "1"])
    said = capfd.readouterr()
    terminal = said.out + said.err
    assert code != ExitCode.OK
    log = (project.reports / CELL / BUILD_LOG).read_text(encoding="utf-8")
    assert "importing cache manifest from" in log, log  # the miss this test is about did happen
    assert "ERROR: " in log.split("importing cache manifest from", 1)[1].split("\n\n", 1)[0], log
    assert "*** Error compiling" in log, log

    stored = verdict.path_of(project.reports, CELL).read_text(encoding="utf-8")
    assert "Error compiling 'sglang/__init__.py'" in stored
    reason = verdict.read(verdict.path_of(project.reports, CELL)).report.reason
    first = reason.splitlines()[0]
    assert "failed at [patched " in first, reason
    assert "] RUN " in first
    assert first.endswith("*** Error compiling 'sglang/__init__.py'..."), first
    assert "SyntaxError: invalid syntax" in reason
    assert "cache manifest" not in reason
    assert "not found" not in reason

    line = next((text for text in terminal.splitlines() if "failed at" in text), terminal)
    assert "failed at [patched " in line, terminal
    assert "Error compiling 'sglang/__init__.py'" in line
    assert "cache manifest" not in terminal

    page = html.unescape((project.reports / CELL / "index.html").read_text(encoding="utf-8"))
    assert f"<p>{first}</p>" in page  # the step and its error line, above the step's last lines
    assert "SyntaxError: invalid syntax" in page
    assert "cache manifest" not in page
