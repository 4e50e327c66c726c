"""What sharing a host costs when compute and communication overlap, and what handing gradients to the
communication thread costs: the measured terms that stretch the core's Pipe-SGD and DDP equations.

Each function takes the core's inputs plus measured terms and, with every term at its neutral value (κ = κc = 0,
λ unset, H = 0), returns the core equation (``timing_model.core.equations``) exactly. Symbols (SI units):
====  ==============================  ==  =========================================================================
T_AR  all-reduce time alone           κ   compute slow-down while communication runs beside it (interference probe)
W     compute running beside it (s)   κc  communication slow-down while compute runs beside it (the same probe)
T̂_c   E[max over workers of fwd+bwd]  λ   share of one compute window a ring beside it loses (window probe)
T_u   update; T_cu = T̂_c + T_u        H   per-step hand-off: packing buckets, writing them back, waking the thread
φ     DDP buckets' share of backward  K   pipeline width
====  ==============================  ==  =========================================================================

Why these exist: on CPU ranks compute and the ring contend for cores (LogGP's o, REFERENCES §2-3), and a
Pipe-SGD step overlaps one compute window per ring, not all of it. All are our reconstructions.
"""
from __future__ import annotations

import math

from ..core import equations

__all__ = ["handoff_time", "overlapped_comm", "window_comm", "window_loss", "ddp_iteration_with",
           "pipe_iteration_with"]


def handoff_time(M: float, copy_Bps: float, handoff_s: float) -> float:
    """Per-step hand-off cost of our optimizer wrapper (our reconstruction, not from the paper):

    H = 2·M/copy_Bps + handoff_s: packing the gradients into flat buckets and writing the averaged
    buckets back to ``.grad`` are two memory copies of M bytes; ``handoff_s`` is the fixed cost of
    queueing the buckets to the communication thread and waking up on its result. copy_Bps = ∞ and
    handoff_s = 0 give H = 0 (the core).
    """
    return (0.0 if copy_Bps == math.inf else 2.0 * M / copy_Bps) + handoff_s


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
    the window, not longer; a probe that measured more had timed the collective alone shorter than a training
    step's, and the excess does not scale with a run's window (experiments/RESULTS.md)."""
    if not all(map(math.isfinite, (T_AR, window, T))) or T_AR <= 0 or window <= 0 or T < 0:
        raise ValueError("window loss needs finite timings, the collective alone and the window > 0")
    if T <= T_AR:
        return 0.0
    return 1.0 - T_AR / T if T <= window else min(1.0, (T - T_AR) / window)


def ddp_iteration_with(T̂_c: float, T_u: float, T_AR: float, T_AR_last: float, φ: float, κ: float,
                       κc: float = 0.0, H: float = 0.0) -> float:
    """The core's DDP equation with the overlap's cost and the bucket copies:

    T = max(T̂_c·(1 + κφ), (1 − φ)·T̂_c + T'_AR, T̂_c + T_AR(last bucket)) + T_u + H,
    T'_AR = ``overlapped_comm``(T_AR, φ·T̂_c, κc): the buckets share the cores with the last φ of backward,
    which they slow by κ and which slows them by κc there. H (the bucket copies, ``handoff_time``) is serial.
    κ = κc = 0 and H = 0 give ``equations.ddp_iteration`` exactly.
    """
    comm = overlapped_comm(T_AR, φ * T̂_c, κc)
    return max(T̂_c * (1 + κ * φ), equations.ddp_iteration(T̂_c, 0.0, comm, T_AR_last, φ)) + T_u + H


def pipe_iteration_with(T_cu: float, T_AR: float, κ: float, K: int, κc: float = 0.0, H: float = 0.0,
                        λ: float | None = None) -> float:
    """The core's Pipe-SGD equation with the overlap's cost and the hand-off:

    K = 1: T = (T_cu + H) + T_AR (synchronous). K ≥ 2: T = max(W, T'_AR) with W = (T_cu + H)·(1 + κ) the compute
    side and T'_AR = ``overlapped_comm``(T_AR, W, κc): κc slows the ring while the compute side runs beside it,
    i.e. for the first W seconds of each ring, as in DDP (calibrate measures κc with the model's own
    forward+backward beside the allreduce all along). With λ (calibrate's window probe: the ring beside one
    compute window per ring, as in a Pipe-SGD step) T'_AR = ``window_comm``(T_AR, W, λ) instead. The hand-off H
    runs in ``step()`` on the compute thread. κ = κc = 0, H = 0 and no λ give ``equations.pipe_iteration``.
    """
    if K <= 1:
        return equations.pipe_iteration(T_cu + H, T_AR, K)
    compute_side = (T_cu + H) * (1 + κ)
    comm = overlapped_comm(T_AR, compute_side, κc) if λ is None else window_comm(T_AR, compute_side, λ)
    return equations.pipe_iteration(compute_side, comm, K)
