"""Does the built-in tiny model measurably learn the built-in task with RL on 2 CPU cores?

A research script, not the runtime: a plain, single-process, synchronous RL loop (REINFORCE with
a leave-one-out group baseline; torch + transformers `generate` only) that shows which task,
model size, warm start and hyperparameters give `make demo` a large and robust reward gain, and
what the pipelined runtime (generators + trainers with lag) should expect. `--lag K` makes the
behaviour policy the weights of K optimizer steps ago and corrects with truncated importance
weights (clamp `--is-clamp`), a crude stand-in for the pipeline's in-flight lag.

Per seed it prints the reward curve (mean sampled reward per block of steps), the first-10% and
last-10% means, greedy reward/exact-match on held-out prompts before and after RL, wall and CPU
times. The defaults are the settings of `examples/local-tiny.yaml`:

    .venv/bin/python bench/task_learnability.py                 # the demo's settings, seeds 0 1 2
    .venv/bin/python bench/task_learnability.py --lag 4         # behaviour policy 4 steps stale
    .venv/bin/python bench/task_learnability.py --task arith --warm-steps 500   # the harder task

Warm-started models are cached under `--cache`, so only the first run of a setting pays for them.
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time

import torch
import transformers

from plrl_workers.models import tiny
from plrl_workers.tasks import base, evaluate, registry, rewards, warm_start


@dataclasses.dataclass
class Args:
    task: str
    reward: str
    seeds: list[int]
    hidden: int
    layers: int
    warm_steps: int
    warm_batch: int
    warm_lr: float
    steps: int
    prompts_per_step: int
    group: int
    max_new_tokens: int
    lr: float
    temperature: float
    lag: int
    is_clamp: float
    norm_adv: bool
    no_is: bool
    is_level: str
    threads: int
    eval_every: int
    eval_n: int
    cache: str
    json_out: str | None


def parse_args() -> Args:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="reverse", help="builtin task name")
    p.add_argument("--reward", default="builtin:digit_match")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--hidden", type=int, default=128, help="tiny model hidden size (64 per head)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--warm-steps", type=int, default=150)
    p.add_argument("--warm-batch", type=int, default=32)
    p.add_argument("--warm-lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=400, help="RL optimizer steps")
    p.add_argument("--prompts-per-step", type=int, default=16, help="B / G")
    p.add_argument("--group", type=int, default=8, help="G: samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=10, help="L")
    p.add_argument("--lr", type=float, default=1.5e-4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lag", type=int, default=0, help="behaviour policy = weights of this many steps ago")
    p.add_argument("--is-clamp", type=float, default=5.0)
    p.add_argument(
        "--is-level",
        choices=["token", "prefix", "sequence"],
        default="token",
        help="with --lag: each token's importance ratio is its own (the runtime's), the product over its "
        "prefix, or the product over the whole sequence",
    )
    p.add_argument("--no-is", action="store_true", help="with --lag: no importance weights (plain REINFORCE)")
    p.add_argument(
        "--norm-adv",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="divide advantages by the group's reward std",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 avoids oversubscription)")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-n", type=int, default=256)
    p.add_argument("--cache", default="/tmp/plrl-bench-learnability")
    p.add_argument("--json-out", default=None)
    ns = p.parse_args()
    return Args(**{k.replace("-", "_"): v for k, v in vars(ns).items()})


def _level_log_ratios(log_ratios: torch.Tensor, level: str) -> torch.Tensor:
    """Per-token log importance ratios (n, Lmax), zero on padding, at the chosen level."""
    if level == "prefix":
        return log_ratios.cumsum(dim=1)
    if level == "sequence":
        return log_ratios.sum(dim=1, keepdim=True).expand_as(log_ratios)
    return log_ratios


def batch_logprobs(
    model: torch.nn.Module, prompts: list[tuple[int, ...]], completions: list[list[int]], pad: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token logprobs of each completion (teacher forced), padded, with its mask: (n, Lmax)."""
    seqs = [list(p) + c for p, c in zip(prompts, completions, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    logits = model(input_ids=ids, attention_mask=attn).logits.float()
    logp_all = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    lmax = max(len(c) for c in completions)
    out = torch.zeros(len(seqs), lmax)
    mask = torch.zeros(len(seqs), lmax)
    rows = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        n = len(c)
        rows.append((i, len(p) - 1, n))
        mask[i, :n] = 1.0
    # gather in one pass per row: slices differ in start, so index them individually
    for i, start, n in rows:
        out[i, :n] = logp_all[i, start : start + n]
    return out, mask


def leave_one_out(rewards_: torch.Tensor, group: int) -> torch.Tensor:
    """Advantage r_i - mean_{j != i} r_j within each consecutive group of G samples."""
    r = rewards_.view(-1, group)
    total = r.sum(dim=1, keepdim=True)
    return (r - (total - r) / (group - 1)).view(-1)


def run_seed(a: Args, seed: int) -> dict[str, object]:
    torch.manual_seed(seed)
    cache = pathlib.Path(a.cache)
    cfg = tiny.TinyModelConfig(
        hidden_size=a.hidden,
        num_layers=a.layers,
        num_attention_heads=a.hidden // 64,
        num_key_value_heads=a.hidden // 64,
        intermediate_size=4 * a.hidden,
    )
    task = registry.builtin(a.task)
    reward_fn = rewards.load(a.reward)
    t0 = time.perf_counter()
    init_dir = tiny.build(cache / f"tiny-h{a.hidden}-l{a.layers}-s{seed}", cfg, seed=seed)
    ws_cfg = warm_start.WarmStartConfig(
        steps=a.warm_steps, batch_size=a.warm_batch, learning_rate=a.warm_lr, seed=seed
    )
    ws_dir = warm_start.run(
        init_dir,
        cache
        / f"warm-{a.task}-h{a.hidden}-l{a.layers}-s{seed}-w{a.warm_steps}-b{a.warm_batch}-lr{a.warm_lr}",
        task,
        ws_cfg,
    )
    t_warm = time.perf_counter() - t0

    tok = transformers.AutoTokenizer.from_pretrained(str(ws_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ws_dir), dtype=torch.float32)
    eval_items = base.take(task, seed, a.eval_n, "eval")

    def greedy_eval() -> evaluate.EvalResult:
        model.eval()
        return evaluate.evaluate(model, tok, eval_items, reward_fn, max_new_tokens=a.max_new_tokens)

    evals = [(0, greedy_eval())]
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    behaviour = copy.deepcopy(model) if a.lag else model
    history: collections.deque[dict[str, torch.Tensor]] = collections.deque(maxlen=a.lag + 1)
    prompts_stream = base.stream(task, seed, "train")
    curve: list[float] = []
    exact_curve: list[float] = []
    t_gen = t_train = 0.0
    gen_tokens = 0
    clamped = ess = 0.0  # summed per step: fraction of tokens whose raw IS weight exceeded the clamp, ESS/n
    t_rl0, cpu0 = time.perf_counter(), time.process_time()
    for step in range(a.steps):
        if a.lag:
            history.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            behaviour.load_state_dict(history[0])  # the oldest kept: `lag` steps behind (fewer at start)
        items = [next(prompts_stream) for _ in range(a.prompts_per_step)]
        prompts = [base.prompt_token_ids(tok, it.text) for it in items for _ in range(a.group)]
        tg = time.perf_counter()
        behaviour.eval()
        comps = evaluate.sample(
            behaviour,
            prompts,
            max_new_tokens=a.max_new_tokens,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            temperature=a.temperature,
        )
        t_gen += time.perf_counter() - tg
        gen_tokens += sum(len(c) for c in comps)
        texts = [base.completion_text(tok, c) for c in comps]
        answers = [it for it in items for _ in range(a.group)]
        r = torch.tensor(
            [rewards.score(reward_fn, it.text, t, it.answer) for it, t in zip(answers, texts, strict=True)]
        )
        ex = [rewards.exact_match(it.text, t, it.answer) for it, t in zip(answers, texts, strict=True)]
        curve.append(float(r.mean()))
        exact_curve.append(sum(ex) / len(ex))

        tt = time.perf_counter()
        model.train()
        adv = leave_one_out(r, a.group)
        if a.norm_adv:
            adv = (adv.view(-1, a.group) / (r.view(-1, a.group).std(dim=1, keepdim=True) + 1e-4)).view(-1)
        logp, mask = batch_logprobs(model, prompts, comps, tok.pad_token_id)
        if a.lag and not a.no_is:
            with torch.no_grad():
                beh_logp, _ = batch_logprobs(behaviour, prompts, comps, tok.pad_token_id)
            raw = torch.exp(logp.detach() - beh_logp)[mask.bool()]
            clamped += float((raw > a.is_clamp).float().mean())
            ess += float(raw.sum() ** 2 / (raw.pow(2).sum() * raw.numel()))
            w = torch.exp(_level_log_ratios((logp.detach() - beh_logp) * mask, a.is_level)).clamp(
                max=a.is_clamp
            )
        else:
            w = torch.ones_like(logp)
        # Token-level normalisation: every generated token of the batch weighs the same.
        loss = -(adv[:, None] * w * logp * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        t_train += time.perf_counter() - tt
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            evals.append((step + 1, greedy_eval()))
    t_rl, cpu_rl = time.perf_counter() - t_rl0, time.process_time() - cpu0
    if a.lag and not a.no_is:
        print(
            f"  IS weights at lag {a.lag}: {clamped / a.steps:.2%} of tokens above the clamp {a.is_clamp}, "
            f"mean normalised ESS {ess / a.steps:.3f}"
        )

    k = max(1, a.steps // 10)
    first, last = statistics.fmean(curve[:k]), statistics.fmean(curve[-k:])
    first_x, last_x = statistics.fmean(exact_curve[:k]), statistics.fmean(exact_curve[-k:])
    block = max(1, a.steps // 20)
    blocks = [round(statistics.fmean(curve[i : i + block]), 3) for i in range(0, a.steps, block)]
    print(f"\n== seed {seed}: warm start {a.warm_steps} steps in {t_warm:.1f}s (cached dirs count as 0)")
    print(f"  reward curve (mean per {block} steps): {blocks}")
    print(
        f"  sampled reward first 10% {first:.3f} -> last 10% {last:.3f} (gain {last - first:+.3f}); "
        f"exact {first_x:.3f} -> {last_x:.3f}"
    )
    print(
        "  held-out greedy: "
        + ", ".join(f"step {s}: r={e.mean_reward:.3f} exact={e.exact:.3f}" for s, e in evals)
    )
    print(
        f"  RL wall {t_rl:.1f}s for {a.steps} steps ({t_rl / a.steps * 1000:.0f} ms/step: gen {t_gen:.1f}s, "
        f"train {t_train:.1f}s, {gen_tokens / max(t_gen, 1e-9):.0f} gen tok/s); CPU time {cpu_rl:.1f}s"
    )
    sys.stdout.flush()
    return {
        "seed": seed,
        "first10": first,
        "last10": last,
        "first10_exact": first_x,
        "last10_exact": last_x,
        "curve": curve,
        "exact_curve": exact_curve,
        "evals": [(s, e.mean_reward, e.exact) for s, e in evals],
        "warm_s": t_warm,
        "rl_s": t_rl,
        "rl_cpu_s": cpu_rl,
        "gen_s": t_gen,
        "train_s": t_train,
    }


def main() -> int:
    a = parse_args()
    torch.set_num_threads(a.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    print(f"config: {json.dumps(dataclasses.asdict(a))}")
    print(f"load average at start: {os.getloadavg()}")
    results = [run_seed(a, s) for s in a.seeds]
    print("\nseed  first10%  last10%   gain   exact first->last  greedy held-out before->after  RL wall")
    for r in results:
        ev = r["evals"]
        assert isinstance(ev, list)
        print(
            f"{r['seed']:>4}  {r['first10']:.3f}     {r['last10']:.3f}    {r['last10'] - r['first10']:+.3f}"  # type: ignore[operator]
            f"  {r['first10_exact']:.3f} -> {r['last10_exact']:.3f}       "
            f"{ev[0][1]:.3f}/{ev[0][2]:.3f} -> {ev[-1][1]:.3f}/{ev[-1][2]:.3f}        {r['rl_s']:.0f}s"
        )
    print(f"load average at end: {os.getloadavg()}")
    if a.json_out:
        pathlib.Path(a.json_out).write_text(json.dumps({"config": dataclasses.asdict(a), "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
