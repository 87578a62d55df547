"""The H200 record of 30-numerics with the path model (tests/test_numerics_fixtures/h200-path-model): what SGLang
0.5.15 computed on the GPU is re-checked here against the planted function and the comparison's rules, so the
record supports its verdicts and a change of the path model or the prompts that the record no longer matches fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stackfarm.numerics.engines import make_prompts
from stackfarm.numerics.pathmodel import PATH_TARGET, path_sequence
from stackfarm.numerics.settings import parse

RECORD = Path(__file__).parent / "test_numerics_fixtures" / "h200-path-model" / "numerics.json"


def _entries() -> dict[str, dict[str, Any]]:
    return {e["test"].split("::")[-1]: e for e in json.loads(RECORD.read_text(encoding="utf-8"))}


def test_eagle3_matches_the_baseline_without_a_near_tie_on_the_gpu() -> None:
    found = _entries()
    for name in ("test_e2e_gpu[eagle3-bfloat16]", "test_e2e_gpu[eagle3-tree-bfloat16]"):
        entry = found[name]
        assert entry["ok"], entry["verdict"]
        props = entry["properties"]
        assert props["near_ties"] == "0"
        assert float(props["min_gap"]) > 25.0
        assert entry["divergences"] == []


@pytest.mark.parametrize(
    "entry_name", ["test_e2e_gpu_bug[attention]", "test_e2e_cpu_bug[attention]", "test_e2e_cpu_bug[mlp]"]
)
def test_a_planted_defect_was_real_on_every_prompt(entry_name: str) -> None:
    entry = _entries()[entry_name]
    assert not entry["ok"]
    settings = parse(None)
    assert len(entry["divergences"]) == settings.prompts
    assert all(d["kind"] == "real" and d["gap"] > 25.0 for d in entry["divergences"])


def test_the_gpu_baseline_computed_the_planted_function() -> None:
    """The reference run's tokens (kept beside each divergence of the attention-defect comparison) are exactly
    perm[the token two back] for the suite's default prompts: SGLang's attention, MLP, norms and head on the H200."""
    settings = parse(None)
    prompts = make_prompts(settings.prompts, settings.prompt_len, PATH_TARGET.vocab, seed=settings.seed)
    entry = _entries()["test_e2e_gpu_bug[attention]"]
    for d in entry["divergences"]:
        prompt = prompts[d["prompt_index"]]
        want = path_sequence(prompt, len(d["baseline_tokens"]), PATH_TARGET.vocab, seed=settings.seed)
        assert d["baseline_tokens"] == want
        assert d["candidate_tokens"] != want
