"""The textbook per-iteration equations of the training modes, in the paper's symbols (REFERENCES §2).

Only the inputs a user knows enter here; what calibrate measures on one cluster is ``timing_model.empirical``.
===  ============================  ====  ===============================  ====  ======================================
p    workers                       M     gradient bytes per iteration     d     2: PS push, pull in turn; 1: pipelined
α    latency per message (s)       c0    fixed cost per call (s)          φ     share of backward DDP buckets overlap
B    bandwidth (bytes/s), β = 1/B  γ_s   server reduce cost (s/byte)      K     pipeline width
r    compression ratio M/payload   E, D  encode / decode passes per rank  k     parameter servers
T_c  mean fwd+bwd                  T̂_c   E[max over workers of fwd+bwd]   B_s   server bandwidth (B_w: worker's)
T_u  optimizer update              T_cu  T̂_c + T_u                        T_AR  all-reduce + codec (T_PS: PS round)
===  ============================  ====  ===============================  ====  ======================================

Sources: the α-β-γ collective costs are in ``collectives``. The parameter-server, DDP and Pipe-SGD equations are
*reconstructions* consistent with the Pipe-SGD paper (Li et al., NeurIPS 2018) and with Paleo/BytePS; they are
not the paper's own equations, which are not available here. All symbols are in SI units.
"""
from __future__ import annotations

import math

__all__ = [
    "codec_passes",
    "codec_time",
    "saved_transfer",
    "ps_transfer",
    "ps_server_link",
    "ps_async_iteration",
    "sync_iteration",
    "ddp_iteration",
    "pipe_iteration",
    "pipe_speedup_vs_sync",
    "periodic_iteration",
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


def ps_server_link(flows: int, M: float, k: int, B_s: float) -> float:
    """Seconds the servers' links need for one update of each of ``flows`` remote workers, a push and a pull of
    m = M/k per server each: flows·2m/B_s (REFERENCES §2: k·B_s/(2M) updates per second); ``flows`` is p, or
    p − 1 when a server shares a worker's machine (its updates never cross the link)."""
    if M <= 0 or flows <= 0:
        return 0.0
    m = M / k
    return flows * 2 * m / B_s


def ps_async_iteration(T_c: float, T_u: float, T_w: float, T_link: float) -> float:
    """Asynchronous PS, the job's time per step (every worker runs the same steps), as many updates as workers:

    T = max(T_c + T_u + T_w, T_link)

    T_w one worker's own push + pull when the servers are idle (``ps_transfer`` with p = 1); T_link the servers'
    link limit (``ps_server_link``). The worker computes while the others' transfers run, hence the max
    (REFERENCES §2: updates/s ≈ min(p/(T_c + T_u + T_PS,worker), k·B_s/(2M)); reconstruction)."""
    return max(T_c + T_u + T_w, T_link)


def sync_iteration(T_cu: float, T_AR: float) -> float:
    """Synchronous allreduce SGD (and the synchronous parameter server with T_PS for T_AR): T = T_cu + T_AR."""
    return T_cu + T_AR


def ddp_iteration(T̂_c: float, T_u: float, T_AR: float, T_AR_last: float, φ: float) -> float:
    """DDP-style overlap of bucket allreduces with the last φ of backward (reconstruction, unverified):

    T = max(T̂_c, (1 − φ)·T̂_c + T_AR, T̂_c + T_AR(last bucket)) + T_u.   φ = 0 gives AR-sync.
    """
    return max(T̂_c, (1 - φ) * T̂_c + T_AR, T̂_c + T_AR_last) + T_u


def pipe_iteration(T_cu: float, T_AR: float, K: int) -> float:
    """Pipe-SGD steady-state iteration (reconstruction, unverified): K = 1 is synchronous, T = T_cu + T_AR; for
    K ≥ 2, T = max(T_cu, T_AR): successive allreduces share one link, so more width adds staleness, not speed.
    A run pays one extra start-up iteration."""
    if K <= 1:
        return sync_iteration(T_cu, T_AR)
    return max(T_cu, T_AR)


def pipe_speedup_vs_sync(T_cu: float, T_AR: float) -> float:
    """(T_cu + T_AR) / max(T_cu, T_AR) ≤ 2, with equality iff T_cu = T_AR."""
    return sync_iteration(T_cu, T_AR) / pipe_iteration(T_cu, T_AR, 2)


def periodic_iteration(T_cu: float, T_AR: float, H: int, τ: int = 0) -> float:
    """Periodic averaging, local SGD and DiLoCo (reconstruction): every rank steps on its own gradient and the ranks
    all-reduce the model once every H steps, so per step

    T = T_cu + max(0, T_AR − τ·T_cu) / H

    with T_AR the full-precision all-reduce of the model. τ = 0 blocks at the sync (local SGD, the paper's DiLoCo,
    arXiv 2311.08105); τ ≥ 1 starts it τ inner steps before the sync and overlaps it with them (Streaming DiLoCo's
    one-fragment delay, arXiv 2501.18512)."""
    if H < 1 or not 0 <= τ < H:
        raise ValueError(f"periodic averaging needs H >= 1 and 0 <= tau < H, got H={H!r}, tau={τ!r}")
    return T_cu + max(0.0, T_AR - τ * T_cu) / H
