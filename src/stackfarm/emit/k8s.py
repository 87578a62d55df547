"""Kubernetes: the plan's pending cells as Indexed Jobs, one per runner kind (and chunk), and a merge Job.

    stackfarm emit k8s --plan plan.json --image REGISTRY/stackfarm-worker:TAG [--chunk N] | kubectl apply -f -

The pods run the worker image (docker/worker.Dockerfile: stackfarm and the project, working directory
/project). Each worker Job has ``completionMode: Indexed`` and ``completions`` = its cells; its pods run
``stackfarm run --plan /plan/plan.json --cell-index $(JOB_COMPLETION_INDEX)`` with the plan's matrix, hash basis
and store, where /plan is a ConfigMap holding that Job's own plan (the plan's fields, its cells in the Job's order).
A pod asks for ``nvidia.com/gpu: <gpus>`` of its kind and selects nodes by GPU Feature Discovery's
compute-capability labels for the kind's arch (sm_90 -> ``nvidia.com/gpu.compute.major: "9"``, ``minor: "0"``).

Volumes: the cache (a ReadWriteMany claim mounted at $STACKFARM_CACHE, so pods share the wheels they download),
the netrc Secret (``stackfarm-netrc``, key ``netrc``: index and store credentials, optional), and the reports:
with a store an emptyDir (each pod pushes its verdict), without one a ReadWriteMany claim, a folder per pod. The
runner key (``stackfarm-runner-key``, key ``key.pem``) and the store token (``stackfarm-store``, key ``token``,
optional) reach the container as variables from their Secrets: a Secret volume's files are group-readable under
an fsGroup, and stackfarm refuses a private key that others can read.

Failures: ``podFailurePolicy`` retries what the infrastructure did (a pod disrupted, i.e. evicted or preempted:
not counted; exit 4, the environment, 130, interrupted, and 137, killed: counted against ``backoffLimitPerIndex``),
never a verdict:
exit 1 (a failed cell) or 3 (incomplete) fails that index at once, exit 2 (the configuration, the same for every
pod) fails the Job. The merge Job waits (an init container with kubectl, under a ServiceAccount that may only read
Jobs) until every worker Job is Complete or Failed, then runs `stackfarm report --gate --plan` on the whole plan
(``--from STORE`` with a store): a planned cell without a verdict, or a conflict, keeps the gate shut.

Names: DNS-1123 labels of at most 52 characters (room for the controller's pod suffix); two runner kinds that
would get one name get each a suffix of their kind's hash instead, so no Job overwrites another.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import storekeys
from ..backends import BACKENDS
from . import (
    CellDoc,
    EmitError,
    basis_args,
    chunks,
    conflict_lines,
    merge_argv,
    pending,
    store_of,
    worker_argv,
)

#: What a ConfigMap may hold (etcd's object limit).
CONFIGMAP_LIMIT = 1024 * 1024
#: The image the pods run unless told (docker/worker.Dockerfile): stackfarm and the project.
DEFAULT_IMAGE = "stackfarm-worker:latest"
#: The image of the merge Job's wait (kubectl), unless told.
KUBECTL_IMAGE = "registry.k8s.io/kubectl:v1.31.0"
#: Where the worker image holds the project (matrix.toml, suites/): the containers' working directory.
PROJECT = "/project"
CACHE_DIR = "/cache"
#: (Secret, key) of each credential.
RUNNER_KEY_SECRET = ("stackfarm-runner-key", "key.pem")
STORE_TOKEN_SECRET = ("stackfarm-store", "token")
NETRC_SECRET = ("stackfarm-netrc", "netrc")
#: Exit statuses of a worker pod: verdicts (never retried), the configuration, the infrastructure (retried).
VERDICT_EXITS = (1, 3)
CONFIG_EXITS = (2,)
INFRA_EXITS = (4, 130, 137)
#: Characters of the merge Job's conflicts annotation (annotations take 256 KiB in all).
CONFLICTS_SHOWN = 64 * 1024
#: Retries of one index for the infrastructure (a verdict fails its index at once).
RETRIES = 2
_NAME = re.compile(r"[^a-z0-9-]+")
_ARCH = re.compile(r"sm_(\d+)(\d)[a-z]?\Z")
#: The fields of a plan cell a pod needs (`stackfarm run --plan` reads the id; the rest say what it is).
_CELL_FIELDS = ("id", "values", "runner", "gpus", "arch", "input_hash", "estimated_seconds", "status")
#: Fields of the plan a Job's own plan leaves out (the other Jobs' business, or the merge's).
_NOT_PER_JOB = ("cells", "conflicts", "excluded", "warnings", "unreachable", "driver_problems")
_LABELS = {"app.kubernetes.io/name": "stackfarm"}


def dns_name(text: str, limit: int = 52) -> str:
    """A DNS-1123 label (Jobs: at most 63; leave room for the pod suffix the controller adds)."""
    name = _NAME.sub("-", text.lower()).strip("-")[:limit].strip("-")
    return name or "cells"


def unique_names(keys: Sequence[str], limit: int = 52) -> dict[str, str]:
    """A DNS-1123 name per key, no two alike: a name two keys would share (`a_b` and `a-b`, or two long kinds
    cut at the same place) gets a suffix of its key's sha256 instead, within `limit`."""
    plain = {key: dns_name(key, limit) for key in keys}
    counts: dict[str, int] = {}
    for name in plain.values():
        counts[name] = counts.get(name, 0) + 1
    out: dict[str, str] = {}
    for key, name in plain.items():
        suffix = hashlib.sha256(key.encode()).hexdigest()[:8]
        out[key] = f"{dns_name(key, limit - 9)}-{suffix}" if counts[name] > 1 else name
    if len(set(out.values())) != len(out):  # two hashes alike in 8 hex digits: refuse rather than overwrite
        raise EmitError(f"runner kinds {sorted(keys)} give Kubernetes names that collide: rename one")
    return out


