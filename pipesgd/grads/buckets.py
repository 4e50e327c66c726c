"""Gradients packed into flat buckets of about ``bucket_mb``, and unpacked as views.

The layout is a pure function of the parameter list (shapes, dtypes, order) and the bucket size, so every
rank builds the same layout. A parameter without a gradient packs as zeros, so ranks never disagree on
sizes. Buckets hold the ring's working dtype: float64 for float64 parameters, float32 for everything else
(bf16/fp16 gradients are summed in fp32 and cast back on unpack).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipesgd.runlog import phases


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the ring adds in: fp64 stays fp64, every other float is summed in fp32."""
    if not dtype.is_floating_point:
        raise ValueError(f"only floating-point tensors can be all-reduced, got {dtype}")
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass(frozen=True, slots=True)
class Bucket:
    """A group of parameters that travel as one flat tensor."""

    param_indices: tuple[int, ...]  # positions in the wrapper's parameter list
    offsets: tuple[int, ...]  # start of each parameter inside the flat tensor
    numels: tuple[int, ...]
    dtype: torch.dtype  # working dtype of the flat tensor
    device: torch.device

    @property
    def numel(self) -> int:
        return self.offsets[-1] + self.numels[-1] if self.offsets else 0

    def empty(self) -> torch.Tensor:
        return torch.empty(self.numel, dtype=self.dtype, device=self.device)


def build_buckets(params: list[torch.Tensor], bucket_bytes: int) -> list[Bucket]:
    """Split ``params`` (in order) into buckets of at most ``bucket_bytes`` (a larger parameter gets its own), grouped
    by (working dtype, device)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes")
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault((working_dtype(p.dtype), p.device), []).append(i)
    buckets: list[Bucket] = []
    for (dtype, device), indices in groups.items():
        item = torch.empty((), dtype=dtype).element_size()
        current: list[int] = []
        size = 0
        for i in indices:
            n = params[i].numel()
            if current and (size + n) * item > bucket_bytes:
                buckets.append(_make_bucket(params, current, dtype, device))
                current, size = [], 0
            current.append(i)
            size += n
        if current:
            buckets.append(_make_bucket(params, current, dtype, device))
    return buckets


def _make_bucket(params, indices, dtype, device) -> Bucket:
    offsets, numels, offset = [], [], 0
    for i in indices:
        offsets.append(offset)
        numels.append(params[i].numel())
        offset += params[i].numel()
    return Bucket(tuple(indices), tuple(offsets), tuple(numels), dtype, device)


def viewable(param: torch.Tensor, bucket: Bucket) -> bool:
    """Whether ``param.grad`` can be a view into ``bucket``'s flat tensor: same dtype and device, and a dense
    contiguous layout (a bf16/fp16 parameter in an fp32 bucket keeps its own gradient and the copy)."""
    return (param.dtype == bucket.dtype and param.device == bucket.device and param.layout == torch.strided
            and param.is_contiguous())


def gradient_slots(bucket: Bucket, params: list[torch.Tensor], flat: torch.Tensor) -> list[torch.Tensor]:
    """Each of ``bucket``'s parameters' place in ``flat`` (in ``bucket.param_indices`` order), shaped like it."""
    return [flat[offset : offset + n].view(params[i].shape)
            for i, offset, n in zip(bucket.param_indices, bucket.offsets, bucket.numels)]


def read_gradients(params: list[torch.Tensor], slots: list[torch.Tensor]) -> None:
    """Copy each ``params[k].grad`` into ``slots[k]`` (zeros where a gradient is missing); a gradient that is its
    slot already (backward wrote it there) costs an identity test and no copy."""
    with phases.timed("pack_unpack"):
        for p, slot in zip(params, slots):
            grad = p.grad
            if grad is slot:
                continue
            if grad is None:
                slot.zero_()
            else:
                slot.copy_(grad)


def write_gradients(params: list[torch.Tensor], slots: list[torch.Tensor], as_view: list[bool], copy: bool = True,
                    create: bool = True) -> None:
    """Make each ``params[k].grad`` hold ``slots[k]``: the slot itself where ``as_view[k]``, a copy elsewhere, created
    where missing. ``copy=False`` leaves the copied ones as they are; ``create=False`` leaves a None a None."""
    with phases.timed("pack_unpack"):
        for p, slot, view in zip(params, slots, as_view):
            grad = p.grad
            if grad is None and not create:
                continue
            if view:
                if grad is not slot:
                    p.grad = slot
            elif not copy:
                continue
            elif grad is None:
                p.grad = slot.to(dtype=p.dtype, copy=True)
            else:
                grad.copy_(slot)


def layout_signature(params: list[torch.Tensor]) -> list[tuple[tuple[int, ...], str]]:
    """Shapes and dtypes of the communicated parameters, to refuse a checkpoint of another model."""
    return [(tuple(p.shape), str(p.dtype)) for p in params]
