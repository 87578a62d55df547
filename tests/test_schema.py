"""matrix.load checks every table through stackfarm.schema: a typo anywhere fails the load with file:line, the
key and a suggestion, before any work starts. One test per table, then the facility itself."""

from __future__ import annotations

import ast
import re
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import WriteMatrix
from stackfarm import families, matrix, schema, suite_config
from stackfarm.errors import ConfigError, ExitCode
from stackfarm.matrix import Runner
from stackfarm.numerics import settings as numerics_settings
from stackfarm.throughput import thresholds
from stackfarm.throughput.measure import MeasureError
from stackfarm.throughput.settings import Settings as ThroughputSettings

REPO = Path(__file__).resolve().parents[1]
REPO_SUITES = REPO / "suites"

RUNNERS = """
[runners.1x-h200]
arch = "sm_90"
gpus = 1
labels = ["self-hosted", "linux", "x64", "sm_90", "gpus-1"]
"""


def suites(root: Path, *names: str) -> None:
    """Suite folders under `root`, each with the checkout's family.py of that name where it has one (the
    family declares the suite's settings)."""
    for name in names:
        folder = root / "suites" / name
        folder.mkdir(parents=True)
        (folder / "test_it.py").write_text("def test_it():\n    pass\n", encoding="utf-8")
        family = REPO_SUITES / name / "family.py"
        if family.is_file():
            shutil.copyfile(family, folder / "family.py")


def fails(path: Path, needle: str) -> ConfigError:
    """Load `path`; expect a ConfigError at the line holding `needle` (its first one)."""
    with pytest.raises(ConfigError) as info:
        matrix.load(path)
    exc = info.value
    lines = path.read_text(encoding="utf-8").splitlines()
    expected = next(n for n, text in enumerate(lines, 1) if needle in text)
    assert exc.line == expected, f"{exc} (expected line {expected}: {lines[expected - 1]!r})"
    assert str(exc).startswith(f"{path}:{expected}: ")
    assert exc.exit_code == ExitCode.CONFIG
    return exc


# --------------------------------------------------------------------------- the shipped matrix


def test_the_shipped_matrix_passes_every_schema_and_exposes_its_runners() -> None:
    m = matrix.load(REPO / "matrix.toml")
    assert list(m.runners) == ["8x-rtx-pro-6000", "1x-h200"]  # file order: the first match takes a cell
    assert m.runners["1x-h200"] == Runner(
        name="1x-h200",
        labels=("self-hosted", "linux", "x64", "sm_90", "gpus-1"),
        arch="sm_90",
        gpus=1,
        cells=("*",),
    )
    assert m.runners["8x-rtx-pro-6000"].cells == ("*-sgl0.5.9", "*-sgl0.5.10")
    for suite in m.suites:  # what load accepted, each suite's own parser accepts too
        assert schema.first_problem(dict(suite.settings), suite_config.settings_schema(suite.path)) is None
    by_name = {s.name: s for s in m.suites}
    numerics_settings.parse(by_name["30-numerics"].settings)
    ThroughputSettings.from_mapping(by_name["40-throughput"].settings)


def test_no_runners_table_is_no_runners(write_matrix: WriteMatrix) -> None:
    assert matrix.load(write_matrix()).runners == {}


# --------------------------------------------------------------------------- [runners.<kind>]


def test_runner_typo(write_matrix: WriteMatrix) -> None:
    path = write_matrix(RUNNERS.replace("labels =", "lables ="))
    exc = fails(path, "lables =")
    assert "`lables` in [runners.1x-h200] is unknown; did you mean `labels`?" in str(exc)
    assert exc.fix == "use one of: labels, arch, gpus, cells, driver, forward_compat"


