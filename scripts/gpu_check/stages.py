"""The gpu-check's stages: what each runs (commands), how long it may take, and how it is judged.

In order, cheap and high-value first, the one most likely to be slow (DeepSpeed) last:

| stage          | GPU (--cpu)                                                                        |
|----------------|------------------------------------------------------------------------------------|
| env            | probe: versions, CUDA device, every GPU-check module imports without kopf/k8s       |
| profile        | `plrl profile` the paper's way: bf16 (4096, h+64) x (h+64, 16384) (`--quick`, CPU)  |
| plan           | `plrl plan --json` N=128, B=128 with the H100 curve and with the measured one      |
| tests-engine   | `-m gpu` engine contract on CUDA in fp32 and bf16, incl. in-flight weight loads,   |
|                | and the NCCL broadcast test (skips: needs 2 GPUs) (all skip on the CPU)             |
| bench-decode   | torch engine vs `generate`, 0.5B model, bf16, H = 16, 64, 128, 256 (tiny, CPU)     |
| run-demo       | `plrl run` of examples/local-tiny.yaml in bf16, both roles on the one GPU, 200     |
|                | steps: learns, updates in flight (fp32, 6 steps: finishes, exactly-once only)      |
| tests-trainer  | `-m gpu` DDP on CUDA vs CPU, bf16, DeepSpeed ZeRO-1/2 (all skip on the CPU)         |

Each stage has a time cap per mode and a floor (the least time worth starting it with); the
runner also keeps a floor's worth for every later stage, so one slow stage cannot starve the rest.
Pytest runs with `--confcutdir` at the test folder, so `tests/conftest.py` (which imports the
Kubernetes client for the cluster fixtures) is not loaded: the image has no `kubernetes`. Warnings
are shown, not raised (the suite's `filterwarnings = error`): a one-shot GPU run should report a
new CUDA warning, not stop at it.

Neighbours: `runner.py` (runs them), `collect.py` (judges their output), `probe.py` (the env stage).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from scripts.gpu_check import collect
from scripts.gpu_check.results import StageResult

Mode = Literal["gpu", "cpu"]
CLI = "plrl_operator.cli"  # `python -m CLI <verb>` is the `plrl` command (no entry point is installed there)
DEMO_JOB = "examples/local-tiny.yaml"
H100_CURVE_FILE = "h100.json"
BENCH_HS = {"gpu": (16, 64, 128, 256), "cpu": (4, 16)}
PYTEST_WARNINGS = (
    "-W",
    "default",
    "-W",
    "ignore::DeprecationWarning",
    "-W",
    "ignore::PendingDeprecationWarning",
)


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How the demo job is shortened for the check, and what its run must show."""

    total_steps: int
    dtype: str
    warm_start_steps: int | None  # None: the example's
    checkpoint_every: int
    judge_learning: bool
    min_gain: float = 0.03  # reward, first vs last 10% of steps; per-step noise averages to ~0.01


RUN = {
    # ~0.2 s a step expected (generator-bound at H=16): ~40 s of training after ~30 s of start-up.
    "gpu": RunSettings(
        total_steps=200, dtype="bfloat16", warm_start_steps=None, checkpoint_every=100, judge_learning=True
    ),
    "cpu": RunSettings(
        total_steps=6, dtype="float32", warm_start_steps=20, checkpoint_every=3, judge_learning=False
    ),
}


@dataclasses.dataclass(frozen=True)
class Context:
    mode: Mode
    repo: pathlib.Path
    work: pathlib.Path
    """Scratch space (run directories, JUnit reports); never what comes back."""
    out: pathlib.Path
    """What comes back from the GPU machine: a few plain files only."""
    python: str
    env: Mapping[str, str]

    def read_json(self, name: str) -> Any:
        path = self.work / name
        return json.loads(path.read_text()) if path.exists() else None

    def read_text(self, name: str) -> str | None:
        path = self.work / name
        return path.read_text() if path.exists() else None

    @property
    def host(self) -> dict[str, Any]:
        probe: dict[str, Any] = self.read_json("probe.json") or {}
        return probe


@dataclasses.dataclass(frozen=True)
class Command:
    argv: list[str]
    stdout: str | None = None
    """A file under the work dir for stdout (else it goes to the stage's log with stderr)."""


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    budget_s: Mapping[Mode, float]
    floor_s: float
    commands: Callable[[Context], list[Command]]
    collect: Callable[[Context, list[int | None]], StageResult]
    prepare: Callable[[Context], None] | None = None


def short_name(device: str | None) -> str:
    """A curve name from a device name: "NVIDIA H200" -> "h200" (like the built-in "h100")."""
    if not device:
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-").removeprefix("nvidia-")


