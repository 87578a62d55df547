"""The GPU kernel cases of 30-numerics: each runs the cell's real kernel on seeded inputs and measures it against
the float32 reference in stackfarm.numerics.kernels. Imported lazily by test_numerics.py (torch only inside).

Shapes are the deployment's: hidden sizes 4096 and 7168 (Kimi K2.5 / DeepSeek-V3), 1 and 129 tokens (decode and
a ragged prefill), 32 query / 8 KV heads of 128 for the rotary embedding, a 32000-token vocabulary for the
probability kernels.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from stackfarm.numerics.kernels import (
    EagleTree,
    ErrorStats,
    bonus_token_window,
    build_tree_ref,
    chi_square_pvalue,
    cos_sin_cache,
    fused_add_rmsnorm_ref,
    greedy_accept_ref,
    measure,
    rmsnorm_ref,
    rope_ref,
    sampling_accept_ref,
    silu_and_mul_ref,
    top_k_renorm_ref,
    top_p_renorm_ref,
)
from stackfarm.numerics.settings import Tolerance

EPS = 1e-6
TOKENS = (1, 129)
HIDDEN = (4096, 7168)


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    """The worst of a case's measurements, plus what it ran."""

    stats: ErrorStats
    impl: str
    notes: dict[str, str] = field(default_factory=dict)


def _sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _worst(results: list[tuple[str, ErrorStats]]) -> tuple[str, ErrorStats]:
    return max(results, key=lambda r: r[1].worst_ratio)


def _combine(results: list[tuple[str, ErrorStats]]) -> tuple[ErrorStats, dict[str, str]]:
    """One ErrorStats over several shapes: counts summed, the worst element kept."""
    where, worst = _worst(results)
    total = ErrorStats(
        max_abs_err=max(s.max_abs_err for _, s in results),
        worst_ratio=worst.worst_ratio,
        mismatches=sum(s.mismatches for _, s in results),
        elements=sum(s.elements for _, s in results),
        worst=worst.worst,
    )
    return total, {"worst_shape": where, "shapes": ", ".join(w for w, _ in results)}


def _norm_impl(sgl: ModuleType, dtype: Any) -> str:
    """sgl_kernel's public norms delegate to flashinfer when it imports (and the dtype is fp16/bf16)."""
    elementwise = getattr(sgl, "elementwise", None)
    uses_fi = bool(getattr(elementwise, "_has_flashinfer", False)) and dtype in getattr(
        elementwise, "_FLASHINFER_NORM_SUPPORTED_DTYPES", ()
    )
    return "flashinfer.norm (via sgl_kernel)" if uses_fi else "sgl_kernel"


def rmsnorm(sgl: ModuleType, torch: Any, dtype: Any, tol: Tolerance, seed: int, device: str) -> CaseResult:
    gen = torch.Generator(device=device).manual_seed(seed)
    results = []
    for tokens in TOKENS:
        for hidden in HIDDEN:
            x = torch.randn(tokens, hidden, device=device, generator=gen).to(dtype)
            w = (1 + 0.1 * torch.randn(hidden, device=device, generator=gen)).to(dtype)
            got = sgl.rmsnorm(x, w, EPS)
            results.append((f"{tokens}x{hidden}", measure(got, rmsnorm_ref(x, w, EPS), tol)))
    stats, notes = _combine(results)
    return CaseResult(stats=stats, impl=_norm_impl(sgl, dtype), notes=notes)


def fused_add_rmsnorm(
    sgl: ModuleType, torch: Any, dtype: Any, tol: Tolerance, seed: int, device: str
) -> CaseResult:
    gen = torch.Generator(device=device).manual_seed(seed)
    results = []
    for tokens in TOKENS:
        for hidden in HIDDEN:
            x = torch.randn(tokens, hidden, device=device, generator=gen).to(dtype)
            residual = torch.randn(tokens, hidden, device=device, generator=gen).to(dtype)
            w = (1 + 0.1 * torch.randn(hidden, device=device, generator=gen)).to(dtype)
            want_out, want_residual = fused_add_rmsnorm_ref(x, residual, w, EPS)
            sgl.fused_add_rmsnorm(x, residual, w, EPS)  # in place: x <- normalised, residual <- sum
            results.append((f"{tokens}x{hidden} out", measure(x, want_out, tol)))
            results.append((f"{tokens}x{hidden} residual", measure(residual, want_residual, tol)))
    stats, notes = _combine(results)
    return CaseResult(stats=stats, impl=_norm_impl(sgl, dtype), notes=notes)


