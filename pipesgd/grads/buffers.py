"""Module buffers (BatchNorm running statistics) kept identical across ranks, as DDP's ``broadcast_buffers``.

Modes: ``"broadcast"`` (default: rank 0's buffers, as DDP does), ``"average"`` (the mean over ranks of every
floating-point buffer; integer buffers such as ``num_batches_tracked`` are equal anyway and are broadcast),
``"none"`` (every rank keeps its own), and ``"broadcast-delayed"`` / ``"average-delayed"`` (the same values,
exchanged with the gradients instead of by a blocking collective).

When the synced buffers take effect: buffers are not delayed, whatever the width K. ``PipeSGD.step()`` at
step t syncs the buffers that step t's forward left (after handing step t's gradients to the ring, before
applying step t-K+1's), so forward t+1 on every rank starts from the same buffers, and after every
``step()`` (and so at every checkpoint and evaluation) they are identical.

Why delayed modes: the immediate sync is a rendezvous of every rank at every step. Pipe-SGD otherwise lets a
rank run a step ahead of a slow one; with the rendezvous each step waits for the slowest rank again, and on the
emulated cluster ResNet-20's pipe iteration took 1.29-1.41x its ``"none"`` time (``experiments/bench_buffers.py``,
moving the sync before the hand-off did not change that). The delayed modes snapshot the buffers that step t's
forward left (``snapshot``), reduce the snapshot on the ring's worker right after step t's gradients
(``reduce_``), and ``PipeSGD`` writes the result into the buffers when it applies step t's gradient, at step
t+K-1 (``load``): forward t+K on every rank starts from the same buffers, the running statistics lag K-1 steps
(the updates of the forwards in between are overwritten), and the buffers are identical after every ``step()``
that applies a gradient, i.e. all but the K-1 steps that fill the pipeline after the warm-up, when each rank keeps
its own. Training-mode BatchNorm normalises with the batch's statistics and only accumulates the running ones,
so the lag changes evaluation, not the gradients. An in-flight step restored from a checkpoint carries no buffers.

Which group and thread: the caller's thread and the caller's group, like ``check_replicas``, never the
ring's private clone, whose worker thread may be in the middle of a ring; collectives of one group issued
from two threads could pair up wrongly. The sync is a blocking collective (exposed, as DDP's is in its
forward); ``StepStats.t_buffers_s`` measures it per step (for the delayed modes: the snapshot's copy).
"""
from __future__ import annotations

import time
from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from pipesgd.runlog import trace

BUFFER_MODES = ("broadcast", "average", "none", "broadcast-delayed", "average-delayed")


