"""matrix.load: the real matrix.toml loads as written; every invalid file is refused with file, line, fix.

Every failing load is checked for three things: the message, the line it points at, and that it wrote nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from conftest import BASE_AXES, WriteMatrix
from stackfarm import matrix
from stackfarm.errors import ConfigError, ExitCode
from stackfarm.matrix import Couple, Model, Override, Rule
from stackfarm.stack import REQUIRED_AXES

REPO = Path(__file__).resolve().parents[1]


def line_no(path: Path, needle: str, nth: int = 1) -> int:
    """The 1-based line of the nth line of `path` that contains `needle`."""
    hits = [n for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if needle in text]
    assert len(hits) >= nth, f"{needle!r} is not in {path} {nth} time(s)"
    return hits[nth - 1]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def load_fails(path: Path) -> ConfigError:
    """Load `path`, expect a ConfigError, check it wrote nothing and is formatted as file:line: message."""
    before = _tree(path.parent)
    with pytest.raises(ConfigError) as info:
        matrix.load(path)
    assert _tree(path.parent) == before, "a failing load must not write anything"
    exc = info.value
    assert exc.path == path
    where = f"{path}:{exc.line}" if exc.line else str(path)
    assert str(exc).startswith(f"{where}: ")
    if exc.fix:
        assert str(exc).endswith(f"\n  fix: {exc.fix}")
    assert exc.exit_code == ExitCode.CONFIG
    return exc


def make_suite(root: Path, name: str, *, with_test: bool = True) -> Path:
    folder = root / "suites" / name
    folder.mkdir(parents=True)
    if with_test:
        (folder / "test_it.py").write_text("def test_it():\n    pass\n", encoding="utf-8")
    return folder


# --------------------------------------------------------------------------- the real matrix.toml


def test_real_matrix_loads_as_written() -> None:
    path = REPO / "matrix.toml"
    before = (_tree(REPO / "suites"), _tree(REPO / "patches"), path.stat().st_mtime_ns)
    m = matrix.load(path)
    assert (_tree(REPO / "suites"), _tree(REPO / "patches"), path.stat().st_mtime_ns) == before

    assert m.path == path
    assert m.root == REPO
    assert dict(m.axes) == {
        "cuda": ("12.8", "13.0"),
        "torch": ("2.9.1", "2.9.1+cu130"),
        "sgl_kernel": ("0.3.21", "0.4.1"),
        "flashinfer": ("0.6.3", "0.6.7.post2"),
        "sglang": ("0.5.9", "0.5.10"),
        "python": ("3.11",),
    }
    assert tuple(m.axes) == REQUIRED_AXES
    assert m.couples == (
        Couple(name="cuda-torch", axes=("cuda", "torch"), rows=(("12.8", "2.9.1"), ("13.0", "2.9.1+cu130"))),
        Couple(
            name="sglang-pins",
            axes=("sglang", "sgl_kernel", "flashinfer"),
            rows=(("0.5.9", "0.3.21", "0.6.3"), ("0.5.10", "0.4.1", "0.6.7.post2")),
        ),
    )
    assert len(m.include) >= 1
    assert m.include[0].as_dict() == {
        "cuda": "12.8",
        "torch": "2.9.1",
        "sgl_kernel": "0.3.21",
        "flashinfer": "0.6.3",
        "sglang": "0.5.10",
    }
    assert m.include[0].reason == "keep the current kernels while upgrading SGLang"
    for rule in m.include:  # an include adds one whole cell
        assert {"cuda", "torch", "sgl_kernel", "flashinfer", "sglang"} <= set(rule.as_dict())
    assert m.exclude == ()
    assert m.overrides == ()  # the [[override]] in the file is commented out

    assert set(m.indexes) == {"pypi", "pytorch-cu130"}
    assert m.indexes["pypi"].url == "https://pypi.org/simple"
    assert m.indexes["pytorch-cu130"].url == "https://download.pytorch.org/whl/cu130"
    assert m.default_index == "pypi"
    assert len(m.routes) == 1
    assert str(m.routes[0].requirement) == "torch==2.9.1+cu130"
    assert m.routes[0].index == "pytorch-cu130"
    assert m.index_for("torch", "2.9.1+cu130") == "pytorch-cu130"
    assert m.index_for("torch", "2.9.1") == "pypi"
    assert m.index_for("sglang", "0.5.10") == "pypi"
    assert m.index_for("flashinfer-python", "0.6.3") == "pypi"

    assert m.platform == "manylinux_2_39_x86_64"
    assert m.archs == ("sm_120", "sm_90")
    assert m.reference_arch == "sm_90"
    assert m.models == (
        Model(name="kimi-k2.5", target="KimiK25ForConditionalGeneration", draft="LlamaForCausalLMEagle3"),
    )
    assert all((ps.path / "series").is_file() for ps in m.patch_sets)
    assert m.suites[0].name == "00-stack"
    assert [s.name for s in m.suites] == sorted(s.name for s in m.suites)
    assert m.suites[0].path == REPO / "suites" / "00-stack"
    assert m.suites[0].gate is True
    assert m.suites[0].timeout == 900
    assert m.suites[0].needs_gpu is False
    assert set(m.thresholds) == {"8x-rtx-pro-6000", "1x-h200"}
    assert dict(m.thresholds["8x-rtx-pro-6000"]) == {"decode_tok_s": 92.6, "eagle3_over_baseline": 1.0}
    # the H200 bounds are derived from two H200 runs, bound for bound: tests/test_gpu_run_record.py owns them
    assert m.thresholds["1x-h200"]["max_regression_pct"] == 20
    assert isinstance(m.features, dict)


def test_matrix_is_frozen() -> None:
    m = matrix.load(REPO / "matrix.toml")
    with pytest.raises(AttributeError):
        setattr(m, "platform", "other")  # noqa: B010  # frozen dataclass: assignment raises


def test_minimal_matrix_defaults(write_matrix: WriteMatrix) -> None:
    path = write_matrix(axes={"python": None})
    m = matrix.load(path)
    assert m.axes["python"] == ("3.11",)  # the one axis with a default
    assert (m.couples, m.include, m.exclude, m.overrides, m.routes) == ((), (), (), (), ())
    assert set(m.indexes) == {"pypi"}
    assert m.indexes["pypi"].url == "https://pypi.org/simple"
    assert m.default_index == "pypi"
    assert m.platform == "manylinux_2_39_x86_64"
    assert m.archs == ("sm_90",)
    assert m.reference_arch is None
    assert (m.models, m.patch_sets, m.suites) == ((), (), ())


# --------------------------------------------------------------------------- the file itself


def test_missing_file(tmp_path: Path) -> None:
    exc = load_fails(tmp_path / "matrix.toml")
    assert "no such matrix file" in str(exc)
    assert exc.line is None
    assert "--matrix" in exc.fix
    assert not (tmp_path / "matrix.toml").exists()


def test_malformed_toml_points_at_the_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text('[axes]\ncuda = ["12.8"]\ntorch = = "2.9.1"\nsglang = ["0.5.9"]\n', encoding="utf-8")
    exc = load_fails(path)
    assert "malformed TOML" in str(exc)
    assert "(line 3, column 9)" in str(exc)
    assert exc.line == 3
    assert exc.fix == "correct the syntax there"


def test_malformed_toml_repeated_table(tmp_path: Path) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text('[axes]\ncuda = ["12.8"]\n\n[axes]\ntorch = ["2.9.1"]\n', encoding="utf-8")
    exc = load_fails(path)
    # The second definition is the error's line; the message names the first one too.
    assert "malformed TOML: [axes] is defined twice (first at line 1)" in str(exc)
    assert exc.line == 4


def test_malformed_toml_repeated_key_in_a_table(tmp_path: Path) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text('[axes]\ncuda = ["12.8"]\n\ncuda = ["13.0"]\n', encoding="utf-8")
    exc = load_fails(path)
    assert "malformed TOML: `cuda` is defined twice (first at line 2)" in str(exc)
    assert exc.line == 4


def test_malformed_toml_repeated_quoted_key_in_a_later_table(tmp_path: Path) -> None:
    path = tmp_path / "matrix.toml"
    text = '[axes]\ncuda = ["12.8"]\n\n[indexes.pypi]\n"url" = "https://a.invalid/simple"\nurl = "https://b.invalid"\n'
    path.write_text(text, encoding="utf-8")
    exc = load_fails(path)
    assert "malformed TOML: `url` is defined twice (first at line 5)" in str(exc)
    assert exc.line == 6


def test_matrix_toml_is_read_without_tomlkit() -> None:
    """TOML is only read, so the standard library reads it (tomllib; tomli on 3.10): tomlkit is no dependency."""
    code = (
        "import sys; sys.modules['tomlkit'] = None\n"  # `import tomlkit` raises ImportError from here on
        "from stackfarm import matrix\n"
        f"print(len(matrix.load({str(REPO / 'matrix.toml')!r}).axes))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 5


# --------------------------------------------------------------------------- top level and [axes]


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = tmp_path / "matrix.toml"
    axes = "\n".join(f"{k} = {json.dumps(v)}" for k, v in BASE_AXES.items())
    path.write_text(f"version = 2\n\n[axes]\n{axes}\n", encoding="utf-8")
    exc = load_fails(path)
    assert "`version` in [top level] is unknown" in str(exc)
    assert exc.line == 1
    assert "axes, couple, include" in exc.fix


def test_unknown_top_level_table_gets_a_suggestion(write_matrix: WriteMatrix) -> None:
    path = write_matrix('\n[platfrom]\ntag = "manylinux_2_39_x86_64"\n')
    exc = load_fails(path)
    assert "`platfrom` in [top level] is unknown; did you mean `platform`?" in str(exc)


def test_unknown_top_level_table_names_its_line(write_matrix: WriteMatrix) -> None:
    path = write_matrix('\n[platfrom]\ntag = "manylinux_2_39_x86_64"\n')
    exc = load_fails(path)
    assert exc.line == line_no(path, "[platfrom]")


def test_unknown_axis_suggests_the_close_one(write_matrix: WriteMatrix) -> None:
    path = write_matrix('flashinfr = ["0.6.3"]\n', axes={"flashinfer": None})
    exc = load_fails(path)
    assert "`flashinfr` in [axes] is unknown; did you mean `flashinfer`?" in str(exc)
    assert exc.line == line_no(path, "flashinfr")
    assert "sgl_kernel" in exc.fix


def test_empty_axis(write_matrix: WriteMatrix) -> None:
    path = write_matrix(axes={"sglang": []})
    exc = load_fails(path)
    assert "axis `sglang` is empty" in str(exc)
    assert exc.line == line_no(path, "sglang = []")


def test_axis_that_is_not_a_list(write_matrix: WriteMatrix) -> None:
    path = write_matrix('cuda = "12.8"\n', axes={"cuda": None})
    exc = load_fails(path)
    assert "axis `cuda` must be a list" in str(exc)
    assert exc.line == line_no(path, 'cuda = "12.8"')


def test_missing_axis(write_matrix: WriteMatrix) -> None:
    path = write_matrix(axes={"sglang": None})
    exc = load_fails(path)
    assert "axis `sglang` is missing" in str(exc)
    assert exc.line == 1  # the [axes] header
    assert "sglang" in exc.fix


def test_missing_axes_table(tmp_path: Path) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text('[platform]\ntag = "manylinux_2_39_x86_64"\n', encoding="utf-8")
    exc = load_fails(path)
    assert "axis `cuda` is missing" in str(exc)
    assert exc.line is None  # there is no [axes] to point at


def test_value_that_is_not_a_version(write_matrix: WriteMatrix) -> None:
    path = write_matrix(axes={"cuda": ["12.8", "twelve"]})
    exc = load_fails(path)
    assert "`twelve` in [axes] cuda is not a PEP 440 version" in str(exc)
    assert exc.line == line_no(path, "cuda =")


def test_value_that_is_not_a_string(write_matrix: WriteMatrix) -> None:
    path = write_matrix("cuda = [12.8]\n", axes={"cuda": None})
    exc = load_fails(path)
    assert "`cuda` in [axes] must be a version string, got 12.8" in str(exc)
    assert exc.line == line_no(path, "cuda =")
    assert "quote it" in exc.fix


def test_duplicated_value(write_matrix: WriteMatrix) -> None:
    path = write_matrix(axes={"torch": ["2.9.1", "2.8.0", "2.9.1"]})
    exc = load_fails(path)
    assert "axis `torch` lists a value twice" in str(exc)
    assert exc.line == line_no(path, "torch =")


# --------------------------------------------------------------------------- [couple.*]


def test_couple_group_zips_its_axes(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [couple.cuda-torch]
        cuda = ["12.8", "13.0"]
        torch = ["2.9.1", "2.9.1+cu130"]
        """,
        axes={"cuda": ["12.8", "13.0"], "torch": ["2.9.1", "2.9.1+cu130"]},
    )
    m = matrix.load(path)
    assert m.couples == (
        Couple(name="cuda-torch", axes=("cuda", "torch"), rows=(("12.8", "2.9.1"), ("13.0", "2.9.1+cu130"))),
    )


