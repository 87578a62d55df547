"""The worker side of a fan-out: pick one cell of a stored plan (`stackfarm plan --json`'s document), so that
an engine that knows only an index (a Kubernetes Indexed Job's $JOB_COMPLETION_INDEX, a Slurm array task id)
or an id runs exactly that cell:

    stackfarm run --plan plan.json --cell-index I      # the plan's I-th cell (0-based)
    stackfarm run --plan plan.json --cells ID          # the cell with that id, which the plan must hold

`stackfarm run` then plans the matrix itself and runs the cells matching the glob returned here: one cell,
whatever characters its id holds. The plan is the worker's contract (`adopt`): it runs the plan's matrix
(refusing, exit 2, a file whose content is not the plan's, both sha256 named), realises and hashes the cells
under the plan's hash basis (`--backend auto` takes the plan's backend; a docker plan where no engine answers, or
a GPU plan on a machine without one, is refused, exit 4, both bases named; a plan without a GPU on a GPU
machine asks no GPU suite), pushes to the plan's store, gives each cell the runner kind the plan dispatched it
to, and refuses a cell whose input hash comes out other than the plan's. With ``--store URL`` (stackfarm.store) the worker first looks for a verdict of
the cell's inputs in the shared store (another runner's: then nothing is built or run) and pushes the verdict
it computes, so `stackfarm report --from URL --plan plan.json` merges what every worker did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .backends import BACKENDS
from .errors import EnvironmentProblem, StackfarmError, UsageError
from .planjson import HashBasis, PlanContract


def read_plan(path: Path | str) -> dict[str, Any]:
    """A plan document from a file ("-": standard input)."""
    import sys

    try:
        text = sys.stdin.read() if str(path) == "-" else Path(path).read_text(encoding="utf-8")
        data = json.loads(text)
    except OSError as exc:
        raise StackfarmError(f"{path}: cannot read the plan ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise StackfarmError(f"{path}: not a plan (`stackfarm plan --json` output): {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise StackfarmError(f"{path}: not a plan (`stackfarm plan --json` output): it has no cells list")
    return data


def exact_glob(cell_id: str) -> str:
    """An fnmatch pattern that matches this id alone (`*`, `?` and `[` escaped; `,` would split --cells)."""
    if "," in cell_id:
        raise StackfarmError(f"cell id {cell_id!r} holds a comma, which --cells reads as a separator")
    return re.sub(r"([*?\[])", r"[\1]", cell_id)


def select_from_plan(
    plan_json: Mapping[str, Any], index: int | str | None = None, cell_id: str | None = None
) -> str:
    """The --cells glob for the plan's cell at `index` (0-based; a string such as "$JOB_COMPLETION_INDEX" is
    read as a number) or with id `cell_id` (exactly one of the two)."""
    cells = [str(c["id"]) for c in plan_json.get("cells", [])]
    if (index is None) == (cell_id is None):
        raise StackfarmError("give the plan's cell by --cell-index or by --cells (one of them)")
    if cell_id is not None:
        if cell_id not in cells:
            raise StackfarmError(
                f"the plan has no cell {cell_id!r} (it has {len(cells)}; --cells with --plan takes an exact id)"
            )
        return exact_glob(cell_id)
    try:
        number = int(str(index).strip())
    except ValueError:
        raise StackfarmError(f"--cell-index {index!r} is not a number") from None
    if not 0 <= number < len(cells):
        raise StackfarmError(
            f"--cell-index {number}: the plan has {len(cells)} cells (0 to {len(cells) - 1})"
        )
    return exact_glob(cells[number])


@dataclass(frozen=True)
class Adopted:
    """What a worker runs a plan's cell with (`adopt`)."""

    matrix: Path
    #: The backend to realise the cell with (the plan's; as asked when the plan states no basis).
    backend: str
    store: str | None
    #: Why no GPU suite is asked here although a GPU answers (a plan hashed without one), else None.
    no_gpu: str | None = None
    #: cell id -> the runner kind the plan dispatched it to; cell id -> its planned input hash.
    kinds: Mapping[str, str] = field(default_factory=dict)
    planned: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def _basis_here(
    basis: HashBasis, asked: str, engine: Callable[[], str | None], gpu_reason: str | None
) -> tuple[str, str | None]:
    """(the backend, the no-GPU reason to impose) that honour `basis`, or a refusal naming both bases."""
    if asked not in ("auto", basis.backend):
        raise UsageError(
            f"--backend {asked}",
            f"the plan's input hashes are for {basis.describe()}: verdicts of backend {asked} would be pushed "
            "under other hashes, where no merge of the plan looks",
            fix=f"leave --backend out (the worker takes the plan's) or make the plan with --backend {asked}",
        )
    problems = []
    here_backend = basis.backend
    needs_engine = (kind := BACKENDS.get(basis.backend)) is not None and kind.needs_engine
    if needs_engine and (why := engine()) is not None:
        here_backend = "local"
        problems.append(f"no Docker engine answers ({why})")
    if basis.gpu and gpu_reason is not None:
        problems.append(gpu_reason)
    if problems:
        here = HashBasis(here_backend, basis.gpu and gpu_reason is None)
        raise EnvironmentProblem(
            f"the plan's input hashes are for {basis.describe()}; this machine can run {here.describe()} "
            f"({'; '.join(problems)}): its verdicts would be pushed under other input hashes and the merge of "
            "the plan would find none, so nothing is run",
            fix="run the workers where the plan's basis holds (a Docker engine, a GPU), or make the plan for "
            f"this machine (`stackfarm plan --json --backend {here.backend}"
            f"{'' if here.gpu else ' --no-gpu'}`)",
        )
    no_gpu = None
    if not basis.gpu and gpu_reason is None:
        no_gpu = (
            "the plan's input hashes are for a runner without a GPU (plan --no-gpu): no GPU suite is asked"
        )
    return here_backend, no_gpu


