"""One trainer rank for the training-engine tests (run by conftest.launch_ranks, never collected).

`--train RUNS`: for each named run (backend, ZeRO stage, clip), build a fresh engine from the same model,
train `--steps` optimizer steps on the same synthetic rollout groups, and save every rank's final
parameters and the per-step metrics to `<out>/<run>.rank<r>.pt`.

AdamW runs with eps=1e-4 here (default 1e-8): with the default, Adam's update g/(|g|+eps) turns
float-rounding differences of near-zero gradients (|g| ~ 1e-9, from a different reduction order
across ranks or ZeRO-2's per-micro-batch reduce-scatter) into update differences of up to ~lr/10,
which would force a loose tolerance; with eps=1e-4 the update is smooth in g and the backends can
be compared at rounding level, so a wrong normalisation or a missed reduction shows at once.
`--checkpoint RUNS --phase first|resume`: the resume scenario of test_checkpoint.py (see there).
`--elastic-save RUNS` / `--elastic-load ROOTS`: the world-size change of test_elastic.py (see there).
`--dtype bfloat16` trains in bf16 on CUDA (autocast for DDP, DeepSpeed's bf16 mode; test_cuda.py);
saved parameters are always float32 on the CPU, so runs on any device compare directly.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import time

import torch
import torch.distributed as dist

from plrl_workers import checkpoint, checkpoint_manifest, protocol
from plrl_workers.engines import base, factory, training
from plrl_workers.rl import losses, step

KEY = checkpoint_manifest.signing_key("test-job-token")
"""What every test checkpoint is signed with (a job's token derives it)."""

RL = step.RLConfig(
    loss=losses.LossConfig("reinforce_tis", is_clamp=2.0),
    temperature=0.9,
    tokens_per_micro_batch=48,
    max_lag=8,
)
RUNS = {
    "torch": ("torch", 1, 0.0),
    "zero1": ("deepspeed", 1, 0.0),
    "zero2": ("deepspeed", 2, 0.0),
    "torch-clip": ("torch", 1, 0.05),
    "zero1-clip": ("deepspeed", 1, 0.05),
    "zero2-clip": ("deepspeed", 2, 0.05),
}


def groups_for_step(
    step_index: int, trainer_version: int, n_groups: int = 4, g: int = 4
) -> list[protocol.RolloutGroup]:
    """Deterministic synthetic rollouts: off-policy logprobs, lagging versions, 0/1 rewards."""
    rng = random.Random(1000 + step_index)
    out = []
    for k in range(n_groups):
        prompt = [rng.randrange(4, 80) for _ in range(rng.randint(3, 8))]
        samples = []
        for _ in range(g):
            n = rng.randint(2, 14)
            samples.append(
                protocol.Sample(
                    token_ids=[rng.randrange(4, 80) for _ in range(n)],
                    logprobs=[-rng.uniform(0.2, 6.0) for _ in range(n)],
                    versions=[max(0, trainer_version - rng.randint(0, 2)) for _ in range(n)],
                    reward=float(rng.random() < 0.5),
                    finish_reason="stop",
                )
            )
        out.append(
            protocol.RolloutGroup(f"lease-{step_index}-{k}", step_index * 100 + k, prompt, samples, "gen")
        )
    return out


def engine_for(model: str, run: str, seed: int = 0, dtype: str = "float32") -> base.TrainingEngine:
    backend, stage, clip = RUNS[run]
    cfg = training.TrainEngineConfig(
        model_path=model,
        backend=backend,  # type: ignore[arg-type]
        zero_stage=stage,
        learning_rate=1e-3,
        gradient_clipping=clip,
        eps=1e-4,
        seed=seed,
        dtype=dtype,  # type: ignore[arg-type]
    )
    return factory.training_engine(cfg)


def train(
    engine: base.TrainingEngine, first_step: int, steps: int
) -> tuple[list[dict[str, float]], float, float]:
    metrics = []
    tokens = 0.0
    elapsed = 0.0
    for i in range(first_step, first_step + steps):
        prep = step.prepare(groups_for_step(i, engine.version), engine.version, engine.world_size, RL)
        t0 = time.perf_counter()
        m = step.train_step(engine, prep.micro_batches[engine.rank], RL)
        elapsed += time.perf_counter() - t0
        tokens += m["input_tokens"]
        metrics.append(m | prep.metrics())
    return metrics, tokens, elapsed


def params(engine: base.TrainingEngine) -> dict[str, torch.Tensor]:
    return {n: t.detach().float().cpu().clone() for n, t in engine.named_parameters_for_sync()}


def run_train(model: str, run: str, steps: int, out: pathlib.Path, dtype: str = "float32") -> None:
    t0 = time.perf_counter()
    engine = engine_for(model, run, dtype=dtype)
    init_s = time.perf_counter() - t0
    metrics, tokens, elapsed = train(engine, 0, steps)
    result = {"params": params(engine), "metrics": metrics, "init_s": init_s}
    result["tokens_per_s"] = tokens / elapsed if elapsed else 0.0
    torch.save(result, out / f"{run}.rank{dist.get_rank()}.pt")
    engine.close()


def run_checkpoint(model: str, run: str, phase: str, out: pathlib.Path) -> None:
    rank = dist.get_rank()
    root = out / f"ckpt-{run}"
    engine = engine_for(model, run)
    if phase == "first":
        # A: 5 steps straight. B: 3 steps, checkpoint, 2 more (the checkpoint must not perturb).
        train(engine, 0, 5)
        torch.save({"params": params(engine)}, out / f"{run}.straight.rank{rank}.pt")
        engine.close()
        engine = engine_for(model, run)
        train(engine, 0, 3)
        torch.save({"params": params(engine)}, out / f"{run}.after3.rank{rank}.pt")
        for s in (1, 2, 3):  # the same weights saved thrice: exercises retention
            extra = {"prompts_issued": 12 * s, "cursor": [s, "x"]}
            checkpoint.save(engine, root, s, key=KEY, extra=extra, keep=2, tokenizer_from=model)
        train(engine, 3, 2)
        torch.save({"params": params(engine)}, out / f"{run}.interrupted.rank{rank}.pt")
    else:
        meta = checkpoint.resume(engine, root, key=KEY)
        assert meta is not None
        train(engine, meta.step, 2)
        info = {"step": meta.step, "version": meta.version, "extra": meta.extra}
        (out / f"{run}.resumed.rank{rank}.json").write_text(json.dumps(info))
        torch.save({"params": params(engine)}, out / f"{run}.resumed.rank{rank}.pt")
    engine.close()


ELASTIC_STEPS = 2
"""Steps before the elastic checkpoint; the step after it is the one compared."""


def optimizer_state(engine: base.TrainingEngine) -> dict[str, dict[str, torch.Tensor]]:
    """Adam's state by parameter name, whole (collective for DeepSpeed, which holds a slice per rank)."""
    from plrl_workers.engines import ddp_engine, deepspeed_engine

    if isinstance(engine, ddp_engine.DDPEngine):
        return {
            name: {k: v.detach().cpu().clone() for k, v in engine._opt.state[p].items()}
            for name, p in engine._model.named_parameters()
        }
    assert isinstance(engine, deepspeed_engine.DeepSpeedEngine)
    from deepspeed.utils import safe_get_full_optimizer_state

    zero = engine._engine.optimizer
    (flat,) = zero.single_partition_of_fp32_groups  # the engines build one parameter group
    step_t = zero.optimizer.state[flat]["step"]
    # DeepSpeed's own (same-size) load leaves the per-parameter views of the state to the next step.
    zero._lazy_init_hp_params_optimizer_state()
    out = {}
    for name, p in engine._engine.module.named_parameters():
        out[name] = {k: safe_get_full_optimizer_state(p, k).cpu().clone() for k in ("exp_avg", "exp_avg_sq")}
        out[name]["step"] = step_t.detach().cpu().clone()
    return out


def run_elastic_save(model: str, run: str, out: pathlib.Path) -> None:
    """ELASTIC_STEPS steps, checkpoint into `<out>/elastic.<run>.w<W>`, one more step; writes the
    whole optimizer state at the checkpoint and the parameters after the step (`<root>.pt`)."""
    root = out / f"elastic.{run}.w{dist.get_world_size()}"
    engine = engine_for(model, run)
    train(engine, 0, ELASTIC_STEPS)
    checkpoint.save(engine, root, ELASTIC_STEPS, key=KEY, tokenizer_from=model)
    state = optimizer_state(engine)
    train(engine, ELASTIC_STEPS, 1)
    if dist.get_rank() == 0:
        torch.save({"state": state, "params": params(engine)}, out / f"{root.name}.pt")
    engine.close()


def run_elastic_load(model: str, root: pathlib.Path, out: pathlib.Path) -> None:
    """A fresh engine loads the latest checkpoint under `root` (`elastic.<run>.w<W>...`) at this run's
    world size and takes the step after it; writes the loaded optimizer state and the parameters
    after the step to `<out>/<root name>.to<W'>.pt`, or the load's error to `... .error.txt`."""
    result = f"{root.name}.to{dist.get_world_size()}"
    engine = engine_for(model, root.name.split(".")[1])
    path = checkpoint.latest(root)
    assert path is not None, root
    try:
        meta = checkpoint.load(engine, path, key=KEY)
    except ValueError as err:
        (out / f"{result}.error.txt").write_text(str(err))
        engine.close()
        return
    state = optimizer_state(engine)
    train(engine, meta.step, 1)
    if dist.get_rank() == 0:
        torch.save({"state": state, "params": params(engine)}, out / f"{result}.pt")
    engine.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--train", default="", help="comma-separated runs (keys of RUNS) to train and save")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--checkpoint", default="", help="comma-separated runs for the checkpoint scenario")
    ap.add_argument("--phase", choices=["first", "resume"], default="first")
    ap.add_argument("--elastic-save", default="", help="comma-separated runs: K steps, checkpoint, 1 step")
    ap.add_argument(
        "--elastic-load", default="", help="comma-separated checkpoint roots (.../elastic.<run>.w<W>...)"
    )
    ap.add_argument("--port", type=int, required=True, help="rank 0's rendezvous port on 127.0.0.1")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    # One process per rank, on GPU `rank` when the launcher gave it GPUs (test_cuda.py).
    training.init_distributed(
        training.Rendezvous("127.0.0.1", args.port, args.rank, args.world_size, local_rank=args.rank)
    )
    for run in filter(None, args.train.split(",")):
        run_train(args.model, run, args.steps, out, args.dtype)
    for run in filter(None, args.checkpoint.split(",")):
        run_checkpoint(args.model, run, args.phase, out)
    for run in filter(None, args.elastic_save.split(",")):
        run_elastic_save(args.model, run, out)
    for root in filter(None, args.elastic_load.split(",")):
        run_elastic_load(args.model, pathlib.Path(root), out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
