"""The upgrade planner's answer (stackfarm.upgrade_plan.UpgradePlan) as a terminal table, a markdown and an HTML page
(a timeline of the releases with their blockers), JSON, and the matrix file of the cells that finish the proof.

The matrix file is the start matrix with its cells replaced: ``[axes]`` holds the start cell, one
``[[include]]`` the recommended one, ``[patches.*]`` only the sets those two cells apply (each one's
``applies_to`` covering exactly them), ``[targets]`` the planner's arch and reference, ``[[models]]`` the
planner's models and one ``[runners.*]`` kind for the server (arch, GPUs, driver). Everything else (indexes,
routes, suites, features, thresholds, Docker) is kept as the start matrix has it, comments included. It must
sit beside the start matrix: a matrix finds ``patches/`` and ``suites/`` in its own folder. It is loaded and
planned (`stackfarm.matrix.load`, `stackfarm.plan.expand`) before it is kept, so a file that would not load
is an error here, never the user's surprise.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import tomlkit
from packaging.version import Version
from rich.table import Table

from .errors import StackfarmError
from .files import write_atomic
from .matrix import Matrix, Runner, load
from .plan import expand
from .sections.grid import COLOURS
from .stack import cell_id
from .upgrade_plan import Blocker, Candidate, Options, Recommendation, Span, UpgradePlan

_BADGE = {"pass": "passed", "open": "incomplete", "fail": "failed", "unavailable": "error"}
_ICON = {"pass": "✅", "open": "🟡", "fail": "❌", "unavailable": "💥"}


def _stack(c: Candidate) -> str:
    v = c.values
    return (
        f"torch {v.get('torch', '?')} · kernel {v.get('sgl_kernel', '?')} · flashinfer "
        f"{v.get('flashinfer', '?')} · CUDA {v.get('cuda', '?')}"
    )


def _status(c: Candidate, start: Candidate) -> str:
    """The status, and "as today" for a failure the start cell has too (nothing new)."""
    same = c is not start and c.status == "fail" and not c.new_failures
    return f"{_ICON[c.status]} {c.status}" + (" (as today)" if same else "")


def _patches(c: Candidate) -> str:
    return ", ".join(f"{p.chosen or p.member} {p.verdict}" for p in c.patches) or "none"


def _blockers(c: Candidate, *, new_only: bool = False) -> list[Blocker]:
    return [b for b in c.blockers if not (new_only and b.current)]


def terminal(plan: UpgradePlan) -> Table:
    """One row per release: its stack, its status, its new blockers, its patch verdicts."""
    table = Table(title=f"upgrade from {plan.start.cell} on {plan.options.arch}", show_lines=False)
    for head in ("sglang", "stack", "status", "blockers (new)", "patches"):
        table.add_column(head, overflow="fold")
    rec = plan.recommendation.release
    for c in (plan.start, *plan.candidates):
        new = _blockers(c, new_only=c is not plan.start)
        shown = "; ".join(b.title for b in new[:3]) + (f" (+{len(new) - 3})" if len(new) > 3 else "")
        name = c.sglang + (" (now)" if c is plan.start else "") + (" ⇐" if c.sglang == rec else "")
        table.add_row(name, _stack(c), _status(c, plan.start), shown or "-", _patches(c))
    return table


def summary_lines(plan: UpgradePlan) -> list[str]:
    """The recommendation and the cost, as the command prints them under the table."""
    r = plan.recommendation
    lines = []
    if r.release is None:
        lines.append(f"no recommendation: {r.reason}")
    else:
        lines.append(f"recommended: sglang {r.release} = {r.cell}")
        lines.append(f"  why: {r.reason}")
        lines += [f"  carry: {p}" for p in r.carry] or ["  carry: no patch"]
        lines += [f"  retire: {p}" for p in r.retire]
        lines += [f"  still failing today and there (not new): {t}" for t in r.accepted]
        lines += [f"  open (the GPU cells answer it): {t}" for t in r.open]
        lines.append(
            f"  proof: run {', '.join(r.proof)} on the GPU runner"
            + (f": nox -s matrix -- --matrix {plan.matrix}" if plan.matrix else "")
        )
    lines.append(
        f"static rows: {plan.computed} computed, {plan.reused} from the cache; {plan.seconds:.1f}s in all"
    )
    return lines


# --------------------------------------------------------------------------- markdown


def _md_blocker(b: Blocker) -> list[str]:
    tag = "current" if b.current else "new"
    where = ", ".join(f"`{s}`" for s in b.sites[:6]) + (f" (+{len(b.sites) - 6})" if len(b.sites) > 6 else "")
    out = [f"- **{b.title}** ({b.kind}, {b.outcome}, {tag})" + (f" at {where}" if where else "")]
    out.append(f"  - {b.message.replace(chr(10), ' ')[:700]}")
    out += [f"  - patch: {f}" for f in b.fixes]
    return out


def markdown(plan: UpgradePlan) -> str:
    lines = (
        _md_head(plan)
        + _md_recommendation(plan)
        + _md_releases(plan)
        + _md_spans(plan)
        + _md_per_release(plan)
    )
    lines.append(f"{plan.computed} static rows computed, {plan.reused} from the cache, {plan.seconds:.1f}s.")
    return "\n".join(lines) + "\n"


def _md_head(plan: UpgradePlan) -> list[str]:
    o = plan.options
    return [
        f"# Upgrade plan from `{plan.start.cell}`",
        "",
        f"On {o.arch} (reference {o.reference or '-'}), {o.gpus} GPU(s), driver {o.driver or 'not given'}, "
        f"models {', '.join(m.name for m in o.models) or '-'}, patch sets "
        f"{', '.join(ps.name for ps in o.sets) or '-'}. Static verdicts only (patches, 10-capability, EAGLE-3 "
        "contract, pins, driver floor): the GPU cells below finish the proof.",
        "",
        "## Recommendation",
        "",
    ]


def _md_recommendation(plan: UpgradePlan) -> list[str]:
    r = plan.recommendation
    if r.release is None:
        return [f"None: {r.reason}.", ""]
    lines = [f"**sglang {r.release}**: `{r.cell}`. {r.reason}.", ""]
    lines += [f"- carry: {p}" for p in r.carry] or ["- carry: no patch"]
    lines += [f"- retire: {p}" for p in r.retire]
    lines += [f"- fails today too (not new): {t}" for t in r.accepted]
    lines += [f"- open, for the GPU cells: {t}" for t in r.open]
    run = f" (`nox -s matrix -- --matrix {plan.matrix}`)" if plan.matrix else ""
    return [*lines, f"- proof: {', '.join(f'`{c}`' for c in r.proof)}{run}", ""]


def _md_releases(plan: UpgradePlan) -> list[str]:
    lines = [
        "## Releases",
        "",
        "| sglang | stack | status | new blockers | patches | GPU verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in (plan.start, *plan.candidates):
        new = _blockers(c, new_only=c is not plan.start)
        text = "; ".join(b.title for b in new) or "-"
        lines.append(
            f"| {c.sglang}{' (now)' if c is plan.start else ''} | {_stack(c)} | {_status(c, plan.start)} "
            f"| {text} | {_patches(c)} | {c.stored or '-'} |"
        )
    return lines


def _md_spans(plan: UpgradePlan) -> list[str]:
    lines = [
        "",
        "## Blockers: where each appears and goes away",
        "",
        "| blocker | kind | appears | goes away | present in |",
        "|---|---|---|---|---|",
    ]
    for s in plan.spans:
        gone = s.gone or "still in the newest looked at"
        now = " (today too)" if s.current else ""
        lines.append(
            f"| {s.title} | {s.kind} {s.outcome} | {s.appears}{now} | {gone} | {', '.join(s.releases)} |"
        )
    return lines


def _md_per_release(plan: UpgradePlan) -> list[str]:
    lines = ["", "## Per release", ""]
    for c in (plan.start, *plan.candidates):
        lines += [f"### sglang {c.sglang}: {c.status}", "", f"`{c.cell}`; " + "; ".join(c.notes), ""]
        for b in c.blockers:
            lines += _md_blocker(b)
        lines += [f"- fixed by {', '.join(f.by)}: {f.title}" for f in c.fixed]
        lines += [
            f"- patch set {p.chosen or p.member}: {p.verdict}" + (f" ({p.note})" if p.note else "")
            for p in c.patches
        ]
        lines.append("")
    return lines


# --------------------------------------------------------------------------- HTML

_CSS = (
    "body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1f2328}table{border-collapse:collapse;"
    "margin:6px 0}th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}"
    "thead th{background:#f6f8fa}code{font:12px ui-monospace,monospace}.badge{padding:1px 8px;"
    "border-radius:10px;font-weight:600;font-size:12px;color:#fff}.muted{color:#57606a}"
    "td.bar{min-width:14px;padding:0}td.on{background:#cf222e}td.open{background:#bf8700}td.cur{background:#8c959f}"
)


def _badge(status: str) -> str:
    colour = COLOURS.get(_BADGE.get(status, status), "#57606a")
    return f'<span class="badge" style="background:{colour}">{html.escape(status)}</span>'


def _html_blocker(b: Blocker) -> str:
    e = html.escape
    sites = " ".join(f"<code>{e(s)}</code>" for s in b.sites[:6])
    fixes = "".join(f"<li>patch: {e(f)}</li>" for f in b.fixes)
    tag = "current" if b.current else "new"
    return (
        f"<li><b>{e(b.title)}</b> <span class=muted>({e(b.kind)}, {e(b.outcome)}, {tag})</span> {sites}"
        f"<ul><li>{e(b.message[:900])}</li>{fixes}</ul></li>"
    )


def page(plan: UpgradePlan) -> str:
    """The HTML page: the recommendation, the releases, then the blocker timeline as a strip per blocker."""
    e = html.escape
    order = [plan.start, *plan.candidates]
    rec = _html_recommendation(plan.recommendation)
    rows = "".join(_html_row(c, plan.start) for c in order)
    head = "".join(f"<th>{e(c.sglang)}</th>" for c in order)
    strip = "".join(_html_strip(s, order) for s in plan.spans)
    details = "".join(_html_details(c) for c in order)
    body = (
        f"<h1>Upgrade plan from <code>{e(plan.start.cell)}</code></h1>"
        f"<p class=muted>{e(plan.options.arch)}, {plan.options.gpus} GPU(s), driver "
        f"{e(plan.options.driver or 'not given')}; static verdicts only</p><h2>Recommendation</h2>{rec}"
        "<h2>Releases</h2><table><thead><tr><th>sglang</th><th>stack</th><th>status</th><th>new blockers</th>"
        f"<th>patches</th><th>GPU verdict</th></tr></thead><tbody>{rows}</tbody></table>"
        f"<h2>Timeline of blockers</h2><table><thead><tr><th>blocker</th>{head}</tr></thead><tbody>{strip}"
        "</tbody></table><p class=muted>red: fails (new), amber: open, grey: fails today too</p>"
        f"<h2>Per release</h2>{details}"
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>upgrade plan</title>'
        f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def _html_recommendation(r: Recommendation) -> str:
    e = html.escape
    if not r.release:
        return f"<p>None: {e(r.reason)}.</p>"
    return (
        f"<p><b>sglang {e(r.release)}</b>: <code>{e(r.cell or '')}</code>. {e(r.reason)}.</p><ul>"
        + "".join(f"<li>carry: {e(p)}</li>" for p in r.carry)
        + "".join(f"<li>retire: {e(p)}</li>" for p in r.retire)
        + "".join(f"<li>fails today too: {e(t)}</li>" for t in r.accepted)
        + "".join(f"<li>open: {e(t)}</li>" for t in r.open)
        + f"<li>proof: {e(', '.join(r.proof))}</li></ul>"
    )


def _html_row(c: Candidate, start: Candidate) -> str:
    e = html.escape
    return (
        f"<tr><td>{e(c.sglang)}</td><td>{e(_stack(c))}</td><td>{_badge(c.status)}</td>"
        f"<td>{e('; '.join(b.title for b in _blockers(c, new_only=c is not start)) or '-')}</td>"
        f"<td>{e(_patches(c))}</td><td>{e(c.stored or '-')}</td></tr>"
    )


def _bar(s: Span, c: Candidate) -> str:
    """One release's square of a blocker's strip: grey today too, red failing, amber open, blank absent."""
    if c.sglang not in s.releases:
        return ""
    return "cur" if s.current else "on" if s.outcome == "fail" else "open"


def _html_strip(s: Span, order: Sequence[Candidate]) -> str:
    e = html.escape
    cells = "".join(f'<td class="bar {_bar(s, c)}"></td>' for c in order)
    return f"<tr><td>{e(s.title)}<br><span class=muted>{e(s.appears)} → {e(s.gone or '…')}</span></td>{cells}</tr>"


def _html_details(c: Candidate) -> str:
    e = html.escape
    return (
        f"<h3>sglang {e(c.sglang)} {_badge(c.status)}</h3><p class=muted><code>{e(c.cell)}</code>; "
        f"{e('; '.join(c.notes))}</p><ul>{''.join(_html_blocker(b) for b in c.blockers)}"
        + "".join(f"<li>fixed by {e(', '.join(f.by))}: {e(f.title)}</li>" for f in c.fixed)
        + "".join(
            f"<li>patch set {e(p.chosen or p.member)}: {e(p.verdict)} {e(p.note)}</li>" for p in c.patches
        )
        + "</ul>"
    )


# --------------------------------------------------------------------------- JSON and files


def to_json(plan: UpgradePlan) -> dict[str, Any]:
    data = asdict(plan)
    opts = data["options"]
    opts["sets"] = [ps.name for ps in plan.options.sets]
    opts["models"] = [m.name for m in plan.options.models]
    opts["reports"] = str(plan.options.reports) if plan.options.reports else None
    return data


def json_text(plan: UpgradePlan) -> str:
    return json.dumps(to_json(plan), indent=1, sort_keys=True, default=str) + "\n"


def write(plan: UpgradePlan, out: Path) -> list[Path]:
    """upgrade.md, upgrade.html and upgrade.json under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "upgrade.md", out / "upgrade.html", out / "upgrade.json"]
    write_atomic(paths[0], markdown(plan))
    write_atomic(paths[1], page(plan))
    write_atomic(paths[2], json_text(plan))
    return paths