def silu_and_mul(
    sgl: ModuleType, torch: Any, dtype: Any, tol: Tolerance, seed: int, device: str
) -> CaseResult:
    gen = torch.Generator(device=device).manual_seed(seed)
    results = []
    for tokens in TOKENS:
        for inter in (11008, 18432):  # Llama-2-7B's and Kimi K2.5 / DeepSeek-V3's dense intermediate sizes
            x = (2 * torch.randn(tokens, 2 * inter, device=device, generator=gen)).to(dtype)
            results.append((f"{tokens}x{2 * inter}", measure(sgl.silu_and_mul(x), silu_and_mul_ref(x), tol)))
    stats, notes = _combine(results)
    return CaseResult(stats=stats, impl="sgl_kernel", notes=notes)


def _rotary(is_neox: bool) -> Callable[[ModuleType, Any, Any, Tolerance, int, str], CaseResult]:
    def case(sgl: ModuleType, torch: Any, dtype: Any, tol: Tolerance, seed: int, device: str) -> CaseResult:
        gen = torch.Generator(device=device).manual_seed(seed)
        head, max_pos = 128, 4096
        # The kernel reads the cache in the query's dtype (SGLang converts it so); the reference reads the same
        # rounded values, so only the kernel's arithmetic is judged.
        cache = cos_sin_cache(max_pos, head).to(device, dtype)
        results = []
        for tokens in (1, 129):
            positions = torch.randint(0, max_pos, (tokens,), device=device, generator=gen)
            q = torch.randn(tokens, 32 * head, device=device, generator=gen).to(dtype)
            k = torch.randn(tokens, 8 * head, device=device, generator=gen).to(dtype)
            want_q = rope_ref(positions, q, head, cache, is_neox)
            want_k = rope_ref(positions, k, head, cache, is_neox)
            sgl.rotary_embedding(positions, q, k, head, cache, is_neox)  # in place
            results.append((f"{tokens} tokens q", measure(q, want_q, tol)))
            results.append((f"{tokens} tokens k", measure(k, want_k, tol)))
        stats, notes = _combine(results)
        return CaseResult(stats=stats, impl="sgl_kernel", notes=notes)

    return case


def _probs(torch: Any, gen: Any, rows: int, vocab: int, scale: float, device: str) -> Any:
    return torch.softmax(scale * torch.randn(rows, vocab, device=device, generator=gen), dim=-1)


def _sampling_impl(sgl: ModuleType) -> str:
    has_fi = bool(getattr(getattr(sgl, "sampling", None), "_has_flashinfer", False))
    return "flashinfer.sampling (via sgl_kernel)" if has_fi else "sgl_kernel"


def top_k_renorm_prob(
    sgl: ModuleType, torch: Any, dtype: Any, tol: Tolerance, seed: int, device: str
) -> CaseResult:
    gen = torch.Generator(device=device).manual_seed(seed)
    probs = _probs(torch, gen, 16, 32000, 3.0, device).to(dtype)
    results = []
    for k in (1, 20, 1000):
        got = sgl.top_k_renorm_prob(probs, k)
        results.append((f"k={k}", measure(got, top_k_renorm_ref(probs, k), tol)))
    ks = torch.randint(1, 200, (16,), device=device, generator=gen, dtype=torch.int32)
    got = sgl.top_k_renorm_prob(probs, ks)
    want = torch.stack([top_k_renorm_ref(probs[i : i + 1], int(ks[i]))[0] for i in range(16)])
    results.append(("per-row k", measure(got, want, tol)))
    stats, notes = _combine(results)
    return CaseResult(stats=stats, impl=_sampling_impl(sgl), notes=notes)


