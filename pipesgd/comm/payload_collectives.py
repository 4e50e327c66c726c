"""The two whole-group collectives of the all-to-all all-reduce (``pipesgd.comm.alltoall``), on uint8 payloads whose
sizes every rank knows before the bytes arrive: an all-to-all with one payload per peer (sizes may differ, as the
chunks do by one element) and an all-gather of one payload per rank, padded to the largest, since gloo and NCCL
gather equal slots only. Both are the backend's native collectives (gloo on CPU has ``alltoallv`` and ``allgather``
in torch 2.2 and later; NCCL has both); gloo with CUDA tensors stages through the topology's pinned host buffers, as
the ring's hops do. There the all-gather is itself an all-to-all (``RingTopology.gathers_by_alltoall``): each rank
sends its payload to every other, the same bytes per rank as gloo's ring all-gather, without the fixed cost that
gloo's all-gather showed on the GPU host.
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
    by_alltoall = topology.gathers_by_alltoall
    if by_alltoall if by_alltoall is not None else topology.stages(device):
        return _gather_by_alltoall(topology, payload, sizes, slot, device, while_waiting)
    send = topology.wire_buffer("allgather-send", slot, device)
    send[: payload.numel()].copy_(payload)
    send[payload.numel() :].zero_()  # the pad: never decoded, zeroed so the bytes on the wire are deterministic
    recv = topology.wire_buffer("allgather-recv", slot * len(sizes), device)
    work = _ALL_GATHER(recv, send, group=topology.group, async_op=True)
    _wait(work, while_waiting)
    return _split(_arrived(topology, recv, device), sizes, [q * slot for q in range(len(sizes))])


def _gather_by_alltoall(topology: RingTopology, payload: torch.Tensor, sizes: list[int], slot: int,
                        device: torch.device, while_waiting: Callable[[], None] | None) -> list[torch.Tensor]:
    """``all_gather_payload`` as an all-to-all: the payload, padded to ``slot``, goes to each of the p-1 other ranks
    (nothing to itself); rank q's arrives at the (q-1)-th slot if q > rank, else the q-th. Own entry: ``payload``."""
    p, r = len(sizes), topology.rank
    send = topology.wire_buffer("allgather-send", (p - 1) * slot, device)
    send[: payload.numel()].copy_(payload)  # once from the device when staged; the copies below stay on the host
    send[payload.numel() : slot].zero_()  # the pad: never decoded, zeroed so the bytes on the wire are deterministic
    for k in range(1, p - 1):
        send[k * slot : (k + 1) * slot].copy_(send[:slot])
    recv = topology.wire_buffer("allgather-recv", (p - 1) * slot, device)
    splits = [0 if q == r else slot for q in range(p)]
    work = dist.all_to_all_single(recv, send, splits, splits, group=topology.group, async_op=True)
    _wait(work, while_waiting)
    parts = _split(_arrived(topology, recv, device), [sizes[q] for q in range(p) if q != r],
                   [k * slot for k in range(p - 1)])
    return parts[:r] + [payload] + parts[r:]


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
