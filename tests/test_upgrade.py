"""`stackfarm plan-upgrade` (stackfarm.upgrade): the walk over the releases after a start cell, on the fake stack
of tests/fakestack.py with four SGLang releases whose wheels hold real (small) SGLang-shaped sources:

- 0.5.9 (the start): Kimi K2.5 lacks the EAGLE-3 target hooks; the patch set ``kimi-hooks`` adds them;
- 0.5.10: a capability table keyed by the compute capability without sm_120's key (KeyError: 12) appears;
- 0.5.11: the table has the key again (the blocker goes away) and upstream holds the hooks (the patch retires);
- 0.5.12: pins a torch built for CUDA 13.0, whose driver floor is above the server's 570 driver.

The planner must name each blocker with its file:line, where it appears and goes away, recommend 0.5.11 with
the patch retired, write a proof matrix that loads and runs, and compute nothing on a second run (every row
from the cache). The pure parts (lineages, the choice of sets, CUDA from torch, the recommendation) are pinned
on their own below.
"""

from __future__ import annotations

import email
import json
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet

from fakestack import OLD, FakeProject, cell_id, write_wheel
from stackfarm import upgrade, upgrade_static
from stackfarm.cli import main
from stackfarm.errors import ExitCode
from stackfarm.matrix import load
from stackfarm.patches.git import make_patch
from stackfarm.patchset import PatchSet
from stackfarm.upgrade import port_check, recommend, timeline, torch_cuda
from stackfarm.upgrade_patches import LineageChoice, PatchStatus, choose, lineages
from stackfarm.upgrade_plan import Blocker, Candidate, Fixed
from test_eagle3 import KIMI_PATCH, KIMI_UNPATCHED, _sglang_tree

pytest_plugins = ("fakestack",)

KIMI = "sglang/srt/models/kimi_k25.py"
SIZES = "sglang/srt/distributed/sizes.py"
TABLE = """
    import torch

    SIZES = {{9: 64, 10: 128{extra}}}


    def size():
        major = torch.cuda.get_device_capability()[0]
        return SIZES[major]
"""
#: The hooks the contract of the synthetic tree asks of a target (test_eagle3's KIMI_PATCH, and lm_head_dtype).
HOOKS = textwrap.dedent(KIMI_PATCH) + "\nlm_head_dtype = None\n"
PATCHED_KIMI = textwrap.dedent(KIMI_UNPATCHED).replace(
    "\n\nEntryClass", textwrap.indent(HOOKS, "    ") + "\n\nEntryClass"
)
#: Per release: (its kimi_k25.py, the table's extra keys or None for no table, its torch pin).
RELEASES = {
    "0.5.9": (textwrap.dedent(KIMI_UNPATCHED), ", 12: 256", "2.9.1"),
    "0.5.10": (textwrap.dedent(KIMI_UNPATCHED), "", "2.9.1"),
    "0.5.11": (PATCHED_KIMI, ", 12: 256", "2.9.1"),
    "0.5.12": (PATCHED_KIMI, ", 12: 256", "2.11.0"),
}
START = cell_id(OLD)
ARGS = ("--arch", "sm_120", "--driver", "570.86.15", "--gpus", "8", "--model", "kimi-k2.5", "--jobs", "1")


def _files(root: Path, version: str, kimi: str, extra: str) -> dict[str, str]:
    tree = _sglang_tree(root / version, version)
    (tree / KIMI).write_text(kimi, encoding="utf-8")
    # what the fake stack's "pass" suite imports: every component names itself
    (tree / "sglang/__init__.py").write_text(f'__version__ = "{version}"\n__distribution__ = "sglang"\n')
    (tree / SIZES).parent.mkdir(parents=True, exist_ok=True)
    (tree / SIZES).write_text(textwrap.dedent(TABLE.format(extra=extra)).lstrip(), encoding="utf-8")
    return {p.relative_to(tree).as_posix(): p.read_text(encoding="utf-8") for p in sorted(tree.rglob("*.py"))}


