"""Per-mode iteration time with a named breakdown (ps-sync, ps-async, sync, ddp, pipe, and the periodic-averaging
localsgd and diloco): the analytic core's equations (``timing_model.core``) composed with the measured terms
(``timing_model.empirical``).

Each ``predict_<mode>`` is a pure function of the frozen plain records and an ``EmpiricalTerms`` record and
returns a ``ModeResult`` whose terms add up to the iteration time:
``iteration_s = compute_s + straggler_s + interference_s + update_s + handoff_s + buffers_s + host_s +
lockstep_s + server_s + exposed_comm_s + codec_s``.
With the terms neutral (``empirical.terms.NEUTRAL``, the default) every mode is its textbook equation of
``core.equations`` exactly: the composition only changes the core's inputs (a longer compute side, a stretched
or anchored allreduce, a measured server round) and adds the measured per-step costs.
For ps-async the "iteration" is the job's time per step (every worker runs the same steps, the job ends with the
slowest), the time the cluster needs for as many updates as there are workers (the same work as one synchronous
iteration), so throughputs and speedups compare like for like.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from .core import equations
from .core.costs import CommCost, allreduce_cost, bucket_count, ps_cost, regime_of
from .core.straggler import expected_max_normal
from .empirical import overlap, server as served
from .empirical.anchor import anchored
from .empirical.terms import NEUTRAL, EmpiricalTerms
from .params import ClusterParams, CodecParams, ComputeParams, ScheduleParams, ServerParams, build_codec

__all__ = ["MODES", "PERIODIC_MODES", "ModeResult", "predict_mode", "predict_ps_sync", "predict_ps_async",
           "predict_sync", "predict_ddp", "predict_pipe", "predict_periodic"]

MODES = ("ps-sync", "ps-async", "sync", "ddp", "pipe")
# pipesgd-train's periodic averaging (``--mode localsgd|diloco``): predicted on request, not in every table, since
# they change the algorithm rather than how one step's gradient is averaged
PERIODIC_MODES = ("localsgd", "diloco")


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
    host_s: float  # measured per-step host work beyond the hand-off estimate (``EmpiricalTerms.host_s``; not hidden)
    lockstep_s: float  # a blocking all-reduce right after compute beyond the two apart, signed (``EmpiricalTerms``)
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
    allreduce: str = ""  # what averages the gradient: sync/pipe "ring", "alltoall" or "backend", ddp "backend"

    def as_dict(self) -> dict:
        return asdict(self)


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
        codec_s=codec_exposed, comm_total_s=comm.total_s, anchor_s=comm.anchor_s,
        hidden_comm_s=hidden if hidden > 1e-12 * max(comm.total_s, 1.0) else 0.0,
        throughput_it_s=throughput, samples_per_s=cluster.nodes * compute.samples_per_worker * throughput
        if compute.samples_per_worker else 0.0, staleness=staleness,
        regime=regime_of(cluster, comm.message_bytes, comm.total_s),
    )


def _allreduce(cluster: ClusterParams, codec: CodecParams, schedule: ScheduleParams, terms: EmpiricalTerms,
               per_hop: bool) -> CommCost:
    """The core's allreduce of the whole gradient, with our compressed all-reduce's fixed cost per call
    (``EmpiricalTerms.codec_call_s``, a codec part), anchored to the calibration's timing at this size if any."""
    cost = allreduce_cost(cluster, codec, schedule, per_hop=per_hop)
    if per_hop and codec.ratio > 1 and terms.codec_call_s > 0 and cost.total_s > 0:
        extra = cost.buckets * terms.codec_call_s
        cost = replace(cost, total_s=cost.total_s + extra, codec_s=cost.codec_s + extra,
                       last_bucket_s=cost.last_bucket_s + terms.codec_call_s)
    return anchored(cost, terms.ring_anchor_s)


