"""Which shared libraries a real process of the cell loaded: SONAME, path and GNU build-id of each, and the two
ways a process can run other code than the cell's verdict was computed on.

On a GPU machine 05-import starts one fresh interpreter that imports the cell's native packages (torch,
sgl_kernel, flashinfer...) and initialises CUDA, then lists every shared object mapped into it
(``/proc/self/maps``). Each is fingerprinted from its ELF file (stackfarm.analysis.elfsyms) and placed: under
a component's root (the cell's own copy), or elsewhere (the system, another site-packages). Then:

- **duplicate**: one SONAME mapped from two files of different builds (two libnccl in one process: which one a
  symbol binds to depends on load order, the class of vllm#41725's hangs) — a failure;
- **shadowed**: the cell ships a library with this SONAME, but the process mapped another file (a system CUDA
  on LD_LIBRARY_PATH, a second site-packages) — a failure: the static verdicts describe the shipped copy.

The record travels as ``loaded-libraries.json`` in the cell's reports folder; stackfarm.verdict keeps it in the
cell's verdict (``loaded_libraries``), so a verdict says which builds actually ran.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .analysis.elfsyms import ElfError, read_from
from .files import write_atomic

#: The record's name inside a cell's reports folder.
RECORD = "loaded-libraries.json"

#: Run in a fresh interpreter: argv[1:] are module names to import. Prints one JSON object.
PROBE = r"""
import importlib, json, sys
errors = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"
cuda = ""
torch = sys.modules.get("torch")
if torch is not None:
    try:
        if torch.cuda.is_available():
            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
            cuda = torch.cuda.get_device_name(0)
    except Exception as exc:
        errors["cuda"] = f"{type(exc).__name__}: {exc}"
paths = []
with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
    for line in maps:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5].rsplit("/", 1)[-1]:
            path = parts[5].strip()
            if path not in paths:
                paths.append(path)
print("STACKFARM-LOADED " + json.dumps({"paths": paths, "errors": errors, "device": cuda}))
"""


@dataclass(frozen=True, kw_only=True)
class LoadedLibrary:
    """One shared object a real process of the cell mapped."""

    #: DT_SONAME ("" for a file without one, e.g. a Python extension module).
    soname: str
    path: str
    build_id: str
    #: The component whose files hold it ("sgl-kernel", "torch"...), or "system" / "other" (outside the cell).
    origin: str


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """A process's loaded libraries, and what is wrong with them."""

    libraries: tuple[LoadedLibrary, ...]
    duplicates: tuple[str, ...] = ()
    shadowed: tuple[str, ...] = ()
    #: Duplicates outside the cell's own libraries (recorded, not failing).
    notes: tuple[str, ...] = ()
    #: Import or CUDA errors of the probe (module -> error), and files that could not be read.
    errors: Mapping[str, str] = field(default_factory=dict)
    device: str = ""

    @property
    def problems(self) -> tuple[str, ...]:
        return (*self.duplicates, *self.shadowed)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["errors"] = dict(self.errors)
        return data


def parse_probe_output(output: str) -> dict[str, Any]:
    """The probe's JSON object, from its output (other lines, e.g. warnings, are ignored)."""
    for line in reversed(output.splitlines()):
        if line.startswith("STACKFARM-LOADED "):
            data = json.loads(line.split(" ", 1)[1])
            if isinstance(data, dict):
                return data
    raise ValueError("the probe printed no STACKFARM-LOADED line")


def _origin(path: Path, owners: Mapping[Path, str], roots: Sequence[Path]) -> str:
    if path in owners:
        return owners[path]
    if any(path.is_relative_to(r) for r in roots):
        return "cell"  # in the cell's site-packages, not a library the analysis knows (a Python extension)
    return "other" if "site-packages" in path.parts or "dist-packages" in path.parts else "system"


def native_packages(relpaths: Iterable[str]) -> list[str]:
    """The importable top-level packages that hold the cell's native libraries (torch first)."""
    tops = {p.split("/", 1)[0] for p in relpaths if "/" in p}
    names = sorted(t for t in tops if t.isidentifier() and t != "nvidia")
    return sorted(names, key=lambda n: n != "torch")


