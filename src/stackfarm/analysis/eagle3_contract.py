"""The EAGLE-3 interface contract as data: its requirements, their uses, JSON, and the diff between versions.

A `Contract` is what one SGLang version's EAGLE-3 code uses on the target and the draft model
(`eagle3_derive.derive_contract` reads it from the tree); `diff_contracts` says what an upgrade changes in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stackfarm.errors import StackfarmError

Role = Literal["target", "draft"]
ROLES: tuple[Role, ...] = ("target", "draft")
UseKind = Literal["call", "attribute", "probe"]
#: implemented: the class defines it; inherited: a base does (torch.nn.Module's own methods and object's
#: attributes included); delegated: its __getattr__ forwards the name to a held model; missing: a required name
#: nobody provides; optional-missing: a name only probed for (hasattr / getattr with a default) that it lacks;
#: signature-mismatch: provided, but some call does not bind; class-not-in-release: no such class in this SGLang.
Verdict = Literal[
    "implemented",
    "inherited",
    "delegated",
    "missing",
    "optional-missing",
    "signature-mismatch",
    "class-not-in-release",
]
VERDICTS: tuple[Verdict, ...] = (
    "implemented",
    "inherited",
    "delegated",
    "missing",
    "optional-missing",
    "signature-mismatch",
    "class-not-in-release",
)
#: The verdicts that let the class serve EAGLE-3.
OK_VERDICTS: frozenset[Verdict] = frozenset({"implemented", "inherited", "delegated", "optional-missing"})


class ContractError(StackfarmError):
    """The tree does not have the shape the derivation reads (no spec_info.py, no EAGLE3 algorithm, ...)."""


@dataclass(frozen=True, kw_only=True)
class Use:
    """One place where SGLang touches a model attribute on an EAGLE-3 path."""

    role: Role
    name: str
    kind: UseKind
    #: "sglang/srt/speculative/eagle_worker.py:157"
    site: str
    #: The source of the model expression, e.g. "self.target_worker.model_runner.model".
    receiver: str
    #: Positional arguments of a call (None: not a call, or *args).
    positional: int | None = None
    keywords: tuple[str, ...] = ()
    #: Guarded by hasattr()/getattr(default): a model may lack it.
    optional: bool = False
    #: The enclosing conditions, as source.
    guard: str = ""

    @property
    def arity(self) -> str:
        if self.kind != "call":
            return ""
        pos = "*" if self.positional is None else str(self.positional)
        return pos + "".join(f",{k}=" for k in self.keywords)


@dataclass(frozen=True, kw_only=True)
class Requirement:
    role: Role
    name: str
    #: "method" when some use calls it, else "attribute".
    kind: Literal["method", "attribute"]
    #: False when every use is guarded by hasattr()/getattr(default).
    required: bool
    uses: tuple[Use, ...]

    @property
    def sites(self) -> tuple[str, ...]:
        return tuple(sorted({u.site for u in self.uses}, key=site_key))

    @property
    def arities(self) -> tuple[str, ...]:
        return tuple(sorted({u.arity for u in self.uses if u.kind == "call"}))

    @property
    def signature(self) -> str:
        if self.kind == "attribute":
            return self.name
        return f"{self.name}({'|'.join(self.arities)})"


def site_key(site: str) -> tuple[str, int]:
    path, _, line = site.rpartition(":")
    return path, int(line) if line.isdigit() else 0


@dataclass(frozen=True, kw_only=True)
class Contract:
    version: str
    #: The EAGLE3 workers create_worker returns, "path:Class".
    workers: tuple[str, ...]
    #: Attributes set only where speculation runs that gate a use below: "name (roles they can be true for)".
    flags: tuple[str, ...]
    requirements: tuple[Requirement, ...]

    def for_role(self, role: Role, *, required_only: bool = True) -> tuple[Requirement, ...]:
        return tuple(r for r in self.requirements if r.role == role and (r.required or not required_only))

    def to_json(self) -> dict[str, Any]:
        """Plain data: the report's `contract_json`, and what `from_json` reads back (the on-disk cache)."""
        return {
            "sglang": self.version,
            "workers": list(self.workers),
            "flags": list(self.flags),
            "requirements": [
                {
                    "role": r.role,
                    "name": r.name,
                    "kind": r.kind,
                    "required": r.required,
                    "arities": list(r.arities),
                    "sites": list(r.sites),
                    "uses": [
                        {
                            "site": u.site,
                            "kind": u.kind,
                            "receiver": u.receiver,
                            "positional": u.positional,
                            "keywords": list(u.keywords),
                            "optional": u.optional,
                            "guard": u.guard,
                        }
                        for u in r.uses
                    ],
                }
                for r in self.requirements
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Contract:
        requirements = []
        for r in data["requirements"]:
            uses = tuple(
                Use(role=r["role"], name=r["name"], **{**u, "keywords": tuple(u["keywords"])})
                for u in r["uses"]
            )
            requirements.append(
                Requirement(role=r["role"], name=r["name"], kind=r["kind"], required=r["required"], uses=uses)
            )
        return cls(
            version=data["sglang"],
            workers=tuple(data["workers"]),
            flags=tuple(data["flags"]),
            requirements=tuple(requirements),
        )


def format_contract(contract: Contract) -> str:
    """The contract as a few readable lines per requirement (for the report)."""
    lines = [
        f"EAGLE-3 contract of sglang {contract.version or '?'}",
        f"  workers: {', '.join(contract.workers)}",
    ]
    if contract.flags:
        lines.append(f"  EAGLE-3 flags: {', '.join(contract.flags)}")
    for role in ROLES:
        lines.append(f"  {role}:")
        for req in contract.for_role(role, required_only=False):
            need = "required" if req.required else "optional"
            lines.append(f"    {req.signature:<40} {need:<8} {', '.join(req.sites)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- the diff


@dataclass(frozen=True, kw_only=True)
class ContractChange:
    role: Role
    name: str
    change: Literal["added", "removed", "changed"]
    detail: str


def _files_of(req: Requirement) -> set[str]:
    return {s.rpartition(":")[0] for s in req.sites}


def diff_contracts(old: Contract, new: Contract) -> tuple[ContractChange, ...]:
    """What changed between two versions' contracts. Line numbers are ignored: they move every release."""
    before = {(r.role, r.name): r for r in old.requirements}
    after = {(r.role, r.name): r for r in new.requirements}
    keys = sorted(before.keys() | after.keys())
    found = (_change(role, name, before.get((role, name)), after.get((role, name))) for role, name in keys)
    return tuple(change for change in found if change is not None)


def _change(role: Role, name: str, a: Requirement | None, b: Requirement | None) -> ContractChange | None:
    """How one (role, name) requirement differs from `a` (old) to `b` (new); None when it is the same."""
    if a is None and b is not None:
        detail = f"{b.signature} {'required' if b.required else 'optional'}, used at {', '.join(b.sites)}"
        return ContractChange(role=role, name=name, change="added", detail=detail)
    if b is None and a is not None:
        return ContractChange(role=role, name=name, change="removed", detail=f"was {a.signature}")
    if a is None or b is None:
        return None
    notes = _changed(a, b)
    return ContractChange(role=role, name=name, change="changed", detail="; ".join(notes)) if notes else None


def _changed(a: Requirement, b: Requirement) -> list[str]:
    """What changed in one requirement kept from `a` to `b`: its signature, whether it is required, its files."""
    notes = []
    if a.kind != b.kind or a.arities != b.arities:
        notes.append(f"{a.signature} -> {b.signature}")
    if a.required != b.required:
        notes.append("now required" if b.required else "now optional")
    gone, came = _files_of(a) - _files_of(b), _files_of(b) - _files_of(a)
    if came:
        notes.append(f"now also used in {', '.join(sorted(came))}")
    if gone:
        notes.append(f"no longer used in {', '.join(sorted(gone))}")
    return notes


def format_diff(old: Contract, new: Contract, changes: Sequence[ContractChange]) -> str:
    head = f"EAGLE-3 contract diff: sglang {old.version or '?'} -> {new.version or '?'}"
    if not changes:
        return f"{head}: no change"
    mark = {"added": "+", "removed": "-", "changed": "~"}
    return "\n".join([head, *(f"  {mark[c.change]} {c.role}.{c.name}: {c.detail}" for c in changes)])


__all__ = [
    "OK_VERDICTS",
    "ROLES",
    "VERDICTS",
    "Contract",
    "ContractChange",
    "ContractError",
    "Requirement",
    "Role",
    "Use",
    "UseKind",
    "Verdict",
    "diff_contracts",
    "format_contract",
    "format_diff",
    "site_key",
]
