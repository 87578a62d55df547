"""Declarations several suite families' settings share (stackfarm.schema pieces): the deployment's environment
table, Python class-name lists, package lists, PEP 440 versions and the "module:qualname" pattern.

Ground floor: imports stackfarm.schema and packaging only; suites/NN-name/family.py files import it.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from .schema import Either, List, Map, Number, Str

#: A Python identifier (a class, a setting).
CLASS = r"[A-Za-z_][A-Za-z0-9_]*"
#: A distribution or package name.
PACKAGE = r"[A-Za-z0-9][A-Za-z0-9._-]*"
#: A function or attribute "module:qualname".
GATE = r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*"


def version(text: str) -> str | None:
    """A check: `text` is a PEP 440 version."""
    try:
        Version(text)
    except InvalidVersion:
        return f"{text!r} is not a PEP 440 version"
    return None


def classes(what: str) -> List:
    """A list of distinct Python class names."""
    return List(Str("a Python class name", pattern=CLASS), f'{what}, e.g. ["LlamaForCausalLM"]', unique=True)


#: The packages a static scan reads.
PACKAGES = List(Str("a package name", pattern=PACKAGE), 'the packages scanned, e.g. ["sglang"]', min_len=1)

#: environ = { NAME = "value" }: the deployment's environment for a static evaluation (10-capability, 15-toolchain).
ENVIRON = Map(
    Either((Str("a value", nonempty=False), Number("a number")), 'a string: environ = { NAME = "value" }'),
    'the deployment\'s environment for the gate evaluation: environ = { NAME = "value" }',
    keys=lambda key: None if key and key.replace("_", "a").isalnum() else "is not a variable name",
    noun="variable",
)

__all__ = ["CLASS", "ENVIRON", "GATE", "PACKAGE", "PACKAGES", "classes", "version"]