def adopt(
    doc: Mapping[str, Any],
    where: str,
    *,
    matrix: Path | None,
    backend: str,
    store: str | None,
    engine: Callable[[], str | None],
    gpu_reason: str | None,
) -> Adopted:
    """A worker's terms from the plan `doc` (read from `where`) and what its command line asked: `matrix` and
    `store` None when not given, `backend` "auto" when not given; `engine`: why no Docker engine answers (None
    when one does), asked only for a docker plan; `gpu_reason`: why no GPU answers here (None: one does)."""
    contract = PlanContract.of(doc, where)
    path = matrix or (Path(contract.matrix.path) if contract.matrix else Path("matrix.toml"))
    contract.check_matrix(path, where)
    if contract.store and store and store.rstrip("/") != contract.store.rstrip("/"):
        raise UsageError(
            f"--store {store}",
            f"the plan was made against the store {contract.store}: verdicts pushed elsewhere are not merged",
            fix="leave --store out (the worker takes the plan's), or make the plan with this --store",
        )
    warnings: list[str] = []
    no_gpu = None
    if contract.basis is None:
        chosen = backend
        warnings.append(
            f"{where} states no hash basis (an older `plan --json`): its input hashes may not be ours"
        )
    else:
        chosen, no_gpu = _basis_here(contract.basis, backend, engine, gpu_reason)
    cells = [c for c in doc.get("cells", []) if isinstance(c, Mapping)]
    return Adopted(
        matrix=path,
        backend=chosen,
        store=store or contract.store,
        no_gpu=no_gpu,
        kinds={str(c["id"]): str(c["runner"]) for c in cells if c.get("runner")},
        planned={str(c["id"]): str(c["input_hash"]) for c in cells if c.get("input_hash")},
        warnings=tuple(warnings),
    )


__all__ = ["Adopted", "adopt", "exact_glob", "read_plan", "select_from_plan"]
