"""Kubernetes Event reasons the operator posts on a PipelineRLJob (one constant per reason).

`handlers.py` posts them through kopf; tests and `kubectl describe` read them by these names.
Normal events mark progress, Warning events something a user must act on.
"""

from __future__ import annotations

# Normal
CREATED = "Created"  # children created for a new job
UPDATED = "Updated"  # a spec change was rolled into the children
PHASE_CHANGED = "PhaseChanged"  # e.g. Pending -> Running
SUSPENDED = "Suspended"  # spec.suspend set: workers scaled to zero
RESUMED = "Resumed"  # spec.suspend cleared: workers scaled back
TRAINER_GROUP_RESTARTED = "TrainerGroupRestarted"  # a trainer failed: every trainer pod is replaced
JOB_SUCCEEDED = "JobSucceeded"  # trainers finished totalSteps; workers scaled to zero

# Warning
INVALID_SPEC = "InvalidSpec"  # the spec failed validation the API server could not do
UNSCHEDULABLE = "Unschedulable"  # pods cannot be scheduled (e.g. too few GPUs)
RECONCILE_FAILED = "ReconcileFailed"  # an API call failed; retried with backoff
HEARTBEAT_TIMEOUT = "HeartbeatTimeout"  # a worker stopped renewing its Lease
SLOW_GENERATOR = "SlowGenerator"  # part of a slow generator's work moved to its peers
NODE_NOT_READY = "NodeNotReady"  # a worker's node stayed NotReady: its pod is force-deleted to move it
WORKER_RESTARTED = "WorkerRestarted"  # a worker failed and was restarted (counts against maxRestarts)
JOB_FAILED = "JobFailed"  # a worker failed with maxRestarts used up; workers scaled to zero
RESCALED = "Rescaled"  # the autoscaler changed I (the message gives the rates and the reason)
