"""Tensors <-> bucket buffers (uint8) following a `buckets.plan` layout; the only torch code of the layout.

Packing copies each tensor's bytes into its slot (one copy, no intermediate flatten); unpacking is
zero-copy: it returns views of the bucket buffer with the announced dtype and shape. Used by
`sender.py` (pack, then broadcast), `receiver.py` (broadcast into a buffer, then unpack) and
`snapshot.py` (the trainer's copy served by the gRPC pull path).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy
import torch

from plrl_workers import protocol
from plrl_workers.weight_sync import buckets


def dtype_of(name: str) -> torch.dtype:
    """`"bfloat16"` -> `torch.bfloat16` (only the dtypes in `protocol.ITEMSIZE`)."""
    if name not in protocol.ITEMSIZE:
        raise ValueError(f"unsupported dtype {name!r}; known: {sorted(protocol.ITEMSIZE)}")
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> `"bfloat16"`."""
    name = str(dtype).removeprefix("torch.")
    if name not in protocol.ITEMSIZE:
        raise ValueError(f"unsupported dtype {dtype}; known: {sorted(protocol.ITEMSIZE)}")
    return name


def meta_of(name: str, tensor: torch.Tensor) -> protocol.ParamMeta:
    return protocol.ParamMeta(name=name, dtype=dtype_name(tensor.dtype), shape=tuple(tensor.shape))


def typed_view(buf: torch.Tensor, offset: int, meta: protocol.ParamMeta) -> torch.Tensor:
    """The `meta`-shaped tensor stored at `buf[offset:]` (a view: writes go to `buf`)."""
    raw = buf[offset : offset + meta.nbytes]
    if meta.nbytes == 0:
        return torch.empty(meta.shape, dtype=dtype_of(meta.dtype), device=buf.device)
    return raw.view(dtype_of(meta.dtype)).view(meta.shape)


def pack(
    bucket: buckets.Bucket,
    params: Sequence[protocol.ParamMeta],
    tensors: Sequence[torch.Tensor],
    device: torch.device | str,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """A uint8 buffer on `device` (`out` if given, else a new one) holding the tensors of `bucket`."""
    buf = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device) if out is None else out
    if buf.numel() != bucket.nbytes:
        raise ValueError(f"bucket buffer has {buf.numel()} bytes, the bucket needs {bucket.nbytes}")
    for slot in bucket.slots:
        meta, tensor = params[slot.index], tensors[slot.index]
        if tuple(tensor.shape) != meta.shape or dtype_name(tensor.dtype) != meta.dtype:
            raise ValueError(
                f"param {meta.name}: tensor is {tensor.dtype} {tuple(tensor.shape)}, "
                f"announced {meta.dtype} {meta.shape}"
            )
        if not meta.nbytes:
            continue
        if buf.device.type == "cpu" and tensor.device.type == "cpu":
            # A plain memcpy: torch's copy_ goes through its intra-op thread pool, which costs more
            # than the copy itself when the cores are busy (a trainer, or `plrl run` on few cores).
            src = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
            numpy.copyto(buf.numpy()[slot.offset : slot.offset + meta.nbytes], src)
        else:
            typed_view(buf, slot.offset, meta).copy_(tensor.detach())
    return buf


def unpack(
    bucket: buckets.Bucket, params: Sequence[protocol.ParamMeta], buf: torch.Tensor
) -> list[tuple[str, torch.Tensor]]:
    """The (name, view) pairs of `bucket`, in announcement order, viewing `buf` (no copy)."""
    return [(params[s.index].name, typed_view(buf, s.offset, params[s.index])) for s in bucket.slots]
