"""Per-iteration time equations of the training modes, in the paper's symbols.

With ``collectives.py`` the only module that uses these symbols. Symbol table (SI units):

====  ==================================================================================
p     workers                          M     gradient bytes per iteration
α     latency per message (s)          B     link bandwidth (bytes/s), β = 1/B
γ_s   server reduce cost (s/byte)      c0    fixed cost per collective call (s)
r     compression ratio M/payload      E, D  encode / decode passes per rank
k     parameter servers                B_s   server bandwidth; B_w worker bandwidth
d     2 if PS push and pull are serialised, 1 if pipelined
T̂_c   E[max over workers of fwd+bwd]   T_u   optimizer update; T_cu = T̂_c + T_u
T_AR  allreduce time (with codec)      κ     compute slow-down while comm overlaps it
κc    comm slow-down while compute overlaps it                         H  per-step hand-off cost
φ     fraction of backward that DDP buckets may overlap                K  pipeline width
====  ==================================================================================

Sources: the α-β-γ collective costs (Thakur, Rabenseifner, Gropp 2005) are in ``collectives.py``. The
parameter-server, DDP and Pipe-SGD equations below are *reconstructions* consistent with the
Pipe-SGD paper's description (Li et al., NeurIPS 2018) and with Paleo/BytePS; they are not the
paper's own equations, which are not available here.
"""
from __future__ import annotations

import math

__all__ = [
    "codec_passes",
    "codec_time",
    "ps_transfer",
    "ps_async_iteration",
    "closed_queue_response",
    "colocated_pace",
    "sync_iteration",
    "ddp_iteration",
    "pipe_iteration",
    "handoff_time",
    "overlapped_comm",
    "window_comm",
    "window_loss",
    "pipe_speedup_vs_sync",
    "saved_transfer",
]


def codec_passes(p: int, per_hop: bool) -> tuple[int, int]:
    """(E, D): encode and decode passes per rank for one allreduce.

    Our ring re-encodes on every reduce-scatter hop, the owner keeps decode(encode(chunk)), and all-gather
    forwards the owner's payload: E = (p−1) + 1 = p, D = (p−1) + 1 + (p−1) = 2p−1 (REFERENCES §2), each
    over M/p bytes. Codec once at the ends (DDP comm hook, Horovod, parameter server): E = D = 1 over M
    bytes. (Reconstruction.)
    """
    if p <= 1:
        return 0, 0
    return (p, 2 * p - 1) if per_hop else (1, 1)


def codec_time(p: int, M: float, enc_Bps: float, dec_Bps: float, per_hop: bool,
               feedback_Bps: float = math.inf) -> float:
    """Codec seconds per allreduce: E·m/enc_Bps + D·m/dec_Bps + E·m/feedback_Bps with m = M/p per hop, m = M
    once at the ends. The last term is error feedback (our reconstruction): every encode's error is decoded
    and added to the residual, at ``feedback_Bps`` fp32 bytes/s (inf: no error feedback)."""
    E, D = codec_passes(p, per_hop)
    m = M / p if per_hop else M
    return E * m / enc_Bps + D * m / dec_Bps + E * m / feedback_Bps


def saved_transfer(p: int, M: float, B: float, r: float) -> float:
    """Ring transfer time saved by compression: M/B·2(p−1)/p·(1 − 1/r). Compression pays off only when
    this exceeds ``codec_time`` (REFERENCES §2 invariant)."""
    if p <= 1:
        return 0.0
    return M / B * 2 * (p - 1) / p * (1 - 1 / r)


def ps_transfer(p: int, M: float, α: float, B_w: float, B_s: float, k: int, d: float,
                γ_s: float = 0.0, c0: float = 0.0, colocated: bool = False) -> float:
    """Synchronous parameter-server push + pull (sharded PS, reconstruction, unverified):

    T_PS = c0 + 2α + d·max(M/B_w, p'·M/(k·B_s)) + p'·M·γ_s/k,   p' = p (dedicated servers)
    or p − 1 (server co-located with a worker, Paleo's OneToAll). Single dedicated server with
    B_s = B_w = B and d = 2 gives 2pM/B.
    """
    flows = p - 1 if colocated else p
    if flows <= 0:
        return 0.0
    return c0 + 2 * α + d * max(M / B_w, flows * M / (k * B_s)) + flows * M * γ_s / k


