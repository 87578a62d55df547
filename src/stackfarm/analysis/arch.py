"""GPU architectures: the rules for which code runs on which GPU, over stackfarm.archspec's `Arch`.

The spellings (``sm_120``, ``12.0``, ``compute_90a``, ...) and `parse_arch` are stackfarm.archspec's, a ground
floor module the matrix's schema reads too; they are handed on here for the analysis readers. The compatibility
rules are NVIDIA's (CUDA C Programming Guide, "Binary Compatibility" and "Feature Availability"):

- SASS built for ``sm_XY`` runs on ``sm_XZ`` for ``Z >= Y`` (same major); ``sm_XYf`` (family) the same;
  ``sm_XYa`` (arch-specific features) only on exactly ``sm_XY``;
- PTX for ``compute_XY`` is JIT-compiled by the driver for any GPU at or above ``XY``; ``compute_XYf`` only
  within its family (same major), ``compute_XYa`` only on exactly ``sm_XY``.
"""

from __future__ import annotations

from stackfarm.archspec import VARIANTS, Arch, ArchError, Variant, parse_arch, parse_target


def sass_runs_on(code: Arch, gpu: Arch) -> bool:
    """Whether a cubin built for `code` runs on `gpu` without recompilation."""
    if code.variant == "a":
        return (code.major, code.minor) == (gpu.major, gpu.minor)
    return code.major == gpu.major and code.minor <= gpu.minor


def ptx_jits_on(code: Arch, gpu: Arch) -> bool:
    """Whether PTX for `code` can be JIT-compiled by the driver for `gpu`."""
    if code.variant == "a":
        return (code.major, code.minor) == (gpu.major, gpu.minor)
    if code.variant == "f":
        return code.major == gpu.major and code.minor <= gpu.minor
    return (code.major, code.minor) <= (gpu.major, gpu.minor)


__all__ = [
    "VARIANTS",
    "Arch",
    "ArchError",
    "Variant",
    "parse_arch",
    "parse_target",
    "ptx_jits_on",
    "sass_runs_on",
]