def node_selector(arch: str | None) -> dict[str, str]:
    """GPU Feature Discovery's labels for a CUDA arch (none when the kind names no arch)."""
    if not arch:
        return {}
    m = _ARCH.fullmatch(arch)
    if m is None:
        raise EmitError(f"runner arch {arch!r} is not like sm_90")
    return {"nvidia.com/gpu.compute.major": m[1], "nvidia.com/gpu.compute.minor": m[2]}


def job_plan(cells: Sequence[CellDoc], doc: Mapping[str, Any] | None = None) -> str:
    """A Job's own plan: the plan's fields (matrix, hash basis, store) and its cells, in the Job's order."""
    head = {k: v for k, v in (doc or {}).items() if k not in _NOT_PER_JOB}
    return json.dumps({**head, "cells": [{k: c.get(k) for k in _CELL_FIELDS} for c in cells]}, indent=1)


def failure_policy() -> dict[str, Any]:
    """Retry the infrastructure, never a verdict (the rules are read in order; the first that matches acts)."""

    def codes(values: Sequence[int], action: str) -> dict[str, Any]:
        return {
            "action": action,
            "onExitCodes": {"containerName": "cell", "operator": "In", "values": list(values)},
        }

    return {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            codes(VERDICT_EXITS, "FailIndex"),
            codes(CONFIG_EXITS, "FailJob"),
            codes(INFRA_EXITS, "Count"),
        ]
    }


def _secret_env(name: str, secret: tuple[str, str], *, optional: bool) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret[0], "key": secret[1], **({"optional": True} if optional else {})}
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def _env(kind: str, store: str | None) -> list[dict[str, Any]]:
    return [
        {"name": "STACKFARM_RUNNER_KIND", "value": kind},
        {"name": "STACKFARM_CACHE", "value": CACHE_DIR},
        {"name": "NETRC", "value": f"/secrets/netrc/{NETRC_SECRET[1]}"},
        # What a pod pushes is signed with the runner key (stackfarm.storekeys), from a Secret.
        *([_secret_env(storekeys.RUNNER_KEY_ENV, RUNNER_KEY_SECRET, optional=False)] if store else []),
        _secret_env("STACKFARM_STORE_TOKEN", STORE_TOKEN_SECRET, optional=True),
    ]


def _volumes(cache_claim: str, reports_claim: str, store: str | None) -> list[dict[str, Any]]:
    reports: dict[str, Any] = (
        {"emptyDir": {}} if store else {"persistentVolumeClaim": {"claimName": reports_claim}}
    )
    return [
        {"name": "cache", "persistentVolumeClaim": {"claimName": cache_claim}},
        {"name": "netrc", "secret": {"secretName": NETRC_SECRET[0], "optional": True, "defaultMode": 0o440}},
        {"name": "reports", **reports},
    ]


