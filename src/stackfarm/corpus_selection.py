"""The corpus's backend-selection part: each SGLang release's auto-selection per arch (stackfarm.analysis.backendsel,
with the matrix's [suites.15-toolchain.settings] selectors, families and platform), judged against the
flashinfer release that SGLang release pins in its own metadata (its C++ arch checks are the gates).

15-toolchain's compiler half is not in the corpus: it needs the torch (Triton) and CUDA toolkit of a cell, which
a release alone does not name; each release's row says so (`TOOLCHAIN_UNANSWERED`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stackfarm.analysis.backendsel import cell_choices, families_of
from stackfarm.analysis.jitfindings import requirement_pin
from stackfarm.cellspec import CellSpec, InstalledComponent, dist_info

SUITE = "15-toolchain"
TOOLCHAIN_UNANSWERED = (
    "the compilers a cell JIT-compiles with (Triton's ptxas from its torch, the CUDA toolkit) are a cell's, not a "
    "release's: 15-toolchain's compiler findings are per cell (nox -s matrix), not in the corpus"
)
_FLASHINFER = ("flashinfer-python", "flashinfer_python", "flashinfer")


def _component(distribution: str, version: str, root: Path) -> InstalledComponent:
    return InstalledComponent(
        axis=distribution,
        distribution=distribution,
        version=version,
        filename="",
        sha256=root.name,
        source="corpus",
        root=str(root),
    )


def flashinfer_pin(version: str, root: Path) -> str | None:
    """The flashinfer-python version the sglang release at `root` pins (its METADATA, plain or under the "srt"
    extra that releases up to 0.4.x put their runtime pins in), or None."""
    info = dist_info(_component("sglang", version, root))
    if info is None or not (info / "METADATA").is_file():
        return None
    text = (info / "METADATA").read_text(encoding="utf-8", errors="replace")
    requires = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist:")]
    return requirement_pin(
        requires, _FLASHINFER, ("", "srt")
    )  # older releases pin it under their "srt" extra


def selection_part(
    version: str,
    root: Path,
    settings: Mapping[str, Any],
    archs: Sequence[str],
    *,
    flashinfer: tuple[str, Path] | None,
    models: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """One release's selection counts (outcome, and outcome per arch), the failures' messages, and the
    flashinfer release judged against."""
    comps = [_component("sglang", version, root)]
    if flashinfer is not None:
        comps.append(_component("flashinfer-python", flashinfer[0], flashinfer[1]))
    cell = CellSpec(
        id=f"corpus-sgl{version}",
        values={"cuda": "12.8", "sglang": version},
        backend="local",
        components=tuple(comps),
        archs=tuple(archs),
        models=tuple(dict(m) for m in models),
    )
    found = cell_choices(
        cell,
        settings.get("selectors", {}),
        families_of(cell, settings),
        platform=settings.get("platform"),
        environ=settings.get("environ", {}),
    )
    counts: Counter[str] = Counter(f.outcome for f in found)
    by_arch: dict[str, Counter[str]] = {}
    for f in found:
        by_arch.setdefault(f.arch, Counter())[f.outcome] += 1
    return {
        "flashinfer": flashinfer[0] if flashinfer else None,
        "counts": dict(sorted(counts.items())),
        "by_arch": {a: dict(sorted(c.items())) for a, c in sorted(by_arch.items())},
        "failures": [f"{f.arch} {f.file}:{f.line} {f.message[:400]}" for f in found if f.outcome == "fail"][
            :20
        ],
        "toolchain": TOOLCHAIN_UNANSWERED,
    }


def flashinfer_trees(
    versions: Mapping[str, Path], fetch: Callable[[str], Path | None], echo: Callable[[str], None] = print
) -> dict[str, tuple[str, Path] | None]:
    """sglang version -> (the flashinfer version it pins, its unpacked tree), fetching each pinned release once;
    None where the release pins none or the wheel cannot be had (its C++ gates then stay unknown)."""
    pins = {v: flashinfer_pin(v, root) for v, root in versions.items()}
    trees: dict[str, Path | None] = {}
    for pin in sorted({p for p in pins.values() if p}):
        trees[pin] = fetch(pin)
        if trees[pin] is None:
            echo(f"flashinfer-python {pin}: not fetched; its releases' C++ gates stay unknown")
    out: dict[str, tuple[str, Path] | None] = {}
    for version, pinned in pins.items():
        tree = trees.get(pinned) if pinned else None
        out[version] = (pinned, tree) if pinned and tree is not None else None
    return out


__all__ = ["TOOLCHAIN_UNANSWERED", "flashinfer_pin", "flashinfer_trees", "selection_part"]
