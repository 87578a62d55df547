"""Capability-keyed tables, feature gates and flag sites, found in small Python trees written here.

Each tree models one way real code (SGLang, flashinfer) reads the compute capability; the verdicts are pinned per
lookup style. The last tests run the 10-capability suite end to end on a synthetic cell (a tree modelling SGLang
0.5.9's symmetric-memory table, unpatched and patched) and read its JUnit report.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest

from stackfarm.analysis.arch import Arch
from stackfarm.analysis.cache import JsonCache
from stackfarm.analysis.captables import (
    FACTS_VERSION,
    CapLookup,
    FeatureError,
    evaluate_gate,
    evaluate_site,
    flag_sites,
    judge_site,
    module_facts,
    parse_features,
    scan_tables,
)
from stackfarm.analysis.fatbin import Binary, Code, Unit
from stackfarm.analysis.kernels import Library
from stackfarm.analysis.pysource import UNKNOWN, Evaluator, SourceTree
from stackfarm.cellspec import InstalledComponent
from stackfarm.junit import NOT_APPLICABLE

SM90, SM100, SM120 = Arch(9, 0), Arch(10, 0), Arch(12, 0)
REPO = Path(__file__).resolve().parent.parent


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def scan(root: Path, cache: JsonCache | None = None) -> dict[tuple[str, int], CapLookup]:
    result = scan_tables(SourceTree([root]), ["pkg"], cache)
    return {(c.path, c.lookup.line): c for c in result.lookups}


# --------------------------------------------------------------------------- tables, one style each

STYLES = {
    "pkg/__init__.py": "",
    # a subscript with the major from a local: the seeds' KeyError: 12
    "pkg/subscript.py": """\
        import torch
        SIZES = {9: 64, 10: 128}
        def size():
            major = torch.cuda.get_device_capability()[0]
            return SIZES[major]
        """,
    # .get with the major from tuple unpacking
    "pkg/get.py": """\
        import torch
        LIMITS = {9: 1, 10: 2}
        def limit():
            major, minor = torch.cuda.get_device_capability()
            return LIMITS.get(major, 0)
        """,
    # `in` with major * 10 + minor from a helper in another module, re-exported through `import *`
    "pkg/util/__init__.py": "from pkg.util.common import *\n",
    "pkg/util/common.py": """\
        import torch
        def get_sm():
            props = torch.cuda.get_device_properties(0)
            return props.major * 10 + props.minor
        """,
    "pkg/member.py": """\
        from pkg.util import get_sm
        KERNELS = {90: "hopper", 100: "blackwell"}
        def has_kernel():
            return get_sm() in KERNELS
        """,
    # (major, minor) keys, looked up with the whole tuple
    "pkg/pair.py": """\
        import torch
        TILES = {(9, 0): 128, (12, 0): 64}
        def tile():
            return TILES[torch.cuda.get_device_capability()]
        """,
    # a class-level table and an attribute set in __init__, read in another method; the table of a
    # second lookup lives in another module
    "pkg/tables.py": "MAX_SIZES = {9: {8: 1}, 10: {8: 2}}\n",
    "pkg/comm.py": """\
        import torch
        from pkg.tables import MAX_SIZES
        class Comm:
            _WORLD = {9: [4, 8], 10: [8]}
            def __init__(self):
                self.cc = torch.cuda.get_device_capability()[0]
                self.max = MAX_SIZES[self.cc]
            def multimem(self, n):
                return n in self._WORLD[self.cc]
        """,
    # guarded subscripts do not crash
    "pkg/guarded.py": """\
        import torch
        T = {9: 1}
        def a():
            cc = torch.cuda.get_device_capability()[0]
            if cc in T:
                return T[cc]
            return 0
        def b():
            cc = torch.cuda.get_device_capability()[0]
            if cc not in T:
                return None
            return T[cc]
        def c():
            cc = torch.cuda.get_device_capability()[0]
            try:
                return T[cc]
            except KeyError:
                return None
        """,
    # keys that are computed, and keys that are named constants (folded)
    "pkg/computed.py": """\
        import torch
        BASE = 9
        HOPPER = 9
        NAMED = {HOPPER: 1, 10: 2}
        COMPUTED = {BASE + 1: 2, **{9: 1}}
        def named():
            return NAMED[torch.cuda.get_device_capability()[0]]
        def computed():
            return COMPUTED[torch.cuda.get_device_capability()[0]]
        """,
    # not capability tables: the key is a parameter, or the dict is not a literal
    "pkg/unrelated.py": """\
        BITS = {4: "int4", 8: "int8"}
        def bits(n):
            return BITS[n]
        def dynamic():
            import torch
            table = dict(zip([9, 10], [1, 2]))
            return table[torch.cuda.get_device_capability()[0]]
        """,
}


@pytest.fixture(scope="module")
def styles(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], CapLookup]:
    return scan(write_tree(tmp_path_factory.mktemp("styles"), STYLES))


@pytest.mark.parametrize(
    ("where", "kind", "table", "on_120", "on_90"),
    [
        (("pkg/subscript.py", 5), "major", "SIZES", "missing-crash", "ok"),
        (("pkg/get.py", 5), "major", "LIMITS", "missing-graceful", "ok"),
        (("pkg/member.py", 4), "sm", "KERNELS", "missing-graceful", "ok"),
        (("pkg/pair.py", 4), "pair", "TILES", "ok", "ok"),
        (("pkg/comm.py", 7), "major", "MAX_SIZES", "missing-crash", "ok"),
        (("pkg/comm.py", 9), "major", "Comm._WORLD", "missing-crash", "ok"),
        (("pkg/guarded.py", 6), "major", "T", "missing-graceful", "ok"),
        (("pkg/guarded.py", 12), "major", "T", "missing-graceful", "ok"),
        (("pkg/guarded.py", 16), "major", "T", "missing-graceful", "ok"),
        (("pkg/computed.py", 7), "major", "NAMED", "missing-crash", "ok"),
    ],
)
def test_lookup_styles(
    styles: dict[tuple[str, int], CapLookup],
    where: tuple[str, int],
    kind: str,
    table: str,
    on_120: str,
    on_90: str,
) -> None:
    assert where in styles, f"{where} not found; found {sorted(styles)}"
    cap = styles[where]
    assert (cap.kind, cap.table.name) == (kind, table)
    assert cap.verdict(SM120) == on_120
    assert cap.verdict(SM90) == on_90


def test_named_keys_are_folded_and_computed_keys_are_undecidable(
    styles: dict[tuple[str, int], CapLookup],
) -> None:
    assert styles[("pkg/computed.py", 7)].table.keys == (9, 10)
    computed = styles[("pkg/computed.py", 9)]
    assert computed.table.keys is None
    assert computed.table.computed == "BASE + 1"
    assert computed.verdict(SM120) is None


def test_non_capability_lookups_are_not_reported(styles: dict[tuple[str, int], CapLookup]) -> None:
    assert not [w for w in styles if w[0] == "pkg/unrelated.py"]
    assert styles[("pkg/comm.py", 7)].table_path == "pkg/tables.py"


def test_table_with_the_target_key(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {"pkg/__init__.py": "", "pkg/subscript.py": STYLES["pkg/subscript.py"]})
    path = root / "pkg" / "subscript.py"
    path.write_text(path.read_text().replace("{9: 64, 10: 128}", "{9: 64, 10: 128, 12: 64}"))
    (cap,) = scan(root).values()
    assert cap.verdict(SM120) == "ok"
    assert cap.target_key(SM120) == 12


def test_facts_are_cached_by_file_hash(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", STYLES)
    cache = JsonCache(tmp_path / "cache", FACTS_VERSION)
    first = scan_tables(SourceTree([root]), ["pkg"], cache)
    second = scan_tables(SourceTree([root]), ["pkg"], cache)
    assert first.files_parsed > 0
    assert first.cache_hits == 0
    assert (second.files_parsed, second.cache_hits) == (0, first.files_parsed)
    assert [(c.path, c.lookup.line, c.verdict(SM120)) for c in first.lookups] == [
        (c.path, c.lookup.line, c.verdict(SM120)) for c in second.lookups
    ]
    (root / "pkg" / "get.py").write_text(
        (root / "pkg" / "get.py").read_text().replace("{9: 1,", "{12: 3, 9: 1,")
    )
    third = scan_tables(SourceTree([root]), ["pkg"], cache)
    assert third.files_parsed == 1
    assert {c.path: c.verdict(SM120) for c in third.lookups}["pkg/get.py"] == "ok"


def test_only_files_that_can_hold_capabilities_are_parsed(tmp_path: Path) -> None:
    files = dict(STYLES)
    files.update(
        {f"pkg/filler{i}.py": f"X{i} = {{1: 2}}\ndef f(k):\n    return X{i}[k]\n" for i in range(30)}
    )
    result = scan_tables(SourceTree([write_tree(tmp_path, files)]), ["pkg"])
    assert result.files_total == len(files)
    assert result.files_parsed < len(STYLES)  # the fillers never mention a capability source


def test_a_file_that_does_not_parse_is_skipped(tmp_path: Path) -> None:
    files = dict(STYLES)
    files["pkg/broken.py"] = "import torch\nx = torch.cuda.get_device_capability(\n"
    result = scan_tables(SourceTree([write_tree(tmp_path, files)]), ["pkg"])
    assert any("pkg/broken.py" in p and "does not parse" in p for p in result.problems)
    assert len(result.lookups) >= 10


def test_module_facts_roundtrip_through_json() -> None:
    facts = module_facts("pkg.comm", False, textwrap.dedent(STYLES["pkg/comm.py"]).encode())
    again = type(facts).from_json(json.loads(json.dumps(facts.to_json())))
    assert again == facts
    assert facts.defs["Comm.cc"] == ("index", ("cap",), 0)
    assert facts.tables["Comm._WORLD"].keys == (9, 10)


# --------------------------------------------------------------------------- gates

GATES = {
    "pkg/__init__.py": "",
    # the way SGLang builds its is_smXX_supported() helpers
    "pkg/utils.py": """\
        from functools import lru_cache, partial
        import torch
        def is_cuda():
            return torch.cuda.is_available() and torch.version.cuda
        def _check(device_capability_majors, cuda_version):
            if not is_cuda():
                return False
            return (
                torch.cuda.get_device_capability()[0] in device_capability_majors
                and tuple(map(int, torch.version.cuda.split(".")[:2])) >= cuda_version
            )
        is_sm90_supported = lru_cache(maxsize=1)(partial(_check, device_capability_majors=[9], cuda_version=(12, 3)))
        is_sm100_supported = lru_cache(maxsize=1)(partial(_check, device_capability_majors=[10], cuda_version=(12, 8)))
        """,
    "pkg/fusion.py": """\
        from pkg.utils import is_cuda, is_sm90_supported, is_sm100_supported
        _is_cuda = is_cuda()
        _sm90 = _is_cuda and is_sm90_supported()
        _sm100 = _is_cuda and is_sm100_supported()
        _ENABLED = False
        def set_enabled(value):
            global _ENABLED
            _ENABLED = value
        def apply_fusion(batch_size, args):
            return (
                (_sm90 or _sm100)
                and batch_size > 0
                and _ENABLED
                and args.enable_fusion
            )
        def auto_enable(args, model):
            if not args.enable_fusion and model == "x" and (is_sm90_supported() or is_sm100_supported()):
                args.enable_fusion = True
        def apply_fusion_everywhere(args):
            return args.enable_fusion and args.world > 1
        """,
    "pkg/attention.py": """\
        import torch
        def create_fa3(runner):
            assert torch.cuda.get_device_capability()[0] == 9, "FA3 needs Hopper"
            return runner
        """,
    # a model of SGLang 0.5.9's TorchSymmMemCommunicator: the table lookup sits in __init__
    "pkg/symm.py": """\
        import torch
        import torch.distributed as dist
        SIZES = {9: {4: 64, 8: 128}, 10: {4: 64, 8: 128}}
        class Comm:
            def __init__(self, group):
                self.disabled = True
                self.world = dist.get_world_size(group)
                self.cc = torch.cuda.get_device_capability()[0]
                if self.cc < 9:
                    return
                if self.world not in SIZES[self.cc]:
                    return
                self.disabled = False
        """,
    # a model of flashinfer's JIT compilation context: a loop, a set filled with .add, a comprehension
    "pkg/jit.py": """\
        import os
        import torch
        class Context:
            def __init__(self):
                self.archs = set()
                if "ARCH_LIST" in os.environ:
                    for arch in os.environ["ARCH_LIST"].split(" "):
                        major, minor = arch.split(".")
                        self.archs.add((int(major), minor))
                else:
                    for device in range(torch.cuda.device_count()):
                        major, minor = torch.cuda.get_device_capability(device)
                        self.archs.add((major, str(minor) + "a"))
            def flags(self, majors):
                chosen = [a for a in self.archs if a[0] in majors]
                if len(chosen) == 0:
                    raise RuntimeError(f"No supported CUDA architectures found for major versions {majors}.")
                return [f"-arch=sm_{a}{b}" for a, b in chosen]
        context = Context()
        def gen_comm_module():
            return context.flags([9, 10])
        def debug_enabled():
            return os.environ.get("PKG_DEBUG", "0") == "1"
        """,
}


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> SourceTree:
    return SourceTree([write_tree(tmp_path_factory.mktemp("gates"), GATES)])


def test_gate_off_on_sm120_and_where(gates: SourceTree) -> None:
    off = evaluate_gate(gates, "pkg.fusion:apply_fusion", SM120, "12.8", assume={"enable_fusion": True})
    assert off.state == "off"
    assert (off.path, off.line) == ("pkg/fusion.py", 11)
    assert "`_sm90 or _sm100` is False" in off.reason
    on = evaluate_gate(gates, "pkg.fusion:apply_fusion", SM90, "12.8", assume={"enable_fusion": True})
    assert on.state == "on"
    # CUDA 12.2 is too old for is_sm90_supported(): the CUDA version takes part too
    assert evaluate_gate(gates, "pkg.fusion:apply_fusion", SM90, "12.2").state == "off"
    assert evaluate_gate(gates, "pkg.fusion:apply_fusion", SM100, "12.8").state == "on"


def test_assert_gate(gates: SourceTree) -> None:
    assert evaluate_gate(gates, "pkg.attention:create_fa3", SM90, "12.8").state == "on"
    off = evaluate_gate(gates, "pkg.attention:create_fa3", SM120, "12.8")
    assert off.state == "off"
    assert "AssertionError" in off.reason
    assert off.line == 3


def test_constructor_gate_crashes_with_keyerror(gates: SourceTree) -> None:
    crash = evaluate_gate(gates, "pkg.symm:Comm.__init__", SM120, "12.8")
    assert crash.state == "crash"
    assert (crash.path, crash.line) == ("pkg/symm.py", 11)
    assert "KeyError: 12" in crash.reason
    assert evaluate_gate(gates, "pkg.symm:Comm.__init__", SM90, "12.8").state == "on"


def test_gate_through_loops_sets_and_comprehensions(gates: SourceTree) -> None:
    off = evaluate_gate(gates, "pkg.jit:gen_comm_module", SM120, "12.8")
    assert off.state == "off"
    assert "No supported CUDA architectures" in off.reason
    assert "`len(chosen) == 0` is True" in off.reason
    assert evaluate_gate(gates, "pkg.jit:gen_comm_module", SM90, "12.8").state == "on"
    # with ARCH_LIST set, the loop over an unknown split is not unrolled: nothing is claimed
    unknown = evaluate_gate(gates, "pkg.jit:gen_comm_module", SM120, "12.8", environ={"ARCH_LIST": "9.0"})
    assert unknown.state == "on"


def test_environment_is_unset_unless_given(gates: SourceTree) -> None:
    assert evaluate_gate(gates, "pkg.jit:debug_enabled", SM90, "12.8").state == "off"
    assert (
        evaluate_gate(gates, "pkg.jit:debug_enabled", SM90, "12.8", environ={"PKG_DEBUG": "1"}).state == "on"
    )


def test_missing_gate_is_reported_not_raised(gates: SourceTree) -> None:
    result = evaluate_gate(gates, "pkg.fusion:no_such_gate", SM120, "12.8")
    assert result.state == "unknown"
    assert "no_such_gate" in result.reason


def test_runtime_globals_are_unknown(gates: SourceTree) -> None:
    # _ENABLED is rebound by set_enabled() through `global`: its import-time False says nothing
    namespace = Evaluator(gates, SM90, "12.8").namespace("pkg.fusion")
    assert namespace["_ENABLED"] is UNKNOWN
    assert namespace["_sm90"] is True


def test_flag_sites_are_found_and_judged(gates: SourceTree) -> None:
    sites = {(s.path, s.line): s for s in flag_sites(gates, ["pkg"], ["enable_fusion"])}
    assert set(sites) == {("pkg/fusion.py", 11), ("pkg/fusion.py", 17), ("pkg/fusion.py", 20)}
    assume = {"enable_fusion": True}
    auto = sites[("pkg/fusion.py", 17)]
    # auto-enabling is moot when the flag is set: false on every arch, so no capability question
    assert evaluate_site(gates, auto, SM120, "12.8", assume=assume) is False
    assert evaluate_site(gates, auto, SM90, "12.8", assume=assume) is False
    runtime = sites[("pkg/fusion.py", 11)]
    assert evaluate_site(gates, runtime, SM120, "12.8", assume=assume) is False
    assert evaluate_site(gates, runtime, SM90, "12.8", assume=assume) is None
    everywhere = sites[("pkg/fusion.py", 20)]
    assert evaluate_site(gates, everywhere, SM120, "12.8", assume=assume) is None


# --------------------------------------------------------------------------- matrix.toml [features]


def test_parse_features() -> None:
    (feature,) = parse_features(
        {
            "fa3": {
                "gate": "pkg.attention:create_fa3",
                "libs": ["sgl_kernel/flash_ops.*"],
                "off": {"sm120": "why"},
            }
        }
    )
    assert feature.gates == ("pkg.attention:create_fa3",)
    assert feature.off == {SM120: "why"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"x": {"gates": "a:b"}}, r"unknown key\(s\) \['gates'\]"),
        ({"x": {"gate": "pkg.attention.create_fa3"}}, "must be 'module:qualname'"),
        ({"x": {"off": {"12": "why"}}}, "a bare major is ambiguous"),
        ({"x": {"flags": [1]}}, "must be a string or a list of strings"),
        ({"x": "on"}, r"must be a table \(\[features.x\]\)"),
    ],
)
def test_parse_features_rejects(raw: dict[str, object], message: str) -> None:
    with pytest.raises(FeatureError, match=message):
        parse_features(raw)


# --------------------------------------------------------------------------- the suite, end to end

SYMM_059 = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/all_reduce_utils.py": "MAX_SIZES = {\n    9: {8: 128},\n    10: {8: 128},\n}\n",
    "sglang/srt/symm.py": """\
        import torch
        import torch.distributed as dist
        from sglang.srt.all_reduce_utils import MAX_SIZES
        class Communicator:
            def __init__(self, group):
                self.disabled = True
                self.world_size = dist.get_world_size(group)
                self.device_capability = torch.cuda.get_device_capability()[0]
                if self.world_size not in MAX_SIZES[self.device_capability]:
                    return
                self.disabled = False
        """,
}


def _run_suite(tmp_path: Path, sglang_root: Path, archs: list[str]) -> dict[str, dict[str, str]]:
    cell = {
        "id": "synthetic", "values": {"cuda": "12.8", "sglang": "0.5.9"}, "backend": "local",
        "components": [{"axis": "sglang", "distribution": "sglang", "version": "0.5.9", "filename": "x.whl",
                        "sha256": "0" * 64, "source": "test", "root": str(sglang_root)}],
        "archs": archs, "reference_arch": "sm_90", "models": [], "patch_sets": [],
        "features": {"symm": {"gate": "sglang.srt.symm:Communicator.__init__"}},
        "thresholds": {}, "settings": {"10-capability": {}}, "no_gpu_reason": "no GPU in unit tests",
    }  # fmt: skip
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "cell.json"
    spec.write_text(json.dumps(cell))
    junit = tmp_path / "junit.xml"
    env = {**os.environ, "STACKFARM_CELL": str(spec), "STACKFARM_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(REPO / "suites" / "10-capability"), f"--junitxml={junit}",
         "-q", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestWarning"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    cases: dict[str, dict[str, str]] = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        failure = case.find("failure")
        skipped = case.find("skipped")
        result = failure if failure is not None else skipped
        props["outcome"] = "failed" if failure is not None else "skipped" if skipped is not None else "passed"
        props["message"] = result.get("message", "") if result is not None else ""
        cases[case.get("name", "")] = props
    return cases


@pytest.mark.integration
def test_suite_fails_unpatched_and_passes_patched(tmp_path: Path) -> None:
    unpatched = write_tree(tmp_path / "unpatched", SYMM_059)
    cases = _run_suite(tmp_path / "run1", unpatched, ["sm_120", "sm120", "12"])
    failed = {name: c for name, c in cases.items() if c["outcome"] == "failed"}
    table = [c for c in failed.values() if c.get("symbol") == "MAX_SIZES" and c.get("arch") == "sm_120"]
    assert len(table) == 1
    assert table[0]["verdict"] == "missing-crash"
    assert table[0]["file"] == "sglang/srt/symm.py"
    assert table[0]["line"] == "9"
    assert "KeyError: 12" in table[0]["message"]
    assert "add 12" in table[0]["message"]
    gate = [c for c in failed.values() if c.get("symbol") == "Communicator.__init__"]
    assert gate
    assert gate[0]["verdict"] == "missing-crash"
    # "sm120" is the same arch (no second set of findings); "12" is rejected with a clear message
    assert [c for c in failed.values() if "a bare major is ambiguous" in c["message"]]
    assert not [c for c in cases.values() if c.get("arch") == "sm120"]
    gpu = [c for name, c in cases.items() if "gpu" in name]
    assert gpu
    assert all(c["outcome"] == "skipped" and "needs GPU: no GPU in unit tests" in c["message"] for c in gpu)
    # the suite's record (family.py) beside its JUnit file says the same, and carries the grid
    record = json.loads((tmp_path / "run1" / "10-capability.json").read_text())["record"]
    (table_finding,) = (f for f in record["findings"] if f["symbol"] == "MAX_SIZES" and f["arch"] == "sm_120")
    assert (table_finding["verdict"], table_finding["file"], table_finding["line"]) == (
        "missing-crash", "sglang/srt/symm.py", 9,
    )  # fmt: skip
    assert table_finding["testcase"] in cases
    assert {(g["arch"], g["component"]) for g in record["grid"]} >= {("sm_120", "sglang")}

    patched = write_tree(tmp_path / "patched", SYMM_059)
    utils = patched / "sglang" / "srt" / "all_reduce_utils.py"
    utils.write_text(
        utils.read_text().replace("    10: {8: 128},\n", "    10: {8: 128},\n    12: {8: 128},\n")
    )
    cases = _run_suite(tmp_path / "run2", patched, ["sm_120", "sm_90"])
    assert not [c for c in cases.values() if c["outcome"] == "failed"], cases
    verdicts = {(c.get("arch"), c.get("symbol")): c.get("verdict") for c in cases.values()}
    assert verdicts[("sm_120", "MAX_SIZES")] == "ok"
    assert verdicts[("sm_120", "Communicator.__init__")] == "ok"
    assert verdicts[("sm_90", "MAX_SIZES")] == "ok"


@pytest.mark.integration
def test_suite_leaves_a_computed_table_unanswered(tmp_path: Path) -> None:
    """A table whose keys are computed cannot be decided: a plain skip (the cell is incomplete), not n/a."""
    files = {
        **SYMM_059,
        "sglang/srt/computed.py": """\
            import torch
            BASE = 9
            COMPUTED = {BASE + 1: 2, **{9: 1}}
            def computed():
                return COMPUTED[torch.cuda.get_device_capability()[0]]
            """,
    }
    cases = _run_suite(tmp_path / "run", write_tree(tmp_path / "tree", files), ["sm_120"])
    computed = [c for c in cases.values() if c.get("symbol") == "COMPUTED"]
    assert len(computed) == 1
    assert computed[0]["outcome"] == "skipped"
    assert "cannot decide statically" in computed[0]["message"]
    assert not computed[0]["message"].startswith(NOT_APPLICABLE)


def test_a_cubin_family_without_the_arch_does_not_apply() -> None:
    """flashinfer picks cubins per GPU: a family with no code for an arch is n/a there, not a failure."""
    sys.path.insert(0, str(REPO / "suites" / "10-capability"))
    findings = importlib.import_module("capability_findings")
    sm90 = Arch(9, 0)
    family = Library(
        "flashinfer-cubin", "flashinfer_cubin/cubins/fmha/*", spread="any-unit",
        binary=Binary("flashinfer_cubin/cubins/fmha/*", 1, "cubin", (Unit((Code("sass", sm90),)),)),
    )  # fmt: skip
    comp = InstalledComponent(axis="flashinfer", distribution="flashinfer-cubin", version="0.6.3",
                              filename="x.whl", sha256="0" * 64, source="test", root="/nowhere")  # fmt: skip
    off = findings._binary_finding(comp, family, Arch(12, 0), ())
    assert (off.outcome, off.verdict) == ("n/a", "no-code")
    assert "flashinfer loads a cubin family only on the GPUs it was built for" in off.message
    assert findings._binary_finding(comp, family, sm90, ()).outcome == "pass"
    analysis = findings.Analysis([off])
    assert findings.grid(analysis) == {("sm_120", "flashinfer-cubin"): "ok"}


# --------------------------------------------------------------------------- three-valued gates

#: A platform object that answers its facts through __getattr__ (SGLang >= 0.5.2x's PlatformContext), a PEP 562
#: module hook (sglang.srt.platforms' current_platform), and a run-time-only unknown for contrast.
UNRESOLVED = {
    "plat/__init__.py": """\
        def __getattr__(name):
            if name == "current_platform":
                return object()
            raise AttributeError(name)
        """,
    "plat/context.py": """\
        class PlatformContext:
            def __getattr__(self, name):
                return probe(name)()
        _PLATFORM = PlatformContext()
        def get_platform():
            return _PLATFORM
        """,
    "plat/fusion.py": """\
        from plat.context import get_platform
        from plat import current_platform
        _is_sm90 = get_platform().is_sm90
        def applies(batch_size, args):
            return _is_sm90 and batch_size > 0 and args.enable_fusion
        def gate(args):
            if get_platform().is_sm100:
                return True
            return False
        def hooked():
            return current_platform.is_cuda()
        def runtime_only(args, batch_size):
            return args.enable_fusion and batch_size > 0
        def refused():
            if get_platform().is_sm100:
                raise RuntimeError("no")
            raise RuntimeError("never")
        """,
}


@pytest.fixture(scope="module")
def unresolved(tmp_path_factory: pytest.TempPathFactory) -> SourceTree:
    return SourceTree([write_tree(tmp_path_factory.mktemp("unresolved"), UNRESOLVED)])


def test_unresolved_values_make_gates_unknown_never_on(unresolved: SourceTree) -> None:
    # `if get_platform().is_sm100: return True` (fusion.py:7): PlatformContext.__getattr__ answers it at run
    # time, so neither branch is known to be taken: before, the True end made it "on" on every GPU
    gate = evaluate_gate(unresolved, "plat.fusion:gate", SM120, "12.8")
    assert gate.state == "unknown"
    assert gate.unresolved.startswith(
        "unknown: `get_platform().is_sm100` at plat/fusion.py:7 could not be resolved"
    )
    assert "PlatformContext.__getattr__" in gate.unresolved
    # the PEP 562 hook of plat/__init__.py answers current_platform (fusion.py:11)
    hooked = evaluate_gate(unresolved, "plat.fusion:hooked", SM90, "12.8")
    assert hooked.state == "unknown"
    assert "`current_platform` at plat/fusion.py:11" in hooked.unresolved
    # a value known only at run time (arguments) stays "on": some run enables it
    assert evaluate_gate(unresolved, "plat.fusion:runtime_only", SM120, "12.8").state == "on"
    # every path refuses, whatever the unresolved test says: off is still sound
    assert evaluate_gate(unresolved, "plat.fusion:refused", SM120, "12.8").state == "off"


def test_unresolved_module_global_makes_a_site_undecidable(unresolved: SourceTree) -> None:
    (site,) = flag_sites(unresolved, ["plat"], ["enable_fusion"])[:1]
    assert (site.path, site.line) == ("plat/fusion.py", 5)
    # `_is_sm90 = get_platform().is_sm90` (fusion.py:3) is bound at import time; reading it later taints the site
    value, why = judge_site(unresolved, site, SM120, "12.8", assume={"enable_fusion": True})
    assert value is None
    assert why.startswith("unknown: `get_platform().is_sm90` at plat/fusion.py:3 could not be resolved")
    runtime = flag_sites(unresolved, ["plat"], ["enable_fusion"])[-1]
    assert judge_site(unresolved, runtime, SM120, "12.8", assume={"enable_fusion": True}) == (None, "")


def _real_tree(version: str) -> Path:
    from stackfarm.matrix import load as load_matrix
    from stackfarm.sglangtrees import sglang_trees

    return sglang_trees(load_matrix(REPO / "matrix.toml"), [version], echo=lambda _: None)[version]


def _analyse_release(version: str, root: Path) -> list[object]:
    sys.path.insert(0, str(REPO / "suites" / "10-capability"))
    findings = importlib.import_module("capability_findings")
    import tomllib

    from stackfarm.cellspec import CellSpec

    raw = tomllib.loads((REPO / "matrix.toml").read_text(encoding="utf-8"))
    comp = InstalledComponent(axis="sglang", distribution="sglang", version=version, filename="x.whl",
                              sha256="0" * 64, source="pypi", root=str(root))  # fmt: skip
    cell = CellSpec(id=version, values={"cuda": "12.8", "sglang": version}, backend="local", components=(comp,),
                    archs=("sm_90", "sm_120"), reference_arch="sm_90", features=raw["features"],
                    settings={"10-capability": {}})  # fmt: skip
    return list(findings.analyse(cell).findings)


@pytest.mark.integration
def test_real_0_5_23_platform_getattr_is_followed() -> None:
    """SGLang 0.5.23, sglang/srt/layers/layer_boundary/residual/add_norm.py:

        53  _is_sm90_supported = _is_cuda and get_platform().is_sm90
        146 (_is_sm90_supported or _is_sm100_supported) and _is_flashinfer_available and ... (flashinfer_ar_fusion_applies)

    get_platform() returns runtime_context.PlatformContext (runtime_context.py:1849); its facts come from
    `__getattr__` (:1862-1874): `probe = _PLATFORM_PROBES.get(name) ...` ("is_sm90" -> "is_sm90_supported",
    :1831), `overrides = object.__getattribute__(self, "_overrides")` (set to {} in __init__, :1860; only
    override_platform(), a scoped test hook, fills it), then `getattr(_common, probe)()`: utils/common.py:333
    is_sm90_supported = lru_cache(partial(_check_cuda_device_version, device_capability_majors=[9], ...)).
    The evaluator follows the hook, so the condition is false on sm_120 (gated-off, a failure) and true up to
    run-time settings on sm_90 (before, it was an undecidable skip on every arch)."""
    findings = _analyse_release("0.5.23", _real_tree("0.5.23"))
    site = {f.arch: f for f in findings if f.kind == "flag" and f.file.endswith("residual/add_norm.py")}  # type: ignore[attr-defined]
    sm120, sm90 = site["sm_120"], site["sm_90"]
    assert (sm120.outcome, sm120.verdict, sm120.line) == ("fail", "gated-off", 146)  # type: ignore[attr-defined]
    assert (sm90.outcome, sm90.verdict) == ("pass", "ok")  # type: ignore[attr-defined]
    assert not [f for f in findings if f.outcome == "pass" and "could not be resolved" in f.message]  # type: ignore[attr-defined]


@pytest.mark.integration
def test_real_0_5_23_unresolved_module_hook_is_never_on() -> None:
    """SGLang 0.5.23, sglang/srt/kv_canary/api.py:45-49 (torch_reference_conflicts_with_decode_graph):

        return (
            use_torch_reference(device)
            and current_platform.capabilities.graph_capture
            and not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
        )

    `current_platform` (api.py:22 `from sglang.srt.platforms import current_platform`) is answered by the PEP 562
    hook sglang/srt/platforms/__init__.py:213 `def __getattr__(name)` -> `_resolve_platform()` at run time: the
    evaluator does not resolve it, so the function's only enabling end hangs on it: unknown, with the expression
    and where, never "on"; as a matrix feature's gate it is an undecidable skip, not a pass."""
    root = _real_tree("0.5.23")
    gate = "sglang.srt.kv_canary.api:torch_reference_conflicts_with_decode_graph"
    for arch in (SM90, SM120):
        result = evaluate_gate(SourceTree([root]), gate, arch, "12.8")
        assert result.state == "unknown"
        assert result.unresolved.startswith(
            "unknown: `current_platform` at sglang/srt/kv_canary/api.py:47 could not be resolved "
            "(sglang.srt.platforms.__getattr__ answers 'current_platform' at run time)"
        )
    sys.path.insert(0, str(REPO / "suites" / "10-capability"))
    capability = importlib.import_module("capability_findings")
    from stackfarm.cellspec import CellSpec

    comp = InstalledComponent(axis="sglang", distribution="sglang", version="0.5.23", filename="x.whl",
                              sha256="0" * 64, source="pypi", root=str(root))  # fmt: skip
    cell = CellSpec(id="x", values={"cuda": "12.8"}, backend="local", components=(comp,), archs=("sm_90", "sm_120"),
                    reference_arch="sm_90", features={"canary": {"gate": gate}}, settings={"10-capability": {}})  # fmt: skip
    found = [f for f in capability.analyse(cell).findings if f.kind == "gate"]
    assert {(f.arch, f.outcome, f.verdict) for f in found} == {
        ("sm_90", "skip", "unknown"),
        ("sm_120", "skip", "unknown"),
    }
    assert all(f.message.startswith("undecidable: ") for f in found)


