"""The python axis names CPython feature releases stackfarm runs under (stackfarm.stack.PYTHONS): anything else
is a matrix error at load, naming file:line, the key and the fix, before any index is asked or cell planned."""

from __future__ import annotations

import sys

import pytest

from conftest import WriteMatrix
from stackfarm.errors import ConfigError, ExitCode
from stackfarm.matrix import load
from stackfarm.stack import PYTHONS

#: [axes]'s python key is line 7 of the conftest matrix (after the header and five axes).
PYTHON_LINE = 7


def test_the_running_python_is_supported() -> None:
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in PYTHONS


def test_every_supported_python_loads(write_matrix: WriteMatrix) -> None:
    assert load(write_matrix(axes={"python": list(PYTHONS)})).axes["python"] == PYTHONS


@pytest.mark.parametrize(
    ("value", "says", "fix"),
    [
        (
            "3.6",
            "CPython 3.6 is not supported: stackfarm (and so every suite) needs Python 3.10",
            "use one of 3.10",
        ),
        ("3.9", "CPython 3.9 is not supported", "use one of 3.10, 3.11, 3.12, 3.13, 3.14"),
        ("2.7", "CPython 2.7 is not supported", "use one of"),
        (
            "3.15",
            "`3.15` is not a CPython release stackfarm knows (3.10 to 3.14)",
            "use one of 3.10, 3.11, 3.12, 3.13, 3.14 (a CPython released since",
        ),
        ("3.99", "`3.99` is not a CPython release stackfarm knows", "use one of"),
        ("4.0", "`4.0` is not a CPython release stackfarm knows", "use one of"),
        ("3.11.7", "`3.11.7` is a patch release: the python axis names a feature release", 'write "3.11"'),
    ],
)
def test_an_unknown_or_unsupported_python_is_a_matrix_error(
    write_matrix: WriteMatrix, value: str, says: str, fix: str
) -> None:
    path = write_matrix(axes={"python": ["3.11", value]})
    with pytest.raises(ConfigError) as info:
        load(path)
    text = str(info.value)
    assert text.startswith(f'{path}:{PYTHON_LINE}: [axes] python = "{value}": '), text
    assert says in text
    assert f"\n  fix: {fix}" in text
    assert info.value.exit_code == ExitCode.CONFIG


def test_an_include_of_an_unknown_python_names_its_entry(write_matrix: WriteMatrix) -> None:
    path = write_matrix(
        """
        [[include]]
        cuda = "12.8"
        torch = "2.9.1"
        sgl_kernel = "0.3.21"
        flashinfer = "0.6.3"
        sglang = "0.5.9"

        [[include]]
        cuda = "12.8"
        torch = "2.9.1"
        sgl_kernel = "0.3.21"
        flashinfer = "0.6.3"
        sglang = "0.5.9"
        python = "3.8"
        """
    )
    with pytest.raises(ConfigError) as info:
        load(path)
    lines = path.read_text().splitlines()
    assert lines[(info.value.line or 0) - 1] == 'python = "3.8"', str(info.value)
    assert '[[include]] python = "3.8": CPython 3.8 is not supported' in str(info.value)