def test_couple_lists_of_unequal_length(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [couple.ct]
        cuda = ["12.8", "13.0"]
        torch = ["2.9.1"]
        """,
        axes={"cuda": ["12.8", "13.0"]},
    )
    exc = load_fails(path)
    assert "the lists in [couple.ct] have different lengths" in str(exc)
    assert exc.line == line_no(path, "[couple.ct]")


def test_couple_value_not_in_the_axis(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [couple.ct]
        cuda = ["13.0"]
        torch = ["2.9.1"]
        """
    )
    exc = load_fails(path)
    assert "`13.0` in [couple.ct] cuda is not a value of that axis" in str(exc)
    # the line inside the couple group, not the line of cuda in [axes]
    assert exc.line == line_no(path, 'cuda = ["13.0"]')
    assert exc.line != line_no(path, "cuda =")
    assert "['12.8']" in exc.fix


def test_couple_axis_in_two_groups(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [couple.a]
        cuda = ["12.8"]
        torch = ["2.9.1"]

        [couple.b]
        sglang = ["0.5.9"]
        cuda = ["12.8"]
        """
    )
    exc = load_fails(path)
    assert "axis `cuda` is in two couple groups" in str(exc)
    # the second group's cuda (lines 1-7 are [axes], whose cuda is the first hit)
    assert exc.line == line_no(path, 'cuda = ["12.8"]', nth=3)


def test_couple_of_one_axis(write_matrix: WriteMatrix) -> None:
    path = write_matrix('\n[couple.alone]\ncuda = ["12.8"]\n')
    exc = load_fails(path)
    assert "[couple.alone] must list two or more axes" in str(exc)
    assert exc.line == line_no(path, "[couple.alone]")


def test_couple_unknown_axis(write_matrix: WriteMatrix) -> None:
    path = write_matrix('\n[couple.ct]\ncuda = ["12.8"]\ntroch = ["2.9.1"]\n')
    exc = load_fails(path)
    assert "`troch` in [couple.ct] is unknown; did you mean `torch`?" in str(exc)
    assert exc.line == line_no(path, "troch")


# --------------------------------------------------------------------------- [[include]] / [[exclude]]


def test_include_and_exclude_rules_load(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [[include]]
        cuda = "12.8"
        torch = "2.9.1"
        sgl_kernel = "0.3.21"
        flashinfer = "0.6.3"
        sglang = "0.5.10"
        reason = "try the upgrade"

        [[exclude]]
        sglang = "0.5.*"
        """
    )
    m = matrix.load(path)
    assert m.include == (
        Rule(
            match=(
                ("cuda", "12.8"),
                ("torch", "2.9.1"),
                ("sgl_kernel", "0.3.21"),
                ("flashinfer", "0.6.3"),
                ("sglang", "0.5.10"),
            ),
            reason="try the upgrade",
            line=line_no(path, "[[include]]"),
        ),
    )
    assert m.exclude == (Rule(match=(("sglang", "0.5.*"),), reason="", line=line_no(path, "[[exclude]]")),)