@pytest.mark.integration
def test_real_0_5_9_gates_unchanged_and_absent_gate_reported() -> None:
    """SGLang 0.5.9, sglang/srt/layers/communicator.py:92-95: apply_flashinfer_allreduce_fusion returns
    `(_is_sm90_supported or _is_sm100_supported) and ...`, with both helpers plain torch.cuda probes: off on
    sm_120, on (run-time dependent) on sm_90 as before. flashinfer.jit.comm:gen_trtllm_comm_module, the
    feature's other gate, is in no tree of this sglang-only cell: reported n/a, not dropped."""
    findings = _analyse_release("0.5.9", _real_tree("0.5.9"))
    gate = {f.arch: f for f in findings if f.symbol == "apply_flashinfer_allreduce_fusion"}  # type: ignore[attr-defined]
    assert (gate["sm_90"].outcome, gate["sm_90"].verdict) == ("pass", "ok")  # type: ignore[attr-defined]
    assert (gate["sm_120"].outcome, gate["sm_120"].verdict) == ("fail", "gated-off")  # type: ignore[attr-defined]
    absent = [f for f in findings if f.symbol == "gen_trtllm_comm_module"]  # type: ignore[attr-defined]
    assert [(f.arch, f.outcome) for f in absent] == [("all", "n/a")]  # type: ignore[attr-defined]
    assert "is not in this cell's trees" in absent[0].message  # type: ignore[attr-defined]


