"""stackfarm.patches on synthetic trees: validation, statuses, drift, upstream detection, the check table, port.

The tests build small synthetic wheel trees (a dist-info folder plus a table module and a model class, shaped
like the SGLang files the real patches touch) so each status and each refusal is checked in isolation. The
repository's own sets on the real wheels are in test_patches_shipped.py; the command line and the way its
wheels are fetched, in test_patches_cli.py.
"""

from __future__ import annotations

import hashlib
import tempfile
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from stackfarm import matrix as matrix_mod
from stackfarm import patches as P
from stackfarm.errors import ConfigError
from stackfarm.patches.drift import locate_drift
from stackfarm.patches.git import make_patch
from stackfarm.patches.model import MARKER, Hunk, Patch, parse_patch, validate_sets
from stackfarm.patches.status import apply_sets, failures
from stackfarm.patches.table import below_range
from stackfarm.patches.upstream import added_definitions, defined_in
from stackfarm.patchset import PatchSet, sets_for

HEADERS = {"Description": "a test patch\nwhy it exists", "Origin": "vendor, tests", "Forwarded": "no"}

TABLE = "sglang/srt/table.py"
MODEL = "sglang/srt/model.py"
# Shaped like all_reduce_utils.py: a capability-keyed table.
TABLE_SRC = textwrap.dedent(
    """\
    MiB = 1024 * 1024

    SIZES = {
        9: {
            2: 64 * MiB,
            8: 128 * MiB,
        },
        10: {
            2: 64 * MiB,
            8: 128 * MiB,
        },
    }
    """
)
TABLE_WITH_12 = TABLE_SRC.replace(
    "        8: 128 * MiB,\n    },\n}\n",
    "        8: 128 * MiB,\n    },\n    12: {\n        2: 64 * MiB,\n        8: 128 * MiB,\n    },\n}\n",
)
# Shaped like kimi_k25.py: a wrapper class that owns a language model.
MODEL_SRC = textwrap.dedent(
    """\
    class Wrapper:
        def __init__(self, language_model):
            self.language_model = language_model

        def forward(self, x):
            return self.language_model(x)


    EntryClass = [Wrapper]
    """
)
MODEL_WITH_HOOK = MODEL_SRC.replace(
    "        return self.language_model(x)\n",
    "        return self.language_model(x)\n\n    def get_embed_and_head(self):\n"
    "        return self.language_model.get_embed_and_head()\n",
)
assert TABLE_WITH_12 != TABLE_SRC
assert MODEL_WITH_HOOK != MODEL_SRC


def _tree(root: Path, files: Mapping[str, str], version: str = "0.5.9") -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    info = root / f"sglang-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n\n")
    return root


def _set(
    root: Path, name: str, patches: Mapping[str, str], spec: str = ">=0.5.9", optional: bool = False
) -> PatchSet:
    folder = root / "patches" / name
    folder.mkdir(parents=True, exist_ok=True)
    for file, text in patches.items():
        (folder / file).write_text(text, encoding="utf-8")
    (folder / "series").write_text("".join(f"{file}\n" for file in patches), encoding="utf-8")
    return PatchSet(name=name, applies_to=SpecifierSet(spec), path=folder, optional=optional)


