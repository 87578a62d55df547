"""20-eagle3 as a suite family (stackfarm.family): its settings, the wheels it needs, its record, its section.

Settings ([suites.20-eagle3.settings], all optional): `extra_targets` / `extra_drafts` (classes checked
statically besides [[models]]), `compare_with` (SGLang versions to diff the contract against: the nearest older
one than the cell's is used), `runtime_pairs` ([[target, draft], ...] built on a GPU; default: Llama and the
[[models]] pairs), `runtime_timeout` (seconds per pair, default 900: the first run JIT-compiles kernels),
`attention_backend` (for the runtime build, default "triton").

Needs: the wheel of the nearest older `compare_with` release than the cell's SGLang (``sglang==<version>``,
`baseline`): the runner resolves it with the matrix's [indexes] and [[route]] and hands its unpacked tree in
``CellSpec.extras``, so the suite neither reads matrix.toml nor resolves a wheel; a wheel that cannot be
resolved is an error of the cell.

Record (``20-eagle3.json``): the contract texts (the derived contract with its SGLang version, the contract diff
and the verdict changes against the version compared with) and every class checked against the contract (role,
class, method, verdict, the provider's file:line, the consumer's site, the detail) with its testcase. The
section joins each class with its testcase's outcome in the JUnit file, as 10-capability's does.

Format 0 (`legacy`): a run held from before this family wrote records carries the same facts as its testcases'
properties (``contract``, ``contract_diff``, ``verdict_diff`` with ``sglang`` / ``compared_with``; ``model_class``,
``method``, ...): read once, from that run's JUnit file, into the same record, so its page renders as it did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from stackfarm.family import Needs, SectionContext, SuiteFamily, WheelQuery
from stackfarm.schema import List, Number, Str, Table
from stackfarm.settings_kit import CLASS, classes, version

if TYPE_CHECKING:  # the report's types: matrix.load imports this file too, and needs none of them
    from stackfarm.history import Case, SuiteRun

NAME = "20-eagle3"

SCHEMA = Table(
    {
        "extra_targets": classes("target classes checked statically besides [[models]]"),
        "extra_drafts": classes("draft classes checked statically besides [[models]]"),
        "compare_with": List(
            Str('a quoted SGLang version, e.g. "0.5.9"', check=version),
            'SGLang versions to diff the contract against (the nearest older one is used), e.g. ["0.5.9"]',
        ),
        "runtime_pairs": List(
            List(Str("a Python class name", pattern=CLASS), "[target, draft]", min_len=2, max_len=2),
            'pairs built on a GPU, e.g. [["LlamaForCausalLM", "LlamaForCausalLMEagle3"]]',
        ),
        "runtime_timeout": Number("seconds per runtime pair: a number > 0, e.g. 900", positive=True),
        "attention_backend": Str('SGLang\'s --attention-backend for the runtime build, e.g. "triton"'),
    },
    noun="setting",
)


@dataclass(frozen=True, kw_only=True)
class Eagle3Settings:
    """[suites.20-eagle3.settings], parsed."""

    extra_targets: tuple[str, ...] = ()
    extra_drafts: tuple[str, ...] = ()
    compare_with: tuple[str, ...] = ()
    #: None: the default pairs (Llama, then the [[models]] pairs).
    runtime_pairs: tuple[tuple[str, str], ...] | None = None
    runtime_timeout: float = 900.0
    attention_backend: str = "triton"

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> Eagle3Settings:
        pairs = table.get("runtime_pairs")
        return cls(
            extra_targets=tuple(str(c) for c in table.get("extra_targets", ())),
            extra_drafts=tuple(str(c) for c in table.get("extra_drafts", ())),
            compare_with=tuple(str(v) for v in table.get("compare_with", ())),
            runtime_pairs=None if pairs is None else tuple((str(t), str(d)) for t, d in pairs),
            runtime_timeout=float(table.get("runtime_timeout", 900)),
            attention_backend=str(table.get("attention_backend", "triton")),
        )


def requirement(version_: str) -> str:
    """The requirement of the SGLang wheel a `compare_with` version names (a key of CellSpec.extras)."""
    return f"sglang=={version_}"


def baseline(settings: Eagle3Settings, current: str) -> str | None:
    """The SGLang release the contract is diffed against: the nearest older than `current` in compare_with."""
    older = sorted((Version(v) for v in settings.compare_with if Version(v) < Version(current)), reverse=True)
    return str(older[0]) if older else None


def _wheels(settings: Eagle3Settings | None, query: WheelQuery) -> tuple[str, ...]:
    """The wheel of the release the cell's contract is diffed against (`baseline`), for the runner to resolve:
    only that one, the one a host's bundle carries (the cell's stack is all it asks)."""
    current = query.stack.get("sglang")
    found = baseline(settings, current) if settings is not None and current else None
    return (requirement(found),) if found is not None else ()


#: The contract texts, in the order a testcase shows them, with their headings.
TEXTS = (
    ("contract", "Derived contract"),
    ("contract_diff", "Contract diff"),
    ("verdict_diff", "Verdict changes"),
)


@dataclass(frozen=True, kw_only=True)
class ContractText:
    """One contract text, as its testcase (`testcase`, pytest's name) reports it."""

    testcase: str
    #: "contract", "contract_diff" or "verdict_diff" (`TEXTS`).
    key: str
    text: str
    #: The SGLang version of the contract ("contract"), or the one compared with (the diffs).
    version: str = ""


@dataclass(frozen=True, kw_only=True)
class ClassCheck:
    """One (class, required name) checked against the contract, as its testcase reports it."""

    testcase: str
    role: str
    model_class: str
    method: str
    verdict: str
    #: "path:line" of the provider ("" when the class provides none).
    provider_file: str = ""
    #: "path:line" of a site that calls it on an EAGLE-3 path.
    consumer_site: str = ""
    provider_class: str = ""
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class Eagle3Record:
    texts: tuple[ContractText, ...] = ()
    classes: tuple[ClassCheck, ...] = ()


#: The columns of the classes table (after suite, outcome, testcase).
KEYS = ("role", "model_class", "method", "verdict", "provider_file", "consumer_site", "detail")
_CHECKED = (*KEYS, "provider_class")


def from_junit(suite: SuiteRun) -> Eagle3Record | None:
    """Format 0: the record of a held run that wrote none, from its testcases' properties; None without any."""
    texts: list[ContractText] = []
    checked: list[ClassCheck] = []
    for case in suite.cases:
        props = case.properties
        version_ = props.get("sglang") or props.get("compared_with") or ""
        texts += [
            ContractText(testcase=case.name, key=key, text=props[key], version=version_)
            for key, _ in TEXTS
            if key in props
        ]
        if {"model_class", "method"} <= props.keys():
            facts = {k: props.get(k, "") for k in _CHECKED}
            checked.append(ClassCheck(testcase=case.name, **facts))
    if not texts and not checked:
        return None
    return Eagle3Record(texts=tuple(texts), classes=tuple(checked))


def _facts(check: ClassCheck) -> dict[str, str]:
    """The class as the table shows it (its outcome comes from its testcase in JUnit)."""
    return {k: str(getattr(check, k)) for k in KEYS}


def _heading(text: ContractText) -> str:
    title = dict(TEXTS).get(text.key, text.key)
    return f"{title} (sglang {text.version})" if text.version and text.key == "contract" else title


def render(ctx: SectionContext[Eagle3Record]) -> str:
    """The contract texts, then each class against the contract with the provider's and consumer's file:line."""
    from stackfarm.sections.html import e, findings, record_cases

    texts: list[str] = []
    cases: list[tuple[str, Case]] = []
    for suite, record in zip(ctx.suites, ctx.records, strict=True):
        texts += [f"<h3>{e(_heading(t))}</h3><pre>{e(t.text)}</pre>" for t in record.texts]
        cases += record_cases(suite, record.classes, _facts)
    if not texts and not cases:
        return ""
    out = "<h2>EAGLE-3 contract</h2>" + "".join(texts)
    if cases:
        out += findings(
            "Classes against the contract", cases, KEYS, locations=("provider_file", "consumer_site")
        )
    return out


FAMILY: SuiteFamily[Eagle3Settings, Eagle3Record] = SuiteFamily(
    name=NAME,
    title="EAGLE-3 contract",
    order=20,
    settings_schema=SCHEMA,
    settings=Eagle3Settings,
    record=Eagle3Record,
    section=render,
    needs=Needs(wheels=_wheels),
    legacy=from_junit,
)

__all__ = [
    "FAMILY",
    "KEYS",
    "NAME",
    "SCHEMA",
    "TEXTS",
    "ClassCheck",
    "ContractText",
    "Eagle3Record",
    "Eagle3Settings",
    "baseline",
    "from_junit",
    "render",
    "requirement",
]