def _slowest_compute(cluster: ClusterParams, compute: ComputeParams) -> float:
    return expected_max_normal(cluster.nodes, compute.compute_s, compute.compute_std_s)


def _handoff(cluster: ClusterParams, terms: EmpiricalTerms, copies_only: bool = False) -> float:
    """H = 2·M/copy_Bps + handoff_s (``overlap.handoff_time``); DDP pays the copies but no thread hand-off."""
    return overlap.handoff_time(cluster.grad_bytes, terms.copy_Bps, 0.0 if copies_only else terms.handoff_s)


def _host_beyond(terms: EmpiricalTerms, hand: float) -> float:
    """The measured per-step host work that the hand-off estimate ``hand`` does not already cover."""
    return max(0.0, terms.host_s - hand)


def _lockstep(terms: EmpiricalTerms, slow: float) -> float:
    """The lockstep term, signed (``EmpiricalTerms.lockstep_s``), at least −slow: a refilled token bucket can hide
    at most the compute that it refilled during."""
    return max(terms.lockstep_s, -slow)


def _buffers_beside_ring(terms: EmpiricalTerms, comm: CommCost) -> float:
    """The buffer sync's exposed seconds when it runs beside the ring (``pipesgd.optimizer`` Step 3: after the
    hand-off, before the wait): max(0, buffers_s − wire_s). Its few small messages queue behind the ring's bytes on
    the link, and that wait, at most the ring's time on the wire, passes inside the ring's own time, which the step
    waits for next; adding it serially over-predicted sync on a slow link (experiments/RESULTS.md)."""
    return max(0.0, terms.buffers_s - comm.wire_s)


def predict_sync(cluster: ClusterParams, compute: ComputeParams, codec: CodecParams, schedule: ScheduleParams,
                 terms: EmpiricalTerms = NEUTRAL) -> ModeResult:
    """Synchronous allreduce SGD (width 1 on our ring), ``equations.sync_iteration`` with T_cu = slowest compute +
    update + buffer sync + hand-off (or the measured host work, if more) + lockstep."""
    comm = _allreduce(cluster, codec, schedule, terms, per_hop=True)
    slow = _slowest_compute(cluster, compute)
    hand = _handoff(cluster, terms)
    host = _host_beyond(terms, hand)
    buffers = _buffers_beside_ring(terms, comm)
    lockstep = _lockstep(terms, slow)
    busy = slow + compute.update_s + buffers + host + lockstep
    return _result("sync", cluster, compute, comm, equations.sync_iteration(busy + hand, comm.total_s), busy + hand,
                   0.0, 0.0, slow - compute.compute_s, hand, buffers, host, lockstep)


def predict_ddp(cluster: ClusterParams, compute: ComputeParams, codec: CodecParams, schedule: ScheduleParams,
                terms: EmpiricalTerms = NEUTRAL) -> ModeResult:
    """PyTorch DDP, ``equations.ddp_iteration``: bucket allreduces overlap the last ``overlap_fraction`` of
    backward, codec once per bucket (``overlap.ddp_iteration_with`` adds the slow-downs there and the serial bucket
    copies). A gradient within one bucket (``bucket_bytes``, DDP's ``bucket_cap_mb``) overlaps nothing: its one
    all-reduce starts when backward has made every gradient (a comm hook's timestamps; experiments/RESULTS.md).
    Backward ends in a blocking wait for the last bucket, so the step pays the lockstep term too, or DDP's own where
    calibrate's DDP probe ran: what the probe's step took beyond this formula's step for the probe's own compute
    (``EmpiricalTerms.ddp_step_s``), at least −compute. Why its own: DDP launches its all-reduce from autograd's
    hooks, and on shared cores its step differs from the synchronous one that the lockstep probe times."""
    comm = _allreduce(cluster, codec, schedule, terms, per_hop=False)
    slow = _slowest_compute(cluster, compute)
    hand = _handoff(cluster, terms, copies_only=True)
    host = _host_beyond(terms, hand)
    overlapped = schedule.overlap_fraction if bucket_count(cluster.grad_bytes, schedule.bucket_bytes) > 1 else 0.0
    slowdown = terms.slowdown

    def step(compute_s: float, extra_s: float) -> float:
        return overlap.ddp_iteration_with(compute_s, extra_s, comm.total_s, comm.last_bucket_s, overlapped, slowdown,
                                          terms.comm_slowdown, hand)

    lockstep = max(terms.ddp_step_s - step(terms.ddp_compute_s, 0.0), -slow) if terms.ddp_step_s > 0 \
        else _lockstep(terms, slow)
    iteration = step(slow, compute.update_s + host + lockstep)
    return _result("ddp", cluster, compute, comm, iteration, slow + compute.update_s + hand + host + lockstep,
                   slowdown * overlapped * slow, 0.0, slow - compute.compute_s, hand, 0.0, host, lockstep)


