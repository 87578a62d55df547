"""Capability-keyed tables and feature gates in a Python tree, found with `ast`, judged for a target GPU.

**Tables.** SGLang keeps per-architecture settings in dict literals keyed by the compute-capability major
(``{9: ..., 10: ...}``), by ``major * 10 + minor`` or by ``(major, minor)``, and looks them up with a value that
came from ``torch.cuda.get_device_capability()``. A subscript lookup of a missing key crashes (SGLang 0.5.9 on
sm_120: ``KeyError: 12``); ``.get`` or ``in`` turns the feature off without a word. Nothing here is a hand list:

1. every module is summarised once into `ModuleFacts` (imports, dict literals, what each function returns and
   each name holds as a symbolic *flow* such as ``index(cap, 0)``, and every lookup whose key has a flow); the
   summary is a pure function of the file's bytes, cached by its sha256;
2. flows are resolved across modules (``major, minor = ...``, ``self.cc = ...[0]``, helpers that return the
   capability, re-exports through ``from x import *``) into a key kind: ``major``, ``minor``, ``sm`` or ``pair``;
3. a lookup with a capability-kind key into a dict literal is a `CapLookup`.

Only files that can hold capability flows are parsed: those that call ``get_device_capability`` /
``get_device_properties``, then, to a fixpoint, those that mention a name found to carry a capability.
Step 1 is `capfacts`; this module resolves and scans.

**Gates.** `evaluate_gate` runs a feature's deciding function with `pysource.Evaluator` for one GPU and says
whether the GPU alone turns it off (and where), or crashes it. `flag_sites` finds every condition that reads a
server argument of the feature, so a gate nobody listed still shows up. They live in `capgates` and are
re-exported here.
"""

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from stackfarm.analysis.arch import Arch
from stackfarm.analysis.cache import JsonCache, digest_bytes
from stackfarm.analysis.capfacts import FACTS_VERSION, Flow, LookupFact, ModuleFacts, TableDef, module_facts
from stackfarm.analysis.capgates import (
    Feature,
    FeatureError,
    FlagSite,
    GateResult,
    evaluate_gate,
    evaluate_site,
    flag_sites,
    judge_site,
    parse_features,
)
from stackfarm.analysis.sourcetree import SourceError, SourceTree

_SOURCES = (b"get_device_capability", b"get_device_properties")
KeyKind = Literal["major", "minor", "sm", "pair"]
_KEY_KINDS: dict[str, KeyKind] = {"major": "major", "minor": "minor", "sm": "sm", "pair": "pair"}
TableVerdict = Literal["ok", "missing-crash", "missing-graceful"]


@dataclass(frozen=True)
class CapLookup:
    """A lookup into a dict literal with a key that comes from the device's compute capability."""

    table: TableDef
    table_module: str
    table_path: str
    module: str
    path: str
    lookup: LookupFact
    kind: KeyKind

    def target_key(self, gpu: Arch) -> Any:
        return {"major": gpu.major, "minor": gpu.minor, "sm": gpu.sm, "pair": (gpu.major, gpu.minor)}[
            self.kind
        ]

    def verdict(self, gpu: Arch) -> TableVerdict | None:
        """``ok`` when the GPU's key is there, else how the miss shows; None when the keys are computed."""
        if self.table.keys is None:
            return None
        if self.target_key(gpu) in self.table.keys:
            return "ok"
        if self.lookup.style == "subscript" and self.lookup.guard is None:
            return "missing-crash"
        return "missing-graceful"


@dataclass
class Scan:
    """The capability lookups of one tree, and what it cost."""

    lookups: tuple[CapLookup, ...]
    files_total: int
    files_parsed: int
    cache_hits: int
    #: Files that did not parse (a message each); they are skipped, never fatal.
    problems: tuple[str, ...] = ()


