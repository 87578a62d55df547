"""Host profiles (stackfarm.profile) and the offline wheelhouse bundle (stackfarm.wheelhouse, its installer).

End to end, offline: a wheelhouse bundle of the fake stack (tests/fakestack.py, a find_links index: no network is
asked) for a fake host, split into parts, checked and joined by the installer into a prefix, and a host-backend
cell run from that prefix, its suites finding the comparison wheel through the profile's route.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from fakestack import OLD, FakeProject, cell_id, write_wheel
from stackfarm import profile, wheelhouse
from stackfarm.errors import ConfigError
from stackfarm.matrix import load as load_matrix

pytest_plugins = ("fakestack",)
REPO = Path(__file__).resolve().parents[1]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"

# --------------------------------------------------------------------------- the profile's schema


def _profile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "host.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


GOOD = """\
    [targets]
    archs = ["sm_90"]

    [profile]
    name = "h200"
    runner = "1x-h200"
    python = "3.12"
    platform = "manylinux_2_39_x86_64"
"""


def test_the_repository_profile_narrows_the_matrix_without_touching_its_other_runners(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STACKFARM_WHEELHOUSE", "/nowhere/wheelhouse")
    matrix = profile.load_matrix(REPO / "matrix.toml", REPO / "runners" / "1x-h200.toml")
    assert matrix.archs == ("sm_90",)
    assert "8x-rtx-pro-6000" in matrix.runners
    assert "8x-rtx-pro-6000" in matrix.thresholds
    assert next(iter(matrix.runners)) == "1x-h200", "the profile's runner takes every cell"
    assert {d.component for d in matrix.deviations} == {"sglang-kernel", "flashinfer-cubin"}
    assert matrix.index_for("sglang", "0.5.10") == "wheelhouse"
    assert str(matrix.indexes["wheelhouse"].find_links) == "/nowhere/wheelhouse"
    assert matrix.axes["python"] == ("3.12",)
    assert matrix.profile is not None
    assert matrix.profile.provides["torch"] == "2.11.0"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (
            GOOD.replace('name = "h200"', 'nmae = "h200"'),
            5,
            "`nmae` in [profile] is an unknown key; did you mean",
        ),
        (
            GOOD.replace('runner = "1x-h200"', 'runner = "1x-h100"'),
            6,
            "runner `1x-h100` is not a [runners.<kind>]",
        ),
        (
            GOOD.replace('["sm_90"]', '["sm_89"]'),
            2,
            "`sm_89` in [targets] archs is not an arch of matrix.toml",
        ),
        (GOOD + '\n[axes]\ncuda = ["12.8"]\n', 10, "`axes` is not a table a profile may hold"),
        (GOOD.replace('python = "3.12"', "python = 3.12"), 7, "`python` in [profile] must be a string"),
        (GOOD + '\n[profile.leave_out]\n"bad name!" = "x"\n', 11, "is not a distribution name"),
        (GOOD + '\nprovides = ["torch>=2"]\n', 10, "names no exact version"),
        (
            GOOD + '\n[[deviation]]\ncomponent = "sglang-kernel"\nreason = "r"\n',
            10,
            "needs exactly one of missing",
        ),
        (GOOD + "\n[suites.40-throughput.settings]\nrepeets = 3\n", 11, "repeets"),
        (
            GOOD + '\n[indexes.w]\nfind_links = "${STACKFARM_NO_SUCH_VAR}"\n',
            11,
            "${STACKFARM_NO_SUCH_VAR} is not set",
        ),
    ],
)
def test_a_bad_profile_is_named_at_its_line_with_a_fix(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    path = _profile(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        profile.load(path, load_matrix(REPO / "matrix.toml"))
    message = str(caught.value)
    assert f"{path}:{line}:" in message, message
    assert words in message
    assert "fix:" in message


def test_the_matrix_alone_refuses_a_narrowed_arch_that_a_profile_accepts(tmp_path: Path) -> None:
    """The reason profiles exist: matrix.toml with archs = ["sm_90"] refuses the sm_120 runner and `off` entries."""
    text = (
        (REPO / "matrix.toml")
        .read_text(encoding="utf-8")
        .replace('archs = ["sm_120", "sm_90"]', 'archs = ["sm_90"]')
    )
    (tmp_path / "suites").symlink_to(REPO / "suites")
    (tmp_path / "patches").symlink_to(REPO / "patches")
    (tmp_path / "matrix.toml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match="sm_120"):
        load_matrix(tmp_path / "matrix.toml")
    narrowed = profile.load(_profile(tmp_path, GOOD), load_matrix(REPO / "matrix.toml"))
    assert narrowed.archs == ("sm_90",)


# --------------------------------------------------------------------------- the walk over pip's resolution


def _item(name: str, version: str, *requires: str, extras: tuple[str, ...] = ()) -> wheelhouse.Item:
    return wheelhouse.Item(
        name=name, version=version, url=f"https://files.example/{name}-{version}-py3-none-any.whl",
        sha256="0" * 64, requires=requires, extras=extras, requested=False,
    )  # fmt: skip


def test_select_skips_what_the_host_provides_and_carries_what_it_lacks(tmp_path: Path) -> None:
    path = _profile(tmp_path, GOOD + """
        provides = ["torch==2.11.0", "numpy==2.5.2", "transformers==5.17.0", "nvidia-nccl-cu13==2.28.9"]
        pins = ["tokenizers==0.22.2"]
        [profile.leave_out]
        tilelang = "not on the suites' paths"
        [[deviation]]
        component = "flashinfer-cubin"
        absent = true
        reason = "too big"
    """.replace("\n        ", "\n"))  # fmt: skip
    matrix = profile.load(path, load_matrix(REPO / "matrix.toml"))
    items = [
        _item("sglang", "0.5.15", "torch==2.11.0", "transformers==5.12.1", "tilelang", "cutlass[cu13]",
              "flashinfer-cubin==0.6.12", 'mistral; python_version < "3"'),
        _item("torch", "2.11.0", "nvidia-nccl-cu13"),
        _item("transformers", "5.12.1", "numpy>=1.17", "tokenizers<=0.23.0"),
        _item("tokenizers", "0.22.2"),
        _item("cutlass", "4.5.2", 'cutlass-libs-cu13==4.5.2; extra == "cu13"', extras=("cu13",)),
        _item("cutlass-libs-cu13", "4.5.2"),
        _item("numpy", "2.5.2"),
    ]  # fmt: skip
    chosen = wheelhouse.select(items, [("sglang==0.5.15", "cell"), ("torch==2.11.0", "cell")], matrix)
    assert set(chosen.carried) == {"sglang", "transformers", "tokenizers", "cutlass", "cutlass-libs-cu13"}
    assert chosen.carried["transformers"] == "dependency of sglang"  # the host's 5.17.0 is not ==5.12.1
    assert "torch" in chosen.provided
    assert "numpy" in chosen.provided
    assert "nvidia-nccl-cu13" not in chosen.provided, (
        "what only a provided distribution needs is not looked at"
    )
    assert "tilelang" in chosen.left_out
    assert "flashinfer-cubin" in chosen.left_out
    assert "absent on the host" in chosen.left_out["flashinfer-cubin"]


def test_a_pin_is_carried_although_the_host_has_a_version_that_would_do(tmp_path: Path) -> None:
    path = _profile(tmp_path, GOOD + '\nprovides = ["tokenizers==0.23.2"]\npins = ["tokenizers==0.22.2"]\n')
    matrix = profile.load(path, load_matrix(REPO / "matrix.toml"))
    items = [_item("tokenizers", "0.22.2")]
    assert wheelhouse.to_resolve(matrix, [("tokenizers==0.22.2", "pin")]) == ["tokenizers==0.22.2"]
    assert set(wheelhouse.select(items, [("tokenizers==0.22.2", "pin")], matrix).carried) == {"tokenizers"}


# --------------------------------------------------------------------------- files


def test_repack_leaves_out_the_declared_files_and_keeps_the_wheels_record(tmp_path: Path) -> None:
    wheel = write_wheel(tmp_path / "in", "sglang-kernel", "0.4.4", files={
        "sgl_kernel/__init__.py": "x = 1\n", "sgl_kernel/flash_ops.abi3.so": "fa3" * 100,
        "sgl_kernel/sm100/common_ops.abi3.so": "bw", "sgl_kernel/sm100/deep/x.py": "y = 2\n",
    })  # fmt: skip
    out = tmp_path / wheel.name
    omitted = wheelhouse.repack(wheel, out, ["sgl_kernel/flash_ops*.so", "sgl_kernel/sm100/**"])
    assert sorted(omitted) == ["sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so",
                               "sgl_kernel/sm100/deep/x.py"]  # fmt: skip
    with zipfile.ZipFile(wheel) as a, zipfile.ZipFile(out) as b:
        assert "sgl_kernel/__init__.py" in b.namelist()
        assert "sgl_kernel/flash_ops.abi3.so" not in b.namelist()
        record = "sglang_kernel-0.4.4.dist-info/RECORD"
        assert a.read(record) == b.read(record), "RECORD stays the wheel's: 00-stack counts the missing files"
    with pytest.raises(ConfigError, match="no member matches"):
        wheelhouse.repack(wheel, tmp_path / "again.whl", ["nothing/**"])


def test_sizes_and_platform_tags() -> None:
    assert wheelhouse.parse_size("58M") == 58 * 2**20
    assert wheelhouse.parse_size("60817408") == 60817408
    with pytest.raises(Exception, match="not a size"):
        wheelhouse.parse_size("58 megs")
    tags = wheelhouse.platform_tags("manylinux_2_39_x86_64")
    assert tags[0] == "manylinux_2_39_x86_64"
    assert "manylinux2014_x86_64" in tags
    assert "manylinux_2_5_x86_64" in tags


# --------------------------------------------------------------------------- end to end, offline

#: A fake 00-stack: each component installed as the cell claims, or absent / missing files as declared.
STACK_SUITE = """
import csv
import importlib.util
from pathlib import Path

