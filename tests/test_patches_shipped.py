"""stackfarm.patches on the repository's own patch sets: matrix.toml's sets, and the real sglang wheels.

The integration tests take the real sglang wheels from PyPI through the artifact cache, apply every shipped
patch, evaluate the patched code where it matters (capability tables, fusion gates, EAGLE-3 hooks), port
sets across real releases, and run ``stackfarm patches check`` on them.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from stackfarm import matrix as matrix_mod
from stackfarm import patches as P
from stackfarm.artifacts import Cache, Source, Target, find_artifact
from stackfarm.cli import patches as patches_cli
from stackfarm.patches.model import REQUIRED_HEADERS, PatchResult, read_series, validate_sets
from stackfarm.patches.status import apply_sets
from stackfarm.patchset import PatchSet, sets_for

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------------------
# The repository's own sets and matrix.toml (no network).


def test_the_shipped_sets_are_valid_and_land_on_the_right_cells() -> None:
    matrix = matrix_mod.load(REPO / "matrix.toml")
    loaded = validate_sets(matrix.patch_sets)
    for name, patches in loaded.items():
        for patch in patches:
            assert set(REQUIRED_HEADERS) <= set(patch.headers), (name, patch.name)
            assert all(fp.path.startswith("sglang/srt/") for fp in patch.files)
    assert [s.name for s in sets_for(matrix.patch_sets, "0.5.9")] == [
        "sm120-capability",
        "sm120-fusion-gates",
        "kimi-k25-eagle3",
    ]
    assert [s.name for s in sets_for(matrix.patch_sets, "0.5.10")] == [
        "sm120-capability",
        "sm120-fusion-gates-0.5.10",
    ]
    kimi = loaded["kimi-k25-eagle3"][0]
    assert str(kimi.upstream_version) == "0.5.10"


# ----------------------------------------------------------------------------------------------------------
# The real patches against the real wheels.


@pytest.fixture(scope="module")
def wheel() -> Callable[[str], Path]:
    source = Source(name="pypi", url="https://pypi.org/simple")
    target = Target(python="3.11", platform="manylinux_2_39_x86_64")
    cache = Cache()

    def get(version: str) -> Path:
        return cache.unpack(find_artifact(source, "sglang", version, target))

    return get


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PatchSet]:
    """Every shipped set with its opt-in patches too (series lines commented out by default, e.g. the
    fusion auto-enable), so that each shipped patch file is tested, not only the default series."""
    sets = {}
    for ps in matrix_mod.load(REPO / "matrix.toml").patch_sets:
        lines = (ps.path / "series").read_text(encoding="utf-8").splitlines()
        opt_in = [
            ln[1:].strip() for ln in lines if ln.startswith("#") and (ps.path / ln[1:].strip()).is_file()
        ]
        if opt_in:
            copy = tmp_path_factory.mktemp("sets") / ps.name
            shutil.copytree(ps.path, copy)
            names = [ln[1:].strip() if ln[1:].strip() in opt_in else ln for ln in lines]
            (copy / "series").write_text("\n".join(names) + "\n", encoding="utf-8")
            sets[ps.name] = dataclasses.replace(ps, path=copy)
        else:
            sets[ps.name] = ps
    return sets


def test_fusion_autoenable_is_opt_in_by_default() -> None:
    """stock flashinfer builds the fused allreduce for sm_90/sm_100 only: auto-enabling it on sm_120 crashes."""
    for name in ("sm120-fusion-gates", "sm120-fusion-gates-0.5.10"):
        series = read_series(_set_named(name))
        assert [p.name for p in series] == ["0001-communicator-fusion-gate-sm120.patch"]


@pytest.fixture(scope="module")
def patched_059(
    wheel: Callable[[str], Path], shipped: dict[str, PatchSet], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, list[PatchResult]]:
    """The real 0.5.9 tree (in the cache), and a hard-linked copy with every set for 0.5.9 applied."""
    pristine = wheel("0.5.9")
    tree = tmp_path_factory.mktemp("sgl") / "tree"
    results = P.patched_copy(sets_for(list(shipped.values()), "0.5.9"), pristine, tree)
    return pristine, tree, results


def _module(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _find_def(module: ast.Module, *names: str) -> ast.AST:
    node: ast.AST = module
    for name in names:
        node = next(
            child
            for child in ast.iter_child_nodes(node)
            if isinstance(child, ast.ClassDef | ast.FunctionDef) and child.name == name
        )
    return node


@pytest.mark.integration
def test_every_059_patch_applies_and_every_patched_file_compiles(
    patched_059: tuple[Path, Path, list[PatchResult]], shipped: dict[str, PatchSet]
) -> None:
    pristine, tree, results = patched_059
    assert [(r.set, r.status) for r in results] == [
        ("sm120-capability", "applied"),
        ("sm120-capability", "applied"),
        ("sm120-fusion-gates", "applied"),
        ("sm120-fusion-gates", "applied"),
        ("kimi-k25-eagle3", "applied"),
    ]
    touched = {fp.path for r in results for p in P.load_series(shipped[r.set]) for fp in p.files}
    assert len(touched) == 5
    for rel in touched:
        compile((tree / rel).read_text(encoding="utf-8"), rel, "exec", dont_inherit=True)
        assert (tree / rel).read_bytes() != (pristine / rel).read_bytes()  # and the cache's copy is untouched
    # Applying again is recognised, not repeated.
    again = apply_sets(sets_for(matrix_mod.load(REPO / "matrix.toml").patch_sets, "0.5.9"), tree)
    assert {r.status for r in again} == {"already-applied"}


def _set_named(name: str) -> PatchSet:
    return next(ps for ps in matrix_mod.load(REPO / "matrix.toml").patch_sets if ps.name == name)


ARU = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
TSM = "sglang/srt/distributed/device_communicators/torch_symm_mem.py"


def _capability_lookups(tree: Path, capability: int, world_size: int) -> list[Any]:
    """Evaluate, on the real code, TorchSymmMemCommunicator's lookups keyed by the capability major."""
    table: dict[str, Any] = {}
    exec(compile((tree / ARU).read_text(), ARU, "exec"), table)  # the module is plain data: no imports
    cls = _find_def(_module(tree / TSM), "TorchSymmMemCommunicator")
    assert isinstance(cls, ast.ClassDef)
    multimem = next(
        ast.literal_eval(stmt.value)
        for stmt in cls.body
        if isinstance(stmt, ast.Assign)
        and any(getattr(t, "id", "") == "_WORLD_SIZES_MULTIMEM" for t in stmt.targets)
    )
    me = SimpleNamespace(device_capability=capability, world_size=world_size, _WORLD_SIZES_MULTIMEM=multimem)
    scope = {"TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES": table["TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"], "self": me}
    lookups = [
        node
        for node in ast.walk(cls)
        if isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Attribute)
        and node.slice.attr == "device_capability"
    ]
    assert len(lookups) >= 2  # __init__'s table lookups and all_reduce's multimem lookup
    return [eval(compile(ast.Expression(node), TSM, "eval"), scope) for node in lookups]


