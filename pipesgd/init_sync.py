"""Every rank starts from rank 0's parameters and buffers, as DDP makes them when it wraps a model.

Scripts commonly seed each rank differently (``seed + rank``); without DDP's broadcast the replicas would train
different models forever. ``sync_initial_state`` checks that every rank holds the same shapes and dtypes (a
mismatch would pair broadcasts of different sizes), then broadcasts rank 0's values, one collective per (dtype,
device) group, on the caller's group and thread before any background communication. The broadcast's time and
bytes are returned: ``compression="auto"`` reads the link from them before step 0's exchange."""
from __future__ import annotations

import hashlib
import time
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from pipesgd.grads.buffers import copy_into


def module_state(model_or_params) -> tuple[list[torch.Tensor], list[str]]:
    """The tensors a replica consists of, with names: a module's parameters and buffers (tied ones once), or
    the given parameters."""
    if isinstance(model_or_params, nn.Module):
        named = list(model_or_params.named_parameters()) + list(model_or_params.named_buffers())
    else:
        named = [(f"param{i}", p) for i, p in enumerate(model_or_params)]
    seen, tensors, names = set(), [], []
    for name, t in named:
        if id(t) not in seen:
            seen.add(id(t))
            tensors.append(t)
            names.append(name)
    return tensors, names


def layout_digest(tensors: list[torch.Tensor]) -> int:
    """A 63-bit digest of the shapes and dtypes, equal on two ranks exactly when their layouts are."""
    text = ";".join(f"{tuple(t.shape)}:{t.dtype}" for t in tensors)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


class Broadcast(NamedTuple):
    """The initial broadcast as this rank saw it: seconds from its start (every rank leaves the layout check's
    all-reduce together) until this rank held all of rank 0's values, the bytes broadcast, and the part of that time
    that is not bytes: the faster of two broadcasts of one element just before, once per broadcast (0: not timed)."""

    seconds: float
    nbytes: int
    latency_s: float = 0.0


def sync_initial_state(model_or_params, group: dist.ProcessGroup, latency: bool = False) -> Broadcast | None:
    """Make every tensor of ``model_or_params`` equal to group rank 0's, bitwise (a collective of ``group``); how
    long this rank took to receive them (None when nothing was broadcast: one rank, or no tensors).

    Raises ``ValueError`` on every rank when the ranks' layouts differ (nothing is broadcast then)."""
    tensors, _ = module_state(model_or_params)
    if dist.get_world_size(group) == 1 or not tensors:
        return None
    device = tensors[0].device if dist.get_backend(group) == "nccl" else torch.device("cpu")
    # Step 1: the same layout everywhere (min and max of the digest agree on every rank, so all raise or none).
    digest = torch.tensor([layout_digest(tensors), -layout_digest(tensors)], dtype=torch.int64, device=device)
    dist.all_reduce(digest, op=dist.ReduceOp.MIN, group=group)
    if int(digest[0]) != -int(digest[1]):
        raise ValueError("the model differs across ranks (parameter or buffer shapes or dtypes); build the same "
                         "model on every rank before wrapping it")
    # Step 2: rank 0's values, one flat broadcast per (dtype, device).
    source = dist.get_global_rank(group, 0)
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    # Before the values, on idle links: right after them, rank 0's queued sends (a broadcast returns there once its data
    # is handed to the network) would make one element's broadcast read the bulk transfer's time, not the latency.
    latency_s = 0.0
    if latency:
        one = torch.zeros(1, device=device)
        latency_s = len(groups) * min(_timed_broadcast(one, source, group) for _ in range(2))
    seconds, nbytes = 0.0, 0
    with torch.no_grad():
        for members in groups.values():
            flat = torch.cat([t.detach().reshape(-1) for t in members])
            seconds += _timed_broadcast(flat, source, group)
            nbytes += flat.numel() * flat.element_size()
            copy_into(members, flat)
    return Broadcast(seconds, nbytes, latency_s)


def _timed_broadcast(x: torch.Tensor, source: int, group: dist.ProcessGroup) -> float:
    start = time.perf_counter()
    dist.broadcast(x, src=source, group=group)
    if x.is_cuda:  # received, not only queued
        torch.cuda.synchronize(x.device)
    return time.perf_counter() - start
