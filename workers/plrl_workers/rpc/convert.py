"""Plain runtime types <-> protobuf messages (pure; the only code that touches message fields).

Per-token arrays go through numpy as packed little-endian bytes (see `plrl.proto`). Decoding a
malformed message (a byte array whose length is not a whole number of elements) raises ValueError;
the server turns that into an INVALID_ARGUMENT ack. Neighbours: `rpc/server.py`, `rpc/client.py`,
`protocol.py` (the types: leases, rollouts, control events, weight metadata, Stats).
"""

from __future__ import annotations

import time
from typing import Any

import numpy
import numpy.typing as npt

from plrl_api import records
from plrl_workers import protocol
from plrl_workers.rpc.generated import plrl_pb2 as pb

I32 = numpy.dtype("<i4")
F32 = numpy.dtype("<f4")

Message = Any  # generated protobuf classes are untyped here (see pyproject's mypy overrides)


def pack_i32(values: npt.ArrayLike) -> bytes:
    """Packed little-endian int32s; an int32 array is copied once, into the bytes."""
    return numpy.asarray(values, dtype=I32).tobytes()


def pack_f32(values: npt.ArrayLike) -> bytes:
    return numpy.asarray(values, dtype=F32).tobytes()


def view_i32(data: bytes, what: str) -> npt.NDArray[numpy.int32]:
    """A zero-copy read-only view of packed int32s."""
    if len(data) % 4:
        raise ValueError(f"{what}: {len(data)} bytes is not a whole number of int32")
    return numpy.frombuffer(data, dtype=I32)


def view_f32(data: bytes, what: str) -> npt.NDArray[numpy.float32]:
    if len(data) % 4:
        raise ValueError(f"{what}: {len(data)} bytes is not a whole number of float32")
    return numpy.frombuffer(data, dtype=F32)


def unpack_i32(data: bytes, what: str) -> list[int]:
    result: list[int] = view_i32(data, what).tolist()
    return result


# ---- prompts and leases ------------------------------------------------------------------------


def prompt_to_pb(p: protocol.Prompt) -> Message:
    return pb.Prompt(prompt_id=p.prompt_id, text=p.text, answer=p.answer, token_ids=pack_i32(p.token_ids))


def prompt_from_pb(m: Message) -> protocol.Prompt:
    return protocol.Prompt(
        prompt_id=m.prompt_id,
        text=m.text,
        answer=m.answer,
        token_ids=tuple(unpack_i32(m.token_ids, "prompt.token_ids")),
    )


def lease_to_pb(lease: protocol.Lease, now: float) -> Message:
    return pb.Lease(
        lease_id=lease.lease_id, prompt=prompt_to_pb(lease.prompt), timeout_s=lease.deadline - now
    )


def lease_from_pb(m: Message, generator_id: str) -> protocol.Lease:
    """The generator's view of a lease: `deadline` is on this process's `time.monotonic()` clock."""
    return protocol.Lease(
        lease_id=m.lease_id,
        prompt=prompt_from_pb(m.prompt),
        generator_id=generator_id,
        deadline=time.monotonic() + m.timeout_s,
    )


# ---- rollouts ----------------------------------------------------------------------------------


def group_to_pb(g: protocol.RolloutGroup) -> Message:
    return pb.RolloutGroup(
        lease_id=g.lease_id,
        prompt_id=g.prompt_id,
        prompt_token_ids=pack_i32(g.prompt_token_ids),
        generator_id=g.generator_id,
        samples=[
            pb.Sample(
                token_ids=pack_i32(s.token_ids),
                logprobs=pack_f32(s.logprobs),
                versions=pack_i32(s.versions),
                reward=s.reward,
                finish_reason=s.finish_reason,
            )
            for s in g.samples
        ],
    )


def group_from_pb(m: Message) -> protocol.RolloutGroup:
    """Decode a RolloutGroup message; the samples' arrays are read-only views of its bytes."""
    return protocol.RolloutGroup(
        lease_id=m.lease_id,
        prompt_id=m.prompt_id,
        prompt_token_ids=unpack_i32(m.prompt_token_ids, "prompt_token_ids"),
        generator_id=m.generator_id,
        samples=[
            protocol.Sample(
                token_ids=view_i32(s.token_ids, f"samples[{i}].token_ids"),
                logprobs=view_f32(s.logprobs, f"samples[{i}].logprobs"),
                versions=view_i32(s.versions, f"samples[{i}].versions"),
                reward=s.reward,
                finish_reason=s.finish_reason,
            )
            for i, s in enumerate(m.samples)
        ],
    )


_LENGTH = numpy.dtype("<u4")


def groups_to_bytes(groups: list[protocol.RolloutGroup]) -> bytes:
    """Groups as bytes for trainer rank 0 to broadcast to its peers: each group's RolloutGroup
    message after its length (uint32). Protobuf, not pickle: a peer decodes data, never code."""
    parts = []
    for g in groups:
        body = group_to_pb(g).SerializeToString()
        parts += [numpy.array([len(body)], dtype=_LENGTH).tobytes(), body]
    return b"".join(parts)


