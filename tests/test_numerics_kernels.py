"""stackfarm.numerics.kernels and the 30-numerics kernel harness, on CPU.

Three kinds of check:
- the float32 references against independent formulations (HF transformers' Llama RMSNorm and rotary embedding,
  complex multiplication for GPT-J rotary, hand-worked renorm cases);
- the reference tree acceptance (tree semantics: parents, depths, children) against a model of the kernels'
  encoding (linked lists of first child / next sibling built by pushing nodes in descending order, flat indices),
  on hypothesis-generated EAGLE trees;
- the suite's harness (suites/30-numerics/numerics_cases.py, which the GPU tests call with the real sgl_kernel)
  run with device="cpu" against stand-in kernel modules: correct stand-ins pass, and stand-ins with a planted bug
  (a missing epsilon, swapped rotary pairs, a verify that ignores siblings, reversed sibling lists, sampling that
  ignores top-p) fail. That exercises every tensor layout the GPU run depends on without a GPU.
"""

from __future__ import annotations

import importlib
import itertools
import math
import random
import struct
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stackfarm.numerics.kernels import (
    EagleTree,
    bonus_token_window,
    build_tree_ref,
    chi_square_pvalue,
    cos_sin_cache,
    greedy_accept_ref,
    max_draft_tokens,
    measure,
    random_tree,
    rmsnorm_ref,
    rope_ref,
    sampling_accept_ref,
    top_k_renorm_ref,
    top_p_renorm_ref,
)
from stackfarm.numerics.settings import DEFAULT_TOLERANCES, Tolerance

torch = pytest.importorskip("torch")

SUITE = Path(__file__).resolve().parents[1] / "suites" / "30-numerics"
sys.path.insert(0, str(SUITE))  # the suite's helpers import each other by name, as pytest runs them
numerics_cases: Any = importlib.import_module("numerics_cases")
numerics_strategies: Any = importlib.import_module("numerics_strategies")

FAST = settings(
    max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


# --------------------------------------------------------------------------- references vs independent forms


def test_rmsnorm_ref_matches_hf_llama() -> None:
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    norm = llama.LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=torch.Generator().manual_seed(0)))
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(
        rmsnorm_ref(x, norm.weight.detach(), 1e-5), norm(x).detach(), rtol=1e-6, atol=1e-6
    )