@pytest.mark.integration
def test_sm120_capability_tables_have_key_12(patched_059: tuple[Path, Path, list[PatchResult]]) -> None:
    pristine, tree, _ = patched_059
    with pytest.raises(KeyError) as info:
        _capability_lookups(pristine, 12, 8)
    assert info.value.args == (12,)  # the seeds' crash, reproduced on the real 0.5.9 code
    values = _capability_lookups(tree, 12, 8)
    assert values == _capability_lookups(tree, 10, 8)  # SM120 mirrors SM100
    table: dict[str, Any] = {}
    exec(compile((tree / ARU).read_text(), ARU, "exec"), table)
    sizes = table["TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"]
    assert sizes[12] == sizes[10]
    assert sizes[12][8] == 128 * 1024 * 1024


def _gate(tree: Path, sm: int) -> bool:
    """apply_flashinfer_allreduce_fusion() of the real communicator.py on a device of major ``sm``."""
    fn = _find_def(_module(tree / "sglang/srt/layers/communicator.py"), "apply_flashinfer_allreduce_fusion")
    assert isinstance(fn, ast.FunctionDef)
    scope: dict[str, Any] = {
        "_is_sm90_supported": sm == 9,
        "_is_sm100_supported": sm == 10,
        "_is_sm120_supported": sm == 12,
        "_is_flashinfer_available": True,
        "FUSE_ALLREDUCE_MAX_BATCH_SIZE": 2048,
        "is_dp_attention_enabled": lambda: False,
        "get_global_server_args": lambda: SimpleNamespace(enable_flashinfer_allreduce_fusion=True),
    }
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "communicator.py", "exec"), scope)
    return bool(scope["apply_flashinfer_allreduce_fusion"](16))


