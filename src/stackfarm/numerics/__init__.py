"""Numerical equivalence: does the upgraded stack still compute what the old one did?

Three layers, each usable without the others:

- `compare`: pure logic over token sequences and per-step top-2 logprobs: where two generations first differ,
  and whether the baseline was near a tie there (explained) or not (a real divergence). No torch.
- `settings`: the suite's settings ([suites.30-numerics.settings]) parsed and checked, with documented defaults.
- `tinymodels`: writes tiny random-weight Llama targets (and EAGLE-3 / assistant drafts) with peaked logits.
- `engines`: one small interface over engines: HF transformers on CPU, SGLang's offline Engine in a child process.
- `kernels`: float32 references for the deployment's kernels and a reference EAGLE tree acceptance.

`compare` and `settings` import nothing heavy; `tinymodels`, `engines` and `kernels` import torch (and
transformers / sglang) only inside the functions that need them.
"""