def test_rope_neox_matches_hf_llama() -> None:
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    head, heads, tokens = 16, 3, 7
    cache = cos_sin_cache(64, head)
    positions = torch.tensor([0, 1, 5, 9, 33, 63, 2])
    x = torch.randn(tokens, heads * head, generator=torch.Generator().manual_seed(2))
    half = cache[positions]
    cos = torch.cat((half[:, : head // 2], half[:, : head // 2]), dim=-1)[None, None]
    sin = torch.cat((half[:, head // 2 :], half[:, head // 2 :]), dim=-1)[None, None]
    q = x.reshape(tokens, heads, head).transpose(0, 1)[None]  # [1, heads, tokens, head]
    want, _ = llama.apply_rotary_pos_emb(q, q, cos.squeeze(1), sin.squeeze(1))
    got = rope_ref(positions, x, head, cache, is_neox=True).reshape(tokens, heads, head).transpose(0, 1)[None]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_rope_gptj_is_complex_rotation() -> None:
    head = 8
    cache = cos_sin_cache(16, head)
    positions = torch.tensor([3, 11])
    x = torch.randn(2, 2 * head, generator=torch.Generator().manual_seed(3))
    got = rope_ref(positions, x, head, cache, is_neox=False).reshape(2, 2, head // 2, 2)
    pairs = torch.view_as_complex(x.reshape(2, 2, head // 2, 2).contiguous())
    angle = torch.atan2(cache[positions, head // 2 :], cache[positions, : head // 2])
    want = torch.view_as_real(pairs * torch.polar(torch.ones_like(angle), angle)[:, None])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_renorm_refs_on_worked_cases() -> None:
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3]])
    torch.testing.assert_close(top_k_renorm_ref(probs, 2), torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))
    # sorted: 0.4, 0.3, 0.2, 0.1 -> cumulative 0.4, 0.7, 0.9: top_p 0.65 keeps {0.4, 0.3}, 0.7 keeps the same,
    # 0.71 also needs 0.2
    torch.testing.assert_close(
        top_p_renorm_ref(probs, torch.tensor([0.65])), torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]])
    )
    torch.testing.assert_close(
        top_p_renorm_ref(probs, torch.tensor([0.71])), torch.tensor([[0.0, 4 / 9, 2 / 9, 3 / 9]])
    )


def test_measure_counts_nan_and_uses_the_bound() -> None:
    tol = Tolerance(atol=0.1, rtol=0.1)
    stats = measure(torch.tensor([1.0, 2.35, float("nan")]), torch.tensor([1.05, 2.0, 0.0]), tol)
    assert stats.mismatches == 2  # 0.35 > 0.1 + 0.1 * 2, and NaN
    assert stats.max_abs_err == math.inf
    assert not stats.ok
    assert measure(torch.tensor([1.0]), torch.tensor([1.15]), tol).ok
    with pytest.raises(ValueError, match="shape mismatch"):
        measure(torch.zeros(2), torch.zeros(3), tol)


def test_chi_square() -> None:
    _, p_good, dof = chi_square_pvalue([250, 250, 500], [250.0, 250.0, 500.0])
    assert p_good == pytest.approx(1.0)
    assert dof == 2
    _, p_bad, _ = chi_square_pvalue([400, 100, 500], [250.0, 250.0, 500.0])
    assert p_bad < 1e-10
    _, _, dof = chi_square_pvalue([5, 0], [5.0, 0.0])
    assert dof == 1


# --------------------------------------------------------------------------- trees: a model of the kernels


def _f32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _kernel_lists(tree: EagleTree) -> tuple[list[int], list[int], list[int]]:
    """First-child / next-sibling lists as the kernel builds them: nodes pushed to the front of their parent's
    list from the last node to the first; plus each node's depth by walking selected score indices."""
    n = tree.num_draft
    first, sibling = [-1] * n, [-1] * n
    for node in range(n - 1, 0, -1):
        tb = tree.selected[node - 1] // tree.topk
        parent = 0 if tb == 0 else tree.selected.index(tree.parent_list[tb]) + 1
        sibling[node], first[parent] = first[parent], node
    depth = [0] * n
    for node in range(1, n):
        score = tree.selected[node - 1]
        while True:
            depth[node] += 1
            tb = score // tree.topk
            if tb == 0:
                break
            score = tree.parent_list[tb]
    return first, sibling, depth


def _walk_greedy(
    first: list[int], sibling: list[int], tokens: list[int], target: list[int], width: int
) -> list[int]:
    path = [0]
    for _ in range(1, width):
        child = first[path[-1]]
        while child != -1 and tokens[child] != target[path[-1]]:
            child = sibling[child]
        if child == -1:
            break
        path.append(child)
    return path


@st.composite
def trees(draw: st.DrawFn) -> EagleTree:
    topk = draw(st.sampled_from((1, 2, 3, 4, 8)))
    depth = draw(st.integers(1, 6))
    n = draw(st.integers(2, min(max_draft_tokens(topk, depth), 40)))
    return random_tree(draw(st.randoms(use_true_random=False)), topk, depth, n)


@FAST
@given(tree=trees())
def test_random_trees_are_valid(tree: EagleTree) -> None:
    assert list(tree.selected) == sorted(set(tree.selected))
    assert len(tree.parent_list) == (tree.topk * (tree.depth - 1) + 1 if tree.depth > 1 else 0)
    for node in range(1, tree.num_draft):
        assert 0 <= tree.parent(node) < node  # ancestor-closed, parents sort first
        assert 1 <= tree.depth_of(node) <= tree.depth
    for node in range(tree.num_draft):
        assert len(tree.children(node)) <= tree.topk


def test_random_tree_reaches_the_asked_size() -> None:
    rng = random.Random(0)
    for topk, depth in ((1, 1), (1, 5), (2, 1), (2, 2), (4, 3), (8, 2)):
        n = max_draft_tokens(topk, depth)
        for _ in range(20):
            assert random_tree(rng, topk, depth, n).num_draft == n


@FAST
@given(tree=trees(), seq_len=st.integers(0, 50), batch=st.integers(0, 3))
def test_build_tree_ref_matches_the_kernel_encoding(tree: EagleTree, seq_len: int, batch: int) -> None:
    first, sibling, depth = _kernel_lists(tree)
    layout = build_tree_ref(tree, seq_len, batch * tree.num_draft)
    assert list(layout.next_token) == first
    assert list(layout.next_sibling) == sibling
    assert list(layout.positions) == [seq_len + d for d in depth]
    assert list(layout.retrieve_index) == [batch * tree.num_draft + i for i in range(tree.num_draft)]
    for node, row in enumerate(layout.mask):
        attended = {j for j, on in enumerate(row) if on}
        chain, cur = {0, node}, node
        while cur:
            cur = tree.parent(cur)
            chain.add(cur)
        assert attended == chain


@FAST
@given(tree=trees(), data=st.data())
def test_greedy_ref_matches_the_linked_list_walk(tree: EagleTree, data: st.DataObject) -> None:
    rnd = data.draw(st.randoms(use_true_random=False))
    n = tree.num_draft
    tokens = [rnd.randrange(8) for _ in range(n)]
    target = [rnd.randrange(8) for _ in range(n)]
    width = data.draw(st.integers(1, tree.depth + 1))
    first, sibling, _ = _kernel_lists(tree)
    want = greedy_accept_ref(tree, tokens, target, width)
    assert list(want.path) == _walk_greedy(first, sibling, tokens, target, width)
    assert dict(want.predicts)[want.path[-1]] == target[want.path[-1]]
    assert all(tokens[b] == target[a] for a, b in zip(want.path, want.path[1:], strict=False))


def test_sampling_ref_worked_case() -> None:
    """Root with children 1 (token 5) and 2 (token 6); node 1 has child 3 (token 7). Coins make the walk reject
    child 1 (coin 0.5 > 0.2), accept child 2 (0.5 <= 0.2 + 0.4), then stop; the bonus avoids nothing at node 2."""
    tree = EagleTree(topk=2, depth=2, parent_list=(-1, 0, 1), selected=(0, 1, 2))  # score 2 -> parent score 0
    assert tree.children(0) == (1, 2)
    assert tree.children(1) == (3,)
    probs = [[0.0] * 8 for _ in range(4)]
    probs[0][5], probs[0][6], probs[0][0] = 0.2, 0.4, 0.4
    probs[2][3] = 1.0
    acc, rejected = sampling_accept_ref(tree, [0, 5, 6, 7], probs, [0.5, 0.9, 0.1, 0.9], width=3)
    assert acc.path == (0, 2)
    assert acc.predicts == ((0, 6),)
    assert rejected == {}  # node 2 has no children: nothing tried there
    acc, rejected = sampling_accept_ref(tree, [0, 5, 6, 7], probs, [0.7, 0.9, 0.1, 0.9], width=3)
    assert acc.path == (0,)
    assert rejected == {5: pytest.approx(0.2), 6: pytest.approx(0.4)}
    allowed, tie = bonus_token_window(probs[0], rejected, 0.5)
    assert allowed == {0}
    assert not tie
    single, _ = sampling_accept_ref(
        tree, [0, 5, 6, 7], probs, [0.99, 0.9, 0.1, 0.9], width=3, threshold_single=0.35
    )
    assert single.path == (0, 2)  # child 2's own probability 0.4 >= threshold_single


def test_bonus_window_edges() -> None:
    allowed, tie = bonus_token_window([0.25, 0.25, 0.5], {}, 0.5)  # u = 0.5 sits on the 1|2 boundary
    assert allowed == {1, 2}
    assert tie
    allowed, _ = bonus_token_window([0.25, 0.25, 0.5, 0.0], {}, 1.0)
    assert allowed == {2}  # past the mass: the last token that has any


# --------------------------------------------------------------------------- the harness with stand-in kernels


def _tensor_tree(parents: Any, selected: Any, b: int, topk: int) -> EagleTree:
    selected.shape[1] + 1
    depth = (parents.shape[1] - 1) // topk + 1 if parents.shape[1] else 1
    return EagleTree(
        topk=topk, depth=depth, parent_list=tuple(parents[b].tolist()), selected=tuple(selected[b].tolist())
    )


def _fake_build_tree(reverse_siblings: bool = False) -> Any:
    def build(
        parents: Any,
        selected: Any,
        seq: Any,
        mask: Any,
        positions: Any,
        index: Any,
        next_token: Any,
        next_sibling: Any,
        topk: int,
        depth: int,
        n: int,
        mode: int,
    ) -> None:
        start = 0
        for b in range(selected.shape[0]):
            tree = _tensor_tree(parents, selected, b, topk)
            first, sibling, depths = _kernel_lists(tree)
            if reverse_siblings:  # the planted bug: children linked last-first
                for node in range(n):
                    kids = tree.children(node)[::-1]
                    first[node] = kids[0] if kids else -1
                    for a, c in zip(kids, (*kids[1:], -1), strict=False):
                        sibling[a] = c
            seq_len = int(seq[b])
            row, prefix = (seq_len + n, seq_len) if mode == 0 else (n, 0)
            for node in range(n):
                mask[start + node * row + prefix : start + (node + 1) * row] = False
                cur = node
                mask[start + node * row + prefix] = True
                while cur:
                    mask[start + node * row + prefix + cur] = True
                    cur = tree.parent(cur)
            start += n * row
            positions[b * n : (b + 1) * n] = torch.tensor([seq_len + d for d in depths])
            index[b] = torch.arange(b * n, (b + 1) * n)
            next_token[b] = torch.tensor(first)
            next_sibling[b] = torch.tensor(sibling)

    return build


def _fake_verify_greedy(first_child_only: bool = False) -> Any:
    def verify(
        predicts: Any,
        accept_index: Any,
        accept_num: Any,
        candidates: Any,
        index: Any,
        next_token: Any,
        next_sibling: Any,
        target: Any,
    ) -> None:
        n, width = candidates.shape[1], accept_index.shape[1]
        for b in range(candidates.shape[0]):
            sib = [-1] * n if first_child_only else next_sibling[b].tolist()
            path = _walk_greedy(
                next_token[b].tolist(), sib, candidates[b].tolist(), target[b].tolist(), width
            )
            for a, c in itertools.pairwise(path):
                predicts[b * n + a] = int(candidates[b, c])
            predicts[b * n + path[-1]] = int(target[b, path[-1]])
            accept_index[b, : len(path)] = torch.tensor([b * n + p for p in path], dtype=torch.int32)
            accept_num[b] = len(path) - 1

    return verify


def _fake_sampling(
    predicts: Any,
    accept_index: Any,
    accept_num: Any,
    candidates: Any,
    index: Any,
    next_token: Any,
    next_sibling: Any,
    coins: Any,
    final: Any,
    target_probs: Any,
    draft_probs: Any,
    threshold_single: float,
    threshold_acc: float,
    deterministic: bool,
) -> None:
    """The target-only walk over the linked lists with float32 running sums, then the residual sample."""
    n, width = candidates.shape[1], accept_index.shape[1]
    for b in range(candidates.shape[0]):
        first, sib, toks = next_token[b].tolist(), next_sibling[b].tolist(), candidates[b].tolist()
        path, coin = [0], _f32(float(coins[b, 0]))
        for _ in range(1, width):
            child, acc, cur = first[path[-1]], 0.0, path[-1]
            while child != -1:
                p = _f32(float(target_probs[b, cur, toks[child]]))
                acc = _f32(acc + p)
                if coin <= _f32(acc / max(threshold_acc, 1e-9)) or p >= threshold_single:
                    break
                draft_probs[b, cur, toks[child]] = p
                child = sib[child]
            if child == -1:
                break
            predicts[b * n + cur] = toks[child]
            path.append(child)
            coin = _f32(float(coins[b, child]))
        last = path[-1]
        q = target_probs[b, last].double()
        p = draft_probs[b, last].double() if len(path) < width else torch.zeros_like(q)
        residual = torch.clamp(q - p, min=0)
        u = float(final[b]) * float(residual.sum())
        cum = torch.cumsum(residual, 0)
        above = (cum > u).nonzero()
        predicts[b * n + last] = int(above[0]) if len(above) else int((residual > 0).nonzero()[-1])
        accept_index[b, : len(path)] = torch.tensor([b * n + x for x in path], dtype=torch.int32)
        accept_num[b] = len(path) - 1


def _fake_sgl(**overrides: Any) -> SimpleNamespace:
    def rmsnorm(x: Any, w: Any, eps: float) -> Any:
        return rmsnorm_ref(x, w, eps).to(x.dtype)

    def fused_add_rmsnorm(x: Any, residual: Any, w: Any, eps: float) -> None:
        total = x.float() + residual.float()
        x.copy_(rmsnorm_ref(total, w, eps).to(x.dtype))
        residual.copy_(total.to(residual.dtype))

    def silu_and_mul(x: Any) -> Any:
        half = x.shape[-1] // 2
        return (torch.nn.functional.silu(x[..., :half].float()) * x[..., half:].float()).to(x.dtype)

    def rotary_embedding(positions: Any, q: Any, k: Any, head: int, cache: Any, is_neox: bool) -> None:
        q.copy_(rope_ref(positions, q, head, cache, is_neox).to(q.dtype))
        k.copy_(rope_ref(positions, k, head, cache, is_neox).to(k.dtype))

    def top_k_renorm_prob(probs: Any, k: Any) -> Any:
        if isinstance(k, int):
            return top_k_renorm_ref(probs, k)
        return torch.stack([top_k_renorm_ref(probs[i : i + 1], int(k[i]))[0] for i in range(probs.shape[0])])

    fake = SimpleNamespace(
        rmsnorm=rmsnorm,
        fused_add_rmsnorm=fused_add_rmsnorm,
        silu_and_mul=silu_and_mul,
        rotary_embedding=rotary_embedding,
        top_k_renorm_prob=top_k_renorm_prob,
        top_p_renorm_prob=top_p_renorm_ref,
        build_tree_kernel_efficient=_fake_build_tree(),
        verify_tree_greedy=_fake_verify_greedy(),
        tree_speculative_sampling_target_only=_fake_sampling,
    )
    for name, value in overrides.items():
        setattr(fake, name, value)
    return fake


@pytest.mark.parametrize(
    ("op", "dtype"), [(op, d) for op, (ds, _) in numerics_cases.ELEMENTWISE.items() for d in ds]
)
def test_elementwise_cases_pass_correct_kernels(op: str, dtype: str) -> None:
    _, case = numerics_cases.ELEMENTWISE[op]
    result = case(_fake_sgl(), torch, getattr(torch, dtype), DEFAULT_TOLERANCES[dtype], 0, "cpu")
    assert result.stats.ok, result.stats.describe()
    assert result.stats.elements > 1000
    assert result.stats.worst_ratio <= 0.5  # one rounding of the output: half the 2-ulp bound at most


def _wrong_rmsnorm(x: Any, w: Any, eps: float) -> Any:
    return rmsnorm_ref(x, torch.ones_like(w), eps).to(x.dtype)  # ignores the weight


def _swapped_rope(positions: Any, q: Any, k: Any, head: int, cache: Any, is_neox: bool) -> None:
    q.copy_(rope_ref(positions, q, head, cache, not is_neox).to(q.dtype))
    k.copy_(rope_ref(positions, k, head, cache, not is_neox).to(k.dtype))


def _gelu_and_mul(x: Any) -> Any:  # the sibling kernel, wired to the wrong op
    half = x.shape[-1] // 2
    return (torch.nn.functional.gelu(x[..., :half].float()) * x[..., half:].float()).to(x.dtype)


@pytest.mark.parametrize(
    ("op", "broken"),
    [
        ("rmsnorm", {"rmsnorm": _wrong_rmsnorm}),
        ("rotary_embedding_neox", {"rotary_embedding": _swapped_rope}),
        ("rotary_embedding_gptj", {"rotary_embedding": _swapped_rope}),
        ("silu_and_mul", {"silu_and_mul": _gelu_and_mul}),
        ("top_k_renorm_prob", {"top_k_renorm_prob": lambda probs, k: probs / probs.sum(-1, keepdim=True)}),
    ],
)
def test_elementwise_cases_catch_broken_kernels(op: str, broken: dict[str, Any]) -> None:
    _, case = numerics_cases.ELEMENTWISE[op]
    dtype = "float32" if op.startswith("top_") else "bfloat16"
    result = case(_fake_sgl(**broken), torch, getattr(torch, dtype), DEFAULT_TOLERANCES[dtype], 0, "cpu")
    assert not result.stats.ok


def _run_trees(check: Any, *, sampling: bool) -> None:
    decorate: Any = given(numerics_strategies.tree_cases(sampling=sampling))
    run: Any = FAST(decorate(check))
    run()


def test_tree_cases_pass_correct_kernels() -> None:
    sgl, ties = _fake_sgl(), [0]

    def check(case: Any) -> None:
        for mode in (0, 1):
            assert numerics_cases.build_tree(sgl, torch, case, mode, "cpu") == []
        assert numerics_cases.verify_greedy(sgl, torch, case, "cpu") == []

    def check_sampling(case: Any) -> None:
        problems, found = numerics_cases.verify_sampling(sgl, torch, case, "cpu")
        ties[0] += found
        assert problems == []

    _run_trees(check, sampling=False)
    _run_trees(check_sampling, sampling=True)


@pytest.mark.parametrize("broken", ["reversed siblings", "first child only"])
def test_tree_cases_catch_broken_kernels(broken: str) -> None:
    sgl = _fake_sgl(
        build_tree_kernel_efficient=_fake_build_tree(reverse_siblings=True),
        verify_tree_greedy=_fake_verify_greedy(first_child_only=True),
    )
    found: list[str] = []

    def check(case: Any) -> None:
        if broken == "reversed siblings":
            found.extend(numerics_cases.build_tree(sgl, torch, case, 0, "cpu"))
        else:
            found.extend(numerics_cases.verify_greedy(sgl, torch, case, "cpu"))

    _run_trees(check, sampling=False)
    assert found, f"the harness never noticed the {broken} bug"


def test_sampling_case_judges_statistically() -> None:
    def sampler(probs: Any, k: int, p: float, indices: Any, generator: Any) -> Any:
        dist = top_p_renorm_ref(top_k_renorm_ref(probs, k), torch.tensor([p]))[0]
        return torch.multinomial(dist, len(indices), replacement=True, generator=generator)

    def no_top_p(probs: Any, k: int, p: float, indices: Any, generator: Any) -> Any:
        return sampler(probs, k, 1.0, indices, generator)

    good = numerics_cases.top_k_top_p_sampling(
        SimpleNamespace(sampling=SimpleNamespace(top_k_top_p_sampling_from_probs=sampler)),
        torch,
        0,
        "cpu",
        draws=20000,
    )
    assert good.stats.ok, good.notes
    assert float(good.notes["pvalue"]) > 1e-4
    bad = numerics_cases.top_k_top_p_sampling(
        SimpleNamespace(sampling=SimpleNamespace(top_k_top_p_sampling_from_probs=no_top_p)),
        torch,
        0,
        "cpu",
        draws=20000,
    )
    assert not bad.stats.ok
    assert int(bad.notes["outside_kept_set"]) > 0
