"""Module buffers (BatchNorm running statistics) kept identical across ranks, as DDP's ``broadcast_buffers``.

Modes: ``"broadcast"`` (default: rank 0's buffers, as DDP does), ``"average"`` (the mean over ranks of every
floating-point buffer; integer buffers such as ``num_batches_tracked`` are equal anyway and are broadcast),
``"none"`` (every rank keeps its own).

When the synced buffers take effect: buffers are not delayed, whatever the width K. ``PipeSGD.step()`` at
step t syncs the buffers that step t's forward left (after handing step t's gradients to the ring, before
applying step t-K+1's), so forward t+1 on every rank starts from the same buffers, and after every
``step()`` (and so at every checkpoint and evaluation) they are identical. Staleness would buy nothing here:
training-mode BatchNorm normalises with the batch's statistics and only accumulates the running ones.

Which group and thread: the caller's thread and the caller's group, like ``check_replicas``, never the
ring's private clone, whose worker thread may be in the middle of a ring; collectives of one group issued
from two threads could pair up wrongly. The sync is a blocking collective (exposed, as DDP's is in its
forward); ``StepStats.t_buffers_s`` measures it per step.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from pipesgd import trace

BUFFER_MODES = ("broadcast", "average", "none")


class BufferSync:
    """Makes the buffers of a model identical across the ranks of ``group`` (``__call__``), per ``mode``."""

    def __init__(self, model_or_params, mode: str, group: dist.ProcessGroup | None = None) -> None:
        if mode not in BUFFER_MODES:
            raise ValueError(f"buffers must be one of {BUFFER_MODES}, got {mode!r}")
        self.mode = mode
        named = list(model_or_params.named_buffers()) if isinstance(model_or_params, nn.Module) else []
        self.names = [name for name, _ in named] if mode != "none" else []
        self.buffers = [b for _, b in named] if mode != "none" else []
        self._group = group
        self._size = dist.get_world_size(group) if dist.is_initialized() else 1
        self._source = dist.get_global_rank(group, 0) if group is not None and self._size > 1 else 0
        # Buffers grouped by (dtype, device): one collective per group, in a fixed order on every rank.
        self._groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for b in self.buffers:
            self._groups.setdefault((b.dtype, b.device), []).append(b)

    @property
    def active(self) -> bool:
        """Whether a call communicates (there are buffers to sync and other ranks to sync them with)."""
        return bool(self.buffers) and self._size > 1

    def __call__(self) -> None:
        if not self.active:
            return
        # Traced as a wait: the training thread blocks on this collective (beside the ring in flight, on the wire).
        with torch.no_grad(), trace.span("buffer sync", "wait"):
            for (dtype, _device), tensors in self._groups.items():
                flat = torch.cat([t.reshape(-1) for t in tensors])
                if self.mode == "average" and dtype.is_floating_point:
                    dist.all_reduce(flat, group=self._group)
                    flat.div_(self._size)
                else:
                    dist.broadcast(flat, src=self._source, group=self._group)
                offset = 0
                for t in tensors:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()
