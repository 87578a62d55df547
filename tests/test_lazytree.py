"""Tests for stackfarm.lazytree: lazy trees of wheels served with range requests on 127.0.0.1 (real ELF shared
objects of this Python), and of real torch libraries from PyPI (integration): the ELF and fatbin readers answer
the same from the sparse copies as from the whole files."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import pytest

from rangeserver import Files, files
from stackfarm import lazytree, lazyzip
from stackfarm.analysis import elfsyms, fatbin
from stackfarm.errors import ArtifactError

__all__ = ["files"]  # the fixture


def _libraries(count: int = 4) -> dict[str, bytes]:
    """Real shared objects: this Python's own extension modules."""
    found = sorted(Path(str(sysconfig.get_config_var("DESTSHARED") or "/nonexistent")).glob("*.so"))
    if not found:
        pytest.skip("this Python has no lib-dynload/*.so to use as real ELF files")
    big = sorted(found, key=lambda p: -p.stat().st_size)[:count]
    return {f"pkg/lib/{p.name}": p.read_bytes() for p in big}


def _wheel(members: dict[str, bytes], lie: str | None = None) -> bytes:
    info = "pkg-1.0.dist-info"
    members = {
        **members,
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n",
    }
    rows = []
    for name, data in members.items():
        digest = hashlib.sha256(b"lie" if name == lie else data).digest()
        rows.append(f"{name},sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},{len(data)}")
    members[f"{info}/RECORD"] = ("\n".join([*rows, f"{info}/RECORD,,"]) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zi = zipfile.ZipInfo(name)
            zi.external_attr = (0o100755 if name.endswith(".so") else 0o100644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return buf.getvalue()


def _answers(path: Path | None, data: bytes | None, name: str) -> tuple[object, object]:
    def elf() -> object:
        try:
            if path is not None:
                with open(path, "rb") as fh:
                    return elfsyms.read_from(fh, Path(name))
            return elfsyms.read_from(io.BytesIO(data or b""), Path(name))
        except elfsyms.ElfError as exc:
            return f"ElfError {exc}"

    def fat() -> object:
        try:
            if path is not None:
                found = fatbin.read_binary(path)
            else:
                found = fatbin.read_binary_from(io.BytesIO(data or b""), Path(name), len(data or b""))
        except fatbin.FatbinError as exc:
            return f"FatbinError {str(exc).replace(str(path), name)}"
        return None if found is None else (found.container, found.size, found.units, found.notes)

    return elf(), fat()


def test_lazy_tree_keeps_sources_whole_and_libraries_sparse(
    files: Files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libs = _libraries()
    monkeypatch.setattr(lazytree, "IN_MEMORY", min(len(d) for d in libs.values()))  # the largest are streamed
    blob = _wheel({**libs, "pkg/__init__.py": b"x = 1\n", "pkg/include/pkg.h": b"int x;\n" * 1000})
    files.blobs["pkg-1.0-cp311-cp311-linux_x86_64.whl"] = blob
    url = f"{files.base}/pkg-1.0-cp311-cp311-linux_x86_64.whl"
    sha = hashlib.sha256(blob).hexdigest()
    tree, built = lazytree.lazy_tree(tmp_path / "cache", sha, url, len(blob), "pkg-1.0.whl")
    assert built is not None
    assert (tree / "pkg" / "__init__.py").read_bytes() == b"x = 1\n"
    assert (tree / "pkg-1.0.dist-info" / "METADATA").is_file()
    assert not (tree / "pkg" / "include").exists()  # nothing reads headers
    assert built.sparse == len(libs)
    assert built.kept < sum(len(d) for d in libs.values())
    for name, data in libs.items():
        sparse = tree / name
        assert sparse.stat().st_size == len(data)
        assert _answers(sparse, None, name) == _answers(None, data, name)
        assert isinstance(_answers(sparse, None, name)[0], elfsyms.ElfInfo)  # a real answer, not an error
    manifest = json.loads((tree / lazytree.LAZY_MARKER).read_text())
    assert manifest["files"]["pkg/__init__.py"][2] == "whole"
    assert {k for k, v in manifest["files"].items() if v[2] == "sparse"} == set(libs)
    assert manifest["files"][next(iter(libs))][1] == hashlib.sha256(libs[next(iter(libs))]).hexdigest()
    # Built once: a second call reuses the tree and asks nothing.
    before = len(files.ranges)
    assert lazytree.lazy_tree(tmp_path / "cache", sha, url, len(blob), "pkg-1.0.whl") == (tree, None)
    assert len(files.ranges) == before


def test_a_library_that_differs_from_record_refuses_the_tree(files: Files, tmp_path: Path) -> None:
    libs = _libraries(1)
    blob = _wheel({**libs, "pkg/__init__.py": b""}, lie=next(iter(libs)))
    files.blobs["w.whl"] = blob
    with pytest.raises(ArtifactError, match="differs from the wheel's RECORD"):
        lazytree.lazy_tree(tmp_path / "cache", "ab" * 32, f"{files.base}/w.whl", len(blob), "w.whl")
    assert not (tmp_path / "cache" / "lazy" / ("ab" * 32)).exists()
    assert not list((tmp_path / "cache" / "tmp").glob("*.lazy-*"))


def test_recorded_ranges_are_merged() -> None:
    assert lazytree.merged([(10, 20), (0, 5), (15, 30), (30, 31), (40, 41)]) == [(0, 5), (10, 31), (40, 41)]


@pytest.mark.integration
def test_real_torch_libraries_answer_the_same_from_sparse_copies(tmp_path: Path) -> None:
    """The libraries of torch 2.9.1 up to 40 MB (libc10_cuda's fatbin among them), from PyPI."""
    from stackfarm.artifacts import Source, Target, find_artifact

    art = find_artifact(
        Source(name="pypi", url="https://pypi.org/simple"),
        "torch",
        "2.9.1",
        Target(python="3.11", platform="manylinux_2_39_x86_64"),
    )
    remote = lazyzip.RemoteZip(art.url, art.size)
    small = {
        n
        for n, m in remote.members.items()
        if lazytree.wanted(n) == "sparse" and m.size < 40 << 20 and n.startswith("torch/lib/")
    }
    assert "torch/lib/libc10_cuda.so" in small

    def keep(name: str) -> str | None:
        return "sparse" if name in small else ("whole" if name.endswith("RECORD") else None)

    built = lazytree.build(remote, tmp_path, keep=keep)
    assert built.sparse == len(small)
    whole = remote.read_many(small)
    fatbins = 0
    for name in sorted(small):
        got = _answers(tmp_path / name, None, name)
        assert got == _answers(None, whole[name], name), name
        fatbins += got[1] is not None and not isinstance(got[1], str)
    assert fatbins  # at least one library with device code was compared
    assert built.kept < sum(len(d) for d in whole.values()) / 10


def test_cache_lazy_tree_and_its_fallback_to_a_full_tree(files: Files, tmp_path: Path) -> None:
    from stackfarm.artifacts import Artifact, Cache

    blob = _wheel({**_libraries(1), "pkg/__init__.py": b"x = 1\n", "pkg/data.txt": b"data"})
    files.blobs["pkg-1.0-cp311-cp311-linux_x86_64.whl"] = blob
    art = Artifact(
        distribution="pkg",
        version="1.0",
        filename="pkg-1.0-cp311-cp311-linux_x86_64.whl",
        url=f"{files.base}/pkg-1.0-cp311-cp311-linux_x86_64.whl",
        sha256=hashlib.sha256(blob).hexdigest(),
        size=len(blob),
        source="test",
    )
    cache = Cache(tmp_path / "cache")
    tree = cache.lazy_tree(art, lazytree.lazy_tree)
    assert tree == cache.root / "lazy" / art.sha256
    assert (tree / lazytree.LAZY_MARKER).is_file()
    assert not (tree / "pkg" / "data.txt").exists()
    assert not cache.blob_path(art).exists()  # no whole download
    files.no_ranges = True  # a server without ranges: the whole wheel, unpacked
    other = Cache(tmp_path / "other")
    assert other.lazy_tree(art, lazytree.lazy_tree) == other.tree_path(art)
    assert (other.tree_path(art) / "pkg" / "data.txt").read_bytes() == b"data"


def _stack_suite(tmp_path: Path, root: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """00-stack's metadata and RECORD testcases on one component rooted at ``root``: name -> (outcome, props)."""
    import os
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    from stackfarm.cellspec import CellSpec, InstalledComponent

    comp = InstalledComponent(
        axis="x", distribution="pkg", version="1.0", filename="", sha256="", source="test", root=str(root)
    )
    spec = tmp_path / "cell.json"
    CellSpec(id="lazy-cell", values={"cuda": "12.8"}, backend="local", components=(comp,)).dump(spec)
    junit = tmp_path / "00-stack.xml"
    env = {**os.environ, "STACKFARM_CELL": str(spec)}
    env.pop("PYTEST_ADDOPTS", None)
    repo = Path(__file__).resolve().parents[1]
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "suites/00-stack",
        "-k",
        "metadata or files",
        f"--junitxml={junit}",
    ]
    done = subprocess.run(
        [*argv, "-q", "-p", "no:cacheprovider"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert junit.is_file(), done.stdout + done.stderr
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = next((k for k in ("failure", "error", "skipped") if case.find(k) is not None), "passed")
        out[case.get("name", "")] = (
            outcome,
            {p.get("name", ""): p.get("value", "") for p in case.iter("property")},
        )
    return out


def test_00_stack_checks_a_lazy_tree_by_what_was_fetched(files: Files, tmp_path: Path) -> None:
    import shutil

    blob = _wheel({**_libraries(1), "pkg/__init__.py": b"x = 1\n", "pkg/data.txt": b"data"})
    files.blobs["w.whl"] = blob
    tree, _built = lazytree.lazy_tree(tmp_path / "c", "cd" * 32, f"{files.base}/w.whl", len(blob), "w.whl")
    cases = _stack_suite(tmp_path, tree)
    outcome, props = cases["test_files_match_record[pkg]"]
    assert outcome == "passed"
    assert props["pkg.lazy"] == "1 sparse copies checked when fetched, 1 not fetched"
    assert cases["test_metadata_matches_claim[pkg]"][0] == "passed"
    # A sparse copy whose fetched hash does not match RECORD fails (here: a manifest altered afterwards).
    bad = tmp_path / "bad"
    shutil.copytree(tree, bad)
    marker = bad / lazytree.LAZY_MARKER
    marker.chmod(0o644)
    manifest = json.loads(marker.read_text())
    lib = next(k for k, v in manifest["files"].items() if v[2] == "sparse")
    manifest["files"][lib][1] = "00" * 32
    marker.write_text(json.dumps(manifest))
    assert _stack_suite(tmp_path, bad)["test_files_match_record[pkg]"][0] == "failure"


def test_00_stack_fails_a_lazy_tree_whose_unfetched_row_is_not_in_the_wheel(
    files: Files, tmp_path: Path
) -> None:
    """A RECORD row the lazy tree did not fetch is still checked against the wheel's central directory: one
    the wheel lacks (or of another size) fails as it would on a full tree, never passes unread."""
    import shutil

    blob = _wheel({**_libraries(1), "pkg/__init__.py": b"x = 1\n", "pkg/data.txt": b"data"})
    files.blobs["w.whl"] = blob
    tree, _built = lazytree.lazy_tree(tmp_path / "c", "ef" * 32, f"{files.base}/w.whl", len(blob), "w.whl")
    manifest = json.loads((tree / lazytree.LAZY_MARKER).read_text())
    assert manifest["members"]["pkg/data.txt"] == 4

    def drop(m: dict[str, Any]) -> None:
        m["members"].pop("pkg/data.txt")

    def resize(m: dict[str, Any]) -> None:
        m["members"]["pkg/data.txt"] = 5

    for change, word in ((drop, "missing"), (resize, "resized")):
        bad = tmp_path / f"bad-{word.split()[0]}"
        shutil.copytree(tree, bad)
        marker = bad / lazytree.LAZY_MARKER
        marker.chmod(0o644)
        altered = json.loads(marker.read_text())
        change(altered)
        marker.write_text(json.dumps(altered))
        outcome, _props = _stack_suite(tmp_path, bad)["test_files_match_record[pkg]"]
        assert outcome == "failure", word


def test_a_lazy_run_refuses_suites_that_need_full_trees(tmp_path: Path) -> None:
    from stackfarm.artifacts import Cache
    from stackfarm.backends.local import LocalBackend

    backend = LocalBackend(Cache(tmp_path / "cache"), lazy=True)
    log = tmp_path / "30-numerics.log"
    out = backend.run_suite(Path("suites/30-numerics"), tmp_path / "cell.json", tmp_path / "j.xml", 60, log)
    assert out.returncode == 4, "a usage error: the runner makes the cell a harness error, never reused"
    assert "30-numerics needs full trees" in out.output
    assert "STACKFARM_LAZY" in log.read_text()
    assert not (tmp_path / "j.xml").exists()  # not run: the runner reads it as an error, never a verdict
    assert LocalBackend(Cache(tmp_path / "cache"), lazy=False).lazy is False


def test_prune_keeps_the_lazy_trees_of_wheels_recent_runs_used(tmp_path: Path) -> None:
    import os

    from stackfarm import cachekeep

    root = tmp_path / "cache"
    used, unused = "a" * 64, "b" * 64
    for sha in (used, unused):
        tree = root / "lazy" / sha / "pkg"
        tree.mkdir(parents=True)
        (tree / "x.py").write_text("x = 1\n")
        (root / "lazy" / sha).chmod(0o555)
        os.utime(root / "lazy" / sha, (1000.0, 1000.0))
    cachekeep.record_use(root, "run1", [root / "blobs" / "sha256" / f"{used}.whl", root / "trees" / used])
    pruned = cachekeep.prune(root, keep_runs=1)
    assert [p.name for p in pruned.removed] == [unused]
    assert (root / "lazy" / used / "pkg" / "x.py").is_file()
    assert not (root / "lazy" / unused).exists()
