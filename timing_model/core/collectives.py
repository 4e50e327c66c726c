"""α-β-γ cost formulas of collective operations, plus the bandwidth and latency rules of thumb built on them.

With ``equations`` and the empirical terms (``timing_model.empirical``) the only place that uses the paper's
symbols; everything else passes named, SI-unit fields. Every function returns 0 for p = 1: one rank moves nothing.

====  =====================================  ====  ==================================================================
p     ranks taking part in the collective    M     message bytes (gradient bytes, 4 per fp32 parameter)
α     latency per message / ring step (s)    β     seconds per byte on one link direction, β = 1/B, B in bytes/s
γ     local reduction cost (s per byte)      c0    fixed cost per collective call (launch, Python, synchronisation)
====  =====================================  ====  ==================================================================

Sources: R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective Communication Operations in MPICH",
IJHPCA 19(1), 2005 (α-β-γ costs; ring and recursive-halving rows as published, tree and broadcast rows the textbook
forms); NVIDIA nccl-tests ``doc/PERFORMANCE.md`` (algbw/busbw factors); NCCL ``src/graph/tuning.cc`` (ring
latency); R. Hockney, Parallel Computing 20, 1994 (n½); Jiang et al., BytePS, OSDI 2020, Thm. 1.
"""
from __future__ import annotations

import math

__all__ = [
    "lg",
    "allreduce_ring",
    "allreduce_rabenseifner",
    "allreduce_recursive_doubling",
    "allreduce_tree",
    "allreduce_exchange",
    "allgather_ring",
    "reduce_scatter_ring",
    "broadcast_tree",
    "broadcast_scatter_allgather",
    "ALLREDUCE",
    "algbw",
    "busbw",
    "BUSBW_FACTOR",
    "hockney_half_size",
    "nccl_ring_latency_us",
    "byteps_bound",
]


def lg(p: int) -> int:
    """⌈log2 p⌉, the number of rounds of a tree or recursive-doubling algorithm (exact for powers of two)."""
    return max(0, math.ceil(math.log2(p))) if p >= 1 else 0


def allreduce_ring(p: int, M: float, α: float, β: float, γ: float = 0.0, c0: float = 0.0) -> float:
    """Ring allreduce, reduce-scatter then all-gather in 2(p−1) steps of M/p bytes.

    T = c0 + 2(p−1)α + 2(p−1)/p·Mβ + (p−1)/p·Mγ      (Thakur–Rabenseifner–Gropp 2005, ring row)
    """
    if p <= 1:
        return 0.0
    return c0 + 2 * (p - 1) * α + 2 * (p - 1) / p * M * β + (p - 1) / p * M * γ


def allreduce_rabenseifner(p: int, M: float, α: float, β: float, γ: float = 0.0, c0: float = 0.0) -> float:
    """Rabenseifner allreduce: recursive-halving reduce-scatter + recursive-doubling all-gather.

    T = c0 + 2·lg p·α + 2(p−1)/p·Mβ + (p−1)/p·Mγ     (Thakur–Rabenseifner–Gropp 2005; lg p = ⌈log2 p⌉,
    exact for powers of two, a lower bound otherwise)
    """
    if p <= 1:
        return 0.0
    return c0 + 2 * lg(p) * α + 2 * (p - 1) / p * M * β + (p - 1) / p * M * γ


def allreduce_recursive_doubling(p: int, M: float, α: float, β: float, γ: float = 0.0, c0: float = 0.0) -> float:
    """Recursive-doubling allreduce (short messages): T = c0 + lg p·(α + Mβ + Mγ)   (Thakur et al. 2005)."""
    if p <= 1:
        return 0.0
    return c0 + lg(p) * (α + M * β + M * γ)


def allreduce_tree(p: int, M: float, α: float, β: float, γ: float = 0.0, c0: float = 0.0) -> float:
    """Binomial-tree reduce followed by binomial-tree broadcast.

    T = c0 + 2⌈lg p⌉(α + Mβ) + ⌈lg p⌉·Mγ      (standard form, Thakur et al. 2005 §2)
    """
    if p <= 1:
        return 0.0
    return c0 + 2 * lg(p) * (α + M * β) + lg(p) * M * γ