class _Resolver:
    def __init__(self, tree: SourceTree, cache: JsonCache | None) -> None:
        self.tree = tree
        self.cache = cache
        self._facts: dict[str, ModuleFacts | None] = {}
        self._kinds: dict[Flow, str | None] = {}
        self.parsed = 0
        self.hits = 0
        self.problems: list[str] = []

    def facts(self, module: str) -> ModuleFacts | None:
        if module in self._facts:
            return self._facts[module]
        path = self.tree.path_of(module)
        result: ModuleFacts | None = None
        if path is not None:
            source = self.tree.read(path)
            key = digest_bytes(f"{FACTS_VERSION}\0{module}\0".encode() + source)
            cached = self.cache.get(key) if self.cache else None
            if cached is not None:
                self.hits += 1
                result = ModuleFacts.from_json(cached)
            else:
                try:
                    result = module_facts(module, path.name == "__init__.py", source)
                except (SyntaxError, ValueError, RecursionError) as exc:
                    self.problems.append(f"{self.tree.relative(path)}: skipped, does not parse ({exc})")
                    result = None
                else:
                    self.parsed += 1
                    if self.cache:
                        self.cache.put(key, result.to_json())
        self._facts[module] = result
        return result

    def _find(self, qualname: str, want: Literal["def", "table"], depth: int = 0) -> tuple[str, Any] | None:
        """Where `qualname` is defined: (module, flow) for a def, (module, TableDef) for a table."""
        if depth > 16:
            return None
        try:
            module, attrs = self.tree.split(qualname)
        except SourceError:
            return None
        facts = self.facts(module)
        if facts is None or not attrs:
            return None
        return self._find_in(facts, attrs, want, depth)

    def _find_in(
        self, facts: ModuleFacts, attrs: Sequence[str], want: Literal["def", "table"], depth: int
    ) -> tuple[str, Any] | None:
        """`_find` inside one module: its own tables and defs, then the imports and star imports it names."""
        module = facts.module
        key = ".".join(attrs)
        if want == "table" and key in facts.tables:
            return module, facts.tables[key]
        if key in facts.defs:
            flow = facts.defs[key]
            if want == "def":
                return module, flow
            if flow[0] == "global":  # an alias: TABLE = OTHER_TABLE
                return self._find(flow[1], want, depth + 1)
            return None
        if attrs[0] in facts.imports:
            return self._find(".".join([facts.imports[attrs[0]], *attrs[1:]]), want, depth + 1)
        for star in facts.stars:
            found = self._find(f"{star}.{key}", want, depth + 1)
            if found:
                return found
        return None

    def kind(self, flow: Flow | None, depth: int = 0) -> str | None:
        if flow is None or depth > 24:
            return None
        if flow in self._kinds:
            return self._kinds[flow]
        self._kinds[flow] = None  # a cycle resolves to nothing
        result = self._derive_kind(flow, depth)
        self._kinds[flow] = result
        return result

    def _derive_kind(self, flow: Flow, depth: int) -> str | None:
        """What `flow` holds, from what its parts hold (see `kind`, which caches this)."""
        tag = flow[0]
        if tag in _SOURCE_KINDS:
            return _SOURCE_KINDS[tag]
        if tag == "index":
            inner = self.kind(flow[1], depth + 1)
            return {0: "major", 1: "minor"}.get(flow[2]) if inner == "pair" else None
        if tag == "attr":
            return flow[2] if self.kind(flow[1], depth + 1) in ("pair", "props") else None
        if tag in ("sm", "pair"):
            major, minor = self.kind(flow[1], depth + 1), self.kind(flow[2], depth + 1)
            return tag if (major, minor) == ("major", "minor") else None
        if tag in ("call", "global"):
            found = self._find(flow[1], "def")
            return self.kind(found[1], depth + 1) if found else None
        return None

    def table(self, container: Flow) -> tuple[str, TableDef] | None:
        found = self._find(container[1], "table")
        return (found[0], found[1]) if found else None


