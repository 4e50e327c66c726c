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
φ     fraction of backward that DDP buckets may overlap                K  pipeline width
====  ==================================================================================

Sources: the α-β-γ collective costs (Thakur, Rabenseifner, Gropp 2005) are in ``collectives.py``. The
parameter-server, DDP and Pipe-SGD equations below are *reconstructions* consistent with the
Pipe-SGD paper's description (Li et al., NeurIPS 2018) and with Paleo/BytePS; they are not the
paper's own equations, which are not available here.
"""
from __future__ import annotations

__all__ = [
    "codec_passes",
    "codec_time",
    "ps_transfer",
    "ps_async_rate",
    "sync_iteration",
    "ddp_iteration",
    "pipe_iteration",
    "pipe_speedup_vs_sync",
    "saved_transfer",
]


def codec_passes(p: int, per_hop: bool) -> tuple[int, int]:
    """(E, D): encode and decode passes per rank for one allreduce.

    Our ring re-encodes on every reduce-scatter hop and forwards the owner's payload in all-gather:
    E = (p−1) + 1 = p, D = (p−1) + (p−1) = 2p−2, each over M/p bytes. Codec once at the ends
    (DDP comm hook, Horovod, parameter server): E = D = 1 over M bytes. (Reconstruction.)
    """
    if p <= 1:
        return 0, 0
    return (p, 2 * p - 2) if per_hop else (1, 1)


def codec_time(p: int, M: float, enc_Bps: float, dec_Bps: float, per_hop: bool) -> float:
    """Codec seconds per allreduce: E·m/enc_Bps + D·m/dec_Bps with m = M/p per hop, m = M once at the ends."""
    E, D = codec_passes(p, per_hop)
    m = M / p if per_hop else M
    return E * m / enc_Bps + D * m / dec_Bps


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


def ps_async_rate(p: int, T_c: float, T_u: float, T_w: float, M: float, k: int, B_s: float) -> float:
    """Asynchronous PS updates per second: min(p/(T_c + T_u + T_w), k·B_s/(2M)), T_w the worker's own
    push+pull time; the second term is the servers' link limit (reconstruction)."""
    worker_rate = p / (T_c + T_u + T_w) if T_c + T_u + T_w > 0 else float("inf")
    server_rate = k * B_s / (2 * M) if M > 0 else float("inf")
    return min(worker_rate, server_rate)


def sync_iteration(T_cu: float, T_AR: float) -> float:
    """Synchronous allreduce SGD: T = T_cu + T_AR."""
    return T_cu + T_AR


def ddp_iteration(T̂_c: float, T_u: float, T_AR: float, T_AR_last: float, φ: float, κ: float) -> float:
    """DDP-style overlap of bucket allreduces with backward (reconstruction, unverified):

    T = max(T̂_c·(1 + κφ), (1 − φ)·T̂_c + T_AR, T̂_c + T_AR(last bucket)) + T_u;  φ = 0 gives AR-sync.
    """
    return max(T̂_c * (1 + κ * φ), (1 - φ) * T̂_c + T_AR, T̂_c + T_AR_last) + T_u


def pipe_iteration(T_cu: float, T_AR: float, κ: float, K: int) -> float:
    """Pipe-SGD steady-state iteration (reconstruction, unverified):

    K = 1: T = T_cu + T_AR (synchronous). K ≥ 2: T = max(T_cu·(1 + κ), T_AR): successive allreduces
    share one link, so more width adds staleness, not speed. A run pays one extra start-up iteration.
    """
    if K <= 1:
        return sync_iteration(T_cu, T_AR)
    return max(T_cu * (1 + κ), T_AR)


def pipe_speedup_vs_sync(T_cu: float, T_AR: float, κ: float = 0.0) -> float:
    """(T_cu + T_AR) / max(T_cu(1+κ), T_AR) ≤ 2, with equality iff T_cu = T_AR and κ = 0."""
    return sync_iteration(T_cu, T_AR) / pipe_iteration(T_cu, T_AR, κ, 2)
