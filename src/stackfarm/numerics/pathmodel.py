"""The path model: a tiny Llama whose greedy output is known in advance *and* needs every kernel on the path.

The planted target (`planted`) repeats its last token because its attention and MLP add nothing to the residual
stream (``o_proj = down_proj = 0``): it checks the speculative logic, not the kernels, and a wrong attention kernel
passes it. A random target needs the kernels, but its top-2 logits are near-tied on a few percent of steps (gaps of
0 and 2^-8 nats measured on the H200), so two correct paths diverge at ties and a real bug hides among them. The
path model keeps the planted model's large margins and makes the next token a function that only correct
attention, MLP, norms and LM head compute:

    next token after position p  =  perm[token at p - 1]          (perm: a seeded permutation of the vocabulary)

- Embedding rows N(0, 1) with channel 0 set to a constant (a "bias channel": RMSNorm keeps it near 1 for every
  token); the LM head is the embedding (tied), so channel 0 shifts every logit alike.
- Layer 0's attention looks one position back, by RoPE alone: every head's query and key read only the bias
  channel (constant vectors), with the key rotated by each frequency's angle, so the score at lag l is
  ``A * sum_i cos((l - 1) * theta_i)``: peaked at l = 1, every other lag up to `max_positions` at most 69 % of the
  peak (`rope_theta` = ROPE_BASE makes every frequency high; measured by `lag_margin`). Values are the identity and
  ``o_proj = ALPHA x I``, so the residual becomes E[t] + ALPHA x E[t_prev] / rms.
- Layer 1's MLP is a key-value memory over the vocabulary (intermediate = vocab): gate and up rows are the
  embedding rows scaled by G, so silu(gate) * up fires ~ALPHA^2 = 4x harder on t_prev than on t; its down columns
  are GAMMA x E[perm[i]]. The final residual is dominated by E[perm[t_prev]], ~4x the next contribution.
- Every other sublayer writes nothing (o_proj / down_proj zero): its kernels run, its output cannot matter.

Margins: the top-1 logit is ~240 nats, the runner-up ~60 (hidden 256, vocab 1024): no near-tie anywhere, so any
divergence is real, and the baseline itself must produce `path_sequence` exactly (a broken kernel shared by both
runs is caught too). `bug` plants kernel-like defects into the target, for the checks that a divergence is caught:
``"attention"`` (the key unrotated: attention reads the current position, an off-by-one in the KV cache) and
``"mlp"`` (down columns shifted by one: the MLP's output row indexing is off). The EAGLE-3 draft (`path_draft_specs`)
computes the same function from its own token history (a lag-1 head and an MLP memory in its one layer) and gives
back the state it carries between steps, so its drafts are right: SGLang's accept path runs on every verify
(accept length 3.99 of 4 in `tests/test_numerics_path_draft.py`'s simulation of SGLang's draft forward; the
draft this replaced decoded the target's last aux state, proposed the token it had just been given, and measured
1.03 on the H200).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from .planted import TensorSpec, write_sharded
from .tinymodels import AUX_LAYERS, INIT_STD, LlamaShape, eagle3_config, llama_config

if TYPE_CHECKING:
    import torch

#: The path model's shape: the GPU target's, with an intermediate as wide as the vocabulary (the MLP memory).
PATH_TARGET = LlamaShape(intermediate=1024)
#: The CPU engine's (HF transformers in every cell): 4x fewer multiply-adds per token, head_dim kept (the lags).
CPU_PATH = LlamaShape(hidden=128, intermediate=256, heads=2, kv_heads=2, vocab=256, max_positions=512)
#: RoPE base: every frequency in [0.67, 1] rad per position, so lags are told apart sharply (see `lag_margin`).
ROPE_BASE = 1.5
#: The bias channel's value in the embedding.
BIAS = 1.0
#: Attention score at the right lag (after SGLang's and HF's 1/sqrt(head_dim) scaling).
PEAK_SCORE = 320.0
#: The previous token enters the residual with this weight (the current one with 1).
ALPHA = 2.0
#: The MLP memory's key scale x sqrt(hidden): the t_prev key's pre-activation is ~14 at hidden 256.
G = 1.0
#: The MLP memory's value scale x hidden: its output ~8x the embedding's norm at hidden 256.
GAMMA = 10.24
#: Planted kernel-like defects (`bug`).
Bug = Literal["attention", "mlp"]
BUGS: tuple[Bug, ...] = ("attention", "mlp")
SIDECAR_FUNCTION = "next = perm[previous token]"


def thetas(shape: LlamaShape, base: float = ROPE_BASE) -> list[float]:
    """RoPE's per-pair angles (rad per position), as HF and SGLang compute them for a Llama (neox style)."""
    half = shape.head_dim // 2
    return [base ** (-2.0 * i / shape.head_dim) for i in range(half)]


