"""A synthetic stack of real (tiny) wheels on a local find_links index, and a project around it.

The runner's rules (gates, pytest's exit 5, verdict reuse, exit codes) are tested end to end against it, with
no download: every distribution a cell installs is a genuine wheel (a zip with a valid ``*.dist-info``:
METADATA, WHEEL and a RECORD of sha256 digests, PEP 376 / PEP 427) holding one tiny importable package.

Use it from a test module with ``pytest_plugins = ("fakestack",)`` and the ``fake_project`` fixture (it has no
assertions of its own: PYTEST_DONT_REWRITE, so importing it before pytest does is fine).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import textwrap
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
#: The tag of every fake wheel: pure Python, so any [platform] tag of the matrix accepts it.
WHEEL_TAG = "py3-none-any"
#: A fixed timestamp inside every zip: the same inputs always give the same bytes, hence the same sha256.
_ZIP_TIME = (2020, 1, 1, 0, 0, 0)

# --------------------------------------------------------------------------- the stack

#: A cell's axis values (the five wheel axes and cuda; python is the matrix' single "3.11").
Stack = Mapping[str, str]

#: SGLang 0.5.9 with what it pins: the cell every test runs unless it asks for another.
OLD: Stack = {
    "cuda": "12.8",
    "torch": "2.9.1",
    "sgl_kernel": "0.3.21",
    "flashinfer": "0.6.3",
    "sglang": "0.5.9",
}
#: SGLang 0.5.10 with what it pins: the kernel distribution is sglang-kernel from 0.4 on.
NEW: Stack = {
    "cuda": "12.8",
    "torch": "2.9.1",
    "sgl_kernel": "0.4.1",
    "flashinfer": "0.6.7.post2",
    "sglang": "0.5.10",
}
#: SGLang 0.5.10 on the old kernels: its own pins contradict the cell, so the plan marks it a conflict.
CONFLICT: Stack = {**OLD, "sglang": "0.5.10"}
#: The CUDA 13.0 build of torch (a local label), for plans over a cuda/torch couple.
CU130: Stack = {**OLD, "cuda": "13.0", "torch": "2.9.1+cu130"}

#: What each fake SGLang release pins in its METADATA (Requires-Dist), like the real wheels do.
SGLANG_PINS: dict[str, tuple[str, ...]] = {
    "0.5.9": ("torch==2.9.1", "sgl-kernel==0.3.21", "flashinfer-python==0.6.3"),
    "0.5.10": ("torch==2.9.1", "sglang-kernel==0.4.1", "flashinfer-python==0.6.7.post2"),
}
#: Every (distribution, version) on the fake index.
DISTRIBUTIONS: tuple[tuple[str, str], ...] = (
    ("torch", "2.9.1"),
    ("torch", "2.9.1+cu130"),
    ("sgl-kernel", "0.3.21"),
    ("sglang-kernel", "0.4.1"),
    ("flashinfer-python", "0.6.3"),
    ("flashinfer-cubin", "0.6.3"),
    ("flashinfer-python", "0.6.7.post2"),
    ("flashinfer-cubin", "0.6.7.post2"),
    ("sglang", "0.5.9"),
    ("sglang", "0.5.10"),
)
#: The import package each distribution ships (sglang-kernel kept sgl-kernel's module name).
PACKAGE: dict[str, str] = {
    "torch": "torch",
    "sgl-kernel": "sgl_kernel",
    "sglang-kernel": "sgl_kernel",
    "flashinfer-python": "flashinfer",
    "flashinfer-cubin": "flashinfer_cubin",
    "sglang": "sglang",
}


def kernel_distribution(version: str) -> str:
    """sgl-kernel up to 0.3.x, sglang-kernel from 0.4 (the rename stackfarm.stack knows)."""
    return "sglang-kernel" if Version(version) >= Version("0.4") else "sgl-kernel"


def cell_id(stack: Stack) -> str:
    """The id stackfarm gives a cell of these values (one python: no py suffix)."""
    torch = Version(stack["torch"]).public
    return (
        f"cu{stack['cuda'].replace('.', '')}-torch{torch}-sk{stack['sgl_kernel']}"
        f"-fi{stack['flashinfer']}-sgl{stack['sglang']}"
    )


def _record_hash(data: bytes) -> str:
    """RECORD's hash field: sha256, urlsafe base64 without padding (PEP 376 as amended by PEP 427)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode('ascii')}"


