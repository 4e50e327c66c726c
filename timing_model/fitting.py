"""From one calibration run's measurements to a ``Calibration``: the fits of the all-reduces, the in-ring codec
factors, the residuals and the host terms. Pure: the measurements come from ``pipesgd.measure`` (torch).

Steps of ``fit_calibration`` (rank 0, after every rank measured):
  Step 1: per all-reduce ('ring', 'backend', 'alltoall') with samples: ``fit_collective`` with its formula
          (``ALGORITHM_OF``); a fit that fails leaves a note and the others stand.
  Step 2: from the compressed samples, the codec cost inside our ring and inside our exchange: a factor on its
          isolated time and a fixed cost per call (``fit_codec_costs``).
  Step 3: residuals of every sample against its fit; no fit at all raises ``ValueError``.
"""
from __future__ import annotations

import math
import statistics

import numpy as np

from .calibration import BURST_BYTES, Calibration, Fit, Sample, compressed_parts, residual_table
from .core import collectives
from .empirical.host_terms import (copy_rate_from_timings, lockstep_from_timings, ps_service_terms,
                                   slowdown_from_timings)
from .empirical.overlap import window_loss
from .params import CODEC_RATIOS

__all__ = ["overlap_sizes", "host_record", "fit_calibration", "fit_collective", "fit_codec_costs", "ALGORITHM_OF"]

# The α-β-γ formula (``core.collectives.ALLREDUCE``) each timed all-reduce is fitted with; the others: the ring's.
ALGORITHM_OF = {"alltoall": "exchange"}
# The unknowns of ``fit_collective``, in the order of ``_features``' columns.
_PARAMS = ("overhead_s", "latency_s", "sec_per_byte", "reduce_sec_per_byte", "reduce_call_s")


def _features(sample: Sample, algorithm: str) -> list[float]:
    """The sample's model row: coefficient of each unknown in ``_PARAMS`` order."""
    if sample.kind == "reduce":
        return [0.0, 0.0, 0.0, sample.n_bytes, 1.0]
    fn = collectives.ALLREDUCE[algorithm]
    workers, n_bytes = sample.nodes, sample.n_bytes
    return [fn(workers, n_bytes, 0.0, 0.0, 0.0, 1.0), fn(workers, n_bytes, 1.0, 0.0, 0.0, 0.0),
            fn(workers, n_bytes, 0.0, 1.0, 0.0, 0.0), fn(workers, n_bytes, 0.0, 0.0, 1.0, 0.0), 0.0]


def _solve_nonnegative(A: np.ndarray, b: np.ndarray, active: list[int]) -> np.ndarray:
    """Non-negative least squares over the columns in ``active`` (scipy's NNLS, Lawson-Hanson); the others stay 0.
    The columns are scaled to unit norm first: seconds-per-byte and per-call terms differ by ~10 orders."""
    from scipy.optimize import nnls  # only when fitting: predict and sweep start without scipy

    x = np.zeros(A.shape[1])
    if active:
        columns = A[:, active]
        norms = np.linalg.norm(columns, axis=0)
        norms[norms == 0] = 1.0
        x[active] = nnls(columns / norms, b)[0] / norms
    return x