def predict_pipe(cluster: ClusterParams, compute: ComputeParams, codec: CodecParams, schedule: ScheduleParams,
                 terms: EmpiricalTerms = NEUTRAL) -> ModeResult:
    """Pipe-SGD on our ring (codec on every hop), ``equations.pipe_iteration``: for width ≥ 2, max(W, allreduce)
    with W = compute + update + buffer sync + hand-off, stretched by ``overlap.pipe_iteration_with``: W by the
    compute slow-down, the ring by the share λ of W it loses (``EmpiricalTerms.window_loss``) where calibrate's
    window probe measured it, else by running at 1/(1 + κc) during W. Why λ: κc's probe keeps the cores computing
    for the whole ring, a Pipe-SGD step for one window per ring. The buffer sync is a blocking collective on the
    caller's thread (``pipesgd.grads.buffers``): it is in the window, never hidden. Width 1 is the synchronous step
    and pays the lockstep term; with width ≥ 2 the ring runs beside the next compute, where κc, not the lockstep
    probe, says what sharing the cores costs, and the look-ahead's replay of the optimizer's rule (``lookahead_s``,
    on the caller's thread, ``pipesgd.delay.lookahead``) counts as update work."""
    if schedule.width >= 2:
        compute = replace(compute, update_s=compute.update_s + compute.lookahead_s)
    comm = _allreduce(cluster, codec, schedule, terms, per_hop=True)
    slow = _slowest_compute(cluster, compute)
    hand = _handoff(cluster, terms)
    host = _host_beyond(terms, hand)
    lockstep = _lockstep(terms, slow) if schedule.width <= 1 else 0.0
    # width 1 is the synchronous step; with width >= 2 the sync is a rendezvous with the slowest rank
    # (pipesgd.grads.buffers)
    buffers = _buffers_beside_ring(terms, comm) if schedule.width <= 1 else terms.buffers_s
    busy = slow + compute.update_s + buffers + host + lockstep
    iteration = overlap.pipe_iteration_with(busy, comm.total_s, terms.slowdown, schedule.width, terms.comm_slowdown,
                                            hand, terms.window_loss)
    cap = terms.slowdown * (busy + hand) if schedule.width >= 2 else 0.0
    return _result("pipe", cluster, compute, comm, iteration, busy + hand, cap, float(schedule.width - 1),
                   slow - compute.compute_s, hand, buffers, host, lockstep)


