"""Throughput against thresholds per runner, judged with the noise (issue 8); the 40-throughput suite's library.

- `stats`: median, bootstrap interval, CV, the pass / fail / inconclusive rules, the retry classifier;
- `thresholds`: runner kinds and the [thresholds.<runner-kind>] tables of matrix.toml;
- `measure`: SGLang servers, health checks, warm-up, interleaved repeats, nvidia-smi facts;
- `benchjson`: SGLang's own bench tools (command lines, JSON output);
- `record`: throughput.json, the stable record of one run.

Standard library only: the suite imports this in whatever Python holds the cell's SGLang.
"""