_MOUNTS = [
    {"name": "cache", "mountPath": CACHE_DIR},
    {"name": "netrc", "mountPath": "/secrets/netrc", "readOnly": True},
    {"name": "reports", "mountPath": "/reports"},
]
#: The worker image's user (docker/worker.Dockerfile); fsGroup makes the volumes writable for it.
_SECURITY = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001}


def _job(
    name: str, kind: str, cells: Sequence[CellDoc], doc: Mapping[str, Any], o: _Options
) -> dict[str, Any]:
    gpus = int(cells[0].get("gpus") or 0)
    store = store_of(doc)
    labels = {**_LABELS, "stackfarm/runner-kind": dns_name(kind, 63)}
    # Without a store each pod keeps its own reports folder (a shared one would make the pods wait for one
    # another's lock); the merge reads them all.
    reports = "/reports" if store else f"/reports/{name}-$(JOB_COMPLETION_INDEX)"
    argv = worker_argv(doc, "/plan/plan.json", index="$(JOB_COMPLETION_INDEX)", reports=reports)
    container: dict[str, Any] = {
        "name": "cell",
        "image": o.image,
        "workingDir": PROJECT,
        "command": argv[:3],
        "args": argv[3:],
        "env": [
            {
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    }
                },
            },
            *_env(kind, store),
        ],
        "volumeMounts": [{"name": "plan", "mountPath": "/plan", "readOnly": True}, *_MOUNTS],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": dict(_SECURITY),
        "containers": [container],
        "volumes": [
            {"name": "plan", "configMap": {"name": name}},
            *_volumes(o.cache_claim, o.reports_claim, store),
        ],
    }
    if selector := node_selector(cells[0].get("arch")):
        pod["nodeSelector"] = selector
    if gpus:  # GPU nodes are commonly tainted so that only GPU pods land there
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": o.namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": len(cells),
            "parallelism": min(o.parallelism or len(cells), len(cells)),
            "backoffLimitPerIndex": RETRIES,
            "podFailurePolicy": failure_policy(),
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


@dataclass(frozen=True, kw_only=True)
class _Options:
    """What every resource of one emit shares."""

    image: str
    parallelism: int | None
    namespace: str
    reports_claim: str
    cache_claim: str
    kubectl_image: str


def _claim(name: str, o: _Options, size: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": o.namespace, "labels": dict(_LABELS)},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}},
    }


def _config_map(name: str, o: _Options, text: str, what: str) -> dict[str, Any]:
    if len(text.encode()) > CONFIGMAP_LIMIT - 4096:
        raise EmitError(
            f"{what} make a plan of {len(text.encode())} bytes, past a ConfigMap's 1 MiB: pass a smaller --chunk"
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": o.namespace, "labels": dict(_LABELS)},
        "data": {"plan.json": text},
    }


def _waiter(name: str, o: _Options) -> list[dict[str, Any]]:
    """The merge's ServiceAccount, allowed to read Jobs in its namespace and nothing else."""
    meta = {"name": name, "namespace": o.namespace, "labels": dict(_LABELS)}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(meta),
            "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": o.namespace}],
        },
    ]


def wait_script(jobs: Sequence[str]) -> str:
    """Until every worker Job is Complete or Failed (a Job with a failed index ends Failed: still merged)."""
    names = " ".join(shlex.quote(j) for j in jobs)
    return (
        f"for job in {names}; do\n"
        '  until kubectl get job "$job" -o jsonpath=\'{.status.conditions[?(@.status=="True")].type}\' '
        "| grep -Eq 'Complete|Failed'; do sleep 20; done\n"
        "done"
    )