from stackfarm.cellspec import dist_info

PACKAGES = {"torch": "torch", "sgl-kernel": "sgl_kernel", "flashinfer-python": "flashinfer",
            "flashinfer-cubin": "flashinfer_cubin", "sglang": "sglang"}


def test_stack_as_declared(cell):
    absent = {d["component"] for d in cell.deviations if d["absent"]}
    for comp in cell.components:
        if comp.distribution in absent:
            assert comp.root == "", f"{comp.distribution} is declared absent, the host has it"
            continue
        init = Path(comp.root) / PACKAGES[comp.distribution] / "__init__.py"
        spec = importlib.util.spec_from_file_location("fake_" + comp.distribution.replace("-", "_"), init)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.__version__ == comp.version
    kernel = cell.component("sgl-kernel")
    rows = [r[0] for r in csv.reader((dist_info(kernel) / "RECORD").open())]
    assert "sgl_kernel/sm100/big.so" in rows, "RECORD is the wheel's"
    assert not (Path(kernel.root) / "sgl_kernel/sm100/big.so").exists(), "the declared file is left out"
    assert (Path(kernel.root) / "sgl_kernel/common.so").is_file()
"""

#: A fake 20-eagle3: fetches its comparison wheel as the real one does, through the profile's route.
COMPARE_SUITE = """
from pathlib import Path