# --------------------------------------------------------------------------- the proof matrix


def _applies(versions: Sequence[str]) -> str:
    return (
        ",".join(f"=={v}" for v in versions)
        if len(versions) == 1
        else (f">={min(versions, key=_key)},<={max(versions, key=_key)}")
    )


def _key(text: str) -> Version:
    return Version(text)


def proof_matrix(plan: UpgradePlan, matrix: Matrix, path: Path) -> Path:
    """Write the matrix of the proof cells to `path` (beside `matrix`), load and plan it; raise on a file
    that does not load, and remove it."""
    r = plan.recommendation
    if r.release is None or r.cell is None:
        raise StackfarmError("no recommendation: there is no proof matrix to write")
    if path.resolve().parent != matrix.path.resolve().parent:
        raise StackfarmError(
            f"{path}: the proof matrix must sit beside {matrix.path} (a matrix finds patches/ "
            f"and suites/ in its own folder)\n  fix: --write-matrix {matrix.root / path.name}"
        )
    doc = tomlkit.parse(matrix.path.read_text(encoding="utf-8"))
    for key in ("axes", "couple", "include", "exclude", "patches", "runners", "models", "targets"):
        doc.pop(key, None)
    start, best = plan.start, next(c for c in plan.candidates if c.sglang == r.release)
    doc["axes"] = _axes_table(start)
    doc["include"] = _include_table(start, best)
    targets = _targets_table(plan.options, matrix)
    doc["targets"] = targets
    if plan.options.models:
        doc["models"] = _models_table(plan.options)
    doc["patches"] = _patch_tables(plan, best)
    doc["runners"] = _runner_table(plan, matrix, (start.cell, best.cell), list(targets["archs"]))
    text = (
        f"# Written by `stackfarm plan-upgrade --from {start.cell}`: the cells that finish the proof of its\n"
        f"# recommendation (sglang {r.release}). Run: nox -s matrix -- --matrix {path.name}\n"
        f"# [axes], [[include]], [targets], [[models]], [patches.*] and [runners.*] are the planner's; the rest,\n"
        f"# comments included, is {matrix.path.name}'s.\n\n" + tomlkit.dumps(doc)
    )
    write_atomic(path, text)
    _check_proof(path, (start.cell, best.cell))
    return path


