"""15-toolchain: per target arch, the toolchain verdict (will the compilers the cell JIT-compiles with accept the
arch: Triton's ptxas, the CUDA toolkit flashinfer uses) and the selection verdict (does every backend the
release's auto-selection can choose there pass that backend's gate), then each finding with its file:line.

An arch's verdict is the worst of its findings (failed > error > unanswered > passed); an arch with no finding
of a kind says so, never passed."""

from __future__ import annotations

from collections.abc import Iterable

from ..history import Case
from ..junit import NA_PROPERTY, worst_of
from . import Context, register
from .html import e, findings, table

KEYS = ("arch", "kind", "compiler", "target", "file", "line", "error", "detail")


def outcome(case: Case) -> str:
    """The testcase's outcome, "n/a" for one the suite marked does-not-apply (never counted unanswered)."""
    return "n/a" if case.outcome == "skipped" and NA_PROPERTY in case.properties else case.outcome


def kind_of(case: Case) -> str:
    """ "selection" or "toolchain" (triton, flashinfer-jit/aot, toolkit, error), from the kind property or the
    testcase id ``test_finding[<kind>-...]``."""
    kind = case.properties.get("kind") or case.name.partition("[")[2]
    return "selection" if kind.startswith("selection") else "toolchain"


def verdict(cases: Iterable[Case]) -> str:
    """The worst outcome of `cases` in words (stackfarm.junit.worst_of, as the suite's per-arch properties)."""
    return worst_of([outcome(c) for c in cases])


@register("toolchain", name="toolchain", order=15)
def render(ctx: Context) -> str:
    cases = [(s.result.suite, c) for s in ctx.suites for c in s.cases if "arch" in c.properties]
    if not cases:
        return ""
    archs = sorted({c.properties["arch"] for _, c in cases})
    rows = []
    for arch in archs:
        mine = [c for _, c in cases if c.properties["arch"] == arch]
        tool = verdict(c for c in mine if kind_of(c) == "toolchain")
        sel = verdict(c for c in mine if kind_of(c) == "selection")
        rows.append((f"<strong>{e(arch)}</strong>", e(tool), e(sel)))
    out = "<h2>Toolchain and backend selection</h2>"
    out += table(("arch", "toolchain", "selection"), rows)
    return out + findings("Findings", cases, KEYS)


__all__ = ["kind_of", "outcome", "render", "verdict"]