def test_compare_wheel_found_on_the_host(cell):
    # The runner resolved the family's declared wheel (its compare_with: the nearest older release) through the
    # profile's route to the wheelhouse and handed it over unpacked: the suite neither reads matrix.toml nor
    # resolves a wheel.
    handed = cell.extras["sglang==0.5.8"]
    assert handed.version == "0.5.8"
    assert Path(handed.root).joinpath("sglang", "__init__.py").is_file()
"""


def _stackfarm_needs() -> list[str]:
    """What this environment has of stackfarm's requirements: the fake host provides them (its pip cannot
    fetch them offline, and the host of a real profile lists its own)."""
    found = []
    for line in importlib.metadata.requires("stackfarm") or []:
        name = line.split(";")[0].split("[")[0]
        for op in ("<", ">", "=", "!", "~", " "):
            name = name.split(op)[0]
        try:
            found.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return sorted(set(found))


def _fake_host(project: FakeProject) -> Path:
    """The fake stack with a kernel wheel that has a big file to leave out, a matrix with a runner kind and an
    older sglang to compare with, and the host's profile."""
    write_wheel(project.wheels, "sgl-kernel", "0.3.21", files={
        "sgl_kernel/__init__.py": '__version__ = "0.3.21"\n', "sgl_kernel/common.so": "common",
        "sgl_kernel/sm100/big.so": "big" * 1000,
    })  # fmt: skip
    bulky = {"flashinfer_cubin/__init__.py": '__version__ = "0.6.3"\n', "flashinfer_cubin/x.bin": "z" * 9000}
    write_wheel(project.wheels, "flashinfer-cubin", "0.6.3", files=bulky)
    for name, body in (("00-stack", STACK_SUITE), ("20-eagle3", COMPARE_SUITE)):
        folder = project.suites / name
        folder.mkdir(parents=True)
        (folder / "test_it.py").write_text(body, encoding="utf-8")
    # 20-eagle3's real family.py: its settings schema, and the compare wheel it declares for the runner
    shutil.copyfile(REPO / "suites" / "20-eagle3" / "family.py", project.suites / "20-eagle3" / "family.py")
    project.suite_config["20-eagle3"] = {}
    project.write_matrix([OLD], extra="""
        [suites.20-eagle3.settings]
        compare_with = ["0.5.9", "0.5.10"]

        [runners.1x-fake]
        labels = ["self-hosted"]
        cells = ["*"]
    """)  # fmt: skip
    # the cell is sglang 0.5.9: compare with an older one, put on the index as 0.5.8
    write_wheel(project.wheels, "sglang", "0.5.8")
    text = project.matrix.read_text(encoding="utf-8").replace('["0.5.9", "0.5.10"]', '["0.5.8", "0.5.10"]')
    project.matrix.write_text(text, encoding="utf-8")
    provides = json.dumps(_stackfarm_needs())
    host = project.root / "runners" / "fake.toml"
    host.parent.mkdir()
    host.write_text(textwrap.dedent(f"""
        [profile]
        name = "fake-host"
        runner = "1x-fake"
        python = "{PYTHON}"
        platform = "manylinux_2_39_x86_64"
        provides = {provides}

        [[deviation]]
        component = "sgl-kernel"
        missing = ["sgl_kernel/sm100/**"]
        reason = "not carried"

        [[deviation]]
        component = "flashinfer-cubin"
        absent = true
        reason = "too big to carry"

        [indexes.wheelhouse]
        find_links = "${{STACKFARM_WHEELHOUSE}}"

        [[route]]
        requirement = "sglang==0.5.8"
        index = "wheelhouse"
    """), encoding="utf-8")  # fmt: skip
    return host