MATRIX = """
[axes]
cuda = ["12.8"]
torch = ["2.9.1"]
sgl_kernel = ["0.3.21"]
flashinfer = ["0.6.3"]
sglang = ["0.5.9"]
python = ["3.11"]

[indexes.local]
find_links = "wheels"
default = true

[platform]
tag = "manylinux_2_39_x86_64"

[targets]
archs = ["sm_120", "sm_90"]
reference = "sm_90"

[[models]]
name = "kimi-k2.5"
target = "KimiK25ForConditionalGeneration"
draft = "DraftLM"

[patches.kimi-hooks]
applies_to = "sglang>=0.5.9,<0.5.10"

[suites.00-ok]
gate = true

[runners.8x-rtx-pro-6000]
arch = "sm_120"
gpus = 8
labels = ["self-hosted", "sm_120"]
cells = ["*"]
"""


@pytest.fixture
def project(fake_project: FakeProject, tmp_path: Path) -> FakeProject:
    wheels = fake_project.wheels
    pins = ("sgl-kernel==0.3.21", "flashinfer-python==0.6.3")
    for version, (kimi, extra, torch) in RELEASES.items():
        files = _files(tmp_path / "trees", version, kimi, extra)
        write_wheel(wheels, "sglang", version, requires=(f"torch=={torch}", *pins), files=files)
    # torch 2.11.0 is the CUDA 13.0 build: its METADATA requires that CUDA runtime, as the real wheel's does.
    write_wheel(wheels, "torch", "2.11.0", requires=("nvidia-cuda-runtime-cu13==13.0.96",))
    patch = fake_project.root / "patches" / "kimi-hooks"
    patch.mkdir(parents=True)
    headers = {"Description": "EAGLE-3 target hooks for Kimi K2.5", "Origin": "vendor, tests",
               "Forwarded": "not-needed"}  # fmt: skip
    (patch / "0001-kimi-hooks.patch").write_text(
        make_patch(KIMI, textwrap.dedent(KIMI_UNPATCHED), PATCHED_KIMI, headers), encoding="utf-8"
    )
    (patch / "series").write_text("0001-kimi-hooks.patch\n", encoding="utf-8")
    fake_project.suite("00-ok", "pass")
    fake_project.matrix.write_text(MATRIX, encoding="utf-8")
    return fake_project


def plan_upgrade(project: FakeProject, *extra: str) -> tuple[int, Any]:
    code = main(["plan-upgrade", "--matrix", str(project.matrix), "--reports", str(project.reports),
                 "--from", START, *ARGS, *extra])  # fmt: skip
    return code, json.loads((project.reports / "upgrade" / "upgrade.json").read_text(encoding="utf-8"))


def _release(data: Any, version: str) -> Any:
    every = [data["start"], *data["candidates"]]
    return next(c for c in every if c["sglang"] == version)


