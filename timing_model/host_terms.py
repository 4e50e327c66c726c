"""The calibration's host terms: from raw probe timings to κ, κc, the lockstep term and the copy rate
(``fitting.host_record`` calls these), and from a calibration's ``host`` record to the model's inputs
(``host_terms``). Pure: no torch.
"""
from __future__ import annotations

import math
import statistics

__all__ = ["slowdown_from_timings", "lockstep_from_timings", "copy_rate_from_timings", "host_terms"]


def slowdown_from_timings(alone_s: list[float], together_s: list[float]) -> float:
    """Relative slow-down from paired timings of the same work alone and with the other side running
    (our reconstruction): κ = median_i(together_i / alone_i) − 1, floored at 0. Used for κ (matmul time with
    the ring running) and κc (ring time with a matmul loop running)."""
    if not alone_s or len(alone_s) != len(together_s):
        raise ValueError("slowdown needs equally many (>= 1) timings alone and together")
    if min(alone_s) <= 0 or min(together_s) <= 0:
        raise ValueError("slowdown timings must be > 0")
    return max(0.0, statistics.median(t / a for a, t in zip(alone_s, together_s)) - 1.0)


def lockstep_from_timings(excess_s: float, ring_alone_s: float) -> float:
    """L = max(0, E − A): what a synchronous step of the lockstep probe (the model's forward + backward on every
    rank, then the blocking all-reduce) took beyond its slowest compute, E (the median over steps of the period less
    that step's slowest compute), and beyond the all-reduce timed alone, A."""
    if ring_alone_s < 0 or not all(map(math.isfinite, (excess_s, ring_alone_s))):
        raise ValueError("lockstep timings must be finite and the all-reduce alone >= 0")
    return max(0.0, excess_s - ring_alone_s)


def copy_rate_from_timings(sizes_bytes: list[float], seconds: list[float]) -> float:
    """Memory-copy rate of ``dst.copy_(src)``: median over sizes of n_bytes / seconds, bytes/s."""
    if not sizes_bytes or len(sizes_bytes) != len(seconds) or min(seconds) <= 0:
        raise ValueError("copy rate needs equally many (>= 1) sizes and positive timings")
    return statistics.median(n / t for n, t in zip(sizes_bytes, seconds))


def host_terms(host: dict, compression: str = "none") -> dict:
    """The model inputs of a calibration's ``host`` record: slowdown (κ), comm_slowdown (κc of ``compression``
    when the probe measured it per codec, else the uncompressed one), lockstep_s, copy_Bps (inf when absent or
    null) and handoff_s; zeros / inf (the pure formula) when not calibrated."""
    host = host or {}
    copy = host.get("copy_Bps")
    by_codec = host.get("comm_slowdown_by_codec") or {}
    if not isinstance(by_codec, dict):
        raise ValueError("comm_slowdown_by_codec must be an object")
    comm = by_codec.get(compression, host.get("comm_slowdown"))
    return {"slowdown": float(host.get("compute_slowdown") or 0.0),
            "comm_slowdown": float(comm or 0.0),
            "lockstep_s": float(host.get("lockstep_s") or 0.0),
            "copy_Bps": math.inf if not copy else float(copy),
            "handoff_s": float(host.get("handoff_s") or 0.0)}