def _digest(tree: Path) -> dict[str, str]:
    return {
        p.relative_to(tree).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(tree.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return _tree(tmp_path / "tree", {TABLE: TABLE_SRC, MODEL: MODEL_SRC})


@pytest.fixture
def table_set(tmp_path: Path) -> PatchSet:
    return _set(tmp_path, "table", {"0001-table.patch": make_patch(TABLE, TABLE_SRC, TABLE_WITH_12, HEADERS)})


# ----------------------------------------------------------------------------------------------------------
# Statuses.


def test_apply_then_reapply(tree: Path, table_set: PatchSet) -> None:
    [first] = apply_sets([table_set], tree)
    assert (first.status, first.ok) == ("applied", True)
    assert (tree / TABLE).read_text() == TABLE_WITH_12
    assert first.sha256 == hashlib.sha256((table_set.path / "0001-table.patch").read_bytes()).hexdigest()
    [again] = apply_sets([table_set], tree)
    assert again.status == "already-applied"
    assert not again.ok
    assert (tree / TABLE).read_text() == TABLE_WITH_12


def test_check_writes_nothing_and_sees_a_series_in_order(tmp_path: Path, tree: Path) -> None:
    step1 = TABLE_SRC.replace("MiB = 1024 * 1024\n", "MiB = 1024 * 1024\nKiB = 1024\n")
    step2 = step1.replace("KiB = 1024\n", "KiB = 1024\nGiB = 1024 * MiB\n")  # needs step 1 as context
    ps = _set(
        tmp_path,
        "two",
        {
            "0001-a.patch": make_patch(TABLE, TABLE_SRC, step1, HEADERS),
            "0002-b.patch": make_patch(TABLE, step1, step2, HEADERS),
        },
    )
    before = _digest(tree)
    assert [r.status for r in P.check_sets([ps], tree)] == ["applied", "applied"]
    assert _digest(tree) == before
    assert [r.status for r in apply_sets([ps], tree)] == ["applied", "applied"]
    assert (tree / TABLE).read_text() == step2


def test_a_release_that_has_the_change_verbatim_is_upstreamed(tmp_path: Path, table_set: PatchSet) -> None:
    release = _tree(tmp_path / "rel", {TABLE: TABLE_WITH_12}, version="0.5.10")
    [res] = P.check_sets([table_set], release)
    assert res.status == "upstreamed"
    assert "verbatim" in res.detail


def test_applied_upstream_header_tells_a_hand_patched_tree_from_a_release(tmp_path: Path) -> None:
    headers = {**HEADERS, "Applied-Upstream": "0.5.10, https://example.invalid/pr/1"}
    ps = _set(tmp_path, "h", {"0001-t.patch": make_patch(TABLE, TABLE_SRC, TABLE_WITH_12, headers)})
    old = _tree(tmp_path / "old", {TABLE: TABLE_WITH_12}, version="0.5.9")
    new = _tree(tmp_path / "new", {TABLE: TABLE_WITH_12}, version="0.5.10")
    [on_old] = P.check_sets([ps], old)
    [on_new] = P.check_sets([ps], new)
    assert on_old.status == "already-applied"
    assert "upstream has it only from 0.5.10" in on_old.detail
    assert on_new.status == "upstreamed"
    assert on_new.detail.startswith("upstream from 0.5.10")


def test_upstream_that_defines_the_added_method_its_own_way_is_upstreamed(tmp_path: Path, tree: Path) -> None:
    ps = _set(tmp_path, "m", {"0001-m.patch": make_patch(MODEL, MODEL_SRC, MODEL_WITH_HOOK, HEADERS)})
    own_way = MODEL_SRC.replace(
        "\n\nEntryClass",
        "\n\n    def load_weights(self, w):\n        pass\n\n    def get_embed_and_head(self):\n"
        "        lm = self.language_model\n        return lm.get_embed_and_head()\n\n\nEntryClass",
    )
    release = _tree(tmp_path / "rel", {MODEL: own_way}, version="0.5.10")
    [res] = P.check_sets([ps], release)
    assert res.status == "upstreamed", res.detail
    assert "Wrapper.get_embed_and_head" in res.detail
    assert f"{MODEL}:12" in res.detail  # where upstream defines it


def test_a_changed_condition_is_never_upstreamed_by_name(tmp_path: Path) -> None:
    """An edit (not an addition) proves nothing by names: the same names upstream are drift, not upstream."""
    src = "def gate(a, b):\n    return a or b\n"
    ps = _set(
        tmp_path,
        "g",
        {"0001-g.patch": make_patch("sglang/g.py", src, src.replace("a or b", "a or b or c"), HEADERS)},
    )
    release = _tree(tmp_path / "rel", {"sglang/g.py": "def gate(a, b):\n    return a and b\n"})
    [res] = P.check_sets([ps], release)
    assert res.status == "drift"


def test_drift_names_file_hunk_first_differing_line_and_upstream_around_it(
    tmp_path: Path, table_set: PatchSet
) -> None:
    moved = TABLE_SRC.replace(
        "        8: 128 * MiB,\n    },\n}\n", "        4: 64 * MiB,\n        8: 256 * MiB,\n    },\n}\n"
    )
    release = _tree(tmp_path / "rel", {TABLE: moved}, version="0.5.10")
    [res] = P.check_sets([table_set], release)
    assert res.status == "drift"
    assert not res.ok
    patch_text = (table_set.path / "0001-table.patch").read_text().splitlines()
    hunk = next(line for line in patch_text if line.startswith("@@"))
    assert TABLE in res.detail
    assert hunk in res.detail
    assert "patch expects: 2: 64 * MiB," not in res.detail  # the first lines still match
    assert "patch expects: 8: 128 * MiB," in res.detail
    assert "upstream has:  4: 64 * MiB,  (line 10)" in res.detail
    assert ">    10 |         4: 64 * MiB," in res.detail
    assert "     9 |         2: 64 * MiB," in res.detail
    # The patch line named is the one that holds the expected line.
    line = int(res.detail.split("(patch line ")[1].split(")")[0])
    assert patch_text[line - 1] == "         8: 128 * MiB,"


def test_locate_drift_notes_whitespace_only_differences() -> None:
    hunk = _hunk_of("a = 1\nb = 2\nc = 3\nd = 4\n", "a = 1\nb = 2\nc = 30\nd = 4\n")
    drift = locate_drift("f.py", hunk, ["a = 1", "b  = 2", "c = 3", "d = 4"], 0)
    assert drift is not None
    assert (drift.expected, drift.found, drift.upstream_line) == ("b = 2", "b  = 2", 2)
    assert drift.note != "the lines differ only in whitespace"
    drift = locate_drift("f.py", hunk, ["a = 1", "\tb = 2", "c = 3", "d = 4"], 0)
    assert drift is not None
    assert drift.note == "the lines differ only in whitespace"
    assert locate_drift("f.py", hunk, ["x", "a = 1", "b = 2", "c = 3", "d = 4"], 0) is None


def test_target_missing(tmp_path: Path, table_set: PatchSet) -> None:
    release = _tree(tmp_path / "rel", {MODEL: MODEL_SRC})
    [res] = P.check_sets([table_set], release)
    assert res.status == "target-missing"
    assert TABLE in res.detail


def test_a_set_stops_at_its_first_failure_and_optional_sets_do_not_fail(tmp_path: Path, tree: Path) -> None:
    bad = make_patch(TABLE, TABLE_SRC.replace("9: {", "7: {"), TABLE_SRC.replace("9: {", "8: {"), HEADERS)
    good = make_patch(MODEL, MODEL_SRC, MODEL_WITH_HOOK, HEADERS)
    other = "sglang/srt/other.py"
    (tree / other).write_text("x = 1\n")
    bad_other = make_patch(other, "x = 2\n", "x = 3\n", HEADERS)
    strict = _set(tmp_path, "strict", {"0001-bad.patch": bad, "0002-good.patch": good})
    optional = _set(tmp_path, "opt", {"0001-bad.patch": bad_other}, optional=True)
    results = apply_sets([strict, optional], tree)
    assert [(r.set, r.patch, r.status) for r in results] == [
        ("strict", "0001-bad.patch", "drift"),
        ("opt", "0001-bad.patch", "drift"),
    ]
    assert [r.ok for r in results] == [False, True]
    assert (tree / MODEL).read_text() == MODEL_SRC  # the patch after the failure was not applied
    assert failures(results) == results[:1]


def test_patched_copy_hard_links_yet_keeps_the_source_intact(
    tmp_path: Path, tree: Path, table_set: PatchSet
) -> None:
    before = _digest(tree)
    copy = tmp_path / "cells" / "one" / "sglang"
    assert [r.status for r in P.patched_copy([table_set], tree, copy)] == ["applied"]
    assert (copy / MODEL).stat().st_ino == (tree / MODEL).stat().st_ino  # untouched files stay linked
    assert (copy / TABLE).read_text() == TABLE_WITH_12
    assert _digest(tree) == before
    assert (copy / MARKER).is_file()
    assert [r.status for r in P.patched_copy([table_set], tree, copy)] == [
        "applied"
    ]  # a fresh copy each time


# ----------------------------------------------------------------------------------------------------------
# Refusals: each names the file, the line and a fix.


def _diff(old_path: str, new_path: str) -> str:
    return (
        "Description: d\nOrigin: o\nForwarded: no\n---\n"
        f"diff --git a/x b/x\n--- {old_path}\n+++ {new_path}\n@@ -1 +1 @@\n-a\n+b\n"
    )


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("/etc/passwd", "/etc/passwd", "is absolute"),
        ("a//etc/passwd", "b//etc/passwd", "is absolute"),
        ("a/../outside.py", "b/../outside.py", "leaves the wheel tree"),
        ("a/sglang/../../x.py", "b/sglang/../../x.py", "leaves the wheel tree"),
        ("sglang/x.py", "sglang/x.py", "does not start with `a/`"),
    ],
)
def test_paths_outside_the_tree_are_refused(tmp_path: Path, old: str, new: str, message: str) -> None:
    path = tmp_path / "0001-bad.patch"
    path.write_text(_diff(old, new))
    with pytest.raises(ConfigError, match=message) as info:
        parse_patch(path)
    assert info.value.path == path
    assert info.value.line == 6  # the --- line
    assert info.value.fix


