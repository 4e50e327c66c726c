"""From one calibration run's measurements to a ``Calibration``: the fits of both all-reduces, the in-ring codec
factors, the residuals and the host terms. Pure: the measurements come from ``pipesgd.measure`` (torch).

Steps of ``fit_calibration`` (rank 0, after every rank measured):
  Step 1: per all-reduce ('ring', 'backend') with samples: ``fit_collective``; a fit that fails leaves a note
          and the other fit stands.
  Step 2: from the compressed ring samples, the codec cost inside our ring (``fit_codec_in_ring``).
  Step 3: residuals of every sample against its fit; no fit at all raises ``ValueError``.
"""
from __future__ import annotations

import statistics

from .calibration import BURST_BYTES, Calibration, Sample, fit_codec_in_ring, fit_collective, residual_table
from .empirical.host_terms import (copy_rate_from_timings, lockstep_from_timings, ps_service_terms,
                                   slowdown_from_timings)
from .empirical.overlap import window_loss
from .params import CODEC_RATIOS

__all__ = ["overlap_sizes", "host_record", "fit_calibration"]


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
    fits, residuals, factors = {}, [], {}
    for collective in ("ring", "backend"):
        if not any(s.collective == collective for s in samples):
            continue
        try:  # Step 1
            fits[collective] = fit_collective(samples, collective, min_bytes=min_fit_bytes)
        except ValueError as err:  # noisy timings on a busy machine: keep the other fit, say why
            notes.append(f"{collective}: {err}")
            continue
        if collective == "ring":  # Step 2: the codec as it runs inside our ring
            factors = fit_codec_in_ring(samples, fits["ring"], codecs, CODEC_RATIOS, min_bytes=min_fit_bytes)
        residuals += residual_table([s for s in samples if s.collective == collective], fits[collective],  # Step 3
                                    codecs=codecs, ratios=CODEC_RATIOS, factors=factors)
    if not fits:
        raise ValueError("calibration failed: " + "; ".join(notes))
    return Calibration(fits, codecs, compute, list(samples), residuals, meta, host, factors, feedback)
