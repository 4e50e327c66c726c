"""Who a rank sends to and receives from in a ring over one process group, and how one hop's bytes cross
the wire: receives posted first on gloo, send/recv pairs batched on NCCL, gloo+CUDA staged through pinned host
buffers that are reused from call to call (``wire_buffer`` lends such buffers to whole-group collectives too).
"""
from __future__ import annotations

import ipaddress
import os
from typing import Callable

import torch
import torch.distributed as dist

from pipesgd.runlog import phases

_TAG = 7_201  # a tag of our own so user point-to-point traffic on the same group cannot be matched

# The exchange's collectives go one peer at a time (``RingTopology.sends_pairwise``) from this many payload bytes per
# peer, as MPICH's all-to-all sends long messages in pairwise rounds to keep one flow per link (Thakur, Rabenseifner
# and Gropp 2005; the bound is MPICH's medium/long one). Between emulated nodes one flow per link beat gloo's
# concurrent flows for long payloads; on one host it does not (``launched_on_one_host``;
# experiments/results/bench_allreduce_choice/report.md).
PAIRWISE_MIN_BYTES = 32 * 1024


def launched_on_one_host(environ=os.environ) -> bool:
    """Whether the launcher's environment says every rank runs on this host, in this network namespace (torchrun's
    ``LOCAL_WORLD_SIZE`` equal to ``WORLD_SIZE``, or a loopback ``MASTER_ADDR``): there no link is shared, so pairwise
    rounds only add waits. Every rank reads the same answer. Unknown (another launcher): False."""
    local, world = environ.get("LOCAL_WORLD_SIZE"), environ.get("WORLD_SIZE")
    if local is not None and local == world:
        return True
    address = environ.get("MASTER_ADDR", "").strip().strip("[]")
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class HostStaging:
    """Host buffers that gloo reads and writes for CUDA tensors, one per (direction, piece) slot, kept between calls and
    grown on demand; pinned when CUDA is present (a plain DMA, no allocation and page faults per hop). A slot is
    reused only after the hop that used it has waited for its send and copied its receive out."""

    def __init__(self, pinned: bool | None = None) -> None:
        self.pinned = torch.cuda.is_available() if pinned is None else pinned
        self._slots: dict[tuple[str, int, torch.dtype], torch.Tensor] = {}

    def slot(self, direction: str, k: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        key = (direction, k, dtype)
        buf = self._slots.get(key)
        if buf is None or buf.numel() < numel:
            buf = self._slots[key] = torch.empty(numel, dtype=dtype, pin_memory=self.pinned)
        return buf[:numel]


class RingTopology:
    """Who sends to whom in a process group, and how bytes cross the wire (staged via host for gloo+CUDA).

    It keeps receive buffers between calls, so one topology serves one thread. ``batched``: post each piece as one
    ``dist.batch_isend_irecv`` pair (NCCL's unbatched point-to-point ops deadlock when both neighbours are one peer);
    None picks it for NCCL."""

    def __init__(self, group: dist.ProcessGroup | None, batched: bool | None = None) -> None:
        self.group = group
        self._scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._wire: dict[tuple[str, torch.device], torch.Tensor] = {}
        self._staging = HostStaging()
        self._forwarded: torch.cuda.Event | None = None  # the last ring's copies out of its forwarding slots
        self.one_host = launched_on_one_host()
        if group is None or not dist.is_initialized():
            self.rank, self.size = 0, 1
            self._stage_on_host = False
            self.batched = bool(batched)
            self.right = self.left = 0
            return
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.right = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.left = dist.get_global_rank(group, (self.rank - 1) % self.size)
        backend = dist.get_backend(group)
        # Gloo's send/recv read host memory; NCCL's read device memory.
        self._stage_on_host = backend == "gloo"
        self.batched = backend == "nccl" if batched is None else batched

    def scratch(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A receive buffer reused across hops and calls: a fresh allocation of a large bucket costs page faults
        on every call (a large share of a large ring's time on CPU). One topology serves one thread."""
        key = (dtype, device)
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < numel:
            buf = self._scratch[key] = torch.empty(numel, dtype=dtype, device=device)
        return buf[:numel]

    def wire_buffer(self, name: str, n_bytes: int, device: torch.device) -> torch.Tensor:
        """A uint8 buffer that a collective reads or writes, one per ``name``, reused from call to call (grown on
        demand): in pinned host memory when gloo carries CUDA tensors (gloo reads host memory), else on ``device``.
        ``stages(device)`` says which; a buffer is reused only after the collective that used it was waited for."""
        if self.stages(device):
            return self._staging.slot(name, 0, n_bytes, torch.uint8)
        key = (name, device)
        buf = self._wire.get(key)
        if buf is None or buf.numel() < n_bytes:
            buf = self._wire[key] = torch.empty(n_bytes, dtype=torch.uint8, device=device)
        return buf[:n_bytes]

    def forwards_on_host(self, device: torch.device) -> bool:
        """Whether a compressed ring's all-gather keeps what it receives in host memory and forwards it from there
        (``forwarding_slot``), copying it to the device only to decode it, without waiting for that copy: wherever
        payloads are staged."""
        return self.stages(device)

    def forwarding_slot(self, hop: int, piece: int, n_bytes: int) -> torch.Tensor:
        """The pinned host buffer that all-gather hop ``hop`` receives ``piece`` into and the next hop sends it from:
        the device copy that decodes it is queued without waiting, so a slot is written again only once the last
        ring's copies out of it have run (``forwarded``); by then they have, as a whole reduce-scatter came between."""
        if hop == 0 and self._forwarded is not None:
            self._forwarded.synchronize()
            self._forwarded = None
        return self._staging.slot(f"forward-{hop}", piece, n_bytes, torch.uint8)

    def forwarded(self, device: torch.device) -> None:
        """Mark the copies out of the forwarding slots queued so far on ``device``'s current stream (the last mark of
        a ring is what the next ring's first slot waits for)."""
        self._forwarded = torch.cuda.Event()
        self._forwarded.record(torch.cuda.current_stream(device))

    def sends_pairwise(self, device: torch.device, peer_bytes: int) -> bool:
        """Whether the exchange's collectives go one peer at a time, for payloads of up to
        ``peer_bytes`` per peer: only on host memory over gloo (NCCL's unbatched pairs can deadlock; staged payloads
        keep the collectives), and by default for payloads of ``PAIRWISE_MIN_BYTES`` per peer or more between hosts
        (not where the launcher says all ranks share this one, ``launched_on_one_host``)."""
        if self.batched or self.stages(device) or not self._stage_on_host:  # _stage_on_host: the group runs gloo
            return False
        return peer_bytes >= PAIRWISE_MIN_BYTES and not self.one_host

    def stages(self, device: torch.device) -> bool:
        """Whether bytes for tensors on ``device`` travel through host buffers (gloo with CUDA tensors)."""
        return self._stage_on_host and device.type == "cuda"

    def exchange_pieces(
        self,
        n_send: int,
        make_payload: Callable[[int], torch.Tensor],
        recv_bufs: list[torch.Tensor],
        on_receive: Callable[[int, torch.Tensor], None],
        while_waiting: Callable[[], None] | None = None,
    ) -> list[torch.Tensor]:
        """One hop: send ``n_send`` pieces to the right neighbour while receiving ``recv_bufs`` from the left.

        Piece k is built and sent while the earlier ones are on the wire, and each received piece goes to ``on_receive``
        as it arrives, so coding overlaps the transfer. ``while_waiting`` runs once every send is posted, before any
        receive is waited for. Returns the payloads sent."""
        if self.batched:
            return self._exchange_paired(n_send, make_payload, recv_bufs, on_receive, while_waiting)
        return self._exchange_posted(n_send, make_payload, recv_bufs, on_receive, while_waiting)

    def _exchange_posted(self, n_send, make_payload, recv_bufs, on_receive, while_waiting=None) -> list[torch.Tensor]:
        """Gloo: every receive is posted first (with p = 2 both directions share one gloo connection, and a
        send posted before its matching receive took markedly longer on a shaped link)."""
        recv_wires, recv_ops = [], []
        for k, buf in enumerate(recv_bufs):
            wire = self._recv_wire(k, buf)
            recv_wires.append(wire)
            recv_ops.append(dist.irecv(wire, self.left, group=self.group, tag=_TAG + 1 + k) if wire.numel() else None)
        sent, send_ops = [], []
        for k in range(n_send):
            payload = make_payload(k)
            sent.append(payload)
            wire = self._send_wire(k, payload)
            if wire.numel():
                send_ops.append(dist.isend(wire, self.right, group=self.group, tag=_TAG + 1 + k))
        if while_waiting is not None:
            while_waiting()
        for k, op in enumerate(recv_ops):
            if op is not None:
                with phases.timed("wire_wait"):
                    op.wait()
            self._arrived(k, recv_wires[k], recv_bufs[k], on_receive)
        with phases.timed("wire_wait"):
            for op in send_ops:
                op.wait()
        return sent

    def _exchange_paired(self, n_send, make_payload, recv_bufs, on_receive, while_waiting=None) -> list[torch.Tensor]:
        """NCCL: piece k's send and receive go out as one batch (an NCCL group), so neither direction can
        queue ahead of the other; every batch is posted before the first receive is waited for."""
        sent, posted = [], []
        for k in range(max(n_send, len(recv_bufs))):
            ops = []
            if k < n_send:
                payload = make_payload(k)
                sent.append(payload)
                wire = self._send_wire(k, payload)
                if wire.numel():
                    ops.append(dist.P2POp(dist.isend, wire, self.right, self.group, _TAG + 1 + k))
            recv_wire = self._recv_wire(k, recv_bufs[k]) if k < len(recv_bufs) else None
            if recv_wire is not None and recv_wire.numel():
                ops.append(dist.P2POp(dist.irecv, recv_wire, self.left, self.group, _TAG + 1 + k))
            posted.append((dist.batch_isend_irecv(ops) if ops else [], recv_wire))
        if while_waiting is not None:
            while_waiting()
        for k, (works, recv_wire) in enumerate(posted):
            with phases.timed("wire_wait"):
                for work in works:
                    work.wait()
            if recv_wire is not None:
                self._arrived(k, recv_wire, recv_bufs[k], on_receive)
        return sent

    # -- staging: gloo reads host memory, so CUDA payloads travel through reused pinned host buffers -------
    def _recv_wire(self, k: int, buf: torch.Tensor) -> torch.Tensor:
        if self._stage_on_host and buf.is_cuda:
            return self._staging.slot("recv", k, buf.numel(), buf.dtype)
        return buf

    def _send_wire(self, k: int, payload: torch.Tensor) -> torch.Tensor:
        if self._stage_on_host and payload.is_cuda:
            # A blocking copy: gloo reads the host buffer as soon as the send is posted.
            return self._staging.slot("send", k, payload.numel(), payload.dtype).copy_(payload)
        return payload

    @staticmethod
    def _arrived(k: int, wire: torch.Tensor, buf: torch.Tensor, on_receive) -> None:
        if wire is not buf:
            buf.copy_(wire)  # blocking: the staging slot is free again once this returns
        on_receive(k, buf)
