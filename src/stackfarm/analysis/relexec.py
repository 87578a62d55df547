"""Run a few top-level definitions of a release's Python file, as written, with stand-ins for what they read.

The toolchain suite asks what a release will hand its compiler on a GPU: Triton's `sm_arch_from_capability`
and `get_ptxas`, flashinfer's `CompilationContext`. Those are small, pure functions of the device's
capability, the environment and the toolkit's version. `load_definitions` parses the file, keeps only the
named top-level functions and classes (never the module's own imports or other statements), and executes
them in a namespace of stand-ins: ``torch.cuda`` answers with the arch under study (the stand-in for a GPU on
a CPU machine), ``os.environ`` is the deployment's environment, and every ``import`` a definition runs is
served from `stubs` or refused with `Unresolvable`, so nothing else of the release (or of this Python) runs.
"""

from __future__ import annotations

import ast
import builtins
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any


class Unresolvable(Exception):
    """A definition is missing, or reads something no stand-in provides: the question stays unanswered."""


@dataclass(frozen=True)
class Definitions:
    """The named definitions of one file, executed, and the line each one (and each class's method,
    "Class.method") starts at."""

    path: Path
    values: Mapping[str, Any]
    lines: Mapping[str, int]

    def get(self, name: str) -> Any:
        if name not in self.values:
            raise Unresolvable(f"{self.path} defines no top-level {name}")
        return self.values[name]


@dataclass
class Warnings:
    """A logger stand-in that keeps what the release logs (flashinfer logs a swallowed error as a warning)."""

    messages: list[str] = field(default_factory=list)

    def warning(self, msg: object, *args: object) -> None:
        self.messages.append(str(msg) % args if args else str(msg))

    info = debug = warning


def fake_torch(capability: tuple[int, int]) -> ModuleType:
    """``torch`` as a one-GPU machine of `capability` shows it to flashinfer's arch detection (device_count,
    get_device_capability); no other attribute exists, so a definition reading more is unresolvable."""
    torch = ModuleType("torch")
    torch.cuda = SimpleNamespace(  # type: ignore[attr-defined]
        device_count=lambda: 1, get_device_capability=lambda *_: capability, is_available=lambda: True
    )
    return torch


def fake_os(environ: Mapping[str, str]) -> SimpleNamespace:
    """``os`` with the deployment's environment (`environ`) instead of this process's."""
    return SimpleNamespace(environ=dict(environ), path=os.path, getenv=lambda k, d=None: environ.get(k, d))


def _importer(stubs: Mapping[str, object]) -> Callable[..., object]:
    def _import(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> object:
        if level == 0 and name in stubs:
            return stubs[name]
        if level == 0 and name in ("os", "re", "logging", "functools"):
            return stubs.get(name) or builtins.__import__(name, globals, locals, fromlist, level)
        raise Unresolvable(f"imports {'.' * level}{name}, which no stand-in provides")

    return _import


def load_definitions(path: Path, names: tuple[str, ...], namespace: Mapping[str, object]) -> Definitions:
    """Execute the top-level definitions `names` of `path` (those it has) in `namespace`: the module globals
    they read (``torch``, ``os``, ``knobs``...). `namespace["__stubs__"]` maps module names that their own
    ``import`` statements may load to stand-ins. Raises `Unresolvable` when the file cannot be read or parsed."""
    keep = _definitions(_parse(path), names)
    lines = {n.name: n.lineno for n in keep}
    glb = _globals(path, namespace)
    code = compile(ast.Module(body=list(keep), type_ignores=[]), str(path), "exec")
    try:
        exec(code, glb)  # the release's own definitions, with stand-ins only (module docstring)
    except Exception as exc:  # a decorator or base class that reads what no stand-in has
        raise Unresolvable(
            f"{path}: defining {', '.join(lines)} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return Definitions(path, {n: glb[n] for n in lines}, {**lines, **_method_lines(keep)})


def _parse(path: Path) -> ast.Module:
    try:
        text = path.read_text(encoding="utf-8")
        return ast.parse(text, str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise Unresolvable(f"cannot read {path}: {exc}") from exc


def _definitions(module: ast.Module, names: tuple[str, ...]) -> list[ast.FunctionDef | ast.ClassDef]:
    """The module's top-level functions and classes named in `names`, in source order."""
    return [n for n in module.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name in names]


def _method_lines(keep: Sequence[ast.stmt]) -> dict[str, int]:
    """``Class.method`` -> line, for the methods of the classes kept."""
    return {
        f"{c.name}.{m.name}": m.lineno
        for c in keep
        if isinstance(c, ast.ClassDef)
        for m in c.body
        if isinstance(m, ast.FunctionDef)
    }


def _globals(path: Path, namespace: Mapping[str, object]) -> dict[str, Any]:
    """The module globals the definitions run in: `namespace`'s, builtins whose ``import`` sees only the stubs."""
    stubs = dict(namespace.get("__stubs__", {}))  # type: ignore[call-overload]
    glb: dict[str, Any] = {k: v for k, v in namespace.items() if k != "__stubs__"}
    glb["__builtins__"] = {**vars(builtins), "__import__": _importer(stubs)}
    glb["__name__"] = f"stackfarm_relexec_{path.stem}"
    glb.setdefault("logger", logging.getLogger(glb["__name__"]))
    return glb


__all__ = ["Definitions", "Unresolvable", "Warnings", "fake_os", "fake_torch", "load_definitions"]