def test_include_missing_an_axis(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [[include]]
        cuda = "12.8"
        torch = "2.9.1"
        flashinfer = "0.6.3"
        """
    )
    exc = load_fails(path)
    assert "an [[include]] cell must give every axis; missing sgl_kernel, sglang" in str(exc)
    assert exc.line == line_no(path, "[[include]]")


def test_include_value_must_be_a_version(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [[include]]
        cuda = "12.8"
        torch = "2.9.1"
        sgl_kernel = "0.3.*"
        flashinfer = "0.6.3"
        sglang = "0.5.9"
        """
    )
    exc = load_fails(path)
    assert "`0.3.*` in [include] sgl_kernel is not a PEP 440 version" in str(exc)
    assert exc.line == line_no(path, 'sgl_kernel = "0.3.*"')


def test_exclude_names_an_unknown_axis(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [[exclude]]
        cudaa = "12.*"
        reason = "typo"
        """
    )
    exc = load_fails(path)
    assert "`cudaa` in [[exclude]] is not an axis; did you mean `cuda`?" in str(exc)
    assert exc.line == line_no(path, "cudaa")
    assert "sgl_kernel" in exc.fix


def test_exclude_with_only_a_reason_matches_nothing(write_matrix: WriteMatrix) -> None:
    path = write_matrix('\n[[exclude]]\nreason = "all of it"\n')
    exc = load_fails(path)
    assert "an entry of [[exclude]] matches nothing" in str(exc)
    assert exc.line == line_no(path, "[[exclude]]")


def test_error_in_second_exclude_points_at_the_second_entry(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [[exclude]]
        cuda = "13.*"

        [[exclude]]
        cudaa = "12.*"
        """
    )
    exc = load_fails(path)
    assert "`cudaa` in [[exclude]] is not an axis" in str(exc)
    assert exc.line == line_no(path, "cudaa")