def test_a_symlink_leaving_the_tree_is_refused(tmp_path: Path, table_set: PatchSet) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "table.py").write_text(TABLE_SRC)
    tree = _tree(tmp_path / "t", {MODEL: MODEL_SRC})
    (tree / "sglang" / "srt" / "table.py").symlink_to(outside / "table.py")
    with pytest.raises(ConfigError, match=r"symlink .*outside the tree") as info:
        apply_sets([table_set], tree)
    assert info.value.line == 6  # the diff --git line of the patch
    assert (outside / "table.py").read_text() == TABLE_SRC


def test_a_binary_patch_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "0001-bin.patch"
    path.write_text(
        "Description: d\nOrigin: o\nForwarded: no\n---\ndiff --git a/sglang/x.so b/sglang/x.so\n"
        "index 1..2 100644\nGIT binary patch\nliteral 3\nKcmZ?wWB>pF01N;C\n\n"
    )
    with pytest.raises(ConfigError, match="binary patch") as info:
        parse_patch(path)
    assert info.value.line == 7


def test_a_series_naming_a_missing_file_is_refused(tmp_path: Path, table_set: PatchSet) -> None:
    (table_set.path / "series").write_text("# order matters\n0001-table.patch\n0002-gone.patch\n")
    with pytest.raises(ConfigError, match=r"`0002-gone\.patch`, which does not exist") as info:
        P.load_series(table_set)
    assert info.value.path == table_set.path / "series"
    assert info.value.line == 3
    assert "remove the line" in info.value.fix


