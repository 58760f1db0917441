"""Which tasks exist: `task.name` (`builtin:<name>` or `jsonl`) -> a `Task`.

The built-in tasks register here by name, so `tasks/base.py` knows nothing about them and nothing
is imported lazily by string. `plrl_api.spec.BUILTIN_TASKS` lists the same names for validation at
`kubectl apply` time (a test keeps the two equal).
Neighbours: `tasks/base.py` (the protocol), `tasks/arith.py`, `tasks/reverse.py`, `tasks/jsonl.py`.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

from plrl_api import spec
from plrl_workers.tasks import arith, base, jsonl, reverse

BUILTIN: dict[str, Callable[[], base.Task]] = {
    "arith": arith.ArithTask,
    "reverse": reverse.ReverseTask,
}


def builtin(name: str) -> base.Task:
    """The built-in task called `name` (without the `builtin:` prefix)."""
    if name not in BUILTIN:
        known = ", ".join(f"builtin:{n}" for n in sorted(BUILTIN))
        raise base.TaskError(f"task.name: unknown builtin task 'builtin:{name}' (known: {known})")
    return BUILTIN[name]()


def from_spec(task_spec: spec.TaskSpec, dataset_file: str | pathlib.Path | None = None) -> base.Task:
    """The task a job asks for; a `jsonl` task reads `dataset_file` (the worker config's path)."""
    if task_spec.name.startswith("builtin:"):
        return builtin(task_spec.name.removeprefix("builtin:"))
    if dataset_file is None:
        raise base.TaskError(
            "task.dataset: a jsonl task needs a dataset file (dataset.path or dataset.configMap)"
        )
    return jsonl.load(pathlib.Path(dataset_file))
