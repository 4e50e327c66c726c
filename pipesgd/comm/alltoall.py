"""A compressed all-reduce in two collectives (an all-to-all, then an all-gather), beside the paper's per-hop ring:
every contribution is encoded once and the sum once (the ring re-encodes a growing partial sum at each hop), as in
DeepSpeed's ``compressed_allreduce`` and CGX, with the ring's bytes on the wire. Rank r of p owns chunk r:
  Step 1: encode each chunk c != r once; its owner's own chunk never needs encoding (it has the exact values).
  Step 2 (all-to-all): send chunk c's payload to rank c; receive every other rank's payload of chunk r.
  Step 3: sum chunk r in the working dtype (fp32/fp64): the exact own chunk first, then the decoded payloads in
          rank order; divide by p for a mean.
  Step 4: encode the sum once and replace chunk r by decode(encode(sum)), so the owner applies exactly the bits
          every other rank decodes (replicas stay bitwise identical, stochastic rounding included).
  Step 5 (all-gather): every rank's payload of its chunk reaches every rank.
  Step 6: decode each chunk c != r in place.
Both collectives may go one peer at a time (``RingTopology.sends_pairwise``), with the same bits. Steps 1, 3 and 6
batch their codec calls (``pipesgd.compression.rows``). Error feedback books what Step 1 dropped at the chunks others
own and what Step 4 dropped at chunk r, in one residual buffer per bucket (docs/architecture.md).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from pipesgd.compression import Compressor
from pipesgd.compression.error_feedback import open_encoder
from pipesgd.compression.rows import views_at
from pipesgd.comm.handles import Work
from pipesgd.comm.payload_collectives import all_gather_payload, all_to_all_payloads, pairwise_payloads
from pipesgd.comm.ring import RingReport, chunk_bounds, run_allreduce
from pipesgd.comm.topology import RingTopology

__all__ = ["alltoall_allreduce", "alltoall_allreduce_"]


def alltoall_allreduce_(
    flat: torch.Tensor,
    compressor: Compressor,
    topology: RingTopology,
    op: str = "mean",
    residual: torch.Tensor | None = None,
) -> RingReport:
    """``ring_allreduce_``'s contract (``flat`` reduced in place, ``residual`` this rank's error-feedback buffer or
    None, a ``RingReport`` back), in the two collectives of the module doc."""
    p, r = topology.size, topology.rank
    start, report = time.perf_counter(), RingReport()
    # Deferred: the error of each encode is booked while the collective that carries it is on the wire.
    encoder = open_encoder(compressor, flat, residual, mean_over=p if op == "mean" else 1, deferred=True)
    encoder.fold_(flat, 0)  # last call's residuals (worker's and owner's) travel in this one
    if p == 1 or flat.numel() == 0:  # the same on every rank
        return RingReport(busy_s=time.perf_counter() - start)  # exact: nothing to encode, nothing to send
    bounds = chunk_bounds(flat.numel(), p)
    chunk = views_at(flat, bounds[:-1], [bounds[c + 1] - bounds[c] for c in range(p)])
    sizes = [compressor.payload_bytes(x.numel(), flat.dtype) for x in chunk]
    no_bytes = torch.empty(0, dtype=torch.uint8, device=flat.device)
    item = flat.element_size()

    others = [c for c in range(p) if c != r]
    own, pairwise = chunk[r], topology.sends_pairwise(flat.device, max(sizes))
    outgoing = [no_bytes] * p

    def encode(owners: list[int]) -> None:
        """Step 1: each chunk that another rank owns, encoded once (in as few codec calls as the codec allows)."""
        if not owners:
            return
        for c, payload in zip(owners, encoder.encode_chunks([chunk[c] for c in owners], [bounds[c] for c in owners])):
            outgoing[c] = payload

    # Step 2: all-to-all; the encodes' errors are booked meanwhile.
    incoming_bytes = [sizes[r] if q != r else 0 for q in range(p)]
    if pairwise:  # round 1's chunk encoded first, the rest on its wire time; each arrival decoded during the next
        first, decoded = (r + 1) % p, {}

        def decode_arrival(q: int, arrived: torch.Tensor) -> None:
            decoded[q] = encoder.decode(arrived, own)

        def encode_the_rest_and_book() -> None:
            encode([c for c in others if c != first])
            encoder.drain()

        encode([first])
        pairwise_payloads(topology, outgoing, incoming_bytes, flat.device, decode_arrival, encode_the_rest_and_book)
        contributions = [decoded[q] for q in others]
    else:
        encode(others)
        incoming = all_to_all_payloads(topology, outgoing, incoming_bytes, flat.device, encoder.drain)
        contributions = encoder.decode_chunks([incoming[q] for q in others], [own] * len(others))
    report.bytes_sent += sum(payload.numel() for payload in outgoing)
    report.raw_bytes += (flat.numel() - chunk[r].numel()) * item

    # Step 3: the owned chunk's sum, in a fixed order (own exact values first, then by rank).
    for contribution in contributions:
        own.add_(contribution)
    if op == "mean":
        own.div_(p)

    # Step 4: encoded once; a lossy codec's owner settles on the decoded bits (at the drain below, on the wire).
    payload = encoder.encode(own, bounds[r]) if compressor.lossless else encoder.settle_(own, bounds[r])

    # Steps 5 and 6: all-gather, every other chunk decoded in place.
    if pairwise:  # each arrival decoded while the next one is on the wire
        peers_bytes = [0 if q == r else sizes[q] for q in range(p)]
        pairwise_payloads(topology, [no_bytes if q == r else payload for q in range(p)], peers_bytes, flat.device,
                          lambda q, got: encoder.decode_into(got, chunk[q]), encoder.drain, 1)
        report.bytes_sent += (p - 1) * payload.numel()
    else:
        gathered = all_gather_payload(topology, payload, sizes, flat.device, encoder.drain)
        report.bytes_sent += (p - 1) * max(sizes)  # a rank forwards p-1 slots in gloo's and NCCL's ring all-gather
        encoder.decode_chunks_into([gathered[q] for q in others], [chunk[q] for q in others])
    report.raw_bytes += (p - 1) * own.numel() * item
    encoder.drain()  # nothing is left (Step 5 drained); kept so no path can skip it
    report.busy_s = time.perf_counter() - start
    return report


def alltoall_allreduce(
    tensor: torch.Tensor,
    compression: str | Compressor = "none",
    op: str = "mean",
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
) -> torch.Tensor | Work[torch.Tensor]:
    """All-reduce ``tensor`` in place with the two-collective exchange (see module doc); the same contract as
    ``pipesgd.ring_allreduce`` (dtypes, ``op``, ``async_op`` on the group's shared channel). Returns ``tensor``."""
    return run_allreduce(alltoall_allreduce_, "alltoall_allreduce", tensor, compression, op, group, async_op)
