"""An opt-in check that replicas stay bitwise identical: a cheap per-parameter checksum compared across ranks.

The checksum sums the raw bits of each parameter as integers, so any single flipped bit changes it, and
compares the min and max over ranks. The error names the first parameter that diverged.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class ReplicaDivergenceError(RuntimeError):
    """Raised when the weights of two ranks are no longer bitwise identical."""


_INT_VIEW = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def parameter_checksums(params: list[torch.Tensor]) -> torch.Tensor:
    """One int64 per parameter: the sum of its elements' bit patterns (exact, order-independent)."""
    sums = []
    for p in params:
        bits = p.detach().reshape(-1).view(_INT_VIEW[p.element_size()])
        sums.append(bits.to(torch.int64).sum())
    return torch.stack(sums).cpu() if sums else torch.zeros(0, dtype=torch.int64)


def check_replicas(params: list[torch.Tensor], names: list[str], step: int, group=None) -> None:
    """Raise ReplicaDivergenceError naming the first parameter whose checksum differs across ranks."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    sums = parameter_checksums(params)
    if dist.get_backend(group) == "nccl":  # NCCL reduces device tensors only
        sums = sums.to(params[0].device)
    low, high = sums.clone(), sums.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    differs = (low != high).nonzero()
    if differs.numel():
        first = int(differs[0])
        raise ReplicaDivergenceError(
            f"replicas diverged at step {step}: parameter {names[first]!r} differs across ranks "
            f"({differs.numel()} of {len(params)} parameters differ)"
        )
