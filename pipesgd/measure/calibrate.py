"""Everything ``pipesgd-timing calibrate`` measures, in its order: collectives and host timings on every rank, then
the local reduction, the codecs and the compute on rank 0; the fitting (``timing_model.fitting``) takes them as is."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from pipesgd.compression import build
from pipesgd.compression.throughput import measure_codec_gbps, measure_feedback_gbps
from pipesgd.measure.allreduce import cluster_sizes, collect_samples, measure_reduce
from pipesgd.measure.compute import measure_compute
from pipesgd.measure.host import measure_host

__all__ = ["CalibrationMeasurements", "measure_codecs", "measure_calibration"]


@dataclass(slots=True)
class CalibrationMeasurements:
    """Rank 0's record of one calibration run (before any fitting)."""

    samples: list[dict]  # calibration-file sample records: all-reduce points, then local reduce points
    host: dict  # raw interference / copy / hand-off timings (``pipesgd.measure.host.measure_host``)
    codecs: dict[str, tuple[float, float]]  # name -> isolated (encode, decode) bytes/s
    feedback: dict[str, float]  # name -> isolated error-feedback bytes/s
    compute_s: float | None  # median forward + backward of the given model (None: no model)
    backend: str  # process-group backend
    world_size: int
    nodes: list[int]  # cluster sizes measured (``cluster_sizes``)
    notes: list[str] = field(default_factory=list)


def measure_codecs(names: list[str], numel: int = 1_000_000, device: str = "cpu"
                   ) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """(encode_Bps, decode_Bps) per compressor and its error-feedback rate (bytes/s), via
    ``pipesgd.compression.throughput``; the lossless ``none`` is skipped."""
    speeds, feedback = {}, {}
    for name in names:
        if name == "none":
            continue
        enc_gbps, dec_gbps = measure_codec_gbps(build(name), numel, device=device)
        speeds[name] = (enc_gbps * 1e9, dec_gbps * 1e9)
        feedback[name] = measure_feedback_gbps(build(name), numel, device=device) * 1e9
    return speeds, feedback


def measure_calibration(sizes_bytes: list[int], repeats: int = 20, warmup: int = 5,
                        compressions: tuple[str, ...] = ("none",), include_ring: bool = True, device: str = "cpu",
                        compute: dict | None = None, overlap: bool = True,
                        overlap_sizes_bytes: list[int] | None = None) -> CalibrationMeasurements | None:
    """Measure on every rank; rank 0 returns the ``CalibrationMeasurements``, other ranks ``None``. ``compute`` also
    times a trainer model and makes it the interference load; ``overlap`` measures the interference (our ring,
    >= 2 ranks), beside all-reduces of ``overlap_sizes_bytes`` when no model is given."""
    world = dist.get_world_size()
    samples = collect_samples(sizes_bytes, repeats, warmup, compressions, include_ring, device)
    host = measure_host(sizes_bytes, list(overlap_sizes_bytes or sizes_bytes), repeats, warmup, device,
                        overlap and include_ring and world > 1, compute, tuple(dict.fromkeys(("none", *compressions))))
    if dist.get_rank() != 0:
        return None
    samples += measure_reduce(sizes_bytes, repeats, device)
    codecs, feedback = measure_codecs(list(compressions), device=device)
    compute_s = measure_compute(compute, device=device) if compute else None
    return CalibrationMeasurements(samples, host, codecs, feedback, compute_s, dist.get_backend(), world,
                                   cluster_sizes(world))
