"""The pod plan: how many accelerators and pods each role gets, computed once from N, I and pod sizes.

The operator sizes its StatefulSets with it, the local runner starts that many processes, and
every worker reads it from its config (a trainer's world size is `trainer_gpus`). Choosing I is
the policy's job (`plrl_operator.policy`); this module only checks that an I tiles the job.

Pipeline mode: I accelerators generate and N - I train. Conventional mode: no generator pods;
all N accelerators are trainer ranks that also generate, one engine each.

Neighbours: `plrl_api.spec` (the inputs), `plrl_api.worker_config` (carries the plan).
"""

from __future__ import annotations

import pydantic
from pydantic.alias_generators import to_camel

from plrl_api import names
from plrl_api import spec as spec_mod


class PlanError(ValueError):
    """An I that does not fit the job; the message names the fields involved."""


class PodPlan(pydantic.BaseModel):
    """Accelerators and pods per role."""

    model_config = pydantic.ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    generator_gpus: int = pydantic.Field(ge=0, alias="generatorGPUs")
    """I: accelerators that generate (0 in conventional mode)."""
    trainer_gpus: int = pydantic.Field(ge=1, alias="trainerGPUs")
    """N - I: trainer ranks, one per accelerator (the trainers' world size)."""
    gpus_per_generator: int = pydantic.Field(ge=1, alias="gpusPerGenerator")
    gpus_per_trainer: int = pydantic.Field(ge=1, alias="gpusPerTrainer")

    @pydantic.model_validator(mode="after")
    def _tiles(self) -> PodPlan:
        if self.generator_gpus % self.gpus_per_generator or self.trainer_gpus % self.gpus_per_trainer:
            raise ValueError(
                f"generatorGPUs={self.generator_gpus} and trainerGPUs={self.trainer_gpus} must be "
                f"multiples of gpusPerGenerator={self.gpus_per_generator} and "
                f"gpusPerTrainer={self.gpus_per_trainer}"
            )
        return self

    @property
    def generator_pods(self) -> int:
        return self.generator_gpus // self.gpus_per_generator

    @property
    def trainer_pods(self) -> int:
        return self.trainer_gpus // self.gpus_per_trainer

    def pods(self, role: names.Role) -> int:
        return self.generator_pods if role == names.GENERATOR else self.trainer_pods

    def gpus_per_pod(self, role: names.Role) -> int:
        return self.gpus_per_generator if role == names.GENERATOR else self.gpus_per_trainer

    @staticmethod
    def of(job: spec_mod.JobSpec, generators: int) -> PodPlan:
        """The plan with I = `generators`; conventional mode ignores I (every accelerator trains)."""
        r = job.resources
        if job.pipeline.mode is spec_mod.PipelineMode.CONVENTIONAL:
            generators = 0
        elif not 0 < generators < r.total_gpus:
            raise PlanError(
                f"generators={generators} must be between 1 and resources.totalGPUs - 1 = {r.total_gpus - 1}"
            )
        elif generators % r.gpus_per_generator or (r.total_gpus - generators) % r.gpus_per_trainer:
            raise PlanError(
                f"generators={generators} does not tile: it must be a multiple of "
                f"resources.gpusPerGenerator={r.gpus_per_generator} and leave a multiple of "
                f"resources.gpusPerTrainer={r.gpus_per_trainer}"
            )
        if (r.total_gpus - generators) % r.gpus_per_trainer:
            raise PlanError(
                f"resources.totalGPUs={r.total_gpus} must be a multiple of "
                f"resources.gpusPerTrainer={r.gpus_per_trainer} in conventional mode"
            )
        return PodPlan(
            generator_gpus=generators,
            trainer_gpus=r.total_gpus - generators,
            gpus_per_generator=r.gpus_per_generator,
            gpus_per_trainer=r.gpus_per_trainer,
        )
