"""A process group's ring plus the one background worker that runs it: the only way a ring leaves the
caller's thread. PipeSGD opens a private channel; ``ring_allreduce(async_op=True)`` shares one per group.
"""
from __future__ import annotations

import atexit
import threading
from datetime import timedelta
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from pipesgd.comm.worker import CommWorker
from pipesgd.defaults import EXIT_WAIT_S
from pipesgd.comm.handles import CompletedWork, Work
from pipesgd.comm.topology import RingTopology

T = TypeVar("T")


class RingChannel:
    """The topology of one group and the worker thread (a side stream too on CUDA) that runs its rings.

    Jobs run one at a time in submission order, which keeps the rings of all ranks matched; only the worker touches
    the topology's buffers. At world size 1 there is no worker: a job runs at once, its handle already completed."""

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device | str = "cpu",
                 owns_group: bool = False) -> None:
        self.topology = RingTopology(group)
        self._worker = CommWorker(device) if self.topology.size > 1 else None
        self._owned_group = group if owns_group else None  # a private clone, destroyed by close()

    @property
    def size(self) -> int:
        return self.topology.size

    @property
    def is_open(self) -> bool:
        return self._worker is None or self._worker.is_alive()

    def submit(self, fn: Callable[..., T], *args: Any) -> Work[T]:
        """Queue ``fn(*args)`` behind every earlier job; its handle's ``wait()`` gives the result."""
        if self._worker is None:
            return CompletedWork(fn(*args))
        return self._worker.submit(fn, *args)

    def close(self, timeout_s: float | None = None) -> bool:
        """Finish the queued jobs, stop the worker and destroy the channel's private group (if any); False, leaving both
        alone, if the jobs had not finished after ``timeout_s``."""
        if self._worker is not None and not self._worker.close(timeout_s):
            return False
        group, self._owned_group = self._owned_group, None
        # Destroying the default group destroys every group; a private one left alive would keep its
        # connections (gloo sockets, NCCL communicators) until the process ends.
        if group is not None and dist.is_initialized():
            dist.destroy_process_group(group)
        return True


def open_private_channel(
    group: dist.ProcessGroup | None, device: torch.device, timeout_s: float | None = None
) -> RingChannel:
    """A channel on a private clone of ``group`` (default: the default group), so the caller's own collectives never
    interleave with the worker's traffic. Creating it is a collective call on every rank; ``close()`` destroys it.
    ``timeout_s`` bounds every wait of the background ring: on gloo a dead peer is an error from ``step()`` instead of
    a hang; on NCCL its watchdog catches it (docs/gpu.md says how to make it raise)."""
    private = private_group(group, timeout_s)
    return RingChannel(private, device, owns_group=private is not None)


def private_group(group: dist.ProcessGroup | None, timeout_s: float | None) -> dist.ProcessGroup | None:
    """A clone of ``group`` (the default group if None) with ``timeout_s``; None where there is nothing to clone
    (no process group, or a world of one). A collective call on every rank of the default group."""
    if not dist.is_initialized():
        return None
    base = group if group is not None else dist.group.WORLD
    if dist.get_world_size(base) == 1:
        return None
    timeout = timedelta(seconds=timeout_s) if timeout_s is not None else None
    return dist.new_group(ranks=dist.get_process_group_ranks(base), backend=dist.get_backend(base), timeout=timeout)


_shared: dict[tuple[dist.ProcessGroup | None, torch.device], RingChannel] = {}
_shared_lock = threading.Lock()


def channel_for(group: dist.ProcessGroup | None, device: torch.device | str) -> RingChannel:
    """The channel that every ``ring_allreduce(async_op=True)`` on ``group`` and ``device`` shares, created on first use
    and kept for the process: async rings on one group run in submission order; rings on different groups may overlap."""
    key = (group, torch.device(device))
    with _shared_lock:
        channel = _shared.get(key)
        if channel is None or not channel.is_open:
            channel = _shared[key] = RingChannel(group, key[1])
        return channel


@atexit.register
def _close_shared() -> None:
    """Async rings nobody waited for finish before the interpreter stops their thread (``pipesgd.lifecycle`` says
    why: a daemon thread stopped inside a gloo wait aborts the process)."""
    with _shared_lock:
        channels = list(_shared.values())
        _shared.clear()
    for channel in channels:
        channel.close(EXIT_WAIT_S)
