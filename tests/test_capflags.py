"""stackfarm.analysis.capflags (a flag followed into the functions it is passed to), on a small tree written here.

The tree models SGLang 0.5.9's torch-symm-mem chain (model_runner.py:782 passes the flag to
``parallel_state.set_torch_symm_mem_all_reduce(enable)``, which stores it in a module global;
``init_model_parallel_group`` passes that on as ``GroupCoordinator(use_...=...)``; ``__init__`` keeps it as
``self.use_...`` and constructs ``TorchSymmMemCommunicator`` under ``if self.use_... and ...``), plus a callee
that tests its parameter against a capability probe, an unresolved callee, a recursion loop, a chain deeper
than the bound, and a callee whose test is unresolvable. The real releases are in test_capability_releases.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stackfarm.analysis.arch import Arch
from stackfarm.analysis.capflags import MAX_HOPS, follow_flags, followed_sites
from stackfarm.analysis.capgates import flag_sites, judge_site
from stackfarm.analysis.pysource import SourceTree
from test_capauto import analyse
from test_captables import write_tree

SM80, SM90, SM100, SM120 = Arch(8, 0), Arch(9, 0), Arch(10, 0), Arch(12, 0)
REPO = Path(__file__).resolve().parent.parent

TREE = {
    "sglang/__init__.py": "",
    "sglang/utils.py": """\
        import torch
        def is_sm90_supported():
            return torch.cuda.get_device_capability()[0] == 9
        class PlatformContext:
            def __getattr__(self, name):
                return probe(name)()
        def get_platform():
            return PlatformContext()
        """,
    "sglang/runner.py": """\
        from sglang.state import set_symm, setup, ping, loop_a, hop1, odd, negated
        class ModelRunner:
            def init(self, unknown_thing):
                set_symm(self.server_args.enable_symm)
                setup(flag=self.server_args.enable_symm)
                unknown_thing.configure(self.server_args.enable_symm)
                loop_a(self.server_args.enable_symm)
                hop1(self.server_args.enable_symm)
                odd(self.server_args.enable_symm)
                if self.server_args.enable_direct:
                    return ping()
                unknown_thing.configure(self.server_args.enable_lost)
                negated(self.server_args.enable_symm)
        """,
    "sglang/state.py": """\
        from sglang.utils import is_sm90_supported, get_platform
        _ENABLE_SYMM = False
        class Coordinator:
            def __init__(self, ranks, use_symm: bool):
                from sglang.comm import SymmComm
                self.world_size = len(ranks)
                self.use_symm = use_symm
                self.comm = None
                if self.use_symm and self.world_size > 1:
                    self.comm = SymmComm(ranks)
        def init_group(ranks, use_symm=None):
            if use_symm is None:
                use_symm = _ENABLE_SYMM
            return Coordinator(ranks, use_symm=use_symm)
        def set_symm(enable: bool):
            global _ENABLE_SYMM
            _ENABLE_SYMM = enable
        def setup(flag):
            if flag and is_sm90_supported():
                return 1
            return 0
        def ping():
            return 0
        def loop_a(x):
            return loop_b(x)
        def loop_b(y):
            if y and is_sm90_supported():
                return loop_a(y)
            return 0
        def hop1(a):
            return hop2(a)
        def hop2(b):
            return hop3(b)
        def hop3(c):
            return c and is_sm90_supported()
        def odd(v):
            if v and get_platform().is_sm100:
                return 1
            return 0
        def negated(v):
            from sglang.comm import OtherComm
            if not v:
                return OtherComm()
            return None
        """,
    "sglang/comm.py": """\
        import torch
        class SymmComm:
            def __init__(self, ranks):
                self.disabled = True
                cap = torch.cuda.get_device_capability()[0]
                if cap < 9:
                    return
                self.disabled = False
        class OtherComm:
            def __init__(self):
                self.ready = True
        """,
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tree(tmp_path_factory.mktemp("flags"), TREE)


@pytest.fixture(scope="module")
def tree(root: Path) -> SourceTree:
    return SourceTree([root])


def _by_line(tree: SourceTree, **kwargs: Any) -> dict[tuple[str, int], Any]:
    return {(s.path, s.line): s for s in followed_sites(tree, ["sglang"], ["enable_symm"], **kwargs)}


def test_the_flag_is_followed_through_a_global_a_keyword_and_self(tree: SourceTree) -> None:
    """runner.py:4 passes the flag to set_symm(enable) (state.py:15), which stores it in the global
    _ENABLE_SYMM (:17); init_group reads that (:13) and passes it as `use_symm=` to Coordinator (:14), whose
    __init__ keeps it as self.use_symm (:7) and tests it at :9: a site, with both call sites recorded. The test
    `use_symm is None` (:12) reads the parameter before it carries the flag: no site."""
    sites = _by_line(tree)
    site = sites[("sglang/state.py", 9)]
    assert site.symbol == "Coordinator.__init__"
    assert site.text == "self.use_symm and self.world_size > 1"
    assert site.via[0].startswith(
        "sglang/runner.py:4 `set_symm(self.server_args.enable_symm)` passes enable_symm"
    )
    assert site.via[1].startswith("sglang/state.py:14 `Coordinator(ranks, use_symm=use_symm)`")
    assert "as `use_symm`" in site.via[1]
    assert site.carrier_attrs == ("use_symm",)
    assert ("sglang/state.py", 12) not in sites
    # not decided by the GPU (world_size is a run-time input)
    assert judge_site(tree, site, SM120, "12.8", assume={"enable_symm": True}) == (None, "")


def test_a_parameter_tested_against_a_probe_is_a_site_decided_by_the_gpu(tree: SourceTree) -> None:
    """runner.py:5 `setup(flag=...)` (a keyword): state.py:19 `if flag and is_sm90_supported()` is true on sm_90
    and false elsewhere with the flag set; with the flag unset it is false everywhere."""
    site = _by_line(tree)[("sglang/state.py", 19)]
    assert site.carriers == ("flag",)
    assert "sglang/runner.py:5" in site.via[0]
    on = {a: judge_site(tree, site, a, "12.8", assume={"enable_symm": True})[0] for a in (SM80, SM90, SM120)}
    assert on == {SM80: False, SM90: True, SM120: False}
    assert judge_site(tree, site, SM90, "12.8", assume={"enable_symm": False})[0] is False


def test_unresolved_callees_loops_and_the_depth_bound(tree: SourceTree) -> None:
    """`unknown_thing.configure(...)` (runner.py:6) cannot be resolved: not followed, nothing concluded. The
    loop loop_a -> loop_b -> loop_a ends (loop_b's test, state.py:27, is found once). hop1 -> hop2 -> hop3: the
    test in hop3 (:35) is three calls deep, beyond MAX_HOPS = 2, so it is found only with max_hops=3."""
    assert MAX_HOPS == 2
    sites = _by_line(tree)
    assert ("sglang/state.py", 27) in sites
    assert ("sglang/state.py", 35) not in sites
    assert ("sglang/state.py", 35) in _by_line(tree, max_hops=3)
    assert all("configure" not in via for s in sites.values() for via in s.via)
    # the direct reads are capgates.flag_sites', not repeated here
    direct = {(s.path, s.line) for s in flag_sites(tree, ["sglang"], ["enable_symm", "enable_direct"])}
    assert direct == {("sglang/runner.py", 10)}
    assert not set(_by_line(tree)) & direct


def test_the_class_constructed_under_the_followed_test_is_a_gate(tree: SourceTree) -> None:
    """state.py:10 constructs SymmComm (imported inside __init__, :5) where :9's test holds: its __init__ is the
    feature's gate, found with the way there. OtherComm, constructed under `if not v:` (state.py:42), is not."""
    gates = {g.gate: g for g in follow_flags(tree, ["sglang"], ["enable_symm"]).gates}
    assert set(gates) == {"sglang.comm:SymmComm.__init__"}
    via = gates["sglang.comm:SymmComm.__init__"].via
    assert via[-2].startswith("sglang/state.py:9 `self.use_symm and self.world_size > 1`")
    assert via[-1] == "sglang/state.py:10 constructs it"
    assert follow_flags(tree, ["sglang"], []).gates == ()


def test_findings_without_a_configured_gate(root: Path) -> None:
    """With flags only, the suite judges the gate the flag leads to (SymmComm.__init__: off on sm_80 by comm.py:6
    `if cap < 9: return`) and the followed sites decided by the GPU (state.py:19), each naming the call site;
    the undecidable followed test (state.py:37, `get_platform().is_sm100` through __getattr__) is a skip."""
    found = analyse(root, {"symm": {"flags": ["enable_symm"]}}, ("sm_80", "sm_90", "sm_120"))
    gate = {f.arch: f for f in found if f.kind == "gate"}
    assert {a: (f.outcome, f.verdict) for a, f in gate.items()} == {
        "sm_80": ("fail", "gated-off"),
        "sm_90": ("pass", "ok"),
        "sm_120": ("pass", "ok"),
    }
    assert "found by following enable_symm: sglang/runner.py:4" in gate["sm_90"].message
    flag = {(f.arch, f.line): f for f in found if f.kind == "flag"}
    assert (flag[("sm_120", 19)].outcome, flag[("sm_120", 19)].verdict) == ("fail", "gated-off")
    assert "sglang/runner.py:5 `setup(flag=self.server_args.enable_symm)`" in flag[("sm_120", 19)].message
    assert "at sglang/state.py:19 (reads flag, which carries enable_symm" in flag[("sm_120", 19)].message
    odd = [f for f in found if f.kind == "flag" and f.line == 37]
    assert odd
    assert {(f.outcome, f.verdict) for f in odd} == {("skip", "unknown")}
    assert all("could not be resolved" in f.message for f in odd)


def test_a_flag_the_release_never_reads_is_said(root: Path) -> None:
    """A feature with flags and no gate whose flags nothing reads: one failure saying nothing decides it."""
    found = analyse(root, {"gone": {"flags": ["enable_gone"]}}, ("sm_90",))
    assert [(f.kind, f.symbol, f.outcome, f.verdict) for f in found if f.feature == "gone"] == [
        ("gate", "gone", "fail", "absent")
    ]


def test_a_flag_passed_only_where_it_cannot_be_followed_is_undecidable(root: Path) -> None:
    """enable_lost is only passed to `unknown_thing.configure(...)` (runner.py:12), which cannot be resolved:
    not "nothing decides it" (it may be decided there) and never ok: one undecidable skip naming the call."""
    found = [
        f for f in analyse(root, {"lost": {"flags": ["enable_lost"]}}, ("sm_90",)) if f.feature == "lost"
    ]
    assert [(f.kind, f.symbol, f.outcome, f.verdict) for f in found] == [("gate", "lost", "skip", "unknown")]
    assert found[0].message.startswith("undecidable: feature lost: no condition in sglang 0 reads its flags")
    assert "passed to calls that could not be resolved: sglang/runner.py:12 `unknown_thing.configure(" in (
        found[0].message
    )
    follow = follow_flags(SourceTree([root]), ["sglang"], ["enable_symm"])
    assert "sglang/runner.py:6 `unknown_thing.configure(self.server_args.enable_symm)`" in follow.unresolved


def test_a_missing_gate_is_undecidable_where_its_flag_goes_unfollowed(tmp_path: Path) -> None:
    """The configured gate is not in the release; a condition reads enable_x (runner.py:4), but the flag is
    also passed to `unknown.configure(...)` (runner.py:6), which cannot be resolved and may hold the moved gate:
    the missing gate is an undecidable skip, not "decided by the conditions that read its flags" (n/a)."""
    moved = write_tree(
        tmp_path,
        {
            "sglang/__init__.py": "",
            "sglang/runner.py": """\
                class ModelRunner:
                    def init(self, unknown):
                        if self.server_args.enable_x:
                            pass
                        unknown.configure(self.server_args.enable_x)
                """,
        },
    )
    features = {"x": {"gate": "sglang.nowhere:Gone.__init__", "flags": ["enable_x"]}}
    missing = [f for f in analyse(moved, features, ("sm_90",)) if f.symbol == "Gone.__init__"]
    assert [(f.outcome, f.verdict) for f in missing] == [("skip", "unknown")]
    assert "may not be all that decide it" in missing[0].message
    assert "unknown.configure(" in missing[0].message


def test_a_site_off_on_the_reference_and_undecidable_elsewhere_is_a_skip(tmp_path: Path) -> None:
    """`enable_y and major >= 10 and get_platform().is_fast`: false on the sm_90 reference, unresolved on sm_100
    (the platform object answers through a __getattr__ probe the evaluator cannot follow). Not "off
    everywhere, no question": an undecidable skip on sm_100."""
    tree = write_tree(
        tmp_path,
        {
            "sglang/__init__.py": "",
            "sglang/utils.py": TREE["sglang/utils.py"],
            "sglang/runner.py": """\
                import torch
                from sglang.utils import get_platform
                class ModelRunner:
                    def init(self):
                        major = torch.cuda.get_device_capability()[0]
                        if self.server_args.enable_y and major >= 10 and get_platform().is_fast:
                            return 1
                        return 0
                """,
        },
    )
    found = [f for f in analyse(tree, {"y": {"flags": ["enable_y"]}}, ("sm_100",)) if f.kind == "flag"]
    assert [(f.arch, f.outcome) for f in found] == [("sm_100", "skip")]


def test_a_module_naming_the_flag_that_does_not_parse_is_undecidable(tmp_path: Path) -> None:
    """A module that reads the flag but does not parse on this Python is not skipped over: what it decides is
    unknown, an undecidable skip naming it. (None of the 43 cached releases has one on Python 3.11.)"""
    tree = write_tree(
        tmp_path,
        {
            "sglang/__init__.py": "",
            "sglang/new.py": "def f(args):\n    if args.enable_z:\n        return (\n",
        },
    )
    found = [
        f for f in analyse(tree, {"z": {"flags": ["enable_z"]}}, ("sm_90",)) if f.file == "sglang/new.py"
    ]
    assert [(f.outcome, f.verdict) for f in found] == [("skip", "unknown")]
    assert "does not parse here" in found[0].message
