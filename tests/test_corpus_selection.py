"""corpus_selection: a release's backend-selection counts, against the flashinfer it pins."""

from __future__ import annotations

from pathlib import Path

from stackfarm.corpus_selection import TOOLCHAIN_UNANSWERED, flashinfer_pin, flashinfer_trees, selection_part
from test_toolchain import SELECTORS, _selection_cell


def test_counts_by_outcome_and_arch(tmp_path: Path) -> None:
    root = Path(_selection_cell(tmp_path).components[0].root)
    part = selection_part("0.0", root, {"selectors": SELECTORS}, ("sm_120", "sm_100"), flashinfer=None)
    assert part["counts"]["fail"] == 1  # trtllm_mla on sm_120, refused by its generator
    assert part["by_arch"]["sm_100"]["pass"] == 1
    assert part["failures"][0].startswith("sm_120 sel/args.py:8 ")
    assert part["toolchain"] == TOOLCHAIN_UNANSWERED


def test_the_pinned_flashinfer_is_fetched_once(tmp_path: Path) -> None:
    trees = {}
    for version, pin in (
        ("0.5.9", "0.6.3"),
        ("0.5.9.post1", "0.6.3"),
        ("0.4.0", None),
        ("0.4.10", "0.2.9rc2"),
    ):
        info = tmp_path / version / f"sglang-{version}.dist-info"
        info.mkdir(parents=True)
        requires = f"Requires-Dist: flashinfer_python=={pin}\n" if pin else ""
        if version == "0.4.10":  # its runtime pins live under the "srt" extra
            requires = f'Requires-Dist: flashinfer_python=={pin}; extra == "srt"\n'
        (info / "METADATA").write_text(
            f"Name: sglang\nVersion: {version}\n{requires}Requires-Dist: torch==2.9.1\n"
        )
        trees[version] = tmp_path / version
    assert flashinfer_pin("0.5.9", trees["0.5.9"]) == "0.6.3"
    fetched: list[str] = []

    def fetch(version: str) -> Path:
        fetched.append(version)
        return tmp_path / f"fi-{version}"

    out = flashinfer_trees(trees, fetch, echo=lambda _: None)
    assert flashinfer_pin("0.4.10", trees["0.4.10"]) == "0.2.9rc2"
    assert fetched == ["0.2.9rc2", "0.6.3"]
    assert out["0.5.9"] == ("0.6.3", tmp_path / "fi-0.6.3")
    assert out["0.4.0"] is None
