"""`plrl run` hands GPUs to its processes (`local.devices.placements`) and picks their collectives.

Cases: a CPU-only machine sets nothing; the demo job (1 trainer + 1 generator) on one GPU shares
it and switches the job's collectives to gloo (NCCL refuses two ranks on one device); enough GPUs
give every pod its own, consecutively, with NCCL; fewer GPUs than accelerators wrap round-robin;
`CUDA_VISIBLE_DEVICES` decides what is visible; the backend choice is checked; and the runner puts
the placements into each process's env and gloo into the worker configs.
"""

from __future__ import annotations

import pathlib
import secrets

import pytest

from plrl_api import names, plan, worker_config
from plrl_operator import jobfile
from plrl_operator.local import devices, runner
from plrl_workers.engines import training

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _plan(
    trainer_gpus: int, gpus_per_trainer: int, generators: int, gpus_per_generator: int = 1
) -> plan.PodPlan:
    return plan.PodPlan(
        generator_gpus=generators * gpus_per_generator,
        trainer_gpus=trainer_gpus,
        gpus_per_generator=gpus_per_generator,
        gpus_per_trainer=gpus_per_trainer,
    )


DEMO = _plan(1, 1, 1)


def _visible(envs: tuple[object, ...]) -> list[str]:
    return [e["CUDA_VISIBLE_DEVICES"] for e in envs]  # type: ignore[index]


def test_a_cpu_only_machine_changes_nothing() -> None:
    got = devices.placements(DEMO, [])
    assert got == devices.Placements(({},), ({},), shared=False)


def test_the_demo_job_on_one_gpu_shares_it_over_gloo() -> None:
    got = devices.placements(DEMO, ["0"])
    assert (_visible(got.trainers), _visible(got.generators), got.shared) == (["0"], ["0"], True)


def test_enough_gpus_give_each_pod_its_own_and_keep_nccl() -> None:
    got = devices.placements(_plan(4, 2, 4), [str(i) for i in range(8)])
    # A trainer pod's ranks see the pod's GPUs and pick theirs by local rank, as in a cluster.
    assert _visible(got.trainers) == ["0,1", "0,1", "2,3", "2,3"]
    assert _visible(got.generators) == ["4", "5", "6", "7"]
    assert not got.shared


def test_fewer_gpus_than_accelerators_wrap_round_robin_one_gpu_per_process() -> None:
    got = devices.placements(_plan(2, 2, 2), ["3", "5", "7"])
    assert (_visible(got.trainers), _visible(got.generators), got.shared) == (["3", "5"], ["7", "3"], True)


@pytest.mark.parametrize(
    ("listed", "expected"), [("0,2", ["0", "2"]), ("", []), ("-1", []), (" 1 , 4 ", ["1", "4"])]
)
def test_cuda_visible_devices_decides_what_is_visible(listed: str, expected: list[str]) -> None:
    assert devices.visible_gpus({"CUDA_VISIBLE_DEVICES": listed}) == expected


def test_the_collective_backend_choice_is_checked() -> None:
    assert training.collective_backend("gloo") == "gloo"
    with pytest.raises(ValueError, match="must be 'gloo' or 'nccl'"):
        training.collective_backend("mpi")


def test_the_runner_puts_placements_into_envs_and_gloo_into_configs(tmp_path: pathlib.Path) -> None:
    job = jobfile.load_job(ROOT / "examples" / "local-tiny.yaml")
    pod_plan = plan.PodPlan.of(job.spec, 1)
    gpus = devices.placements(pod_plan, ["0"])
    launch = runner.Launch(
        job,
        pod_plan,
        runner.local_paths(job, tmp_path, ROOT / "examples"),
        tmp_path,
        token=secrets.token_urlsafe(8),
        gpus=gpus,
        endpoints=runner.loopback_endpoints(gpus.shared),
    )
    specs = launch.specs()
    assert {s.name: s.env["CUDA_VISIBLE_DEVICES"] for s in specs} == {"trainer-0": "0", "generator-0": "0"}
    for role in names.ROLES:
        cfg = worker_config.load(tmp_path / "config" / f"{role}.json")
        assert cfg.endpoints.collective_backend == "gloo"
