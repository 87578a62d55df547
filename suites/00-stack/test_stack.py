"""00-stack: the stack in the cell is the stack the cell claims (the way PyTorch's smoke test checks a build).

For every component: the installed metadata names the claimed distribution and version, every file matches the
wheel's RECORD hash, torch was built for the cell's CUDA, and every CUDA library links that CUDA's runtime.
Nothing here imports the stack, so it runs on any machine, with or without a GPU. Which components ship CUDA
libraries is the stack table's ``cuda_libraries`` flag, read from stackfarm.stack (the suite has no family.py, so
it declares no ``Needs.stack_flags``; tests/test_stack.py checks the list is the table's).

A host that deliberately lacks parts of a component declares them in matrix.toml (``[[deviation]]``, handed over
as ``cell.deviations``): files matching its `missing` globs may be missing, and an `absent` component may be
missing whole. Those testcases pass with a note, the property ``deviation.<component>``; every undeclared
difference (another missing file, a file that differs from RECORD, a declared file that is there but altered)
still fails.
"""

from __future__ import annotations

import ast
import base64
import csv
import email.parser
import hashlib
import json
import os
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from packaging.utils import canonicalize_name
from packaging.version import Version

from stackfarm import stack
from stackfarm.cellspec import CellSpec, InstalledComponent, RecordProperty, dist_info, load

_CUDART = re.compile(r"^libcudart\.so\.(\d+)")


#: Components that ship CUDA libraries: the stack table's ``cuda_libraries`` flag (stackfarm.stack, its one owner;
#: flashinfer ships Python and cubins, JIT-linked at run time).
_CUDA_LIBRARIES = stack.with_property("cuda_libraries")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    spec = load(os.environ["STACKFARM_CELL"])
    if "component" in metafunc.fixturenames:
        metafunc.parametrize("component", spec.components, ids=[c.distribution for c in spec.components])
    if "cuda_component" in metafunc.fixturenames:
        comps = [c for c in spec.components if c.distribution in _CUDA_LIBRARIES]
        metafunc.parametrize("cuda_component", comps, ids=[c.distribution for c in comps])


def _deviation(cell: CellSpec, component: InstalledComponent) -> Mapping[str, object] | None:
    """The [[deviation]] declared for this component, or None."""
    name = canonicalize_name(component.distribution)
    return next((d for d in cell.deviations if canonicalize_name(str(d.get("component", ""))) == name), None)


def _glob(pattern: str) -> re.Pattern[str]:
    """A path glob: ** spans folders, * and ? stay within one."""
    out = ""
    for part in re.split(r"(\*\*/?|\*|\?)", pattern):
        out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
    return re.compile(out + r"\Z")


@pytest.fixture(scope="session", autouse=True)
def _declared(cell: CellSpec, record_testsuite_property: RecordProperty) -> None:
    """Every declared deviation in the suite's properties, so the record shows what the host left out."""
    if cell.deviations:
        record_testsuite_property("deviations", json.dumps(list(cell.deviations), sort_keys=True))


def _absent(cell: CellSpec, component: InstalledComponent, record_property: RecordProperty) -> bool:
    """True (and the note recorded) when the component is missing whole and declared absent: a pass."""
    found = _deviation(cell, component)
    if component.root or found is None or not found.get("absent"):
        return False
    record_property(f"deviation.{component.distribution}", f"absent (declared): {found.get('reason', '')}")
    return True


def _root(component: InstalledComponent) -> Path:
    if not component.root:
        pytest.fail(f"{component.distribution} {component.version} is not installed ({component.source})")
    return Path(component.root)


def _dist_info(component: InstalledComponent) -> Path:
    _root(component)
    found = dist_info(component)
    if found is None:
        pytest.fail(f"{component.distribution}: no *.dist-info for it under {component.root}")
    return found


