"""Kubernetes: the plan's pending cells as Indexed Jobs, one per runner kind (and chunk).

    stackfarm emit k8s --plan plan.json [--image IMAGE] [--chunk N] | kubectl apply -f -

Each Job has ``completionMode: Indexed`` and ``completions`` = its cells; its pods run
``stackfarm run --plan /plan/plan.json --cell-index $(JOB_COMPLETION_INDEX)``, where /plan is a ConfigMap holding
that Job's own plan (its cells, in the Job's order). A pod asks for ``nvidia.com/gpu: <gpus>`` of its runner
kind and selects nodes by GPU Feature Discovery's compute-capability labels for the kind's arch (sm_90 ->
``nvidia.com/gpu.compute.major: "9"``, ``...minor: "0"``). Each pod keeps a reports folder of its own,
``/reports/<job>-<index>/`` on the volume claim named by ``--reports-claim`` (a shared reports folder would make
the pods wait for one another's lock); merge them by copying every ``/reports/*/<cell>/`` into one folder and
running `stackfarm report` there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .. import storekeys
from ..planjson import PlanContract
from . import CellDoc, EmitError, chunks, pending, store_of

#: What a ConfigMap may hold (etcd's object limit).
CONFIGMAP_LIMIT = 1024 * 1024
#: The image the pods run unless told: it must hold stackfarm and the project (matrix.toml, suites/).
DEFAULT_IMAGE = "stackfarm:latest"
_NAME = re.compile(r"[^a-z0-9-]+")
_ARCH = re.compile(r"sm_(\d+)(\d)[a-z]?\Z")
#: The fields of a plan cell a pod needs (`stackfarm run --plan` reads the id; the rest say what it is).
_CELL_FIELDS = ("id", "values", "runner", "gpus", "arch", "input_hash", "estimated_seconds", "status")
#: The plan's contract (stackfarm.planjson.PlanContract), carried into every Job's plan.
_CONTRACT_FIELDS = ("matrix", "hash_basis", "store")


def dns_name(text: str, limit: int = 52) -> str:
    """A DNS-1123 label (Jobs: at most 63; leave room for the pod suffix the controller adds)."""
    name = _NAME.sub("-", text.lower()).strip("-")[:limit].strip("-")
    return name or "cells"


def node_selector(arch: str | None) -> dict[str, str]:
    """GPU Feature Discovery's labels for a CUDA arch (none when the kind names no arch)."""
    if not arch:
        return {}
    m = _ARCH.fullmatch(arch)
    if m is None:
        raise EmitError(f"runner arch {arch!r} is not like sm_90")
    return {"nvidia.com/gpu.compute.major": m[1], "nvidia.com/gpu.compute.minor": m[2]}


def job_plan(cells: Sequence[CellDoc], doc: Mapping[str, Any] | None = None) -> str:
    """A Job's own plan: its cells, with the whole plan's contract (matrix, hash basis, store), which the pods'
    `run --plan` adopts."""
    contract = {k: (doc or {}).get(k) for k in _CONTRACT_FIELDS if (doc or {}).get(k) is not None}
    return json.dumps({**contract, "cells": [{k: c.get(k) for k in _CELL_FIELDS} for c in cells]}, indent=1)


def _job(name: str, kind: str, cells: Sequence[CellDoc], *, image: str, parallelism: int | None,
         namespace: str, reports_claim: str, store: str | None = None,
         matrix: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    gpus = int(cells[0].get("gpus") or 0)
    labels = {"app.kubernetes.io/name": "stackfarm", "stackfarm/runner-kind": dns_name(kind, 63)}
    container: dict[str, Any] = {
        "name": "cell",
        "image": image,
        "command": ["python", "-m", "stackfarm"],
        "args": [
            "run",
            "--plan",
            "/plan/plan.json",
            "--cell-index",
            "$(JOB_COMPLETION_INDEX)",
            "--jobs",
            "1",
            "--reports",
            f"/reports/{name}-$(JOB_COMPLETION_INDEX)",
            *matrix,  # the plan's matrix (a plan made from --matrix X runs X)
            *(["--store", store] if store else []),  # each pod pushes its verdict where the plan looked
        ],
        "env": [
            {
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    }
                },
            },
            {"name": "STACKFARM_RUNNER_KIND", "value": kind},
            # What a pod pushes is signed with the runner key (stackfarm.storekeys), from a Secret.
            *([_runner_key()] if store else []),
        ],
        "volumeMounts": [
            {"name": "plan", "mountPath": "/plan", "readOnly": True},
            {"name": "reports", "mountPath": "/reports"},
        ],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [
            {"name": "plan", "configMap": {"name": name}},
            {"name": "reports", "persistentVolumeClaim": {"claimName": reports_claim}},
        ],
    }
    if selector := node_selector(cells[0].get("arch")):
        pod["nodeSelector"] = selector
    if gpus:  # GPU nodes are commonly tainted so that only GPU pods land there
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": len(cells),
            "parallelism": min(parallelism or len(cells), len(cells)),
            # A failed cell is a verdict, not a flake: its index is not retried, the others go on.
            "backoffLimitPerIndex": 0,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


#: The Secret holding the runner's signing key: `kubectl create secret generic stackfarm-runner-key
#: --from-file=key.pem=PATH`.
RUNNER_KEY_SECRET = ("stackfarm-runner-key", "key.pem")


def _runner_key() -> dict[str, Any]:
    name, key = RUNNER_KEY_SECRET
    return {"name": storekeys.RUNNER_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}


def _matrix_args(doc: Mapping[str, Any]) -> list[str]:
    contract = PlanContract.of(doc)
    return ["--matrix", contract.matrix.path] if contract.matrix else []


def manifests(
    doc: Mapping[str, Any],
    *,
    chunk: int | None = None,
    image: str = DEFAULT_IMAGE,
    parallelism: int | None = None,
    namespace: str = "default",
    reports_claim: str = "stackfarm-reports",
    prefix: str = "stackfarm",
) -> list[dict[str, Any]]:
    """A ConfigMap (the Job's plan) and an Indexed Job for every runner kind's chunk of pending cells."""
    by_kind: dict[str, list[CellDoc]] = {}
    for cell in pending(doc):
        by_kind.setdefault(str(cell["runner"]), []).append(cell)
    out: list[dict[str, Any]] = []
    for kind, cells in by_kind.items():
        parts = list(chunks(cells, chunk or len(cells)))
        for n, part in enumerate(parts, 1):
            name = dns_name(f"{prefix}-{kind}" + (f"-{n}" if len(parts) > 1 else ""))
            text = job_plan(part, doc)
            if len(text.encode()) > CONFIGMAP_LIMIT - 4096:
                raise EmitError(
                    f"{len(part)} cells of {kind} make a plan of {len(text.encode())} bytes, past a ConfigMap's "
                    "1 MiB: pass a smaller --chunk"
                )
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": namespace,
                                 "labels": {"app.kubernetes.io/name": "stackfarm"}},
                    "data": {"plan.json": text},
                }
            )  # fmt: skip
            out.append(_job(name, kind, part, image=image, parallelism=parallelism, namespace=namespace,
                            reports_claim=reports_claim, store=store_of(doc),
                            matrix=_matrix_args(doc)))  # fmt: skip
    return out


__all__ = ["CONFIGMAP_LIMIT", "DEFAULT_IMAGE", "dns_name", "job_plan", "manifests", "node_selector"]
