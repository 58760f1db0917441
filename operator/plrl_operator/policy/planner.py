"""The throughput model of the PipelineRL paper (seed/MODEL.md) and the initial choice of I.

Placeholder until the planner lands: only the seed's default rule for the initial I.
"""

from __future__ import annotations

from plrl_operator import spec as spec_mod


def initial_generators(job: spec_mod.JobSpec) -> int:
    """I for a new job: the spec's value, else the seed's `min(N // 3, 64)` on pod granularity.

    The result always leaves room for at least one trainer pod and is a whole number of
    generator pods.
    """
    r = job.resources
    if job.pipeline.generators is not None:
        return job.pipeline.generators
    per_gen = r.gpus_per_generator
    i = min(r.total_gpus // 3, 64)
    i = max(per_gen, i - i % per_gen)
    # Trainer pods must tile what is left.
    while i > per_gen and (r.total_gpus - i) % r.gpus_per_trainer:
        i -= per_gen
    return i