@pytest.mark.integration
def test_a_wheelhouse_bundle_installs_offline_and_runs_a_host_cell(
    fake_project: FakeProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stackfarm.cli import main

    host = _fake_host(fake_project)
    out = tmp_path / "bundle"
    monkeypatch.delenv("STACKFARM_WHEELHOUSE", raising=False)
    cell = cell_id(OLD)
    code = main(["bundle", cell, "--matrix", str(fake_project.matrix), "--profile", str(host),
                 "--wheelhouse", str(out), "--split", "64K"])  # fmt: skip
    assert code == 0
    manifest = json.loads((out / wheelhouse.MANIFEST).read_text())
    names = {w["name"]: w for w in manifest["wheels"]}
    assert {"torch", "sgl-kernel", "flashinfer-python", "sglang", "stackfarm"} <= set(names)
    assert "flashinfer-cubin" not in names
    assert "flashinfer-cubin" in manifest["left_out"]
    assert names["sgl-kernel"]["omitted"] == ["sgl_kernel/sm100/big.so"]
    assert [w for w in manifest["wheels"] if w["name"] == "sglang" and not w["install"]] != []
    parts = sorted(out.glob(f"{wheelhouse.TARBALL}.*"))
    assert len(parts) >= 2
    assert all(p.stat().st_size <= 64 * 1024 for p in parts)

    # A damaged part is refused, naming it; the good parts install.
    prefix = tmp_path / "pfx"
    good = parts[0].read_bytes()
    parts[0].write_bytes(b"x" + good[1:])
    bad = subprocess.run([sys.executable, str(out / "install.py"), "--prefix", str(prefix)],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert bad.returncode == 2
    assert parts[0].name in bad.stderr
    parts[0].write_bytes(good)
    done = subprocess.run([sys.executable, str(out / "install.py"), "--prefix", str(prefix)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    env = {}
    for line in (prefix / "stackfarm-env.sh").read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.strip('"').replace("${PYTHONPATH:-}", "").replace("${PATH}", "").rstrip(":")
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    monkeypatch.setenv("STACKFARM_WHEELHOUSE", env["STACKFARM_WHEELHOUSE"])
    # Offline: no index is reachable (the matrix's own index is a local folder; take it away too).
    (fake_project.wheels).rename(tmp_path / "index-gone")
    argv = ["run", "--matrix", str(fake_project.matrix), "--reports", str(fake_project.reports), "--jobs", "1",
            "--backend", "host", "--python", sys.executable, "--profile", str(host)]  # fmt: skip
    assert main(argv) == 0
    stored = json.loads((fake_project.reports / cell / "verdict.json").read_text())
    assert stored["report"]["status"] == "passed"
    assert stored["report"]["backend_facts"]["profile_name"] == "fake-host"
    assert stored["inputs"]["profile"]["name"] == "fake-host", (
        "a verdict under a profile is not reused without it"
    )
    assert [s["outcome"] for s in stored["report"]["suites"]] == ["passed", "passed"]


def test_a_nodeps_wheel_is_carried_as_named_whatever_asks_for_it(tmp_path: Path) -> None:
    path = _profile(tmp_path, GOOD + '\nnodeps = ["cuda-tile==1.7.0"]\n')
    matrix = profile.load(path, load_matrix(REPO / "matrix.toml"))
    items = [
        _item("flashinfer-python", "0.6.12", "cuda-tile[tileiras]"),
        _item("cuda-tile", "1.7.0", 'nvidia-cuda-tileiras; extra == "tileiras"', extras=("tileiras",)),
    ]
    roots = [("flashinfer-python===0.6.12", "cell"), ("cuda-tile==1.7.0", "nodeps")]
    chosen = wheelhouse.select(items, roots, matrix)
    assert chosen.carried == {"flashinfer-python": "cell", "cuda-tile": "nodeps"}