def lag_margin(shape: LlamaShape = PATH_TARGET, base: float = ROPE_BASE) -> float:
    """1 - (largest score at a wrong lag) / (score at lag 1), over every lag the model's positions allow."""
    angles = thetas(shape, base)

    def score(lag: int) -> float:
        return sum(math.cos((lag - 1) * t) for t in angles)

    peak = score(1)
    other = max(score(lag) for lag in range(shape.max_positions) if lag != 1)
    return 1.0 - other / peak


def permutation(vocab: int, seed: int) -> list[int]:
    """The planted function's permutation of token ids (seeded, the same for target, sequence and tests)."""
    perm = list(range(vocab))
    random.Random(seed * 7919 + 17).shuffle(perm)
    return perm


def path_sequence(prompt: Sequence[int], new_tokens: int, vocab: int, seed: int = 0) -> list[int]:
    """What the path target generates greedily after `prompt`: each token is perm[the token two back]."""
    perm = permutation(vocab, seed)
    seq = list(prompt)
    for _ in range(new_tokens):
        seq.append(perm[seq[-2]] if len(seq) >= 2 else perm[seq[-1]])
    return seq[len(prompt) :]


def _embedding(shape: LlamaShape, seed: int) -> Callable[[], torch.Tensor]:
    def make() -> torch.Tensor:
        import torch

        gen = torch.Generator().manual_seed(seed * 1_000_003)
        table = torch.randn(shape.vocab, shape.hidden, generator=gen)
        table[:, 0] = BIAS
        return table

    return make


def _rnd(seed: int, salt: int, *size: int) -> Callable[[], torch.Tensor]:
    def make() -> torch.Tensor:
        import torch

        gen = torch.Generator().manual_seed(seed * 1_000_003 + salt)
        return torch.randn(*size, generator=gen) * INIT_STD

    return make


def _zeros(*size: int) -> Callable[[], torch.Tensor]:
    return lambda: __import__("torch").zeros(*size)


def _ones(n: int) -> Callable[[], torch.Tensor]:
    return lambda: __import__("torch").ones(n)


def _qk(shape: LlamaShape, *, rotate: bool) -> Callable[[], torch.Tensor]:
    """q_proj (rotate False) or k_proj (rotate True) of layer 0: every head reads only the bias channel."""

    def make() -> torch.Tensor:
        import torch

        half = shape.head_dim // 2
        amp = math.sqrt(PEAK_SCORE * math.sqrt(shape.head_dim) / half)
        head = torch.zeros(shape.head_dim)
        for i, theta in enumerate(thetas(shape)):
            head[i] = amp * (math.cos(theta) if rotate else 1.0)
            head[i + half] = amp * (math.sin(theta) if rotate else 0.0)
        heads = shape.heads if not rotate else shape.kv_heads
        weight = torch.zeros(heads * shape.head_dim, shape.hidden)
        weight[:, 0] = head.repeat(heads) / BIAS
        return weight

    return make


def _memory(shape: LlamaShape, seed: int, *, role: str, shift: int = 0) -> Callable[[], torch.Tensor]:
    """Layer 1's MLP memory: gate/up rows G x E[i] (role "key"), down columns GAMMA x E[perm[i + shift]]."""

    def make() -> torch.Tensor:
        import torch

        table = _embedding(shape, seed)()
        table[:, 0] = 0.0  # the memory keys and values ignore the bias channel
        if role == "key":
            return (table * (G / math.sqrt(shape.hidden))).contiguous()
        perm = torch.tensor(permutation(shape.vocab, seed))
        rows = perm[(torch.arange(shape.vocab) + shift) % shape.vocab]
        return (table[rows] * (GAMMA / shape.hidden)).t().contiguous()

    return make


