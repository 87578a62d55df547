"""stackfarm.analysis.capauto (auto-enable code) and the flag reads capgates follows, on small trees written here.

The tree models the three ways SGLang's server arguments switch a flag on (an attribute set in a
``ServerArgs`` method, 0.5.1-0.5.18; a post-process returning a dict, 0.5.19+; ``declare_resolution(...,
flag=...)``) and the use-gates they are compared with: a module-level capability probe, a
``global_server_args_dict["flag"]`` read (<= 0.4.x) and an unresolvable platform object. The verdicts of
10-capability's ``auto`` findings are pinned on a synthetic cell; the real releases are in
test_capability_releases.py.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from stackfarm.analysis.arch import Arch
from stackfarm.analysis.capauto import auto_sites, decided_by_gpu, evaluate_auto
from stackfarm.analysis.capgates import flag_sites, judge_site, reads_flag
from stackfarm.analysis.pysource import SourceTree
from stackfarm.cellspec import CellSpec, InstalledComponent
from test_captables import write_tree

SM80, SM90, SM100, SM120 = Arch(8, 0), Arch(9, 0), Arch(10, 0), Arch(12, 0)
REPO = Path(__file__).resolve().parent.parent

TREE = {
    "sglang/__init__.py": "",
    "sglang/utils.py": """\
        import torch
        def is_sm90_supported():
            return torch.cuda.get_device_capability()[0] == 9
        def is_sm100_supported():
            return torch.cuda.get_device_capability()[0] == 10
        class PlatformContext:
            def __getattr__(self, name):
                return probe(name)()
        def get_platform():
            return PlatformContext()
        """,
    "sglang/server_args.py": """\
        from sglang.utils import is_sm90_supported, is_sm100_supported, get_platform
        class ServerArgs:
            def _handle(self, model_arch):
                if self.nnodes > 1:
                    return
                if not self.enable_fusion and model_arch in ["A", "B"] and (is_sm90_supported() or is_sm100_supported()):
                    self.enable_fusion = True
                if is_sm100_supported():
                    self.enable_wide = True
                else:
                    self.enable_wide = False
                if get_platform().is_sm100:
                    self.enable_odd = True
                self.enable_user = self.enable_user or model_arch == "A"
        def post_process(view):
            if not is_sm100_supported():
                return {}
            return {"fusion_backend": "auto"}
        def deprecated(args, declare):
            if args.enable_fusion:
                declare(args, "deprecated", fusion_backend="auto")
            setattr(args, "enable_odd", is_sm90_supported())
        """,
    "sglang/layers.py": """\
        from sglang.utils import is_sm90_supported
        from sglang.schedule import global_server_args_dict, get_args
        _is_sm90 = is_sm90_supported()
        def use_fusion(batch):
            return _is_sm90 and get_args().enable_fusion and batch > 0
        def use_wide(x):
            if global_server_args_dict["enable_wide"] and _is_sm90:
                return x
            return None
        def use_wide_get():
            return global_server_args_dict.get("enable_wide", False) and _is_sm90
        def use_wide_assigned(x):
            ok = global_server_args_dict["enable_wide"] and _is_sm90
            return x if ok else None
        """,
    "sglang/schedule.py": """\
        global_server_args_dict = {"enable_wide": False}
        def get_args():
            return None
        """,
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tree(tmp_path_factory.mktemp("auto"), TREE)


@pytest.fixture(scope="module")
def tree(root: Path) -> SourceTree:
    return SourceTree([root])


def test_auto_sites_in_every_form(tree: SourceTree) -> None:
    flags = ["enable_fusion", "enable_wide", "enable_odd", "enable_user", "fusion_backend"]
    sites = {(s.line, s.flag): s for s in auto_sites(tree, ["sglang"], flags)}
    # an attribute set to True (:7), a returned dict (:18), a keyword (:21), setattr with a non-constant (:22),
    # a value that is not a false constant (:14); `self.enable_wide = False` (:11) switches nothing on
    assert set(sites) == {
        (7, "enable_fusion"),
        (9, "enable_wide"),
        (13, "enable_odd"),
        (14, "enable_user"),
        (18, "fusion_backend"),
        (21, "fusion_backend"),
        (22, "enable_odd"),
    }
    fusion = sites[(7, "enable_fusion")]
    assert fusion.symbol == "ServerArgs._handle"
    assert fusion.path == "sglang/server_args.py"
    # the early exit at :4 (`if self.nnodes > 1: return`) must be false, the `if` at :6 true
    assert [(c.line, c.want) for c in fusion.conditions] == [(4, False), (6, True)]
    # past `if not is_sm100_supported(): return {}` (:16)
    assert [(c.line, c.want) for c in sites[(18, "fusion_backend")].conditions] == [(16, False)]
    assert auto_sites(tree, ["sglang"], []) == ()


def test_evaluate_auto_per_arch(tree: SourceTree) -> None:
    sites = {(s.line, s.flag): s for s in auto_sites(tree, ["sglang"], ["enable_fusion", "enable_odd"])}
    fusion = sites[(7, "enable_fusion")]
    states = {a: evaluate_auto(tree, fusion, a, "12.8").state for a in (SM80, SM90, SM100, SM120)}
    # model_arch and nnodes are run-time inputs: "on" (some deployment); the capability check is off on sm_80/120
    assert states == {SM80: "off", SM90: "on", SM100: "on", SM120: "off"}
    off = evaluate_auto(tree, fusion, SM120, "12.8")
    assert off.line == 6
    assert off.reason.startswith("`not self.enable_fusion and model_arch in ['A', 'B']")
    assert "is false at sglang/server_args.py:6" in off.reason
    # PlatformContext.__getattr__ answers is_sm100 at run time: unknown, never "on"
    odd = evaluate_auto(tree, sites[(13, "enable_odd")], SM100, "12.8")
    assert odd.state == "unknown"
    assert odd.reason.startswith("unknown: `get_platform().is_sm100` at sglang/server_args.py:12 could not")
    assert decided_by_gpu([odd])
    results = [evaluate_auto(tree, fusion, a, "12.8") for a in (SM90, SM120)]
    assert decided_by_gpu(results)
    assert not decided_by_gpu([evaluate_auto(tree, fusion, a, "12.8") for a in (SM90, SM100)])


def test_flag_reads_through_dict_subscripts_and_get(tree: SourceTree) -> None:
    sites = {s.line: s for s in flag_sites(tree, ["sglang"], ["enable_wide"])}
    # layers.py:7 `global_server_args_dict["enable_wide"]`, :11 `.get("enable_wide", False)` and :13 (a condition
    # assigned to a name) are reads; server_args.py:8 tests no flag of this feature
    assert {(s.path, line) for line, s in sites.items() if s.path == "sglang/layers.py"} == {
        ("sglang/layers.py", 7),
        ("sglang/layers.py", 11),
        ("sglang/layers.py", 13),
    }
    assert judge_site(tree, sites[13], SM120, "12.8", assume={"enable_wide": True}) == (False, "")
    assume = {"enable_wide": True}
    # the dict's import-time value is the default (False); the deployment's flag is what `assume` says
    assert judge_site(tree, sites[7], SM90, "12.8", assume=assume) == (True, "")
    assert judge_site(tree, sites[7], SM120, "12.8", assume=assume) == (False, "")
    assert judge_site(tree, sites[11], SM90, "12.8", assume=assume) == (True, "")
    import ast

    assert reads_flag(ast.parse('d["enable_wide"]'), {"enable_wide"})
    assert reads_flag(ast.parse('d.get("enable_wide")'), {"enable_wide"})
    assert not reads_flag(ast.parse('os.environ.get("ENABLE_WIDE")'), {"enable_wide"})


def _findings() -> ModuleType:
    sys.path.insert(0, str(REPO / "suites" / "10-capability"))
    return importlib.import_module("capability_findings")


def analyse(root: Path, features: Mapping[str, object], archs: tuple[str, ...]) -> list[Any]:
    comp = InstalledComponent(axis="sglang", distribution="sglang", version="0", filename="x.whl",
                              sha256="0" * 64, source="test", root=str(root))  # fmt: skip
    cell = CellSpec(id="x", values={"cuda": "12.8"}, backend="local", components=(comp,), archs=archs,
                    reference_arch="sm_90", features=dict(features), settings={"10-capability": {}})  # fmt: skip
    return list(_findings().analyse(cell).findings)


def test_auto_findings_against_the_use_gate(root: Path) -> None:
    """enable_wide is switched on on sm_100 only (server_args.py:9) while its use-gates (layers.py:7, :11) read
    the sm_90 probe: switched on where the use-gate keeps it off on sm_100 (a failure naming both sites), and
    on sm_90 the reverse (not switched on although the gate lets it on), a default noted as such."""
    features = {"wide": {"flags": ["enable_wide"]}}
    found = analyse(root, features, ("sm_90", "sm_100", "sm_120"))
    auto = {(f.arch, f.line): f for f in found if f.kind == "auto"}
    on_100 = auto[("sm_100", 9)]
    assert (on_100.outcome, on_100.verdict) == ("fail", "auto-on-gated-off")
    assert "sglang/server_args.py:9" in on_100.message
    assert "sglang/layers.py:7 gated-off" in on_100.message
    assert (auto[("sm_120", 9)].outcome, auto[("sm_120", 9)].verdict) == ("pass", "ok")
    # sm_90 is the reference here: "the reverse" needs a reference that switches it on, so it is consistent
    assert auto[("sm_90", 9)].verdict == "ok"


def test_auto_off_where_the_reference_switches_it_on(root: Path) -> None:
    """enable_fusion: switched on on sm_90 / sm_100 (server_args.py:7), used under the sm_90 probe
    (layers.py:5): on sm_100 switched on where the use-gate is off; on sm_120 neither."""
    features = {"fusion": {"flags": ["enable_fusion"]}}
    found = analyse(root, features, ("sm_100", "sm_120"))
    auto = {f.arch: f for f in found if f.kind == "auto" and f.line == 7}
    assert auto["sm_100"].verdict == "auto-on-gated-off"
    assert auto["sm_120"].outcome == "pass"
    assert "its use-gate is off there too" in auto["sm_120"].message
    # the use-gate without the sm_90 probe: sm_120 is now a default the release does not take
    patched = dict(TREE)
    patched["sglang/layers.py"] = TREE["sglang/layers.py"].replace(
        "return _is_sm90 and get_args()", "return get_args()"
    )
    other = write_tree(root.parent / "auto-patched", patched)
    found = analyse(other, features, ("sm_100", "sm_120"))
    auto = {f.arch: f for f in found if f.kind == "auto" and f.line == 7}
    assert (auto["sm_120"].outcome, auto["sm_120"].verdict) == ("pass", "auto-off-gate-on")
    assert auto["sm_100"].verdict == "ok"


def test_unresolved_auto_enable_is_undecidable_never_ok(root: Path) -> None:
    """server_args.py:12 `if get_platform().is_sm100:` cannot be resolved: every arch is a skip, not a pass."""
    found = analyse(root, {"odd": {"flags": ["enable_odd"]}}, ("sm_90", "sm_120"))
    auto = [f for f in found if f.kind == "auto" and f.line == 13]
    assert {(f.arch, f.outcome, f.verdict) for f in auto} == {
        ("sm_90", "skip", "unknown"),
        ("sm_120", "skip", "unknown"),
    }
    assert all(f.message.startswith("undecidable: ") for f in auto)
    assert all("could not be resolved" in f.message for f in auto)


def test_a_moved_gate_is_found_through_its_flag(root: Path) -> None:
    """The configured gate is not in the release, but layers.py reads the flag: n/a (decided there), and the
    flag site's verdicts are reported; with no gate and no read at all it is a failure."""
    features = {"wide": {"gate": "sglang.gone:use_wide", "flags": ["enable_wide"]}}
    found = analyse(root, features, ("sm_90", "sm_120"))
    absent = [f for f in found if f.kind == "gate" and f.arch == "all"]
    assert [f.outcome for f in absent] == ["n/a"]
    assert "decided here by the conditions that read its flags: sglang/layers.py:7" in absent[0].message
    flags = {(f.arch, f.line): f.verdict for f in found if f.kind == "flag"}
    assert flags[("sm_120", 7)] == "gated-off"
    assert flags[("sm_90", 7)] == "ok"
    nothing = analyse(root, {"x": {"gate": "sglang.gone:f", "flags": ["enable_nothing"]}}, ("sm_90",))
    assert [f.outcome for f in nothing if f.kind == "gate"] == ["fail"]


