"""Per-mode iteration time with a named breakdown: ps-sync, ps-async, sync, ddp and pipe.

Each ``predict_<mode>`` is a pure function of the frozen parameter records and returns a
``ModeResult`` whose terms add up to the iteration time:
``iteration_s = compute_s + straggler_s + interference_s + update_s + handoff_s + buffers_s + host_s +
lockstep_s + server_s + exposed_comm_s + codec_s``.
For ps-async the "iteration" is the job's time per step (every worker runs the same steps, the job ends with the
slowest), the time the cluster needs for as many updates as there are workers (the same work as one synchronous
iteration), so throughputs and speedups compare like for like.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from . import collectives, formulas
from .params import ClusterParams, CodecParams, ComputeParams, ScheduleParams, ServerParams
from .straggler import expected_max_normal

__all__ = ["MODES", "ModeResult", "CommCost", "allreduce_cost", "ps_cost", "predict_mode",
           "predict_ps_sync", "predict_ps_async", "predict_sync", "predict_ddp", "predict_pipe"]

MODES = ("ps-sync", "ps-async", "sync", "ddp", "pipe")


@dataclass(frozen=True, slots=True)
class CommCost:
    """One iteration's communication: total seconds, the codec part of it, and how it splits."""

    total_s: float  # all communication of one iteration, codec included
    codec_s: float  # encode + decode seconds inside total_s
    last_bucket_s: float  # one bucket's collective (what DDP cannot hide)
    buckets: int  # collective calls per iteration
    message_bytes: float  # bytes of one message on the wire (for the regime label)
    anchor_s: float = 0.0  # of total_s: the measured allreduce at this size less the α-β fit's (``allreduce_cost``)
    wire_s: float = 0.0  # of total_s: the bytes' time on one link, β·bytes without latency or call overhead


@dataclass(frozen=True, slots=True)
class ModeResult:
    """Predicted steady-state iteration of one training mode; all times in seconds."""

    mode: str
    iteration_s: float  # wall-clock seconds per iteration (sum of the eleven terms below)
    compute_s: float  # mean forward+backward
    straggler_s: float  # extra wait for the slowest worker, E[max] − mean
    interference_s: float  # compute slow-down from communication running alongside
    update_s: float  # optimizer step
    handoff_s: float  # packing gradients into buckets, writing them back, thread hand-off (not hidden)
    buffers_s: float  # blocking sync of module buffers each step (pipe; sync and width 1: what outlasts the ring)
    host_s: float  # measured per-step host work beyond the hand-off estimate (``ComputeParams.host_s``; not hidden)
    lockstep_s: float  # a blocking all-reduce right after compute beyond the two apart, signed (``ComputeParams``)
    server_s: float  # ps-async, ps-sync: the server's service (and queue) beyond the link's push + pull
    exposed_comm_s: float  # transfer, latency and reduction time not hidden behind compute
    codec_s: float  # encode/decode time not hidden behind compute
    comm_total_s: float  # all communication including codec, hidden or not
    anchor_s: float  # of comm_total_s: the calibration's allreduce measured at this size less the fit's (0: none)
    hidden_comm_s: float  # comm_total_s − exposed_comm_s − codec_s
    throughput_it_s: float  # iterations per second
    samples_per_s: float  # workers × batch per worker / iteration_s (0 when the batch is unknown)
    staleness: float  # how many iterations old an applied gradient is
    regime: str  # 'latency-bound', 'bandwidth-bound' or 'no-communication'

    def as_dict(self) -> dict:
        return asdict(self)


def _buckets(grad_bytes: float, bucket_bytes: float) -> int:
    if bucket_bytes <= 0 or grad_bytes <= 0:
        return 1
    return max(1, math.ceil(grad_bytes / bucket_bytes - 1e-9))


def _regime(cluster: ClusterParams, message_bytes: float, comm_s: float) -> str:
    if comm_s <= 0:
        return "no-communication"
    half = collectives.hockney_half_size(cluster.latency_s, cluster.bandwidth_Bps)
    return "latency-bound" if message_bytes < half else "bandwidth-bound"


