"""Kernel references: float32 torch references for the deployment's elementwise and sampling kernels, and a
reference EAGLE tree acceptance (pure Python) to check sgl-kernel's verify kernels against.

The elementwise references take the kernel's own (bf16 / fp16) inputs, upcast them, and compute in float32 the
formula the kernel documents, so the only difference left is the kernel's rounding; `measure` then applies a
`Tolerance` (|got - ref| <= atol + rtol * |ref|) and says by how much the worst element used its bound.

The tree references restate, from SGLang's EAGLE tree layout (eagle_utils.organize_draft_results and
spec_utils.select_top_k_tokens), what a tree *means*, without the kernels' linked lists:

- node 0 is the root (the last verified token); node i >= 1 is the i-th smallest selected score index;
- a score index s has parent score index parent_list[s // topk] (s // topk == 0: the root); its depth is one more;
- greedy verify walks from the root, at each node taking the first child (in node order) whose draft token is
  the target's argmax there, for at most `width - 1` steps;
- target-only sampling verify walks the same way but accepts a child when the coin of its parent is <= the
  running sum of the target probabilities of the siblings tried so far (over threshold_acc), or when the child's
  own probability is >= threshold_single; it then samples the bonus token from relu(target - rejected).

`random_tree` builds trees the way SGLang's draft stage does (topk children per expanded node, topk nodes of
each step expanded in the next), so every tree the kernels see here is one SGLang can produce.
"""

from __future__ import annotations

import itertools
import math
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .settings import Tolerance

if TYPE_CHECKING:
    import torch


# --------------------------------------------------------------------------- elementwise references


@dataclass(frozen=True, kw_only=True)
class ErrorStats:
    """How a kernel output compares with its reference under a tolerance."""

    max_abs_err: float
    #: max over elements of |got - ref| / (atol + rtol |ref|): <= 1 passes.
    worst_ratio: float
    mismatches: int
    elements: int
    #: The flat index, got and ref of the element with the worst ratio.
    worst: tuple[int, float, float]

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    @property
    def match_rate(self) -> float:
        return 1.0 - self.mismatches / self.elements if self.elements else 1.0

    def describe(self) -> str:
        index, got, ref = self.worst
        return (
            f"{self.mismatches}/{self.elements} elements outside tolerance, max abs err {self.max_abs_err:.3g}, "
            f"worst at {index}: got {got:.6g}, ref {ref:.6g} ({self.worst_ratio:.2f}x its bound)"
        )


def measure(got: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> ErrorStats:
    """Compare a kernel output with a reference (any shapes that broadcast equal), in float64."""
    import torch

    g = got.detach().to("cpu", torch.float64).flatten()
    r = ref.detach().to("cpu", torch.float64).flatten()
    if g.shape != r.shape:
        raise ValueError(f"shape mismatch: kernel {tuple(got.shape)} vs reference {tuple(ref.shape)}")
    err = (g - r).abs()
    # NaN anywhere counts as an infinite error (a NaN comparison is otherwise silently False).
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    ratio = err / (tol.atol + tol.rtol * r.abs())
    worst = int(torch.argmax(ratio).item()) if ratio.numel() else 0
    return ErrorStats(
        max_abs_err=float(err.max().item()) if err.numel() else 0.0,
        worst_ratio=float(ratio[worst].item()) if ratio.numel() else 0.0,
        mismatches=int((ratio > 1.0).sum().item()),
        elements=int(err.numel()),
        worst=(worst, float(g[worst].item()), float(r[worst].item())) if err.numel() else (0, 0.0, 0.0),
    )


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """out = x / sqrt(mean(x^2) + eps) * weight, in float32."""
    import torch

    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()


def fused_add_rmsnorm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalised, new residual): residual += x, then x = rmsnorm(residual), in float32."""
    total = x.float() + residual.float()
    return rmsnorm_ref(total, weight, eps), total


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] for x of last dimension 2d, in float32."""
    import torch

    xf = x.float()
    half = xf.shape[-1] // 2
    return torch.nn.functional.silu(xf[..., :half]) * xf[..., half:]