def _auto_enable(tree: Path, sm: int) -> bool:
    """The condition under which the real ServerArgs turns allreduce fusion on, for Kimi K2.5 on ``sm``."""
    method = _find_def(_module(tree / "sglang/srt/server_args.py"), "ServerArgs")
    test = next(
        node.test
        for node in ast.walk(method)
        if isinstance(node, ast.If)
        and any(
            isinstance(s, ast.Assign)
            and any(getattr(t, "attr", "") == "enable_flashinfer_allreduce_fusion" for t in s.targets)
            and isinstance(s.value, ast.Constant)
            and s.value.value is True
            for s in node.body
        )
    )
    me = SimpleNamespace(
        enable_flashinfer_allreduce_fusion=False, enable_dp_attention=False, nnodes=1, moe_a2a_backend="none"
    )
    scope = {
        "self": me,
        "model_arch": "KimiK25ForConditionalGeneration",
        "is_h20_device": False,
        "is_sm90_supported": lambda: sm == 9,
        "is_sm100_supported": lambda: sm == 10,
        "is_sm120_supported": lambda: sm == 12,
    }
    return bool(eval(compile(ast.Expression(test), "server_args.py", "eval"), scope))


@pytest.mark.integration
def test_sm120_fusion_gates_admit_sm120(patched_059: tuple[Path, Path, list[PatchResult]]) -> None:
    pristine, tree, _ = patched_059
    assert (_gate(pristine, 12), _gate(tree, 12)) == (False, True)
    assert _gate(pristine, 9)
    assert _gate(tree, 9)
    assert _gate(tree, 10)
    assert not _gate(tree, 8)
    assert (_auto_enable(pristine, 12), _auto_enable(tree, 12)) == (False, True)
    assert _auto_enable(tree, 9)
    assert not _auto_enable(tree, 8)
    comm = _module(tree / "sglang/srt/layers/communicator.py")
    imported = {
        a.name
        for n in ast.walk(comm)
        if isinstance(n, ast.ImportFrom) and n.module == "sglang.srt.utils"
        for a in n.names
    }
    assert "is_sm120_supported" in imported


def _target_hooks(tree: Path) -> set[str]:
    """The methods 0.5.9's EAGLE-3 code calls on the target model (from speculative/, model_executor/)."""
    names: set[str] = set()
    for path in [
        *(tree / "sglang/srt/speculative").glob("*.py"),
        *(tree / "sglang/srt/model_executor").glob("*.py"),
    ]:
        for node in ast.walk(_module(path)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = ast.unparse(node.func.value)
            on_target = owner == "self.target_worker.model_runner.model"
            on_own_model = path.name in ("model_runner.py", "cuda_graph_runner.py") and owner in (
                "self.model",
                "self.model_runner.model",
            )
            if on_target or (on_own_model and "eagle" in node.func.attr):
                names.add(node.func.attr)
    return names


@pytest.mark.integration
def test_kimi_k25_gets_the_eagle3_target_hooks(patched_059: tuple[Path, Path, list[PatchResult]]) -> None:
    pristine, tree, _ = patched_059
    wanted = _target_hooks(pristine)
    assert {"get_embed_and_head", "set_eagle3_layers_to_capture"} <= wanted
    kimi = "sglang/srt/models/kimi_k25.py"

    def methods(root: Path) -> dict[str, ast.FunctionDef]:
        cls = _find_def(_module(root / kimi), "KimiK25ForConditionalGeneration")
        assert isinstance(cls, ast.ClassDef)
        return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}

    assert not wanted <= set(methods(pristine))  # the seeds' AttributeError
    patched = methods(tree)
    assert wanted | {"set_embed_and_head"} <= set(patched)
    # Behaviour: the real method bodies, in a stand-in class, delegate to the language model.
    calls: list[tuple[str, tuple[Any, ...]]] = []

    class LanguageModel:
        """Records every call; answers get_embed_and_head with a recognisable pair."""

        def __getattr__(self, name: str) -> Callable[..., Any]:
            def record(*args: Any) -> Any:
                calls.append((name, args))
                return ("embed", "head")

            return record

    stub = ast.ClassDef(
        name="Stub",
        bases=[],
        keywords=[],
        body=[
            patched[n] for n in ("get_embed_and_head", "set_embed_and_head", "set_eagle3_layers_to_capture")
        ],
        decorator_list=[],
    )
    scope: dict[str, Any] = {
        "Tuple": tuple,
        "Optional": Any,
        "List": list,
        "torch": SimpleNamespace(Tensor=object),
    }
    exec(compile(ast.fix_missing_locations(ast.Module(body=[stub], type_ignores=[])), kimi, "exec"), scope)
    obj = scope["Stub"]()
    obj.language_model = LanguageModel()
    assert obj.get_embed_and_head() == ("embed", "head")
    obj.set_embed_and_head("E", "H")
    obj.set_eagle3_layers_to_capture()  # cuda_graph_runner's call
    obj.set_eagle3_layers_to_capture([1, 29, 57])  # model_runner's call with the draft's layer ids
    assert calls == [
        ("get_embed_and_head", ()),
        ("set_embed_and_head", ("E", "H")),
        ("set_eagle3_layers_to_capture", (None,)),
        ("set_eagle3_layers_to_capture", ([1, 29, 57],)),
    ]