def fit_collective(samples: list[Sample], collective: str = "ring", algorithm: str = "ring",
                   min_bytes: float = 0.0) -> Fit:
    """Fit c0, α, β (and γ when ``reduce`` samples exist) to the uncompressed samples of ``collective``.

    Least squares on *relative* error (REFERENCES §3), i.e. minimise Σ ((model_i − t_i)/t_i)², so small messages
    (which fix latency) weigh as much as large ones (which fix bandwidth). The model is linear in its unknowns, so
    each row is the formula evaluated at a unit vector of (overhead, latency, seconds-per-byte, reduce
    seconds-per-byte), divided by t_i, solved as non-negative least squares (an estimate that would go negative is
    fixed at zero and the rest refitted).

    Identifiability: overhead and latency separate only with ≥ 2 cluster sizes (else overhead is fixed at 0 and
    latency absorbs it); the reduction rate separates from bandwidth only through local ``reduce`` samples
    (timings of ``add_``), else it is fixed at infinity (free) and bandwidth absorbs it. Each such choice leaves a
    note on the fit.

    Allreduce samples below ``min_bytes`` are left out of the fit (e.g. ``BURST_BYTES`` on a tc-tbf shaped
    link, whose burst lets small messages leave at line rate); if samples below ``BURST_BYTES`` remain, a note
    says so.
    """
    # Step 1: keep the samples this fit may use.
    use = [s for s in samples if (s.kind == "allreduce" and s.collective == collective and s.compression == "none"
                                  and s.nodes >= 2 and s.n_bytes >= min_bytes) or s.kind == "reduce"]
    coll = [s for s in use if s.kind == "allreduce"]
    if len(coll) < 2:
        raise ValueError(f"need at least 2 uncompressed allreduce samples of {collective!r} over >= 2 ranks"
                         f"{f' of >= {min_bytes:.0f} bytes' if min_bytes else ''}, got {len(coll)}")
    notes, active = [], [0, 1, 2, 3, 4]
    small = sum(s.n_bytes < BURST_BYTES for s in coll)
    if small:
        notes.append(f"{small} samples below {BURST_BYTES} bytes: on a tc-tbf shaped link they may leave at burst "
                     f"(line) rate and bias latency/bandwidth; fit with min_bytes (calibrate --fit-min-bytes) to drop")
    # Step 2: drop the unknowns the grid cannot identify.
    if len({s.nodes for s in coll}) < 2:
        active.remove(0)
        notes.append("one cluster size only: overhead fixed at 0, latency absorbs it")
    if not any(s.kind == "reduce" for s in use):
        active.remove(3)
        active.remove(4)
        notes.append("no local reduce samples: reduction folded into bandwidth")
    # Step 3: weighted least squares on relative error, non-negative.
    A = np.array([_features(s, algorithm) for s in use]) / np.array([[s.seconds] for s in use])
    x = _solve_nonnegative(A, np.ones(len(use)), active)
    labels = {0: "overhead", 1: "latency", 3: "reduction"}
    notes += [f"{labels[j]} fitted below zero: fixed at 0" for j in labels if j in active and x[j] == 0.0]
    if x[2] <= 0:
        raise ValueError("fit gave no bandwidth term: add larger message sizes to the grid")
    fit = Fit(float(x[0]), float(x[1]), float(1.0 / x[2]), math.inf if x[3] <= 0 else float(1.0 / x[3]),
              len(coll), 0.0, 0.0, tuple(notes))
    errors = [abs(row["rel_err"]) for row in residual_table(coll, fit, algorithm)]
    return Fit(fit.overhead_s, fit.latency_s, fit.bandwidth_Bps, fit.reduce_Bps, len(coll),
               statistics.median(errors), max(errors), tuple(notes))