def _capability_names(resolver: _Resolver, modules: Sequence[str]) -> set[str]:
    names: set[str] = set()
    for module in modules:
        facts = resolver.facts(module)
        if facts is None:
            continue
        for name, flow in facts.defs.items():
            if resolver.kind(flow) in ("pair", "props", "major", "minor", "sm"):
                names.add(name.rsplit(".", 1)[-1])
    return names


#: What the two capability sources hold: ``get_device_capability()`` a (major, minor) pair, ``get_device_properties()``
#: an object with ``.major`` / ``.minor``.
_SOURCE_KINDS = {"cap": "pair", "props": "props"}


def scan_tables(tree: SourceTree, packages: Sequence[str], cache: JsonCache | None = None) -> Scan:
    """Every capability-keyed dict lookup in `packages` (top-level package names) of `tree`."""
    resolver = _Resolver(tree, cache)
    files = [p for package in packages for p in tree.files(package)]
    chosen, modules = _chosen(tree, resolver, files)
    out: dict[tuple[str, int, str, str], CapLookup] = {}
    for module, path in zip(modules, chosen, strict=True):
        facts = resolver.facts(module)
        if facts is None:
            continue
        for lookup in facts.lookups:
            cap = _cap_lookup(tree, resolver, module, path, lookup)
            if cap is not None:
                out.setdefault((cap.path, lookup.line, lookup.style, cap.table.name), cap)
    lookups = tuple(sorted(out.values(), key=lambda c: (c.path, c.lookup.line, c.lookup.style)))
    return Scan(lookups, len(files), resolver.parsed, resolver.hits, tuple(resolver.problems))


def _chosen(tree: SourceTree, resolver: _Resolver, files: Sequence[Path]) -> tuple[list[Path], list[str]]:
    """The files worth summarising, with their modules: those naming a capability source, then, to a fixpoint,
    those naming a function or constant that one of the chosen defines as a capability."""
    texts = {p: tree.read(p) for p in files}
    chosen = [p for p in files if _names_source(texts[p])]
    modules = [tree.module_of(p) for p in chosen]
    seen_names: set[str] = set()
    while True:
        names = _capability_names(resolver, modules) - seen_names
        if not names:
            break
        seen_names |= names
        more = [p for p in _naming_word(files, texts, names) if p not in chosen]
        chosen += more
        modules += [tree.module_of(p) for p in more]
    return chosen, modules


def _names_source(text: bytes) -> bool:
    """Whether a file's text names one of the capability sources at all."""
    return any(s in text for s in _SOURCES)


def _naming_word(files: Sequence[Path], texts: Mapping[Path, bytes], names: Collection[str]) -> list[Path]:
    """The files whose text names one of `names` as a whole word (a byte search: the summaries need not be read)."""
    pattern = re.compile(rb"\b(?:" + b"|".join(re.escape(n.encode()) for n in sorted(names)) + rb")\b")
    return [p for p in files if pattern.search(texts[p])]


def _cap_lookup(
    tree: SourceTree, resolver: _Resolver, module: str, path: Path, lookup: LookupFact
) -> CapLookup | None:
    """`lookup` as a `CapLookup` when its key is a capability and its container a table of the tree."""
    kind = _KEY_KINDS.get(resolver.kind(lookup.key) or "")
    if kind is None:
        return None
    found = resolver.table(lookup.container)
    if found is None:
        return None
    table_module, table = found
    table_path = tree.path_of(table_module)
    return CapLookup(
        table=table,
        table_module=table_module,
        table_path=tree.relative(table_path) if table_path else "",
        module=module,
        path=tree.relative(path),
        lookup=lookup,
        kind=kind,
    )


__all__ = [
    "FACTS_VERSION",
    "CapLookup",
    "Feature",
    "FeatureError",
    "FlagSite",
    "GateResult",
    "KeyKind",
    "LookupFact",
    "ModuleFacts",
    "Scan",
    "TableDef",
    "evaluate_gate",
    "evaluate_site",
    "flag_sites",
    "judge_site",
    "module_facts",
    "parse_features",
    "scan_tables",
]