def test_an_empty_patch_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "0001-empty.patch"
    path.write_text("Description: nothing\nOrigin: o\nForwarded: no\n---\n")
    with pytest.raises(ConfigError, match="the patch is empty"):
        parse_patch(path)
    path.write_text("")
    with pytest.raises(ConfigError, match="the patch is empty"):
        parse_patch(path)


def test_crlf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "0001-crlf.patch"
    path.write_bytes(make_patch(TABLE, TABLE_SRC, TABLE_WITH_12, HEADERS).replace("\n", "\r\n").encode())
    with pytest.raises(ConfigError, match="CRLF") as info:
        parse_patch(path)
    assert info.value.line == 1
    assert "LF" in info.value.fix


def test_missing_dep3_headers_and_wrong_hunk_counts_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "0001.patch"
    body = make_patch(TABLE, TABLE_SRC, TABLE_WITH_12)
    path.write_text("Description: d\n---\n" + body)
    with pytest.raises(ConfigError, match=r"DEP-3 header.* missing: Origin, Forwarded"):
        parse_patch(path)
    good = make_patch(TABLE, TABLE_SRC, TABLE_WITH_12, HEADERS)
    assert "@@ -9,4 +9,8 @@" in good
    path.write_text(good.replace("@@ -9,4 +9,8 @@", "@@ -9,4 +9,9 @@"))
    with pytest.raises(ConfigError, match="line counts are wrong"):
        parse_patch(path)


