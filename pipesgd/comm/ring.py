"""Ring AllReduce over torch.distributed point-to-point, with a codec on every hop.

Algorithm (rank r of p, chunk c = the c-th of p near-equal slices of the flat tensor):
  Step 1 (reduce-scatter, p-1 hops): at hop s send chunk (r-s) mod p to the right neighbour, receive
          chunk (r-s-1) mod p from the left one, and add it in the working dtype (fp32/fp64).
          A lossy codec compresses before every send and decompresses after every receive.
  Step 2: rank r now owns the fully reduced chunk (r+1) mod p. It scales it by 1/p for a mean and, with a
          lossy codec, replaces it by decode(encode(chunk)) so the owner applies the same bits it sends.
  Step 3 (all-gather, p-1 hops): payloads are forwarded unchanged around the ring and decoded once on
          arrival, so every rank ends with bit-identical results (essential with stochastic rounding).
On CPU a compressed hop travels in pieces (``piece_bounds``), so coding overlaps the wire. Every encode goes
through one ``HopEncoder`` per ring, which owns error feedback; the ring itself never touches a residual."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from pipesgd.runlog import phases
from pipesgd.grads.buckets import working_dtype
from pipesgd.comm.channel import channel_for
from pipesgd.compression import Compressor, build, open_encoder
from pipesgd.comm.groups import require_group
from pipesgd.comm.handles import Work
from pipesgd.comm.topology import RingTopology

__all__ = [
    "RingReport",
    "RingTopology",
    "backend_allreduce_",
    "chunk_bounds",
    "pieces",
    "ring_allreduce",
    "ring_allreduce_",
    "run_allreduce",
]


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


def chunk_bounds(numel: int, parts: int) -> list[int]:
    """Boundaries of ``parts`` near-equal slices of ``numel`` elements (sizes differ by at most one)."""
    return [(i * numel) // parts for i in range(parts + 1)]


PIECE_ELEMENTS = 1 << 18  # 256 Ki elements (1 MiB of fp32) per piece of a compressed hop on CPU
MAX_PIECES = 8


def piece_bounds(numel: int, on_gpu: bool = False) -> list[int]:
    """Boundaries of the pieces a compressed hop sends one by one, a function of the chunk's length and device only,
    so sender and receiver split alike. On a GPU a hop is one piece: the codec is far faster than the wire, and each
    piece costs a blocking staging copy and many kernel launches (experiments/results/gpu/README.md)."""
    count = 1 if on_gpu else max(1, min(MAX_PIECES, numel // PIECE_ELEMENTS))
    return chunk_bounds(numel, count)


def pieces(chunk: torch.Tensor) -> list[torch.Tensor]:
    """A chunk split into the pieces a compressed hop sends one by one (views)."""
    b = piece_bounds(chunk.numel(), chunk.is_cuda)
    return [chunk[b[j] : b[j + 1]] for j in range(len(b) - 1)]


def ring_allreduce_(
    flat: torch.Tensor,
    compressor: Compressor,
    topology: RingTopology,
    op: str = "mean",
    residual: torch.Tensor | None = None,
) -> RingReport:
    """All-reduce the contiguous 1-D ``flat`` (fp32/fp64) in place; returns what it sent and how long it took.

    ``residual``: this rank's error-feedback buffer for ``flat`` (``ErrorFeedback.residual``), or None."""
    start = time.perf_counter()
    report = RingReport()
    p, r = topology.size, topology.rank
    # Deferred: error feedback folds each chunk just in time and books its errors while the wire is busy.
    encoder = open_encoder(compressor, flat, residual, mean_over=p if op == "mean" else 1, deferred=True)
    bounds = chunk_bounds(flat.numel(), p)
    chunk = [flat[bounds[i] : bounds[i + 1]] for i in range(p)]
    lossless = compressor.lossless
    item = flat.element_size()
    # Every chunk gets last ring's residual before it is encoded or receives anything (the same sums as folding
    # the whole tensor first): the first one sent at once, the others while hop 0 waits on the wire.
    first = r % p
    encoder.fold_(flat if lossless else chunk[first], 0 if lossless else bounds[first])
    unfolded = [] if lossless else [i for i in range(p) if i != first]

    def fold_rest_and_drain() -> None:
        for i in unfolded:
            encoder.fold_(chunk[i], bounds[i])
        unfolded.clear()
        encoder.drain()

    def placed_pieces(i: int) -> list[tuple[int, torch.Tensor]]:
        """Chunk i's pieces with their positions in ``flat`` (where the encoder books their error)."""
        b = piece_bounds(chunk[i].numel(), flat.is_cuda)
        return [(bounds[i] + b[j], chunk[i][b[j] : b[j + 1]]) for j in range(len(b) - 1)]

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
            outgoing, targets = placed_pieces(send_i), pieces(chunk[recv_i])
            sent = topology.exchange_pieces(
                len(outgoing), lambda k: encoder.encode(outgoing[k][1], outgoing[k][0]), receive_buffers(recv_i),
                lambda k, buf: targets[k].add_(encoder.decode(buf, targets[k])), fold_rest_and_drain)
            report.bytes_sent += sum(payload.numel() for payload in sent)
        report.raw_bytes += chunk[send_i].numel() * item

    # Step 2: the owned chunk becomes final (scaled for a mean; decode(encode(.)) for a lossy codec).
    own = (r + 1) % p
    if op == "mean" and p > 1:
        chunk[own].div_(p)
    forward: list[torch.Tensor] = []
    if p > 1 and not lossless:
        # Encoded now, settled in place (and, with feedback, booked) while all-gather hop 0 waits on the wire.
        forward = [encoder.settle_(x, position) for position, x in placed_pieces(own)]

    # Step 3: all-gather; lossy payloads are forwarded unchanged and decoded once. Where gloo carries CUDA tensors
    # they stay in host memory and are forwarded from there, their decode queued behind a copy nobody waits for:
    # the hop then never waits for the GPU, whose queue the training step fills (one sync per hop otherwise).
    on_host = not lossless and topology.forwards_on_host(flat.device)

    def decode_into(target: torch.Tensor, payload: torch.Tensor) -> None:
        encoder.decode_into(payload.to(flat.device, non_blocking=True), target)
        if on_host:  # marked after every copy out of a slot, so even a ring that fails later leaves no copy unmarked
            topology.forwarded(flat.device)

    for s in range(p - 1):
        send_i, recv_i = (r + 1 - s) % p, (r - s) % p
        if lossless:
            # Received straight into place: nothing to do on arrival.
            topology.exchange_pieces(1, lambda _: chunk[send_i], [chunk[recv_i]], lambda _, received: None)
            report.bytes_sent += chunk[send_i].numel() * item
        else:
            targets, outgoing = pieces(chunk[recv_i]), forward
            incoming = ([topology.forwarding_slot(s, k, compressor.payload_bytes(x.numel(), flat.dtype))
                         for k, x in enumerate(targets)] if on_host else receive_buffers(recv_i))
            topology.exchange_pieces(len(outgoing), outgoing.__getitem__, incoming,
                                     lambda k, buf: decode_into(targets[k], buf), encoder.drain)
            report.bytes_sent += sum(payload.numel() for payload in outgoing)
            forward = incoming
        report.raw_bytes += chunk[send_i].numel() * item
    encoder.drain()  # nothing is left at p > 1 (hop 0 of each phase drained); kept so no path can skip it
    report.busy_s = time.perf_counter() - start
    return report