def test_the_walk_names_blockers_where_they_appear_and_go_away(
    project: FakeProject, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = plan_upgrade(project)
    out = capsys.readouterr().out
    assert code == ExitCode.OK, out
    start = _release(data, "0.5.9")
    assert start["status"] == "pass", start["blockers"]
    assert [(c["lineage"], c["verdict"]) for c in start["patches"]] == [("kimi-hooks", "carry")]
    assert {f["title"] for f in start["fixed"]} >= {
        "EAGLE-3 target KimiK25ForConditionalGeneration: get_embed_and_head missing"
    }
    # 0.5.10: the table without sm_120's key, at its file:line; the patch is carried past its range.
    r10 = _release(data, "0.5.10")
    assert r10["status"] == "fail"
    (table,) = [b for b in r10["blockers"] if b["kind"] == "capability"]
    assert table["sites"] == [f"{SIZES}:8"]
    assert "KeyError: 12" in table["message"]
    assert not table["current"]
    assert [(c["lineage"], c["verdict"]) for c in r10["patches"]] == [("kimi-hooks", "widen")]
    # 0.5.11: the table is fixed upstream, and so are the hooks: the patch retires.
    r11 = _release(data, "0.5.11")
    assert r11["status"] == "pass"
    assert r11["blockers"] == []
    assert [(c["lineage"], c["verdict"]) for c in r11["patches"]] == [("kimi-hooks", "retire")]
    # 0.5.12: torch 2.11.0 is a CUDA 13.0 build; the 570 driver is below its floor.
    r12 = _release(data, "0.5.12")
    assert r12["values"]["torch"] == "2.11.0"
    assert r12["values"]["cuda"] == "13.0"
    assert r12["floor"] == "580.65.06"
    assert [b["title"] for b in r12["blockers"]] == ["driver 570.86.15 < 580.65.06"]
    spans = {s["kind"]: s for s in data["spans"]}
    assert (spans["capability"]["appears"], spans["capability"]["gone"]) == ("0.5.10", "0.5.11")
    assert (spans["driver"]["appears"], spans["driver"]["gone"]) == ("0.5.12", None)
    rec = data["recommendation"]
    assert rec["release"] == "0.5.11"
    assert rec["carry"] == []
    assert rec["retire"] == ["kimi-hooks: upstream holds every patch of it"]
    best = cell_id({**OLD, "sglang": "0.5.11"})
    assert rec["proof"] == [START, best]
    assert "recommended: sglang 0.5.11" in out
    assert "retire: kimi-hooks" in out
    md = (project.reports / "upgrade" / "upgrade.md").read_text(encoding="utf-8")
    assert f"`{SIZES}:8`" in md
    assert "| 0.5.10 |" in md
    assert "Timeline of blockers" in (project.reports / "upgrade" / "upgrade.html").read_text(
        encoding="utf-8"
    )
    assert data["computed"] == 4
    assert data["reused"] == 0
    # The proof matrix loads, plans the two cells with the patch set only where it is carried, and runs.
    proof = project.root / "matrix-upgrade.toml"
    written = load(proof)
    assert {ps.name: str(ps.applies_to) for ps in written.patch_sets} == {"kimi-hooks": "==0.5.9"}
    assert written.runners["8x-rtx-pro-6000"].driver == "570.86.15"
    assert main(["run", "--matrix", str(proof), "--reports", str(project.root / "proof-reports"),
                 "--backend", "local", "--jobs", "1"]) == ExitCode.OK  # fmt: skip
    assert {cell for cell, _ in project.runs()} == {START, best}


def test_a_second_run_computes_nothing(project: FakeProject, monkeypatch: pytest.MonkeyPatch) -> None:
    code, first = plan_upgrade(project)
    assert code == ExitCode.OK
    assert first["computed"] == 4
    calls: list[str] = []

    def counting(job: upgrade_static.Job) -> upgrade_static.Row:
        calls.append(job.version)
        return upgrade_static.analyse(job)

    monkeypatch.setattr(upgrade, "analyse", counting)
    code, again = plan_upgrade(project)
    assert code == ExitCode.OK
    assert calls == []
    assert (again["computed"], again["reused"]) == (0, 4)
    assert again["recommendation"] == first["recommendation"]
    # A changed patch set is another input: its rows are computed again (never a stale row).
    series = project.root / "patches" / "kimi-hooks" / "series"
    series.write_text(series.read_text(encoding="utf-8") + "# touched\n", encoding="utf-8")
    code, third = plan_upgrade(project)
    assert sorted(calls) == ["0.5.10", "0.5.11", "0.5.12", "0.5.9"]
    assert third["computed"] == 4


def test_strict_and_no_driver(project: FakeProject) -> None:
    # Without a driver the CUDA 13.0 release is not blocked: 0.5.12 is the newest that fails nothing.
    code, data = plan_upgrade(project, "--driver", "580.65.06")
    assert code == ExitCode.OK
    assert data["recommendation"]["release"] == "0.5.12"
    code, data = plan_upgrade(project, "--to", "0.5.10")
    assert code == ExitCode.CELLS_FAILED
    assert data["recommendation"]["release"] is None
    assert "sglang 0.5.10, fails on" in data["recommendation"]["reason"]


def test_bad_arguments_name_the_fix(project: FakeProject, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["plan-upgrade", "--matrix", str(project.matrix), "--from", "cu99-nothing"]) == ExitCode.CONFIG
    )
    assert "--from: 'cu99-nothing' is neither in the plan" in capsys.readouterr().err
    code = main(["plan-upgrade", "--matrix", str(project.matrix), "--from", START, "--model", "kimi"])
    assert code == ExitCode.CONFIG
    assert "did you mean" in capsys.readouterr().err
    code = main(["plan-upgrade", "--matrix", str(project.matrix), "--from", START, "--driver", "570.xx"])
    assert code == ExitCode.CONFIG
    assert "--driver" in capsys.readouterr().err


