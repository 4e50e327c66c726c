"""Ring AllReduce over torch.distributed point-to-point, with a codec on every hop.

Algorithm (rank r of p, chunk c = the c-th of p near-equal slices of the flat tensor):
  Step 1 (reduce-scatter, p-1 hops): at hop s send chunk (r-s) mod p to the right neighbour, receive
          chunk (r-s-1) mod p from the left one, and add it in the working dtype (fp32/fp64).
          A lossy codec compresses before every send and decompresses after every receive.
  Step 2: rank r now owns the fully reduced chunk (r+1) mod p. It scales it by 1/p for a mean and, with a
          lossy codec, replaces it by decode(encode(chunk)) so the owner applies the same bits it sends.
  Step 3 (all-gather, p-1 hops): payloads are forwarded unchanged around the ring and decoded once on
          arrival, so every rank ends with bit-identical results (essential with stochastic rounding).
A compressed hop travels in pieces of about a MiB: piece k+1 is encoded while piece k is on the wire, and
each received piece is decoded while the next one arrives, so the codec overlaps the transfer.
With error feedback, the residual of the local input is added before Step 1 and every encode's error
(x - decode(encode(x))) is added back into the residual at that chunk's position, so the sum over ranks of
next iteration's inputs carries this iteration's total compression error.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from pipesgd.buckets import working_dtype
from pipesgd.compression import Compressor, ChunkContext, build
from pipesgd.handles import CompletedWork, Work

_TAG = 7_201  # a tag of our own so user point-to-point traffic on the same group cannot be matched


@dataclass(slots=True)
class RingReport:
    """What one ring did: payload bytes sent, the bytes an uncompressed ring would have sent, busy time."""

    bytes_sent: int = 0
    raw_bytes: int = 0
    busy_s: float = 0.0

    def add(self, other: "RingReport") -> None:
        self.bytes_sent += other.bytes_sent
        self.raw_bytes += other.raw_bytes
        self.busy_s += other.busy_s


class RingTopology:
    """Who sends to whom in a process group, and how bytes cross the wire (staged via host for gloo+CUDA)."""

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


def chunk_bounds(numel: int, parts: int) -> list[int]:
    """Boundaries of ``parts`` near-equal slices of ``numel`` elements (sizes differ by at most one)."""
    return [(i * numel) // parts for i in range(parts + 1)]


PIECE_ELEMENTS = 1 << 18  # 256 Ki elements (1 MiB of fp32) per piece of a compressed hop
MAX_PIECES = 8


def pieces(chunk: torch.Tensor) -> list[torch.Tensor]:
    """A chunk split into the pieces a compressed hop sends one by one; a function of its length only,
    so sender and receiver split alike."""
    count = max(1, min(MAX_PIECES, chunk.numel() // PIECE_ELEMENTS))
    b = chunk_bounds(chunk.numel(), count)
    return [chunk[b[j] : b[j + 1]] for j in range(count)]


def ring_allreduce_(
    flat: torch.Tensor,
    compressor: Compressor,
    topology: RingTopology,
    op: str = "mean",
    residual: torch.Tensor | None = None,
) -> RingReport:
    """All-reduce the contiguous 1-D ``flat`` (fp32/fp64) in place; returns what it sent and how long it took."""
    start = time.perf_counter()
    report = RingReport()
    p, r = topology.size, topology.rank
    if residual is not None:
        flat.add_(residual)
        residual.zero_()
    bounds = chunk_bounds(flat.numel(), p)
    chunk = [flat[bounds[i] : bounds[i + 1]] for i in range(p)]
    lossless = compressor.lossless
    item = flat.element_size()

    def residual_pieces(i: int) -> list[torch.Tensor | None]:
        if residual is None:
            return [None] * len(pieces(chunk[i]))
        return pieces(residual[bounds[i] : bounds[i + 1]])

    def encode(x: torch.Tensor, res: torch.Tensor | None) -> torch.Tensor:
        payload, _ = compressor.compress(x)
        if res is not None:
            res.add_(x - decode(payload, x))
        return payload

    def decode(payload: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return compressor.decompress(payload, ChunkContext(like.numel(), flat.dtype, flat.device))

    def receive_buffers(i: int) -> list[torch.Tensor]:
        return [torch.empty(compressor.payload_bytes(x.numel(), flat.dtype), dtype=torch.uint8, device=flat.device)
                for x in pieces(chunk[i])]

    # Step 1: reduce-scatter.
    for s in range(p - 1):
        send_i, recv_i = (r - s) % p, (r - s - 1) % p
        if lossless:
            incoming = topology.scratch(chunk[recv_i].numel(), flat.dtype, flat.device)
            topology.exchange_pieces(1, lambda _: chunk[send_i], [incoming],
                                     lambda _, received: chunk[recv_i].add_(received))
            report.bytes_sent += chunk[send_i].numel() * item
        else:
            xs, rs, targets = pieces(chunk[send_i]), residual_pieces(send_i), pieces(chunk[recv_i])
            sent = topology.exchange_pieces(
                len(xs), lambda k: encode(xs[k], rs[k]), receive_buffers(recv_i),
                lambda k, buf: targets[k].add_(decode(buf, targets[k])))
            report.bytes_sent += sum(payload.numel() for payload in sent)
        report.raw_bytes += chunk[send_i].numel() * item

    # Step 2: the owned chunk becomes final (scaled for a mean; decode(encode(.)) for a lossy codec).
    own = (r + 1) % p
    if op == "mean" and p > 1:
        chunk[own].div_(p)
    forward: list[torch.Tensor] = []
    if p > 1 and not lossless:
        # The residual lives in "sum" units: the owner's error of a mean counts p times.
        scale = p if op == "mean" else 1
        for x, res in zip(pieces(chunk[own]), residual_pieces(own)):
            payload, _ = compressor.compress(x)
            decoded = decode(payload, x)
            if res is not None:
                res.add_((x - decoded) * scale)
            x.copy_(decoded)
            forward.append(payload)

    # Step 3: all-gather; lossy payloads are forwarded unchanged and decoded once.
    for s in range(p - 1):
        send_i, recv_i = (r + 1 - s) % p, (r - s) % p
        if lossless:
            # Received straight into place: nothing to do on arrival.
            topology.exchange_pieces(1, lambda _: chunk[send_i], [chunk[recv_i]], lambda _, received: None)
            report.bytes_sent += chunk[send_i].numel() * item
        else:
            incoming, targets, outgoing = receive_buffers(recv_i), pieces(chunk[recv_i]), forward
            topology.exchange_pieces(len(outgoing), outgoing.__getitem__, incoming,
                                     lambda k, buf: targets[k].copy_(decode(buf, targets[k])))
            report.bytes_sent += sum(payload.numel() for payload in outgoing)
            forward = incoming
        report.raw_bytes += chunk[send_i].numel() * item
    report.busy_s = time.perf_counter() - start
    return report


_per_thread = threading.local()


def _topology_for(group: dist.ProcessGroup | None) -> RingTopology:
    """One cached topology (and scratch buffer) per group and calling thread."""
    cache = _per_thread.__dict__.setdefault("topologies", {})
    topology = cache.get(group)
    if topology is None or (group is not None and not dist.is_initialized()):
        topology = cache[group] = RingTopology(group)
    return topology


def backend_allreduce_(flat: torch.Tensor, topology: RingTopology, op: str = "mean") -> RingReport:
    """The backend's own all_reduce on ``flat`` in place: the uncompressed fast path (gloo and NCCL run a
    ring in C++, without a Python round trip per hop, which is what small messages are dominated by)."""
    start = time.perf_counter()
    p = topology.size
    report = RingReport()
    if p > 1:
        dist.all_reduce(flat, group=topology.group)
        if op == "mean":
            flat.div_(p)
        # A ring all-reduce sends 2(p-1)/p of the message per rank (gloo's and NCCL's large-message case).
        report.bytes_sent = report.raw_bytes = 2 * (p - 1) * flat.numel() * flat.element_size() // p
    report.busy_s = time.perf_counter() - start
    return report


def resolve_compressor(compression: str | Compressor) -> Compressor:
    return build(compression) if isinstance(compression, str) else compression


def ring_allreduce(
    tensor: torch.Tensor,
    compression: str | Compressor = "none",
    op: str = "mean",
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
) -> torch.Tensor | Work[torch.Tensor]:
    """All-reduce ``tensor`` in place with our ring (fp32/fp64/bf16/fp16, any size, any p).

    ``op`` is "mean" or "sum". With ``async_op=True`` the ring runs on the process's background
    communication worker and a handle is returned whose ``wait()`` gives the tensor; do not touch
    ``tensor`` or issue other collectives on ``group`` until then. Returns ``tensor``.
    """
    if op not in ("mean", "sum"):
        raise ValueError(f"op must be 'mean' or 'sum', got {op!r}")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"ring_allreduce needs a torch.Tensor, got {type(tensor).__name__}")
    dtype = working_dtype(tensor.dtype)
    compressor = resolve_compressor(compression)
    if group is None and dist.is_initialized():
        group = dist.group.WORLD
    topology = _topology_for(group) if not async_op else RingTopology(group)

    def run() -> torch.Tensor:
        in_place = tensor.is_contiguous() and tensor.dtype == dtype
        work = tensor.detach().view(-1) if in_place else tensor.detach().reshape(-1).to(dtype).contiguous()
        ring_allreduce_(work, compressor, topology, op)
        if not in_place:
            tensor.copy_(work.view(tensor.shape))
        return tensor

    if not async_op:
        return run()
    if topology.size == 1:
        return CompletedWork(run())
    from pipesgd.comm_worker import default_worker

    return default_worker(tensor.device).submit(run)
