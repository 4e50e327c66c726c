"""Module buffers (BatchNorm running statistics) made identical across ranks where the ranks meet, not every step.

Modes: ``"broadcast"`` (rank 0's, as DDP's ``broadcast_buffers``), ``"average"`` (the mean of floating-point
buffers; integer ones are broadcast) and ``"none"``. A blocking collective in ``step()`` would queue behind the
exchange in flight and make the pipeline synchronous, and training-mode BatchNorm reads no running statistics, so
the buffers meet at ``flush()``, ``consolidate_state_dict()``, the replica check and ``sync_buffers()``, on the
caller's group and thread (docs/wrapper.md, "Module buffers")."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from pipesgd.runlog import trace

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
        self._flat = flat_groups(self.buffers)  # one collective per group, in a fixed order on every rank

    @property
    def active(self) -> bool:
        """Whether a call communicates (there are buffers to sync and other ranks to sync them with)."""
        return bool(self.buffers) and self._size > 1

    def __call__(self) -> float | None:
        """Sync now (a collective of the group); the seconds it took, None when there was nothing to sync."""
        if not self.active:
            return None
        start = time.perf_counter()
        with torch.no_grad(), trace.span("buffer sync", "wait"):
            for (dtype, _device), group in self._flat.items():
                flat = group.flatten()
                if self.mode == "average" and dtype.is_floating_point:
                    dist.all_reduce(flat, group=self._group)
                    flat.div_(self._size)
                else:
                    dist.broadcast(flat, src=self._source, group=self._group)
                group.unflatten_(flat)
        return time.perf_counter() - start


class FlatGroup:
    """One group's buffers to and from one flat tensor in a fixed number of torch calls, however many buffers there
    are: each buffer's 1-D view is made once, so a sync concatenates them (one call) and writes a flat tensor back
    with one multi-tensor copy of its split. A group holding a buffer that is not contiguous (no 1-D view of it can
    write back) keeps a loop."""

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