# --------------------------------------------------------------------------- pure parts


def _set(tmp_path: Path, name: str, spec: str, patches: tuple[str, ...]) -> PatchSet:
    path = tmp_path / name
    path.mkdir()
    for patch in patches:
        (path / patch).write_text("", encoding="utf-8")
    (path / "series").write_text("\n".join(patches) + "\n", encoding="utf-8")
    return PatchSet(name=name, applies_to=SpecifierSet(spec), path=path)


def _st(ps: PatchSet, *statuses: str) -> tuple[PatchStatus, ...]:
    return tuple(
        PatchStatus(set=ps.name, patch=f"000{i}", status=s, detail="") for i, s in enumerate(statuses)
    )


def test_lineages_and_the_choice_of_sets(tmp_path: Path) -> None:
    old = _set(tmp_path, "caps", ">=0.5.9,<0.5.16", ("0001-a.patch", "0002-b.patch"))
    port = _set(tmp_path, "caps-0.5.16", ">=0.5.16", ("0001-a.patch", "0002-b.patch"))
    gates = _set(tmp_path, "gates", ">=0.5.9,<0.5.10", ("0001-g.patch",))
    gates2 = _set(tmp_path, "gates-0.5.10", ">=0.5.10,<0.5.11", ("0001-g.patch",))
    other = _set(tmp_path, "old-only", "<0.5.9", ("0001-x.patch",))
    sets = (old, port, gates, gates2, other)
    assert lineages(sets) == {"caps": "caps", "caps-0.5.16": "caps", "gates": "gates", "gates-0.5.10": "gates",
                              "old-only": "old-only"}  # fmt: skip
    found = {old.name: _st(old, "applied", "drift"), port.name: _st(port, "applied", "applied"),
             gates.name: _st(gates, "applied"), gates2.name: _st(gates2, "drift"), other.name: _st(other, "drift")}  # fmt: skip
    picked = {c.lineage: c for c in choose(sets, "0.5.16", "0.5.9", found)}
    assert set(picked) == {"caps", "gates"}  # old-only is neither carried nor meant for 0.5.16
    assert (picked["caps"].verdict, picked["caps"].chosen) == ("carry", "caps-0.5.16")
    # gates: nothing in range; the nearest member below drifts, the older one applies: carried past its range
    assert (picked["gates"].verdict, picked["gates"].chosen) == ("widen", "gates")
    found[gates.name] = _st(gates, "drift")
    assert {c.lineage: c.verdict for c in choose(sets, "0.5.16", "0.5.9", found)}["gates"] == "port"
    found[gates2.name] = _st(gates2, "upstreamed")
    assert {c.lineage: c.verdict for c in choose(sets, "0.5.16", "0.5.9", found)}["gates"] == "retire"
    found[port.name] = _st(port, "upstreamed", "applied")
    part = {c.lineage: c for c in choose(sets, "0.5.16", "0.5.9", found)}["caps"]
    assert (part.verdict, part.keep) == ("partial", ("0001",))