class BufferSync:
    """Makes the buffers of a model identical across the ranks of ``group`` (``__call__``), per ``mode``."""

    def __init__(self, model_or_params, mode: str, group: dist.ProcessGroup | None = None) -> None:
        if mode not in BUFFER_MODES:
            raise ValueError(f"buffers must be one of {BUFFER_MODES}, got {mode!r}")
        self.mode = mode
        self.delayed = mode.endswith("-delayed")
        self._reduction = mode.removesuffix("-delayed")  # broadcast | average | none
        named = list(model_or_params.named_buffers()) if isinstance(model_or_params, nn.Module) else []
        self.names = [name for name, _ in named] if mode != "none" else []
        self.buffers = [b for _, b in named] if mode != "none" else []
        self._group = group
        self._size = dist.get_world_size(group) if dist.is_initialized() else 1
        self._source = dist.get_global_rank(group, 0) if group is not None and self._size > 1 else 0
        self._flat = flat_groups(self.buffers)  # one collective per group, in a fixed order on every rank

    @property
    def active(self) -> bool:
        """Whether a call communicates (there are buffers to sync and other ranks to sync them with)."""
        return bool(self.buffers) and self._size > 1

    def __call__(self) -> None:
        if not self.active:
            return
        # Traced as a wait: the training thread blocks on this collective (beside the ring in flight, on the wire).
        with torch.no_grad(), trace.span("buffer sync", "wait"):
            for (dtype, _device), group in self._flat.items():
                flat = group.flatten()
                if self._averages(dtype):
                    dist.all_reduce(flat, group=self._group)
                    flat.div_(self._size)
                else:
                    dist.broadcast(flat, src=self._source, group=self._group)
                group.unflatten_(flat)

    def timed(self) -> float:
        """``self()``, and the seconds it took."""
        start = time.perf_counter()
        self()
        return time.perf_counter() - start

    def snapshot(self) -> list[torch.Tensor]:
        """Delayed modes, caller's thread: this rank's share of every buffer group, one flat copy each (its values
        to average, or for a broadcast its values on group rank 0 and zeros elsewhere, so a sum is rank 0's)."""
        source = dist.get_rank(self._group) == 0
        with torch.no_grad():
            flats = [group.flatten() for group in self._flat.values()]
            for (dtype, _device), flat in zip(self._flat, flats):
                if not source and not self._averages(dtype):
                    flat.zero_()
        return flats

    def job(self, exchange, channel):
        """The worker's job for one step's buckets, and the seconds its snapshot took (None without one): the
        exchange alone, or under a delayed mode the exchange and then the reduction, on the ring's group
        (``channel.topology.group``, read only then), of a snapshot of the buffers taken now."""
        if not (self.active and self.delayed):
            return exchange, None
        start = time.perf_counter()
        job = partial(_exchange_then_reduce, exchange, self, self.snapshot(), channel.topology.group)
        return job, time.perf_counter() - start

    def reduce_(self, flats: list[torch.Tensor], group: dist.ProcessGroup | None) -> list[torch.Tensor]:
        """Delayed modes, the ring's worker on the ring's group (the same ranks): every rank's snapshots summed,
        averages divided by the world size; in place, returned."""
        for (dtype, _device), flat in zip(self._flat, flats):
            dist.all_reduce(flat, group=group)
            if self._averages(dtype):
                flat.div_(self._size)
        return flats

    def load(self, flats: list[torch.Tensor]) -> None:
        """Delayed modes, caller's thread: write reduced snapshots into the buffers."""
        with torch.no_grad():
            for group, flat in zip(self._flat.values(), flats):
                group.unflatten_(flat)

    def _averages(self, dtype: torch.dtype) -> bool:
        return self._reduction == "average" and dtype.is_floating_point


def _exchange_then_reduce(exchange, sync: "BufferSync", snapshot: list[torch.Tensor], group,
                          buckets: list[torch.Tensor]):
    """On the ring's worker: the gradient exchange, then the buffer snapshot's reduction on the ring's group."""
    result = exchange(buckets)
    result.module_buffers = sync.reduce_(snapshot, group)
    return result


class FlatGroup:
    """One group's buffers to and from one flat tensor in a fixed number of torch calls, however many buffers there
    are (ResNet-18 has 60): each buffer's 1-D view is made once, so a step concatenates them (one call) and writes a
    flat tensor back with one multi-tensor copy of its split, where a loop over the buffers made four calls each
    (view, slice, view, copy), every one a kernel launch or a dispatch on the training thread. A group holding a
    buffer that is not contiguous (no 1-D view of it can write back) keeps the loop."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self.numels = [t.numel() for t in tensors]
        self.views = [t.view(-1) for t in tensors] if all(t.is_contiguous() for t in tensors) else None

    def flatten(self) -> torch.Tensor:
        """A new 1-D tensor holding every buffer's values, in order."""
        return torch.cat(self.views if self.views is not None else [t.reshape(-1) for t in self.tensors])

    def unflatten_(self, flat: torch.Tensor) -> None:
        """Every buffer overwritten with its slice of ``flat`` (``flatten``'s inverse)."""
        if self.views is None:
            copy_into(self.tensors, flat)
        else:
            torch._foreach_copy_(self.views, list(flat.split(self.numels)))


def flat_groups(buffers: list[torch.Tensor]) -> dict[tuple[torch.dtype, torch.device], FlatGroup]:
    """``buffers`` grouped by (dtype, device), in the order each group first appears, one ``FlatGroup`` each."""
    grouped: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for b in buffers:
        grouped.setdefault((b.dtype, b.device), []).append(b)
    return {key: FlatGroup(tensors) for key, tensors in grouped.items()}


def copy_into(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Write consecutive slices of the 1-D ``flat`` into ``tensors`` (the inverse of concatenating them)."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
