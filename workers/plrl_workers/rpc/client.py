"""A thin typed client for the coordinator: one method per RPC, plain runtime types in and out.

Every call carries the job token (`rpc/auth.py`); with `tls_ca` (the job's CA) the channel is TLS
and the coordinator must present the job's certificate, so the token never crosses the network in
clear and reaches no impostor. Failures of a whole call raise `grpc.RpcError`
(`.code()` is e.g. UNAUTHENTICATED, FAILED_PRECONDITION); refusals of single rollout groups come back
as `protocol.SubmitResult`s with a non-OK `code`, and the stream goes on.

Usage (generator main loop, sketched):

    c = client.CoordinatorClient("trainer-0.job:7000", token)
    reg = c.register("gen-0")
    if reg.weight_version > engine.weight_version:
        pulled = c.pull_weights("gen-0", reg.weight_version)
        engine.update_weights(pulled.named_tensors, pulled.version)
    control = c.control("gen-0")          # iterate in a thread: WeightUpdate / PullWeights / Stop
    batch = c.lease_prompts("gen-0", max_prompts=4, wait_s=1.0)
    ... generate G samples per lease ...
    results = c.submit(groups)            # one result per group; or, for a long-lived stream that
                                          # re-sends on RESOURCE_EXHAUSTED: rpc/rollout_stream.py
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import grpc
import torch

from plrl_api import names
from plrl_workers import protocol
from plrl_workers.rpc import auth, convert, limits
from plrl_workers.rpc.generated import plrl_pb2 as pb
from plrl_workers.rpc.generated import plrl_pb2_grpc as pb_grpc
from plrl_workers.weight_sync import snapshot


@dataclasses.dataclass
class PulledWeights:
    """A full-weights pull: iterate `named_tensors` once, to the end, to receive every parameter."""

    version: int
    params: tuple[protocol.ParamMeta, ...]
    named_tensors: Iterator[tuple[str, torch.Tensor]]


class ControlStream:
    """Coordinator -> generator events; iterating blocks until the next one. `cancel()` ends it."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self.cancelled_here = False
        """`cancel()` was called (so a CANCELLED status is ours, not the server going away)."""

    def __iter__(self) -> Iterator[protocol.ControlEvent]:
        for message in self._call:
            yield convert.control_from_pb(message)

    def cancel(self) -> None:
        self.cancelled_here = True
        self._call.cancel()


# gRPC retries a refused connection after 1 s, then 1.6x longer each time up to 120 s: after a
# 20 s outage of trainer rank 0 its next try came up to ~10 s after the new rank 0 listened, and
# training waited for it (`bench/reconnect_after_outage.py`). A refused connect to a restarting
# coordinator costs nothing, so retry often.
INITIAL_RECONNECT_BACKOFF_S = 0.1
MAX_RECONNECT_BACKOFF_S = 1.0


