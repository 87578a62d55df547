"""Throughput against thresholds per runner, judged with the noise (issue 8); the 40-throughput suite's library.

- `stats`: median, bootstrap interval, CV, the pass / fail / inconclusive rules, the retry classifier;
- `thresholds`: runner kinds and the [thresholds.<runner-kind>] tables of matrix.toml;
- `settings`: [suites.40-throughput.settings], its defaults and its declared SCHEMA (checked by matrix.load);
- `measure`: requests, warm-up, interleaved repeats, the figures (and re-exports of the next three);
- `server`: SGLang servers' command lines, environment, start, health checks and stop;
- `machine`: nvidia-smi facts, free ports, CPU placement; `errors`: what a measurement raises;
- `benchjson`: SGLang's own bench tools (command lines, JSON output);
- `record`: throughput.json, the stable record of one run.

Standard library only: the suite imports this in whatever Python holds the cell's SGLang.
"""
