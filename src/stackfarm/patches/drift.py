"""Drift: where a hunk's context stopped matching, in the words of the upstream file.

``git apply`` never fuzzes: a hunk applies where its whole context matches, or not at all. When it does not,
``locate_drift`` finds where the hunk would sit upstream and names the first line that differs there.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from .model import Hunk


@dataclass(frozen=True, kw_only=True)
class Drift:
    path: str
    hunk: str
    patch_line: int
    expected: str | None  # the first line of the hunk that upstream does not have (None: upstream has more)
    found: str | None  # what upstream has there (None: the file ends)
    upstream_line: int  # 1-based line in the upstream file where they part
    around: tuple[tuple[int, str], ...]
    note: str = ""

    def describe(self) -> str:
        lines = [f"{self.path}: hunk `{self.hunk}` (patch line {self.patch_line}) does not match upstream"]
        if self.expected is not None:
            lines.append(f"  patch expects: {self.expected.strip()}")
        if self.found is not None:
            lines.append(f"  upstream has:  {self.found.strip()}  (line {self.upstream_line})")
        else:
            lines.append(f"  upstream has:  nothing more (line {self.upstream_line})")
        if self.note:
            lines.append(f"  {self.note}")
        lines.append("  upstream around it:")
        for number, text in self.around:
            mark = ">" if number == self.upstream_line else " "
            lines.append(f"  {mark}{number:6d} | {text}")
        return "\n".join(lines)


def _exact_at(needle: Sequence[str], hay: Sequence[str]) -> list[int]:
    if not needle:
        return []
    first = needle[0]
    return [
        p
        for p in range(len(hay) - len(needle) + 1)
        if hay[p] == first and list(hay[p : p + len(needle)]) == list(needle)
    ]


#: Extra upstream lines after a candidate position that a drifted hunk may still reach (lines inserted).
_SLACK = 3


def locate_drift(path: str, hunk: Hunk, upstream: Sequence[str], expected_at: int) -> Drift | None:
    """None when the hunk's old side is in ``upstream`` verbatim; else where and how it differs."""
    old = hunk.old_lines
    if _exact_at(old, upstream):
        return None
    # Every distinctive hunk line found upstream proposes where the hunk would start; the proposal whose
    # window shares the most lines with the hunk wins, the nearest to where git expected it on a tie.
    index: dict[str, list[int]] = {}
    for number, text in enumerate(upstream):
        index.setdefault(text.strip(), []).append(number)
    starts = {
        n - i for i, text in enumerate(old) if len(text.strip()) >= 4 for n in index.get(text.strip(), ())
    }
    note = "" if starts else "no line of this hunk occurs in the upstream file any more"
    starts.add(min(max(expected_at, 0), max(len(upstream) - 1, 0)))

    def fit(start: int) -> tuple[int, int, int]:
        window = upstream[max(start, 0) : max(start, 0) + len(old) + _SLACK]
        matcher = difflib.SequenceMatcher(None, old, window, autojunk=False)
        return sum(block.size for block in matcher.get_matching_blocks()), -abs(start - expected_at), start

    matched, _, start = max(fit(s) for s in starts)
    if matched <= 1 and len(old) > 2 and not note:
        note = "at most one line of this hunk is still together upstream: the code moved or was rewritten"
    lo = max(start, 0)
    window = list(upstream[lo : lo + len(old) + _SLACK])
    matcher = difflib.SequenceMatcher(None, old, window, autojunk=False)
    i_diff, j_diff = len(old), min(max(start - lo, 0) + len(old), len(window))
    for tag, i1, _i2, j1, _j2 in matcher.get_opcodes():
        # Window lines before the hunk's first line or after its last are not part of the comparison.
        if tag == "equal" or (tag == "insert" and i1 in (0, len(old))):
            continue
        i_diff, j_diff = i1, j1
        break
    expected = old[i_diff] if i_diff < len(old) else None
    upstream_index = lo + j_diff
    found = upstream[upstream_index] if upstream_index < len(upstream) else None
    if expected is not None and found is not None and expected.strip() == found.strip() and expected != found:
        note = note or "the lines differ only in whitespace"
    elif expected is not None and not note and len(expected.strip()) >= 4:
        elsewhere = [n + 1 for n in index.get(expected.strip(), []) if abs(n - upstream_index) > 0]
        if elsewhere:
            note = f"the expected line occurs upstream at line(s) {', '.join(map(str, elsewhere[:5]))}"
        else:
            note = "the expected line occurs nowhere upstream"
    first = max(upstream_index - 3, 0)
    around = tuple((n + 1, upstream[n]) for n in range(first, min(upstream_index + 4, len(upstream))))
    return Drift(
        path=path,
        hunk=hunk.header,
        patch_line=hunk.line + 1 + _body_offset(hunk, i_diff),
        expected=expected,
        found=found,
        upstream_line=upstream_index + 1,
        around=around,
        note=note,
    )


def _body_offset(hunk: Hunk, old_index: int) -> int:
    """The index in hunk.body of the ``old_index``-th old-side line (for pointing into the patch file)."""
    seen = -1
    for k, text in enumerate(hunk.body):
        if text[:1] in (" ", "-"):
            seen += 1
            if seen == old_index:
                return k
    return len(hunk.body)


__all__ = [
    "Drift",
    "locate_drift",
]
