"""The EAGLE-3 interface contract: what an SGLang version's EAGLE-3 code uses on its models, and who has it.

SGLang declares no interface for EAGLE-3 (vLLM has the runtime-checkable `SupportsEagle3` protocol): its
workers duck-type the target and the draft model, so a missing hook shows only when a server fails to start.
The contract is therefore read from the version under test itself, never listed by hand:

1. `derive_contract(tree)` asks `SpeculativeAlgorithm.create_worker` (speculative/spec_info.py) which worker
   classes serve EAGLE3, evaluates the algorithm's `is_*()` predicates for EAGLE3 from their own bodies, and
   reads those workers plus every module of `speculative/` and `model_executor/` with `ast`. Each attribute
   used on the target or the draft model on an EAGLE-3 path becomes a `Requirement` with its call sites and
   arities.
2. `check_class(tree, name, role, contract)` finds a model class by name or `EntryClass`, linearises its bases
   across modules (imports resolved inside the tree) and gives, per requirement, a `Finding`: implemented,
   inherited (torch.nn.Module's own methods too), delegated (a forwarding __getattr__), missing,
   optional-missing, signature-mismatch, or class-not-in-release.
3. `diff_contracts(old, new)` shows what an upgrade changes in the contract.

Pure functions over files, read through `sourcetree.SourceTree`: ASTs are cached by the sha256 of a file's
bytes, so the trees of several cells (or a patched tree that differs in two files) are parsed once per process.

The code lives in `eagle3_contract` (the data, JSON, the diff), `eagle3_uses` (what the conditions mean, and the
walker that records model uses), `eagle3_derive` (step 1) and `eagle3_models` (step 2); this module is the API.
"""

from __future__ import annotations

from stackfarm.analysis.eagle3_contract import (
    OK_VERDICTS,
    ROLES,
    VERDICTS,
    Contract,
    ContractChange,
    ContractError,
    Requirement,
    Role,
    Use,
    Verdict,
    diff_contracts,
    format_contract,
    format_diff,
)
from stackfarm.analysis.eagle3_derive import contract_key, derive_contract, tree_version
from stackfarm.analysis.eagle3_models import Finding, check_class, locate_class
from stackfarm.analysis.sourcetree import SourceTree, parse_file

__all__ = [
    "OK_VERDICTS",
    "ROLES",
    "VERDICTS",
    "Contract",
    "ContractChange",
    "ContractError",
    "Finding",
    "Requirement",
    "Role",
    "SourceTree",
    "Use",
    "Verdict",
    "check_class",
    "contract_key",
    "derive_contract",
    "diff_contracts",
    "format_contract",
    "format_diff",
    "locate_class",
    "parse_file",
    "tree_version",
]