def cos_sin_cache(max_positions: int, rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    """[max_positions, rotary_dim] float32: cos of each frequency, then sin (SGLang's RotaryEmbedding layout)."""
    import torch

    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1).float()


def rope_ref(
    positions: torch.Tensor, x: torch.Tensor, head_size: int, cache: torch.Tensor, is_neox: bool
) -> torch.Tensor:
    """Rotary embedding of x [tokens, heads * head_size] at `positions`, rotating every dimension of each head.

    neox style rotates (x[i], x[i + d/2]); GPT-J style rotates the interleaved pairs (x[2i], x[2i + 1]).
    """
    tokens = x.shape[0]
    xf = x.float().reshape(tokens, -1, head_size)
    rows = cache.float()[positions.long()]
    half = rows.shape[-1] // 2
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    if is_neox:
        x1, x2 = xf[..., :half], xf[..., half : 2 * half]
    else:
        x1, x2 = xf[..., 0 : 2 * half : 2], xf[..., 1 : 2 * half : 2]
    out1, out2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    out = xf.clone()
    if is_neox:
        out[..., :half], out[..., half : 2 * half] = out1, out2
    else:
        out[..., 0 : 2 * half : 2], out[..., 1 : 2 * half : 2] = out1, out2
    return out.reshape(tokens, -1)


