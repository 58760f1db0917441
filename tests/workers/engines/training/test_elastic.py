"""A trainer checkpoint loads at another world size (the autoscaler's elastic restart), for torch DDP
and DeepSpeed ZeRO-1 and ZeRO-2, as real ranks (separate processes, gloo on loopback).

Each backend trains `_worker.ELASTIC_STEPS` steps at W ranks, checkpoints, and takes one more step
(the reference). A fresh run at W' != W loads that checkpoint (2 -> 1 and 1 -> 2): its Adam state
(exp_avg, exp_avg_sq, step of every parameter, gathered whole) equals the saved one exactly, and
after the same step on the same global batch its parameters agree with the reference within
test_backends.TOL. A checkpoint whose engine.json predates the elastic load (no tag, no partition
list) still loads at its own world size, exactly. An incomplete checkpoint is refused with its path
and the missing file; one whose ZeRO partition was replaced after the save (by a pickle that would
run code) is refused before anything unpickles it. Without ranks, on partition files made here: the
re-cut gives every new rank its slice (also 2 -> 3, 3 -> 2, 4 -> 3), and partitions of another
model or save are refused.
"""

from __future__ import annotations

import json
import pathlib
import pickle
import shutil
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from plrl_workers import checkpoint_manifest
from plrl_workers.engines import deepspeed_engine, zero_reshard
from tests.workers.engines.training import _worker, conftest
from tests.workers.engines.training.test_backends import TOL, _max_diff

RUNS = conftest.ELASTIC_RUNS
LEGACY = "elastic.zero2.w2-legacy"
TAMPERED = "elastic.zero2.w2-tampered"