def test_two_sets_touching_the_same_hunk_are_refused(tmp_path: Path, table_set: PatchSet) -> None:
    other = TABLE_SRC.replace("        8: 128 * MiB,\n    },\n}\n", "        8: 256 * MiB,\n    },\n}\n")
    rival = _set(tmp_path, "rival", {"0001-rival.patch": make_patch(TABLE, TABLE_SRC, other, HEADERS)})
    with pytest.raises(
        ConfigError, match=r"sets `table` .* and `rival` .* both touch sglang/srt/table.py"
    ) as info:
        validate_sets([table_set, rival])
    assert info.value.path == rival.path / "0001-rival.patch"
    assert "disjoint" in info.value.fix
    # Disjoint ranges may touch the same lines: they never meet in one tree.
    apart = PatchSet(name="rival", applies_to=SpecifierSet(">=0.5.10"), path=rival.path)
    narrow = PatchSet(name="table", applies_to=SpecifierSet(">=0.5.9,<0.5.10"), path=table_set.path)
    assert set(validate_sets([narrow, apart])) == {"table", "rival"}


def test_an_unparsable_specifier_is_refused(tmp_path: Path) -> None:
    (tmp_path / "matrix.toml").write_text(
        textwrap.dedent(
            """\
            [axes]
            cuda = ["12.8"]
            torch = ["2.9.1"]
            sgl_kernel = ["0.3.21"]
            flashinfer = ["0.6.3"]
            sglang = ["0.5.9"]

            [patches.broken]
            applies_to = "sglang>>0.5.9"
            """
        )
    )
    with pytest.raises(ConfigError, match="not a version specifier") as info:
        matrix_mod.load(tmp_path / "matrix.toml")
    assert info.value.line == 9


# ----------------------------------------------------------------------------------------------------------
# Helpers: hashes, ordering, definitions, version picking.


def test_set_hash_covers_series_and_patch_bytes(tmp_path: Path, table_set: PatchSet) -> None:
    first = P.set_hash(table_set)
    assert first == P.set_hash(table_set)
    patch = table_set.path / "0001-table.patch"
    patch.write_text(patch.read_text().replace("why it exists", "why it exists!"))
    second = P.set_hash(table_set)
    assert second != first
    (table_set.path / "series").write_text("# a comment\n0001-table.patch\n")
    assert P.set_hash(table_set) != second


def test_sets_for_keeps_matrix_order(tmp_path: Path) -> None:
    a = PatchSet(name="a", applies_to=SpecifierSet(">=0.5.9,<0.5.10"), path=tmp_path)
    b = PatchSet(name="b", applies_to=SpecifierSet(">=0.5.9"), path=tmp_path)
    c = PatchSet(name="c", applies_to=SpecifierSet(">=0.5.10"), path=tmp_path)
    assert [s.name for s in sets_for([c, a, b], "0.5.9")] == ["a", "b"]
    assert [s.name for s in sets_for([c, a, b], "0.5.10")] == ["c", "b"]


