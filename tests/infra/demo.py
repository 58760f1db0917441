"""What `examples/cluster-tiny.yaml` needs from a cluster: the demo model on a volume, and its claims.

- `prepare_model(models_dir)`: builds the built-in tiny model, warm-started on the example's task, into
  `models_dir/tiny` by running the same init step `plrl run` runs (`python -m plrl_workers.prepare`),
  once: a second call with the same inputs reuses the directory.
- `volumes(namespace, models_dir, checkpoints_dir)`: PersistentVolumes backed by those host directories
  (hostPath), pre-bound to the example's claims `plrl-models` (read-only) and `plrl-checkpoints`, and
  the claims themselves; there is no provisioner in this cluster.
- `job(**spec)`: the example as a dict, with `spec` merged in (for tests' variants).

Neighbours: tests/operator/cluster/test_e2e_*.py, cluster.py (`make cluster-up`), bench/e2e_cluster.py.
"""

from __future__ import annotations

import copy
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Any

import yaml

from plrl_api import names, plan, worker_config
from plrl_api import spec as spec_mod

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cluster-tiny.yaml"
MODEL_CLAIM, CHECKPOINT_CLAIM = "plrl-models", "plrl-checkpoints"
MODEL_NAME = "tiny"
WARM_START_STEPS = 150  # as examples/local-tiny.yaml


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """`base` with `patch` merged in recursively (a merge patch without deletes)."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        out[key] = (
            merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def job(metadata: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """The example job with `spec` merged into its spec (recursively) and `metadata` into its metadata."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return merge(doc, {"metadata": metadata or {}, "spec": spec})


def prepare_model(models_dir: pathlib.Path, warm_start_steps: int = WARM_START_STEPS) -> pathlib.Path:
    """The warm-started tiny model at `models_dir/tiny` (built on first use; ~15 s on 2 cores)."""
    doc = job()
    doc["spec"]["model"] = {"name": "builtin:tiny", "dtype": "float32", "warmStartSteps": warm_start_steps}
    parsed = spec_mod.parse_job(doc)
    out = models_dir / MODEL_NAME
    with tempfile.TemporaryDirectory() as tmp:
        paths = worker_config.Paths(model_dir=str(out), checkpoint_dir=tmp)
        cfg = worker_config.build(
            parsed, plan.PodPlan.of(parsed.spec, 1), names.TRAINER, _LOCAL_ENDPOINTS, paths
        )
        cfg_file = pathlib.Path(tmp) / "trainer.json"
        cfg_file.write_text(worker_config.dump(cfg))
        proc = subprocess.run(
            [sys.executable, "-m", "plrl_workers.prepare", "--config", str(cfg_file)],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=600,
            check=False,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"preparing the demo model failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return out


_LOCAL_ENDPOINTS = worker_config.Endpoints(
    coordinator="127.0.0.1:1", rendezvous="127.0.0.1:1", weight_sync="127.0.0.1:1", metrics_port=0
)


def volumes(namespace: str, models_dir: pathlib.Path, checkpoints_dir: pathlib.Path) -> list[dict[str, Any]]:
    """Two pre-bound hostPath PVs (named after the namespace, as PVs are cluster-wide) and their claims."""
    docs: list[dict[str, Any]] = []
    for claim, path, mode in (
        (MODEL_CLAIM, models_dir, "ReadOnlyMany"),
        (CHECKPOINT_CLAIM, checkpoints_dir, "ReadWriteMany"),
    ):
        pv = f"{namespace}-{claim}"
        docs += [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": pv, "labels": {"plrl.dev/demo": namespace}},
                "spec": {
                    "capacity": {"storage": "10Gi"},
                    "accessModes": [mode],
                    "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                    "storageClassName": "",
                    "persistentVolumeReclaimPolicy": "Retain",
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {
                    "accessModes": [mode],
                    "resources": {"requests": {"storage": "10Gi"}},
                    "storageClassName": "",
                    "volumeName": pv,
                },
            },
        ]
    return docs


def dump_all(docs: list[dict[str, Any]]) -> str:
    return "\n---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)
