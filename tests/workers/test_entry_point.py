"""`plrl-worker` refuses to start on what it cannot use, with one line naming it (exit 2).

Cases: a config file that is not there; a model directory that is missing, or has no config.json
(the line names spec.model.name and the path, which a pod's termination message then carries).
"""

from __future__ import annotations

import pathlib

import pytest

from plrl_api import names, plan, worker_config
from plrl_api import spec as spec_mod
from plrl_workers import __main__ as entry
from tests import samples


def _config(tmp_path: pathlib.Path, model_dir: pathlib.Path) -> pathlib.Path:
    job = spec_mod.parse_job(
        {
            "apiVersion": "pipelinerl.io/v1alpha1",
            "kind": "PipelineRLJob",
            "metadata": {"name": "j"},
            "spec": {"model": {"name": str(model_dir)}, "resources": {"totalGPUs": 2}},
        }
    )
    endpoints = worker_config.Endpoints(
        coordinator="t:1", rendezvous="t:2", weight_sync="t:3", metrics_port=9400
    )
    paths = worker_config.Paths(model_dir=str(model_dir), checkpoint_dir=str(tmp_path / "ckpt"))
    cfg = worker_config.build(job, plan.PodPlan.of(job.spec, 1), names.TRAINER, endpoints, paths)
    out = tmp_path / "trainer.json"
    out.write_text(worker_config.dump(cfg))
    return out


def test_a_missing_config_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.main(["--role", "trainer", "--config", str(tmp_path / "nope.json")]) == 2
    assert "cannot read worker config" in capsys.readouterr().err


@pytest.mark.parametrize("make", [False, True])
def test_a_model_directory_that_is_not_there(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, make: bool
) -> None:
    model = tmp_path / "models" / "tiny"
    if make:
        model.mkdir(parents=True)
    monkeypatch.setenv(names.ENV_TOKEN_FILE, samples.token_env()[names.ENV_TOKEN_FILE])
    assert entry.main(["--role", "trainer", "--config", str(_config(tmp_path, model))]) == 2
    err = capsys.readouterr().err.strip()
    why = "no config.json in it" if make else "no such directory"
    assert err == (
        f"plrl-worker: spec.model.name: {model} is not a Hugging Face model directory ({why}); "
        "in a cluster it must be on a volume the pods mount (spec.model.volume)"
    )