def _hunk_of(old: str, new: str, heading_path: str = "m.py") -> Hunk:
    with_headers = make_patch(heading_path, old, new, HEADERS)
    return _parse_text(with_headers).files[0].hunks[0]


def _parse_text(text: str) -> Patch:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.patch"
        path.write_text(text)
        return parse_patch(path)


def test_added_definitions() -> None:
    assert added_definitions(_hunk_of(TABLE_SRC, TABLE_WITH_12)) == ((("assign", "SIZES"), ("key", "12")),)
    assert added_definitions(_hunk_of(MODEL_SRC, MODEL_WITH_HOOK)) == (
        (("class", "Wrapper"), ("def", "get_embed_and_head")),
    )
    edited = MODEL_SRC.replace("return self.language_model(x)", "return self.language_model(x) + 1")
    assert added_definitions(_hunk_of(MODEL_SRC, edited)) is None


def test_defined_in_walks_classes_and_tables() -> None:
    assert defined_in(TABLE_WITH_12, [("assign", "SIZES"), ("key", "12")]) == 12
    assert defined_in(TABLE_SRC, [("assign", "SIZES"), ("key", "12")]) is None
    assert defined_in(MODEL_WITH_HOOK, [("class", "Wrapper"), ("def", "get_embed_and_head")]) == 8
    assert defined_in(MODEL_SRC, [("class", "Wrapper"), ("def", "get_embed_and_head")]) is None


def test_pick_versions_takes_the_range_the_next_releases_and_the_newest() -> None:
    available = [
        "0.5.8",
        "0.5.9",
        "0.5.10rc0",
        "0.5.10",
        "0.5.10.post1",
        "0.5.11",
        "0.5.12",
        "0.5.13",
        "0.6.0",
    ]
    picked = P.pick_versions(available, [SpecifierSet(">=0.5.9,<0.5.11")], newer=2, include_newest=True)
    assert picked == ["0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.6.0"]
    assert P.pick_versions(available, [SpecifierSet(">=0.5.9,<0.5.10")], newer=1, include_newest=False) == [
        "0.5.9",
        "0.5.10",
    ]


def test_below_range() -> None:
    assert below_range(SpecifierSet(">=0.5.10,<0.5.11"), "0.5.9")
    assert not below_range(SpecifierSet(">=0.5.10,<0.5.11"), "0.5.12")
    assert below_range(SpecifierSet(">0.5.9"), "0.5.9")


def test_check_table_and_since(tmp_path: Path, table_set: PatchSet) -> None:
    trees = {
        "0.5.9": _tree(tmp_path / "a", {TABLE: TABLE_SRC}, "0.5.9"),
        "0.5.10": _tree(tmp_path / "b", {TABLE: TABLE_WITH_12}, "0.5.10"),
        "0.5.11": _tree(tmp_path / "c", {TABLE: TABLE_WITH_12}, "0.5.11"),
    }
    narrow = PatchSet(name="table", applies_to=SpecifierSet(">=0.5.9,<0.5.10"), path=table_set.path)
    rows = P.check_versions([narrow], trees)
    assert [(r.version, r.status, r.in_range) for r in rows] == [
        ("0.5.9", "applied", True),
        ("0.5.10", "upstreamed", False),
        ("0.5.11", "upstreamed", False),
    ]
    assert {r.since for r in rows} == {"0.5.10"}
    table = P.format_table(rows)
    assert "0.5.10..0.5.11" in table  # identical neighbouring columns share one
    assert "table/0001-table.patch: upstreamed from 0.5.10 on" in table


# ----------------------------------------------------------------------------------------------------------
# Port.


