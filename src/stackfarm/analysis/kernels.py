"""The GPU code a component's wheel ships, library by library, and which library its loader picks for a GPU.

`inventory` reads every shared library of an unpacked wheel once (headers only, see `fatbin`); identical copies
such as ``mscclpp.so`` / ``.so.0`` / ``.so.0.6.0`` become one `Library` with aliases. flashinfer-cubin's
thousands of ``.cubin`` files become one `Library` per kernel family (``fmha/trtllm-gen``, ``gemm-…``): flashinfer
picks a cubin for the running GPU, so a family is usable where *any* of its cubins runs.

`sgl_kernel_loader` follows sgl-kernel's own choice of ops library: it evaluates ``sgl_kernel/__init__.py`` (and
through it ``load_utils._load_architecture_specific_ops``) for the GPU with `pysource.Evaluator`, records the
``glob.glob`` patterns the code asks for, answers them from the real tree, and reports the first that matches:
``sgl_kernel/sm90/common_ops.*`` on sm_90, ``sgl_kernel/sm100/common_ops.*`` on anything else (0.3.21 - 0.4.4).
"""

from __future__ import annotations

import glob as globlib
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from stackfarm.analysis.arch import Arch
from stackfarm.analysis.fatbin import Binary, Coverage, FatbinError, Unit, coverage, read_binary
from stackfarm.analysis.pysource import UNKNOWN, Evaluator, SourceTree

Spread = Literal["every-unit", "any-unit"]

_SONAME = re.compile(r"^(?P<stem>.+?\.so)(?:\.\d+)*$")
_HASH_DIR = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Library:
    """One binary of a component (or one family of cubins), with what it contains."""

    component: str
    #: Path inside the component's tree (for a cubin family, its directory with the hash folder as ``*``).
    relpath: str
    #: Other files that are byte-for-byte the same library (``lib/mscclpp.so.0``).
    aliases: tuple[str, ...] = ()
    #: The device code; None for a host-only library.
    binary: Binary | None = None
    #: Why it could not be read (truncated, not an ELF, ...); then `binary` is None.
    error: str | None = None
    #: every-unit: a shared library needs code for the GPU in each translation unit; any-unit: a cubin
    #: family is usable when one of its cubins runs there.
    spread: Spread = "every-unit"

    @property
    def name(self) -> str:
        return PurePosixPath(self.relpath).name

    def coverage(self, gpu: Arch) -> Coverage | None:
        if self.binary is None:
            return None
        if self.spread == "every-unit":
            return coverage(self.binary, gpu)
        # any-unit: judge the family as if it were one unit holding every cubin
        merged = Binary(
            self.binary.path,
            self.binary.size,
            self.binary.container,
            (Unit(tuple(c for u in self.binary.units for c in u.codes)),),
        )
        return coverage(merged, gpu)


def _walk(root: Path, files: Iterable[str] | None) -> Iterator[tuple[str, list[str]]]:
    """(dirpath, filenames) under `root`: every file, or only `files` (paths relative to root)."""
    if files is None:
        for dirpath, _, filenames in os.walk(root):
            yield dirpath, filenames
        return
    by_dir: dict[str, list[str]] = defaultdict(list)
    for rel in files:
        head, _, name = rel.rpartition("/")
        by_dir[os.path.join(root, head) if head else str(root)].append(name)  # noqa: PTH118 - see below
    yield from by_dir.items()


