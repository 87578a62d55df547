"""Render the held runs' cell pages (tests/test_gpu_runs/*, the H200 throughput history) with whatever
stackfarm is on the path, into OUT: ``PYTHONPATH=CHECKOUT/src python tests/measure/render_held.py OUT REPO``.
Rendered at two commits, the pages are compared byte for byte (`cmp`); issue 26's note did b33c85b vs final."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from stackfarm import history, htmlreport


def main(argv: list[str] | None = None) -> int:
    out_arg, repo_arg = argv or sys.argv[1:]
    out, repo = Path(out_arg), Path(repo_arg)
    out.mkdir(parents=True, exist_ok=True)
    held = repo / "tests"
    runs = sorted((held / "test_gpu_runs").glob("h200-*"))
    runs += sorted((held / "test_throughput_fixtures" / "h200-history").glob("run-*"))
    kwargs: dict[str, Any] = {}
    try:  # a checkout from before suite families renders without a registry
        from stackfarm import families

        kwargs["registry"] = families.load(repo / "suites")
    except ImportError:
        pass
    for run_dir in runs:
        for cell_id, cell in history.read_run(run_dir).cells.items():
            page = htmlreport.cell_page(cell, **kwargs)
            (out / f"{run_dir.name}--{cell_id}.html").write_text(page, encoding="utf-8")
    print(f"{len(runs)} held runs rendered into {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
