"""The contract between the operator, the local runner and the workers.

Both halves import this package and nothing of each other: the `PipelineRLJob` spec (`spec`),
the pod plan (`plan`), the file a worker reads (`worker_config`) and the environment that says
which replica it is (`identity`), the records that travel back (`records`: step rows, heartbeat
reports in Lease annotations), the utilisation-curve format (`utilisation`), and every label,
annotation key, port and environment variable name (`names`).

It imports only pydantic and the standard library (import-linter checks), so the operator image,
the workers and `plrl crd` can all use it without pulling in kopf, kubernetes or torch.
"""