@pytest.mark.parametrize(
    ("edit", "needle", "message"),
    [
        (('arch = "sm_90"', 'arch = "sm_100"'), "arch =", "names an unknown target arch 'sm_100'"),
        (("gpus = 1", "gpus = 0"), "gpus =", "0 is outside [1, inf]"),
        (("gpus = 1", "gpus = 8"), "gpus =", "= 8 but the kind's name says 1 GPUs"),
        (("labels = [", "cells = 3\nlabels = ["), "cells =", "must be a string"),
        (("labels = [", "labels = []\nx = ["), "labels =", "must be a non-empty list"),
    ],
)  # fmt: skip
def test_bad_runner_values(
    write_matrix: WriteMatrix, edit: tuple[str, str], needle: str, message: str
) -> None:
    exc = fails(write_matrix(RUNNERS.replace(*edit)), needle)
    assert message in str(exc)


def test_runner_without_labels_and_an_empty_runners_table(write_matrix: WriteMatrix) -> None:
    exc = fails(write_matrix('\n[runners.1x-h200]\narch = "sm_90"\n'), "[runners.1x-h200]")
    assert "[runners.1x-h200] needs `labels`" in str(exc)
    exc = fails(write_matrix("\n[runners]\n"), "[runners]")
    assert "lists no runner" in str(exc)


# --------------------------------------------------------------------------- [thresholds.<kind>]