def _merge_job(name: str, doc: Mapping[str, Any], jobs: Sequence[str], o: _Options) -> dict[str, Any]:
    store = store_of(doc)
    argv = merge_argv(doc, "/plan/plan.json", reports="/merged")
    if not store:  # each worker pod's folder holds its cells: gather them, then merge
        argv = ["sh", "-c", f"cp -R /reports/*/. /merged/ && {shlex.join(argv)}"]
    container = {
        "name": "merge",
        "image": o.image,
        "workingDir": PROJECT,
        "command": argv[:3],
        "args": argv[3:],
        # No runner key: the merge signs nothing, and trusts the keys the matrix names ([store] trusted_keys).
        "env": [e for e in _env("merge", store) if e["name"] != storekeys.RUNNER_KEY_ENV][1:],
        "volumeMounts": [
            {"name": "plan", "mountPath": "/plan", "readOnly": True},
            *_MOUNTS,
            {"name": "merged", "mountPath": "/merged"},
        ],
    }
    wait = {"name": "wait-for-workers", "image": o.kubectl_image, "command": ["sh", "-c", wait_script(jobs)]}
    pod = {
        "restartPolicy": "Never",
        "serviceAccountName": name,
        "securityContext": dict(_SECURITY),
        "initContainers": [wait],
        "containers": [container],
        "volumes": [
            {"name": "plan", "configMap": {"name": name}},
            *_volumes(o.cache_claim, o.reports_claim, store),
            {"name": "merged", "emptyDir": {}},
        ],
    }
    meta: dict[str, Any] = {
        "name": name,
        "namespace": o.namespace,
        "labels": {**_LABELS, "stackfarm/role": "merge"},
    }
    conflicts = conflict_lines(doc)
    if conflicts:  # no Job runs them; the merge counts them (exit 1), `kubectl describe` says which
        meta["annotations"] = {"stackfarm/conflicts": "\n".join(conflicts)[:CONFLICTS_SHOWN]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {"backoffLimit": 1, "template": {"metadata": {"labels": dict(_LABELS)}, "spec": pod}},
    }


def manifests(
    doc: Mapping[str, Any],
    *,
    chunk: int | None = None,
    image: str = DEFAULT_IMAGE,
    parallelism: int | None = None,
    namespace: str = "default",
    reports_claim: str = "stackfarm-reports",
    cache_claim: str = "stackfarm-cache",
    cache_size: str = "500Gi",
    prefix: str = "stackfarm",
    kubectl_image: str = KUBECTL_IMAGE,
) -> list[dict[str, Any]]:
    """The claims, a ConfigMap (its plan) and an Indexed Job per runner kind's chunk of pending cells, then the
    merge: its plan, its ServiceAccount and Role, and its Job. A plan hashed for the docker backend is refused:
    a pod has no container engine, so its verdict would never be the one the plan hashed."""
    backend = basis_args(doc)[1]
    if (declared := BACKENDS.get(backend)) is not None and declared.needs_engine:
        raise EmitError(
            "the plan's input hashes are for the docker backend, and a Kubernetes pod has no container engine: "
            "plan it for the pods, `stackfarm plan --json --backend local` (or host), then emit it"
        )
    o = _Options(
        image=image,
        parallelism=parallelism,
        namespace=namespace,
        reports_claim=reports_claim,
        cache_claim=cache_claim,
        kubectl_image=kubectl_image,
    )
    by_kind: dict[str, list[CellDoc]] = {}
    for cell in pending(doc):
        by_kind.setdefault(str(cell["runner"]), []).append(cell)
    names = unique_names([f"{prefix}-{kind}" for kind in by_kind], limit=48)  # -<chunk> fits within 52
    out = [_claim(cache_claim, o, cache_size)]
    if not store_of(doc):
        out.append(_claim(reports_claim, o, "10Gi"))
    jobs: list[str] = []
    for kind, cells in by_kind.items():
        parts = list(chunks(cells, chunk or len(cells)))
        for n, part in enumerate(parts, 1):
            name = names[f"{prefix}-{kind}"] + (f"-{n}" if len(parts) > 1 else "")
            out.append(_config_map(name, o, job_plan(part, doc), f"{len(part)} cells of {kind}"))
            out.append(_job(name, kind, part, doc, o))
            jobs.append(name)
    merge = dns_name(f"{prefix}-merge")
    if merge in jobs:
        raise EmitError(f"a runner kind's Job would be named {merge}, the merge Job's name: rename the kind")
    out.append(_config_map(merge, o, json.dumps(dict(doc), indent=1), "the whole plan"))
    out += [*_waiter(merge, o), _merge_job(merge, doc, jobs, o)]
    return out


__all__ = [
    "CONFIGMAP_LIMIT",
    "DEFAULT_IMAGE",
    "dns_name",
    "failure_policy",
    "job_plan",
    "manifests",
    "node_selector",
    "unique_names",
    "wait_script",
]