def test_metadata_matches_claim(
    cell: CellSpec, component: InstalledComponent, record_property: RecordProperty
) -> None:
    if _absent(cell, component, record_property):
        return
    meta = email.parser.Parser().parsestr((_dist_info(component) / "METADATA").read_text(encoding="utf-8"))
    record_property(f"{component.distribution}.installed_version", meta["Version"])
    record_property(f"{component.distribution}.sha256", component.sha256)
    assert canonicalize_name(meta["Name"]) == canonicalize_name(component.distribution)
    assert Version(meta["Version"]) == Version(component.version), (
        f"the cell claims {component.distribution} {component.version}, the tree holds {meta['Version']}"
    )


def _check(root: Path, path: str, expected: str) -> str | None:
    algo, _, want = expected.partition("=")
    digest = hashlib.new(algo)
    try:
        with (root / path).open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    except FileNotFoundError:
        return f"{path}: missing"
    got = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    return None if got == want else f"{path}: {algo} {got} != RECORD {want}"


def _lazy_manifest(root: Path) -> tuple[dict[str, list[object]], dict[str, int] | None] | None:
    """The manifest of a lazy tree (stackfarm.lazytree): its fetched files, and every member's size (None
    in a tree made before sizes were kept); None for a full tree."""
    marker = root / ".stackfarm-lazy"
    if not marker.is_file():
        return None
    data = json.loads(marker.read_text(encoding="utf-8"))
    members = data.get("members")
    sizes = {str(k): int(v) for k, v in members.items()} if isinstance(members, dict) else None
    return {str(k): list(v) for k, v in data["files"].items()}, sizes


def _lazy_rows(
    lazy: tuple[dict[str, list[object]], dict[str, int] | None],
    rows: list[tuple[str, str, str]],
    component: InstalledComponent,
    record_property: RecordProperty,
) -> tuple[list[tuple[str, str]], list[str]]:
    """A lazy tree's RECORD rows: whole files are hashed on disk as usual (returned); a sparse copy holds only
    what the readers read, so its whole member's sha256, taken while it was fetched, must match RECORD and the
    copy must have the member's size; members the static suites do not read were not fetched: each must be in
    the wheel with RECORD's size (the central directory's), their bytes unread (counted, never passed silently)."""
    files, sizes = lazy
    whole, problems, sparse, absent = [], [], 0, 0
    for path, expected, size_text in rows:
        entry = files.get(path)
        if entry is None:
            absent += 1
            if sizes is None:
                problems.append(
                    f"{path}: not fetched, and this lazy tree keeps no member sizes: remove it "
                    "(stackfarm cache prune) so it is made again"
                )
            elif path not in sizes:
                problems.append(f"{path}: missing (in RECORD, not in the wheel)")
            elif size_text and int(size_text) != sizes[path]:
                problems.append(f"{path}: {sizes[path]} bytes in the wheel, RECORD says {size_text}")
        elif entry[2] != "sparse":
            whole.append((path, expected))
        else:
            sparse += 1
            algo, _, want = expected.partition("=")
            got = base64.urlsafe_b64encode(bytes.fromhex(str(entry[1]))).rstrip(b"=").decode()
            size = (component_root := Path(str(component.root))).joinpath(path).stat().st_size
            if algo != "sha256" or got != want:
                problems.append(f"{path}: sha256 {got} (when fetched) != RECORD {want}")
            elif size != entry[0]:
                problems.append(f"{path}: {size} bytes in {component_root}, the member has {entry[0]}")
    record_property(
        f"{component.distribution}.lazy",
        f"{sparse} sparse copies checked when fetched, {absent} not fetched",
    )
    return whole, problems


