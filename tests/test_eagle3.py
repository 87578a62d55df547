"""stackfarm.analysis.eagle3 on small, real Python trees shaped like SGLang's (and, marked integration, on the
real sglang 0.5.9 / 0.5.10 wheels).

The synthetic trees model each case the suite must tell apart: a worker that only serves other algorithms,
conditions on the algorithm and on the runner's role, aliases (locals, attributes, hasattr), inheritance
across modules with import aliases and name shadowing, a wrapper that holds the model without delegating, a
real `__getattr__` forwarder, torch.nn.Module's non-forwarding `__getattr__`, a missing method, a wrong
signature.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import pytest

from stackfarm import families
from stackfarm.analysis import eagle3
from stackfarm.analysis.eagle3 import (
    Contract,
    ContractError,
    Finding,
    SourceTree,
    check_class,
    contract_key,
    derive_contract,
    diff_contracts,
    format_contract,
    format_diff,
    parse_file,
)
from stackfarm.artifacts import Cache, Source, Target, find_artifact
from stackfarm.cellspec import InstalledComponent
from stackfarm.errors import ArtifactError
from stackfarm.handover import hand_over
from stackfarm.junit import NOT_APPLICABLE
from stackfarm.matrix import Suite
from stackfarm.matrix import load as load_matrix
from stackfarm.resolve import Resolver

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "suites" / "20-eagle3"

SPEC_INFO = """
    from enum import Enum, auto


    class SpeculativeAlgorithm(Enum):
        EAGLE = auto()
        EAGLE3 = auto()
        STANDALONE = auto()
        NONE = auto()

        def is_none(self) -> bool:
            return self == SpeculativeAlgorithm.NONE

        def is_eagle(self) -> bool:
            \"\"\"EAGLE3 is a variant of EAGLE.\"\"\"
            return self in (SpeculativeAlgorithm.EAGLE, SpeculativeAlgorithm.EAGLE3)

        def is_eagle3(self) -> bool:
            return self == SpeculativeAlgorithm.EAGLE3

        def is_standalone(self) -> bool:
            return self == SpeculativeAlgorithm.STANDALONE

        def create_worker(self, server_args):
            if self.is_eagle() and server_args.overlap:
                from sglang.srt.speculative.eagle_worker_v2 import EagleWorkerV2

                return EagleWorkerV2
            elif self.is_eagle():
                from sglang.srt.speculative.eagle_worker import EagleWorker

                return EagleWorker
            elif self.is_standalone():
                from sglang.srt.speculative.standalone_worker import StandaloneWorker

                return StandaloneWorker
            raise ValueError("unreachable")
"""

BASE_WORKER = """
    class BaseSpecWorker:
        def draft_hook(self):
            self.draft_runner.model.base_draft_hook()  # <base-hook>
"""

EAGLE_WORKER = """
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker as Base


    class EagleWorker(Base):
        def __init__(self, target_worker):
            self.target_worker = target_worker
            self.target_model = self.target_worker.model_runner.model
            embed, head = self.target_worker.model_runner.model.get_embed_and_head()  # <get-embed>
            if self.speculative_algorithm.is_eagle3():
                draft = self.draft_model_runner.model
                if (
                    hasattr(draft, "load_lm_head_from_target")  # <probe>
                    and draft.load_lm_head_from_target
                ):
                    draft.set_embed_and_head(embed, head)  # <eagle3-share-both>
                else:
                    self.draft_model_runner.model.set_embed(embed)  # <set-embed>
            else:
                self.draft_model_runner.model.set_embed_and_head(embed, head)  # <eagle1-only>
                self.draft_model_runner.model.eagle1_only_hook()

        def verify(self):
            return self.target_model.lm_head_dtype  # <attr-alias>

        def optional_things(self):
            scale = getattr(self.target_worker.model_runner.model, "logit_scale", 1.0)  # <getattr-default>
            return scale
"""

EAGLE_WORKER_V2 = """
    class EagleWorkerV2:
        def __init__(self, target_worker):
            runner = self.draft_runner_list[0]
            both = self.target_worker.model_runner.model.get_embed_and_head()  # <v2>
            runner.model.set_embed_and_head(*both)
"""

STANDALONE_WORKER = """
    class StandaloneWorker:
        def __init__(self, target_worker):
            target_worker.model_runner.model.standalone_only()
            self.target_worker.model_runner.model.standalone_only()
"""

MODEL_RUNNER = """
    class ModelRunner:
        def __init__(self, is_draft_worker):
            self.is_draft_worker = is_draft_worker
            self.use_aux = False
            if self.spec_algorithm.is_eagle3() and not self.is_draft_worker:
                self.use_aux = True
                self.aux_ids = [0, 1, 2]

        def initialize(self):
            self.model.load_weights([])  # not an EAGLE-3 path
            if self.use_aux:
                self.model.set_eagle3_layers_to_capture(self.aux_ids)  # <capture-ids>
            if self.is_draft_worker and self.spec_algorithm.is_eagle3():
                self.model.draft_only_hook()  # <draft-only>
            if self.spec_algorithm.is_none():
                self.model.plain_only()
"""

CUDA_GRAPH_RUNNER = """
    class CudaGraphRunner:
        def __init__(self, model_runner):
            self.model_runner = model_runner
            if model_runner.spec_algorithm.is_eagle3() and model_runner.use_aux:
                self.model_runner.model.set_eagle3_layers_to_capture()  # <capture-none>
            self.model_runner.model.forward()