def allreduce_cost(cluster: ClusterParams, codec: CodecParams, schedule: ScheduleParams,
                   collective: str | None = None, per_hop: bool = True) -> CommCost:
    """Allreduce of the whole gradient in buckets; codec per hop (our ring) or once at the ends.

    With ``cluster.ring_anchor_s`` = A (the calibration's probe timed this allreduce alone at this very size,
    ``timing_model.validation.calibrated_scenario``), the fit's time F (network + codec, without error feedback) is replaced
    by A and every part scales by A/F: T = A + T_feedback, and the breakdown's ``anchor_s`` = A − F. Why: the
    α-β fit is a least-squares line over the calibration's sizes and misses a single size by up to 40 % on
    fast links (latency-bound small gradients); the anchor is measured by ``calibrate``, never by the runs.
    """
    algorithm = collective or cluster.collective
    workers, buckets = cluster.nodes, _buckets(cluster.grad_bytes, schedule.bucket_bytes)
    bucket = cluster.grad_bytes / buckets
    reduce_s_per_byte = 0.0 if math.isinf(cluster.reduce_Bps) else 1.0 / cluster.reduce_Bps
    wire_s_per_byte = 1.0 / (cluster.bandwidth_Bps * codec.ratio)  # payload is 1/ratio of the fp32 bytes
    one = collectives.ALLREDUCE[algorithm](workers, bucket, cluster.latency_s, wire_s_per_byte, reduce_s_per_byte,
                                           cluster.overhead_s)
    hop = per_hop and algorithm == "ring"
    codec_s = formulas.codec_time(workers, cluster.grad_bytes, codec.encode_Bps, codec.decode_Bps, hop,
                                  codec.feedback_Bps)
    split = workers if algorithm in ("ring", "rabenseifner") else 1
    wire = collectives.ALLREDUCE[algorithm](workers, bucket, 0.0, wire_s_per_byte) * buckets
    cost = CommCost(one * buckets + codec_s, codec_s, one + codec_s / buckets, buckets, bucket / codec.ratio / split,
                    wire_s=wire)
    return _anchored(cost, cluster, workers, hop, codec) if cluster.ring_anchor_s > 0 and cost.total_s > 0 else cost


def _anchored(cost: CommCost, cluster: ClusterParams, workers: int, hop: bool, codec: CodecParams) -> CommCost:
    """``cost`` with its fitted part (all but error feedback) scaled to the anchor (``allreduce_cost``)."""
    feedback = cost.codec_s - formulas.codec_time(workers, cluster.grad_bytes, codec.encode_Bps, codec.decode_Bps,
                                                  hop, math.inf)
    fitted = cost.total_s - feedback
    if fitted <= 0:
        return cost
    scale = cluster.ring_anchor_s / fitted
    per_bucket_feedback = feedback / cost.buckets
    return CommCost(cluster.ring_anchor_s + feedback, (cost.codec_s - feedback) * scale + feedback,
                    (cost.last_bucket_s - per_bucket_feedback) * scale + per_bucket_feedback, cost.buckets,
                    cost.message_bytes, cluster.ring_anchor_s - fitted, min(cost.wire_s, cluster.ring_anchor_s))


def ps_cost(cluster: ClusterParams, codec: CodecParams, schedule: ScheduleParams, server: ServerParams,
            asynchronous: bool = False) -> CommCost:
    """Parameter-server push + pull of the whole gradient, codec once at the worker.

    Synchronous: all workers' flows meet at the servers. Asynchronous: one worker's own push and pull
    (server contention is the separate server-link limit of ``formulas.ps_async_iteration``).
    """
    workers, buckets = cluster.nodes, _buckets(cluster.grad_bytes, schedule.bucket_bytes)
    colocated = server.colocated
    if asynchronous:
        workers, colocated = (1, False) if not (colocated and workers == 1) else (1, True)
    bucket = cluster.grad_bytes / buckets
    server_Bps = server.server_bandwidth_Bps or cluster.bandwidth_Bps
    reduce_s_per_byte = 0.0 if math.isinf(server.server_reduce_Bps) else 1.0 / server.server_reduce_Bps
    directions = 2.0 if server.serialised else 1.0
    one = formulas.ps_transfer(workers, bucket / codec.ratio, cluster.latency_s, cluster.bandwidth_Bps, server_Bps,
                               server.servers, directions, reduce_s_per_byte * codec.ratio, cluster.overhead_s,
                               colocated)
    # once at the worker, one encode and one decode of the whole gradient (the 2 only matters per hop)
    codec_s = formulas.codec_time(2, cluster.grad_bytes, codec.encode_Bps, codec.decode_Bps, False,
                                  codec.feedback_Bps) if one else 0.0
    return CommCost(one * buckets + codec_s, codec_s, one + codec_s / buckets, buckets, bucket / codec.ratio)