def _check(shape: LlamaShape) -> None:
    if shape.intermediate < shape.vocab or shape.layers < 2 or shape.kv_heads != shape.heads:
        raise ValueError(
            f"the path model needs intermediate >= vocab, >= 2 layers and no grouped KV heads, not {shape}"
        )


def path_target_specs(
    shape: LlamaShape = PATH_TARGET, *, seed: int = 0, bug: Bug | None = None
) -> list[TensorSpec]:
    """The path target's tensors (module docstring), with `bug` planted if given."""
    _check(shape)
    h, q, inter = shape.hidden, shape.heads * shape.head_dim, shape.intermediate
    specs = [TensorSpec("model.embed_tokens.weight", (shape.vocab, h), _embedding(shape, seed))]
    for layer in range(shape.layers):
        p, salt = f"model.layers.{layer}.", 100 * (layer + 1)
        if layer == 0:
            attn = [
                TensorSpec(f"{p}self_attn.q_proj.weight", (q, h), _qk(shape, rotate=False)),
                TensorSpec(f"{p}self_attn.k_proj.weight", (q, h), _qk(shape, rotate=bug != "attention")),
                TensorSpec(f"{p}self_attn.v_proj.weight", (q, h), lambda: __import__("torch").eye(h)),
                TensorSpec(f"{p}self_attn.o_proj.weight", (h, q), lambda: __import__("torch").eye(h) * ALPHA),
            ]
        else:
            attn = [
                TensorSpec(f"{p}self_attn.{n}_proj.weight", (q, h), _rnd(seed, salt + i, q, h))
                for i, n in enumerate(("q", "k", "v"))
            ] + [TensorSpec(f"{p}self_attn.o_proj.weight", (h, q), _zeros(h, q))]
        if layer == 1:
            mlp = [
                TensorSpec(f"{p}mlp.gate_proj.weight", (inter, h), _memory(shape, seed, role="key")),
                TensorSpec(f"{p}mlp.up_proj.weight", (inter, h), _memory(shape, seed, role="key")),
                TensorSpec(
                    f"{p}mlp.down_proj.weight",
                    (h, inter),
                    _memory(shape, seed, role="value", shift=1 if bug == "mlp" else 0),
                ),
            ]
        else:
            mlp = [
                TensorSpec(f"{p}mlp.gate_proj.weight", (inter, h), _rnd(seed, salt + 4, inter, h)),
                TensorSpec(f"{p}mlp.up_proj.weight", (inter, h), _rnd(seed, salt + 5, inter, h)),
                TensorSpec(f"{p}mlp.down_proj.weight", (h, inter), _zeros(h, inter)),
            ]
        norms = [
            TensorSpec(f"{p}input_layernorm.weight", (h,), _ones(h)),
            TensorSpec(f"{p}post_attention_layernorm.weight", (h,), _ones(h)),
        ]
        specs += attn + mlp + norms
    specs.append(TensorSpec("model.norm.weight", (h,), _ones(h)))
    return specs


#: The draft's residual channels: block A (the token one back, which the draft's memory reads) and block B (its
#: memory's values, which its LM head reads); channel 0 stays empty (the bias channel lives in the embeddings).
DRAFT_A = range(1, 65)
DRAFT_B = range(65, 193)
#: The draft's cancelling heads (lag 0) give back the hidden state it carries from its previous step, scaled by
#: this estimate of that state's rms (mean 4.69, range 2.1-5.3, in `tests/test_numerics_path_draft.py`'s simulation).
DRAFT_CANCEL = 4.69