def fit_codec_costs(samples: list[Sample], fit: Fit, codecs: dict[str, tuple[float, float]],
                    ratios: dict[str, float], algorithm: str = "ring", min_bytes: float = 0.0,
                    collective: str = "ring") -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]:
    """Per compressor and cluster size p, the factor f >= 0 that scales its isolated codec time and the fixed
    seconds h >= 0 per call that together explain our compressed all-reduces (our reconstruction):
    measured_i ≈ wire_i + f·codec_i + h, with wire_i the uncompressed ``fit`` at ratio× the bandwidth and codec_i
    the per-hop codec time at the isolated throughput of ``codecs``. Returns (factors, call seconds).

    Two unknowns per (codec, p), non-negative least squares on relative error over the sizes. Per p because the
    codec is CPU work: where p ranks share fewer than p cores (the emulated cluster) each rank's codec runs at a
    share of a core, so f grows with p. f > 1: the codec costs more inside the all-reduce than alone; f < 1: the
    piecewise hops hide part of it behind the wire. h is what a compressed call costs whatever its size beyond
    the uncompressed one's latency: the bookkeeping of its pieces, a Python round trip per hop (on small
    buckets it dominates: experiments/RESULTS.md). With one size only h is not
    identified and stays 0. Samples below ``min_bytes`` and codecs without a throughput or without samples are
    left out (no factor: the model uses f = 1, h = 0). ``collective`` = "alltoall" (with ``algorithm``
    "exchange") fits the two-collective exchange's own terms, which its codec work (the ring's passes, no Python
    hop between them) does not share with the ring's.
    """
    factors: dict[str, dict[int, float]] = {}
    call_s: dict[str, dict[int, float]] = {}
    for name, speeds in codecs.items():
        rows = [s for s in samples if s.kind == "allreduce" and s.collective == collective and s.compression == name
                and s.nodes >= 2 and s.n_bytes >= min_bytes]
        for nodes in sorted({s.nodes for s in rows}):
            at = [s for s in rows if s.nodes == nodes]
            parts = [(s.seconds, *compressed_parts(s, fit, algorithm, {name: speeds}, ratios)) for s in at]
            if not any(codec > 0 for _, _, codec in parts):
                continue
            A = np.array([[codec / t, 1.0 / t] for t, _, codec in parts])
            b = np.array([1.0 - wire / t for t, wire, _ in parts])
            f, h = _solve_nonnegative(A, b, [0, 1] if len({s.n_bytes for s in at}) > 1 else [0])
            factors.setdefault(name, {})[nodes] = float(f)
            call_s.setdefault(name, {})[nodes] = float(h)
    return factors, call_s


def overlap_sizes(sizes_bytes: list[int], count: int = 3) -> list[int]:
    """Up to ``count`` sizes for the interference measurement: smallest, middle and largest of the grid at or
    above ``BURST_BYTES`` (all sizes if none is that large)."""
    big = sorted(n for n in sizes_bytes if n >= BURST_BYTES) or sorted(sizes_bytes)
    if len(big) <= count:
        return big
    picks = [big[round(i * (len(big) - 1) / (count - 1))] for i in range(count)]
    return list(dict.fromkeys(picks))