class CoordinatorClient:
    """Connects lazily; safe to share between threads (gRPC channels are).

    `max_reconnect_backoff_s`: the longest wait between connection attempts while the coordinator
    is unreachable (None: gRPC's defaults, for comparison)."""

    def __init__(
        self,
        target: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        max_reconnect_backoff_s: float | None = MAX_RECONNECT_BACKOFF_S,
        tls_ca: bytes | None = None,
    ) -> None:
        options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", protocol.MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", protocol.MAX_MESSAGE_BYTES),
            *limits.client_options(),
        ]
        if max_reconnect_backoff_s is not None:
            initial = min(INITIAL_RECONNECT_BACKOFF_S, max_reconnect_backoff_s)
            options += [
                ("grpc.initial_reconnect_backoff_ms", int(initial * 1000)),
                ("grpc.max_reconnect_backoff_ms", int(max_reconnect_backoff_s * 1000)),
            ]
        if tls_ca is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            # The job's own CA signs exactly one certificate, the coordinator's, under a fixed
            # name: whatever address is dialled (pod DNS name, loopback), that name is checked.
            options.append(("grpc.ssl_target_name_override", names.TLS_SERVER_NAME))
            creds = grpc.ssl_channel_credentials(root_certificates=tls_ca)
            self._channel = grpc.secure_channel(target, creds, options=options)
        self._stub = pb_grpc.CoordinatorStub(self._channel)
        self._md = auth.metadata(token)
        self._timeout_s = timeout_s
        # generator id -> the fencing token of its latest registration through this client, sent
        # with every lease request and control stream of that id.
        self._incarnations: dict[str, str] = {}

    def register(self, generator_id: str, ready_timeout_s: float = 600.0) -> protocol.Registration:
        """Waits up to `ready_timeout_s` for the coordinator to listen: generator pods (and `plrl run`'s
        processes) start alongside trainer rank 0, which loads the model before it serves."""
        r = self._stub.Register(
            pb.RegisterRequest(generator_id=generator_id),
            metadata=self._md,
            timeout=ready_timeout_s,
            wait_for_ready=True,
        )
        self._incarnations[generator_id] = r.incarnation
        return protocol.Registration(
            r.weight_version, r.samples_per_prompt, r.lease_timeout_s, r.session, r.incarnation
        )

    def lease_prompts(
        self, generator_id: str, max_prompts: int, wait_s: float = 0.0, prompt_ids: Sequence[int] = ()
    ) -> protocol.LeaseBatch:
        """Leases' `deadline`s are on this process's `time.monotonic()` clock. `prompt_ids`: adopt
        exactly those prompts (`Coordinator.lease`)."""
        r = self._stub.LeasePrompts(
            pb.LeaseRequest(
                generator_id=generator_id,
                max_prompts=max_prompts,
                wait_s=wait_s,
                incarnation=self._incarnations.get(generator_id, ""),
                prompt_ids=list(prompt_ids),
            ),
            metadata=self._md,
            timeout=self._timeout_s + wait_s,
        )
        return protocol.LeaseBatch([convert.lease_from_pb(x, generator_id) for x in r.leases], r.finished)

    def submit_rollouts(self, groups: Iterable[protocol.RolloutGroup]) -> Iterator[protocol.SubmitResult]:
        """Stream `groups` (consumed in a background thread) and yield one result per group, in order."""
        acks = self._stub.SubmitRollouts((convert.group_to_pb(g) for g in groups), metadata=self._md)
        for ack in acks:
            yield convert.ack_from_pb(ack)

    def submit(self, groups: Sequence[protocol.RolloutGroup]) -> list[protocol.SubmitResult]:
        """`submit_rollouts` for a list: returns when every group has its result."""
        return list(self.submit_rollouts(groups))

    def control(self, generator_id: str) -> ControlStream:
        """Open this generator's control stream (one per generator; a newer one replaces it)."""
        return ControlStream(
            self._stub.Control(
                pb.ControlRequest(
                    generator_id=generator_id, incarnation=self._incarnations.get(generator_id, "")
                ),
                metadata=self._md,
            )
        )

    def pull_weights(self, generator_id: str, min_version: int = 0, device: str = "cpu") -> PulledWeights:
        """Start pulling the full current weights (UNAVAILABLE if the trainer has none >= min_version)."""
        stream = self._stub.PullWeights(
            pb.PullRequest(generator_id=generator_id, min_version=min_version), metadata=self._md
        )
        head = next(stream)
        params = tuple(convert.param_from_pb(p) for p in head.params)

        def data() -> Iterator[bytes]:
            if head.data:
                yield head.data
            for chunk in stream:
                yield chunk.data

        return PulledWeights(head.version, params, snapshot.assemble(params, data(), device))

    def status(self) -> protocol.Stats:
        return convert.stats_from_pb(
            self._stub.Status(pb.StatusRequest(), metadata=self._md, timeout=self._timeout_s)
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
