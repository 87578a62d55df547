"""Inspect: pure analyses over unpacked wheel trees (ELF/fatbin listings, AST scans), cached by file hash.

Modules (import them directly; this package imports nothing eagerly):

- `arch`: one `Arch` for every spelling (sm_120, sm120, 12.0, 120, compute_90a) and NVIDIA's SASS/PTX rules;
- `fatbin`: the SASS archs and PTX versions of a .so / .o / .cubin, from the fatbin headers alone;
- `kernels`: a component's libraries (and cubin families) read once, and sgl-kernel's loader choice per GPU;
- `sourcetree`: the one `SourceTree` every source analyser reads through (modules -> files, ASTs parsed once
  per content, names and class hierarchies across modules), and the AST helpers they share;
- `pysource`: a partial evaluator that runs capability checks for one GPU (its values in `pyvalues`, the
  model of torch / os / functools / builtins in `pyplatform`, expressions in `pyexpr`);
- `captables`: capability-keyed dict lookups found with `ast` (per-module facts in `capfacts`), and, from
  `capgates`, feature gates and flag conditions judged per GPU;
- `cache`: the by-file-hash JSON cache under $STACKFARM_CACHE/analysis;
- `eagle3`: the EAGLE-3 interface contract (another suite's): `eagle3_contract`, `eagle3_uses`,
  `eagle3_derive`, `eagle3_models`.
"""