def predict_ps_sync(cluster: ClusterParams, compute: ComputeParams, codec: CodecParams, schedule: ScheduleParams,
                    server: ServerParams, terms: EmpiricalTerms = NEUTRAL) -> ModeResult:
    """Synchronous parameter server, ``equations.sync_iteration`` with the round's push/pull for T_AR: slowest
    compute + update + measured host work + the round.

    With a co-located server and a calibrated service time (calibrate's parameter-server probe), the round serves
    the p' = p − 1 remote workers one after another (``pipesgd.baselines.ps_server.ShardServer.sync_round``:
    every header, every gradient, one update, every reply), so it takes at least p'·(s_idle − T_u): the idle
    service time (rank 0 is not computing during its round) less the update that the asynchronous probe applies
    per request and the round applies once (T_u, already in the step). ``server_s`` is what that holds beyond the
    link's push + pull. Why: on fast links the round is per-message host work that the α-β link term misses.

    Where calibrate's ps-sync probe timed the round itself (``EmpiricalTerms.ps_round_s``), the round is that, and
    ``server_s`` (signed) what it took beyond the link's push + pull. Why: on a tc-tbf link each direction's token
    bucket refills while the other carries its half of the round, so a small gradient's round beats p'·M/B each
    way (experiments/RESULTS.md)."""
    comm = ps_cost(cluster, codec, schedule, server)
    slow = _slowest_compute(cluster, compute)
    busy = slow + compute.update_s + terms.host_s
    flows = cluster.nodes - 1
    round_s = comm.total_s
    service = terms.ps_service_idle_s or terms.ps_service_s
    if server.colocated and flows >= 1 and terms.ps_round_s > 0:
        round_s = terms.ps_round_s
    elif server.colocated and flows >= 1 and service > 0:
        round_s = max(round_s, flows * max(0.0, service - compute.update_s))
    waiting = round_s - comm.total_s
    return _result("ps-sync", cluster, compute, comm, equations.sync_iteration(busy, round_s), busy + waiting, 0.0,
                   0.0, slow - compute.compute_s, host_s=terms.host_s, server_s=waiting)


def predict_ps_async(cluster: ClusterParams, compute: ComputeParams, codec: CodecParams, schedule: ScheduleParams,
                     server: ServerParams, terms: EmpiricalTerms = NEUTRAL) -> ModeResult:
    """Asynchronous parameter server, the job's time per step; staleness workers − 1.

    Without a calibrated service time: one remote worker's own cycle or the server link, whichever is slower
    (``equations.ps_async_iteration``; the link with the kernel's socket buffer, ``server.buffered_server_link``).
    With one (``EmpiricalTerms.ps_service_s``, a co-located server): the remote workers queue at the server, each
    thinking Z = compute + update + host between requests, and the server answers a request in s (its transfers
    included), so a remote step takes T = Z + R(p', Z, s) (``server.closed_queue_response``, p' remote workers):
    T1 with s = ps_service_s while the co-located worker trains, T2 with ps_service_idle_s after; that worker,
    whose updates never cross the link, steps in T0 (``EmpiricalTerms.ps_colocated_step_s``, its measured local
    work, else Z) and finishes first, and the job's pace is ``server.colocated_pace(T0, T1, T2)``, at least the
    link limit. ``server_s`` is what the pace holds beyond Z and the worker's own push + pull. Why T0 is its own:
    the co-located worker shares its process and cores with the server thread, and with T0 = Z the model ended
    its training too early and counted too few of the slow steps T1 (experiments/RESULTS.md).
    """
    comm = ps_cost(cluster, codec, schedule, server, asynchronous=True)
    workers = cluster.nodes
    server_Bps = (server.server_bandwidth_Bps or cluster.bandwidth_Bps) * codec.ratio
    flows = workers - 1 if server.colocated else workers
    think = compute.compute_s + compute.update_s + terms.host_s
    # fp32-equivalent bytes: the wire carries 1/ratio of them
    link_s = served.buffered_server_link(flows, cluster.grad_bytes if comm.total_s > 0 else 0.0, server.servers,
                                         server_Bps, terms.send_buffer_bytes * codec.ratio)
    link = equations.ps_async_iteration(compute.compute_s, compute.update_s + terms.host_s, comm.total_s, link_s)
    pace, waiting = link, 0.0
    if terms.ps_service_s > 0 and server.colocated and flows >= 1:
        busy_step = think + served.closed_queue_response(flows, think, terms.ps_service_s)
        idle_step = think + served.closed_queue_response(flows, think, terms.ps_service_idle_s or terms.ps_service_s)
        own = terms.ps_colocated_step_s or think
        pace = max(link, served.colocated_pace(own, busy_step, idle_step))
        waiting = max(0.0, pace - think - comm.total_s)
    return _result("ps-async", cluster, compute, comm, pace, think + waiting, 0.0, float(workers - 1), 0.0,
                   host_s=terms.host_s, server_s=waiting)