def curve_file(ctx: Context) -> str:
    return f"curve-{short_name(ctx.host.get('device') if ctx.mode == 'gpu' else None)}.json"


# ------------------------------------------------------------------ env


def _env_commands(ctx: Context) -> list[Command]:
    return [Command([ctx.python, "-m", "scripts.gpu_check.probe", "--out", str(ctx.work / "probe.json")])]


def _env_collect(ctx: Context, rcs: list[int | None]) -> StageResult:
    return collect.env_result(ctx.read_json("probe.json"), ctx.mode, ctx.env.get("PLRL_GPU_CHECK_INSTALL_RC"))


# ------------------------------------------------------------------ profile and plan


def _tau(ctx: Context) -> list[str]:
    tau = ctx.host.get("h100_tau")
    # The H200 computes like an H100 (same bf16 peak), so training costs it the same flashes per
    # token; recording the H100's tau keeps the two plans comparable and the file's fields the same.
    return ["--tau", repr(tau)] if tau else []


def _profile_commands(ctx: Context) -> list[Command]:
    out = str(ctx.work / curve_file(ctx))
    name = curve_file(ctx).removeprefix("curve-").removesuffix(".json")
    argv = [ctx.python, "-m", CLI, "profile", "--out", out, "--name", name, *_tau(ctx)]
    return [Command(argv if ctx.mode == "gpu" else [*argv, "--quick", "--device", "cpu"])]


def _profile_collect(ctx: Context, rcs: list[int | None]) -> StageResult:
    reference = {}
    if ctx.host.get("curves_dir"):
        reference = json.loads((pathlib.Path(ctx.host["curves_dir"]) / H100_CURVE_FILE).read_text())
    curve = ctx.read_json(curve_file(ctx))
    if curve is not None:
        (ctx.out / curve_file(ctx)).write_text((ctx.work / curve_file(ctx)).read_text())
    return collect.curve_result(curve, reference, ctx.mode, curve_file(ctx))


def _plan_commands(ctx: Context) -> list[Command]:
    base = [ctx.python, "-m", CLI, "plan", "--json", "-N", "128", "-B", "128"]
    cmds = [Command(base, stdout="plan-h100.json")]
    if (ctx.work / curve_file(ctx)).exists():
        cmds.append(Command([*base, "--curve", str(ctx.work / curve_file(ctx))], stdout="plan-measured.json"))
    return cmds


def _plan_collect(ctx: Context, rcs: list[int | None]) -> StageResult:
    name = curve_file(ctx).removeprefix("curve-").removesuffix(".json")
    return collect.plan_result(
        _json_or_none(ctx, "plan-h100.json"), _json_or_none(ctx, "plan-measured.json"), name
    )


def _json_or_none(ctx: Context, name: str) -> Any:
    try:
        return ctx.read_json(name)
    except json.JSONDecodeError:
        return None


# ------------------------------------------------------------------ pytest


def _pytest(ctx: Context, stage: str, folders: Sequence[tuple[str, Sequence[str]]]) -> list[Command]:
    cmds = []
    for k, (folder, paths) in enumerate(folders):
        junit = ctx.work / f"junit-{stage}-{k}.xml"
        cmds.append(
            Command(
                [
                    *(
                        ctx.python,
                        "-m",
                        "pytest",
                        "-q",
                        "-rs",
                        "-p",
                        "no:cacheprovider",
                        "--confcutdir",
                        folder,
                    ),
                    *("-m", "gpu", *PYTEST_WARNINGS, "--junitxml", str(junit), *paths),
                ]
            )
        )
    return cmds


def _pytest_collect(stage: str, n: int) -> Callable[[Context, list[int | None]], StageResult]:
    def collect_(ctx: Context, rcs: list[int | None]) -> StageResult:
        counts = collect.junit_counts([ctx.read_text(f"junit-{stage}-{k}.xml") for k in range(n)])
        return collect.tests_result(stage, counts, rcs, ctx.mode)

    return collect_


ENGINE_TESTS = (
    ("tests/workers/engines", ["tests/workers/engines/test_contract.py"]),
    ("tests/workers/weight_sync", ["tests/workers/weight_sync/test_broadcast.py"]),
)
TRAINER_TESTS = (("tests/workers/engines/training", ["tests/workers/engines/training/test_cuda.py"]),)


# ------------------------------------------------------------------ bench


