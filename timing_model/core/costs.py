"""One iteration's communication from the plain parameter records: the allreduce of the whole gradient in
buckets (codec on every hop of our ring, or once at the ends) and the parameter server's push + pull, with the
split a breakdown needs (codec part, last bucket, wire time, message size for the regime label).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..params import ClusterParams, CodecParams, ScheduleParams, ServerParams
from . import collectives, equations

__all__ = ["CommCost", "bucket_count", "regime_of", "allreduce_cost", "ps_cost"]


@dataclass(frozen=True, slots=True)
class CommCost:
    """One iteration's communication: total seconds, the codec part of it, and how it splits."""

    total_s: float  # all communication of one iteration, codec included
    codec_s: float  # encode + decode seconds inside total_s
    last_bucket_s: float  # one bucket's collective (what DDP cannot hide)
    buckets: int  # collective calls per iteration
    message_bytes: float  # bytes of one message on the wire (for the regime label)
    anchor_s: float = 0.0  # of total_s: a measured allreduce at this size less the α-β fit's (``empirical.anchor``)
    wire_s: float = 0.0  # of total_s: the bytes' time on one link, β·bytes without latency or call overhead
    feedback_s: float = 0.0  # of codec_s: the error feedback's work


def bucket_count(grad_bytes: float, bucket_bytes: float) -> int:
    """Collective calls per iteration: the gradient in buckets of ``bucket_bytes`` (0: one bucket)."""
    if bucket_bytes <= 0 or grad_bytes <= 0:
        return 1
    return max(1, math.ceil(grad_bytes / bucket_bytes - 1e-9))


def regime_of(cluster: ClusterParams, message_bytes: float, comm_s: float) -> str:
    """'latency-bound' when one message is shorter than Hockney's n½ = α·B, else 'bandwidth-bound'."""
    if comm_s <= 0:
        return "no-communication"
    half = collectives.hockney_half_size(cluster.latency_s, cluster.bandwidth_Bps)
    return "latency-bound" if message_bytes < half else "bandwidth-bound"


def allreduce_cost(cluster: ClusterParams, codec: CodecParams, schedule: ScheduleParams,
                   collective: str | None = None, per_hop: bool = True) -> CommCost:
    """Allreduce of the whole gradient in buckets, each one collective call of the α-β-γ cost
    (``collectives.ALLREDUCE``) on payload bytes 1/r of the fp32 bytes; codec per hop (our ring) or once at the
    ends (``equations.codec_time``). With ``per_hop`` (our all-reduces: sync and pipe) ``schedule.allreduce`` picks
    the ring or the two-collective exchange, whose codec work is the ring's: each rank encodes p chunks of M/p (p−1
    contributions and its chunk's sum, never its own contribution) and decodes 2p−1 (``pipesgd.comm.alltoall``)."""
    exchange = per_hop and schedule.allreduce == "alltoall"
    algorithm = "exchange" if exchange else collective or cluster.collective
    workers, calls = cluster.nodes, bucket_count(cluster.grad_bytes, schedule.bucket_bytes)
    bucket = cluster.grad_bytes / calls
    reduce_s_per_byte = 0.0 if math.isinf(cluster.reduce_Bps) else 1.0 / cluster.reduce_Bps
    wire_s_per_byte = 1.0 / (cluster.bandwidth_Bps * codec.ratio)  # payload is 1/ratio of the fp32 bytes
    one = collectives.ALLREDUCE[algorithm](workers, bucket, cluster.latency_s, wire_s_per_byte, reduce_s_per_byte,
                                           cluster.overhead_s)
    hop = per_hop and algorithm in ("ring", "exchange")
    codec_s = equations.codec_time(workers, cluster.grad_bytes, codec.encode_Bps, codec.decode_Bps, hop,
                                   codec.feedback_Bps)
    feedback_s = codec_s - equations.codec_time(workers, cluster.grad_bytes, codec.encode_Bps, codec.decode_Bps,
                                                hop) if codec.feedback_Bps < math.inf else 0.0
    split = workers if algorithm in ("ring", "rabenseifner", "exchange") else 1
    wire = collectives.ALLREDUCE[algorithm](workers, bucket, 0.0, wire_s_per_byte) * calls
    return CommCost(one * calls + codec_s, codec_s, one + codec_s / calls, calls, bucket / codec.ratio / split,
                    wire_s=wire, feedback_s=feedback_s)


def ps_cost(cluster: ClusterParams, codec: CodecParams, schedule: ScheduleParams, server: ServerParams,
            asynchronous: bool = False) -> CommCost:
    """Parameter-server push + pull of the whole gradient (``equations.ps_transfer``), codec once at the worker.

    Synchronous: all workers' flows meet at the servers. Asynchronous: one worker's own push and pull
    (server contention is the separate server-link limit, ``equations.ps_server_link``).
    """
    workers, calls = cluster.nodes, bucket_count(cluster.grad_bytes, schedule.bucket_bytes)
    colocated = server.colocated
    if asynchronous:
        workers, colocated = (1, False) if not (colocated and workers == 1) else (1, True)
    bucket = cluster.grad_bytes / calls
    server_Bps = server.server_bandwidth_Bps or cluster.bandwidth_Bps
    reduce_s_per_byte = 0.0 if math.isinf(server.server_reduce_Bps) else 1.0 / server.server_reduce_Bps
    directions = 2.0 if server.serialised else 1.0
    one = equations.ps_transfer(workers, bucket / codec.ratio, cluster.latency_s, cluster.bandwidth_Bps, server_Bps,
                                server.servers, directions, reduce_s_per_byte * codec.ratio, cluster.overhead_s,
                                colocated)
    # once at the worker, one encode and one decode of the whole gradient (the 2 only matters per hop)
    codec_s = equations.codec_time(2, cluster.grad_bytes, codec.encode_Bps, codec.decode_Bps, False,
                                   codec.feedback_Bps) if one else 0.0
    return CommCost(one * calls + codec_s, codec_s, one + codec_s / calls, calls, bucket / codec.ratio)