def _result(mode: str, cluster: ClusterParams, compute: ComputeParams, comm: CommCost, iteration_s: float,
            busy_s: float, interference_cap_s: float, staleness: float, straggler_s: float,
            handoff_s: float = 0.0, buffers_s: float = 0.0, host_s: float = 0.0,
            lockstep_s: float = 0.0, server_s: float = 0.0) -> ModeResult:
    """Split ``iteration_s`` into named terms; ``busy_s`` is compute + straggler + update + hand-off + buffers +
    host + lockstep + server."""
    interference = min(interference_cap_s, max(0.0, iteration_s - busy_s))
    exposed = max(0.0, iteration_s - busy_s - interference)
    codec_share = comm.codec_s / comm.total_s if comm.total_s > 0 else 0.0
    codec_exposed = exposed * codec_share
    throughput = 1.0 / iteration_s if iteration_s > 0 else math.inf
    hidden = comm.total_s - exposed
    return ModeResult(
        mode=mode, iteration_s=iteration_s, compute_s=compute.compute_s, straggler_s=straggler_s,
        interference_s=interference, update_s=compute.update_s, handoff_s=handoff_s, buffers_s=buffers_s, host_s=host_s,
        lockstep_s=lockstep_s, server_s=server_s, exposed_comm_s=exposed - codec_exposed,
        codec_s=codec_exposed, comm_total_s=comm.total_s, anchor_s=comm.anchor_s, hidden_comm_s=hidden if hidden > 1e-12 * max(comm.total_s, 1.0) else 0.0,
        throughput_it_s=throughput, samples_per_s=cluster.nodes * compute.samples_per_worker * throughput
        if compute.samples_per_worker else 0.0, staleness=staleness,
        regime=_regime(cluster, comm.message_bytes, comm.total_s),
    )


def _slowest_compute(cluster: ClusterParams, compute: ComputeParams) -> float:
    return expected_max_normal(cluster.nodes, compute.compute_s, compute.compute_std_s)


def _handoff(cluster: ClusterParams, compute: ComputeParams, copies_only: bool = False) -> float:
    """H = 2·M/copy_Bps + handoff_s (``formulas.handoff_time``); DDP pays the copies but no thread hand-off."""
    return formulas.handoff_time(cluster.grad_bytes, compute.copy_Bps, 0.0 if copies_only else compute.handoff_s)


def _host_beyond(compute: ComputeParams, hand: float) -> float:
    """The measured per-step host work that the hand-off estimate ``hand`` does not already cover."""
    return max(0.0, compute.host_s - hand)


def _lockstep(compute: ComputeParams, slow: float) -> float:
    """The lockstep term, signed (``ComputeParams.lockstep_s``), at least −slow: a refilled token bucket can hide
    at most the compute that it refilled during."""
    return max(compute.lockstep_s, -slow)


def _buffers_beside_ring(compute: ComputeParams, comm: CommCost) -> float:
    """The buffer sync's exposed seconds when it runs beside the ring (``pipesgd.optimizer`` Step 3: after the
    hand-off, before the wait): max(0, buffers_s − wire_s). Its few small messages queue behind the ring's bytes on
    the link, and that wait, at most the ring's time on the wire, passes inside the ring's own time, which the step
    waits for next. Why: at 100 Mbit/s the measured sync (ResNet-20, 1.09 MB, 4 nodes) took 21 ms of a 190 ms step
    behind a 139 ms ring, and adding it serially over-predicted the step by 10-12 % on both grids."""
    return max(0.0, compute.buffers_s - comm.wire_s)


def predict_sync(cluster, compute, codec, schedule) -> ModeResult:
    """Synchronous allreduce SGD (width 1 on our ring): slowest compute + update + buffer sync + hand-off (or the
    measured host work, if more) + lockstep + allreduce."""
    comm = allreduce_cost(cluster, codec, schedule, per_hop=True)
    slow = _slowest_compute(cluster, compute)
    hand = _handoff(cluster, compute)
    host = _host_beyond(compute, hand)
    buffers = _buffers_beside_ring(compute, comm)
    lockstep = _lockstep(compute, slow)
    busy = slow + compute.update_s + buffers + host + lockstep
    return _result("sync", cluster, compute, comm, formulas.sync_iteration(busy, comm.total_s, hand), busy + hand,
                   0.0, 0.0, slow - compute.compute_s, hand, buffers, host, lockstep)