def test_port_carries_a_patch_over_moved_lines(tmp_path: Path, table_set: PatchSet) -> None:
    old = _tree(tmp_path / "old", {TABLE: TABLE_SRC}, "0.5.9")
    newer = "# a new header line\n\n" + TABLE_SRC
    new = _tree(tmp_path / "new", {TABLE: newer}, "0.5.10")
    result = P.port_set(
        table_set, old_tree=old, new_tree=new, from_version="0.5.9", to_version="0.5.10", out=tmp_path / "out"
    )
    assert [p.status for p in result.patches] == ["ported"]
    assert [r.status for r in result.verify] == ["applied"]
    text = (tmp_path / "out" / "0001-table.patch").read_text()
    assert "@@ -11,4 +11,8 @@" in text  # two lines further down than the old patch's @@ -9,4 +9,8 @@
    assert "Stackfarm-Ported: from sglang 0.5.9 to 0.5.10" in text
    assert "Description: a test patch\n why it exists\n" in text


def test_port_lists_conflicts_by_file_and_hunk_then_resolve_writes_the_patch(
    tmp_path: Path, table_set: PatchSet
) -> None:
    old = _tree(tmp_path / "old", {TABLE: TABLE_SRC}, "0.5.9")
    # Upstream adds an entry exactly where the patch adds one: a real conflict.
    theirs = TABLE_SRC.replace("    },\n}\n", "    },\n    11: {\n        2: 32 * MiB,\n    },\n}\n")
    new = _tree(tmp_path / "new", {TABLE: theirs}, "0.5.10")
    out = tmp_path / "out"
    result = P.port_set(
        table_set, old_tree=old, new_tree=new, from_version="0.5.9", to_version="0.5.10", out=out
    )
    [conflict] = result.conflicts
    assert conflict.path == TABLE
    assert conflict.hunks == (next(h.header for h in P.load_series(table_set)[0].files[0].hunks),)
    merged = out / "conflicts" / "0001-table.patch" / TABLE
    text = merged.read_text()
    assert "<<<<<<< new-upstream" in text
    assert "0001-table.patch  (CONFLICT" in (out / "series").read_text()
    report = P.format_port(result)
    assert f"CONFLICT {TABLE}" in report
    assert "resolve" in report
    with pytest.raises(ConfigError, match="conflict marker"):
        P.resolve_conflicts(out, new)
    merged.write_text(theirs.replace("    },\n}\n", "    },\n    12: {\n        8: 256 * MiB,\n    },\n}\n"))
    assert "11: {" in merged.read_text()
    assert P.resolve_conflicts(out, new) == ["0001-table.patch"]
    assert (out / "series").read_text().splitlines()[-1] == "0001-table.patch"
    assert not (out / "conflicts").exists()
    assert [r.status for r in P.verify_ported(out, new, "0.5.10")] == ["applied"]


def test_port_retires_a_patch_upstream_already_has(tmp_path: Path) -> None:
    ps = _set(tmp_path, "m", {"0001-m.patch": make_patch(MODEL, MODEL_SRC, MODEL_WITH_HOOK, HEADERS)})
    old = _tree(tmp_path / "old", {MODEL: MODEL_SRC}, "0.5.9")
    new = _tree(tmp_path / "new", {MODEL: MODEL_WITH_HOOK.replace("x)\n", "x)  # upstream\n")}, "0.5.10")
    result = P.port_set(
        ps, old_tree=old, new_tree=new, from_version="0.5.9", to_version="0.5.10", out=tmp_path / "o"
    )
    assert [p.status for p in result.patches] == ["upstreamed"]
    assert "retired" in (tmp_path / "o" / "series").read_text()


def test_one_patch_rule_only_an_applied_patch_is_fine() -> None:
    from stackfarm.patches.model import fine

    every = ("applied", "already-applied", "upstreamed", "drift", "target-missing")
    assert [status for status in every if fine(status)] == ["applied"]
