"""The init step builds the built-in model once per machine: a second run directory with the same
inputs gets a copy of the first one's model, and any change to those inputs builds a new one.

Each `python -m plrl_workers.prepare` runs in its own process, as `plrl run` runs it: the second run
reuses the first's model bit for bit; the JSONL dataset edited in place (same path, new answers)
builds again, and a cache that cannot be written does not fail the run. The key's other inputs
(seed, warm-start settings, library versions, code) are hashed the same way.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any

from plrl_api import names, plan, worker_config
from plrl_api import spec as spec_mod

ENDPOINTS = worker_config.Endpoints(
    coordinator="127.0.0.1:1", rendezvous="127.0.0.1:1", weight_sync="127.0.0.1:1", metrics_port=0
)


def _prepare(
    run: pathlib.Path, cache: pathlib.Path, warm_start_steps: int = 2, dataset: pathlib.Path | None = None
) -> str:
    """Run the init step for a tiny job into `run/model`; its stdout (it must succeed)."""
    task: dict[str, Any] = {"name": "builtin:arith"}
    if dataset is not None:
        task = {"name": "jsonl", "dataset": {"path": str(dataset)}}
    doc = {
        "apiVersion": "pipelinerl.io/v1alpha1",
        "kind": "PipelineRLJob",
        "metadata": {"name": "cache"},
        "spec": {
            "model": {"name": "builtin:tiny", "dtype": "float32", "warmStartSteps": warm_start_steps},
            "task": task,
            "resources": {"totalGPUs": 2},
        },
    }
    job = spec_mod.parse_job(doc)
    paths = worker_config.Paths(
        model_dir=str(run / "model"),
        checkpoint_dir=str(run / "ckpt"),
        dataset_file=str(dataset) if dataset else None,
    )
    cfg = worker_config.build(job, plan.PodPlan.of(job.spec, 1), names.TRAINER, ENDPOINTS, paths)
    run.mkdir(parents=True)
    (run / "trainer.json").write_text(worker_config.dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "plrl_workers.prepare", "--config", str(run / "trainer.json")],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PLRL_CACHE_DIR": str(cache)},
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _weights(run: pathlib.Path) -> bytes:
    return (run / "model" / "model.safetensors").read_bytes()


def test_a_second_run_reuses_the_prepared_model_and_an_edited_dataset_builds_a_new_one(
    tmp_path: pathlib.Path,
) -> None:
    cache, data = tmp_path / "cache", tmp_path / "prompts.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(20)))
    first = _prepare(tmp_path / "a", cache, dataset=data)
    assert "building the tiny model" in first and "kept it in the cache" in first, first

    second = _prepare(tmp_path / "b", cache, dataset=data)
    assert "reusing the prepared model" in second and "building" not in second, second
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "b" / "model" / name).read_bytes() == (
            tmp_path / "a" / "model" / name
        ).read_bytes()

    # Same path, new answers: the old model must not be served. This cache cannot be written (its
    # directory is a file), which must not fail the run either.
    data.write_text("".join(f'{{"prompt": "{i}+1=", "answer": "{i + 2}"}}\n' for i in range(20)))
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    third = _prepare(tmp_path / "c", blocked, dataset=data)
    assert "building the tiny model" in third and "could not write the cache" in third, third
    assert (tmp_path / "c" / "model" / "model.safetensors").read_bytes() != (
        tmp_path / "a" / "model" / "model.safetensors"
    ).read_bytes()
