"""`stackfarm emit gha | buildkite | k8s --plan plan.json [--chunk N]`: the plan's pending cells as another
engine's pipeline, on standard output (stackfarm.emit)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..emit import EmitError, buildkite, gha, k8s, place, yamltext
from ..errors import ExitCode
from ..gha import DEFAULT_RUNNER
from ..matrix import load
from ..worker import read_plan
from .args import whole

_Sub = argparse._SubParsersAction  # argparse's type for add_subparsers()


def register(sub: _Sub[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "emit", help="the plan as a GitHub Actions workflow, a Buildkite pipeline or Kubernetes Jobs"
    )
    p.add_argument("engine", choices=("gha", "buildkite", "k8s"))
    p.add_argument("--plan", default="-", help="`stackfarm plan --json` output (a file, or - for stdin)")
    p.add_argument(
        "--chunk",
        type=whole(1, 100),
        default=None,
        help="cells per chunk (default: the engine's limit, 256 jobs per matrix / 500 steps per upload, "
        "a docker plan's cell taking two there: its build step and its test step)",
    )
    p.add_argument(
        "--matrix",
        type=Path,
        default=Path("matrix.toml"),
        help="places cells the plan gives no runner kind (plans of an older `plan --json`)",
    )
    p.add_argument(
        "--part", type=whole(1, 2), default=1, help="buildkite: which upload of a chunked plan (1..N)"
    )
    p.add_argument(
        "--image",
        default=None,
        help="buildkite, k8s: the worker image (docker/worker.Dockerfile) the steps or pods run in "
        f"(default: buildkite {buildkite.DEFAULT_IMAGE}, k8s {k8s.DEFAULT_IMAGE})",
    )
    p.add_argument(
        "--parallelism", type=whole(1, 8), default=None, help="k8s: pods at once per Job (default: all)"
    )
    p.add_argument("--namespace", default="default", help="k8s: the namespace of the Jobs")
    p.add_argument(
        "--reports-claim",
        default="stackfarm-reports",
        help="k8s: the reports volume claim (plans without a store)",
    )
    p.add_argument("--cache-claim", default="stackfarm-cache", help="k8s: the cache volume claim")
    p.add_argument("--cache-size", default="500Gi", help="k8s: the cache volume claim's size")
    p.set_defaults(func=cmd_emit)


def _placed(args: argparse.Namespace) -> dict[str, Any]:
    doc = read_plan(args.plan)
    if all(c.get("runner") for c in doc["cells"]):
        return doc
    runners = tuple(load(args.matrix).runners.values()) if args.matrix.is_file() else ()
    return place(doc, runners or (DEFAULT_RUNNER,))


def checkout_relative(doc: dict[str, Any], here: Path) -> dict[str, Any]:
    """The plan with its matrix path relative to `here` when it lies under it: the workers run in a checkout of
    this folder (the repository), not on the machine that planned, whose absolute path they do not have."""
    matrix = doc.get("matrix")
    given = matrix.get("path") if isinstance(matrix, dict) else matrix
    if not isinstance(given, str) or not Path(given).is_absolute():
        return doc
    try:
        relative = str(Path(given).resolve().relative_to(here.resolve()))
    except ValueError:
        return doc
    return {**doc, "matrix": {**matrix, "path": relative} if isinstance(matrix, dict) else relative}


def cmd_emit(args: argparse.Namespace) -> int:
    doc = checkout_relative(_placed(args), Path.cwd())
    if args.engine == "gha":
        text = yamltext.dump(
            gha.workflow(doc, chunk=args.chunk, plan="plan.json" if args.plan == "-" else args.plan)
        )
    elif args.engine == "buildkite":
        parts = buildkite.pipelines(
            doc,
            chunk=args.chunk,
            plan="plan.json" if args.plan == "-" else args.plan,
            image=args.image or buildkite.DEFAULT_IMAGE,
        )
        if not 1 <= args.part <= len(parts):
            raise EmitError(f"--part {args.part}: the plan makes {len(parts)} part(s)")
        text = yamltext.dump(parts[args.part - 1])
        if args.part == 1 and len(parts) > 1:
            print(f"{len(parts)} parts: part 1's first step uploads the others", file=sys.stderr)
    else:
        text = yamltext.dump_all(
            k8s.manifests(
                doc,
                chunk=args.chunk,
                image=args.image or k8s.DEFAULT_IMAGE,
                parallelism=args.parallelism,
                namespace=args.namespace,
                reports_claim=args.reports_claim,
                cache_claim=args.cache_claim,
                cache_size=args.cache_size,
            )
        )
    sys.stdout.write(text)
    return int(ExitCode.OK)


__all__ = ["cmd_emit", "register"]
