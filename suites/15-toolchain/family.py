"""15-toolchain as a suite family (stackfarm.family): its settings, its record, its report section.

Settings ([suites.15-toolchain.settings]): `environ` (as 10-capability's), `flashinfer_modes` (which of
flashinfer's arch lists to compile: stackfarm.analysis.jitfindings.MODES), `compile`, and the backend selection
checked per arch and model family: `selectors`, `families`, `platform` (stackfarm.analysis.backendsel).

Needs (`wheels`): every wheel the analysis reads beyond the cell's stack, "name==version", chosen in the runner by
the rules the analysis applies (stackfarm.analysis.jitcompile.wheels_needed: the Triton torch pins, the nvcc wheel
of its CUDA release, and with `compile` the cuda-toolkit release's component wheels and apache-tvm-ffi), the
index asked through the runner's query. The runner hands them over in ``CellSpec.extras``; what it cannot resolve
arrives in ``CellSpec.unavailable`` with the reason (`unresolved="unanswered"`), so an offline host's finding is
unanswered, never a pass, and never an error of the cell.

Record (``15-toolchain.json``): per target arch, the toolchain verdict (will the compilers the cell JIT-compiles
with accept the arch: Triton's ptxas, the CUDA toolkit flashinfer uses) and the selection verdict (does every
backend the release's auto-selection can choose there pass that backend's gate), each the worst of its findings
(stackfarm.junit.worst_of: failed > error > unanswered > passed; an arch with no finding of a kind says so, never
passed); then every finding with its testcase and file:line. The section joins each finding with its testcase's
outcome in the JUnit file.

Format 0 (`legacy`): a run held from before this family wrote records (its verdict binds no record sha256) kept
each finding as the properties of a testcase that has ``arch``; the report's renderer of then judged each arch
from those testcases' outcomes (a skip marked does-not-apply counts "n/a"), telling selection from toolchain by
the ``kind`` property or the testcase id ``test_finding[<kind>-...]``. `legacy` builds the record the same way,
so a held report's page shows the section it showed then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stackfarm.analysis.jitcompile import wheels_needed
from stackfarm.analysis.jitfindings import MODES
from stackfarm.family import Needs, SectionContext, SuiteFamily, WheelQuery, to_json
from stackfarm.schema import Bool, Either, Enum, List, Map, Str, Table
from stackfarm.settings_kit import CLASS, ENVIRON, GATE, classes

if TYPE_CHECKING:  # the report's types: matrix.load imports this file too, and needs none of them
    from stackfarm.history import Case, SuiteRun

NAME = "15-toolchain"

_LIB_GATE = r"lib:[A-Za-z0-9][A-Za-z0-9._|-]*:[A-Za-z0-9_./*?\[\]-]+"
_CXX_GATE = r"[A-Za-z0-9][A-Za-z0-9._-]*:[A-Za-z0-9_./-]+\.(?:h|cuh|hpp|cu):[A-Za-z_][A-Za-z0-9_]*"

_SELECTOR = Table(
    {
        "selector": Either(
            (
                Str('a function "module:qualname"', pattern=GATE),
                List(Str('a function "module:qualname"', pattern=GATE), "", min_len=1),
            ),
            'a function "module:qualname" that chooses a backend, or a list of them run in order',
        ),
        "sets": List(
            Str("a setting name", pattern=CLASS),
            'settings whose literal assignments are choices, e.g. ["attention_backend"]',
            unique=True,
        ),
        "calls": Map(
            Str(
                'a dotted kernel entry, e.g. "flashinfer.prefill.trtllm_ragged_attention_deepseek"',
                pattern=r"[A-Za-z_][A-Za-z0-9_.]*",
            ),
            'backend name -> the kernel entry whose call chooses it: calls = { trtllm = "m.f" }',
            noun="backend",
        ),
        "bind": Map(
            Str('"arch.major", "arch.minor" or "self.<attr>"', pattern=r"arch\.(major|minor)|self\.\w+"),
            'parameter -> its value: bind = { major = "arch.major" }',
            noun="parameter",
        ),
        "init": Bool("true: run the class's __init__ first (its arch-derived attributes)"),
        "per_family": Bool("true: run once per model family (it reads hf_config.architectures)"),
        "admits": Map(
            Str(
                'the backend\'s gate: "module:qualname", a C++ arch check '
                '"<distribution>:<path>.cuh:<symbol>" or its kernels "lib:<distribution>:<glob>"',
                pattern=GATE + "|" + _CXX_GATE + "|" + _LIB_GATE,
            ),
            'backend name -> the gate deciding whether it runs on a GPU: admits = { fa3 = "m:f" }',
            noun="backend",
        ),
    },
    'a table: { selector = "module:qualname", admits = { <backend> = "module:qualname" } }',
    required=("selector",),
    noun="key",
)

SCHEMA = Table(
    {
        "environ": ENVIRON,
        "flashinfer_modes": List(
            Enum(MODES, noun="mode"),
            'which of flashinfer\'s arch lists to compile, e.g. ["jit"] or ["jit", "aot"]',
            min_len=1,
            unique=True,
        ),
        "compile": Bool(
            "true: compile flashinfer's rope JIT module with the cell's CUDA toolkit per target arch"
        ),
        "families": classes(
            "model families (hf_config.architectures) selection is checked for besides [[models]]"
        ),
        "platform": Table(
            {
                "attribute": Str(
                    'the run-time global, e.g. "sglang.srt.platforms:current_platform"', pattern=GATE
                ),
                "cuda": Str(
                    'its class on a CUDA GPU, e.g. "sglang.srt.platforms.cuda:CudaSRTPlatform"', pattern=GATE
                ),
                "plugins": Str(
                    'the entry-point group of out-of-tree platforms, e.g. "sglang.srt.platforms"',
                    pattern=r"[A-Za-z_][A-Za-z0-9_.]*",
                ),
            },
            'a table: { attribute = "m:name", cuda = "m:Class", plugins = "group" }',
            required=("attribute", "cuda", "plugins"),
            noun="key",
        ),
        "selectors": Map(
            _SELECTOR, "[suites.15-toolchain.settings.selectors.<name>] tables", noun="selector"
        ),
    },
    noun="setting",
)


@dataclass(frozen=True, kw_only=True)
class ToolchainSettings:
    """[suites.15-toolchain.settings], parsed. `selectors` stays the checked table (backendsel reads it)."""

    environ: dict[str, str] = field(default_factory=dict)
    flashinfer_modes: tuple[str, ...] = ("jit",)
    compile: bool = False
    families: tuple[str, ...] = ()
    platform: dict[str, str] | None = None
    selectors: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> ToolchainSettings:
        platform = table.get("platform")
        return cls(
            environ={str(k): str(v) for k, v in dict(table.get("environ", {})).items()},
            flashinfer_modes=tuple(str(m) for m in table.get("flashinfer_modes", ("jit",))),
            compile=bool(table.get("compile", False)),
            families=tuple(str(f) for f in table.get("families", ())),
            platform={str(k): str(v) for k, v in platform.items()} if platform is not None else None,
            selectors=dict(table.get("selectors", {})),
        )

    def as_table(self) -> dict[str, Any]:
        """The settings as the analysis reads them (jitfindings.analyse, backendsel: a mapping)."""
        return {k: v for k, v in to_json(self).items() if v is not None}


def wheels(settings: ToolchainSettings | None, query: WheelQuery) -> tuple[str, ...]:
    """The wheels the cell's analysis reads beyond its stack (`wheels_needed`), for the runner to resolve."""
    compile_ = settings.compile if settings is not None else False
    return wheels_needed(query.stack, query.requires, query.versions, first_use_compile=compile_)


