"""Running git: ``git apply`` on a tree, and git-format diffs of one file (``make_patch``).

Git runs with no user or system configuration, so diff.noprefix, color.ui and the like change nothing, and
a ceiling directory keeps it from discovering a repository above the tree.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import StackfarmError
from ..proc import Outcome, call

_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}


def _git(args: Sequence[str | Path], cwd: Path) -> Outcome:
    # The ceiling keeps git from discovering a repository above the tree: paths stay relative to `cwd`.
    env = {**_GIT_ENV, "GIT_CEILING_DIRECTORIES": str(cwd.resolve().parent)}
    return call(["git", *args], cwd=cwd, env=env, timeout=120)


def _git_apply(patch: Path, root: Path, *, reverse: bool = False, check: bool = False) -> Outcome:
    args: list[str | Path] = ["apply", "-p1", "--whitespace=nowarn"]
    if reverse:
        args.append("--reverse")
    if check:
        args.append("--check")
    args.append(patch.resolve())
    return _git(args, root)


def make_patch(path: str, old: str, new: str, headers: Mapping[str, str] | None = None) -> str:
    """A git-format diff of one file (``a/<path>`` -> ``b/<path>``), with DEP-3 headers when given."""
    with tempfile.TemporaryDirectory(prefix="stackfarm-diff-") as tmp:
        root = Path(tmp)
        (root / "old" / path).parent.mkdir(parents=True)
        (root / "new" / path).parent.mkdir(parents=True)
        (root / "old" / path).write_text(old, encoding="utf-8")
        (root / "new" / path).write_text(new, encoding="utf-8")
        out = _git(
            [
                "diff",
                "--no-index",
                "--no-prefix",
                "--no-color",
                "--no-ext-diff",
                "-U3",
                f"old/{path}",
                f"new/{path}",
            ],
            root,
        )
    if out.returncode not in (0, 1):
        raise StackfarmError(f"git diff --no-index failed for {path}:\n{out.output}")
    body = _rewrite_diff(out.output, path)
    return (_format_headers(headers) if headers else "") + body


def _rewrite_diff(text: str, path: str) -> str:
    """git's --no-index output, renamed from old/ new/ to the a/ b/ wheel paths; the index line dropped."""
    out = []
    for line in text.splitlines():
        if line.startswith("index "):
            continue  # blob ids of scratch files mean nothing to a reader and git apply does not need them
        if line.startswith("diff --git "):
            out.append(f"diff --git a/{path} b/{path}")
        elif line.startswith("--- old/"):
            out.append(f"--- a/{path}")
        elif line.startswith("+++ new/"):
            out.append(f"+++ b/{path}")
        else:
            out.append(line)
    return "\n".join(out) + "\n" if out else ""


def _format_headers(headers: Mapping[str, str]) -> str:
    lines = []
    for key, value in headers.items():
        first, *rest = value.splitlines() or [""]
        lines.append(f"{key}: {first}".rstrip())
        lines.extend(f" {more}" if more.strip() else " ." for more in rest)
    return "\n".join(lines) + "\n---\n"


__all__ = [
    "make_patch",
]