def inventory(root: Path | str, component: str, record: Iterable[str] | None = None) -> tuple[Library, ...]:
    """Every shared library and cubin family of one wheel under `root`, each read once. `record` (its RECORD
    paths) limits the walk to that wheel where one root holds several (a container's site-packages)."""
    root = Path(root)
    libraries: list[Library] = []
    groups: dict[tuple[str, int], list[Path]] = defaultdict(list)
    cubins: dict[str, list[str]] = defaultdict(list)
    for dirpath, filenames in _walk(root, record):
        for filename in filenames:
            if filename.endswith(".cubin"):
                # plain strings, not Path objects: their cost shows with flashinfer-cubin's 15 000 files
                cubins[_family(os.path.relpath(dirpath, root))].append(os.path.join(dirpath, filename))  # noqa: PTH118
            elif match := _SONAME.match(filename):
                path = Path(dirpath, filename)
                if path.is_file() and not path.is_symlink():
                    groups[(str(Path(dirpath, match.group("stem"))), path.stat().st_size)].append(path)
    for paths in groups.values():
        paths.sort(key=lambda p: (len(p.name), p.name))
        first, rest = paths[0], paths[1:]
        rel = str(PurePosixPath(first.relative_to(root)))
        aliases = tuple(str(PurePosixPath(p.relative_to(root))) for p in rest)
        try:
            binary = read_binary(first)
        except FatbinError as exc:
            libraries.append(Library(component, rel, aliases, None, str(exc)))
            continue
        libraries.append(Library(component, rel, aliases, binary))
    for family, files in cubins.items():
        units: list[Unit] = []
        errors: list[str] = []
        size = 0
        for file in sorted(files):
            try:
                found = read_binary(file)
            except FatbinError as exc:
                errors.append(str(exc))
                continue
            if found is not None:
                units.extend(found.units)
                size += found.size
        notes = tuple(errors[:3]) + (
            (f"... and {len(errors) - 3} more unreadable",) if len(errors) > 3 else ()
        )
        binary = Binary(str(root / family), size, "cubin", tuple(units), notes)
        error = (
            f"{len(errors)} of {len(files)} cubins unreadable, e.g. {errors[0]}"
            if errors and not units
            else None
        )
        libraries.append(Library(component, family, (), None if error else binary, error, "any-unit"))
    return tuple(sorted(libraries, key=lambda lib: lib.relpath))


def _family(rel_dir: str) -> str:
    """``flashinfer_cubin/cubins/<sha1>/fmha/trtllm-gen`` -> ``flashinfer_cubin/cubins/*/fmha/trtllm-gen``."""
    parts = ["*" if _HASH_DIR.match(p) else p for p in PurePosixPath(rel_dir).parts]
    return str(PurePosixPath(*parts)) if parts else "."


@dataclass(frozen=True)
class LoaderChoice:
    """Which ops library a component's loader opens on one GPU."""

    gpu: Arch
    #: The glob patterns the loader tries, in order, relative to the tree.
    patterns: tuple[str, ...]
    #: The library it loads (relative path), or None when no pattern matches a file.
    chosen: str | None
    #: How this was found (the evaluated entry point), for messages.
    how: str


def sgl_kernel_loader(root: Path | str, gpu: Arch, cuda: str) -> LoaderChoice:
    """Evaluate ``import sgl_kernel`` for `gpu` and report which ``common_ops`` library it loads."""
    root = Path(root)
    tree = SourceTree([root])
    if tree.path_of("sgl_kernel") is None:
        return LoaderChoice(gpu, (), None, f"no sgl_kernel package under {root}")
    patterns: list[str] = []

    def observe(name: str, args: tuple[object, ...]) -> object:
        if name == "glob.glob" and isinstance(args[0], str) and args[0].startswith(str(root)):
            patterns.append(args[0])
            return sorted(globlib.glob(args[0]))  # noqa: PTH207  # answer exactly as the loader's glob.glob would
        return UNKNOWN

    evaluator = Evaluator(tree, gpu, cuda, observe=observe)
    evaluator.namespace("sgl_kernel")
    rel = tuple(str(PurePosixPath(Path(p).relative_to(root))) for p in patterns)
    how = "sgl_kernel/__init__.py evaluated for this GPU"
    if not patterns:
        # a wheel without an arch-specific loader imports its single ops library directly
        rel = ("sgl_kernel/common_ops.*",)
        how = "no arch-specific loader in sgl_kernel/__init__.py: the single common_ops library"
    for pattern in rel:
        matches = sorted(globlib.glob(str(root / pattern)))  # noqa: PTH207  # the loader's own glob semantics
        libs = [m for m in matches if _SONAME.match(Path(m).name)]
        if libs:
            return LoaderChoice(gpu, rel, str(PurePosixPath(Path(libs[0]).relative_to(root))), how)
    return LoaderChoice(gpu, rel, None, how)


__all__ = ["Library", "LoaderChoice", "Spread", "inventory", "sgl_kernel_loader"]
