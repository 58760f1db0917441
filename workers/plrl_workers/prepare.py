"""`python -m plrl_workers.prepare --config FILE`: check a job's task and build its initial model, once.

`plrl run` runs this before any worker starts, the way a pod's init container would: it reads the
trainer's worker config, checks that the task's prompts and the reward function load (exit 2 with
the spec field named, so a bad dataset or reward never reaches the workers), and for the built-in
model builds and warm-starts it into `paths.modelDir` (reused when its inputs are unchanged).
The controller itself never imports torch; this process does the worker-side work.

Neighbours: `models/tiny.py`, `tasks/warm_start.py`, `tasks/registry.py`, `tasks/rewards.py`,
`plrl_operator.local.runner` (the caller).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import pathlib
import sys

from plrl_api import worker_config
from plrl_workers.tasks import base, registry, rewards, warm_start

BUILTIN_MODELS = ("builtin:tiny",)
EXIT_BAD_SPEC = 2


def check_task(cfg: worker_config.WorkerConfig) -> base.Task:
    """The job's task, with its reward function loaded; TaskError / RewardError name the field."""
    task = registry.from_spec(cfg.spec.task, cfg.paths.dataset_file)
    rewards.load(cfg.spec.task.reward)
    return task


def _warm_start_data_digest(task: base.Task, warm: warm_start.WarmStartConfig) -> str:
    """A digest of exactly the items the warm start trains on, so an edited dataset file (same
    path, new content) is never served a model trained on the old one."""
    h = hashlib.sha256()
    for it in itertools.islice(base.stream(task, warm.seed, "train"), warm.steps * warm.batch_size):
        h.update(json.dumps([it.text, it.answer]).encode())
    return h.hexdigest()


def build_builtin_model(cfg: worker_config.WorkerConfig, task: base.Task) -> pathlib.Path:
    """The built-in tiny model, warm-started on `task`, at `paths.modelDir` (base weights beside it);
    copied from the machine's cache of prepared models when it holds one for the same inputs."""
    from plrl_workers.engines import training
    from plrl_workers.models import prepared_cache, tiny

    m = cfg.spec.model
    out = pathlib.Path(cfg.paths.model_dir)
    warm = warm_start.WarmStartConfig(steps=m.warm_start_steps, seed=m.seed)
    k = prepared_cache.key(
        {
            "model": m.name,
            "seed": m.seed,
            "task": task.name,
            "warm_start": dataclasses.asdict(warm),
            "data": _warm_start_data_digest(task, warm),
        },
        [tiny, warm_start, training, base],
    )
    entry = prepared_cache.fetch(k, out)
    if entry is not None:
        print(f"reusing the prepared model {entry}", flush=True)
        return out
    base_dir = tiny.build(out.parent / "base", seed=m.seed)
    print(f"building the tiny model and warm-starting it for {m.warm_start_steps} steps", flush=True)
    warm_start.run(base_dir, out, task, warm)
    entry = prepared_cache.store(k, out)
    print(f"kept it in the cache as {entry}" if entry else "could not write the cache", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m plrl_workers.prepare", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--config", required=True, help="the trainer's worker config (run-dir/config/trainer.json)"
    )
    args = ap.parse_args(argv)
    try:
        cfg = worker_config.load(args.config)
        task = check_task(cfg)
    except worker_config.ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_BAD_SPEC
    except (base.TaskError, rewards.RewardError) as err:
        print(f"spec.{err}", file=sys.stderr)
        return EXIT_BAD_SPEC
    name = cfg.spec.model.name
    if name.startswith("builtin:"):
        if name not in BUILTIN_MODELS:
            print(
                f"spec.model.name: unknown builtin model {name!r} (known: {', '.join(BUILTIN_MODELS)})",
                file=sys.stderr,
            )
            return EXIT_BAD_SPEC
        build_builtin_model(cfg, task)
    elif not (pathlib.Path(cfg.paths.model_dir) / "config.json").exists():
        print(
            f"spec.model.name: {cfg.paths.model_dir} is not a Hugging Face model directory (no config.json)",
            file=sys.stderr,
        )
        return EXIT_BAD_SPEC
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