def groups_from_bytes(data: bytes) -> list[protocol.RolloutGroup]:
    """The inverse of `groups_to_bytes`; ValueError on bytes it did not make."""
    out, at = [], 0
    while at < len(data):
        if at + _LENGTH.itemsize > len(data):
            raise ValueError(f"rollout batch: {len(data) - at} trailing bytes, not a length")
        (n,) = numpy.frombuffer(data, dtype=_LENGTH, count=1, offset=at)
        at += _LENGTH.itemsize
        if at + int(n) > len(data):
            raise ValueError(
                f"rollout batch: a group of {int(n)} bytes at {at} runs past the end ({len(data)})"
            )
        m = pb.RolloutGroup()
        try:
            m.ParseFromString(data[at : at + int(n)])
        except Exception as exc:  # google.protobuf.message.DecodeError
            raise ValueError(f"rollout batch: the group at byte {at} does not decode: {exc}") from None
        out.append(group_from_pb(m))
        at += int(n)
    return out


def ack_to_pb(r: protocol.SubmitResult) -> Message:
    return pb.SubmitAck(lease_id=r.lease_id, code=r.code.name, message=r.message)


def ack_from_pb(m: Message) -> protocol.SubmitResult:
    return protocol.SubmitResult(lease_id=m.lease_id, code=protocol.Code(m.code), message=m.message)


# ---- weight sync -------------------------------------------------------------------------------


def param_to_pb(p: protocol.ParamMeta) -> Message:
    return pb.ParamMeta(name=p.name, dtype=p.dtype, shape=list(p.shape))


def param_from_pb(m: Message) -> protocol.ParamMeta:
    return protocol.ParamMeta(name=m.name, dtype=m.dtype, shape=tuple(m.shape))


def group_info_to_pb(g: protocol.GroupInfo) -> Message:
    return pb.GroupInfo(
        host=g.host, port=g.port, rank=g.rank, world_size=g.world_size, epoch=g.epoch, backend=g.backend
    )


def group_info_from_pb(m: Message) -> protocol.GroupInfo:
    return protocol.GroupInfo(
        host=m.host, port=m.port, rank=m.rank, world_size=m.world_size, epoch=m.epoch, backend=m.backend
    )


def control_to_pb(e: protocol.ControlEvent) -> Message:
    if isinstance(e, protocol.WeightUpdate):
        a = e.announcement
        return pb.ControlMessage(
            weight_update=pb.WeightUpdate(
                version=a.version,
                epoch=a.epoch,
                params=[param_to_pb(p) for p in a.params],
                bucket_bytes=a.bucket_bytes,
                group=group_info_to_pb(e.group),
            )
        )
    if isinstance(e, protocol.PullWeights):
        return pb.ControlMessage(pull=pb.PullHint(version=e.version))
    if isinstance(e, protocol.Revoke):
        return pb.ControlMessage(revoke=pb.Revoke(lease_ids=list(e.lease_ids), reason=e.reason))
    return pb.ControlMessage(stop=pb.StopRequest(reason=e.reason))


def control_from_pb(m: Message) -> protocol.ControlEvent:
    kind = m.WhichOneof("event")
    if kind == "weight_update":
        w = m.weight_update
        ann = protocol.Announcement(
            version=w.version,
            epoch=w.epoch,
            params=tuple(param_from_pb(p) for p in w.params),
            bucket_bytes=w.bucket_bytes,
        )
        return protocol.WeightUpdate(group=group_info_from_pb(w.group), announcement=ann)
    if kind == "pull":
        return protocol.PullWeights(version=m.pull.version)
    if kind == "stop":
        return protocol.Stop(reason=m.stop.reason)
    if kind == "revoke":
        return protocol.Revoke(lease_ids=tuple(m.revoke.lease_ids), reason=m.revoke.reason)
    raise ValueError(f"control message without a known event (got {kind!r})")


# ---- status ------------------------------------------------------------------------------------


def stats_to_pb(s: protocol.Stats) -> Message:
    a = s.accounting
    return pb.StatusReply(
        accounting=pb.Accounting(
            issued=a.issued,
            trained=a.trained,
            dropped_by_lag=a.dropped_by_lag,
            leased=a.leased,
            requeued=a.requeued,
            buffered=a.buffered,
            in_training=a.in_training,
        ),
        weight_version=s.weight_version,
        buffer_capacity=s.buffer_capacity,
        generators=s.generators,
        control_streams=s.control_streams,
        leases_expired=s.leases_expired,
        leases_revoked=s.leases_revoked,
        leases_migrated=s.leases_migrated,
        session=s.session,
        leases_adopted=s.leases_adopted,
        refused=dict(s.refused),
        source_exhausted=s.source_exhausted,
        finished=s.finished,
    )


def stats_from_pb(m: Message) -> protocol.Stats:
    a = m.accounting
    return protocol.Stats(
        accounting=records.PromptCounts(
            issued=a.issued,
            trained=a.trained,
            dropped_by_lag=a.dropped_by_lag,
            leased=a.leased,
            requeued=a.requeued,
            buffered=a.buffered,
            in_training=a.in_training,
        ),
        weight_version=m.weight_version,
        buffer_capacity=m.buffer_capacity,
        generators=m.generators,
        control_streams=m.control_streams,
        leases_expired=m.leases_expired,
        leases_revoked=m.leases_revoked,
        leases_migrated=m.leases_migrated,
        session=m.session,
        leases_adopted=m.leases_adopted,
        refused=dict(m.refused),
        source_exhausted=m.source_exhausted,
        finished=m.finished,
    )
