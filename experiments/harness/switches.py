"""The variants that benchmarks time against the library's one way, patched in from here so that the library keeps
no switch for them: codec calls one per chunk, the exchange's collectives forced one way, the communication side
stream's priority, the ring's all-gather forwarded through the device. Each patch holds for the whole process and
is not thread-safe: for a benchmark's or a test's process, never a training run."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

__all__ = ["exchange_collectives", "forward_through_device", "one_call_per_chunk", "side_stream_priority"]


@contextmanager
def one_call_per_chunk() -> Iterator[None]:
    """Within this block every chunk goes through its own codec call (``pipesgd.compression.rows`` batches none):
    the same bits as batched, so only the time differs."""
    from pipesgd.compression import rows

    groups, runs = rows._groups, rows._cast_runs
    rows._groups = lambda layout, numels, device: [[j] for j in range(len(numels))]
    rows._cast_runs = lambda tensors: [([j], tensor) for j, tensor in enumerate(tensors)]
    try:
        yield
    finally:
        rows._groups, rows._cast_runs = groups, runs


@contextmanager
def exchange_collectives(gather_by_alltoall: bool | None = None, pairwise: bool | None = None) -> Iterator[None]:
    """Within this block the exchange (``pipesgd.comm.alltoall``) sends its all-gather as an all-to-all (True) or
    as the backend's all-gather (False), and both collectives one peer at a time (True) or as the backend's
    (False); None keeps the library's choice. One peer at a time only goes where the library could (gloo on host
    memory): NCCL's unbatched pairs can deadlock."""
    from pipesgd.comm import alltoall, payload_collectives
    from pipesgd.comm.topology import RingTopology

    gather, sends_pairwise = alltoall.all_gather_payload, RingTopology.sends_pairwise
    if gather_by_alltoall is not None:
        way = payload_collectives._gather_by_alltoall if gather_by_alltoall else payload_collectives._gather_native
        alltoall.all_gather_payload = (lambda topology, payload, sizes, device, while_waiting=None:
                                       way(topology, payload, sizes, device, while_waiting))
    if pairwise is not None:
        def forced(topology: RingTopology, device: torch.device, peer_bytes: int) -> bool:
            return (pairwise and not topology.batched and not topology.stages(device) and topology.size > 1
                    and dist.get_backend(topology.group) == "gloo")

        RingTopology.sends_pairwise = forced
    try:
        yield
    finally:
        alltoall.all_gather_payload, RingTopology.sends_pairwise = gather, sends_pairwise


def side_stream_priority(priority: int) -> None:
    """From now on, every communication worker's CUDA side stream has ``priority`` (lower is more urgent than the
    training step's kernels, as NCCL's high-priority streams are); the library's is the default stream's."""
    from pipesgd.comm.worker import CommWorker

    made = CommWorker.__init__

    def init(self, *args, **kwargs) -> None:
        made(self, *args, **kwargs)
        if self._stream is not None:  # before any job: each job reads the stream when it runs
            self._stream = torch.cuda.Stream(self.device, priority=priority)

    CommWorker.__init__ = init


def forward_through_device() -> None:
    """From now on, a compressed ring's all-gather copies each received payload to the device and back before
    forwarding it, where the library forwards it from host memory."""
    from pipesgd.comm.topology import RingTopology

    RingTopology.forwards_on_host = lambda self, device: False