def _escaped(distribution: str) -> str:
    """The distribution as a wheel filename component: runs of -_. become one underscore (PEP 427/491)."""
    return canonicalize_name(distribution).replace("-", "_")


def write_wheel(
    folder: Path,
    distribution: str,
    version: str,
    *,
    requires: Iterable[str] = (),
    files: Mapping[str, str | bytes] | None = None,
) -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` into `folder` and return its path.

    `files` maps paths inside the wheel to their text (or bytes); by default the wheel holds its import package
    (``PACKAGE[distribution]/__init__.py``) with ``__version__`` and ``__distribution__``.
    """
    name = _escaped(distribution)
    info = f"{name}-{version}.dist-info"
    if files is None:
        package = PACKAGE.get(canonicalize_name(distribution), name)
        files = {
            f"{package}/__init__.py": (
                f'"""Fake {distribution} {version} (stackfarm tests)."""\n\n'
                f'__version__ = "{version}"\n__distribution__ = "{distribution}"\n'
            )
        }
    metadata = "".join(
        [
            "Metadata-Version: 2.1\n",
            f"Name: {distribution}\n",
            f"Version: {version}\n",
            "Summary: a synthetic wheel for stackfarm's runner tests\n",
            *(f"Requires-Dist: {req}\n" for req in requires),
        ]
    )
    wheel = f"Wheel-Version: 1.0\nGenerator: stackfarm-fakestack\nRoot-Is-Purelib: true\nTag: {WHEEL_TAG}\n"
    members: dict[str, bytes] = {p: t.encode() if isinstance(t, str) else t for p, t in files.items()}
    members[f"{info}/METADATA"] = metadata.encode()
    members[f"{info}/WHEEL"] = wheel.encode()
    record_path = f"{info}/RECORD"
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in members.items())
    members[record_path] = (record + f"{record_path},,\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-{WHEEL_TAG}.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for member, data in members.items():
            entry = zipfile.ZipInfo(member, date_time=_ZIP_TIME)
            entry.external_attr = (stat.S_IFREG | 0o644) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(entry, data)
    return path


#: What the kernel wheel of `native_kernel_files` links from the driver: at import (through its extension
#: module) and lazily (a library no extension needs).
AT_IMPORT_SYMBOL = "cuGreenCtxStreamCreate"  # CUDA 12.5: driver >= 555.42.02
LAZY_SYMBOL = "cuCtxGetDevice_v2"  # CUDA 13.0: driver >= 580.65.06


def native_kernel_files(work: Path, package: str = "sgl_kernel") -> dict[str, str | bytes]:
    """A kernel package with real shared objects, compiled here (cc): the extension module ``ops.so``
    (PyInit_ops) needs ``libkern.so`` (found by $ORIGIN), which calls AT_IMPORT_SYMBOL of libcuda.so.1;
    ``lazy.so``, which no extension needs (Python would dlopen it later), calls LAZY_SYMBOL. libcuda.so.1 is a
    stub built only to link against: the driver is the system's, never the wheel's."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc/gcc) on PATH")
    work.mkdir(parents=True, exist_ok=True)

    def build(name: str, source: str, *args: str) -> Path:
        (work / f"{name}.c").write_text(source, encoding="utf-8")
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(work / name), str(work / f"{name}.c"), *args],
                       check=True, capture_output=True)  # fmt: skip
        return work / name

    build("libcuda.so.1", f"int {AT_IMPORT_SYMBOL}(void) {{ return 0; }}\nint {LAZY_SYMBOL}(void) {{ return 0; }}\n",
          "-Wl,-soname,libcuda.so.1")  # fmt: skip
    cuda = ("-L", str(work), "-l:libcuda.so.1")
    build("libkern.so", f"int {AT_IMPORT_SYMBOL}(void);\nint kern(void) {{ return {AT_IMPORT_SYMBOL}(); }}\n",
          "-Wl,-soname,libkern.so", *cuda)  # fmt: skip
    build("lazy.so", f"int {LAZY_SYMBOL}(void);\nint lazy(void) {{ return {LAZY_SYMBOL}(); }}\n", *cuda)
    build("ops.so", "int kern(void);\nvoid *PyInit_ops(void) { kern(); return 0; }\n",
          "-L", str(work), "-l:libkern.so", "-Wl,-rpath,$ORIGIN")  # fmt: skip
    return {
        f"{package}/__init__.py": '"""A fake kernel package with native libraries (stackfarm tests)."""\n',
        **{f"{package}/{name}": (work / name).read_bytes() for name in ("ops.so", "libkern.so", "lazy.so")},
    }


def write_stack(folder: Path, distributions: Iterable[tuple[str, str]] = DISTRIBUTIONS) -> list[Path]:
    """Every wheel of the fake index into `folder` (a find_links index); sglang's wheels carry its pins."""
    return [
        write_wheel(
            folder,
            dist,
            version,
            requires=SGLANG_PINS.get(version, ()) if dist == "sglang" else (),
        )
        for dist, version in distributions
    ]


# --------------------------------------------------------------------------- the suites

#: Test modules by kind: each suite is suites/NN-name/test_it.py with one of these.
SUITES: dict[str, str] = {
    # Imports every component of the cell from the tree the backend realised it in, checking its version.
    "pass": """
        import importlib.util
        import sys
        from pathlib import Path

        PACKAGES = {
            "torch": "torch", "sgl-kernel": "sgl_kernel", "sglang-kernel": "sgl_kernel",
            "flashinfer-python": "flashinfer", "flashinfer-cubin": "flashinfer_cubin", "sglang": "sglang",
        }


        def test_every_component_is_realised(cell):
            assert [c.distribution for c in cell.components], "the cell has no components"
            for comp in cell.components:
                init = Path(comp.root) / PACKAGES[comp.distribution] / "__init__.py"
                spec = importlib.util.spec_from_file_location(f"fake_{comp.distribution}", init)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                assert (module.__distribution__, module.__version__) == (comp.distribution, comp.version)


        def test_the_cell_has_sglang(cell):
            assert cell.component("sglang").version == cell.values["sglang"]
            assert sys.version_info >= (3, 10)
    """,
    "fail": """
        def test_passes(cell):
            assert cell.values["sglang"], "the cell names its sglang"


        def test_fails():
            assert 1 + 1 == 3, "synthetic failure"
    """,
    # A testcase that cannot answer without a GPU: a plain skip, the cell stays incomplete.
    "gpu-skip": """
        import pytest


        def test_passes(cell):
            assert cell.values["sglang"], "the cell names its sglang"


        def test_needs_a_gpu():
            pytest.skip("needs GPU: the fake stack has none")
    """,
    # A testcase that has no question for this cell: suitekit.not_applicable with a reason class, which does
    # not count.
    "not-applicable": """
        from stackfarm.suitekit import NA, not_applicable


        def test_passes(cell):
            assert cell.values["sglang"], "the cell names its sglang"


        def test_does_not_apply():
            not_applicable(NA.COMPONENT_ABSENT, "the fake cell has no such component")
    """,
    # Claims "does not apply" without earning it: a bare "n/a: " skip text, and a suite recording the mark
    # itself. Both are unanswered: the cell stays incomplete.
    "claims-na": """
        import pytest


        def test_passes(cell):
            assert cell.values["sglang"], "the cell names its sglang"


        def test_says_na():
            pytest.skip("n/a: whatever")


        def test_forges_the_mark(record_property):
            record_property("stackfarm.not_applicable", "component-absent")
            pytest.skip("n/a: forged")
    """,
    # Asks a 2-GPU question on a machine that reports FAKESTACK_GPUS GPUs (0 unless set): n/a only where the
    # cell's [runners.<kind>] has fewer GPUs and this machine is that kind.
    "two-gpus": """
        import os

        from stackfarm.suitekit import need_gpus


        def test_passes(cell):
            assert cell.values["sglang"], "the cell names its sglang"


        def test_two_gpus(cell):
            need_gpus(cell, 2, int(os.environ.get("FAKESTACK_GPUS", "0")), "tensor parallelism")
    """,
    # Collects nothing: pytest exits 5.
    "empty": """
        def helper():
            return 1
    """,
    # Raises while pytest imports it: a collection error (pytest exits 2, like an interrupt does).
    "import-crash": """
        raise RuntimeError("synthetic crash at import")


        def test_never_collected():
            pass
    """,
    # The interpreter dies in the middle of the run: no JUnit file at all.
    "dies": """
        import os


        def test_dies():
            os._exit(3)
    """,
    # Must never run: placed after a failing gate (a run would be a failure, not a skip).
    "never": """
        def test_must_not_run():
            raise AssertionError("this suite must have been gated")
    """,
    # Depends on the cell: a GPU skip (incomplete) on SGLang 0.5.9, a failure on 0.5.10.
    "by-cell": """
        import pytest


        def test_depends_on_the_cell(cell):
            if cell.values["sglang"] == "0.5.10":
                raise AssertionError("synthetic failure on sglang 0.5.10")
            pytest.skip("needs GPU: the fake stack has none")
    """,
    # Long enough to be interrupted.
    "slow": """
        import time


        def test_slow():
            time.sleep(60)
    """,
}


#: Every suite module starts with this: it appends "<cell id> <suite>" to $FAKESTACK_RUNS when pytest imports
#: it, so a test sees which suites really ran (a reused verdict or a gate runs none) without reading logs.
_RECORD_RUN = """
    import json as _json
    import os as _os
    from pathlib import Path as _Path

    if _os.environ.get("FAKESTACK_RUNS"):
        _spec = _os.environ.get("STACKFARM_CELL")
        _cell = _json.loads(_Path(_spec).read_text())["id"] if _spec else "?"
        with open(_os.environ["FAKESTACK_RUNS"], "a", encoding="utf-8") as _runs:
            _runs.write(f"{_cell} {_Path(__file__).parent.name}\\n")
"""


def write_suite(suites: Path, name: str, kind: str) -> Path:
    """suites/<name>/test_it.py of one of the SUITES kinds."""
    folder = suites / name
    folder.mkdir(parents=True, exist_ok=True)
    body = textwrap.dedent(_RECORD_RUN).lstrip() + "\n\n" + textwrap.dedent(SUITES[kind]).lstrip()
    (folder / "test_it.py").write_text(body, encoding="utf-8")
    return folder


def _toml(value: object) -> str:
    """A TOML value for the scalars and lists a matrix uses here (JSON spells them the same way)."""
    return json.dumps(value)


# --------------------------------------------------------------------------- the project


@dataclass
class FakeProject:
    """A matrix folder with the fake index, its own suites and the real suites/conftest.py."""

    root: Path
    cache: Path
    suite_config: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def wheels(self) -> Path:
        return self.root / "wheels"

    @property
    def suites(self) -> Path:
        return self.root / "suites"

    @property
    def matrix(self) -> Path:
        return self.root / "matrix.toml"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def runs_log(self) -> Path:
        """Where the suites record that they ran (the fixture sets $FAKESTACK_RUNS to it)."""
        return self.root.parent / "runs.log"

    def runs(self) -> list[tuple[str, str]]:
        """(cell id, suite) for every suite pytest imported so far, in order."""
        if not self.runs_log.is_file():
            return []
        lines = self.runs_log.read_text(encoding="utf-8").splitlines()
        return [(cell, suite) for cell, suite in (line.split(" ", 1) for line in lines if line)]

    def suite(self, name: str, kind: str, **config: Any) -> Path:
        """Add suites/<name>/ of `kind` (a SUITES key); `config` is its [suites.<name>] table (gate, ...)."""
        self.suite_config[name] = dict(config)
        return write_suite(self.suites, name, kind)

    def write_matrix(
        self,
        cells: Sequence[Stack] = (OLD,),
        *,
        axes: Mapping[str, Sequence[str]] | None = None,
        extra: str = "",
    ) -> Path:
        """matrix.toml: the first cell is [axes] (each value once, `axes` adds values), the others are
        [[include]] cells; the fake index is the default; then one [suites.<name>] table per suite."""
        first, *others = cells
        values = {axis: [value] for axis, value in first.items()}
        for axis, more in (axes or {}).items():
            values[axis] = [*values.get(axis, []), *(v for v in more if v not in values.get(axis, []))]
        lines = ["[axes]", *(f"{axis} = {_toml(v)}" for axis, v in values.items()), 'python = ["3.11"]', ""]
        for other in others:
            lines += ["[[include]]", *(f"{axis} = {_toml(v)}" for axis, v in other.items()), ""]
        lines += [
            "[indexes.local]",
            'find_links = "wheels"',
            "default = true",
            "",
            "[platform]",
            'tag = "manylinux_2_39_x86_64"',
            "",
            "[targets]",
            'archs = ["sm_90"]',
            "",
        ]
        for name, config in self.suite_config.items():
            lines += [f"[suites.{name}]", *(f"{k} = {_toml(v)}" for k, v in config.items()), ""]
        self.matrix.write_text("\n".join(lines) + textwrap.dedent(extra), encoding="utf-8")
        return self.matrix

    def argv(self, *args: str) -> list[str]:
        """`stackfarm run` on this project with the local backend, one cell at a time."""
        where = ["--matrix", str(self.matrix), "--reports", str(self.reports)]
        return ["run", *where, "--backend", "local", "--jobs", "1", *args]

    def run(self, *args: str) -> int:
        """The exit code of `stackfarm run` (in this process) with `args` added."""
        from stackfarm.cli import main  # imported late: a broken cli fails the tests that run it, not all

        return main(self.argv(*args))


def make_project(root: Path, monkeypatch: pytest.MonkeyPatch) -> FakeProject:
    """Write the fake index and the suites' conftest under `root`; point the cache and the GPU probe at
    `root` too: the user's cache is never touched, and no GPU answers (whatever the machine has)."""
    project = FakeProject(root=root / "project", cache=root / "cache")
    write_stack(project.wheels)
    project.suites.mkdir(parents=True)
    shutil.copy(REPO / "suites" / "conftest.py", project.suites / "conftest.py")
    monkeypatch.setenv("STACKFARM_CACHE", str(project.cache))
    monkeypatch.setenv("FAKESTACK_RUNS", str(project.runs_log))
    # The suites need no pytest plugin; loading the venv's (hypothesis, xdist) costs most of a second per suite.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps its messages at the terminal's width: keep them whole
    # An nvidia-smi that lists nothing: every run sees "no GPU", on a GPU machine as well.
    bin_dir = root / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'No devices were found (stackfarm fake)'\nexit 6\n", encoding="utf-8")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return project


@pytest.fixture
def fake_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeProject:
    """A project on the fake index, with no suites yet: add them with `.suite()`, then `.write_matrix()`."""
    return make_project(tmp_path, monkeypatch)


__all__ = [
    "AT_IMPORT_SYMBOL",
    "CONFLICT",
    "CU130",
    "DISTRIBUTIONS",
    "LAZY_SYMBOL",
    "NEW",
    "OLD",
    "SGLANG_PINS",
    "SUITES",
    "FakeProject",
    "cell_id",
    "fake_project",
    "kernel_distribution",
    "make_project",
    "native_kernel_files",
    "write_stack",
    "write_suite",
    "write_wheel",
]