def allreduce_exchange(p: int, M: float, α: float, β: float, γ: float = 0.0, c0: float = 0.0) -> float:
    """Two-collective allreduce (``pipesgd.comm.alltoall``): a pairwise-exchange all-to-all of M/p-byte chunks, each
    owner reduces its chunk, then a ring all-gather of the reduced chunks; two calls, each with its c0.

    T = 2c0 + 2(p−1)α + 2(p−1)/p·Mβ + (p−1)/p·Mγ      (Thakur et al. 2005: all-to-all by pairwise exchange,
    (p−1)α + (p−1)/p·Mβ, plus ``allgather_ring``)

    The same steps and bytes as ``allreduce_ring``, one call more: in the textbook the two differ by c0 alone. What
    sets them apart in practice is the implementation (our ring makes a Python round trip per step, the exchange
    two backend calls, or between hosts p-1 rounds of one peer each from ``pipesgd.comm.topology.PAIRWISE_MIN_BYTES``
    per peer on gloo over host memory: this formula's pairwise exchange), so ``calibrate`` fits each its own α and
    β, for the way it runs where it is calibrated."""
    if p <= 1:
        return 0.0
    return 2 * c0 + 2 * (p - 1) * α + 2 * (p - 1) / p * M * β + (p - 1) / p * M * γ


def allgather_ring(p: int, M: float, α: float, β: float) -> float:
    """Ring all-gather of a total of M bytes: T = (p−1)α + (p−1)/p·Mβ   (Thakur et al. 2005)."""
    if p <= 1:
        return 0.0
    return (p - 1) * α + (p - 1) / p * M * β


def reduce_scatter_ring(p: int, M: float, α: float, β: float, γ: float = 0.0) -> float:
    """Ring reduce-scatter of M bytes: T = (p−1)α + (p−1)/p·M(β + γ)   (Thakur et al. 2005)."""
    if p <= 1:
        return 0.0
    return (p - 1) * α + (p - 1) / p * M * (β + γ)


def broadcast_tree(p: int, M: float, α: float, β: float) -> float:
    """Binomial-tree broadcast: T = ⌈lg p⌉(α + Mβ)   (Thakur et al. 2005)."""
    if p <= 1:
        return 0.0
    return lg(p) * (α + M * β)


def broadcast_scatter_allgather(p: int, M: float, α: float, β: float) -> float:
    """Scatter + all-gather broadcast (van de Geijn): T = (lg p + p − 1)α + 2(p−1)/p·Mβ   (Thakur et al. 2005)."""
    if p <= 1:
        return 0.0
    return (lg(p) + p - 1) * α + 2 * (p - 1) / p * M * β


ALLREDUCE = {
    "ring": allreduce_ring,
    "rabenseifner": allreduce_rabenseifner,
    "recursive-doubling": allreduce_recursive_doubling,
    "tree": allreduce_tree,
    "exchange": allreduce_exchange,  # our all-to-all allreduce, not a backend algorithm (params.COLLECTIVES)
}

# nccl-tests doc/PERFORMANCE.md: busbw = algbw × factor(n).
BUSBW_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "in-network-allreduce": lambda n: (n - 1) / (n + 1),
}


def algbw(M: float, t: float) -> float:
    """Algorithm bandwidth S/t in bytes/s (nccl-tests)."""
    if t <= 0:
        raise ValueError(f"time must be positive, got {t}")
    return M / t


def busbw(n: int, M: float, t: float, operation: str = "allreduce") -> float:
    """Bus bandwidth algbw·factor, allreduce factor 2(n−1)/n (nccl-tests doc/PERFORMANCE.md)."""
    if operation not in BUSBW_FACTOR:
        raise ValueError(f"unknown operation {operation!r}; valid: {', '.join(BUSBW_FACTOR)}")
    return algbw(M, t) * BUSBW_FACTOR[operation](n)


def hockney_half_size(α: float, B: float) -> float:
    """Hockney n½ = t0·r∞ = α·B bytes: messages shorter than this are latency-bound (Hockney 1994)."""
    return α * B


def nccl_ring_latency_us(n: int, protocol: str = "Simple") -> float:
    """NCCL ring latency for 1 GPU per node: baseLat + 2(n−1)·netHopLat, µs (NCCL src/graph/tuning.cc)."""
    base = {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}
    hop = {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}
    if protocol not in base:
        raise ValueError(f"unknown NCCL protocol {protocol!r}; valid: {', '.join(base)}")
    return base[protocol] + 2 * (n - 1) * hop[protocol]


def byteps_bound(n: int, k: int, M: float, B: float) -> float:
    """BytePS optimal communication time with n workers and k CPU servers (OSDI'20 Thm. 1, 3rd-party):

    t = 2n(n−1)M / ((n² + kn − 2k)·B);  k = 0 gives the ring 2(n−1)M/(nB), k = n gives M/B.
    """
    return 2 * n * (n - 1) * M / ((n * n + k * n - 2 * k) * B)