def top_k_renorm_ref(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Keep each row's k largest probabilities, zero the rest, renormalise (float32)."""
    import torch

    p = probs.float()
    kth = torch.topk(p, k, dim=-1).values[..., -1:]
    kept = torch.where(p >= kth, p, torch.zeros_like(p))
    return kept / kept.sum(dim=-1, keepdim=True)


def top_p_renorm_ref(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep each row's smallest set of largest probabilities whose sum reaches top_p, renormalise (float32)."""
    import torch

    p = probs.float()
    ordered, order = torch.sort(p, dim=-1, descending=True)
    before = torch.cumsum(ordered, dim=-1) - ordered  # mass strictly above each token
    keep_sorted = before < top_p.float().reshape(-1, 1)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = torch.where(keep, p, torch.zeros_like(p))
    return kept / kept.sum(dim=-1, keepdim=True)


def chi_square_pvalue(counts: Sequence[int], expected: Sequence[float]) -> tuple[float, float, int]:
    """Pearson's chi-square goodness of fit: (statistic, p-value, degrees of freedom), cells with expected > 0."""
    import torch

    pairs = [(c, e) for c, e in zip(counts, expected, strict=True) if e > 0]
    stat = sum((c - e) ** 2 / e for c, e in pairs)
    dof = max(len(pairs) - 1, 1)
    pvalue = float(
        torch.special.gammaincc(
            torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        ).item()
    )
    return stat, pvalue, dof


# --------------------------------------------------------------------------- EAGLE trees


@dataclass(frozen=True, kw_only=True)
class EagleTree:
    """One request's draft tree in SGLang's encoding (what build_tree_kernel_efficient takes)."""

    topk: int
    depth: int
    #: [topk * (depth - 1) + 1] score indices of the nodes expanded at each step (-1 for the root).
    parent_list: tuple[int, ...]
    #: [num_draft - 1] selected score indices, ascending.
    selected: tuple[int, ...]

    @property
    def num_draft(self) -> int:
        return len(self.selected) + 1

    def parent(self, node: int) -> int:
        """The parent node of node >= 1 (0 is the root)."""
        tb = self.selected[node - 1] // self.topk
        if tb == 0:
            return 0
        return self.selected.index(self.parent_list[tb]) + 1

    def depth_of(self, node: int) -> int:
        steps = 0
        while node:
            node, steps = self.parent(node), steps + 1
        return steps

    def children(self, node: int) -> tuple[int, ...]:
        return tuple(c for c in range(1, self.num_draft) if self.parent(c) == node)


def max_draft_tokens(topk: int, depth: int) -> int:
    """The largest num_draft for which `random_tree` always finds enough nodes: a chain of `depth` for topk 1;
    else every step-0 node is expanded, so step 0 and step 1 (topk + topk^2 nodes) are always reachable."""
    if topk == 1:
        return depth + 1
    return 1 + topk + (topk * topk if depth > 1 else 0)


def random_tree(rng: random.Random, topk: int, depth: int, num_draft: int) -> EagleTree:
    """A tree SGLang's draft stage could build: step 0 proposes topk children of the root; each later step
    proposes topk children for each of the topk nodes the previous step chose to expand; then num_draft - 1 score
    indices are selected so that every selected node's parent is selected (or is the root)."""
    parent_list = [-1, *range(topk)]
    expanded = list(range(topk))  # score indices expanded at the current step
    parents: dict[int, int] = dict.fromkeys(range(topk), -1)  # score index -> parent score index (-1: root)
    for step in range(1, depth):
        base = topk + topk * topk * (step - 1)
        children = {base + m * topk + c: expanded[m] for m in range(topk) for c in range(topk)}
        parents.update(children)
        expanded = rng.sample(sorted(children), topk)
        if step < depth - 1:
            parent_list += expanded
    if depth == 1:
        parent_list = []
    selected: set[int] = set()
    frontier = [s for s in parents if parents[s] == -1]
    while frontier and len(selected) < num_draft - 1:
        pick = frontier.pop(rng.randrange(len(frontier)))
        selected.add(pick)
        frontier += [s for s, p in parents.items() if p == pick]
    return EagleTree(topk=topk, depth=depth, parent_list=tuple(parent_list), selected=tuple(sorted(selected)))


@dataclass(frozen=True, kw_only=True)
class TreeLayout:
    """What build_tree_kernel_efficient computes for one request (indices local to the request)."""

    positions: tuple[int, ...]
    retrieve_index: tuple[int, ...]
    next_token: tuple[int, ...]
    next_sibling: tuple[int, ...]
    #: mask[i][j]: draft token i attends to draft token j (root, itself and its ancestors).
    mask: tuple[tuple[bool, ...], ...]


def build_tree_ref(tree: EagleTree, seq_len: int, offset: int) -> TreeLayout:
    """The reference layout; `offset` is the request's first row in the batch (batch index x num_draft)."""
    n = tree.num_draft
    next_token, next_sibling = [-1] * n, [-1] * n
    for node in range(n):
        kids = tree.children(node)
        if kids:
            next_token[node] = kids[0]
            for a, b in itertools.pairwise(kids):
                next_sibling[a] = b
    mask = []
    for node in range(n):
        row = [False] * n
        cur = node
        row[0] = True
        while cur:
            row[cur] = True
            cur = tree.parent(cur)
        mask.append(tuple(row))
    return TreeLayout(
        positions=tuple(seq_len + tree.depth_of(i) for i in range(n)),
        retrieve_index=tuple(offset + i for i in range(n)),
        next_token=tuple(next_token),
        next_sibling=tuple(next_sibling),
        mask=tuple(mask),
    )


@dataclass(frozen=True, kw_only=True)
class Acceptance:
    """One request's verify result, indices local to the request (0 = root)."""

    path: tuple[int, ...]
    #: node -> token written into `predicts` (every node on the path).
    predicts: tuple[tuple[int, int], ...]
    #: True when a float comparison of the sampling walk was within rounding of its threshold (either outcome is
    #: then correct, and the kernel's is not judged).
    ambiguous: bool = False

    @property
    def accepted(self) -> int:
        return len(self.path) - 1


def greedy_accept_ref(
    tree: EagleTree, tokens: Sequence[int], target: Sequence[int], width: int
) -> Acceptance:
    """Greedy tree verify: tokens[i] is node i's draft token, target[i] the target's argmax after node i."""
    path = [0]
    while len(path) < width:
        cur = path[-1]
        match = next((c for c in tree.children(cur) if tokens[c] == target[cur]), None)
        if match is None:
            break
        path.append(match)
    predicts = [(a, tokens[b]) for a, b in itertools.pairwise(path)] + [(path[-1], target[path[-1]])]
    return Acceptance(path=tuple(path), predicts=tuple(predicts))


def _f32(value: float) -> float:
    """Round to float32, to replay the kernel's float32 running sum exactly."""
    rounded: float = struct.unpack("f", struct.pack("f", value))[0]
    return rounded


#: Relative slack within which a float32 comparison of the sampling walk counts as a tie.
_TIE = 1e-6


def sampling_accept_ref(
    tree: EagleTree,
    tokens: Sequence[int],
    probs: Sequence[Sequence[float]],
    coins: Sequence[float],
    *,
    width: int,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
) -> tuple[Acceptance, dict[int, float]]:
    """Target-only tree sampling verify; returns the acceptance and the rejected mass at the last node
    ({token: target prob} of the children tried and rejected there), which the bonus token must avoid."""
    threshold_acc = max(threshold_acc, 1e-9)
    path, ambiguous = [0], False
    rejected: dict[int, float] = {}
    coin = _f32(coins[0])
    for _ in range(1, width):
        cur = path[-1]
        acc = 0.0
        rejected = {}
        chosen = None
        for child in tree.children(cur):
            p = _f32(probs[cur][tokens[child]])
            acc = _f32(acc + p)
            ratio = _f32(acc / _f32(threshold_acc))
            if abs(coin - ratio) <= _TIE * max(1.0, ratio) or abs(p - threshold_single) <= _TIE:
                ambiguous = True
            if coin <= ratio or p >= threshold_single:
                chosen = child
                break
            rejected[tokens[child]] = p
        if chosen is None:
            break
        path.append(chosen)
        coin = _f32(coins[chosen])
    if len(path) == width:
        rejected = {}  # the bonus token after a fully accepted path has no draft distribution to subtract
    predicts = [(a, tokens[b]) for a, b in itertools.pairwise(path)]
    return Acceptance(path=tuple(path), predicts=tuple(predicts), ambiguous=ambiguous), rejected


def bonus_token_window(
    probs: Sequence[float], rejected: dict[int, float], coin: float, slack: float = 1e-5
) -> tuple[set[int], bool]:
    """The tokens the final sampling may return: u = coin * sum(relu(q - rejected)) falls in their cumulative
    interval, widened by `slack` x the total to allow for the kernel's float32 block sums. The flag says whether
    the window holds more than one token (a boundary tie)."""
    residual = [max(q - rejected.get(i, 0.0), 0.0) for i, q in enumerate(probs)]
    total = sum(residual)
    u = coin * total
    eps = slack * max(total, 1e-30)
    allowed: set[int] = set()
    running = 0.0
    for i, r in enumerate(residual):
        if r > 0 and running - eps <= u <= running + r + eps:
            allowed.add(i)
        running += r
    if not allowed or u >= total - eps:
        last = max((i for i, r in enumerate(residual) if r > 0), default=len(probs) - 1)
        allowed.add(last)  # u beyond the summed mass: the kernel returns the last valid token
    return allowed, len(allowed) > 1


__all__ = [
    "Acceptance",
    "EagleTree",
    "ErrorStats",
    "TreeLayout",
    "bonus_token_window",
    "build_tree_ref",
    "chi_square_pvalue",
    "cos_sin_cache",
    "fused_add_rmsnorm_ref",
    "greedy_accept_ref",
    "max_draft_tokens",
    "measure",
    "random_tree",
    "rmsnorm_ref",
    "rope_ref",
    "sampling_accept_ref",
    "silu_and_mul_ref",
    "top_k_renorm_ref",
    "top_p_renorm_ref",
]
