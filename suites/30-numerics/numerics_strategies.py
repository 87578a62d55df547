"""hypothesis strategies for the EAGLE tree kernels of 30-numerics (imported only where hypothesis is)."""

from __future__ import annotations

import math
import random
import struct

from hypothesis import strategies as st
from numerics_cases import TreeCase

from stackfarm.numerics.kernels import max_draft_tokens, random_tree

_THRESHOLDS = ((1.0, 1.0), (1.0, 0.5), (0.3, 1.0), (0.6, 0.8))


def _f32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _distribution(rnd: random.Random, vocab: int, scale: float) -> tuple[float, ...]:
    # Box-Muller from uniforms: hypothesis's Random draws floats for gauss() that can be inf.
    logits = [
        scale * math.sqrt(-2.0 * math.log(1.0 - rnd.random())) * math.cos(2 * math.pi * rnd.random())
        for _ in range(vocab)
    ]
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = sum(weights)
    return tuple(_f32(w / total) for w in weights)


@st.composite
def tree_cases(draw: st.DrawFn, *, sampling: bool) -> TreeCase:
    """A batch of 1-4 random EAGLE trees (topk 1-8, 1-5 steps, <= 32 draft tokens) with draft tokens that are
    distinct among siblings (they are a top-k), and a target that agrees with some child 90 % of the time."""
    topk = draw(st.sampled_from((1, 2, 3, 4, 8)))
    depth = draw(st.sampled_from((1, 2, 3, 4, 5)))
    num_draft = draw(st.integers(2, min(max_draft_tokens(topk, depth), 32)))
    batch = draw(st.integers(1, 4))
    rnd = draw(st.randoms(use_true_random=False))  # structure and tokens: few draws, shrinkable
    bulk = random.Random(
        draw(st.integers(0, 2**32 - 1))
    )  # distributions and coins: too many draws for hypothesis
    trees = tuple(random_tree(rnd, topk, depth, num_draft) for _ in range(batch))
    seq_lens = tuple(draw(st.integers(1, 300)) for _ in range(batch))
    width = draw(st.one_of(st.just(depth + 1), st.integers(2, depth + 1)))  # SGLang verifies depth + 1
    vocab = 256 if sampling else 64
    scale = draw(st.sampled_from((1.0, 4.0, 8.0)))
    tokens, target, probs, coins = [], [], [], []
    for tree in trees:
        dists = [_distribution(bulk, vocab, scale) for _ in range(num_draft)] if sampling else []
        toks = [rnd.randrange(vocab)] + [0] * (num_draft - 1)
        for node in range(num_draft):
            kids = tree.children(node)
            if sampling:  # children are drawn from the parent's most likely tokens, as a draft model would
                pool = sorted(range(vocab), key=lambda t: dists[node][t], reverse=True)[: max(4, len(kids))]
            else:
                pool = list(range(vocab))
            for kid, tok in zip(kids, rnd.sample(pool, len(kids)), strict=True):
                toks[kid] = tok
        tokens.append(tuple(toks))
        target.append(
            tuple(
                toks[rnd.choice(tree.children(node))]
                if tree.children(node) and rnd.random() < 0.9
                else rnd.randrange(vocab)
                for node in range(num_draft)
            )
        )
        probs.append(tuple(dists))
        coins.append(tuple(_f32(bulk.random()) for _ in range(num_draft)))
    single, acc = draw(st.sampled_from(_THRESHOLDS)) if sampling else (1.0, 1.0)
    return TreeCase(
        trees=trees,
        seq_lens=seq_lens,
        width=width,
        vocab=vocab,
        tokens=tuple(tokens),
        target=tuple(target),
        probs=tuple(probs) if sampling else (),
        coins=tuple(coins) if sampling else (),
        final_coins=tuple(_f32(bulk.random()) for _ in trees) if sampling else (),
        threshold_single=single,
        threshold_acc=acc,
    )