def predict_periodic(mode: str, cluster: ClusterParams, compute: ComputeParams, schedule: ScheduleParams,
                     terms: EmpiricalTerms = NEUTRAL) -> ModeResult:
    """Periodic averaging, ``equations.periodic_iteration`` with H = ``schedule.sync_every``: localsgd (torch's
    ``average_parameters``) and diloco (the pseudo-gradient) all-reduce the model once per sync in one flat
    full-precision buffer, the backend's all_reduce of one call (the ring's formula, no codec: the trainer does not
    compress them, no anchor: the calibration times the bucketed per-step all-reduce, not this one). diloco overlaps
    it with ``schedule.sync_delay`` inner steps; localsgd blocks. T_cu = the slowest rank's H steps per step, H steps
    of compute + update: the ranks meet once per H steps, so the spread of a step is divided by √H
    (``expected_max_normal`` with σ/√H, independent steps). The sync's flatten and write-back are priced as the
    hand-off's copies (2·M/copy_Bps per sync); the outer Nesterov step is not priced (no measured term for it).
    The breakdown's communication is per iteration: one sync's over H."""
    if mode not in PERIODIC_MODES:
        raise ValueError(f"unknown periodic mode {mode!r}; valid: {', '.join(PERIODIC_MODES)}")
    every = schedule.sync_every
    if mode == "localsgd" and every < 2:  # as the trainer: averaging every step is ddp
        raise ValueError(f"localsgd needs sync_every >= 2, got {every}")
    delay = schedule.sync_delay if mode == "diloco" else 0
    full = build_codec("none")
    one_call = ScheduleParams(width=1, bucket_bytes=0.0, allreduce="backend", sync_every=every)
    sync = allreduce_cost(cluster, full, one_call, per_hop=False)
    slow = expected_max_normal(cluster.nodes, compute.compute_s, compute.compute_std_s / math.sqrt(every))
    copies = overlap.handoff_time(cluster.grad_bytes, terms.copy_Bps, 0.0) / every
    busy = slow + compute.update_s
    iteration = equations.periodic_iteration(busy, sync.total_s, every, delay) + copies
    per_step = replace(sync, total_s=sync.total_s / every, codec_s=0.0, wire_s=sync.wire_s / every)
    return _result(mode, cluster, compute, per_step, iteration, busy + copies, 0.0, float(delay),
                   slow - compute.compute_s, copies)


def predict_mode(mode: str, cluster: ClusterParams, compute: ComputeParams, codec: CodecParams,
                 schedule: ScheduleParams, server: ServerParams, terms: EmpiricalTerms = NEUTRAL) -> ModeResult:
    """Dispatch on the mode name used by ``pipesgd-train --mode``."""
    if mode in PERIODIC_MODES:
        return replace(predict_periodic(mode, cluster, compute, schedule, terms), allreduce="backend")
    if mode in ("ps-sync", "ps-async"):
        fn = predict_ps_sync if mode == "ps-sync" else predict_ps_async
        return replace(fn(cluster, compute, codec, schedule, server, terms), allreduce="-")
    table = {"sync": predict_sync, "ddp": predict_ddp, "pipe": predict_pipe}
    if mode not in table:
        raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES + PERIODIC_MODES)}")
    return replace(table[mode](cluster, compute, codec, schedule, terms),
                   allreduce="backend" if mode == "ddp" else schedule.allreduce)
