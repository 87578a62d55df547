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
* ``table`` -- the check table: many releases, each set in and past its range.

The unpacked sglang wheels they work on come from ``stackfarm.sglangtrees`` (through the resolver and the shared
artifact cache), which stands above this package.

``git apply`` never fuzzes: a hunk applies where its whole context matches, or not at all. The command line
(``stackfarm patches check|port|resolve``, in ``stackfarm.cli.patches``) previews upgrades and carries sets
forward.

The face is what the rest of stackfarm uses: the runner (load_series, patched_copy), `stackfarm upgrade`
(check_sets, set_hash) and the command line; everything else is imported from its module. It re-exported 44 names.
"""

from __future__ import annotations

from .model import load_series, set_hash
from .port import format_port, port_set, resolve_conflicts, verify_ported
from .status import check_sets, patched_copy
from .table import check_versions, download_order, format_table, pick_versions

__all__ = [
    "check_sets",
    "check_versions",
    "download_order",
    "format_port",
    "format_table",
    "load_series",
    "patched_copy",
    "pick_versions",
    "port_set",
    "resolve_conflicts",
    "set_hash",
    "verify_ported",
]