def test_threshold_kind_typo(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    suites(tmp_path, "40-throughput")  # its family owns [thresholds]
    path = write_matrix(RUNNERS + "\n[thresholds.1x-h2000]\ndecode_tok_s = 200\n")
    exc = fails(path, "[thresholds.1x-h2000]")
    assert "`1x-h2000` is not a runner kind; did you mean `1x-h200`?" in str(exc)
    assert "1x-h200" in exc.fix
    assert "h200" in exc.fix


def test_threshold_kind_may_be_a_known_kind_without_a_runners_table(write_matrix: WriteMatrix) -> None:
    m = matrix.load(write_matrix("\n[thresholds.8x-h200]\ndecode_tok_s = 200\n"))
    assert dict(m.thresholds) == {"8x-h200": {"decode_tok_s": 200}}


def test_threshold_figure_typo(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    suites(tmp_path, "40-throughput")  # its family owns [thresholds]
    path = write_matrix(RUNNERS + "\n[thresholds.1x-h200]\ndecode_tok_s = 200\ndecode_toks = 200\n")
    exc = fails(path, "decode_toks =")
    assert (
        "`decode_toks` in [thresholds.1x-h200] is an unknown threshold; did you mean `decode_tok_s`?"
        in str(exc)
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('itl_ms = "5"', "must be a number, got '5' (a string)"),
        ("itl_ms = 0", "must be a number > 0"),
        ("batch4_tok_s = 100", "batch size 4 is not in settings.batch_sizes"),
        ("max_regression_pct = 100", "must be below 100"),
    ],
)
def test_bad_threshold_values(write_matrix: WriteMatrix, tmp_path: Path, line: str, message: str) -> None:
    suites(tmp_path, "40-throughput")  # its family owns [thresholds]
    path = write_matrix(RUNNERS + f"\n[thresholds.1x-h200]\n{line}\n")
    exc = fails(path, line.split(" =", maxsplit=1)[0] + " =")
    assert message in str(exc)


def test_thresholds_follow_the_throughput_settings(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    suites(tmp_path, "40-throughput")
    path = write_matrix(
        RUNNERS
        + "\n[suites.40-throughput.settings]\nbatch_sizes = [1, 4]\neagle3 = false\n"
        + "\n[thresholds.1x-h200]\nbatch4_tok_s = 100\neagle3_decode_tok_s = 10\n"
    )
    exc = fails(path, "eagle3_decode_tok_s =")
    assert "EAGLE-3 is not measured" in str(exc)


def test_threshold_figure_names_are_declared() -> None:
    assert {"decode_tok_s", "batch<B>_tok_s", "eagle3_accept_length", thresholds.RELATIVE_KEY} <= set(
        thresholds.FIGURES
    )
    assert thresholds.is_known_kind("8x-rtx-pro-6000")
    assert thresholds.is_known_kind("1x-h200+1x-l40s")
    assert not thresholds.is_known_kind("1x-h2000")
    assert not thresholds.is_known_kind("h200")


# --------------------------------------------------------------------------- [features.<name>]


def test_feature_typo(write_matrix: WriteMatrix) -> None:
    path = write_matrix('\n[features.fa3]\nlibs = ["sgl_kernel/flash_ops.*"]\nflag = ["enable_fa3"]\n')
    exc = fails(path, "flag =")
    assert "`flag` in [features.fa3] is unknown; did you mean `flags`?" in str(exc)


@pytest.mark.parametrize(
    ("body", "needle", "message"),
    [
        ('gate = "sglang.srt.layers.attention"', "gate =", "is not 'module:qualname'"),
        ('libs = ["x"]\noff = { sm_91 = "why" }', "off =", "`sm_91` in [features.fa3.off] is not one of [targets]"),
        ('libs = ["x"]\noff = { sm_9 = "why" }', "off =", "is not a GPU arch"),
        ('libs = ["x"]\noff = { sm_90 = 3 }', "off =", "must be a string"),
        ("flags = []", "flags =", "must be a string"),
        ('description = "only off"', "[features.fa3]", "names no gate, flags or libs"),
    ],
)  # fmt: skip
def test_bad_features(write_matrix: WriteMatrix, body: str, needle: str, message: str) -> None:
    exc = fails(write_matrix(f"\n[features.fa3]\n{body}\n"), needle)
    assert message in str(exc)


def test_feature_off_arch_suggests_the_target(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        '\n[targets]\narchs = ["sm_120", "sm_90"]\n\n[features.x]\nlibs = ["a"]\noff = { sm_102 = "w" }\n'
    )
    assert "did you mean `sm_120`?" in str(fails(path, "off ="))


# --------------------------------------------------------------------------- [suites.*.settings]


def test_numerics_setting_typo(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    suites(tmp_path, "30-numerics")
    path = write_matrix("\n[suites.30-numerics.settings]\nprompts = 8\nnear_tie_tolerance = 0.1\n")
    exc = fails(path, "near_tie_tolerance")
    assert (
        "`near_tie_tolerance` in [suites.30-numerics.settings] is an unknown setting; did you mean `near_tie_tol`?"
        in str(exc)
    )


def test_numerics_nested_tolerance_typo_points_at_its_line(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    suites(tmp_path, "30-numerics")
    path = write_matrix(
        "\n[suites.30-numerics.settings.tolerance]\n"
        "bfloat16 = { atol = 1e-2, rtol = 1e-2 }\nbf16 = { atol = 1e-2 }\nfloat16 = { atl = 1 }\n"
    )
    exc = fails(path, "bf16 =")
    assert (
        "`bf16` in [suites.30-numerics.settings.tolerance] is an unknown dtype; did you mean `bfloat16`?"
        in str(exc)
    )
    path.write_text(path.read_text().replace("bf16 = { atol = 1e-2 }\n", ""))
    exc = fails(path, "float16 = { atl")
    assert (
        "`atl` in [suites.30-numerics.settings.tolerance.float16] is an unknown key; did you mean `atol`?"
        in str(exc)
    )


def test_throughput_setting_typo(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    suites(tmp_path, "40-throughput")
    path = write_matrix("\n[suites.40-throughput.settings]\nrepeat = 5\n")
    exc = fails(path, "repeat =")
    assert (
        "`repeat` in [suites.40-throughput.settings] is an unknown setting; did you mean `repeats`?"
        in str(exc)
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("repeats = 1", "1 is outside [2, inf]"),
        ('model_shape = "llama3-8b"', "names an unknown shape 'llama3-8b'; did you mean `llama-3-8b`?"),
        ("mem_fraction_static = [0.3]", "needs one value per configuration"),
        ('batch_sizes = [1, "8"]', "item 2 must be an integer"),
    ],
)
def test_bad_throughput_settings(write_matrix: WriteMatrix, tmp_path: Path, line: str, message: str) -> None:
    suites(tmp_path, "40-throughput")
    exc = fails(
        write_matrix(f"\n[suites.40-throughput.settings]\n{line}\n"), line.split(" =", maxsplit=1)[0] + " ="
    )
    assert message in str(exc)


def test_throughput_library_reads_the_same_declaration() -> None:
    with pytest.raises(MeasureError, match=r"repeats = 1: 1 is outside \[2, inf\]; fix: rounds per figure"):
        ThroughputSettings.from_mapping({"repeats": 1})
    with pytest.raises(MeasureError, match="warmup_max_runs"):
        ThroughputSettings(warmup_window=5, warmup_max_runs=3).validate()


def test_eagle3_setting_typo(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    suites(tmp_path, "20-eagle3")
    path = write_matrix('\n[suites.20-eagle3.settings]\ncompare_wth = ["0.5.9"]\n')
    exc = fails(path, "compare_wth")
    assert (
        "`compare_wth` in [suites.20-eagle3.settings] is an unknown setting; did you mean `compare_with`?"
        in str(exc)
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("compare_with = [0.5]", "item 1 must be a string"),
        ('compare_with = ["latest"]', "'latest' is not a PEP 440 version"),
        ('runtime_pairs = [["LlamaForCausalLM"]]', "must list at least 2 items"),
        ('runtime_timeout = "900"', "must be a number"),
        ('extra_targets = ["Llama-3"]', "is not a Python class name"),
    ],
)
def test_bad_eagle3_settings(write_matrix: WriteMatrix, tmp_path: Path, line: str, message: str) -> None:
    suites(tmp_path, "20-eagle3")
    exc = fails(
        write_matrix(f"\n[suites.20-eagle3.settings]\n{line}\n"), line.split(" =", maxsplit=1)[0] + " ="
    )
    assert message in str(exc)


def test_capability_settings(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    suites(tmp_path, "10-capability")
    family = REPO / "suites" / "10-capability" / "family.py"  # the suite's settings are its family's
    (tmp_path / "suites" / "10-capability" / "family.py").write_text(family.read_text())
    good = (
        '\n[suites.10-capability]\nsettings = { environ = { SGLANG_X = "1" }, flag_packages = ["sglang"] }\n'
    )
    assert matrix.load(write_matrix(good)).suites[0].settings["flag_packages"] == ["sglang"]
    exc = fails(
        write_matrix('\n[suites.10-capability.settings]\nflag_package = ["sglang"]\n'), "flag_package"
    )
    assert "did you mean `flag_packages`?" in str(exc)


def test_a_suite_that_declares_no_settings_takes_none(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    suites(tmp_path, "00-stack", "05-serve")
    exc = fails(write_matrix("\n[suites.05-serve]\nsettings = { port = 30000 }\n"), "settings =")
    assert "`port` in [suites.05-serve.settings] is an unknown setting: this suite declares none" in str(exc)
    assert "remove it" in exc.fix


# --------------------------------------------------------------------------- [suites.*] keys


def test_timeout_that_is_not_a_number(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    suites(tmp_path, "00-stack")
    exc = fails(write_matrix('\n[suites.00-stack]\ngate = true\ntimeout = "soon"\n'), "timeout =")
    assert "`timeout` in [suites.00-stack] must be a number, got 'soon' (a string)" in str(exc)
    assert exc.fix.startswith("a number of seconds")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("gate = 1", "must be true or false"),
        ("needs_gpu = 'yes'", "must be true or false"),
        ("timeout = 0", "> 0"),
    ],
)
def test_other_suite_keys_are_typed(
    write_matrix: WriteMatrix, tmp_path: Path, line: str, message: str
) -> None:
    suites(tmp_path, "00-stack")
    exc = fails(write_matrix(f"\n[suites.00-stack]\n{line}\n"), line.split(" =", maxsplit=1)[0] + " =")
    assert message in str(exc)


def test_fractional_timeout_rounds_up(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    suites(tmp_path, "00-stack")
    assert matrix.load(write_matrix("\n[suites.00-stack]\ntimeout = 90.5\n")).suites[0].timeout == 91


# --------------------------------------------------------------------------- [docker]


def test_docker_typo(write_matrix: WriteMatrix) -> None:
    exc = fails(write_matrix('\n[docker]\nshm_size = "32g"\nulimits = { memlok = -1 }\n'), "ulimits =")
    assert "`memlok` in [docker.ulimits] is an unknown limit; did you mean `memlock`?" in str(exc)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("shm_size = 32", "must be a string, got 32 (an integer)"),
        ('shm_size = "32 GB"', "is not a size like"),
        ('ulimits = { stack = "big" }', "must be an integer"),
        ('base = "nvidia/cuda:{cudo}-devel"', "the only placeholders allowed are {cuda} and {python}"),
        ('base = "Not An Image"', "is not an image reference"),
        ('ipc_host = "yes"', "must be true or false"),
        ("network = 1", "must be a string"),
    ],
)
def test_bad_docker_values(write_matrix: WriteMatrix, line: str, message: str) -> None:
    exc = fails(write_matrix(f"\n[docker]\n{line}\n"), line.split(" =", maxsplit=1)[0] + " =")
    assert message in str(exc)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("shm_size", "32g"),
        ("shm_size", "1073741824"),
        ("shm_size", "0g"),
        ("shm_size", "16gb"),
        ("ulimits", {"memlock": -1, "stack": 67108864}),
        ("ulimits", {"nofile": "1024:4096"}),
        ("ulimits", {"nofile": "lots"}),
        ("ulimits", {"nofiles": 1}),
        ("base", "nvidia/cuda:{cuda}-devel-ubuntu24.04"),
        ("base", "registry.local:5000/cuda:{cuda}"),
        ("base", "./base.tar"),
        ("base", "nvidia/cuda:{cuda.x}"),
        ("base", "UPPER/case:{cuda}"),
        ("base", "python:{python}-slim-bookworm"),
        ("base", "nvidia/cuda:{torch}"),
    ],
)
def test_docker_schema_agrees_with_the_backend(key: str, value: object) -> None:
    """The load-time mirror accepts exactly what the docker backend accepts."""
    pytest.importorskip("stackfarm.backends.docker")
    from stackfarm.backends.docker.base import base_for
    from stackfarm.backends.docker.common import DockerError, validate_shm_size, validate_ulimits
    from stackfarm.matrix_tables import DOCKER

    raw: Any = value  # the backend's validators take what matrix.toml holds, of any type
    try:
        if key == "shm_size":
            validate_shm_size(raw)
        elif key == "ulimits":
            validate_ulimits(raw)
        else:
            base_for(raw, {"cuda": "12.8", "python": "3.12"})
        backend_ok = True
    except DockerError:
        backend_ok = False
    assert (schema.first_problem({key: value}, DOCKER) is None) == backend_ok


# --------------------------------------------------------------------------- the CLI


def test_plan_refuses_a_bad_matrix_with_exit_2(
    write_matrix: WriteMatrix, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stackfarm.cli import main

    (tmp_path / "wheels").mkdir()
    suites(tmp_path, "40-throughput")  # its family owns [thresholds]
    path = write_matrix(
        '\n[indexes.local]\nfind_links = "wheels"\n' + RUNNERS + "\n[thresholds.1x-h200]\ndecode_toks = 200\n"
    )
    assert main(["plan", "--matrix", str(path)]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    line = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if t.startswith("decode_toks"))
    assert f"{path}:{line}" in err
    assert "did you mean `decode_tok_s`?" in err


# --------------------------------------------------------------------------- the facility


def test_find_line_walks_down_to_the_deepest_header() -> None:
    lines = textwrap.dedent(
        """\
        top = 1
        [suites.30-numerics]   # a comment
        timeout = 10
        [suites . "30-numerics" . settings]
        runtime_pairs = [
          ["A", "B"],
        ]
        'prompts' = 8
        [patches."sm120-0.5.16"]
        applies_to = "x"
        """
    ).splitlines()
    assert schema.find_line(lines, ("top",)) == 1
    assert schema.find_line(lines, ("suites", "30-numerics", "timeout")) == 3
    assert schema.find_line(lines, ("suites", "30-numerics", "settings", "prompts")) == 8
    assert schema.find_line(lines, ("suites", "30-numerics", "settings", "tolerance", "x")) == 4
    assert schema.find_line(lines, ("suites", "30-numerics", "gate")) == 2
    assert schema.find_line(lines, ("patches", "sm120-0.5.16", "applies_to")) == 10
    assert schema.find_line(lines, ("nothing", "here")) is None


def test_fields_report_the_path_the_value_and_the_fix() -> None:
    table = schema.Table(
        {
            "n": schema.Int("a count", min=1),
            "pair": schema.List(schema.Str("a name"), "two names", min_len=2, max_len=2),
            "sub": schema.Map(schema.Number("a number", max=1), "per name", keys=("a", "b"), noun="name"),
            "how": schema.Enum(("fast", "slow"), noun="speed"),
        },
        required=("n",),
        noun="setting",
    )
    assert schema.first_problem({"n": 1, "pair": ["a", "b"], "sub": {"a": 0.5}, "how": "fast"}, table) is None
    problem = schema.first_problem({"n": 1, "sub": {"a": 2}}, table)
    assert problem is not None
    assert (problem.key, problem.message, problem.fix, problem.value) == (
        "sub.a",
        "2.0 is outside [-inf, 1]",
        "a number",
        2,
    )
    problem = schema.first_problem({"n": 1, "sub": {"c": 1}}, table)
    assert problem is not None
    assert problem.key == "sub.c"
    assert "unknown name" in problem.message
    problem = schema.first_problem({"n": 1, "how": "fsat"}, table)
    assert problem is not None
    assert "did you mean `fast`?" in problem.message
    problem = schema.first_problem({"pair": ["a"]}, table)
    assert problem is not None
    assert problem.message == "must list at least 2 items, got 1"
    problem = schema.first_problem({}, table)
    assert problem is not None
    assert (problem.path, problem.message) == ((), "needs `n`")
    assert re.search(r"\(a boolean\)", schema.first_problem({"n": True}, table).message)  # type: ignore[union-attr]


def test_the_config_layer_names_no_suite_library() -> None:
    """[thresholds] is the 40-throughput family's table (SuiteFamily.tables), its settings the families'
    (family.py): matrix.load reaches both through the family registry, and the throughput library's record
    imports no sign-off (the signed baseline is stackfarm.qualrecord's to verify)."""
    src = REPO / "src" / "stackfarm"
    config = ("matrix.py", "matrix_tables.py", "suite_config.py", "families.py", "family.py", "schema.py",
              "settings_kit.py", "profile.py", "tomlread.py")  # fmt: skip
    for module in config:
        tree = ast.parse((src / module).read_text(encoding="utf-8"))
        imported = {
            f"{'.' * n.level}{n.module or ''}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
        } | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        libraries = [m for m in imported if re.match(r"^(\.|stackfarm\.)(throughput|numerics|analysis)\b", m)]
        assert not libraries, f"{module} imports the suite libraries {libraries}"
    record = (src / "throughput" / "record.py").read_text(encoding="utf-8")
    assert not re.search(r"^from \.\. import .*(attest|qualrecord)", record, re.M)
    owned = families.load(REPO_SUITES)["40-throughput"].tables
    assert list(owned) == ["thresholds"]