def test_each_rule_records_its_own_line(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [[exclude]]
        cuda = "13.*"

        [[exclude]]
        sglang = "0.4.*"
        """
    )
    m = matrix.load(path)
    assert [rule.line for rule in m.exclude] == [
        line_no(path, "[[exclude]]", nth=1),
        line_no(path, "[[exclude]]", nth=2),
    ]


# --------------------------------------------------------------------------- [[override]]


def test_override_loads(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [[override]]
        axis = "flashinfer"
        when = { sglang = "0.5.9" }
        reason = "flashinfer 0.6.7 fixes the sm_120 allreduce fusion"
        """
    )
    m = matrix.load(path)
    assert m.overrides == (
        Override(
            when=(("sglang", "0.5.9"),),
            axis="flashinfer",
            reason="flashinfer 0.6.7 fixes the sm_120 allreduce fusion",
        ),
    )


def test_override_of_an_axis_that_cannot_be_overridden(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [[override]]
        axis = "sglang"
        reason = "because"
        """
    )
    exc = load_fails(path)
    assert "override axis `sglang` cannot be overridden" in str(exc)
    assert exc.line == line_no(path, 'axis = "sglang"')
    assert "torch, sgl_kernel, flashinfer" in exc.fix


def test_override_without_a_reason(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [[override]]
        axis = "torch"
        """
    )
    exc = load_fails(path)
    assert "an override needs a reason" in str(exc)
    assert exc.line == line_no(path, "[[override]]")
    assert "reason" in exc.fix