"""

BASE_LM = """
    from torch import nn


    class BaseLM(nn.Module):
        def get_embed_and_head(self):  # <base-get>
            return self.embed, self.head

        def set_eagle3_layers_to_capture(self, layer_ids=None):  # <base-set>
            self.layers_to_capture = layer_ids
"""

MODELS = {
    "inherited.py": """
        from sglang.srt.models.base_lm import BaseLM as Base


        class InheritedLM(Base):
            pass


        EntryClass = [InheritedLM]
    """,
    "shadow.py": """
        from .base_lm import BaseLM


        class BaseLM(BaseLM):  # the base is the import: bases are evaluated before the name is bound
            def get_embed_and_head(self):  # <shadow-get>
                return super().get_embed_and_head()


        EntryClass = BaseLM
    """,
    "wrapper.py": """
        from torch import nn

        from sglang.srt.models.base_lm import BaseLM


        class WrapperLM(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.language_model = BaseLM(config)  # <holds>
    """,
    "forwarding.py": """
        from torch import nn

        from sglang.srt.models import base_lm


        class ForwardingLM(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.inner = base_lm.BaseLM(config)

            def __getattr__(self, name):  # <forward>
                return getattr(self.inner, name)
    """,
    "bad_sig.py": """
        from sglang.srt.models.base_lm import BaseLM


        class BadSigLM(BaseLM):
            def set_eagle3_layers_to_capture(self, layer_ids):  # <bad-sig>
                self.layers_to_capture = layer_ids
    """,
    "bare.py": """
        from torch import nn


        class BareLM(nn.Module):
            def get_embed_and_head(self):
                return None, None
    """,
    "alias.py": """
        from sglang.srt.models.base_lm import BaseLM

        AliasLM = BaseLM
    """,
    "draft.py": """
        from sglang.srt.models.base_lm import BaseLM


        class DraftLM(BaseLM):
            def __init__(self, config):
                self.hot_token_id = None
                self.load_lm_head_from_target = False

            def set_embed(self, embed):
                self.embed = embed

            def set_embed_and_head(self, embed, head, *, strict=True):
                self.embed, self.head = embed, head

            def draft_only_hook(self):
                pass

            def base_draft_hook(self):
                pass

            def set_aux(self, n):
                pass
    """,
}

#: Kimi K2.5 as shipped in 0.5.9 (a wrapper) and as the patch leaves it (delegating hooks).
KIMI_UNPATCHED = """
    from torch import nn

    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM


    class KimiK25ForConditionalGeneration(nn.Module):
        def __init__(self, config, quant_config=None):
            super().__init__()
            self.language_model = DeepseekV3ForCausalLM(config.text_config, quant_config)


    EntryClass = [KimiK25ForConditionalGeneration]
"""
KIMI_PATCH = """

    def get_embed_and_head(self):
        return self.language_model.get_embed_and_head()

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.language_model.set_eagle3_layers_to_capture(layer_ids)
"""
DEEPSEEK = """
    from torch import nn


    class DeepseekV2ForCausalLM(nn.Module):
        def get_embed_and_head(self):
            return self.model.embed_tokens.weight, self.lm_head.weight

        def set_eagle3_layers_to_capture(self, layer_ids=None):
            self.capture_aux_hidden_states = True


    class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
        pass
"""

FAKE_TORCH = {
    "torch/__init__.py": "",
    "torch/nn/__init__.py": "from .modules import Module\n",
    "torch/nn/modules/__init__.py": "from .module import Module\n",
    "torch/nn/modules/module.py": """
        class Module:
            def __getattr__(self, name):
                if name in self.__dict__["_parameters"]:
                    return self.__dict__["_parameters"][name]
                raise AttributeError(name)
    """,
}


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


def _sglang_tree(root: Path, version: str = "0.5.9", **overrides: str) -> Path:
    files = {
        f"sglang-{version}.dist-info/METADATA": f"Name: sglang\nVersion: {version}\n",
        "sglang/__init__.py": "",
        "sglang/srt/speculative/spec_info.py": SPEC_INFO,
        "sglang/srt/speculative/base_spec_worker.py": BASE_WORKER,
        "sglang/srt/speculative/eagle_worker.py": EAGLE_WORKER,
        "sglang/srt/speculative/eagle_worker_v2.py": EAGLE_WORKER_V2,
        "sglang/srt/speculative/standalone_worker.py": STANDALONE_WORKER,
        "sglang/srt/model_executor/model_runner.py": MODEL_RUNNER,
        "sglang/srt/model_executor/cuda_graph_runner.py": CUDA_GRAPH_RUNNER,
        "sglang/srt/models/__init__.py": "",
        "sglang/srt/models/base_lm.py": BASE_LM,
        "sglang/srt/models/kimi_k25.py": KIMI_UNPATCHED,
        "sglang/srt/models/deepseek_v2.py": DEEPSEEK,
        **{f"sglang/srt/models/{name}": text for name, text in MODELS.items()},
    }
    files.update(overrides)
    return _write(root, files)


def _site(root: Path, rel: str, marker: str) -> str:
    """The file:line of the line holding `# <marker>` in a tree file."""
    lines = (root / rel).read_text(encoding="utf-8").splitlines()
    return f"{rel}:{next(i for i, line in enumerate(lines, 1) if f'# <{marker}>' in line)}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return _sglang_tree(tmp_path / "sgl")


def _req(contract: Contract, role: str, name: str) -> eagle3.Requirement:
    return next(r for r in contract.requirements if r.role == role and r.name == name)


# --------------------------------------------------------------------------------------------- the contract


def test_contract_reads_the_eagle3_paths(tree: Path) -> None:
    contract = derive_contract(tree)
    assert contract.version == "0.5.9"
    assert {w.rsplit(":", 1)[1] for w in contract.workers} == {
        "EagleWorker",
        "EagleWorkerV2",
        "BaseSpecWorker",
    }
    target = {r.name for r in contract.for_role("target")}
    draft = {r.name for r in contract.for_role("draft")}
    # standalone_only (a worker of another algorithm), load_weights / forward (not on an EAGLE-3 path) and
    # plain_only (only without speculation) are not in the contract;
    # eagle1_only_hook is in the else branch of is_eagle3().
    assert target == {"get_embed_and_head", "set_eagle3_layers_to_capture", "lm_head_dtype"}
    assert draft == {"set_embed", "set_embed_and_head", "draft_only_hook", "base_draft_hook"}
    assert "eagle_use_aux_hidden_state" not in " ".join(contract.flags)
    assert contract.flags == ("use_aux (target)",)


def test_contract_sites_arities_and_optional_uses(tree: Path) -> None:
    contract = derive_contract(tree)
    spec, runner = "sglang/srt/speculative", "sglang/srt/model_executor"
    get = _req(contract, "target", "get_embed_and_head")
    assert set(get.sites) == {
        _site(tree, f"{spec}/eagle_worker.py", "get-embed"),
        _site(tree, f"{spec}/eagle_worker_v2.py", "v2"),
    }
    capture = _req(contract, "target", "set_eagle3_layers_to_capture")
    assert capture.arities == ("0", "1")
    assert set(capture.sites) == {
        _site(tree, f"{runner}/model_runner.py", "capture-ids"),
        _site(tree, f"{runner}/cuda_graph_runner.py", "capture-none"),
    }
    # set_embed_and_head: the EAGLE-3 branch (through a local alias), the list-of-runners alias, 2 args;
    # the star call of EagleWorkerV2 has an unknown arity.
    share = _req(contract, "draft", "set_embed_and_head")
    assert _site(tree, f"{spec}/eagle_worker.py", "eagle3-share-both") in share.sites
    assert _site(tree, f"{spec}/eagle_worker.py", "eagle1-only") not in share.sites
    assert share.arities == ("*", "2")
    assert _req(contract, "draft", "draft_only_hook").sites == (
        _site(tree, f"{runner}/model_runner.py", "draft-only"),
    )
    assert _req(contract, "target", "lm_head_dtype").sites == (
        _site(tree, f"{spec}/eagle_worker.py", "attr-alias"),
    )
    # hasattr() probes and getattr() with a default are in the contract, but not required.
    probe = _req(contract, "draft", "load_lm_head_from_target")
    assert not probe.required
    assert _site(tree, f"{spec}/eagle_worker.py", "probe") in probe.sites
    assert not _req(contract, "target", "logit_scale").required
    assert "logit_scale" in format_contract(contract)


def test_contract_error_without_speculative_decoding(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=r"spec_info\.py is missing"):
        derive_contract(_write(tmp_path, {"sglang/__init__.py": ""}))
    no_eagle3 = _sglang_tree(
        tmp_path / "old", **{"sglang/srt/speculative/spec_info.py": SPEC_INFO.replace("EAGLE3 = auto()", "")}
    )
    with pytest.raises(ContractError, match="no EAGLE3 member"):
        derive_contract(no_eagle3)


def test_contract_json_round_trip_and_key(tree: Path) -> None:
    contract = derive_contract(tree)
    again = Contract.from_json(json.loads(json.dumps(contract.to_json())))
    assert again == contract
    key = contract_key(tree)
    assert contract_key(tree) == key
    (tree / "sglang/srt/models/bare.py").write_text(
        "# models are not part of the contract\n", encoding="utf-8"
    )
    assert contract_key(tree) == key
    runner = tree / "sglang/srt/model_executor/model_runner.py"
    runner.write_text(runner.read_text(encoding="utf-8") + "\n# changed\n", encoding="utf-8")
    assert contract_key(tree) != key


def test_parse_cache_is_keyed_by_content(tmp_path: Path) -> None:
    a = _write(tmp_path, {"a.py": "x = 1\n", "b.py": "x = 1\n", "c.py": "x = 2\n"})
    assert parse_file(a / "a.py") is parse_file(a / "b.py")
    assert parse_file(a / "a.py") is not parse_file(a / "c.py")


def test_diff_between_versions(tmp_path: Path) -> None:
    old = derive_contract(_sglang_tree(tmp_path / "old", "0.5.9"))
    # The newer version drops the no-argument call from the CUDA-graph runner and needs a new target hook.
    newer_graph_runner = """
        class CudaGraphRunner:
            def __init__(self, model_runner):
                if model_runner.use_aux:
                    self.model_runner.model.get_aux_buffer(size=4)
    """
    new = derive_contract(
        _sglang_tree(
            tmp_path / "new",
            "0.5.10",
            **{"sglang/srt/model_executor/cuda_graph_runner.py": newer_graph_runner},
        )
    )
    changes = {(c.role, c.name): c for c in diff_contracts(old, new)}
    assert changes[("target", "set_eagle3_layers_to_capture")].change == "changed"
    assert "set_eagle3_layers_to_capture(0|1) -> set_eagle3_layers_to_capture(1)" in (
        changes[("target", "set_eagle3_layers_to_capture")].detail
    )
    assert changes[("target", "get_aux_buffer")].change == "added"
    assert "get_aux_buffer(0,size=)" in changes[("target", "get_aux_buffer")].detail
    assert ("target", "get_embed_and_head") not in changes
    text = format_diff(old, new, tuple(changes.values()))
    assert text.startswith("EAGLE-3 contract diff: sglang 0.5.9 -> 0.5.10")
    assert diff_contracts(old, old) == ()
    assert format_diff(old, old, ()).endswith("no change")


# --------------------------------------------------------------------------------------------- providers


def _verdicts(findings: tuple[Finding, ...]) -> dict[str, str]:
    return {f.method: f.verdict for f in findings}


def test_inherited_across_modules_through_an_import_alias(tree: Path) -> None:
    contract = derive_contract(tree)
    findings = check_class(SourceTree([tree]), "InheritedLM", "target", contract)
    assert _verdicts(findings) == {
        "get_embed_and_head": "inherited",
        "set_eagle3_layers_to_capture": "inherited",
        "lm_head_dtype": "missing",
    }
    get = next(f for f in findings if f.method == "get_embed_and_head")
    assert get.provider_class == "BaseLM"
    assert get.provider_file == _site(tree, "sglang/srt/models/base_lm.py", "base-get")
    assert get.consumer_site.startswith("sglang/srt/speculative/eagle_worker.py:")


def test_shadowing_base_and_entry_class(tree: Path) -> None:
    # `class BaseLM(BaseLM)` in shadow.py (in EntryClass) is preferred over base_lm.BaseLM, and inherits it.
    findings = check_class(SourceTree([tree]), "BaseLM", "target", derive_contract(tree))
    by_name = {f.method: f for f in findings}
    assert by_name["get_embed_and_head"].verdict == "implemented"
    assert by_name["get_embed_and_head"].provider_file == _site(
        tree, "sglang/srt/models/shadow.py", "shadow-get"
    )
    assert by_name["set_eagle3_layers_to_capture"].verdict == "inherited"


def test_wrapper_without_delegation_is_missing(tree: Path) -> None:
    findings = check_class(SourceTree([tree]), "WrapperLM", "target", derive_contract(tree))
    get = next(f for f in findings if f.method == "get_embed_and_head")
    assert get.verdict == "missing"
    assert get.provider_file == ""
    assert "self.language_model = BaseLM(...)" in get.detail
    assert _site(tree, "sglang/srt/models/wrapper.py", "holds") in get.detail
    assert "sglang/srt/speculative/eagle_worker.py:" in get.consumer_site
    assert "torch.nn.Module" in get.detail  # the base it could not look into is named


def test_module_getattr_of_torch_does_not_forward(tree: Path, tmp_path: Path) -> None:
    torch_root = _write(tmp_path / "torch-tree", FAKE_TORCH)
    findings = check_class(SourceTree([tree, torch_root]), "WrapperLM", "target", derive_contract(tree))
    assert set(_verdicts(findings).values()) == {"missing"}
    assert all("not inspected" not in f.detail for f in findings)  # torch.nn.Module was found and read


def test_real_getattr_forwarding_counts(tree: Path) -> None:
    findings = check_class(SourceTree([tree]), "ForwardingLM", "target", derive_contract(tree))
    # its __getattr__ forwards every name to self.inner: a delegation, which serves (ok)
    assert set(_verdicts(findings).values()) == {"delegated"}
    assert all(f.ok for f in findings)
    get = next(f for f in findings if f.method == "get_embed_and_head")
    assert get.provider_file == _site(tree, "sglang/srt/models/forwarding.py", "forward")
    assert "self.inner" in get.detail


def test_wrong_signature(tree: Path) -> None:
    findings = check_class(SourceTree([tree]), "BadSigLM", "target", derive_contract(tree))
    bad = next(f for f in findings if f.method == "set_eagle3_layers_to_capture")
    assert bad.verdict == "signature-mismatch"
    assert bad.provider_file == _site(tree, "sglang/srt/models/bad_sig.py", "bad-sig")
    assert "cuda_graph_runner.py" in bad.detail
    assert "needs layer_ids" in bad.detail
    assert not bad.ok


def test_missing_method_and_unknown_class(tree: Path) -> None:
    contract = derive_contract(tree)
    bare = _verdicts(check_class(SourceTree([tree]), "BareLM", "target", contract))
    assert bare == {
        "get_embed_and_head": "implemented",
        "set_eagle3_layers_to_capture": "missing",
        "lm_head_dtype": "missing",
    }
    nowhere = check_class(SourceTree([tree]), "NoSuchLM", "target", contract)
    # a class the release does not have is one verdict of its own, not a missing method per requirement
    assert [(f.method, f.verdict, f.ok) for f in nowhere] == [("*", "class-not-in-release", False)]
    assert "has no class NoSuchLM" in nowhere[0].detail


def test_module_level_alias_is_found(tree: Path) -> None:
    findings = check_class(SourceTree([tree]), "AliasLM", "target", derive_contract(tree))
    assert _verdicts(findings)["get_embed_and_head"] == "implemented"


def test_draft_contract(tree: Path) -> None:
    findings = check_class(SourceTree([tree]), "DraftLM", "draft", derive_contract(tree))
    assert {f.method: f.verdict for f in findings} == {
        "base_draft_hook": "implemented",
        "draft_only_hook": "implemented",
        "set_embed": "implemented",
        "set_embed_and_head": "implemented",  # 2 positional args fit (embed, head, *, strict=True)
    }


def test_kimi_wrapper_fails_unpatched_and_passes_patched(tree: Path, tmp_path: Path) -> None:
    contract = derive_contract(tree)
    unpatched = check_class(SourceTree([tree]), "KimiK25ForConditionalGeneration", "target", contract)
    failing = {f.method for f in unpatched if not f.ok}
    assert {"get_embed_and_head", "set_eagle3_layers_to_capture"} <= failing
    capture = next(f for f in unpatched if f.method == "set_eagle3_layers_to_capture")
    assert "model_runner.py:" in capture.consumer_site
    assert "cuda_graph_runner.py:" in capture.consumer_site
    assert "DeepseekV2ForCausalLM" in capture.detail  # where the held language model has it

    patched_source = textwrap.dedent(KIMI_UNPATCHED).replace(
        "\n\nEntryClass", textwrap.indent(textwrap.dedent(KIMI_PATCH), "    ") + "\n\nEntryClass"
    )
    patched = _sglang_tree(tmp_path / "patched", **{"sglang/srt/models/kimi_k25.py": patched_source})
    findings = check_class(
        SourceTree([patched]), "KimiK25ForConditionalGeneration", "target", derive_contract(patched)
    )
    verdicts = _verdicts(findings)
    assert verdicts["get_embed_and_head"] == verdicts["set_eagle3_layers_to_capture"] == "implemented"


# --------------------------------------------------------------------------------------------- the suite


def _load_probe() -> object:
    spec = importlib.util.spec_from_file_location("eagle3_probe_under_test", SUITE / "eagle3_probe.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probe_is_import_safe_and_its_tiny_configs_fit_together() -> None:
    before = set(sys.modules)
    probe = _load_probe()
    assert not {"torch", "sglang"} & (set(sys.modules) - before)
    target, draft = probe.tiny_configs("LlamaForCausalLM", "LlamaForCausalLMEagle3")  # type: ignore[attr-defined]
    assert draft["target_hidden_size"] == target["hidden_size"]
    ids = draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert max(ids) + 1 < target["num_hidden_layers"]  # SGLang captures after layer id+1: it must exist
    assert draft["vocab_size"] == target["vocab_size"] == draft["draft_vocab_size"]
    # Kimi K2.5: its language model is the tiny DeepseekV3, which is what get_embed_and_head hands the draft.
    kimi, kimi_draft = probe.tiny_configs("KimiK25ForConditionalGeneration", "LlamaForCausalLMEagle3")  # type: ignore[attr-defined]
    assert kimi["text_config"]["architectures"] == ["DeepseekV3ForCausalLM"]
    assert kimi["text_config"]["hidden_size"] == kimi_draft["target_hidden_size"]
    assert kimi["vision_config"]["text_hidden_size"] == kimi["text_config"]["hidden_size"]
    with pytest.raises(KeyError):
        probe.tiny_configs("Qwen3MoeForCausalLM", "LlamaForCausalLMEagle3")  # type: ignore[attr-defined]


def _cell_json(
    tmp_path: Path,
    sglang_root: Path,
    extras: Mapping[str, InstalledComponent] | None = None,
    **settings: object,
) -> Path:
    cell = {
        "id": "synthetic-sgl0.5.9",
        "values": {"sglang": "0.5.9", "python": "3.11"},
        "backend": "local",
        "components": [
            {
                "axis": "sglang", "distribution": "sglang", "version": "0.5.9",
                "filename": "sglang-0.5.9.whl", "sha256": "0" * 64, "source": "synthetic",
                "root": str(sglang_root),
            }
        ],
        "models": [{"name": "kimi", "target": "KimiK25ForConditionalGeneration", "draft": "DraftLM"}],
        "settings": {"20-eagle3": {"extra_targets": ["InheritedLM"], **settings}},
        "no_gpu_reason": "no NVIDIA GPU in the unit tests",
        "extras": {k: asdict(v) for k, v in (extras or {}).items()},
    }  # fmt: skip
    path = tmp_path / "cell.json"
    path.write_text(json.dumps(cell), encoding="utf-8")
    return path


def test_suite_end_to_end_on_a_synthetic_tree(tree: Path, tmp_path: Path) -> None:
    """The real suite in a real pytest process: one testcase per (class, name) with the report properties."""
    junit = tmp_path / "reports" / "20-eagle3.xml"
    env = {
        **os.environ,
        "STACKFARM_CELL": str(_cell_json(tmp_path, tree)),
        "STACKFARM_CACHE": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(SUITE), f"--junitxml={junit}", "-q", "-p", "no:cacheprovider"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:]  # the unpatched Kimi wrapper fails
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    kimi = cases["test_provider[target:KimiK25ForConditionalGeneration.get_embed_and_head]"]
    props = {p.get("name"): p.get("value") for p in kimi.iter("property")}
    assert props["verdict"] == "missing"
    assert props["model_class"] == "KimiK25ForConditionalGeneration"
    assert props["method"] == "get_embed_and_head"
    assert props["provider_file"] == ""
    assert "eagle_worker.py:" in (props["consumer_site"] or "")
    assert kimi.find("failure") is not None
    inherited = cases["test_provider[target:InheritedLM.set_eagle3_layers_to_capture]"]
    assert {p.get("name"): p.get("value") for p in inherited.iter("property")}["verdict"] == "inherited"
    assert inherited.find("failure") is None
    runtime = [c for name, c in cases.items() if name and name.startswith("test_runtime[")]
    assert runtime
    assert all(c.find("skipped") is not None for c in runtime)
    assert "needs GPU: no NVIDIA GPU" in (runtime[0].find("skipped").get("message") or "")  # type: ignore[union-attr]
    # The record (family.py's Eagle3Record) says what the properties say, testcase by testcase.
    record = json.loads((junit.parent / "20-eagle3.json").read_text(encoding="utf-8"))["record"]
    providers = {n for n in cases if n and n.startswith("test_provider[")}
    assert {c["testcase"] for c in record["classes"]} == providers
    for check in record["classes"]:
        props = {p.get("name"): p.get("value") or "" for p in cases[check["testcase"]].iter("property")}
        assert {k: check[k] for k in props} == props
    contract = {p.get("name"): p.get("value") for p in cases["test_contract"].iter("property")}
    assert [(t["key"], t["version"], t["text"]) for t in record["texts"]] == [
        ("contract", contract["sglang"], contract["contract"])
    ]
    report = json.loads((junit.parent / "eagle3-contract.json").read_text(encoding="utf-8"))
    assert {r["name"] for r in report["contract"]["requirements"]} >= {"get_embed_and_head", "set_embed"}
    assert list((tmp_path / "cache" / "eagle3").glob("contract-*.json"))  # the contract was cached on disk


def _run_suite(tmp_path: Path, cell: Path) -> dict[str, ET.Element]:
    junit = tmp_path / "reports" / "20-eagle3.xml"
    env = {**os.environ, "STACKFARM_CELL": str(cell), "STACKFARM_CACHE": str(tmp_path / "cache")}
    subprocess.run(
        [sys.executable, "-m", "pytest", str(SUITE), f"--junitxml={junit}", "-q", "-p", "no:cacheprovider"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return {c.get("name") or "": c for c in ET.parse(junit).getroot().iter("testcase")}


def _wheel(folder: Path, tree: Path, version: str) -> Path:
    """A pure sglang wheel of `tree`, as an index would serve it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sglang-{version}-py3-none-any.whl"
    info = f"sglang-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as whl:
        for file in sorted(tree.rglob("*.py")):
            whl.write(file, file.relative_to(tree).as_posix())
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return path


def _extras(
    tmp_path: Path, compare_with: list[str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, InstalledComponent]:
    """What the runner hands the suite: family.py's Needs.wheels resolved on the matrix's index (here a local
    find-links folder) and unpacked in the shared cache (stackfarm.handover.hand_over)."""
    monkeypatch.setenv("STACKFARM_CACHE", str(tmp_path / "cache"))
    matrix_file = tmp_path / "matrix.toml"
    matrix_file.write_text(
        '[axes]\ncuda = ["12.8"]\ntorch = ["2.9.1"]\nsgl_kernel = ["0.3.21"]\nflashinfer = ["0.6.3"]\n'
        'sglang = ["0.5.9"]\npython = ["3.11"]\n\n[indexes.local]\nfind_links = "wheels"\n',
        encoding="utf-8",
    )
    matrix = load_matrix(matrix_file)
    family = families.load_one(SUITE / families.FAMILY_FILE)
    suite = Suite(name=family.name, path=SUITE, parsed_settings=family.parse({"compare_with": compare_with}))
    return hand_over((suite,), {"sglang": "0.5.9"}, Resolver(matrix, Cache()), "3.11").extras


def test_contract_diff_against_the_wheel_the_runner_resolved(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The older SGLang is the wheel the runner resolved on the index the cell's matrix routes it to, as
    family.py's Needs.wheels asks: the suite reads CellSpec.extras, never matrix.toml."""
    older = _sglang_tree(tmp_path / "older", "0.5.8")
    _wheel(tmp_path / "wheels", older, "0.5.8")
    extras = _extras(tmp_path, ["0.5.8"], monkeypatch)
    assert list(extras) == ["sglang==0.5.8"]
    # unpacked in the shared cache, where every cell's wheels are
    assert list((tmp_path / "cache" / "trees").glob("*/sglang-0.5.8.dist-info"))
    cell = _cell_json(tmp_path, tree, extras, compare_with=["0.5.8"])
    diff = _run_suite(tmp_path, cell)["test_contract_diff"]
    assert diff.find("failure") is None
    assert diff.find("error") is None
    assert diff.find("skipped") is None
    props = {p.get("name"): p.get("value") for p in diff.iter("property")}
    assert props["compared_with"] == "0.5.8"
    assert "sglang 0.5.8 -> 0.5.9" in (props["contract_diff"] or "")
    record = json.loads((tmp_path / "reports" / "20-eagle3.json").read_text(encoding="utf-8"))["record"]
    texts = {t["key"]: t for t in record["texts"]}
    assert texts["contract_diff"]["version"] == "0.5.8"
    assert texts["contract_diff"]["text"] == props["contract_diff"]
    assert texts["verdict_diff"]["text"] == props["verdict_diff"]


def test_a_wheel_the_runner_cannot_resolve_is_an_error_naming_the_suite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "wheels").mkdir()
    with pytest.raises(
        ArtifactError, match=r"suite 20-eagle3 needs sglang==0\.5\.8, which cannot be resolved"
    ):
        _extras(tmp_path, ["0.5.8"], monkeypatch)


def test_contract_diff_without_a_baseline(tree: Path, tmp_path: Path) -> None:
    """Nothing to compare with does not apply; a baseline the runner did not hand over is an unanswered
    question (the runner itself fails the cell when it cannot resolve one)."""
    cases = _run_suite(tmp_path / "a", _cell_json(tmp_path, tree))
    skipped = cases["test_contract_diff"].find("skipped")
    assert skipped is not None
    assert (skipped.get("message") or "").startswith(NOT_APPLICABLE)
    cases = _run_suite(tmp_path / "b", _cell_json(tmp_path, tree, compare_with=["0.5.8"]))
    skipped = cases["test_contract_diff"].find("skipped")
    assert skipped is not None
    message = skipped.get("message") or ""
    assert not message.startswith(NOT_APPLICABLE)
    assert "cannot fetch sglang 0.5.8" in message
    assert "the runner handed no sglang==0.5.8" in message


# --------------------------------------------------------------------------------------------- real wheels


def _real_sglang(version: str) -> Path:
    source = Source(name="pypi", url="https://pypi.org/simple")
    artifact = find_artifact(
        source, "sglang", version, Target(python="3.11", platform="manylinux_2_39_x86_64")
    )
    return Cache().unpack(artifact)


@pytest.mark.integration
def test_real_sglang_0_5_9_and_0_5_10() -> None:
    old_root, new_root = _real_sglang("0.5.9"), _real_sglang("0.5.10")
    old, new = derive_contract(old_root), derive_contract(new_root)
    for contract in (old, new):
        assert {r.name for r in contract.for_role("target")} >= {
            "get_embed_and_head",
            "set_eagle3_layers_to_capture",
        }
        assert {r.name for r in contract.for_role("draft")} >= {"set_embed", "set_embed_and_head"}
    kimi_old = check_class(SourceTree([old_root]), "KimiK25ForConditionalGeneration", "target", old)
    missing = {f.method: f for f in kimi_old if f.verdict == "missing"}
    assert {"get_embed_and_head", "set_eagle3_layers_to_capture"} <= missing.keys()
    assert "speculative/eagle_worker.py:" in missing["get_embed_and_head"].consumer_site
    assert "model_executor/model_runner.py:" in missing["set_eagle3_layers_to_capture"].consumer_site
    kimi_new = check_class(SourceTree([new_root]), "KimiK25ForConditionalGeneration", "target", new)
    assert all(f.ok for f in kimi_new), [f.detail for f in kimi_new if not f.ok]
    for root, contract in ((old_root, old), (new_root, new)):
        for name in ("LlamaForCausalLM", "DeepseekV3ForCausalLM"):
            assert all(f.ok for f in check_class(SourceTree([root]), name, "target", contract))
        assert all(f.ok for f in check_class(SourceTree([root]), "LlamaForCausalLMEagle3", "draft", contract))


# --------------------------------------------------------------------------------------------- across releases


def _release(version: str) -> Path:
    """The real wheel's tree, fetched through the farm's artifacts layer (matrix.toml's index)."""
    from stackfarm.matrix import load as load_matrix
    from stackfarm.sglangtrees import sglang_trees

    return sglang_trees(load_matrix(REPO / "matrix.toml"), [version], echo=lambda _: None)[version]


def _by(findings: tuple[Finding, ...]) -> dict[str, Finding]:
    return {f.method: f for f in findings}


@pytest.mark.integration
def test_real_0_4_10_post2_bare_enum_worker_from_the_scheduler() -> None:
    """0.4.10.post2: spec_info.py is a bare `class SpeculativeAlgorithm(IntEnum)` (no create_worker, no registry);
    managers/scheduler.py:324-327 picks the worker: `if self.spec_algorithm.is_eagle(): from
    sglang.srt.speculative.eagle_worker import EAGLEWorker` (is_eagle: `self == EAGLE or self == EAGLE3`)."""
    root = _release("0.4.10.post2")
    contract = derive_contract(root)
    assert contract.workers == ("sglang/srt/speculative/eagle_worker.py:EAGLEWorker",)
    target = {r.name: r for r in contract.for_role("target")}
    # eagle_worker.py:138 `embed, head = self.target_worker.model_runner.model.get_embed_and_head()`
    assert target["get_embed_and_head"].sites == ("sglang/srt/speculative/eagle_worker.py:138",)
    # model_runner.py:366 `self.model.set_eagle3_layers_to_capture(...)` under `is_eagle3() and not is_draft_worker`
    assert "sglang/srt/model_executor/model_runner.py:366" in target["set_eagle3_layers_to_capture"].sites
    # eagle_worker.py:142 `self.draft_model_runner.model.set_embed(embed)` under `is_eagle3()`
    assert {r.name for r in contract.for_role("draft")} >= {"set_embed", "hot_token_id"}
    tree = SourceTree([root])
    # models/llama.py:714 and :743 define both target hooks on LlamaForCausalLM itself
    assert {f.verdict for f in check_class(tree, "LlamaForCausalLM", "target", contract)} == {"implemented"}
    # models/deepseek_v2.py of this release never mentions set_eagle3_layers_to_capture
    deepseek = _by(check_class(tree, "DeepseekV3ForCausalLM", "target", contract))
    assert deepseek["set_eagle3_layers_to_capture"].verdict == "missing"
    assert deepseek["get_embed_and_head"].provider_class == "DeepseekV2ForCausalLM"  # inherited from V2
    # there is no models/kimi_k25.py yet: one verdict for the class, not a missing per method
    kimi = check_class(tree, "KimiK25ForConditionalGeneration", "target", contract)
    assert [(f.method, f.verdict) for f in kimi] == [("*", "class-not-in-release")]


@pytest.mark.integration
def test_real_0_5_5_registry_form() -> None:
    """0.5.5: SpeculativeAlgorithm is a registry; spec_info.py registers
    `register_speculative_algorithm("EAGLE3", worker_cls=_create_eagle_worker, flags=("EAGLE", "EAGLE3"))`, and
    is_eagle3() is `self._has_flag("EAGLE3")` (:168). _create_eagle_worker (:264-273) imports EAGLEWorkerV2
    when enable_overlap, else EAGLEWorker."""
    root = _release("0.5.5")
    contract = derive_contract(root)
    assert set(contract.workers) >= {
        "sglang/srt/speculative/eagle_worker.py:EAGLEWorker",
        "sglang/srt/speculative/eagle_worker_v2.py:EAGLEWorkerV2",
    }
    target = {r.name: r for r in contract.for_role("target")}
    # eagle_worker.py:143 and eagle_worker_v2.py:158 call get_embed_and_head() on the target's model
    assert set(target["get_embed_and_head"].sites) == {
        "sglang/srt/speculative/eagle_worker.py:143",
        "sglang/srt/speculative/eagle_worker_v2.py:158",
    }
    assert "set_eagle3_layers_to_capture" in target
    # `hasattr(..., "load_lm_head_from_target")` guards every use (eagle_worker.py:149-150): optional
    optional = {r.name for r in contract.for_role("draft", required_only=False) if not r.required}
    assert "load_lm_head_from_target" in optional
    tree = SourceTree([root])
    llama = _by(check_class(tree, "LlamaForCausalLMEagle3", "draft", contract, include_optional=True))
    # models/llama_eagle3.py:206 sets self.load_lm_head_from_target; set_embed comes from LlamaForCausalLM
    assert llama["load_lm_head_from_target"].verdict == "implemented"
    assert (llama["set_embed"].verdict, llama["set_embed"].provider_class) == (
        "inherited",
        "LlamaForCausalLM",
    )


@pytest.mark.integration
def test_real_0_5_21_hooks_called_through_helper_functions() -> None:
    """0.5.21: model_runner.py:1009 calls `configure_aux_hidden_state_capture(model=self.model,
    eagle_use_aux_hidden_state=self.spec_aux_config.eagle_use_aux_hidden_state, ...)`, which calls
    `model.set_eagle3_layers_to_capture(...)` under `if eagle_use_aux_hidden_state:`
    (model_runner_components/attention_backend_setup.py:54-55); spec_aux_hidden_state.py sets that flag only
    past `if not ((is_eagle() or is_standalone()) and not is_draft_worker): return`, so for the target only.
    eagle_worker_v2.py:372 passes `target_model=target_runner.model` to resolve_draft_embed_and_head, which
    calls resolve_target_embed_and_head(target_model) -> `target_model.get_embed_and_head()`
    (speculative/pp_draft_embedding.py:84). eagle_worker_v2.py:432 iterates `self.draft_runner.model.modules()`,
    torch.nn.Module's own method."""
    root = _release("0.5.21")
    contract = derive_contract(root)
    target = {r.name: r for r in contract.for_role("target")}
    assert target["set_eagle3_layers_to_capture"].sites == (
        "sglang/srt/model_executor/model_runner_components/attention_backend_setup.py:55",
    )
    assert target["get_embed_and_head"].sites == ("sglang/srt/speculative/pp_draft_embedding.py:84",)
    assert "set_eagle3_layers_to_capture" not in {r.name for r in contract.for_role("draft")}
    # `target_model.lm_head` (pp_draft_embedding.py:88) runs only in `except AttributeError:`: a fallback
    assert not next(r for r in contract.requirements if r.role == "target" and r.name == "lm_head").required
    tree = SourceTree([root])
    for name in ("KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM", "LlamaForCausalLM"):
        findings = check_class(tree, name, "target", contract, include_optional=True)
        assert all(f.ok for f in findings), [(f.method, f.verdict, f.detail) for f in findings if not f.ok]
    # models/kimi_k25.py:924 and :961 now define both hooks on the wrapper itself
    kimi = _by(check_class(tree, "KimiK25ForConditionalGeneration", "target", contract))
    assert kimi["set_eagle3_layers_to_capture"].provider_file == "sglang/srt/models/kimi_k25.py:924"
    draft = _by(check_class(tree, "LlamaForCausalLMEagle3", "draft", contract, include_optional=True))
    assert (draft["modules"].verdict, draft["modules"].provider_class) == ("inherited", "torch.nn.Module")
    assert (
        draft["set_lm_head_from_target"].verdict == "optional-missing"
    )  # hasattr-probed (eagle_worker_v2.py:338)
    assert draft["set_lm_head_from_target"].ok


@pytest.mark.integration
def test_every_release_on_the_index_has_a_contract() -> None:
    """0.4.10.post2 to the newest: a release whose contract cannot be derived is a bug of the derivation."""
    from packaging.version import Version

    from stackfarm.matrix import load as load_matrix
    from stackfarm.sglangtrees import available_versions, sglang_trees

    matrix = load_matrix(REPO / "matrix.toml")
    versions = [
        v
        for v in available_versions(matrix)
        if Version(v) >= Version("0.4.10.post2") and not Version(v).is_prerelease
    ]
    trees = sglang_trees(matrix, versions, echo=lambda _: None)
    for version, root in trees.items():
        contract = derive_contract(root)
        names = {r.name for r in contract.for_role("target")}
        assert {"get_embed_and_head", "set_eagle3_layers_to_capture"} <= names, version
        assert contract.for_role("draft"), version
