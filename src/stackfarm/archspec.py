"""GPU architectures as matrix.toml and every tool spell them: one spelling in, one `Arch` out.

matrix.toml, cuobjdump, the fatbin headers and SGLang's tables all name architectures differently
(``sm_120``, ``sm120``, ``12.0``, ``120``, ``(12, 0)``, ``compute_90a``); everything past `parse_arch` sees one
`Arch`. A declaration, on the ground floor: the matrix's schema (stackfarm.matrix_tables) reads its targets
with it, and the analysis readers (stackfarm.analysis.arch adds NVIDIA's compatibility rules) work on it; in
stackfarm.analysis it made the configuration layer stand on the analysis package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Variant = Literal["", "a", "f"]
#: Suffix text -> Variant (the regexes below only ever capture these three).
VARIANTS: dict[str, Variant] = {"": "", "a": "a", "f": "f"}

_SM = re.compile(r"^(?:sm|compute)_?(\d{1,3})([af]?)$")
_DOTTED = re.compile(r"^(\d{1,2})\.(\d)([af]?)$")
_BARE = re.compile(r"^(\d{1,3})([af]?)$")
_PAIR = re.compile(r"^\(\s*(\d{1,2})\s*,\s*(\d)\s*\)$")


class ArchError(ValueError):
    """An architecture spelling that cannot be read; the message says which spellings work."""


@dataclass(frozen=True, order=True)
class Arch:
    """A compute capability, optionally with the ``a`` (arch-specific) or ``f`` (family) suffix of a build target."""

    major: int
    minor: int
    variant: Variant = ""

    @property
    def sm(self) -> int:
        """``major * 10 + minor``: the number in ``sm_120``, and the key style of some SGLang tables."""
        return self.major * 10 + self.minor

    @property
    def device(self) -> Arch:
        """The GPU this names: a GPU has no suffix (an sm_90a build target runs on an sm_90 GPU)."""
        return Arch(self.major, self.minor)

    def __str__(self) -> str:
        return f"sm_{self.sm}{self.variant}"


def _from_sm(number: int, variant: str, text: str) -> Arch:
    # Two digits are sm_XY (sm_90 -> 9.0); three are sm_XXY (sm_120 -> 12.0). Numbers below 30 are no CUDA
    # architecture stackfarm can meet; 10..12 are almost surely a major (12 for sm_120), so say that.
    if number < 30:
        hint = f": a bare major is ambiguous, write sm_{number}0 or {number}.0" if number >= 5 else ""
        raise ArchError(f"architecture {text!r} is not a CUDA architecture{hint}")
    return Arch(number // 10, number % 10, VARIANTS[variant])


def parse_arch(value: object) -> Arch:
    """Read an architecture in any common spelling: ``sm_120``, ``sm120``, ``SM_120a``, ``compute_90a``,
    ``12.0`` (or the float 12.0), ``120`` (or the int 120), ``(12, 0)`` (a tuple too, as from ``get_device_capability``).

    A bare major such as ``12`` is rejected: it cannot tell sm_120 from sm_121.
    """
    if isinstance(value, Arch):
        return value
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return Arch(value[0], value[1])
    if isinstance(value, float):
        value = repr(value)  # TOML reads `12.0` as a float; its repr is the dotted spelling
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ArchError(
            f"architecture {value!r}: expected a string such as 'sm_120', not {type(value).__name__}"
        )
    text = str(value).strip()
    lowered = text.lower()
    if match := _SM.match(lowered):
        return _from_sm(int(match.group(1)), match.group(2), text)
    if match := _DOTTED.match(lowered):
        return Arch(int(match.group(1)), int(match.group(2)), VARIANTS[match.group(3)])
    if match := _PAIR.match(lowered):
        return Arch(int(match.group(1)), int(match.group(2)))
    if match := _BARE.match(lowered):
        return _from_sm(int(match.group(1)), match.group(2), text)
    raise ArchError(
        f"architecture {text!r} is not understood; write it as sm_120, sm_90a, 12.0, 120 or (12, 0)"
    )


def parse_target(value: object) -> Arch:
    """A target GPU from matrix.toml: like `parse_arch`, but a build suffix is dropped (an sm_90a GPU is sm_90)."""
    return parse_arch(value).device


__all__ = ["VARIANTS", "Arch", "ArchError", "Variant", "parse_arch", "parse_target"]