def _draft_qk(shape: LlamaShape, lags: Sequence[int], *, rotate: bool) -> Callable[[], torch.Tensor]:
    """The draft's q_proj / k_proj over [embeddings | hidden]: head i reads the bias channel, its key rotated by
    `lags[i]` positions, so its scores peak at that lag (the target's layer 0 is the lag-1 case)."""

    def make() -> torch.Tensor:
        import torch

        half = shape.head_dim // 2
        amp = math.sqrt(PEAK_SCORE * math.sqrt(shape.head_dim) / half)
        weight = torch.zeros(shape.heads * shape.head_dim, 2 * shape.hidden)
        for head, lag in enumerate(lags):
            for i, theta in enumerate(thetas(shape)):
                row = head * shape.head_dim
                weight[row + i, 0] = amp * (math.cos(lag * theta) if rotate else 1.0) / BIAS
                weight[row + i + half, 0] = amp * (math.sin(lag * theta) if rotate else 0.0) / BIAS
        return weight

    return make


def _draft_heads(
    shape: LlamaShape,
) -> tuple[list[int], Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
    """Head 0 (lag 1) carries block A of the previous input embedding; heads 1.. (lag 0) carry blocks A and B of
    the incoming hidden state back out, negated (v_proj, then o_proj)."""
    d, h = shape.head_dim, shape.hidden
    carried = list(DRAFT_A) + list(DRAFT_B)
    if len(DRAFT_A) != d or len(carried) > (shape.heads - 1) * d or DRAFT_B[-1] >= h:
        raise ValueError(f"the path draft needs head_dim {len(DRAFT_A)} and {shape.heads} heads, not {shape}")
    lags = [1] + [0] * (shape.heads - 1)

    def v_proj() -> torch.Tensor:
        import torch

        weight = torch.zeros(shape.heads * d, 2 * h)
        for i, channel in enumerate(DRAFT_A):
            weight[i, channel] = 1.0  # the embedding half
        for i, channel in enumerate(carried):
            weight[d + i, h + channel] = 1.0  # the hidden half
        return weight

    def o_proj() -> torch.Tensor:
        import torch

        weight = torch.zeros(h, shape.heads * d)
        for i, channel in enumerate(DRAFT_A):
            weight[channel, i] = ALPHA
        for i, channel in enumerate(carried):
            weight[channel, d + i] = -DRAFT_CANCEL
        return weight

    return lags, v_proj, o_proj


#: The draft memory's pre-activation on the right key (its input's block A has norm ~sqrt(hidden)).
DRAFT_KEY = 12.0
#: The draft memory's output norm (block B), against ~ALPHA x sqrt(len(DRAFT_A)) for block A.
DRAFT_VALUE = 64.0


def _unit_rows(table: torch.Tensor) -> torch.Tensor:
    unit: torch.Tensor = table / table.norm(dim=1, keepdim=True)
    return unit


def _draft_memory(shape: LlamaShape, seed: int, *, role: str) -> Callable[[], torch.Tensor]:
    """The draft's MLP memory: keys read block A (the direction of E[i] there, so the right key's activation is
    the same for every token), values write the direction of E[perm[i]] in block B."""

    def make() -> torch.Tensor:
        import torch

        table = _embedding(shape, seed)()
        a, b = list(DRAFT_A), list(DRAFT_B)
        if role == "key":
            keys = torch.zeros(shape.intermediate, shape.hidden)
            keys[: shape.vocab, a] = _unit_rows(table[:, a]) * (DRAFT_KEY / math.sqrt(shape.hidden))
            return keys
        act = DRAFT_KEY * DRAFT_KEY / (1.0 + math.exp(-DRAFT_KEY))  # silu(k) * k
        perm = torch.tensor(permutation(shape.vocab, seed))
        values = torch.zeros(shape.hidden, shape.intermediate)
        values[b, : shape.vocab] = _unit_rows(table[perm][:, b]).t() * (DRAFT_VALUE / act)
        return values

    return make


def _draft_head(shape: LlamaShape, seed: int) -> Callable[[], torch.Tensor]:
    """The draft's LM head: the direction of each token's embedding in block B."""

    def make() -> torch.Tensor:
        table = _embedding(shape, seed)()
        head = table * 0.0
        head[:, list(DRAFT_B)] = _unit_rows(table[:, list(DRAFT_B)])
        return head

    return make


def path_draft_specs(shape: LlamaShape = PATH_TARGET, *, seed: int = 0) -> list[TensorSpec]:
    """The path target's EAGLE-3 draft: it predicts perm[the token one back] from its own token history, like
    the target's first two layers in one (a lag-1 attention head, an MLP memory), so its drafts are right and
    EAGLE-3's accept path runs on every verify.

    SGLang's draft takes at position j the token j + 1 (its input is shifted by one) and the target's hidden
    state at j; its next step takes the pre-norm hidden state of its previous one. fc is zero (the target's
    states are captured and multiplied, but add nothing); head 0 brings the previous input embedding into block A;
    the memory keyed on block A writes E[perm[token]] into block B, which the head reads; heads 1.. give back
    the carried state (`DRAFT_CANCEL`), so that each step sees its own token, not the sum of all steps so far."""
    _check(shape)
    h, q, inter, aux = shape.hidden, shape.heads * shape.head_dim, shape.intermediate, len(AUX_LAYERS)
    lags, v_proj, o_proj = _draft_heads(shape)
    p = "layers.0."
    return [
        TensorSpec(f"{p}self_attn.q_proj.weight", (q, 2 * h), _draft_qk(shape, lags, rotate=False)),
        TensorSpec(f"{p}self_attn.k_proj.weight", (q, 2 * h), _draft_qk(shape, lags, rotate=True)),
        TensorSpec(f"{p}self_attn.v_proj.weight", (q, 2 * h), v_proj),
        TensorSpec(f"{p}self_attn.o_proj.weight", (h, q), o_proj),
        TensorSpec(f"{p}mlp.gate_proj.weight", (inter, h), _draft_memory(shape, seed, role="key")),
        TensorSpec(f"{p}mlp.up_proj.weight", (inter, h), _draft_memory(shape, seed, role="key")),
        TensorSpec(f"{p}mlp.down_proj.weight", (h, inter), _draft_memory(shape, seed, role="value")),
        TensorSpec(f"{p}input_layernorm.weight", (h,), _ones(h)),
        TensorSpec(f"{p}post_attention_layernorm.weight", (h,), _ones(h)),
        TensorSpec(f"{p}hidden_norm.weight", (h,), _ones(h)),
        TensorSpec("fc.weight", (h, h * aux), _zeros(h, h * aux)),
        TensorSpec("norm.weight", (h,), _ones(h)),
        TensorSpec("lm_head.weight", (shape.vocab, h), _draft_head(shape, seed)),
    ]


def _config(config: dict[str, object]) -> dict[str, object]:
    config["rope_theta"] = ROPE_BASE
    # transformers >= 5 reads RoPE from rope_parameters; older releases and SGLang read rope_theta.
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": ROPE_BASE}
    return config


def write_target_path(
    folder: Path,
    shape: LlamaShape = PATH_TARGET,
    *,
    seed: int = 0,
    bug: Bug | None = None,
    dtype: str = "float32",
) -> Path:
    """The path target (or its variant with `bug` planted), written as a model folder."""
    config = _config(llama_config(shape, dtype=dtype))
    config["tie_word_embeddings"] = True
    sidecar = {"role": "target", "function": SIDECAR_FUNCTION, "bug": bug, "seed": seed}
    specs = path_target_specs(shape, seed=seed, bug=bug)
    return write_sharded(folder, config, specs, dtype=dtype, sidecar=sidecar)


def write_draft_path(
    folder: Path, shape: LlamaShape = PATH_TARGET, *, seed: int = 0, dtype: str = "float32"
) -> Path:
    """The path target's EAGLE-3 draft (same `seed`)."""
    config = _config(eagle3_config(shape, dtype=dtype))
    sidecar = {"role": "eagle3-draft", "function": SIDECAR_FUNCTION, "seed": seed}
    return write_sharded(folder, config, path_draft_specs(shape, seed=seed), dtype=dtype, sidecar=sidecar)


__all__ = [
    "ALPHA",
    "BUGS",
    "CPU_PATH",
    "PATH_TARGET",
    "ROPE_BASE",
    "Bug",
    "lag_margin",
    "path_draft_specs",
    "path_sequence",
    "path_target_specs",
    "permutation",
    "thetas",
    "write_draft_path",
    "write_target_path",
]