def fingerprint(
    paths: Iterable[str],
    shipped: Mapping[str, Sequence[tuple[str, Path]]],
    roots: Sequence[Path] = (),
    *,
    errors: Mapping[str, str] | None = None,
    device: str = "",
    owners: Mapping[Path, str] | None = None,
) -> Fingerprint:
    """Fingerprint the mapped files. `shipped`: SONAME -> (component, path) of each of the cell's own copies;
    `roots`: where the cell's files lie (a mapped file under one that the analysis does not know is "cell");
    `owners`: path -> component of the cell's other libraries (extension modules have no SONAME)."""
    known = {Path(os.path.realpath(p)): c for copies in shipped.values() for c, p in copies}
    known |= {Path(os.path.realpath(p)): c for p, c in (owners or {}).items()}
    real_roots = [Path(os.path.realpath(r)) for r in roots]
    problems = dict(errors or {})
    libs: list[LoadedLibrary] = []
    for raw in paths:
        path = Path(os.path.realpath(raw))
        try:
            # Headers and the dynamic section only, uncached: read_elf would hash each file (GBs of CUDA
            # libraries) just to key its cache, for a fingerprint taken once per run.
            with path.open("rb") as fh:
                info = read_from(fh, path)
        except (ElfError, OSError) as exc:
            problems[raw] = f"cannot read: {exc}"
            continue
        libs.append(
            LoadedLibrary(
                soname=info.soname,
                path=str(path),
                build_id=info.build_id,
                origin=_origin(path, known, real_roots),
            )
        )
    own = {soname: [Path(os.path.realpath(p)) for _, p in copies] for soname, copies in shipped.items()}
    duplicates, notes = _duplicates(libs, own)
    return Fingerprint(
        libraries=tuple(libs),
        duplicates=tuple(duplicates),
        shadowed=_shadowed(libs, own),
        notes=tuple(notes),
        errors=problems,
        device=device,
    )


def _duplicates(
    libs: Sequence[LoadedLibrary], shipped: Mapping[str, Sequence[Path]]
) -> tuple[list[str], list[str]]:
    """(failures, notes): one SONAME mapped from files of different builds. Only libraries with a DT_SONAME
    count (a Python extension module has none and is opened by its path). It fails where one copy is a library
    the cell ships: the cell's code may bind to the other build. Elsewhere (a vendored libz beside the
    system's) it is noted."""
    by_soname: dict[str, list[LoadedLibrary]] = {}
    for lib in libs:
        if lib.soname:
            by_soname.setdefault(lib.soname, []).append(lib)
    failures: list[str] = []
    notes: list[str] = []
    for soname, copies in sorted(by_soname.items()):
        builds = {c.build_id or c.path for c in copies}
        if len(copies) > 1 and len(builds) > 1:
            where = ", ".join(f"{c.path} ({c.origin}, build-id {c.build_id or '?'})" for c in copies)
            line = f"duplicate: {soname} is loaded twice, as different builds: {where}"
            own = {str(p) for p in shipped.get(soname, ())}
            (failures if any(c.path in own for c in copies) else notes).append(line)
    return failures, notes


def _shadowed(libs: Sequence[LoadedLibrary], shipped: Mapping[str, Sequence[Path]]) -> tuple[str, ...]:
    loaded = {lib.path for lib in libs}
    out = []
    for lib in libs:
        own = shipped.get(lib.soname, ()) if lib.soname else ()
        if not own or Path(lib.path) in own or any(str(p) in loaded for p in own):
            continue  # the cell's copy, or the cell's copy beside another (a duplicate, reported there)
        out.append(
            f"shadowed: the cell ships {lib.soname} at {own[0]}, the process loaded {lib.path} "
            f"({lib.origin}, build-id {lib.build_id or '?'}): fix the library path (LD_LIBRARY_PATH, "
            "ld.so.conf) so the cell's own copy loads"
        )
    return tuple(out)


def save(folder: Path, print_: Fingerprint) -> Path:
    """Write the record into a cell's reports folder (atomically)."""
    path = folder / RECORD
    write_atomic(path, json.dumps(print_.to_json(), indent=1, sort_keys=True) + "\n")
    return path


def read_libraries(folder: Path) -> tuple[LoadedLibrary, ...]:
    """The loaded libraries recorded in a cell's reports folder (empty when the cell ran on no GPU)."""
    path = folder / RECORD
    if not path.is_file():
        return ()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return tuple(LoadedLibrary(**item) for item in data["libraries"])
    except (OSError, ValueError, TypeError, KeyError):
        return ()


__all__ = [
    "PROBE",
    "RECORD",
    "Fingerprint",
    "LoadedLibrary",
    "fingerprint",
    "native_packages",
    "parse_probe_output",
    "read_libraries",
    "save",
]