def top_p_renorm_prob(
    sgl: ModuleType, torch: Any, dtype: Any, tol: Tolerance, seed: int, device: str
) -> CaseResult:
    gen = torch.Generator(device=device).manual_seed(seed)
    probs = _probs(torch, gen, 16, 32000, 3.0, device).to(dtype)
    # Each row's top_p lies halfway between two consecutive cumulative sums of its sorted probabilities, so the
    # kept set is unambiguous: a float32 rounding of the pivot cannot move a token in or out.
    ordered = torch.sort(probs.float(), dim=-1, descending=True).values
    cum = torch.cumsum(ordered, dim=-1)
    rng = random.Random(seed)
    cut = torch.tensor([rng.randrange(0, 60) for _ in range(16)], device=device)
    rows = torch.arange(16, device=device)
    top_p = ((cum[rows, cut] + cum[rows, cut + 1]) / 2).float()
    got = sgl.top_p_renorm_prob(probs, top_p)
    stats = measure(got, top_p_renorm_ref(probs, top_p), tol)
    return CaseResult(stats=stats, impl=_sampling_impl(sgl), notes={"kept": str((cut + 2).tolist())})


def top_k_top_p_sampling(
    flashinfer: ModuleType, torch: Any, seed: int, device: str, draws: int = 65536
) -> CaseResult:
    """Sampling with a fixed seed, judged statistically: `draws` samples of one 64-token distribution through
    flashinfer's top_k_top_p_sampling_from_probs, against the top-k-then-top-p renormalised reference by a
    chi-square test; a sample outside the kept set fails outright."""
    gen = torch.Generator(device=device).manual_seed(seed)
    probs = _probs(torch, gen, 1, 64, 1.5, device)
    k, p = 16, 0.9
    want = top_p_renorm_ref(top_k_renorm_ref(probs, k), torch.tensor([p], device=device))[0]
    sampler = torch.Generator(device=device).manual_seed(seed + 1)
    indices = torch.zeros(draws, dtype=torch.int32, device=device)
    samples = flashinfer.sampling.top_k_top_p_sampling_from_probs(
        probs, k, p, indices=indices, generator=sampler
    )
    counts = torch.bincount(samples.long(), minlength=64).tolist()
    expected = (want.double() * draws).tolist()
    outside = sum(c for c, e in zip(counts, expected, strict=True) if e == 0)
    stat, pvalue, dof = chi_square_pvalue(counts, expected)
    empirical = torch.tensor(counts, dtype=torch.float64) / draws
    max_err = float((empirical - want.double().cpu()).abs().max())
    stats = ErrorStats(
        max_abs_err=max_err,
        worst_ratio=0.0 if pvalue >= 1e-4 and outside == 0 else 2.0,
        mismatches=outside + (0 if pvalue >= 1e-4 else 1),
        elements=draws,
        worst=(0, 0.0, 0.0),
    )
    notes = {
        "chi2": f"{stat:.2f}",
        "dof": str(dof),
        "pvalue": f"{pvalue:.4g}",
        "outside_kept_set": str(outside),
        "draws": str(draws),
        "top_k": str(k),
        "top_p": str(p),
    }
    return CaseResult(stats=stats, impl="flashinfer.sampling", notes=notes)


#: (op, dtypes) -> case. The elementwise ops run in the deployment's activation dtypes; the probability kernels
#: take float32 (sgl_kernel casts them to float32 itself).
ELEMENTWISE: dict[
    str, tuple[tuple[str, ...], Callable[[ModuleType, Any, Any, Tolerance, int, str], CaseResult]]
] = {
    "rmsnorm": (("bfloat16", "float16"), rmsnorm),
    "fused_add_rmsnorm": (("bfloat16", "float16"), fused_add_rmsnorm),
    "silu_and_mul": (("bfloat16", "float16"), silu_and_mul),
    "rotary_embedding_neox": (("bfloat16", "float16"), _rotary(is_neox=True)),
    "rotary_embedding_gptj": (("bfloat16", "float16"), _rotary(is_neox=False)),
    "top_k_renorm_prob": (("float32",), top_k_renorm_prob),
    "top_p_renorm_prob": (("float32",), top_p_renorm_prob),
}


# --------------------------------------------------------------------------- EAGLE tree kernels


