"""Per-worker runtime settings: the resolved job file a worker reads, plus its identity.

In a cluster the operator writes `/etc/plrl/<role>.json` into the job's ConfigMap
(`plrl_operator.render.config.worker_config`) and the pod's env says which replica it is and holds
the RPC token. `plrl run` writes the same file per role with loopback endpoints and sets the same
env vars, so a worker cannot tell the two apart.

Neighbours: `plrl_operator.spec` (the job spec inside), `generator`/`trainer` (the readers),
`local` (the writer on one machine).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Literal

import pydantic
from pydantic.alias_generators import to_camel

from plrl_operator import spec as spec_mod

Role = Literal["generator", "trainer"]


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class JobRef(_Model):
    name: str
    namespace: str | None = None
    uid: str | None = None


class PlanRef(_Model):
    generator_gpus: int = pydantic.Field(alias="generatorGPUs")
    trainer_gpus: int = pydantic.Field(alias="trainerGPUs")
    generator_pods: int
    trainer_pods: int


class Endpoints(_Model):
    """host:port strings; locally all on loopback, in a cluster the headless Services' DNS names."""

    coordinator: str
    rendezvous: str
    weight_sync: str


class Ports(_Model):
    rpc: int
    rendezvous: int
    weight_sync: int
    metrics: int


class LocalPaths(_Model):
    """Only in `plrl run`: where the run directory and the prepared model are."""

    run_dir: str
    model_dir: str


class WorkerConfig(_Model):
    role: Role
    job: JobRef
    spec: spec_mod.JobSpec
    plan: PlanRef
    endpoints: Endpoints
    ports: Ports
    token_env: str = "PLRL_TOKEN"
    local: LocalPaths | None = None


@dataclasses.dataclass(frozen=True)
class Identity:
    """Which replica this process is, from the env the pod (or `plrl run`) sets."""

    pod_index: int
    local_rank: int
    token: str
    bind_host: str
    metrics_port: int | None = None

    @staticmethod
    def from_env(cfg: WorkerConfig, env: Mapping[str, str] | None = None) -> Identity:
        env = os.environ if env is None else env
        token = env.get(cfg.token_env, "")
        if not token:
            raise RuntimeError(
                f"the RPC token env var {cfg.token_env} is empty; refusing to start unauthenticated"
            )
        return Identity(
            pod_index=int(env.get("PLRL_POD_INDEX", "0")),
            local_rank=int(env.get("PLRL_LOCAL_RANK", "0")),
            token=token,
            # A local pod gets its own 127.0.0.x; in a cluster every pod listens on all interfaces.
            bind_host=env.get("PLRL_BIND_HOST", "0.0.0.0"),
            # Pods each own an IP; local processes share one, so `plrl run` gives each its own port.
            metrics_port=int(env["PLRL_METRICS_PORT"]) if env.get("PLRL_METRICS_PORT") else None,
        )


def load(path: str | pathlib.Path) -> WorkerConfig:
    """Read `/etc/plrl/<role>.json`; errors name the file and the field."""
    p = pathlib.Path(path)
    try:
        return WorkerConfig.model_validate_json(p.read_bytes())
    except OSError as err:
        raise SystemExit(f"{p}: cannot read worker config: {err.strerror}") from None
    except pydantic.ValidationError as err:
        raise SystemExit(f"{p}: invalid worker config:\n{spec_mod.format_validation_error(err)}") from None


def split_host_port(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected host:port, got {addr!r}")
    return host, int(port)