@dataclass(frozen=True, kw_only=True)
class ArchVerdict:
    arch: str
    #: The worst of the arch's toolchain findings in words (stackfarm.junit.worst_of), "no finding" for none.
    toolchain: str
    selection: str


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One finding, as its testcase (`testcase`, pytest's name) reports it."""

    testcase: str
    kind: str
    arch: str
    component: str = ""
    compiler: str = ""
    target: str = ""
    file: str = ""
    line: int = 0
    command: str = ""
    error: str = ""
    detail: str = ""
    #: Which CUDA toolkit was used and why.
    toolkit: str = ""


@dataclass(frozen=True, kw_only=True)
class ToolchainRecord:
    archs: tuple[ArchVerdict, ...] = ()
    findings: tuple[Finding, ...] = ()


#: A finding's outcome as its testcase ends (stackfarm.junit's words).
_AS_TESTCASE = {"fail": "failed", "skip": "skipped", "pass": "passed", "n/a": "n/a"}


def arch_verdicts(found: Iterable[Any]) -> tuple[ArchVerdict, ...]:
    """Each arch's toolchain and selection verdict from its findings (anything with kind, arch and outcome:
    stackfarm.analysis.jitfindings.ToolFinding): the worst outcome of each, in words ("failed (2 of 5)"),
    stackfarm.junit.worst_of; "no finding" for a kind an arch has none of, never passed."""
    from stackfarm.junit import worst_of

    groups: dict[tuple[str, str], list[str]] = {}
    for f in found:
        kind = "selection" if f.kind == "selection" else "toolchain"
        groups.setdefault((f.arch, kind), []).append(_AS_TESTCASE.get(f.outcome, "error"))
    return tuple(
        ArchVerdict(
            arch=arch,
            toolchain=worst_of(groups.get((arch, "toolchain"), [])),
            selection=worst_of(groups.get((arch, "selection"), [])),
        )
        for arch in sorted({arch for arch, _ in groups})
    )


#: The columns of the findings table (after suite, outcome, testcase).
KEYS = ("arch", "kind", "compiler", "target", "file", "line", "error", "detail")


def _facts(finding: Finding) -> dict[str, str]:
    """The finding as the table shows it (its outcome comes from its testcase in JUnit)."""
    return {k: str(getattr(finding, k)) for k in KEYS}


def render(ctx: SectionContext[ToolchainRecord]) -> str:
    """Each arch's toolchain and selection verdicts, then each finding with its file:line."""
    from stackfarm.junit import worst_of
    from stackfarm.sections.html import e, findings, record_cases, table

    cases: list[tuple[str, Case]] = []
    verdicts: dict[str, ArchVerdict] = {}
    for suite, record in zip(ctx.suites, ctx.records, strict=True):
        cases += record_cases(suite, record.findings, _facts)
        verdicts |= {v.arch: v for v in record.archs}
    if not cases:
        return ""
    rows = []
    for arch in sorted({c.properties["arch"] for _, c in cases}):
        found = verdicts.get(arch)
        tool, sel = (found.toolchain, found.selection) if found else (worst_of([]), worst_of([]))
        rows.append((f"<strong>{e(arch)}</strong>", e(tool), e(sel)))
    out = "<h2>Toolchain and backend selection</h2>"
    out += table(("arch", "toolchain", "selection"), rows)
    return out + findings("Findings", cases, KEYS)


# --------------------------------------------------------------------------- format 0: a held run's properties

#: The finding's fields a held testcase carried as properties of the same name (all but testcase and line).
_HELD_FIELDS = (
    "kind",
    "arch",
    "component",
    "compiler",
    "target",
    "file",
    "command",
    "error",
    "detail",
    "toolkit",
)


@dataclass(frozen=True, kw_only=True)
class _Held:
    """A held testcase as `arch_verdicts` reads a finding: its arch, its kind, its outcome."""

    arch: str
    kind: str
    outcome: str


def _held(case: Case) -> _Held:
    """How the renderer of then judged a held testcase: "n/a" for a skip marked does-not-apply, its kind from
    the ``kind`` property or the testcase id ``test_finding[<kind>-...]``."""
    from stackfarm.junit import NA_PROPERTY

    na = case.outcome == "skipped" and NA_PROPERTY in case.properties
    kind = case.properties.get("kind") or case.name.partition("[")[2]
    outcome = (
        "n/a" if na else {"failed": "fail", "skipped": "skip", "passed": "pass"}.get(case.outcome, "error")
    )
    return _Held(
        arch=case.properties["arch"],
        kind="selection" if kind.startswith("selection") else "toolchain",
        outcome=outcome,
    )


def _held_finding(case: Case) -> Finding:
    props = case.properties
    line = props.get("line", "")
    return Finding(
        testcase=case.name,
        line=int(line) if line.isdigit() else 0,
        **{k: props.get(k, "") for k in _HELD_FIELDS},
    )


def legacy(suite: SuiteRun) -> ToolchainRecord | None:
    """Format 0: the record of a run held from before records, from its testcases that carry ``arch``; None when
    it has none."""
    cases = [c for c in suite.cases if "arch" in c.properties]
    if not cases:
        return None
    return ToolchainRecord(
        archs=arch_verdicts(_held(c) for c in cases), findings=tuple(_held_finding(c) for c in cases)
    )


FAMILY: SuiteFamily[ToolchainSettings, ToolchainRecord] = SuiteFamily(
    name=NAME,
    title="Toolchain and backend selection",
    order=15,
    settings_schema=SCHEMA,
    settings=ToolchainSettings,
    record=ToolchainRecord,
    section=render,
    needs=Needs(wheels=wheels, unresolved="unanswered"),
    legacy=legacy,
)


__all__ = [
    "FAMILY",
    "KEYS",
    "NAME",
    "SCHEMA",
    "ArchVerdict",
    "Finding",
    "ToolchainRecord",
    "ToolchainSettings",
    "arch_verdicts",
    "legacy",
    "render",
    "wheels",
]