@dataclass(frozen=True, kw_only=True)
class TreeCase:
    """A batch of random trees with their draft tokens and the target's view of them."""

    trees: tuple[EagleTree, ...]
    seq_lens: tuple[int, ...]
    width: int
    vocab: int
    #: Per request, per node: draft token.
    tokens: tuple[tuple[int, ...], ...]
    #: Per request, per node: the target's argmax after that node (greedy).
    target: tuple[tuple[int, ...], ...]
    #: Per request, per node, per token: the target's probabilities (sampling), as float32 values.
    probs: tuple[tuple[tuple[float, ...], ...], ...] = ()
    coins: tuple[tuple[float, ...], ...] = ()
    final_coins: tuple[float, ...] = ()
    threshold_single: float = 1.0
    threshold_acc: float = 1.0


def build_tree(sgl: ModuleType, torch: Any, case: TreeCase, mode: int, device: str) -> list[str]:
    """Run build_tree_kernel_efficient on the batch; the differences from the reference, as text."""
    trees, n, bs = case.trees, case.trees[0].num_draft, len(case.trees)
    topk, depth = trees[0].topk, trees[0].depth
    # [bs, topk * (depth - 1) + 1], or [bs, 0] for a single step (SGLang passes an empty one then)
    parents = torch.tensor([list(t.parent_list) for t in trees], dtype=torch.int64, device=device).reshape(
        bs, len(trees[0].parent_list)
    )
    selected = torch.tensor([list(t.selected) for t in trees], dtype=torch.int64, device=device)
    seq = torch.tensor(case.seq_lens, dtype=torch.int64, device=device)
    size = sum(case.seq_lens) * n + n * n * bs if mode == 0 else n * n * bs
    mask = torch.full((size,), True, dtype=torch.bool, device=device)
    positions = torch.empty(bs * n, dtype=torch.int64, device=device)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.int64, device=device)
    sgl.build_tree_kernel_efficient(
        parents, selected, seq, mask, positions, retrieve[0], retrieve[1], retrieve[2], topk, depth, n, mode
    )
    _sync(torch, device)
    got_mask, got_pos, got_ret = mask.tolist(), positions.tolist(), retrieve.tolist()
    problems = []
    start = 0
    for b, (tree, seq_len) in enumerate(zip(trees, case.seq_lens, strict=True)):
        want = build_tree_ref(tree, seq_len, b * n)
        checks: dict[str, tuple[object, object]] = {
            "positions": (tuple(got_pos[b * n : (b + 1) * n]), want.positions),
            "retrieve_index": (tuple(got_ret[0][b]), want.retrieve_index),
            "retrieve_next_token": (tuple(got_ret[1][b]), want.next_token),
            "retrieve_next_sibling": (tuple(got_ret[2][b]), want.next_sibling),
        }
        row_len = seq_len + n if mode == 0 else n
        prefix = seq_len if mode == 0 else 0
        block = got_mask[start : start + n * row_len]
        rows = tuple(tuple(block[i * row_len + prefix : (i + 1) * row_len]) for i in range(n))
        checks["tree_mask"] = (rows, want.mask)
        if mode == 0:
            checks["tree_mask prefix"] = (
                all(block[i * row_len + j] for i in range(n) for j in range(prefix)),
                True,
            )
        start += n * row_len
        problems += [
            f"request {b} {name}: kernel {got} != reference {exp}"
            for name, (got, exp) in checks.items()
            if got != exp
        ]
    return problems


def _retrieve(torch: Any, case: TreeCase, device: str) -> tuple[Any, Any, Any]:
    n = case.trees[0].num_draft
    layouts = [
        build_tree_ref(t, s, b * n) for b, (t, s) in enumerate(zip(case.trees, case.seq_lens, strict=True))
    ]

    def as_tensor(rows: list[list[int]]) -> Any:
        return torch.tensor(rows, dtype=torch.int64, device=device)

    return (
        as_tensor([list(lay.retrieve_index) for lay in layouts]),
        as_tensor([list(lay.next_token) for lay in layouts]),
        as_tensor([list(lay.next_sibling) for lay in layouts]),
    )