def test_feature_off_everywhere_including_the_reference_is_reported(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "suites" / "10-capability"))
    findings = importlib.import_module("capability_findings")
    from stackfarm.cellspec import CellSpec

    root = write_tree(tmp_path / "tree", {"sglang/__init__.py": "", "sglang/off.py": """\
        import torch
        def gate():
            return torch.cuda.get_device_capability()[0] == 7
        """})  # fmt: skip
    comp = InstalledComponent(axis="sglang", distribution="sglang", version="0", filename="x.whl",
                              sha256="0" * 64, source="test", root=str(root))  # fmt: skip
    cell = CellSpec(id="x", values={"cuda": "12.8"}, backend="local", components=(comp,), archs=("sm_120",),
                    reference_arch="sm_90", features={"f": {"gate": ["sglang.off:gate", "sglang.gone:gate"]}},
                    settings={"10-capability": {}})  # fmt: skip
    out = findings.analyse(cell).findings
    everywhere = [f for f in out if f.arch == "all" and f.verdict == "gated-off"]
    assert len(everywhere) == 1
    assert "off on every target arch, the reference sm_90 included" in everywhere[0].message
    assert [
        f.outcome for f in out if f.symbol == "gate" and f.arch == "all" and "sglang.gone" in f.message
    ] == ["n/a"]


def test_a_loader_pattern_the_host_declared_missing_is_undecidable_not_a_failure() -> None:
    """A host that stripped sgl_kernel/sm100/ (declared) cannot say what an sm_120 GPU would load: a skip."""
    sys.path.insert(0, str(REPO / "suites" / "10-capability"))
    findings = importlib.import_module("capability_findings")
    from stackfarm.analysis.kernels import LoaderChoice

    comp = InstalledComponent(axis="sgl_kernel", distribution="sglang-kernel", version="0.4.4",
                              filename="x.whl", sha256="0" * 64, source="test", root="/nowhere")  # fmt: skip
    choice = LoaderChoice(
        Arch(12, 0), ("sgl_kernel/sm100/common_ops.*", "sgl_kernel/common_ops.*"), None, "t"
    )
    stripped = findings._loader_finding(comp, (), choice, (), {"sgl_kernel/sm100/**": "not carried"})
    assert stripped.outcome == "skip"
    assert stripped.message.startswith("undecidable:")
    assert "not carried" in stripped.message
    assert findings._loader_finding(comp, (), choice, (), {}).outcome == "fail", "undeclared: still a failure"