def _bench_commands(ctx: Context) -> list[Command]:
    hs = ",".join(map(str, BENCH_HS[ctx.mode]))
    argv = [
        ctx.python,
        "bench/decode_throughput.py",
        "--hs",
        hs,
        "--repeats",
        "3",
        "--json",
        str(ctx.work / "bench.json"),
    ]
    if ctx.mode == "gpu":
        return [Command([*argv, "--device", "cuda", "--dtype", "bfloat16", "--preset", "0.5b"])]
    return [
        Command([*argv, "--device", "cpu", "--dtype", "float32", "--preset", "tiny", "--new-tokens", "8"])
    ]


def _bench_collect(ctx: Context, rcs: list[int | None]) -> StageResult:
    return collect.bench_result(ctx.read_json("bench.json"), BENCH_HS[ctx.mode])


# ------------------------------------------------------------------ run-demo


def demo_job(doc: Mapping[str, Any], s: RunSettings) -> dict[str, Any]:
    """The demo job shortened for the check (everything else as `make demo` runs it)."""
    job = copy.deepcopy(dict(doc))
    spec = job["spec"]
    job["metadata"]["name"] = "gpu-check-demo"
    spec["model"]["dtype"] = s.dtype
    if s.warm_start_steps is not None:
        spec["model"]["warmStartSteps"] = s.warm_start_steps
    spec["training"]["totalSteps"] = s.total_steps
    spec["training"]["checkpoint"]["everySteps"] = s.checkpoint_every
    return job


def _run_prepare(ctx: Context) -> None:
    import yaml

    doc = yaml.safe_load((ctx.repo / DEMO_JOB).read_text())
    (ctx.work / "demo-job.yaml").write_text(yaml.safe_dump(demo_job(doc, RUN[ctx.mode]), sort_keys=False))


def _run_commands(ctx: Context) -> list[Command]:
    job, run_dir = ctx.work / "demo-job.yaml", ctx.work / "run-demo"
    return [Command([ctx.python, "-m", CLI, "run", str(job), "--run-dir", str(run_dir), "--quiet"])]


WORKER_LOG_LINES = 200


def _run_collect(ctx: Context, rcs: list[int | None]) -> StageResult:
    s = RUN[ctx.mode]
    # The workers' own logs go into the stage's log (and so into logs.txt): on a one-shot GPU run
    # they are the only account of what a trainer or generator did.
    with (ctx.work / "logs" / "run-demo.log").open("a") as stage_log:
        for worker_log in sorted((ctx.work / "run-demo" / "logs").glob("*.log")):
            tail = worker_log.read_text(errors="replace").splitlines()[-WORKER_LOG_LINES:]
            stage_log.write(f"\n----- {worker_log.name} (last {len(tail)} lines)\n" + "\n".join(tail) + "\n")
    report = ctx.work / "run-demo" / "report.png"
    if report.exists():
        (ctx.out / "run-demo.png").write_bytes(report.read_bytes())
    job = {"source": DEMO_JOB, "total_steps": s.total_steps, "dtype": s.dtype}
    summary = ctx.read_json("run-demo/summary.json")
    log = ctx.read_text("run-demo/logs/trainer-0.log")
    return collect.run_result(summary, job, rcs[0] if rcs else None, s.judge_learning, s.min_gain, log)


# ------------------------------------------------------------------ the table

STAGES: tuple[Stage, ...] = (
    Stage("env", {"gpu": 60, "cpu": 60}, 20, _env_commands, _env_collect),
    Stage("profile", {"gpu": 60, "cpu": 60}, 20, _profile_commands, _profile_collect),
    Stage("plan", {"gpu": 30, "cpu": 30}, 10, _plan_commands, _plan_collect),
    Stage(
        "tests-engine",
        {"gpu": 120, "cpu": 90},
        40,
        lambda ctx: _pytest(ctx, "tests-engine", ENGINE_TESTS),
        _pytest_collect("tests-engine", len(ENGINE_TESTS)),
    ),
    Stage("bench-decode", {"gpu": 120, "cpu": 90}, 40, _bench_commands, _bench_collect),
    Stage("run-demo", {"gpu": 150, "cpu": 150}, 60, _run_commands, _run_collect, _run_prepare),
    Stage(
        "tests-trainer",
        {"gpu": 150, "cpu": 90},
        40,
        lambda ctx: _pytest(ctx, "tests-trainer", TRAINER_TESTS),
        _pytest_collect("tests-trainer", len(TRAINER_TESTS)),
    ),
)
# The whole check's budget: 8 minutes on the GPU machine includes installing the wheels and
# Python's start-up, so the stages get 7.5 minutes; the CPU mode's is generous (it takes ~2 minutes).
BUDGET_S = {"gpu": 450.0, "cpu": 420.0}
