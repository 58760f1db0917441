"""`Identity`: which replica a worker process is, parsed from its environment in this one place.

A pod's environment comes from the operator's render (downward API, and the path of the mounted
token Secret); a local process's from `plrl run`, which sets the same variables
(`plrl_api.names.ENV_*`). The token itself is read from its file, never passed in the environment. The
worker config file is the same for every pod of a role; this is what tells them apart.

Neighbours: `plrl_api.names` (the variable names), `plrl_api.worker_config` (the rest of what a
worker needs), `plrl_workers.trainer` / `plrl_workers.generator` (the readers).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping

from plrl_api import names


class IdentityError(ValueError):
    """An environment a worker cannot start from; the message names the variable."""


def _int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise IdentityError(f"{name}={raw!r} must be an integer") from None
    if value < 0:
        raise IdentityError(f"{name}={raw!r} must be >= 0")
    return value


def read_token(path: str) -> str:
    """The job token from the file at `path` (`names.ENV_TOKEN_FILE`)."""
    if not path:
        raise IdentityError(f"{names.ENV_TOKEN_FILE} is not set; refusing to start unauthenticated")
    try:
        token = pathlib.Path(path).read_text().strip()
    except OSError as err:
        raise IdentityError(
            f"{names.ENV_TOKEN_FILE}={path}: cannot read the job token: {err.strerror}"
        ) from None
    if not token:
        raise IdentityError(f"{names.ENV_TOKEN_FILE}={path} is empty; refusing to start unauthenticated")
    return token


def _read_optional(path: pathlib.Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def write_token(path: pathlib.Path, token: str) -> pathlib.Path:
    """Write `token` where `read_token` finds it, readable by this user only (`plrl run`)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return path


@dataclasses.dataclass(frozen=True)
class TLSFiles:
    """The job's TLS files (PEM), from the Secret's directory: the CA every worker verifies the
    coordinator with, and the coordinator's certificate and key."""

    ca: bytes
    cert: bytes
    key: bytes


def read_tls(secret_dir: pathlib.Path) -> TLSFiles | None:
    """The TLS files beside the token, or None if the Secret has none (then RPCs are plain text)."""
    if not (secret_dir / names.TLS_CA_KEY).exists():
        return None
    try:
        return TLSFiles(
            *(
                (secret_dir / k).read_bytes()
                for k in (names.TLS_CA_KEY, names.TLS_CERT_KEY, names.TLS_KEY_KEY)
            )
        )
    except OSError as err:
        raise IdentityError(
            f"{secret_dir}: {names.TLS_CA_KEY} is there but not all TLS files are: {err}"
        ) from None


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who this process is and how it authenticates."""

    token: str
    """The job's RPC token: every worker-to-worker call carries it."""
    tls: TLSFiles | None = None
    """The job's TLS files, if its Secret has them: the coordinator serves TLS, generators verify it."""
    checkpoint_key: str | None = None
    """The secret checkpoints are signed with (`names.CHECKPOINT_KEY_KEY` beside the token); None:
    a Secret without one, and the token stands in (its checkpoints then die with the job)."""
    pod_index: int = 0
    """The pod's StatefulSet ordinal (trainer pod k holds ranks k * gpusPerTrainer + local rank)."""
    local_rank: int | None = None
    """Accelerator within the pod; None in a multi-accelerator pod's first process (it spawns)."""
    bind_host: str = "0.0.0.0"
    """Address to listen on: all interfaces in a pod, loopback under `plrl run`."""
    metrics_port: int | None = None
    """Overrides the config's metrics port (`plrl run`: processes share one IP)."""
    pod_name: str | None = None
    """Set in a cluster only; the worker then renews its Lease `<job>-<pod>`."""
    pod_uid: str | None = None
    """Set in a cluster only: this incarnation of the pod, named on its Lease."""
    namespace: str | None = None

    def rank(self, gpus_per_pod: int) -> int:
        """This process's trainer rank: pod index x accelerators per pod + local rank."""
        return self.pod_index * gpus_per_pod + (self.local_rank or 0)

    def with_local_rank(self, local_rank: int) -> dict[str, str]:
        """The environment additions for the process that drives accelerator `local_rank`."""
        return {names.ENV_LOCAL_RANK: str(local_rank)}

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> Identity:
        env = os.environ if env is None else env
        return Identity(
            token=read_token(env.get(names.ENV_TOKEN_FILE, "")),
            tls=read_tls(pathlib.Path(env[names.ENV_TOKEN_FILE]).parent),
            checkpoint_key=_read_optional(
                pathlib.Path(env[names.ENV_TOKEN_FILE]).parent / names.CHECKPOINT_KEY_KEY
            ),
            pod_index=_int(env, names.ENV_POD_INDEX, 0) or 0,
            local_rank=_int(env, names.ENV_LOCAL_RANK, None),
            bind_host=env.get(names.ENV_BIND_HOST) or "0.0.0.0",
            metrics_port=_int(env, names.ENV_METRICS_PORT, None),
            pod_name=env.get(names.ENV_POD_NAME) or None,
            pod_uid=env.get(names.ENV_POD_UID) or None,
            namespace=env.get(names.ENV_NAMESPACE) or None,
        )