def ps_async_iteration(flows: int, T_c: float, T_u: float, T_w: float, M: float, k: int, B_s: float,
                       send_buffer: float = math.inf) -> float:
    """Asynchronous PS, one iteration of a remote worker (the job's pace: every worker runs the same steps):

    T = max(T_c + T_u + T_w, flows·(m + max(0, m − S))/B_s),   m = M/k

    T_w the worker's own push + pull when the servers are idle; the second term the servers' link limit. Links
    are full duplex (pushes arrive on one direction while pulls leave on the other), so each remote update
    costs M/(k·B_s) of each direction, and between two of a worker's updates the server link carries one
    update of each of the ``flows`` remote workers: p, or p − 1 when a server shares a worker's machine (its
    updates never cross the link). The worker computes while the others' transfers run, hence the max. This
    replaces REFERENCES' updates/s ≈ min(p/(T_c+T_u+T_w), k·B_s/(2M)), which serialises push and pull on one
    direction and counts every worker as remote: on the comparison grid (4 nodes, co-located server) it
    predicted 2.6x and 3.0x the measured iteration at 100 Mbit/s (reconstruction, issue 14). The server serves
    one request at a time and waits for its reply to be sent before it receives the next: a reply of up to S
    bytes completes into the kernel's socket buffers at once, the rest (m − S) only as the link carries it, so a
    large model's updates take the link's outbound and inbound in turn (AlexNet, 34 MB: 2m/B_s per update).
    """
    m = M / k
    server_s = flows * (m + max(0.0, m - send_buffer)) / B_s if M > 0 and flows > 0 else 0.0
    return max(T_c + T_u + T_w, server_s)


def closed_queue_response(n: int, Z: float, s: float) -> float:
    """Mean time a request spends at one server (queue + service) when ``n`` workers each spend Z between two of
    their requests and the server takes s per request (mean-value analysis of a closed network; exact for
    exponential service times, our approximation for the parameter server):

    Q_0 = 0,   R_j = s·(1 + Q_{j−1}),   X_j = j/(Z + R_j),   Q_j = X_j·R_j   (j = 1..n),   R = R_n.

    n = 1 gives s (nobody to queue behind); Z = 0 gives n·s (the server saturated: one request per s).
    """
    if n < 1 or s <= 0:
        return 0.0
    queue = 0.0
    for j in range(1, n + 1):
        response = s * (1.0 + queue)
        queue = j * response / (Z + response)
    return response


def colocated_pace(T0: float, T1: float, T2: float) -> float:
    """Seconds per step of an asynchronous job whose co-located worker (on the server's machine, steps of T0)
    finishes before the remote workers (steps of T1 while it trains, T2 after), every worker running S steps:
    the job ends with the remote workers, after S·T0 + (S − S·T0/T1)·T2, so per step

    T = T0 + (1 − T0/T1)·T2   if T0 < T1,   else T1 (the co-located worker is not ahead).
    """
    if T1 <= 0 or T0 >= T1:
        return T1
    return T0 + (1.0 - T0 / T1) * T2


def handoff_time(M: float, copy_Bps: float, handoff_s: float) -> float:
    """Per-step hand-off cost of our optimizer wrapper (our reconstruction, not from the paper):

    H = 2·M/copy_Bps + handoff_s: packing the gradients into flat buckets and writing the averaged
    buckets back to ``.grad`` are two memory copies of M bytes; ``handoff_s`` is the fixed cost of
    queueing the buckets to the communication thread and waking up on its result. copy_Bps = ∞ and
    handoff_s = 0 give H = 0 (the pure formula).
    """
    return (0.0 if copy_Bps == float("inf") else 2.0 * M / copy_Bps) + handoff_s


def overlapped_comm(T_AR: float, window: float, κc: float) -> float:
    """Communication time when the first ``window`` seconds of it share the cores with compute (our
    reconstruction): during the window the collective progresses at rate 1/(1 + κc), afterwards at full rate.

    T = T_AR·(1 + κc)                    if T_AR·(1 + κc) ≤ window (it finishes inside the window)
      = T_AR + window·κc/(1 + κc)         otherwise,
    i.e. T = T_AR + κc·min(T_AR, window/(1 + κc)) = ``window_comm``(T_AR, window, κc/(1 + κc)). κc = 0 gives
    T_AR exactly; an unbounded window gives T_AR·(1 + κc).
    """
    if κc == 0.0:
        return T_AR
    return T_AR + κc * min(T_AR, window / (1.0 + κc))


def window_comm(T_AR: float, window: float, λ: float) -> float:
    """Communication time when the collective loses the share λ ∈ [0, 1] of the compute ``window`` that runs beside
    it (our reconstruction; λ from calibrate's window probe, ``window_loss``):

    T = T_AR / (1 − λ)      if λ < 1 and T_AR / (1 − λ) ≤ window (it finishes inside the window)
      = T_AR + λ·window     otherwise,
    i.e. ``overlapped_comm`` with κc = λ/(1 − λ); λ = 1: no progress while the window runs.
    """
    if not 0.0 <= λ <= 1.0:
        raise ValueError(f"window loss must lie in [0, 1], got {λ!r}")
    if λ < 1.0 and T_AR <= window * (1.0 - λ):
        return T_AR / (1.0 - λ)
    return T_AR + λ * window