def host_record(raw: dict) -> dict:
    """The calibration's ``host`` record from the raw host timings of ``pipesgd.measure.host.measure_host``:
    κc per codec = median over sizes of ring together/alone − 1 (``comm_slowdown``: the uncompressed one, else the
    first measured), λ per codec = median over sizes of ``overlap.window_loss`` of the window probe's rows
    (``window_loss``, the same way; when that probe ran), κ = median over all rows of load together/alone − 1, the
    lockstep term (``lockstep_from_timings``, when the probe ran the model's synchronous steps), the DDP probe's step
    and compute (raw, when it ran), what error feedback
    adds to each lossy ring at the model's size (raw, when that probe ran), the parameter server's seconds per
    request (``ps_service_terms``, when its probe ran), the copy rate (``copy_rate_from_timings``) and the hand-off
    (around a real ring when measured, else the no-op round trip)."""
    host: dict = {}
    rows = raw.get("overlap")
    if rows:
        codecs = list(dict.fromkeys(r["compression"] for r in rows))
        per_codec = {c: [r for r in rows if r["compression"] == c] for c in codecs}
        by_codec = {c: slowdown_from_timings([r["ring_alone_s"] for r in mine], [r["ring_together_s"] for r in mine])
                    for c, mine in per_codec.items()}
        # λ per codec, where the window probe ran for every size of it (calibrations before it: κc only)
        loss = {c: statistics.median(window_loss(r["ring_alone_s"], r["load_window_s"], r["ring_window_s"])
                                     for r in mine)
                for c, mine in per_codec.items() if all(r.get("ring_window_s") for r in mine)}
        if loss:
            host.update({"window_loss": loss.get("none", next(iter(loss.values()))), "window_loss_by_codec": loss})
        host.update({"comm_slowdown": by_codec.get("none", by_codec[codecs[0]]), "comm_slowdown_by_codec": by_codec,
                     "compute_slowdown": slowdown_from_timings([r["load_alone_s"] for r in rows],
                                                               [r["load_together_s"] for r in rows]),
                     "load": raw["load"], "overlap": rows, "handoff_ring_s": raw.get("handoff_ring_s")})
    lockstep = raw.get("lockstep")
    if lockstep:
        host["lockstep"] = lockstep
        # a probe without the paired excess (before it was recorded): the difference of the medians
        excess = lockstep.get("excess_s", lockstep["period_s"] - lockstep["compute_max_s"])
        host["lockstep_s"] = lockstep_from_timings(excess, lockstep["ring_alone_s"])
    if raw.get("ddp_step"):  # raw: ``modes.predict_ddp`` needs the gradient's all-reduce to read it
        host["ddp_step"] = raw["ddp_step"]
    if raw.get("ps_round"):  # raw: ``host_terms`` reads the round, ``calibrated_scenario`` its size
        host["ps_round"] = raw["ps_round"]
    if raw.get("feedback_rings"):  # raw: ``Calibration.ring_feedback_speed`` turns each row's F into a rate
        host["feedback_rings"] = raw["feedback_rings"]
    if raw.get("ps_service"):
        host["ps_service"] = raw["ps_service"]
        host.update(ps_service_terms(raw["ps_service"]))
    if raw.get("copy"):
        copies = raw["copy"]
        host["copy_Bps"] = copy_rate_from_timings([r["n_bytes"] for r in copies], [r["seconds"] for r in copies])
        host["copy"] = copies
    if raw.get("handoff_noop_s") is not None:
        host["handoff_noop_s"] = raw["handoff_noop_s"]
        host["handoff_s"] = host.get("handoff_ring_s") or raw["handoff_noop_s"]
    return host


def fit_calibration(samples: list[Sample], codecs: dict[str, tuple[float, float]], feedback: dict[str, float],
                    compute: dict | None, host: dict, meta: dict, min_fit_bytes: float = 0.0) -> Calibration:
    """Fit the measured ``samples`` (Steps 1-3) into a ``Calibration`` carrying the other measurements as given.
    Fit failures are appended to ``meta['notes']``; all fits failing raises
    ``ValueError('calibration failed: ...')``."""
    notes = meta.setdefault("notes", [])
    fits, residuals, factors, call_s = {}, [], {"ring": {}, "alltoall": {}}, {"ring": {}, "alltoall": {}}
    for collective in ("ring", "backend", "alltoall"):
        if not any(s.collective == collective for s in samples):
            continue
        algorithm = ALGORITHM_OF.get(collective, "ring")
        try:  # Step 1
            fits[collective] = fit_collective(samples, collective, algorithm, min_bytes=min_fit_bytes)
        except ValueError as err:  # noisy timings on a busy machine: keep the other fit, say why
            notes.append(f"{collective}: {err}")
            continue
        if collective in factors:  # Step 2: the codec as it runs inside our ring, or our exchange
            factors[collective], call_s[collective] = fit_codec_costs(samples, fits[collective], codecs, CODEC_RATIOS,
                                                                      algorithm, min_fit_bytes, collective)
        residuals += residual_table([s for s in samples if s.collective == collective], fits[collective],  # Step 3
                                    algorithm, codecs=codecs, ratios=CODEC_RATIOS,
                                    factors=factors.get(collective) or factors["ring"],
                                    call_s=call_s.get(collective) or call_s["ring"])
    if not fits:
        raise ValueError("calibration failed: " + "; ".join(notes))
    return Calibration(fits, codecs, compute, list(samples), residuals, meta, host, factors["ring"], feedback,
                       factors["alltoall"], call_s["ring"], call_s["alltoall"])