def predict_ddp(cluster, compute, codec, schedule) -> ModeResult:
    """PyTorch DDP: bucket allreduces overlap the last ``overlap_fraction`` of backward (slowed by κc there);
    codec once per bucket; the bucket copies (2·M/copy_Bps) are serial; backward ends in a blocking wait for the
    last bucket, so the step pays the lockstep term too, or DDP's own where calibrate's DDP probe ran: what the
    probe's step took beyond this formula's step for the probe's own compute (``ComputeParams.ddp_step_s``), at
    least −compute. Why: DDP launches its all-reduce from autograd's hooks and on shared cores its step differs from
    the synchronous one the lockstep probe times (LeNet, 4 nodes on 2 cores: ddp 13.2 ms per step, sync 10.9 ms).
    A gradient within one bucket (``bucket_bytes``, DDP's ``bucket_cap_mb``) overlaps nothing: its one
    all-reduce starts when backward has made every gradient. Measured with a comm hook's timestamps (2 ranks,
    torch 2.13, batch 32, 2026-11-24): ResNet-20's 1.09 MB gradient is one bucket after DDP's rebuild, its hook
    called at 77 % of ``backward()``, the rest the wait; AlexNet's 34 MB are two, the first called at 36 %."""
    comm = allreduce_cost(cluster, codec, schedule, per_hop=False)
    slow = _slowest_compute(cluster, compute)
    hand = _handoff(cluster, compute, copies_only=True)
    host = _host_beyond(compute, hand)
    # one bucket is all-reduced after backward: nothing to overlap (a hook's timestamps, ``predict_ddp``)
    overlap = schedule.overlap_fraction if _buckets(cluster.grad_bytes, schedule.bucket_bytes) > 1 else 0.0
    slowdown = compute.slowdown

    def step(compute_s: float, extra_s: float) -> float:
        return formulas.ddp_iteration(compute_s, extra_s, comm.total_s, comm.last_bucket_s, overlap, slowdown,
                                      compute.comm_slowdown, hand)

    lockstep = max(compute.ddp_step_s - step(compute.ddp_compute_s, 0.0), -slow) if compute.ddp_step_s > 0 \
        else _lockstep(compute, slow)
    iteration = step(slow, compute.update_s + host + lockstep)
    return _result("ddp", cluster, compute, comm, iteration, slow + compute.update_s + hand + host + lockstep,
                   slowdown * overlap * slow, 0.0, slow - compute.compute_s, hand, 0.0, host, lockstep)


def predict_pipe(cluster, compute, codec, schedule) -> ModeResult:
    """Pipe-SGD on our ring (codec on every hop): max(W, allreduce slowed during W) with W = (compute + update +
    buffer sync + hand-off)·(1+κ), for width ≥ 2 (``formulas.pipe_iteration``). The ring loses the share λ of W
    (``ComputeParams.window_loss``) where calibrate's window probe measured it, else it runs at 1/(1 + κc) in W.
    Why λ: κc's probe keeps the cores computing for the whole ring, a Pipe-SGD step for one window per ring (LeNet,
    100 Mbit/s, 4 nodes on 2 cores: κc 12.8 predicted a 14.8 ms step that took 11.3 ms). The buffer sync is a
    blocking collective on the caller's thread (``pipesgd.grads.buffers``): it is in the window, never hidden. Width 1
    is the synchronous step and pays the lockstep term; with width ≥ 2 the ring runs beside the next compute, where
    κc, not the lockstep probe, says what sharing the cores costs."""
    comm = allreduce_cost(cluster, codec, schedule, per_hop=True)
    slow = _slowest_compute(cluster, compute)
    hand = _handoff(cluster, compute)
    host = _host_beyond(compute, hand)
    lockstep = _lockstep(compute, slow) if schedule.width <= 1 else 0.0
    # width 1 is the synchronous step; with width >= 2 the sync is a rendezvous with the slowest rank
    # (pipesgd.grads.buffers)
    buffers = _buffers_beside_ring(compute, comm) if schedule.width <= 1 else compute.buffers_s
    busy = slow + compute.update_s + buffers + host + lockstep
    iteration = formulas.pipe_iteration(busy, comm.total_s, compute.slowdown, schedule.width, compute.comm_slowdown,
                                        hand, compute.window_loss)
    cap = compute.slowdown * (busy + hand) if schedule.width >= 2 else 0.0
    return _result("pipe", cluster, compute, comm, iteration, busy + hand, cap, float(schedule.width - 1),
                   slow - compute.compute_s, hand, buffers, host, lockstep)


