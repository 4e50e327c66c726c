"""The calibration's host terms: from raw probe timings to the compute and communication slow-downs (κ, κc), the
lockstep term, the copy rate and the server's service time (``fitting.host_record`` calls these; the window loss λ
comes from ``overlap.window_loss``), and from a calibration's ``host`` record to the model's inputs
(``host_terms``). Pure: no torch.
"""
from __future__ import annotations

import math
import statistics

from .server import closed_queue_response

__all__ = ["slowdown_from_timings", "lockstep_from_timings", "copy_rate_from_timings", "service_from_timings",
           "ps_service_terms", "host_terms"]


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
    """L = E − A: what a synchronous step of the lockstep probe (the model's forward + backward on every rank, then
    the blocking all-reduce) took beyond its slowest compute, E (the median over steps of the period less that
    step's slowest compute), and beyond the all-reduce timed alone, A. Signed: on a tc-tbf shaped link the token
    bucket refills while the ranks compute, so the all-reduce after compute can beat the back-to-back one, and a
    step then takes less than the two apart; on shared cores the ranks leave the collective at staggered times and
    contend for cores, and it takes more (experiments/RESULTS.md)."""
    if ring_alone_s < 0 or not all(map(math.isfinite, (excess_s, ring_alone_s))):
        raise ValueError("lockstep timings must be finite and the all-reduce alone >= 0")
    return excess_s - ring_alone_s


def copy_rate_from_timings(sizes_bytes: list[float], seconds: list[float]) -> float:
    """Memory-copy rate of ``dst.copy_(src)``: median over sizes of n_bytes / seconds, bytes/s."""
    if not sizes_bytes or len(sizes_bytes) != len(seconds) or min(seconds) <= 0:
        raise ValueError("copy rate needs equally many (>= 1) sizes and positive timings")
    return statistics.median(n / t for n, t in zip(sizes_bytes, seconds))


def service_from_timings(workers: int, think_s: float, response_s: float) -> float:
    """The server's seconds per request s that makes the queue of ``server.closed_queue_response`` answer
    ``workers`` workers, each thinking ``think_s`` between requests, in ``response_s`` on average: the response
    grows with s from 0 (s = 0) to at least s, so s lies in [0, response_s]; bisection to 1e-9 relative."""
    if workers < 1 or not all(map(math.isfinite, (think_s, response_s))) or think_s < 0 or response_s < 0:
        raise ValueError("service needs >= 1 worker and finite think and response times >= 0")
    low, high = 0.0, response_s
    while high - low > 1e-9 * max(response_s, 1e-12):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if closed_queue_response(workers, think_s, mid) < response_s else (low, mid)
    return 0.5 * (low + high)


def ps_service_terms(probe: dict) -> dict:
    """{'ps_service_s', 'ps_service_idle_s'} from the parameter-server probe's phases
    (``pipesgd.measure.server``): each phase's seconds per request (``service_from_timings``) where the phase has
    steps; a phase without any takes the other's (rank 0 finished at once, or never ahead of the remote workers)."""
    workers = int(probe["workers"])
    found = {}
    for phase in ("busy", "idle"):
        row = probe.get(phase) or {}
        if row.get("steps") and row.get("response_s") is not None:
            found[phase] = service_from_timings(workers, float(row["think_s"]), float(row["response_s"]))
    if not found:
        raise ValueError("the parameter-server probe recorded no remote step")
    busy = found.get("busy", found.get("idle"))
    return {"ps_service_s": busy, "ps_service_idle_s": found.get("idle", busy)}


def _lockstep(host: dict, ring_alone_s: float) -> float:
    """The signed lockstep term from the probe's record where it holds the paired excess (calibrations written
    before the term was signed stored it floored at 0), else the stored ``lockstep_s``. With ``ring_alone_s`` > 0
    (the anchor that the prediction adds, ``Calibration.ring_anchor_s``) the excess is taken beyond that, not beyond
    the probe's own all-reduce alone: then the model, given the probe's compute, gives the probe's period exactly.
    Why: two timings of one all-reduce alone (on the probe's thread, and the anchor's) can differ by more than the
    term on short steps (experiments/RESULTS.md)."""
    record = host.get("lockstep") or {}
    if isinstance(record, dict) and record.get("excess_s") is not None and record.get("ring_alone_s") is not None:
        return lockstep_from_timings(float(record["excess_s"]), ring_alone_s or float(record["ring_alone_s"]))
    return float(host.get("lockstep_s") or 0.0)


def _ps_round(host: dict, nodes: int, grad_bytes: float) -> float:
    """The ps-sync probe's round (``pipesgd.measure.ps_round``: what a step took beyond its slowest compute and
    the server's update), where it ran at ``nodes`` ranks and ``grad_bytes`` (either 0: any); else 0. Why the
    match: the round is measured, not scaled, so it holds only for the gradient and the ranks it was timed with."""
    record = host.get("ps_round") or {}
    if not record.get("excess_s"):
        return 0.0
    if nodes and int(record["nodes"]) != nodes:
        return 0.0
    if grad_bytes and not math.isclose(float(record["grad_bytes"]), grad_bytes, rel_tol=1e-6):
        return 0.0
    return max(0.0, float(record["excess_s"]))


def _by_codec(host: dict, key: str, compression: str):
    """``host[key + '_by_codec'][compression]`` where the probe measured it per codec, else ``host[key]``."""
    by_codec = host.get(f"{key}_by_codec") or {}
    if not isinstance(by_codec, dict):
        raise ValueError(f"{key}_by_codec must be an object")
    return by_codec.get(compression, host.get(key))


def host_terms(host: dict, compression: str = "none", ring_alone_s: float = 0.0, nodes: int = 0,
               grad_bytes: float = 0.0) -> dict:
    """The model inputs of a calibration's ``host`` record: slowdown (κ), comm_slowdown (κc of ``compression``
    when the probe measured it per codec, else the uncompressed one), window_loss (λ, the same way; None when
    the window probe did not run), lockstep_s, the DDP probe's ddp_step_s and ddp_compute_s (0 when it did not
    run), copy_Bps (inf when absent or null), handoff_s and the parameter server's seconds per request while its
    co-located worker trains and after (ps_service_s, ps_service_idle_s), the ps-sync probe's round ps_round_s
    (``_ps_round``: 0 where it did not run, or ran at other ``nodes`` or ``grad_bytes`` than those given); zeros /
    inf (the pure formula) when not calibrated."""
    host = host or {}
    copy = host.get("copy_Bps")
    comm, loss = _by_codec(host, "comm_slowdown", compression), _by_codec(host, "window_loss", compression)
    ddp = host.get("ddp_step") or {}
    return {"slowdown": float(host.get("compute_slowdown") or 0.0),
            "comm_slowdown": float(comm or 0.0),
            "window_loss": None if loss is None else float(loss),
            "lockstep_s": _lockstep(host, ring_alone_s),
            # the DDP step beyond its compute alone, not beyond the lockstep probe's compute: held-out runs
            # chose between the two (experiments/results/fidelity/report.md)
            "ddp_step_s": float(ddp.get("period_s") or 0.0), "ddp_compute_s": float(ddp.get("compute_s") or 0.0),
            "copy_Bps": math.inf if not copy else float(copy),
            "handoff_s": float(host.get("handoff_s") or 0.0),
            "ps_service_s": float(host.get("ps_service_s") or 0.0),
            "ps_service_idle_s": float(host.get("ps_service_idle_s") or 0.0),
            "ps_round_s": _ps_round(host, nodes, grad_bytes)}