def test_files_match_record(
    cell: CellSpec, component: InstalledComponent, record_property: RecordProperty
) -> None:
    if _absent(cell, component, record_property):
        return
    root = _root(component)
    record = _dist_info(component) / "RECORD"
    with record.open(newline="", encoding="utf-8") as fh:
        rows = [
            (row[0], row[1], row[2] if len(row) > 2 else "")
            for row in csv.reader(fh)
            if len(row) >= 2 and row[1]
        ]
    assert rows, f"{record} lists no hashed files"
    if component.distribution == "sglang" and cell.patched_files:
        # The cell's own patches change these files on purpose; every other file must still match the wheel.
        patched = set(cell.patched_files)
        assert patched <= {path for path, _, _ in rows}, f"patched files missing from RECORD: {patched}"
        rows = [row for row in rows if row[0] not in patched]
        record_property("sglang.patched_files", sorted(patched))
    lazy = _lazy_manifest(root)
    if lazy is not None:
        hashed, problems = _lazy_rows(lazy, rows, component, record_property)
    else:
        hashed, problems = [(path, expected) for path, expected, _ in rows], []
    # hashlib releases the GIL on large buffers, so threads make hashing a 2 GB torch tree quicker.
    with ThreadPoolExecutor(max_workers=4) as pool:
        problems += [p for p in pool.map(lambda r: _check(root, *r), hashed) if p]
    record_property(f"{component.distribution}.files_checked", len(hashed))
    declared = _deviation(cell, component)
    if declared is not None and declared.get("missing"):
        listed = declared["missing"]
        globs = [str(g) for g in listed] if isinstance(listed, list | tuple) else [str(listed)]
        patterns = [_glob(g) for g in globs]
        excused = [
            p
            for p in problems
            if p.endswith(": missing") and any(r.match(p[: -len(": missing")]) for r in patterns)
        ]
        problems = [p for p in problems if p not in excused]
        note = f"{len(excused)} files missing as declared ({', '.join(globs)}): {declared.get('reason', '')}"
        record_property(f"deviation.{component.distribution}", note)
    assert not problems, f"{len(problems)} of {len(rows)} files differ from RECORD, e.g. {problems[:5]}"


def _torch(cell: CellSpec) -> InstalledComponent:
    return cell.component("torch")


def test_torch_built_for_cell_cuda(cell: CellSpec, record_property: RecordProperty) -> None:
    version_py = _root(_torch(cell)) / "torch" / "version.py"
    tree = ast.parse(version_py.read_text(encoding="utf-8"))
    built: str | None = None
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "cuda" for t in targets) and node.value is not None:
                value = ast.literal_eval(node.value)
                built = value if isinstance(value, str) else None
    record_property("torch.version.cuda", str(built))
    assert built is not None, f"{version_py}: torch.version.cuda is None: a CPU-only torch in a CUDA cell"
    want = Version(cell.values["cuda"]).release[:2]
    assert Version(built).release[:2] == want, (
        f"torch was built for CUDA {built}, the cell is CUDA {cell.values['cuda']}"
    )


def _cudart_majors(path: Path) -> set[int]:
    try:
        with path.open("rb") as fh:
            elf = ELFFile(fh)
            majors = set()
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    for tag in section.iter_tags():
                        # pyelftools sets `needed` on DT_NEEDED tags only (its stubs do not say so)
                        needed = getattr(tag, "needed", "")
                        if tag.entry.d_tag == "DT_NEEDED" and (m := _CUDART.match(needed)):
                            majors.add(int(m.group(1)))
            return majors
    except ELFError:
        return set()


def test_cuda_libraries_link_cell_runtime(
    cell: CellSpec, cuda_component: InstalledComponent, record_property: RecordProperty
) -> None:
    if _absent(cell, cuda_component, record_property):
        return
    distribution = cuda_component.distribution
    root = _root(cuda_component)
    linked = {
        str(so.relative_to(root)): _cudart_majors(so) for so in sorted(root.rglob("*.so*")) if so.is_file()
    }
    linked = {name: majors for name, majors in linked.items() if majors}
    assert linked, f"no library of {distribution} links libcudart: cannot tell which CUDA it was built for"
    want = Version(cell.values["cuda"]).major
    record_property(f"{distribution}.cudart_majors", sorted({m for ms in linked.values() for m in ms}))
    wrong = {name: sorted(m) for name, m in linked.items() if m != {want}}
    assert not wrong, f"{distribution} libraries link another CUDA runtime than {want}: {wrong}"
