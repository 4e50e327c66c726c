"""The two whole-group collectives of the all-to-all all-reduce (``pipesgd.comm.alltoall``), on uint8 payloads whose
sizes every rank knows before the bytes arrive: an all-to-all with one payload per peer (sizes may differ, as the
chunks do by one element) and an all-gather of one payload per rank, padded to the largest, since gloo and NCCL
gather equal slots only. Both are the backend's native collectives (gloo on CPU has ``alltoallv`` and ``allgather``
in torch 2.2 and later; NCCL has both); gloo with CUDA tensors stages through the topology's pinned host buffers, as
the ring's hops do.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from pipesgd.runlog import phases
from pipesgd.comm.topology import RingTopology

# torch 2.13 renamed all_gather_into_tensor (which it still has, with a deprecation warning) to all_gather_single.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def all_to_all_payloads(
    topology: RingTopology,
    outgoing: list[torch.Tensor],
    incoming_bytes: list[int],
    device: torch.device,
    while_waiting: Callable[[], None] | None = None,
) -> list[torch.Tensor]:
    """Send ``outgoing[q]`` to group rank q and receive ``incoming_bytes[q]`` bytes from rank q, for every q (an
    empty payload sends nothing). Returns what arrived from each rank, on ``device``: views into a buffer that the
    next call reuses. ``while_waiting`` runs once the collective is posted, before it is waited for."""
    send = topology.wire_buffer("alltoall-send", sum(payload.numel() for payload in outgoing), device)
    offset = 0
    for payload in outgoing:  # a blocking copy when staged: gloo reads the host buffer once the call is posted
        send[offset : offset + payload.numel()].copy_(payload)
        offset += payload.numel()
    recv = topology.wire_buffer("alltoall-recv", sum(incoming_bytes), device)
    work = dist.all_to_all_single(recv, send, list(incoming_bytes), [payload.numel() for payload in outgoing],
                                  group=topology.group, async_op=True)
    _wait(work, while_waiting)
    return _split(_arrived(topology, recv, device), incoming_bytes, [sum(incoming_bytes[:q]) for q in
                                                                     range(len(incoming_bytes))])


def all_gather_payload(
    topology: RingTopology,
    payload: torch.Tensor,
    sizes: list[int],
    device: torch.device,
    while_waiting: Callable[[], None] | None = None,
) -> list[torch.Tensor]:
    """Every rank's payload on every rank: ``sizes[q]`` is the size of rank q's (``sizes[rank]`` that of
    ``payload``). Each travels in a slot of ``max(sizes)`` bytes (the pad is at most a block's scale and a byte
    or two for the codecs we have). Returns views into a buffer that the next call reuses, on ``device``."""
    slot = max(sizes)
    send = topology.wire_buffer("allgather-send", slot, device)
    send[: payload.numel()].copy_(payload)
    send[payload.numel() :].zero_()  # the pad: never decoded, zeroed so the bytes on the wire are deterministic
    recv = topology.wire_buffer("allgather-recv", slot * len(sizes), device)
    work = _ALL_GATHER(recv, send, group=topology.group, async_op=True)
    _wait(work, while_waiting)
    return _split(_arrived(topology, recv, device), sizes, [q * slot for q in range(len(sizes))])


def _wait(work, while_waiting: Callable[[], None] | None) -> None:
    if while_waiting is not None:
        while_waiting()
    with phases.timed("wire_wait"):
        work.wait()


def _arrived(topology: RingTopology, recv: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The received bytes on ``device``: copied out of the host staging buffer when gloo carries CUDA tensors
    (into the topology's uint8 scratch, which only this all-reduce uses; one collective's bytes are decoded before
    the next one arrives)."""
    if not topology.stages(device):
        return recv
    return topology.scratch(recv.numel(), torch.uint8, device).copy_(recv)


def _split(buffer: torch.Tensor, sizes: list[int], starts: list[int]) -> list[torch.Tensor]:
    return [buffer[start : start + size] for start, size in zip(starts, sizes)]
