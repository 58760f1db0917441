"""The weight-sync byte layout, in one process: bucket plans, packing, snapshots and pull chunks.

Cases: every parameter lands in exactly one bucket, in order, aligned, within the bucket size
(oversize parameters alone); pack/unpack and snapshot chunk/assemble are bit-exact for every dtype,
0-d, empty and non-contiguous tensors, at any chunk size; a truncated or overlong pull stream is an
error, not silently wrong weights.
"""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import pytest
import torch

from plrl_workers import protocol
from plrl_workers.weight_sync import buckets, packing, snapshot

DTYPES = sorted(protocol.ITEMSIZE)


@st.composite
def metas(draw: st.DrawFn) -> list[protocol.ParamMeta]:
    n = draw(st.integers(min_value=0, max_value=12))
    return [
        protocol.ParamMeta(
            f"p{i}",
            draw(st.sampled_from(DTYPES)),
            tuple(draw(st.lists(st.integers(min_value=0, max_value=9), max_size=3))),
        )
        for i in range(n)
    ]


@hypothesis.given(metas(), st.integers(min_value=1, max_value=400))
def test_plan_puts_every_param_in_one_bucket_in_order(
    params: list[protocol.ParamMeta], bucket_bytes: int
) -> None:
    layout = buckets.plan(params, bucket_bytes)
    slots = [s for b in layout for s in b.slots]
    assert [s.index for s in slots] == list(range(len(params)))
    for b in layout:
        end = 0
        for s in b.slots:
            assert s.offset % buckets.ALIGN == 0 and s.offset >= end
            assert s.nbytes == params[s.index].nbytes
            end = s.offset + s.nbytes
        assert b.nbytes == end
        assert b.nbytes <= bucket_bytes or len(b.slots) == 1


def test_plan_rejects_a_non_positive_bucket_size() -> None:
    with pytest.raises(ValueError, match="bucket_bytes"):
        buckets.plan([], 0)


def model_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(40, 16, generator=g),
        "norm.weight": torch.randn(16, generator=g).to(torch.bfloat16),
        "half": torch.randn(3, 5, generator=g).to(torch.float16),
        "steps": torch.arange(7, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scale": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "transposed": torch.randn(6, 9, generator=g).t(),  # not contiguous
    }


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("bucket_bytes", [1, 100, 1 << 20])
def test_pack_unpack_is_bit_exact(bucket_bytes: int) -> None:
    named = model_tensors()
    params = [packing.meta_of(n, t) for n, t in named.items()]
    tensors = list(named.values())
    out: dict[str, torch.Tensor] = {}
    for b in buckets.plan(params, bucket_bytes):
        out.update(packing.unpack(b, params, packing.pack(b, params, tensors, "cpu")))
    assert list(out) == list(named)
    for name, t in named.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert bits(out[name]) == bits(t)


def test_pack_refuses_a_tensor_that_does_not_match_its_announcement() -> None:
    params = [protocol.ParamMeta("w", "float32", (2, 2))]
    (b,) = buckets.plan(params, 1 << 10)
    with pytest.raises(ValueError, match="announced float32"):
        packing.pack(b, params, [torch.zeros(2, 3)], "cpu")


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(st.integers(min_value=1, max_value=5000))
def test_snapshot_chunks_reassemble_bit_exact_at_any_chunk_size(chunk_bytes: int) -> None:
    named = model_tensors()
    snap = snapshot.WeightSnapshot.from_named_tensors(7, named.items(), bucket_bytes=512)
    pieces = list(snapshot.chunks(snap, chunk_bytes))
    assert all(len(p) == chunk_bytes for p in pieces[:-1])
    assert sum(map(len, pieces)) == snap.total_bytes
    got = dict(snapshot.assemble(snap.params, pieces))
    assert list(got) == list(named)
    assert all(bits(got[n]) == bits(t) and got[n].shape == t.shape for n, t in named.items())


def test_a_truncated_or_overlong_pull_stream_is_an_error() -> None:
    snap = snapshot.WeightSnapshot.from_named_tensors(1, model_tensors().items())
    data = b"".join(snapshot.chunks(snap, 64))
    with pytest.raises(ValueError, match="ended inside"):
        list(snapshot.assemble(snap.params, [data[:-3]]))
    with pytest.raises(ValueError, match="beyond"):
        list(snapshot.assemble(snap.params, [data, b"xx"]))


def test_snapshot_is_a_copy_and_the_store_keeps_the_newest() -> None:
    w = torch.zeros(4)
    store = snapshot.SnapshotStore()
    store.publish(snapshot.WeightSnapshot.from_named_tensors(1, [("w", w)]))
    w += 1  # the trainer's next step must not leak into the published version
    snap = store.latest()
    assert snap is not None
    assert torch.equal(dict(snap.named_tensors())["w"], torch.zeros(4))
    with pytest.raises(ValueError, match="older"):
        store.publish(snapshot.WeightSnapshot.from_named_tensors(0, [("w", w)]))


def test_metadata_rejects_what_the_wire_cannot_carry() -> None:
    with pytest.raises(ValueError, match="unsupported dtype"):
        protocol.ParamMeta("w", "complex64", (1,))
    with pytest.raises(ValueError, match="twice"):
        protocol.Announcement(1, 1, (protocol.ParamMeta("w", "float32", ()),) * 2, 64)
    with pytest.raises(ValueError, match="rank"):
        protocol.GroupInfo("h", 1, rank=2, world_size=2, epoch=1, backend="gloo")
    with pytest.raises(ValueError, match="backend"):
        protocol.GroupInfo("h", 1, rank=1, world_size=2, epoch=1, backend="mpi")