def test_torch_cuda_from_label_and_metadata() -> None:
    meta = email.message_from_string(
        "Name: torch\nVersion: 2.11.0\nRequires-Dist: cuda-toolkit[cublas,cudart]==13.0.2; platform_system == "
        '"Linux"\nRequires-Dist: filelock\n'
    )
    assert torch_cuda("2.11.0", meta) == "13.0"
    assert torch_cuda("2.9.1+cu130", None) == "13.0"
    assert torch_cuda("2.9.1+cu128", None) == "12.8"
    old = email.message_from_string(
        "Name: torch\nVersion: 2.9.1\nRequires-Dist: nvidia-cuda-runtime-cu12==12.8.90\n"
    )
    assert torch_cuda("2.9.1", old) == "12.8"
    assert torch_cuda("2.9.1", email.message_from_string("Name: torch\n")) is None


def _cand(version: str, *blockers: Blocker, status: str = "") -> Candidate:
    kinds = {b.outcome for b in blockers}
    return Candidate(sglang=version, values={"sglang": version}, cell=f"c{version}", notes=(), floor="",
                     status=status or ("fail" if "fail" in kinds else "open" if kinds else "pass"),
                     blockers=blockers)  # fmt: skip


def _b(key: str, outcome: str = "fail", *, current: bool = False) -> Blocker:
    return Blocker(key=key, kind="capability", outcome=outcome, title=key, sites=(), message="",
                   current=current)  # fmt: skip


def test_recommendation_and_timeline() -> None:
    today = _b("fused-allreduce", current=True)
    start = _cand("1", today)
    cands = [
        _cand("2", today),
        _cand("3", today, _b("table")),
        _cand("4", today, _b("q", "open")),
        _cand("5", today, _b("driver")),
    ]
    rec = recommend(start, cands)
    assert rec.release == "4"
    assert rec.accepted == ("fused-allreduce",)
    assert rec.open == ("q",)
    assert "sglang 5 is next: driver" in rec.reason
    assert recommend(start, cands, strict=True).release is None  # today's failure blocks too
    spans = {s.key: s for s in timeline([start, *cands])}
    assert (spans["table"].appears, spans["table"].gone) == ("3", "4")
    assert (spans["fused-allreduce"].appears, spans["fused-allreduce"].gone, spans["fused-allreduce"].current) == (
        "1", None, True)  # fmt: skip
    assert recommend(start, [_cand("2", status="unavailable")]).release is None


def test_a_moved_gate_keeps_its_patch_needed() -> None:
    """A lineage that no longer applies retires only when nothing of what it fixed on the start release fails
    without it; a failing finding of the same [features] entry under another key (the gate moved) keeps it."""
    port = LineageChoice(lineage="gates", verdict="port", chosen="", member="gates-0.5.10", in_range=False,
                         statuses=(), note="drift")  # fmt: skip
    carried = LineageChoice(lineage="gates", verdict="carry", chosen="gates", member="gates", in_range=True,
                            statuses=())  # fmt: skip
    fixed = Fixed(key="capability:gate:sm_120:sglang:communicator.py:g:gated-off", title="g", sites=(),
                  by=("gates",), feature="fusion")  # fmt: skip
    base = replace(_cand("1"), patches=(carried,), fixed=(fixed,))
    kept, blocker = port_check(port, base, {"capability:gate:sm_120:sglang:add_norm.py:g2:gated-off",
                                             "feature:fusion"})  # fmt: skip
    assert (kept.verdict, blocker) == ("port", None)  # the findings themselves are the blockers
    retired, blocker = port_check(port, base, set())
    assert retired.verdict == "retire"
    assert blocker is None
    # A lineage whose purpose no static finding shows is a blocker of its own where it stops applying.
    _, blocker = port_check(port, replace(base, fixed=()), set())
    assert blocker is not None
    assert blocker.key == "patch:gates"


def test_the_row_key_follows_the_judging_code_only() -> None:
    names = {p.name for p in upgrade_static.code_files()}
    assert {"captables.py", "capgates.py", "eagle3_models.py", "status.py", "capability_findings.py"} <= names
    assert not names & {"abicheck.py", "elfsyms.py", "matrix.py", "artifacts.py", "upgrade.py"}