def window_loss(T_AR: float, window: float, T: float) -> float:
    """The λ of ``window_comm`` that gives the measured ``T`` for a collective of ``T_AR`` alone beside a compute
    window of ``window`` seconds, its inverse: 0 when T ≤ T_AR, 1 − T_AR/T when it ended inside the window
    (T ≤ window), else (T − T_AR)/window, at most 1. Why at most 1: sharing the cores can stop the collective for
    the window, not longer; where a probe measured more (LeNet at 1 Gbit/s, q8: 14.2 ms beside a 3.7 ms window, 7.5
    ms alone), the timing alone, back to back after a barrier, was short of a training step's (the lockstep probe's
    timing of the same all-reduce alone: 8.0 vs 5.1 ms in one calibration), and λ = 1.83 scaled with the run's
    longer window over-predicted the run by 40 %."""
    if not all(map(math.isfinite, (T_AR, window, T))) or T_AR <= 0 or window <= 0 or T < 0:
        raise ValueError("window loss needs finite timings, the collective alone and the window > 0")
    if T <= T_AR:
        return 0.0
    return 1.0 - T_AR / T if T <= window else min(1.0, (T - T_AR) / window)


def sync_iteration(T_cu: float, T_AR: float, H: float = 0.0) -> float:
    """Synchronous allreduce SGD: T = T_cu + H + T_AR (H: hand-off cost, ``handoff_time``; 0 in the pure
    formula)."""
    return T_cu + H + T_AR


def ddp_iteration(T̂_c: float, T_u: float, T_AR: float, T_AR_last: float, φ: float, κ: float,
                  κc: float = 0.0, H: float = 0.0) -> float:
    """DDP-style overlap of bucket allreduces with backward (reconstruction, unverified):

    T = max(T̂_c·(1 + κφ), (1 − φ)·T̂_c + T'_AR, T̂_c + T_AR(last bucket)) + T_u + H,
    T'_AR = ``overlapped_comm``(T_AR, φ·T̂_c, κc): the buckets share the cores with the last φ of backward
    and are slowed by κc there (our reconstruction). φ = 0 gives AR-sync; κc = 0 and H = 0 give the
    original form exactly. H (the bucket copies, ``handoff_time``) is serial.
    """
    comm = overlapped_comm(T_AR, φ * T̂_c, κc)
    return max(T̂_c * (1 + κ * φ), (1 - φ) * T̂_c + comm, T̂_c + T_AR_last) + T_u + H


def pipe_iteration(T_cu: float, T_AR: float, κ: float, K: int, κc: float = 0.0, H: float = 0.0,
                   λ: float | None = None) -> float:
    """Pipe-SGD steady-state iteration (reconstruction, unverified):

    K = 1: T = T_cu + H + T_AR (synchronous). K ≥ 2: T = max(W, T'_AR) with W = (T_cu + H)·(1 + κ) the
    compute side and T'_AR = ``overlapped_comm``(T_AR, W, κc): successive allreduces share one link, so more
    width adds staleness, not speed. κc (our reconstruction) slows the ring while the compute side runs beside
    it, i.e. for the first W seconds of each ring, as in DDP; calibrate measures it with the model's own
    forward+backward running beside the allreduce all along (``benchmarks.measure_overlap``). On the emulated
    CPU cluster (1 Gbit/s, 4 nodes on 2 cores, κc 0.76 measured) this gave 100.5 ms for a run that took
    102.0 ms, where slowing the ring throughout gave 117.5 ms. With λ (calibrate's window probe: the ring beside
    one compute window per ring, as in a Pipe-SGD step) T'_AR = ``window_comm``(T_AR, W, λ) instead of κc. The
    hand-off H (``handoff_time``) runs in ``step()`` on the compute thread. κc = 0 and H = 0 give the original
    max(T_cu·(1 + κ), T_AR) exactly. A run pays one extra start-up iteration.
    """
    if K <= 1:
        return sync_iteration(T_cu, T_AR, H)
    compute_side = (T_cu + H) * (1 + κ)
    comm = overlapped_comm(T_AR, compute_side, κc) if λ is None else window_comm(T_AR, compute_side, λ)
    return max(compute_side, comm)


def pipe_speedup_vs_sync(T_cu: float, T_AR: float, κ: float = 0.0) -> float:
    """(T_cu + T_AR) / max(T_cu(1+κ), T_AR) ≤ 2, with equality iff T_cu = T_AR and κ = 0."""
    return sync_iteration(T_cu, T_AR) / pipe_iteration(T_cu, T_AR, κ, 2)
