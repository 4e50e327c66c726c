"""Micro-benchmarks behind ``pipesgd-timing calibrate``: collectives over a grid, local reduction, codecs, compute.

Run on every rank of an initialised process group. Per grid point (REFERENCES §3):
  Step 1: 5 warm-up calls, then a barrier of the sub-group.
  Step 2: time ≥ 20 calls one by one; keep this rank's median.
  Step 3: all_reduce(MAX) of the medians, so the point is the slowest rank's time.
Cluster sizes are sub-groups of the first p ranks (powers of two up to the world size, and the world
size), so overhead and latency separate. torch and pipesgd are imported here only, never by the
pure model modules.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from .calibration import Calibration, Sample, fit_collective, residual_table

__all__ = ["cluster_sizes", "collect_samples", "measure_reduce", "measure_codecs", "measure_compute", "run_calibration"]


def cluster_sizes(world_size: int) -> list[int]:
    """2, 4, 8, ... up to ``world_size``, plus ``world_size`` itself."""
    sizes, p = [], 2
    while p <= world_size:
        sizes.append(p)
        p *= 2
    if world_size >= 2 and world_size not in sizes:
        sizes.append(world_size)
    return sizes


def _sync(tensor) -> None:
    import torch

    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)


def _time_calls(call: Callable[[], object], tensor, warmup: int, repeats: int, group) -> float:
    import torch.distributed as dist

    for _ in range(warmup):  # Step 1
        call()
    _sync(tensor)
    dist.barrier(group=group)
    times = []
    for _ in range(repeats):  # Step 2
        start = time.perf_counter()
        call()
        _sync(tensor)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _slowest(value: float, group, device) -> float:
    """Step 3: the slowest rank's median."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _ring_call(tensor, compression: str, group):
    from pipesgd import ring_allreduce  # lazy: the trainer package is optional for prediction

    return lambda: ring_allreduce(tensor, compression=compression, op="mean", group=group)


def collect_samples(sizes_bytes: list[int], repeats: int = 20, warmup: int = 5,
                    compressions: tuple[str, ...] = ("none",), include_ring: bool = True,
                    device: str = "cpu", notes: list | None = None) -> list[Sample]:
    """Time our ring and the backend all_reduce over sub-groups × sizes; rank 0 (a member of every sub-group)
    returns all samples, other ranks those of the sub-groups they belong to."""
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    samples: list[Sample] = []
    if include_ring:
        try:
            from pipesgd import ring_allreduce  # noqa: F401 - only checks that the ring exists
        except ImportError as err:
            include_ring = False
            if notes is not None:
                notes.append(f"our ring not measured: {err}")
    for p in cluster_sizes(world):
        group = dist.new_group(ranks=list(range(p))) if p < world else None
        member = rank < p
        for n_bytes in sizes_bytes:
            numel = max(1, n_bytes // 4)
            tensor = torch.ones(numel, dtype=torch.float32, device=device)
            impls = [("backend", "none", lambda t=tensor, g=group: dist.all_reduce(t, group=g))]
            if include_ring:
                impls += [("ring", c, _ring_call(tensor, c, group)) for c in compressions]
            for collective, compression, call in impls:
                if member:
                    median = _time_calls(call, tensor, warmup, repeats, group)
                    seconds = _slowest(median, group, device)
                    samples.append(Sample("allreduce", collective, compression, p, float(numel * 4), seconds))
        dist.barrier()
    return samples


def measure_reduce(sizes_bytes: list[int], repeats: int = 20, device: str = "cpu") -> list[Sample]:
    """Local reduction rate: median time of ``a.add_(b)`` on fp32 tensors of each size."""
    import torch

    samples = []
    for n_bytes in sizes_bytes:
        a = torch.ones(max(1, n_bytes // 4), device=device)
        b = torch.ones_like(a)
        for _ in range(3):
            a.add_(b)
        times = []
        for _ in range(repeats):
            _sync(a)
            start = time.perf_counter()
            a.add_(b)
            _sync(a)
            times.append(time.perf_counter() - start)
        samples.append(Sample("reduce", "local", "none", 1, float(a.numel() * 4), statistics.median(times)))
    return samples


def measure_codecs(names: list[str], numel: int = 1_000_000, device: str = "cpu",
                   notes: list | None = None) -> dict[str, tuple[float, float]]:
    """(encode_Bps, decode_Bps) per compressor via ``pipesgd.compression.throughput.measure_codec_gbps``."""
    try:
        from pipesgd.compression import build
        from pipesgd.compression.throughput import measure_codec_gbps
    except ImportError as err:
        if notes is not None:
            notes.append(f"codec throughput not measured: {err}")
        return {}
    out = {}
    for name in names:
        if name == "none":
            continue
        enc_gbps, dec_gbps = measure_codec_gbps(build(name), numel, device=device)
        out[name] = (enc_gbps * 1e9, dec_gbps * 1e9)
    return out


def measure_compute(model_name: str, input_shape: tuple[int, ...], num_classes: int, batch_size: int,
                    repeats: int = 10, device: str = "cpu") -> float:
    """Median seconds of forward + backward of a trainer model on random data."""
    import torch
    from pipesgd.train.models import build_model

    model = build_model(model_name, input_shape, num_classes).to(device)
    x = torch.randn(batch_size, *input_shape, device=device)
    y = torch.randint(0, num_classes, (batch_size,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for i in range(repeats + 2):
        _sync(x)
        start = time.perf_counter()
        loss_fn(model(x), y).backward()
        _sync(x)
        if i >= 2:
            times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return statistics.median(times)


def run_calibration(sizes_bytes: list[int], repeats: int = 20, warmup: int = 5,
                    compressions: tuple[str, ...] = ("none",), include_ring: bool = True, device: str = "cpu",
                    compute: dict | None = None) -> Calibration | None:
    """Measure on every rank, fit on rank 0; rank 0 returns the ``Calibration``, other ranks ``None``.

    ``compute`` = {'model', 'input_shape', 'num_classes', 'batch_size'} also times a trainer model.
    """
    import datetime

    import torch.distributed as dist

    from .params import CODEC_RATIOS

    notes: list[str] = []
    samples = collect_samples(sizes_bytes, repeats, warmup, compressions, include_ring, device, notes)
    if dist.get_rank() != 0:
        return None
    samples += measure_reduce(sizes_bytes, repeats, device)
    codecs = measure_codecs(list(compressions), device=device, notes=notes)
    compute_record = None
    if compute:
        seconds = measure_compute(compute["model"], tuple(compute["input_shape"]), compute["num_classes"],
                                  compute["batch_size"], device=device)
        compute_record = {"model": compute["model"], "batch_size": compute["batch_size"], "compute_s": seconds}
    fits, residuals = {}, []
    for collective in ("ring", "backend"):
        if not any(s.collective == collective for s in samples):
            continue
        try:
            fits[collective] = fit_collective(samples, collective)
        except ValueError as err:  # noisy timings on a busy machine: keep the other fit, say why
            notes.append(f"{collective}: {err}")
            continue
        residuals += residual_table([s for s in samples if s.collective == collective], fits[collective],
                                    codecs=codecs, ratios=CODEC_RATIOS)
    if not fits:
        raise ValueError("calibration failed: " + "; ".join(notes))
    meta = {"created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "backend": dist.get_backend(), "device": device, "world_size": dist.get_world_size(),
            "grid": {"nodes": cluster_sizes(dist.get_world_size()), "sizes_bytes": list(sizes_bytes),
                     "repeats": repeats, "warmup": warmup, "compressions": list(compressions)},
            "notes": notes}
    return Calibration(fits, codecs, compute_record, samples, residuals, meta)
