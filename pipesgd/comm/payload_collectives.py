"""The two whole-group collectives of the all-to-all all-reduce (``pipesgd.comm.alltoall``) on uint8 payloads whose
sizes every rank knows in advance: an all-to-all (one payload per peer) and an all-gather padded to the largest
(gloo and NCCL gather equal slots only). Both are the backend's own; gloo with CUDA tensors stages through pinned
host buffers, and there the all-gather is an all-to-all (``RingTopology.stages``), the same bytes per rank
without gloo's all-gather's fixed cost on the GPU host. ``pairwise_payloads`` goes one peer at a time instead."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from pipesgd.runlog import phases
from pipesgd.compression.rows import follows, views_at
from pipesgd.comm.topology import RingTopology

_PAIRWISE_TAG = 7_301  # our own tags, apart from the ring's (pipesgd.comm.topology) and from user traffic

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
    sizes = [payload.numel() for payload in outgoing]
    send = span = _span(outgoing)  # the payloads in order in the codec's own buffer (one batched encode), or None
    if span is None or topology.stages(device):  # a blocking copy when staged: gloo reads the host buffer once posted
        send = topology.wire_buffer("alltoall-send", sum(sizes), device)
        if span is not None:  # one device-to-host copy (and one wait) for all the payloads
            send.copy_(span)
        else:
            torch._foreach_copy_(views_at(send, [sum(sizes[:q]) for q in range(len(sizes))], sizes), outgoing)
    recv = topology.wire_buffer("alltoall-recv", sum(incoming_bytes), device)
    work = dist.all_to_all_single(recv, send, list(incoming_bytes), sizes, group=topology.group, async_op=True)
    _wait(work, while_waiting)
    return views_at(_arrived(topology, recv, device), [sum(incoming_bytes[:q]) for q in range(len(incoming_bytes))],
                    incoming_bytes)


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
    if topology.stages(device):
        return _gather_by_alltoall(topology, payload, sizes, device, while_waiting)
    return _gather_native(topology, payload, sizes, device, while_waiting)


def _gather_native(topology: RingTopology, payload: torch.Tensor, sizes: list[int], device: torch.device,
                   while_waiting: Callable[[], None] | None) -> list[torch.Tensor]:
    """``all_gather_payload`` as the backend's all-gather of equal slots of ``max(sizes)`` bytes."""
    slot = max(sizes)
    send = topology.wire_buffer("allgather-send", slot, device)
    send[: payload.numel()].copy_(payload)
    send[payload.numel() :].zero_()  # the pad: never decoded, zeroed so the bytes on the wire are deterministic
    recv = topology.wire_buffer("allgather-recv", slot * len(sizes), device)
    work = _ALL_GATHER(recv, send, group=topology.group, async_op=True)
    _wait(work, while_waiting)
    return views_at(_arrived(topology, recv, device), [q * slot for q in range(len(sizes))], sizes)


def _gather_by_alltoall(topology: RingTopology, payload: torch.Tensor, sizes: list[int], device: torch.device,
                        while_waiting: Callable[[], None] | None) -> list[torch.Tensor]:
    """``all_gather_payload`` as an all-to-all: the payload, padded to ``max(sizes)``, goes to each of the p-1 other
    ranks (nothing to itself); rank q's arrives at the (q-1)-th slot if q > rank, else the q-th. Own entry:
    ``payload``."""
    p, r, slot = len(sizes), topology.rank, max(sizes)
    send = topology.wire_buffer("allgather-send", (p - 1) * slot, device)
    send[: payload.numel()].copy_(payload)  # once from the device when staged; the copies below stay on the host
    send[payload.numel() : slot].zero_()  # the pad: never decoded, zeroed so the bytes on the wire are deterministic
    if p > 2:  # the other p-2 slots in one copy (a kernel or memcpy per slot would grow with p)
        send[slot:].view(p - 2, slot).copy_(send[:slot].expand(p - 2, slot))
    recv = topology.wire_buffer("allgather-recv", (p - 1) * slot, device)
    splits = [0 if q == r else slot for q in range(p)]
    work = dist.all_to_all_single(recv, send, splits, splits, group=topology.group, async_op=True)
    _wait(work, while_waiting)
    parts = views_at(_arrived(topology, recv, device), [k * slot for k in range(p - 1)],
                     [sizes[q] for q in range(p) if q != r])
    return parts[:r] + [payload] + parts[r:]


def pairwise_payloads(
    topology: RingTopology,
    outgoing: list[torch.Tensor],
    incoming_bytes: list[int],
    device: torch.device,
    on_receive: Callable[[int, torch.Tensor], None],
    while_waiting: Callable[[], None] | None = None,
    collective: int = 0,
) -> None:
    """``all_to_all_payloads``' bytes (or an all-gather's) in p-1 rounds of one peer each, on gloo with host tensors:
    round i sends ``outgoing[r+i]`` and receives ``incoming_bytes[r-i]`` bytes from rank r-i, so every link carries
    one flow at a time (``pipesgd.comm.topology.PAIRWISE_MIN_BYTES`` says why). Round i's arrivals go to
    ``on_receive(q, payload)`` (views into a reused buffer) while round i+1 is on the wire; ``while_waiting`` runs
    once round 1 is posted and may fill in later rounds' ``outgoing``. ``collective`` keeps tags apart."""
    p, r, group = topology.size, topology.rank, topology.group
    starts = [sum(incoming_bytes[:q]) for q in range(p)]
    recv = topology.wire_buffer(f"pairwise-recv-{collective}", sum(incoming_bytes), device)
    tag = _PAIRWISE_TAG + collective
    arrived: tuple[int, torch.Tensor] | None = None
    for i in range(1, p):
        to, frm = (r + i) % p, (r - i) % p
        into = recv[starts[frm] : starts[frm] + incoming_bytes[frm]]
        works = []
        if into.numel():  # the receive first, as the ring posts it
            works.append(dist.irecv(into, dist.get_global_rank(group, frm), group=group, tag=tag))
        if outgoing[to].numel():
            works.append(dist.isend(outgoing[to], dist.get_global_rank(group, to), group=group, tag=tag))
        if i == 1 and while_waiting is not None:
            while_waiting()
        if arrived is not None:
            on_receive(*arrived)
        with phases.timed("wire_wait"):
            for work in works:
                work.wait()
        arrived = (frm, into)
    if arrived is not None:
        on_receive(*arrived)


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


def _span(payloads: list[torch.Tensor]) -> torch.Tensor | None:
    """The non-empty ``payloads`` as one 1-D view when each starts where the one before ends in one storage (the rows
    of one batched encode), else None."""
    full = [payload for payload in payloads if payload.numel()]
    if not full or full[0].dim() != 1 or full[0].stride(0) != 1 or not all(map(follows, full, full[1:])):
        return None
    return torch.as_strided(full[0], (sum(t.numel() for t in full),), (1,))
