"""Planted test models: a target whose greedy output and an EAGLE-3 draft whose acceptance are known in advance.

The construction (verified in SGLang 0.5.15 on the H200, /work/shared/device/README.md, last bullet):

- Target (LlamaForCausalLM): embedding rows N(0, 1); in every layer ``o_proj = 0`` and ``mlp.down_proj = 0``, so
  the residual stream stays the token's embedding E[t] through every layer (attention and MLP add zero); the
  final RMSNorm (weight 1) gives E[t] / rms(E[t]). With ``tie_word_embeddings`` the head is E, so the logit of
  token j is <E[j], E[t]> / rms(E[t]): ~hidden for j = t and ~N(0, hidden) for the others. Greedy decoding
  *repeats the last token*, with a top-1/top-2 logprob gap of ~hidden - 3.3 sqrt(hidden) (>= 178 at hidden 256,
  vocab 1024; `margin` computes it exactly): no near-ties anywhere.
- Alternating target: the head is the embedding with its rows swapped as t <-> t XOR 1 for t in a chosen range
  (`swap`), so a token there is followed by its partner (t, t^1, t, ...) and every other token repeats. On one
  pair it is "the reference target, wrong on one pair of tokens": a planted *real* divergence.
- EAGLE-3 draft (LlamaForCausalLMEagle3, one layer, draft_vocab_size = vocab, no d2t/t2d and no embed_tokens:
  SGLang shares the target's): ``fc.weight = [I | 0 | 0]`` (the first auxiliary hidden state, i.e. the target's
  residual E[t] of the last token, passes unchanged), ``o_proj = down_proj = 0``, all norms 1, ``lm_head`` = E.
  The draft's residual is fc's output (the token embedding enters only through qkv), so it predicts t at every
  draft step: right for the repeating target. With its head rows swapped on `wrong` (t <-> t XOR 1) it predicts
  t^1 there, and is rejected.

What the *acceptance rate* means here (`PLANTED_RATES`): with chain drafting (3 steps, topk 1, 4 draft tokens) a
request whose prompt ends in a token the draft gets right accepts all 3 draft tokens at every verify (accept
length 4: 3 accepted + the bonus token); one ending in `wrong` accepts none (accept length 1). The rate r is the
share of prompts whose last token is in the right set; the mean per-prompt accept length is then exactly
1 + 3r (SGLang's own per-request figure counts the prefill token too: 128 tokens / 127 verifies = 1.008 instead
of 1). `planted_prompts` draws prompts with exactly round(r x count) right.

`simulate_eagle3` runs the draft on CPU the way SGLang does (the target's auxiliary hidden states through fc,
then the draft layer, the same state carried to every step) and counts each prompt's accepted tokens.
`write_target_planted` / `write_draft_planted` write shard by shard (`Tensor specs` are known before any weight
exists), so the Llama-3-8B shape (16 GB of bf16) is generated on the GPU machine, one shard in memory at a time.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .tinymodels import AUX_LAYERS, GPU_TARGET, INIT_STD, LlamaShape, eagle3_config, llama_config

if TYPE_CHECKING:
    import torch

#: Rates of accepting prompts the suites plant: 0 %, 50 %, 90 % (mean accept length 1, 2.5, 3.7).
PLANTED_RATES = (0.0, 0.5, 0.9)
#: Chain drafting as SGLang runs it in the suites: draft steps (accept length per verify is 1 .. STEPS + 1).
STEPS = 3
#: The sidecar file describing a planted model (engines ignore it; the fake server of the tests reads it).
SIDECAR = "planted.json"
#: A shard of at most this many bytes is in memory at a time.
SHARD_BYTES = 2 << 30


def expected_accept_length(rate: float, steps: int = STEPS) -> float:
    """The mean per-prompt accept length of the planted draft at acceptance `rate`: 1 + steps x rate."""
    return 1.0 + steps * rate


def default_wrong(vocab: int) -> tuple[int, int]:
    """The draft's wrong set when none is chosen: the upper half of the vocabulary (closed under XOR 1)."""
    return (vocab // 2 // 2 * 2, vocab)


def swapped(token: int, swap: tuple[int, int] | None) -> int:
    """t XOR 1 for t in [lo, hi), else t: the row permutation of a swapped head (an involution)."""
    if swap is not None and swap[0] <= token < swap[1]:
        return token ^ 1
    return token


def planted_next(token: int, swap: tuple[int, int] | None = None) -> int:
    """The planted target's greedy next token after `token` (the repeating target when `swap` is None)."""
    return swapped(token, swap)


def planted_sequence(
    prompt: Sequence[int], new_tokens: int, swap: tuple[int, int] | None = None
) -> list[int]:
    """What greedy decoding of the planted target generates after `prompt`."""
    out, last = [], prompt[-1]
    for _ in range(new_tokens):
        last = planted_next(last, swap)
        out.append(last)
    return out


def _check_range(what: str, value: tuple[int, int] | None, vocab: int) -> None:
    if value is None:
        return
    lo, hi = value
    if not (0 <= lo < hi <= vocab and lo % 2 == 0 and hi % 2 == 0):
        raise ValueError(
            f"{what} = {value}: an even [lo, hi) inside the vocabulary (0..{vocab}), closed under XOR 1"
        )


# --------------------------------------------------------------------------- tensors, described before made


@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor: its name, shape and how to make it (called only when its shard is written)."""

    name: str
    shape: tuple[int, ...]
    make: Callable[[], torch.Tensor]

    def nbytes(self, itemsize: int) -> int:
        size = itemsize
        for dim in self.shape:
            size *= dim
        return size


def _factories(seed: int, device: str) -> tuple[Any, Any, Any]:
    import torch

    def gen(salt: int) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(seed * 1_000_003 + salt)

    def rnd(salt: int, *size: int, std: float = INIT_STD) -> Callable[[], torch.Tensor]:
        def make() -> torch.Tensor:  # called when its shard is written, not before
            out: torch.Tensor = (torch.randn(*size, generator=gen(salt), device=device) * std).cpu()
            return out

        return make

    def const(value: float, *size: int) -> Callable[[], torch.Tensor]:
        return lambda: torch.full(size, value)

    return rnd, const, gen


def _embedding(shape: LlamaShape, seed: int, device: str) -> Callable[[], torch.Tensor]:
    rnd, _, _ = _factories(seed, device)
    return rnd(0, shape.vocab, shape.hidden, std=1.0)  # type: ignore[no-any-return]


def _permuted(make: Callable[[], torch.Tensor], swap: tuple[int, int] | None) -> Callable[[], torch.Tensor]:
    """Rows of make() in the order row j <- row swapped(j)."""
    if swap is None:
        return make

    def rows() -> torch.Tensor:
        import torch

        table = make()
        index = torch.arange(table.shape[0])
        lo, hi = swap
        index[lo:hi] = index[lo:hi] ^ 1
        return table[index].contiguous()

    return rows


def _layer_specs(
    prefix: str, shape: LlamaShape, makers: tuple[Any, Any], *, in_dim: int, salt: int
) -> list[TensorSpec]:
    rnd, const = makers
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    h, inter = shape.hidden, shape.intermediate
    return [
        TensorSpec(f"{prefix}self_attn.q_proj.weight", (q, in_dim), rnd(salt + 1, q, in_dim)),
        TensorSpec(f"{prefix}self_attn.k_proj.weight", (kv, in_dim), rnd(salt + 2, kv, in_dim)),
        TensorSpec(f"{prefix}self_attn.v_proj.weight", (kv, in_dim), rnd(salt + 3, kv, in_dim)),
        TensorSpec(f"{prefix}self_attn.o_proj.weight", (h, q), const(0.0, h, q)),  # attention adds nothing
        TensorSpec(f"{prefix}mlp.gate_proj.weight", (inter, h), rnd(salt + 4, inter, h)),
        TensorSpec(f"{prefix}mlp.up_proj.weight", (inter, h), rnd(salt + 5, inter, h)),
        TensorSpec(f"{prefix}mlp.down_proj.weight", (h, inter), const(0.0, h, inter)),  # nor does the MLP
        TensorSpec(f"{prefix}input_layernorm.weight", (h,), const(1.0, h)),
        TensorSpec(f"{prefix}post_attention_layernorm.weight", (h,), const(1.0, h)),
    ]


def target_specs(
    shape: LlamaShape = GPU_TARGET, *, swap: tuple[int, int] | None = None, seed: int = 0, device: str = "cpu"
) -> list[TensorSpec]:
    """The planted target's tensors: repeating (tied head) or alternating on `swap` (a swapped head)."""
    _check_range("swap", swap, shape.vocab)
    rnd, const, _ = _factories(seed, device)
    embed = _embedding(shape, seed, device)
    specs = [TensorSpec("model.embed_tokens.weight", (shape.vocab, shape.hidden), embed)]
    for i in range(shape.layers):
        specs += _layer_specs(
            f"model.layers.{i}.", shape, (rnd, const), in_dim=shape.hidden, salt=100 * (i + 1)
        )
    specs.append(TensorSpec("model.norm.weight", (shape.hidden,), const(1.0, shape.hidden)))
    if swap is not None:
        specs.append(TensorSpec("lm_head.weight", (shape.vocab, shape.hidden), _permuted(embed, swap)))
    return specs


def draft_specs(
    shape: LlamaShape = GPU_TARGET,
    *,
    wrong: tuple[int, int] | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> list[TensorSpec]:
    """The planted EAGLE-3 draft's tensors (names without "model.", as SGLang's loader reads them)."""
    import torch

    _check_range("wrong", wrong, shape.vocab)
    rnd, const, _ = _factories(seed, device)
    h, aux = shape.hidden, len(AUX_LAYERS)

    def fc() -> torch.Tensor:
        return torch.cat([torch.eye(h), torch.zeros(h, h * (aux - 1))], dim=1)  # [I | 0 | 0]

    specs = _layer_specs("layers.0.", shape, (rnd, const), in_dim=2 * h, salt=10_000)
    specs += [
        TensorSpec("layers.0.hidden_norm.weight", (h,), const(1.0, h)),
        TensorSpec("fc.weight", (h, h * aux), fc),
        TensorSpec("norm.weight", (h,), const(1.0, h)),
        # The target's embedding (the same seed), its rows swapped on `wrong`.
        TensorSpec("lm_head.weight", (shape.vocab, h), _permuted(_embedding(shape, seed, device), wrong)),
    ]
    return specs


def write_sharded(
    folder: Path,
    config: Mapping[str, Any],
    specs: Sequence[TensorSpec],
    *,
    dtype: str = "float32",
    shard_bytes: int = SHARD_BYTES,
    sidecar: Mapping[str, Any] | None = None,
) -> Path:
    """config.json, generation_config.json and the weights, made and saved one shard at a time (one
    model.safetensors when they fit in one shard, else model-0000i-of-0000n.safetensors and the index)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config), indent=2), encoding="utf-8")
    generation = {"bos_token_id": 1, "pad_token_id": 0, "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    if sidecar is not None:
        (folder / SIDECAR).write_text(json.dumps(dict(sidecar), indent=2), encoding="utf-8")
    torch_dtype = getattr(torch, dtype)
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes(itemsize) > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes(itemsize)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    weight_map = {}
    for name, shard in zip(names, shards, strict=True):
        tensors = {spec.name: spec.make().to(torch_dtype).contiguous() for spec in shard}
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map.update({spec.name: name for spec in shard})
        del tensors
    if len(shards) > 1:
        total = sum(spec.nbytes(itemsize) for spec in specs)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    return folder


def write_target_planted(
    folder: Path,
    shape: LlamaShape = GPU_TARGET,
    *,
    swap: tuple[int, int] | None = None,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
    shard_bytes: int = SHARD_BYTES,
) -> Path:
    """The planted target: repeats its last token (`swap` None) or alternates t <-> t^1 on `swap`."""
    config = llama_config(shape, dtype=dtype)
    config["tie_word_embeddings"] = swap is None
    sidecar = {
        "role": "target",
        "function": "repeat" if swap is None else "alternate",
        "swap": swap,
        "seed": seed,
    }
    specs = target_specs(shape, swap=swap, seed=seed, device=device)
    return write_sharded(folder, config, specs, dtype=dtype, shard_bytes=shard_bytes, sidecar=sidecar)


def write_draft_planted(
    folder: Path,
    shape: LlamaShape = GPU_TARGET,
    *,
    wrong: tuple[int, int] | None = None,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
    shard_bytes: int = SHARD_BYTES,
) -> Path:
    """The planted EAGLE-3 draft of the repeating target (same `seed`): right everywhere, or wrong on `wrong`."""
    config = eagle3_config(shape, dtype=dtype)
    sidecar = {"role": "eagle3-draft", "wrong": wrong, "seed": seed, "steps": STEPS}
    specs = draft_specs(shape, wrong=wrong, seed=seed, device=device)
    return write_sharded(folder, config, specs, dtype=dtype, shard_bytes=shard_bytes, sidecar=sidecar)


# --------------------------------------------------------------------------- prompts with a planted rate


def right_count(rate: float, count: int) -> int:
    """How many of `count` prompts end in the right set at `rate`."""
    return round(rate * count)


def planted_prompts(
    count: int,
    length: int,
    *,
    rate: float,
    vocab: int,
    wrong: tuple[int, int] | None = None,
    seed: int = 0,
) -> tuple[tuple[int, ...], ...]:
    """BOS, random tokens, then a last token in the draft's right set for exactly round(rate x count) of the
    prompts (spread evenly over the order), in `wrong` for the rest. Tokens 0-2 (pad, BOS, EOS) never follow BOS."""
    import random

    lo, hi = wrong or default_wrong(vocab)
    right = [t for t in range(3, vocab) if not lo <= t < hi]
    bad = list(range(max(3, lo), hi))
    rng = random.Random(seed)
    k = right_count(rate, count)
    out = []
    for i in range(count):
        is_right = (i + 1) * k // count > i * k // count  # k of count, evenly spread
        pool = right if is_right else bad
        body = [rng.randrange(3, vocab) for _ in range(max(0, length - 2))]
        out.append((1, *body, rng.choice(pool)))
    return tuple(out)


# --------------------------------------------------------------------------- the draft on CPU, as SGLang runs it


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    import torch

    half = x.shape[-1] // 2
    inv = 1.0 / theta ** (torch.arange(half, dtype=torch.float32) / half)
    angles = positions.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[None] + rotated * sin[None]


class Eagle3Draft:
    """A LlamaForCausalLMEagle3 checkpoint run in float32 torch, following SGLang 0.5.15's llama_eagle3.py."""

    def __init__(self, folder: Path | str, embed: torch.Tensor) -> None:
        from safetensors.torch import load_file

        self.config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        self.w = {k: v.float() for k, v in load_file(str(Path(folder) / "model.safetensors")).items()}
        self.embed = embed.float()

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """fc: the target's concatenated auxiliary hidden states to the draft's hidden size."""
        return aux @ self.w["fc.weight"].T

    def forward(self, tokens: Sequence[int], hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the last position's logits, the pre-norm hidden states): input j is (embed(tokens[j]), hidden[j]), `hidden`
        already projected (`project`) or a draft step's own state."""
        import torch

        c, w = self.config, self.w
        eps, heads, kv = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"]
        hd = c.get("head_dim") or c["hidden_size"] // heads
        p = "layers.0."
        residual = hidden
        embeds = _rms(self.embed[list(tokens)], w[p + "input_layernorm.weight"], eps)
        x = torch.cat([embeds, _rms(hidden, w[p + "hidden_norm.weight"], eps)], dim=-1)
        n = x.shape[0]
        pos = torch.arange(n)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(n, heads, hd).transpose(0, 1)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(n, kv, hd).transpose(0, 1)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(n, kv, hd).transpose(0, 1)
        q, k = _rope(q, pos, c["rope_theta"]), _rope(k, pos, c["rope_theta"])
        k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
        scores = (q @ k.transpose(1, 2)) / hd**0.5 + torch.full((n, n), float("-inf")).triu(1)
        attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, heads * hd)
        residual = residual + attn @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(residual, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        residual = residual + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        logits = _rms(residual[-1:], w["norm.weight"], eps) @ w["lm_head.weight"].T
        return logits[0], residual


@dataclass(frozen=True, kw_only=True)
class Simulated:
    """One prompt's EAGLE-3 chain decoding, simulated: tokens, accepted draft tokens per verify."""

    tokens: tuple[int, ...]
    accepted: tuple[int, ...]

    @property
    def accept_length(self) -> float:
        """Tokens per verify step (accepted draft tokens + the bonus), prefill excluded."""
        return statistics.fmean(a + 1 for a in self.accepted)


def _target_pass(target: Any, tokens: Sequence[int]) -> tuple[list[int], torch.Tensor]:
    """The target's greedy prediction after each position, and its auxiliary hidden states (layers 0-2's
    outputs, which is what SGLang captures as the inputs of layers 1-3), concatenated."""
    import torch

    with torch.no_grad():
        out = target(torch.tensor([list(tokens)]), output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i + 1][0] for i in AUX_LAYERS], dim=-1).float()
    return out.logits[0].argmax(-1).tolist(), aux


def simulate_eagle3(
    target_folder: Path,
    draft_folder: Path,
    prompts: Sequence[Sequence[int]],
    new_tokens: int,
    steps: int = STEPS,
) -> list[Simulated]:
    """Greedy EAGLE-3 chain decoding (topk 1, `steps` draft steps) of each prompt, in float32 on CPU."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only contend (10x slower on a loaded 2-CPU box)
    try:
        return _simulate(target_folder, draft_folder, prompts, new_tokens, steps)
    finally:
        torch.set_num_threads(threads)


def _simulate(
    target_folder: Path, draft_folder: Path, prompts: Sequence[Sequence[int]], new_tokens: int, steps: int
) -> list[Simulated]:
    import torch
    import transformers

    auto: Any = transformers.AutoModelForCausalLM  # untyped
    target = auto.from_pretrained(str(target_folder), dtype=torch.float32)
    target.eval()
    draft = Eagle3Draft(draft_folder, target.get_input_embeddings().weight.detach())
    results = []
    for prompt in prompts:
        predicted, aux = _target_pass(target, prompt)
        committed = [*prompt, predicted[-1]]  # the prefill's token
        known = len(prompt)  # positions whose target hidden state is known
        accepted: list[int] = []
        with torch.no_grad():
            while len(committed) - len(prompt) < new_tokens:
                # Draft: inputs (committed[j + 1], H_j) for the known positions, then its own states.
                tokens, hidden = committed[1 : known + 1], draft.project(aux[:known])
                drafts: list[int] = []
                for _ in range(steps):
                    logits, pre = draft.forward(tokens, hidden)
                    drafts.append(int(logits.argmax()))
                    tokens, hidden = [*tokens, drafts[-1]], torch.cat([hidden, pre[-1:]], dim=0)
                # Verify: the target over committed + drafts.
                predicted, aux = _target_pass(target, [*committed, *drafts])
                base = len(committed) - 1
                a = 0
                while a < steps and drafts[a] == predicted[base + a]:
                    a += 1
                committed += [*drafts[:a], predicted[base + a]]
                known = base + a + 1
                accepted.append(a)
        results.append(
            Simulated(tokens=tuple(committed[len(prompt) :][:new_tokens]), accepted=tuple(accepted))
        )
    return results


def margin(folder: Path | str) -> float:
    """The smallest top-1/top-2 logit gap over all one-token contexts of a planted target, from its weights
    (the logprob gap equals the logit gap)."""
    import torch
    from safetensors.torch import load_file

    w = load_file(str(Path(folder) / "model.safetensors"))
    embed = w["model.embed_tokens.weight"].float()
    head = w.get("lm_head.weight", embed).float()
    hidden = embed * (embed.pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt()
    top = torch.topk(hidden @ head.T, 2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min())


__all__ = [
    "PLANTED_RATES",
    "SIDECAR",
    "STEPS",
    "Eagle3Draft",
    "Simulated",
    "TensorSpec",
    "default_wrong",
    "draft_specs",
    "expected_accept_length",
    "margin",
    "planted_next",
    "planted_prompts",
    "planted_sequence",
    "right_count",
    "simulate_eagle3",
    "swapped",
    "target_specs",
    "write_draft_planted",
    "write_sharded",
    "write_target_planted",
]