def test_override_with_an_empty_reason(write_matrix: WriteMatrix) -> None:
    path = write_matrix('\n[[override]]\naxis = "torch"\nreason = ""\n')
    exc = load_fails(path)
    assert "an override needs a reason" in str(exc)
    assert exc.line == line_no(path, "[[override]]")


def test_override_unknown_key(write_matrix: WriteMatrix) -> None:
    path = write_matrix('\n[[override]]\naxis = "torch"\nreasn = "x"\n')
    exc = load_fails(path)
    assert "`reasn` in [override] is unknown; did you mean `reason`?" in str(exc)
    assert exc.line == line_no(path, "reasn")


# --------------------------------------------------------------------------- [indexes] and [[route]]


def test_indexes_of_every_kind(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    path = write_matrix(
        """
        [indexes.mirror]
        url = "https://mirror.example/simple/"

        [indexes.local]
        find_links = "wheels"
        default = true

        [indexes.one]
        wheel = "dist/torch-2.9.1-cp311-cp311-linux_x86_64.whl"
        """
    )
    m = matrix.load(path)
    assert m.indexes["mirror"].url == "https://mirror.example/simple"  # trailing slash dropped
    assert m.indexes["local"].find_links == tmp_path / "wheels"  # relative to the matrix file
    assert m.indexes["one"].wheel == tmp_path / "dist/torch-2.9.1-cp311-cp311-linux_x86_64.whl"
    assert m.default_index == "local"
    assert m.index_for("torch", "2.9.1") == "local"


def test_first_index_is_the_default_when_none_says_so(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        '\n[indexes.a]\nurl = "https://a.example/simple"\n[indexes.b]\nurl = "https://b.example"\n'
    )
    assert matrix.load(path).default_index == "a"


def test_index_with_two_kinds(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [indexes.pypi]
        url = "https://pypi.org/simple"

        [indexes.both]
        url = "https://mirror.example/simple"
        find_links = "wheels"
        """
    )
    exc = load_fails(path)
    assert "[indexes.both] needs exactly one of url, find_links, wheel" in str(exc)
    assert exc.line == line_no(path, "[indexes.both]")


def test_index_with_no_kind(write_matrix: WriteMatrix) -> None:
    path = write_matrix("\n[indexes.none]\ndefault = true\n")
    exc = load_fails(path)
    assert "[indexes.none] needs exactly one of url, find_links, wheel" in str(exc)
    assert exc.line == line_no(path, "[indexes.none]")


def test_route_to_an_unknown_index(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [indexes.pypi]
        url = "https://pypi.org/simple"

        [indexes.pytorch-cu130]
        url = "https://download.pytorch.org/whl/cu130"

        [[route]]
        requirement = "torch==2.9.1+cu130"
        index = "pytorch-cu13"
        """
    )
    exc = load_fails(path)
    assert "route index `pytorch-cu13` is not in [indexes]; did you mean `pytorch-cu130`?" in str(exc)
    assert exc.line == line_no(path, 'index = "pytorch-cu13"')
    assert exc.fix == "use one of: pypi, pytorch-cu130"


def test_route_with_an_invalid_requirement(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [[route]]
        requirement = "torch=2.9.1"
        index = "pypi"
        """
    )
    exc = load_fails(path)
    assert "route requirement is invalid" in str(exc)
    assert exc.line == line_no(path, "requirement =")
    assert "torch==2.9.1+cu130" in exc.fix


def test_routes_pick_the_index(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [indexes.pypi]
        url = "https://pypi.org/simple"
        default = true

        [indexes.nightly]
        url = "https://download.pytorch.org/whl/nightly/cu130"

        [[route]]
        requirement = "torch>=2.10.0.dev0"
        index = "nightly"
        """
    )
    m = matrix.load(path)
    assert m.index_for("torch", "2.10.0.dev20250101") == "nightly"  # pre-releases are routed too
    assert m.index_for("torch", "2.9.1") == "pypi"
    assert m.index_for("sglang", "2.10.0") == "pypi"  # another distribution


def test_route_names_are_compared_normalised(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [indexes.pypi]
        url = "https://pypi.org/simple"
        default = true

        [indexes.mirror]
        url = "https://mirror.example/simple"

        [[route]]
        requirement = "flashinfer_python==0.6.3"
        index = "mirror"
        """
    )
    m = matrix.load(path)
    # plan.components asks with canonical names, the way sglang's own Requires-Dist spells it does not
    assert m.index_for("flashinfer-python", "0.6.3") == "mirror"


# --------------------------------------------------------------------------- [targets]


def test_targets_accept_arch_variants(write_matrix: WriteMatrix) -> None:
    path = write_matrix('\n[targets]\narchs = ["sm_90a", "sm_100f", "sm_120"]\nreference = "sm_90a"\n')
    m = matrix.load(path)
    assert m.archs == ("sm_90a", "sm_100f", "sm_120")
    assert m.reference_arch == "sm_90a"


@pytest.mark.parametrize("arch", ["sm90", "sm_9", "compute_90", "SM_90", "sm_1200"])
def test_bad_arch(write_matrix: WriteMatrix, arch: str) -> None:
    path = write_matrix(f'\n[targets]\nreference = "sm_120"\narchs = ["sm_120", "{arch}"]\n')
    exc = load_fails(path)
    assert f"`{arch}` in [targets] archs is not a GPU arch" in str(exc)
    assert exc.line == line_no(path, "archs =")


def test_reference_not_in_archs(write_matrix: WriteMatrix) -> None:
    path = write_matrix('\n[targets]\narchs = ["sm_120", "sm_90"]\nreference = "sm_80"\n')
    exc = load_fails(path)
    assert "reference arch `sm_80` is not in archs" in str(exc)
    assert exc.line == line_no(path, "reference =")
    assert exc.fix == "add it to archs"


def test_unknown_key_in_targets(write_matrix: WriteMatrix) -> None:
    path = write_matrix('\n[targets]\narch = ["sm_90"]\n')
    exc = load_fails(path)
    assert "`arch` in [targets] is unknown; did you mean `archs`?" in str(exc)
    assert exc.line == line_no(path, "arch =")


# --------------------------------------------------------------------------- [patches.*]


def test_patch_set_loads(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    (tmp_path / "patches" / "sm120-fix").mkdir(parents=True)
    (tmp_path / "patches" / "sm120-fix" / "series").write_text("0001-fix.patch\n", encoding="utf-8")
    path = write_matrix('\n[patches.sm120-fix]\napplies_to = "sglang>=0.5.9,<0.5.10"\noptional = true\n')
    m = matrix.load(path)
    (ps,) = m.patch_sets
    assert ps.name == "sm120-fix"
    assert ps.path == tmp_path / "patches" / "sm120-fix"
    assert ps.applies_to == SpecifierSet(">=0.5.9,<0.5.10")
    assert ps.optional is True
    assert ps.applies_to.contains("0.5.9")
    assert not ps.applies_to.contains("0.5.10")


def test_patch_set_without_series(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    (tmp_path / "patches" / "sm120-fix").mkdir(parents=True)  # the folder, but no series file
    path = write_matrix('\n[patches.sm120-fix]\napplies_to = "sglang>=0.5.9"\n')
    exc = load_fails(path)
    assert f"patch set `sm120-fix` has no {tmp_path / 'patches' / 'sm120-fix' / 'series'}" in str(exc)
    assert exc.line == line_no(path, "[patches.sm120-fix]")
    assert not (tmp_path / "patches" / "sm120-fix" / "series").exists()


def test_patch_set_with_invalid_applies_to(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    (tmp_path / "patches" / "fix").mkdir(parents=True)
    (tmp_path / "patches" / "fix" / "series").write_text("", encoding="utf-8")
    path = write_matrix('\n[patches.fix]\napplies_to = "sglang newer than 0.5"\n')
    exc = load_fails(path)
    assert "applies_to of [patches.fix] is not a version specifier" in str(exc)
    assert exc.line == line_no(path, "applies_to =")


# --------------------------------------------------------------------------- [suites.*]


def test_suites_are_discovered_in_nn_order(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    for name in ("10-perf", "00-stack", "05-serve"):
        make_suite(tmp_path, name)
    make_suite(tmp_path, "07-empty", with_test=False)  # no test_*.py: not a suite
    make_suite(tmp_path, "misc")  # no NN- prefix: not a suite
    path = write_matrix(
        """
        [suites.05-serve]
        needs_gpu = true
        gate = false
        timeout = 60
        """
    )
    m = matrix.load(path)
    assert [s.name for s in m.suites] == ["00-stack", "05-serve", "10-perf"]
    assert [s.path for s in m.suites] == [
        tmp_path / "suites" / n for n in ("00-stack", "05-serve", "10-perf")
    ]
    serve = m.suites[1]
    assert (serve.needs_gpu, serve.gate, serve.timeout, dict(serve.settings)) == (
        True,
        False,
        60,
        {},
    )
    stack = m.suites[0]  # not mentioned: defaults
    assert (stack.needs_gpu, stack.gate, stack.timeout, dict(stack.settings)) == (False, True, 1800, {})
    assert list(matrix.discover_suites(tmp_path)) == ["00-stack", "05-serve", "10-perf"]


def test_discover_suites_without_a_folder(tmp_path: Path) -> None:
    assert matrix.discover_suites(tmp_path) == {}


def test_disabled_suite_is_dropped(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    make_suite(tmp_path, "00-stack")
    make_suite(tmp_path, "10-perf")
    path = write_matrix("\n[suites.10-perf]\nenabled = false\n")
    assert [s.name for s in matrix.load(path).suites] == ["00-stack"]


def test_unknown_suite_gets_a_suggestion(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    make_suite(tmp_path, "00-stack")
    make_suite(tmp_path, "10-perf")
    path = write_matrix("\n[suites.00-stak]\ngate = true\n")
    exc = load_fails(path)
    assert "suite `00-stak` in [suites] does not exist under suites/; did you mean `00-stack`?" in str(exc)
    assert exc.line == line_no(path, "[suites.00-stak]")
    assert exc.fix == "known suites: 00-stack, 10-perf"


def test_suite_when_there_are_no_suites(write_matrix: WriteMatrix) -> None:
    path = write_matrix("\n[suites.00-stack]\ngate = true\n")
    exc = load_fails(path)
    assert "suite `00-stack` in [suites] does not exist under suites/" in str(exc)
    assert exc.fix == "known suites: none"


def test_unknown_suite_setting(write_matrix: WriteMatrix, tmp_path: Path) -> None:
    make_suite(tmp_path, "00-stack")
    path = write_matrix("\n[suites.00-stack]\ntimout = 10\n")
    exc = load_fails(path)
    assert "`timout` in [suites.00-stack] is unknown; did you mean `timeout`?" in str(exc)
    assert exc.line == line_no(path, "timout")


# --------------------------------------------------------------------------- [[models]]


def test_model_entry_needs_every_key(write_matrix: WriteMatrix) -> None:
    path = write_matrix('\n[[models]]\nname = "kimi"\ntarget = "KimiK25ForConditionalGeneration"\n')
    exc = load_fails(path)
    assert "a [[models]] entry needs `draft`" in str(exc)
    assert exc.line == line_no(path, "[[models]]")


# --------------------------------------------------------------------------- locate()


def test_locate_finds_the_line_of_a_key_in_its_table(tmp_path: Path) -> None:
    path = tmp_path / "matrix.toml"
    path.write_text(
        textwrap.dedent(
            """\
            [axes]
            cuda = ["12.8", "13.0"]
            torch = ["2.9.1", "2.9.1+cu130"]

            [couple . cuda-torch]   # spaced header, trailing comment
            # cuda = ["commented"]
              cuda = ["12.8", "13.0"]
            "torch" = ["2.9.1", "2.9.1+cu130"]

            [targets]
            archs = ["sm_120"]
            """
        ),
        encoding="utf-8",
    )
    before = _tree(tmp_path)
    assert matrix.locate(path, "axes") == 1
    assert matrix.locate(path, "axes", "cuda") == 2
    assert matrix.locate(path, "axes", "torch") == 3
    assert matrix.locate(path, "couple.cuda-torch") == 5
    assert matrix.locate(path, "couple.cuda-torch", "cuda") == 7
    assert matrix.locate(path, "couple.cuda-torch", "torch") == 8
    assert matrix.locate(path, "targets", "archs") == 11
    # a key the table lacks: the table's header; a table the file lacks: nothing
    assert matrix.locate(path, "targets", "reference") == 10
    assert matrix.locate(path, "platform") is None
    assert _tree(tmp_path) == before


def test_locate_in_a_missing_file(tmp_path: Path) -> None:
    assert matrix.locate(tmp_path / "nope.toml", "axes", "cuda") is None
    assert not (tmp_path / "nope.toml").exists()


def test_locate_on_the_real_matrix() -> None:
    path = REPO / "matrix.toml"
    assert matrix.locate(path, "targets", "reference") == line_no(path, 'reference = "sm_90"')
    assert matrix.locate(path, "couple.sglang-pins", "flashinfer") == line_no(path, "flashinfer = [", nth=2)