def predict_ps_sync(cluster, compute, codec, schedule, server) -> ModeResult:
    """Synchronous parameter server: slowest compute + update + measured host work + the round's push/pull.

    With a co-located server and a calibrated service time (calibrate's parameter-server probe), the round serves
    the p' = p − 1 remote workers one after another (``pipesgd.baselines.ps_server.ShardServer.sync_round``:
    every header, every gradient, one update, every reply), so it takes at least p'·(s_idle − T_u): the idle
    service time (rank 0 is not computing during its round) less the update that the asynchronous probe applies
    per request and the round applies once (T_u, already in the step). ``server_s`` is what that holds beyond the
    link's push + pull. Why: on fast links the round is per-message host work that the α-β link term misses
    (LeNet unshaped, 4 nodes: 6.7 ms measured, 3.2 ms predicted without it, 7.1 ms with it).

    Where calibrate's ps-sync probe timed the round itself (``ServerParams.round_s``), the round is that, and
    ``server_s`` (signed) what it took beyond the link's push + pull. Why: on a tc-tbf link each direction's token
    bucket refills while the other carries its half of the round, so a small gradient's round beats p'·M/B each
    way (LeNet at 100 Mbit/s, 4 nodes, three sittings: 33 ms per step measured, 43 ms predicted)."""
    comm = ps_cost(cluster, codec, schedule, server)
    slow = _slowest_compute(cluster, compute)
    busy = slow + compute.update_s + compute.host_s
    flows = cluster.nodes - 1
    served = comm.total_s
    service = server.service_idle_s or server.service_s
    if server.colocated and flows >= 1 and server.round_s > 0:
        served = server.round_s
    elif server.colocated and flows >= 1 and service > 0:
        served = max(served, flows * max(0.0, service - compute.update_s))
    waiting = served - comm.total_s
    return _result("ps-sync", cluster, compute, comm, busy + served, busy + waiting, 0.0, 0.0,
                   slow - compute.compute_s, host_s=compute.host_s, server_s=waiting)


def predict_ps_async(cluster, compute, codec, schedule, server) -> ModeResult:
    """Asynchronous parameter server, the job's time per step; staleness workers − 1.

    Without a calibrated service time: one remote worker's own cycle or the server link, whichever is slower
    (``formulas.ps_async_iteration``). With one (``ServerParams.service_s``, a co-located server): the remote
    workers queue at the server, each thinking Z = compute + update + host between requests, and the server
    answers a request in s (its transfers included), so a remote step takes T = Z + R(p', Z, s)
    (``formulas.closed_queue_response``, p' remote workers): T1 with s = service_s while the co-located worker
    trains, T2 with service_idle_s after; that worker, whose updates never cross the link, steps in T0
    (``ServerParams.colocated_step_s``, its measured local work, else Z) and finishes first, and the job's pace
    is ``formulas.colocated_pace(T0, T1, T2)``, at least the link limit. ``server_s`` is what the pace holds
    beyond Z and the worker's own push + pull. Why T0 is its own: the co-located worker shares its process with
    the server thread, and on the comparison grid its mean step took 1.03-1.78 times the remote workers' think; with
    T0 = Z the model ended its training too early and counted too few of the slow steps T1.
    """
    comm = ps_cost(cluster, codec, schedule, server, asynchronous=True)
    workers = cluster.nodes
    server_Bps = (server.server_bandwidth_Bps or cluster.bandwidth_Bps) * codec.ratio
    flows = workers - 1 if server.colocated else workers
    think = compute.compute_s + compute.update_s + compute.host_s
    link = formulas.ps_async_iteration(flows, compute.compute_s, compute.update_s + compute.host_s, comm.total_s,
                                       cluster.grad_bytes if comm.total_s > 0 else 0.0, server.servers,
                                       server_Bps, server.send_buffer_bytes * codec.ratio)  # fp32-equivalent bytes
    served, waiting = link, 0.0
    if server.service_s > 0 and server.colocated and flows >= 1:
        busy_step = think + formulas.closed_queue_response(flows, think, server.service_s)
        idle_step = think + formulas.closed_queue_response(flows, think, server.service_idle_s or server.service_s)
        own = server.colocated_step_s or think
        served = max(link, formulas.colocated_pace(own, busy_step, idle_step))
        waiting = max(0.0, served - think - comm.total_s)
    return _result("ps-async", cluster, compute, comm, served, think + waiting, 0.0, float(workers - 1), 0.0,
                   host_s=compute.host_s, server_s=waiting)


def predict_mode(mode: str, cluster: ClusterParams, compute: ComputeParams, codec: CodecParams,
                 schedule: ScheduleParams, server: ServerParams) -> ModeResult:
    """Dispatch on the mode name used by ``pipesgd-train --mode``."""
    if mode in ("ps-sync", "ps-async"):
        fn = predict_ps_sync if mode == "ps-sync" else predict_ps_async
        return fn(cluster, compute, codec, schedule, server)
    table = {"sync": predict_sync, "ddp": predict_ddp, "pipe": predict_pipe}
    if mode not in table:
        raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    return table[mode](cluster, compute, codec, schedule)