class _RunsCode:
    """Unpickled, it creates `marker`: what an attacker's file would do instead."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


@pytest.fixture(scope="module")
def resized(
    tiny_model_dir: pathlib.Path,
    one_rank: pathlib.Path,
    two_ranks: pathlib.Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[int, int], pathlib.Path]:
    """Where each (saved, loaded) world size's results are: `two_ranks` saved at 2, `one_rank` saved
    at 1 and loaded those at 1; here 2 ranks load the 1-rank checkpoints, and a copy of a 2-rank one
    whose engine.json is cut back to what it held before the elastic load (no tag, no partitions)."""
    out = tmp_path_factory.mktemp("elastic")
    shutil.copytree(two_ranks / "elastic.zero2.w2", out / LEGACY)
    for engine_json in (out / LEGACY).glob("step-*/engine.json"):
        meta = json.loads(engine_json.read_text())
        engine_json.write_text(json.dumps({k: meta[k] for k in ("backend", "version", "world_size")}))
        checkpoint_manifest.write(engine_json.parent, _worker.KEY)  # as if saved like that
    # One partition file replaced by a pickle that runs code when DeepSpeed unpickles it.
    shutil.copytree(two_ranks / "elastic.zero2.w2", out / TAMPERED)
    (partition,) = (out / TAMPERED).glob("step-*/deepspeed/state/zero_pp_rank_1_*optim_states.pt")
    partition.write_bytes(pickle.dumps(_RunsCode(out / "code-ran")))
    roots = f"{conftest.elastic_roots(one_rank, 1)},{out / LEGACY},{out / TAMPERED}"
    conftest.launch_ranks(2, ["--model", str(tiny_model_dir), "--out", str(out), "--elastic-load", roots])
    return {(2, 2): two_ranks, (1, 1): one_rank, (2, 1): one_rank, (1, 2): out}


def _load(out: pathlib.Path, name: str) -> dict[str, Any]:
    assert not (out / f"{name}.error.txt").exists(), (out / f"{name}.error.txt").read_text()
    result: dict[str, Any] = torch.load(out / f"{name}.pt", weights_only=False)
    return result


def _assert_same_state(a: dict[str, dict[str, torch.Tensor]], b: dict[str, dict[str, torch.Tensor]]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys() == {"exp_avg", "exp_avg_sq", "step"}, name
        for key in a[name]:
            torch.testing.assert_close(a[name][key], b[name][key], atol=0, rtol=0, msg=f"{name} {key}")


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize(("saved", "loaded"), [(2, 1), (1, 2)])
def test_a_checkpoint_loads_at_another_world_size(
    resized: dict[tuple[int, int], pathlib.Path], run: str, saved: int, loaded: int
) -> None:
    import safetensors.torch

    reference = _load(resized[saved, saved], f"elastic.{run}.w{saved}")
    result = _load(resized[saved, loaded], f"elastic.{run}.w{saved}.to{loaded}")
    _assert_same_state(result["state"], reference["state"])
    assert all(s["step"] == _worker.ELASTIC_STEPS for s in reference["state"].values())  # not a fresh state
    assert _max_diff(result["params"], reference["params"]) <= TOL
    (ckpt,) = (resized[saved, saved] / f"elastic.{run}.w{saved}").glob("step-*")
    before = safetensors.torch.load_file(str(ckpt / "model" / "model.safetensors"))
    assert _max_diff(reference["params"], before) > 100 * TOL  # the compared step really moved them


@pytest.mark.slow
def test_a_checkpoint_from_before_the_elastic_load_still_loads(
    resized: dict[tuple[int, int], pathlib.Path],
) -> None:
    reference = _load(resized[2, 2], "elastic.zero2.w2")
    old = _load(resized[1, 2], f"{LEGACY}.to2")
    _assert_same_state(old["state"], reference["state"])
    assert _max_diff(old["params"], reference["params"]) == 0.0  # the same-size path: DeepSpeed's own


@pytest.mark.slow
def test_a_checkpoint_file_changed_after_the_save_is_refused_before_anything_unpickles_it(
    resized: dict[tuple[int, int], pathlib.Path],
) -> None:
    out = resized[1, 2]
    error = (out / f"{TAMPERED}.to2.error.txt").read_text()
    assert "deepspeed/state/zero_pp_rank_1_mp_rank_00_optim_states.pt changed after it was saved" in error
    assert not (out / "code-ran").exists()
    assert not (out / f"{TAMPERED}.to2.pt").exists()


def test_an_incomplete_deepspeed_checkpoint_is_refused_with_its_path_and_the_missing_file(
    tmp_path: pathlib.Path,
) -> None:
    tag_dir = tmp_path / "deepspeed" / "state"
    tag_dir.mkdir(parents=True)
    (tag_dir / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"")
    (tag_dir / "zero_pp_rank_2_mp_rank_00_optim_states.pt").write_bytes(b"")
    listed = [f"deepspeed/state/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(3)]
    with pytest.raises(ValueError, match=rf"checkpoint {tmp_path}: .*missing: \['zero_pp_rank_1_mp"):
        deepspeed_engine._saved_partitions(tmp_path, {"world_size": 3, "partitions": listed})
    with pytest.raises(ValueError, match=rf"checkpoint {tmp_path}: written by 3 ranks.* \(missing \[1\]\)"):
        deepspeed_engine._saved_partitions(tmp_path, {"world_size": 3})  # an engine.json without the list
    (tag_dir / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"")
    assert deepspeed_engine._saved_partitions(tmp_path, {"world_size": 3}) == [
        tag_dir / n.split("/")[-1] for n in listed
    ]


def _layout(
    sizes: dict[str, int], world_size: int
) -> tuple[int, list[dict[str, SimpleNamespace]], list[dict[str, zero_reshard.Slot]]]:
    """ZeRO's cut of one flat group into `world_size` equal partitions (the last one padded): the
    partition size, each partition's `param_slice_mappings`, and each rank's slots."""
    total = sum(sizes.values())
    size = -(-total // world_size)
    mappings: list[dict[str, SimpleNamespace]] = [{} for _ in range(world_size)]
    slots: list[dict[str, zero_reshard.Slot]] = [{} for _ in range(world_size)]
    at = 0
    for name, n in sizes.items():
        for r in range(world_size):
            lo, hi = max(at, r * size), min(at + n, (r + 1) * size)
            if lo < hi:
                mappings[r][name] = SimpleNamespace(start=lo - r * size, numel=hi - lo)
                slots[r][name] = zero_reshard.Slot(0, lo - at, lo - r * size, hi - lo)
        at += n
    return size, mappings, slots


def _fake_zero_optimizer(sizes: dict[str, int], world_size: int, rank: int) -> SimpleNamespace:
    """What `zero_reshard.read` looks at in a DeepSpeedZeroOptimizer: one group's parameters, their
    names and fragment addresses, and this rank's flat partition."""
    size, _, slots = _layout(sizes, world_size)
    params = []
    for name, n in sizes.items():
        p = torch.zeros(n)
        s = slots[rank].get(name)
        p._hp_mapping = (  # type: ignore[attr-defined]
            None
            if s is None
            else SimpleNamespace(
                lp_fragment_address=SimpleNamespace(start=s.param_start, numel=s.numel),
                hp_fragment_address=SimpleNamespace(start=s.part_start, numel=s.numel),
            )
        )
        params.append(p)
    flat = torch.zeros(size)
    return SimpleNamespace(
        bit16_groups=[params],
        param_names=dict(zip(params, sizes, strict=True)),
        optimizer=SimpleNamespace(param_groups=[{"params": [flat]}]),
        single_partition_of_fp32_groups=[flat],
    )