def _axes_table(start: Candidate) -> Any:
    """``[axes]``: the start cell, one value per axis."""
    axes = tomlkit.table()
    for axis, value in start.values.items():
        axes[axis] = [value]
    return axes


def _include_table(start: Candidate, best: Candidate) -> Any:
    """``[[include]]``: the recommended cell (its python is the start cell's)."""
    include = tomlkit.aot()
    row = tomlkit.table()
    for axis, value in best.values.items():
        if axis != "python":
            row[axis] = value
    row["reason"] = f"the upgrade planner's recommendation from {start.cell}"
    include.append(row)
    return include


def _targets_table(o: Options, matrix: Matrix) -> Any:
    """``[targets]``: the planner's arch and reference first, then the start matrix's archs."""
    targets = tomlkit.table()
    targets["archs"] = list(dict.fromkeys([o.arch, *([o.reference] if o.reference else []), *matrix.archs]))
    if o.reference:
        targets["reference"] = o.reference
    return targets


def _models_table(o: Options) -> Any:
    models = tomlkit.aot()
    for m in o.models:
        entry = tomlkit.table()
        entry.update({"name": m.name, "target": m.target, "draft": m.draft})
        models.append(entry)
    return models


def _check_proof(path: Path, cells: tuple[str, str]) -> None:
    """Load and plan the written file; remove it and raise when it does not load or lacks one of `cells`."""
    try:
        written = load(path)
        kept, _, _ = expand(written)
    except StackfarmError:
        path.unlink(missing_ok=True)
        raise
    ids = {cell_id(v, with_python=len(written.axes["python"]) > 1) for v, _ in kept}
    if not set(cells) <= ids:
        path.unlink(missing_ok=True)
        raise StackfarmError(
            f"{path}: plans {sorted(ids)}, not {cells[0]} and {cells[1]} (a bug of the planner)"
        )


