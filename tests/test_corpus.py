"""stackfarm.corpus: one release's row from a small SGLang-shaped tree, the report, and the warm cache.

The tree is the synthetic one of test_eagle3 (spec_info.py with create_worker, workers, a model runner, models):
the row's EAGLE-3 verdicts are the ones check_class gives there; a second run reads the row from the cache.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from stackfarm import corpus
from stackfarm.analysis.eagle3 import VERDICTS
from test_eagle3 import _sglang_tree


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return _sglang_tree(tmp_path / "sgl", "0.5.9")


def test_release_row(tree: Path) -> None:
    row = corpus.analyse_release(
        "0.5.9", tree, {}, archs=("sm_90", "sm_120"), targets=("InheritedLM", "NoSuchLM"), drafts=("DraftLM",)
    )
    eagle = row["eagle3"]
    assert "error" not in eagle
    assert eagle["classes"]["target:NoSuchLM"] == {"*": "class-not-in-release"}
    assert eagle["classes"]["target:InheritedLM"]["get_embed_and_head"] == "inherited"
    assert set(eagle["counts"]) <= set(VERDICTS)
    # the capability findings ran: the tree has no capability table and no [features], so none, no error
    assert row["capability"]["counts"] == {}
    assert set(row["capability"]["timings"]) == {"binaries", "tables", "gates"}
    text = corpus.markdown([row], ("sm_90", "sm_120"))
    assert "| 0.5.9 |" in text
    assert "class-not-in-release" in corpus.counts_table([row])


def test_the_selection_table_totals_every_release(tree: Path) -> None:
    row = corpus.analyse_release("0.5.9", tree, {}, archs=("sm_90",), targets=("InheritedLM",), drafts=())
    rows = [
        {**row, "sglang": v, "selection": {"flashinfer": fi, "counts": counts, "toolchain": "per cell"}}
        for v, fi, counts in (("0.5.9", "0.6.3", {"fail": 1, "pass": 6}), ("0.5.10", None, {"skip": 2}))
    ]
    text = corpus.markdown(rows, ("sm_90",))
    assert "| 0.5.10 | - | 0 | 0 | 2 |" in text
    assert "| **all** | | **1** | **6** | **2** |" in text


def test_a_release_without_eagle3_is_a_failed_derivation(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    (empty / "sglang").mkdir(parents=True)
    row = corpus.analyse_release("0.0.1", empty, {}, archs=("sm_90",))
    assert row["eagle3"]["counts"] == {"derivation-failed": 1}
    assert "spec_info.py is missing" in row["eagle3"]["error"]


def test_rows_are_cached_by_wheel_and_code(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACKFARM_CACHE", str(tmp_path / "cache"))

    class _Matrix:
        features: typing.ClassVar[dict[str, object]] = {}
        suites: typing.ClassVar[tuple[object, ...]] = ()  # no 15-toolchain: no selection part

    calls: list[str] = []
    real = corpus._analyse_job

    def counting(job: corpus.Job) -> dict[str, object]:
        calls.append(job[0])
        return real(job)

    monkeypatch.setattr(corpus, "sglang_trees", lambda _m, versions, echo: dict.fromkeys(versions, tree))
    monkeypatch.setattr(corpus, "_analyse_job", counting)
    monkeypatch.setattr(corpus, "ProcessPoolExecutor", _Serial)
    first = corpus.run_corpus(_Matrix(), ["0.5.9"], archs=("sm_90",), echo=lambda _: None)  # type: ignore[arg-type]
    again = corpus.run_corpus(_Matrix(), ["0.5.9"], archs=("sm_90",), echo=lambda _: None)  # type: ignore[arg-type]
    assert calls == ["0.5.9"]  # the second run read the row from the cache
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
    md, js = corpus.write(again, tmp_path / "out")
    assert md.read_text(encoding="utf-8").startswith("# SGLang corpus")
    assert json.loads(js.read_text(encoding="utf-8"))[0]["sglang"] == "0.5.9"


class _Serial:
    """ProcessPoolExecutor's interface, in this process (so the monkeypatched job is the one that runs)."""

    def __init__(self, max_workers: int) -> None:
        del max_workers

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn: object, items: list[object]) -> list[object]:
        return [fn(i) for i in items]  # type: ignore[operator]