def _save_partitions(
    directory: pathlib.Path, sizes: dict[str, int], flat: torch.Tensor, world_size: int
) -> list[pathlib.Path]:
    """Partition files like DeepSpeed's for `flat` (the concatenated parameters) cut `world_size` ways:
    fp32 weights `flat`, exp_avg `2 * flat`, step 3."""
    size, mappings, _ = _layout(sizes, world_size)
    padded = torch.nn.functional.pad(flat, (0, size * world_size - flat.numel())).view(world_size, size)
    files = []
    for r in range(world_size):
        lean = min(size, max(0, flat.numel() - r * size))
        state = {"step": torch.tensor(3.0), "exp_avg": 2 * padded[r]}
        base = {"state": {0: state}, "param_groups": [{"lr": 0.5, "params": [0]}]}
        sd = {
            "base_optimizer_state": base,
            "single_partition_of_fp32_groups": [padded[r][:lean].clone()],
            "param_slice_mappings": [mappings[r]],
            "partition_count": [world_size],
            "group_paddings": [size - lean],
        }
        files.append(directory / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        torch.save({"optimizer_state_dict": sd}, files[-1])
    return files


SIZES = {"embed": 5, "q": 7, "bias": 1, "head": 10}


@pytest.mark.parametrize(("saved", "loaded"), [(2, 1), (1, 2), (2, 3), (3, 2), (4, 3)])
def test_recutting_gives_each_new_rank_its_slice_of_weights_and_state(
    tmp_path: pathlib.Path, saved: int, loaded: int
) -> None:
    flat = torch.arange(1.0, sum(SIZES.values()) + 1)
    files = _save_partitions(tmp_path, SIZES, flat, saved)
    size, _, _ = _layout(SIZES, loaded)
    expected = torch.nn.functional.pad(flat, (0, size * loaded - flat.numel())).view(loaded, size)
    for rank in range(loaded):
        recut = zero_reshard.read(_fake_zero_optimizer(SIZES, loaded, rank), files, "ckpt")
        (target,) = recut.targets
        assert target.keys() == {"exp_avg", zero_reshard._FP32}  # step is not cut: it comes from rank 0
        torch.testing.assert_close(target[zero_reshard._FP32], expected[rank], atol=0, rtol=0)
        torch.testing.assert_close(target["exp_avg"], 2 * expected[rank], atol=0, rtol=0)


def test_recutting_refuses_partitions_of_another_model_or_another_save(tmp_path: pathlib.Path) -> None:
    flat = torch.arange(1.0, sum(SIZES.values()) + 1)
    files = _save_partitions(tmp_path, SIZES, flat, 2)
    other = {"embed": 5, "k": 7, "bias": 1, "head": 10}
    with pytest.raises(ValueError, match=r"checkpoint ckpt: zero_pp_rank_0_.* holds parameter 'q', not in"):
        zero_reshard.read(_fake_zero_optimizer(other, 1, 0), files, "ckpt")
    bigger = SIZES | {"head": 11}
    with pytest.raises(ValueError, match=r"checkpoint ckpt: its partitions hold .*'head': \(10, 11\)"):
        zero_reshard.read(_fake_zero_optimizer(bigger, 1, 0), files, "ckpt")
    with pytest.raises(ValueError, match=r"zero_pp_rank_0_.* was cut into \[2\] partitions .*expected 3"):
        zero_reshard.read(_fake_zero_optimizer(SIZES, 1, 0), [*files, files[0]], "ckpt")