def _patch_tables(plan: UpgradePlan, best: Candidate) -> Any:
    uses: dict[str, list[str]] = {}
    for cand in (plan.start, best):
        for choice in cand.patches:
            if choice.chosen:
                uses.setdefault(choice.chosen, []).append(cand.sglang)
            elif choice.verdict == "partial":
                raise StackfarmError(
                    f"patch set {choice.member} is partly upstream on sglang {cand.sglang}: "
                    f"{choice.note}; make a set of {', '.join(choice.keep)} first"
                )
    optional = {ps.name: ps.optional for ps in plan.options.sets}
    table = tomlkit.table(is_super_table=True)
    for name in (ps.name for ps in plan.options.sets if ps.name in uses):
        entry = tomlkit.table()
        entry["applies_to"] = f"sglang{_applies(sorted(set(uses[name]), key=_key))}"
        if optional.get(name):
            entry["optional"] = True
        table[name] = entry
    return table


def _runner_table(plan: UpgradePlan, matrix: Matrix, cells: Sequence[str], archs: Sequence[str]) -> Any:
    """The server's runner kind first (the start matrix's kind of that arch and GPU count, so its
    [thresholds] still apply; else ``<gpus>x-<arch>``) taking the proof cells, then the start matrix's other
    kinds of the target archs as they were."""
    o = plan.options
    same = next((r for r in matrix.runners.values() if r.arch == o.arch and r.gpus == o.gpus), None)
    kind = same.name if same is not None else f"{o.gpus}x-{o.arch.replace('_', '')}"
    table = tomlkit.table(is_super_table=True)
    table[kind] = _server_runner(o, same, cells)
    for other in matrix.runners.values():
        if other.name == kind or other.arch not in archs:
            continue
        entry = tomlkit.table()
        entry.update(
            {"arch": other.arch, "gpus": other.gpus, "labels": list(other.labels), "cells": list(other.cells)}
        )
        if other.driver:
            entry["driver"] = other.driver
        table[other.name] = entry
    return table


def _server_runner(o: Options, same: Runner | None, cells: Sequence[str]) -> Any:
    """The server's runner kind: the planner's arch, GPUs and driver, the labels of the start matrix's kind
    of that arch and GPU count (`same`) when it has one."""
    runner = tomlkit.table()
    runner["arch"] = o.arch
    runner["gpus"] = o.gpus
    runner["labels"] = (
        list(same.labels) if same else ["self-hosted", "linux", "x64", o.arch, f"gpus-{o.gpus}"]
    )
    runner["cells"] = list(dict.fromkeys(cells))
    driver = o.driver or (same.driver if same else None)
    if driver:
        runner["driver"] = driver
    if o.forward_compat:
        runner["forward_compat"] = True
    return runner


__all__ = ["json_text", "markdown", "page", "proof_matrix", "summary_lines", "terminal", "to_json", "write"]