def backend_allreduce_(flat: torch.Tensor, topology: RingTopology, op: str = "mean") -> RingReport:
    """The backend's own all_reduce on ``flat`` in place: the uncompressed fast path (gloo and NCCL run a
    ring in C++, without a Python round trip per hop, which is what small messages are dominated by)."""
    start = time.perf_counter()
    p = topology.size
    report = RingReport()
    if p > 1:
        with phases.timed("wire_wait"):  # the backend's C++ ring: its wire time and its adds, not told apart
            dist.all_reduce(flat, group=topology.group, async_op=True).wait()  # the wait holds no interpreter lock
        if op == "mean":
            flat.div_(p)
        # A ring all-reduce sends 2(p-1)/p of the message per rank (gloo's and NCCL's large-message case).
        report.bytes_sent = report.raw_bytes = 2 * (p - 1) * flat.numel() * flat.element_size() // p
    report.busy_s = time.perf_counter() - start
    return report


# ------------------------------------------------------------------------------ the public entry point
_per_thread = threading.local()


def _topology_for(group: dist.ProcessGroup | None) -> RingTopology:
    """One cached topology (and scratch buffer) per group and calling thread, for synchronous calls."""
    cache = _per_thread.__dict__.setdefault("topologies", {})
    topology = cache.get(group)
    if topology is None or (group is not None and not dist.is_initialized()):
        topology = cache[group] = RingTopology(group)
    return topology


def resolve_compressor(compression: str | Compressor) -> Compressor:
    return build(compression) if isinstance(compression, str) else compression


def ring_allreduce(
    tensor: torch.Tensor,
    compression: str | Compressor = "none",
    op: str = "mean",
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
) -> torch.Tensor | Work[torch.Tensor]:
    """All-reduce ``tensor`` in place with our ring (fp32/fp64/bf16/fp16, any size, any p); returns ``tensor``.

    ``op`` is "mean" or "sum". With ``async_op=True`` the ring runs on the worker of ``group``'s shared channel
    (``channel_for``) and a handle is returned whose ``wait()`` gives the tensor: async rings on one group run in
    the order issued, which every rank must share. Until ``wait()`` returns, touch neither ``tensor`` nor ``group``
    from this thread."""
    return run_allreduce(ring_allreduce_, "ring_allreduce", tensor, compression, op, group, async_op)


def run_allreduce(
    algorithm: Callable[[torch.Tensor, Compressor, RingTopology, str], RingReport],
    caller: str,
    tensor: torch.Tensor,
    compression: str | Compressor,
    op: str,
    group: dist.ProcessGroup | None,
    async_op: bool,
) -> torch.Tensor | Work[torch.Tensor]:
    """A public all-reduce entry point (``ring_allreduce``, ``pipesgd.comm.alltoall.alltoall_allreduce``): checks its
    arguments, runs ``algorithm`` on a flat working copy (or the tensor itself) now or on the group's channel."""
    if op not in ("mean", "sum"):
        raise ValueError(f"op must be 'mean' or 'sum', got {op!r}")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{caller} needs a torch.Tensor, got {type(tensor).__name__}")
    dtype = working_dtype(tensor.dtype)
    compressor = resolve_compressor(compression)
    group = require_group(group, caller)

    def run(topology: RingTopology) -> torch.Tensor:
        in_place = tensor.is_contiguous() and tensor.dtype == dtype
        work = tensor.detach().view(-1) if in_place else tensor.detach().reshape(-1).to(dtype).contiguous()
        algorithm(work, compressor, topology, op)
        if not in_place:
            tensor.copy_(work.view(tensor.shape))
        return tensor

    if not async_op:
        return run(_topology_for(group))
    channel = channel_for(group, tensor.device)
    return channel.submit(run, channel.topology)