# --------------------------------------------------------------------------------------------- the evaluator

PLATFORM = {
    "plat/__init__.py": "",
    "plat/common.py": """\
        import torch
        from functools import lru_cache, partial
        def _check(majors):
            if not torch.cuda.is_initialized():
                return None
            return torch.cuda.get_device_capability()[0] in majors
        is_sm90_supported = lru_cache(maxsize=1)(partial(_check, majors=[9]))
        """,
    "plat/context.py": """\
        _PROBES = {"is_sm90": "is_sm90_supported"}
        class PlatformContext:
            __slots__ = ("_overrides",)
            def __init__(self):
                object.__setattr__(self, "_overrides", {})
            def __getattr__(self, name):
                probe = _PROBES.get(name)
                if probe is None:
                    raise AttributeError(name)
                overrides = object.__getattribute__(self, "_overrides")
                if name in overrides:
                    return overrides[name]
                from plat import common as _common
                return getattr(_common, probe)()
        _PLATFORM = PlatformContext()
        def get_platform():
            return _PLATFORM
        def fresh():
            return PlatformContext().is_sm90
        """,
}


def test_a_platform_object_answering_through_getattr_is_followed(tmp_path: Path) -> None:
    """SGLang 0.5.19+'s PlatformContext: `__getattr__` maps a fact to a probe and calls it; `object.__setattr__`
    in `__init__` sets the (empty) overrides; `getattr(module, name)` finds the probe; `torch.cuda.is_initialized()`
    only picks how the capability is read. A second instance gets its own `__init__` run (the memo is per object);
    a fact the hook does not know raises there: unknown, recorded as unresolved."""
    import ast

    from stackfarm.analysis.pysource import UNKNOWN, Evaluator

    plat = SourceTree([write_tree(tmp_path / "plat", PLATFORM)])
    for gpu, want in ((SM90, True), (SM120, False)):
        ev = Evaluator(plat, gpu, "12.8")
        assert ev.expression("plat.context", ast.parse("get_platform().is_sm90", mode="eval").body) is want
        assert ev.expression("plat.context", ast.parse("fresh()", mode="eval").body) is want
        assert not ev.unresolved
        assert (
            ev.expression("plat.context", ast.parse("get_platform().is_sm100", mode="eval").body) is UNKNOWN
        )
        assert "PlatformContext.__getattr__ answers 'is_sm100' at run time" in ev.unresolved[-1].why
