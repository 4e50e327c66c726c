"""A compressed all-reduce in one collective, for small buckets: every rank's whole payload to every rank.

The per-hop ring makes 2(p-1) Python round trips per bucket and the two-collective exchange two collective calls;
for a small bucket those fixed costs, not bytes, set the time (LeNet's q8 ring took 4-7 ms on the H100 host against
1.1-1.3 ms for gloo's own uncompressed all-reduce: about 0.35 ms of Python and loopback round trip per hop,
``experiments/results/gpu/README.md``). Here there is one call, with p-1 payloads per rank on the wire instead of
the ring's 2(p-1)/p, so it pays where latency dominates and loses where bytes do:
  Step 1: encode the whole flat tensor once (error feedback books what the encode dropped, as for the ring).
  Step 2 (all-gather): every rank's payload reaches every rank (``payload_collectives.all_gather_payload``).
  Step 3: decode every payload, one's own too, and sum them in rank order in the working dtype (fp32/fp64); divide
          by p for a mean. Every rank adds the same decoded values in the same order, so replicas stay bitwise
          identical; each contribution is quantized once and the sum never, so the error does not grow with p.
A lossless codec is reduced the same way (its "payload" is the tensor's bytes).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from pipesgd.compression import Compressor
from pipesgd.compression.error_feedback import open_encoder
from pipesgd.comm.handles import Work
from pipesgd.comm.payload_collectives import all_gather_payload
from pipesgd.comm.ring import RingReport, run_allreduce
from pipesgd.comm.topology import RingTopology

__all__ = ["gather_allreduce", "gather_allreduce_"]


def gather_allreduce_(flat: torch.Tensor, compressor: Compressor, topology: RingTopology, op: str = "mean",
                      residual: torch.Tensor | None = None) -> RingReport:
    """``ring_allreduce_``'s contract (``flat`` reduced in place, ``residual`` this rank's error-feedback buffer or
    None, a ``RingReport`` back), in the one collective of the module doc."""
    p = topology.size
    start = time.perf_counter()
    encoder = open_encoder(compressor, flat, residual, mean_over=p if op == "mean" else 1, deferred=True)
    encoder.fold_(flat, 0)  # last call's residual travels in this one
    if p == 1 or flat.numel() == 0:  # the same on every rank
        return RingReport(busy_s=time.perf_counter() - start)  # exact: nothing to encode, nothing to send
    # Step 1
    payload = encoder.encode(flat, 0)
    size = payload.numel()
    # Step 2: the encode's error is booked while the payloads are on the wire.
    gathered = all_gather_payload(topology, payload, [size] * p, flat.device, encoder.drain)
    # Step 3: rank order, so every rank adds the same values in the same order.
    flat.zero_()
    for contribution in encoder.decode_chunks(gathered, [flat] * p):
        flat.add_(contribution)
    if op == "mean":
        flat.div_(p)
    encoder.drain()  # nothing is left (Step 2 drained); kept so no path can skip it
    item = flat.element_size()
    return RingReport(bytes_sent=(p - 1) * size, raw_bytes=(p - 1) * flat.numel() * item,
                      busy_s=time.perf_counter() - start)


def gather_allreduce(tensor: torch.Tensor, compression: str | Compressor = "none", op: str = "mean",
                     group: dist.ProcessGroup | None = None,
                     async_op: bool = False) -> torch.Tensor | Work[torch.Tensor]:
    """All-reduce ``tensor`` in place in one all-gather of payloads (see module doc); the same contract as
    ``pipesgd.ring_allreduce`` (dtypes, ``op``, ``async_op`` on the group's shared channel). Returns ``tensor``."""
    return run_allreduce(gather_allreduce_, "gather_allreduce", tensor, compression, op, group, async_op)
