"""`plrl run` hands GPUs to its processes (`local_devices.placements`) and picks their collectives.

Cases: a CPU-only machine sets nothing; the demo job (1 trainer + 1 generator) on one GPU shares
it and switches every collective to gloo (NCCL refuses two ranks on one device); enough GPUs give
every pod its own, consecutively, with NCCL; fewer GPUs than accelerators wrap round-robin;
`CUDA_VISIBLE_DEVICES` decides what is visible; the backend override is read and checked; and
`process_specs` puts the placements into the processes' env.
"""

from __future__ import annotations

import pathlib

import pytest

from plrl_operator import spec as spec_mod
from plrl_workers import local, local_devices
from plrl_workers.engines import training

GLOO = {training.COLLECTIVE_BACKEND_ENV: "gloo"}
DEMO = local_devices.Pods(trainer_pods=1, gpus_per_trainer=1, generator_pods=1, gpus_per_generator=1)


def envs(placements: list[local_devices.Placement]) -> list[dict[str, str]]:
    return [dict(p.env) for p in placements]


def test_a_cpu_only_machine_changes_nothing() -> None:
    trainers, generators = local_devices.placements(DEMO, [])
    assert envs(trainers) == [{}] and envs(generators) == [{}]


def test_the_demo_job_on_one_gpu_shares_it_over_gloo() -> None:
    trainers, generators = local_devices.placements(DEMO, ["0"])
    assert envs(trainers) == [{"CUDA_VISIBLE_DEVICES": "0", **GLOO}]
    assert envs(generators) == [{"CUDA_VISIBLE_DEVICES": "0", **GLOO}]


def test_enough_gpus_give_each_pod_its_own_and_keep_nccl() -> None:
    pods = local_devices.Pods(trainer_pods=2, gpus_per_trainer=2, generator_pods=4, gpus_per_generator=1)
    trainers, generators = local_devices.placements(pods, [str(i) for i in range(8)])
    # A trainer pod's ranks see the pod's GPUs and pick theirs by LOCAL_RANK, as in a cluster.
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs(trainers)] == ["0,1", "0,1", "2,3", "2,3"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs(generators)] == ["4", "5", "6", "7"]
    assert not any(training.COLLECTIVE_BACKEND_ENV in e for e in envs(trainers) + envs(generators))


def test_fewer_gpus_than_accelerators_wrap_round_robin_one_gpu_per_process() -> None:
    pods = local_devices.Pods(trainer_pods=1, gpus_per_trainer=2, generator_pods=2, gpus_per_generator=1)
    trainers, generators = local_devices.placements(pods, ["3", "5", "7"])
    assert envs(trainers) == [{"CUDA_VISIBLE_DEVICES": "3", **GLOO}, {"CUDA_VISIBLE_DEVICES": "5", **GLOO}]
    assert envs(generators) == [{"CUDA_VISIBLE_DEVICES": "7", **GLOO}, {"CUDA_VISIBLE_DEVICES": "3", **GLOO}]


@pytest.mark.parametrize(
    ("listed", "expected"), [("0,2", ["0", "2"]), ("", []), ("-1", []), (" 1 , 4 ", ["1", "4"])]
)
def test_cuda_visible_devices_decides_what_is_visible(listed: str, expected: list[str]) -> None:
    assert local_devices.visible_gpus({"CUDA_VISIBLE_DEVICES": listed}) == expected


def test_the_collective_backend_can_be_forced_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(training.COLLECTIVE_BACKEND_ENV, "gloo")
    assert training.collective_backend() == "gloo"
    monkeypatch.setenv(training.COLLECTIVE_BACKEND_ENV, "mpi")
    with pytest.raises(ValueError, match="must be 'gloo' or 'nccl'"):
        training.collective_backend()


def test_process_specs_put_the_placements_into_each_process_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    job = spec_mod.load_job(pathlib.Path(__file__).parents[2] / "examples" / "local-tiny.yaml")
    monkeypatch.setattr(local_devices, "visible_gpus", lambda: ["0"])
    specs = local.process_specs(job, local.Layout.of(job.spec), tmp_path, tmp_path / "model")
    assert {s.name: s.env["CUDA_VISIBLE_DEVICES"] for s in specs} == {"trainer-0": "0", "generator-0": "0"}
    assert all(s.env[training.COLLECTIVE_BACKEND_ENV] == "gloo" for s in specs)