@pytest.mark.integration
def test_on_0510_kimi_is_upstreamed_and_sm120_still_applies(
    wheel: Callable[[str], Path], shipped: dict[str, PatchSet]
) -> None:
    tree = wheel("0.5.10")
    by_set = {}
    for name in ("sm120-capability", "sm120-fusion-gates", "sm120-fusion-gates-0.5.10", "kimi-k25-eagle3"):
        by_set[name] = [(r.patch, r.status, r.detail) for r in P.check_sets([shipped[name]], tree)]
    assert [s for _, s, _ in by_set["sm120-capability"]] == ["applied", "applied"]
    [(_, status, detail)] = by_set["kimi-k25-eagle3"]
    assert status == "upstreamed"
    assert "KimiK25ForConditionalGeneration.get_embed_and_head" in detail
    assert "KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture" in detail
    assert [s for _, s, _ in by_set["sm120-fusion-gates"]] == ["applied", "drift"]
    drift = by_set["sm120-fusion-gates"][1][2]
    assert "sglang/srt/server_args.py: hunk `@@ -1688,7 +1688,7 @@" in drift
    assert '"Qwen3_5MoeForConditionalGeneration",' in drift  # the line upstream inserted
    assert [s for _, s, _ in by_set["sm120-fusion-gates-0.5.10"]] == ["applied", "applied"]


@pytest.mark.integration
def test_port_on_real_releases(
    wheel: Callable[[str], Path], shipped: dict[str, PatchSet], tmp_path: Path
) -> None:
    old, v10, v15 = wheel("0.5.9"), wheel("0.5.10"), wheel("0.5.15")
    clean = P.port_set(
        shipped["sm120-capability"],
        old_tree=old,
        new_tree=v15,
        from_version="0.5.9",
        to_version="0.5.15",
        out=tmp_path / "a",
    )
    assert [p.status for p in clean.patches] == ["ported", "ported"]
    assert [r.status for r in clean.verify] == ["applied", "applied"]
    gates = P.port_set(
        shipped["sm120-fusion-gates"],
        old_tree=old,
        new_tree=v10,
        from_version="0.5.9",
        to_version="0.5.10",
        out=tmp_path / "b",
    )
    assert [p.status for p in gates.patches] == ["ported", "conflict"]
    [conflict] = gates.conflicts
    assert conflict.path == "sglang/srt/server_args.py"
    assert conflict.hunks == ("@@ -1688,7 +1688,7 @@ class ServerArgs:",)
    kimi = P.port_set(
        shipped["kimi-k25-eagle3"],
        old_tree=old,
        new_tree=v10,
        from_version="0.5.9",
        to_version="0.5.10",
        out=tmp_path / "c",
    )
    assert [p.status for p in kimi.patches] == ["upstreamed"]


def _patches_cli(argv: list[str]) -> int:
    """``stackfarm patches ARGV...`` as the top-level command line runs it."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    patches_cli.register(sub)
    args = parser.parse_args(["patches", *argv])
    code: int = args.func(args)
    return code


@pytest.mark.integration
def test_check_cli_on_cached_releases(capsys: pytest.CaptureFixture[str]) -> None:
    code = _patches_cli(
        ["--matrix", str(REPO / "matrix.toml"), "check", "--version", "0.5.9", "--version", "0.5.10"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "kimi-k25-eagle3/0001-kimi-k25-eagle3-target-hooks.patch" in out
    assert "upstreamed from 0.5.10 on" in out
