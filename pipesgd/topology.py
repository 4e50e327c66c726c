"""Who a rank sends to and receives from in a ring over one process group, and how one hop's bytes cross
the wire (posted receives, pieces sent while earlier ones travel, staging through the host for gloo+CUDA).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

_TAG = 7_201  # a tag of our own so user point-to-point traffic on the same group cannot be matched


class RingTopology:
    """Who sends to whom in a process group, and how bytes cross the wire (staged via host for gloo+CUDA).

    It keeps receive buffers between calls, so one topology serves one thread: the background worker that
    runs a group's rings (``pipesgd.channel``) or one caller of the synchronous ``ring_allreduce``.
    """

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self._scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        if group is None or not dist.is_initialized():
            self.rank, self.size = 0, 1
            self._stage_on_host = False
            self.right = self.left = 0
            return
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.right = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.left = dist.get_global_rank(group, (self.rank - 1) % self.size)
        # Gloo's send/recv read host memory; NCCL's read device memory.
        self._stage_on_host = dist.get_backend(group) == "gloo"

    def scratch(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A receive buffer reused across hops and calls: fresh 10-100 MB allocations cost page faults
        on every call (a third of a large ring's time on CPU). One topology serves one thread."""
        key = (dtype, device)
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < numel:
            buf = self._scratch[key] = torch.empty(numel, dtype=dtype, device=device)
        return buf[:numel]

    def exchange_pieces(
        self,
        n_send: int,
        make_payload: Callable[[int], torch.Tensor],
        recv_bufs: list[torch.Tensor],
        on_receive: Callable[[int, torch.Tensor], None],
    ) -> list[torch.Tensor]:
        """One hop: send ``n_send`` pieces to the right neighbour while receiving ``recv_bufs`` from the left.

        Every receive is posted first (with p = 2 both directions share one gloo connection, and a send
        posted before its matching receive took ~1.8x longer for 4 MB on a shaped link). Piece k is built
        and sent while the earlier ones are on the wire, and each received piece goes to ``on_receive`` as
        it arrives, so encoding and decoding overlap the transfer. Returns the payloads sent."""
        stage = self._stage_on_host
        recv_wires, recv_ops = [], []
        for k, buf in enumerate(recv_bufs):
            wire = torch.empty(buf.shape, dtype=buf.dtype) if stage and buf.is_cuda else buf
            recv_wires.append(wire)
            recv_ops.append(dist.irecv(wire, self.left, group=self.group, tag=_TAG + 1 + k) if wire.numel() else None)
        sent, send_ops = [], []
        for k in range(n_send):
            payload = make_payload(k)
            sent.append(payload)
            wire = payload.cpu() if stage and payload.is_cuda else payload
            if wire.numel():
                send_ops.append((dist.isend(wire, self.right, group=self.group, tag=_TAG + 1 + k), wire))
        for k, op in enumerate(recv_ops):
            if op is not None:
                op.wait()
            if recv_wires[k] is not recv_bufs[k]:
                recv_bufs[k].copy_(recv_wires[k], non_blocking=False)
            on_receive(k, recv_bufs[k])
        for op, _wire in send_ops:
            op.wait()
        return sent