def verify_greedy(sgl: ModuleType, torch: Any, case: TreeCase, device: str) -> list[str]:
    """Run verify_tree_greedy; the differences from greedy_accept_ref, as text."""
    n, bs = case.trees[0].num_draft, len(case.trees)
    index, next_token, next_sibling = _retrieve(torch, case, device)
    candidates = torch.tensor([list(t) for t in case.tokens], dtype=torch.int64, device=device)
    target = torch.tensor([list(t) for t in case.target], dtype=torch.int64, device=device)
    predicts = torch.full((bs * n,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, case.width), -1, dtype=torch.int32, device=device)
    accept_num = torch.zeros(bs, dtype=torch.int32, device=device)
    # Positional: the wrapper's keyword names changed spelling across releases (retrive_* / retrieve_*).
    sgl.verify_tree_greedy(
        predicts, accept_index, accept_num, candidates, index, next_token, next_sibling, target
    )
    _sync(torch, device)
    got_pred, got_idx, got_num = predicts.tolist(), accept_index.tolist(), accept_num.tolist()
    problems = []
    for b, tree in enumerate(case.trees):
        want = greedy_accept_ref(tree, case.tokens[b], case.target[b], case.width)
        want_idx = [b * n + node for node in want.path] + [-1] * (case.width - len(want.path))
        want_pred = [-1] * n
        for node, token in want.predicts:
            want_pred[node] = token
        if got_num[b] != want.accepted:
            problems.append(
                f"request {b}: accepted {got_num[b]}, reference {want.accepted} (path {want.path})"
            )
        if got_idx[b] != want_idx:
            problems.append(f"request {b}: accept_index {got_idx[b]}, reference {want_idx}")
        if got_pred[b * n : (b + 1) * n] != want_pred:
            problems.append(f"request {b}: predicts {got_pred[b * n : (b + 1) * n]}, reference {want_pred}")
    return problems


def verify_sampling(sgl: ModuleType, torch: Any, case: TreeCase, device: str) -> tuple[list[str], int]:
    """Run tree_speculative_sampling_target_only; (differences from the reference, requests not judged because
    a float32 comparison sat on its threshold)."""
    n, bs = case.trees[0].num_draft, len(case.trees)
    index, next_token, next_sibling = _retrieve(torch, case, device)
    candidates = torch.tensor([list(t) for t in case.tokens], dtype=torch.int64, device=device)
    target_probs = torch.tensor(
        [[list(r) for r in rows] for rows in case.probs], dtype=torch.float32, device=device
    )
    draft_probs = torch.zeros_like(target_probs)
    coins = torch.tensor([list(c) for c in case.coins], dtype=torch.float32, device=device)
    final = torch.tensor(list(case.final_coins), dtype=torch.float32, device=device)
    predicts = torch.full((bs * n,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, case.width), -1, dtype=torch.int32, device=device)
    accept_num = torch.zeros(bs, dtype=torch.int32, device=device)
    sgl.tree_speculative_sampling_target_only(
        predicts,
        accept_index,
        accept_num,
        candidates,
        index,
        next_token,
        next_sibling,
        coins,
        final,
        target_probs,
        draft_probs,
        case.threshold_single,
        case.threshold_acc,
        True,
    )
    _sync(torch, device)
    got_pred, got_idx, got_num = predicts.tolist(), accept_index.tolist(), accept_num.tolist()
    problems, ties = [], 0
    for b, tree in enumerate(case.trees):
        want, rejected = sampling_accept_ref(
            tree,
            case.tokens[b],
            case.probs[b],
            case.coins[b],
            width=case.width,
            threshold_single=case.threshold_single,
            threshold_acc=case.threshold_acc,
        )
        if want.ambiguous:
            ties += 1
            continue
        want_idx = [b * n + node for node in want.path] + [-1] * (case.width - len(want.path))
        if got_num[b] != want.accepted or got_idx[b] != want_idx:
            problems.append(
                f"request {b}: accepted {got_num[b]} {got_idx[b]}, reference {want.accepted} {want_idx}"
            )
            continue
        for node, token in want.predicts:
            if got_pred[b * n + node] != token:
                problems.append(f"request {b}: predicts[{node}] {got_pred[b * n + node]}, reference {token}")
        last = want.path[-1]
        allowed, tie = bonus_token_window(case.probs[b][last], rejected, case.final_coins[b])
        ties += int(tie)
        if got_pred[b * n + last] not in allowed:
            problems.append(
                f"request {b}: bonus token {got_pred[b * n + last]} after node {last}, "
                f"reference {sorted(allowed)}"
            )
    return problems, ties
