"""Patch series per SGLang version: validate, check, apply, detect drift and obsolescence, port forward.

A patch set is a quilt-style folder ``patches/<set>/`` holding ``series`` (one patch file name per line, in
order) and ``NNNN-<name>.patch`` files: DEP-3 headers (Description, Origin, Forwarded, optionally
Applied-Upstream), then a git-format diff against the unpacked wheel tree (``a/sglang/srt/...``, applied
with -p1 at the wheel root). matrix.toml's ``[patches.<set>]`` gives the versions it applies to.

The modules, in the order a patch meets them:

* ``model`` -- patches parsed into files and hunks, DEP-3 headers, series files, validation of sets;
* ``git`` -- running ``git apply``, and git-format diffs of one file (``make_patch``);
* ``drift`` -- where a hunk's context stopped matching upstream;
* ``upstream`` -- the definitions a patch adds, and whether a release defines them itself;
* ``status`` -- the status of every patch on a tree: check, apply, a patched copy (see its docstring);
* ``port`` -- a three-way forward port of a set to another release, and resolving its conflicts;
* ``table`` -- the check table: many releases, each set in and past its range;
* ``trees`` -- unpacked sglang wheels, through the resolver and the shared artifact cache.

``git apply`` never fuzzes: a hunk applies where its whole context matches, or not at all. The command line
(``stackfarm patches check|port|resolve``, in ``stackfarm.cli.patches``) previews upgrades and carries sets
forward.
"""

from __future__ import annotations

from .drift import Drift, locate_drift
from .git import make_patch
from .model import (
    DISTRIBUTION,
    MARKER,
    REQUIRED_HEADERS,
    FilePatch,
    Hunk,
    Patch,
    PatchResult,
    Status,
    load_series,
    parse_patch,
    read_series,
    set_hash,
    sets_for,
    validate_sets,
)
from .port import (
    Conflict,
    PortedPatch,
    PortResult,
    format_port,
    port_series,
    port_set,
    resolve_conflicts,
    verify_ported,
    write_ported,
)
from .status import (
    apply_sets,
    check_sets,
    failure_message,
    failures,
    junit_properties,
    patched_copy,
    tree_version,
)
from .table import CheckRow, below_range, check_versions, download_order, format_table, pick_versions
from .trees import available_versions, sglang_trees
from .upstream import added_definitions, defined_in, upstream_evidence

__all__ = [
    "DISTRIBUTION",
    "MARKER",
    "REQUIRED_HEADERS",
    "CheckRow",
    "Conflict",
    "Drift",
    "FilePatch",
    "Hunk",
    "Patch",
    "PatchResult",
    "PortResult",
    "PortedPatch",
    "Status",
    "added_definitions",
    "apply_sets",
    "available_versions",
    "below_range",
    "check_sets",
    "check_versions",
    "defined_in",
    "download_order",
    "failure_message",
    "failures",
    "format_port",
    "format_table",
    "junit_properties",
    "load_series",
    "locate_drift",
    "make_patch",
    "parse_patch",
    "patched_copy",
    "pick_versions",
    "port_series",
    "port_set",
    "read_series",
    "resolve_conflicts",
    "set_hash",
    "sets_for",
    "sglang_trees",
    "tree_version",
    "upstream_evidence",
    "validate_sets",
    "verify_ported",
    "write_ported",
]
