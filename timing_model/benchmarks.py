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

from .calibration import (BURST_BYTES, Calibration, Sample, copy_rate_from_timings, fit_codec_in_ring, fit_collective,
                          residual_table, slowdown_from_timings)

__all__ = ["cluster_sizes", "collect_samples", "measure_reduce", "measure_codecs", "measure_compute",
           "measure_overlap", "model_load", "measure_copy", "measure_handoff", "overlap_sizes", "run_calibration"]


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


def _local_times(call: Callable[[], object], tensor, repeats: int, warmup: int = 3,
                 before: Callable[[], object] | None = None) -> list[float]:
    """Seconds of each of ``repeats`` calls of a local operation on ``tensor``, after ``warmup`` calls
    (and ``before()``, e.g. a barrier so all ranks measure together)."""
    for _ in range(warmup):
        call()
    if before is not None:
        before()
    times = []
    for _ in range(repeats):
        _sync(tensor)
        start = time.perf_counter()
        call()
        _sync(tensor)
        times.append(time.perf_counter() - start)
    return times


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
        times = _local_times(lambda: a.add_(b), a, repeats)
        samples.append(Sample("reduce", "local", "none", 1, float(a.numel() * 4), statistics.median(times)))
    return samples


def measure_codecs(names: list[str], numel: int = 1_000_000, device: str = "cpu",
                   notes: list | None = None) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """(encode_Bps, decode_Bps) per compressor and its error-feedback rate (bytes/s) via
    ``pipesgd.compression.throughput``; ({}, {}) without pipesgd."""
    try:
        from pipesgd.compression import build
        from pipesgd.compression.throughput import measure_codec_gbps, measure_feedback_gbps
    except ImportError as err:
        if notes is not None:
            notes.append(f"codec throughput not measured: {err}")
        return {}, {}
    speeds, feedback = {}, {}
    for name in names:
        if name == "none":
            continue
        enc_gbps, dec_gbps = measure_codec_gbps(build(name), numel, device=device)
        speeds[name] = (enc_gbps * 1e9, dec_gbps * 1e9)
        feedback[name] = measure_feedback_gbps(build(name), numel, device=device) * 1e9
    return speeds, feedback


def measure_compute(compute: dict, repeats: int = 10, device: str = "cpu") -> float:
    """Median seconds of forward + backward of a trainer model on random data (``model_load``)."""
    call, _, _ = model_load(compute, device)
    times = [call() for _ in range(repeats + 2)]
    return statistics.median(times[2:])


def overlap_sizes(sizes_bytes: list[int], count: int = 3) -> list[int]:
    """Up to ``count`` sizes for the interference measurement: smallest, middle and largest of the grid at or
    above ``BURST_BYTES`` (all sizes if none is that large)."""
    big = sorted(n for n in sizes_bytes if n >= BURST_BYTES) or sorted(sizes_bytes)
    if len(big) <= count:
        return big
    picks = [big[round(i * (len(big) - 1) / (count - 1))] for i in range(count)]
    return list(dict.fromkeys(picks))


def _median_slowest(times: list[float], device) -> float:
    import torch.distributed as dist

    return _slowest(statistics.median(times), dist.group.WORLD, device)


def _matmul_load(device, n: int = 256) -> tuple[Callable[[], float], str]:
    """A compute load for the interference probe: one n×n fp32 matmul per call; returns (call, label)."""
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)

    def call() -> float:
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(a)
        return time.perf_counter() - start

    return call, f"matmul {n}x{n}"


def model_load(compute: dict, device: str = "cpu") -> tuple[Callable[[], float], str, int]:
    """One forward + backward of a trainer model on random data per call, timed; the compute of a training
    step, used for the compute time and as the interference probe's load. ``compute`` = {'model',
    'input_shape', 'num_classes', 'batch_size'[, 'hidden']}; returns (call, label, gradient bytes)."""
    import torch
    from pipesgd.train.models import build_model, grad_bytes

    opts = {"hidden": compute["hidden"]} if compute.get("hidden") else {}
    model = build_model(compute["model"], tuple(compute["input_shape"]), compute["num_classes"], **opts).to(device)
    x = torch.randn(compute["batch_size"], *compute["input_shape"], device=device)
    y = torch.randint(0, compute["num_classes"], (compute["batch_size"],), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def call() -> float:
        _sync(x)
        start = time.perf_counter()
        loss_fn(model(x), y).backward()
        _sync(x)
        seconds = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return seconds

    return call, f"{compute['model']} forward+backward, batch {compute['batch_size']}", grad_bytes(model)


def _trainer_collective(compression: str) -> Callable:
    """The allreduce a PipeSGD step runs for ``compression`` (``allreduce="auto"``): the backend's all_reduce
    when uncompressed, our ring with the codec on every hop otherwise."""
    import torch.distributed as dist

    from pipesgd import ring_allreduce

    if compression == "none":
        return lambda tensor: dist.all_reduce(tensor)
    return lambda tensor: ring_allreduce(tensor, compression=compression, op="mean")


def measure_overlap(sizes_bytes: list[int], repeats: int = 10, warmup: int = 2, device: str = "cpu",
                    load: tuple[Callable[[], float], str] | None = None,
                    compressions: tuple[str, ...] = ("none",)) -> dict:
    """Interference between the gradient allreduce and compute, on every rank of the world group (all ranks
    must call it).

    As in the trainer, the allreduce (``_trainer_collective``: the backend's when uncompressed, our ring per
    codec otherwise) runs on the background communication thread (``pipesgd.comm_worker``) and the compute on
    the main thread: ``load`` = (call, label), by default a loop of 256² fp32 matmuls; ``calibrate --model``
    passes the model's own forward + backward (``model_load``), which loads the cores as training does.
    Per compression and size:
      Step 1: allreduce alone: warm-up, barrier, ``repeats`` timed calls on the worker thread.
      Step 2: allreduce together: the same while the main thread runs the load, each call timed.
      Step 3: load alone (once): ``max(20, repeats)`` timed calls on the main thread.
    Each value is the slowest rank's median. κc = median over sizes of together/alone − 1, per compression
    (``comm_slowdown_by_codec``; ``comm_slowdown`` is the uncompressed one, else the first measured), and
    κ = median over all rows of load together/alone − 1 (``slowdown_from_timings``).
    """
    import torch
    import torch.distributed as dist

    from pipesgd.comm_worker import CommWorker

    compute, label = load or _matmul_load(device)

    def collectives(tensor, collective) -> list[float]:
        for _ in range(warmup):
            collective(tensor)
        dist.barrier()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            collective(tensor)
            _sync(tensor)
            times.append(time.perf_counter() - start)
        return times

    for _ in range(3):
        compute()
    dist.barrier()
    load_alone = _median_slowest([compute() for _ in range(max(20, repeats))], device)
    worker = CommWorker(device)
    rows, handoff = [], []
    try:
        for compression in compressions:
            collective = _trainer_collective(compression)
            for n_bytes in sizes_bytes:
                tensor = torch.ones(max(1, n_bytes // 4), dtype=torch.float32, device=device)
                alone = worker.submit(collectives, tensor, collective).wait()  # Step 1
                if compression == compressions[0]:
                    handoff.extend(_handoff_gaps(worker, tensor, repeats))
                dist.barrier()
                work = worker.submit(collectives, tensor, collective)  # Step 2
                load_times = []
                while not work.is_completed():
                    load_times.append(compute())
                together = work.wait()
                rows.append({"compression": compression, "n_bytes": float(tensor.numel() * 4),
                             "ring_alone_s": _median_slowest(alone, device),
                             "ring_together_s": _median_slowest(together, device),
                             "load_alone_s": load_alone,
                             "load_together_s": _median_slowest(load_times or [load_alone], device)})
                dist.barrier()
    finally:
        worker.close()
    by_codec = {c: slowdown_from_timings([r["ring_alone_s"] for r in rows if r["compression"] == c],
                                         [r["ring_together_s"] for r in rows if r["compression"] == c])
                for c in compressions}
    return {"comm_slowdown": by_codec.get("none", by_codec[compressions[0]]),
            "comm_slowdown_by_codec": by_codec,
            "compute_slowdown": slowdown_from_timings([r["load_alone_s"] for r in rows],
                                                      [r["load_together_s"] for r in rows]),
            "load": label, "overlap": rows,
            "handoff_ring_s": _median_slowest(handoff, device) if handoff else None}


def _handoff_gaps(worker, tensor, repeats: int) -> list[float]:
    """Per ring job: (submit → wait returns) − the job's own busy time, i.e. the thread hand-off latency the
    trainer's ``step()`` pays around each ring on this (possibly oversubscribed) host."""
    from pipesgd import ring_allreduce

    gaps = []
    for _ in range(repeats):
        start = time.perf_counter()
        work = worker.submit(ring_allreduce, tensor, "none", "mean")
        work.wait()
        gaps.append(max(0.0, time.perf_counter() - start - work.busy_s))
    return gaps


def measure_copy(sizes_bytes: list[int], repeats: int = 20, device: str = "cpu") -> dict:
    """Gradient pack/unpack copy rate: slowest rank's median time of ``dst.copy_(src)`` on fp32 tensors of each
    size, on every rank at once (all ranks must call it); copy_Bps = median over sizes of bytes / seconds."""
    import torch
    import torch.distributed as dist

    rows = []
    for n_bytes in sizes_bytes:
        src = torch.ones(max(1, n_bytes // 4), device=device)
        dst = torch.empty_like(src)
        times = _local_times(lambda: dst.copy_(src), src, repeats, before=dist.barrier)
        rows.append({"n_bytes": float(src.numel() * 4), "seconds": _median_slowest(times, device)})
    rate = copy_rate_from_timings([r["n_bytes"] for r in rows], [r["seconds"] for r in rows])
    return {"copy_Bps": rate, "copy": rows}


def measure_handoff(repeats: int = 50, device: str = "cpu") -> float:
    """Thread hand-off: slowest rank's median seconds to submit a no-op to the communication worker and wait
    for its result (all ranks must call it)."""
    from pipesgd.comm_worker import CommWorker

    worker = CommWorker(device)
    try:
        for _ in range(5):
            worker.submit(lambda: None).wait()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            worker.submit(lambda: None).wait()
            times.append(time.perf_counter() - start)
    finally:
        worker.close()
    return _median_slowest(times, device)


def measure_host(sizes_bytes: list[int], repeats: int, warmup: int, device: str, overlap: bool,
                 notes: list, compute: dict | None = None, compressions: tuple[str, ...] = ("none",)) -> dict:
    """The ``host`` record of the calibration (κ, κc, copy rate, hand-off); every rank must call it.

    With a ``compute`` model the interference probe loads the cores with that model's forward + backward and
    reduces its own gradient size with each of ``compressions``, as a training step would; without one it
    runs the matmul load beside uncompressed allreduces of up to three grid sizes."""
    host: dict = {}
    try:
        if overlap and compute:
            call, label, grad_bytes = model_load(compute, device)
            # one size per codec, so afford more calls: scheduling on shared cores makes each one noisy
            host.update(measure_overlap([grad_bytes], max(repeats, 30), warmup, device, (call, label), compressions))
        elif overlap:
            host.update(measure_overlap(overlap_sizes(sizes_bytes), repeats, warmup, device))
        host.update(measure_copy(sizes_bytes, max(repeats, 10), device))
        host["handoff_noop_s"] = measure_handoff(device=device)
        # the hand-off around a real ring (wake-ups on a loaded host) when measured, else the no-op round trip
        host["handoff_s"] = host.get("handoff_ring_s") or host["handoff_noop_s"]
    except ImportError as err:
        notes.append(f"interference / hand-off not measured: {err}")
    return host


def run_calibration(sizes_bytes: list[int], repeats: int = 20, warmup: int = 5,
                    compressions: tuple[str, ...] = ("none",), include_ring: bool = True, device: str = "cpu",
                    compute: dict | None = None, overlap: bool = True, min_fit_bytes: float = 0.0
                    ) -> Calibration | None:
    """Measure on every rank, fit on rank 0; rank 0 returns the ``Calibration``, other ranks ``None``.

    ``compute`` = {'model', 'input_shape', 'num_classes', 'batch_size'} also times a trainer model.
    ``overlap`` also measures κ and κc (``measure_overlap``; needs our ring); the copy rate and hand-off are
    always measured. ``min_fit_bytes`` leaves smaller allreduce samples out of the fits (still in the residuals).
    """
    import datetime

    import torch.distributed as dist

    from .params import CODEC_RATIOS

    notes: list[str] = []
    samples = collect_samples(sizes_bytes, repeats, warmup, compressions, include_ring, device, notes)
    host = measure_host(sizes_bytes, repeats, warmup, device, overlap and include_ring and dist.get_world_size() > 1,
                        notes, compute, tuple(dict.fromkeys(("none", *compressions))))
    if dist.get_rank() != 0:
        return None
    samples += measure_reduce(sizes_bytes, repeats, device)
    codecs, feedback = measure_codecs(list(compressions), device=device, notes=notes)
    compute_record = None
    if compute:
        seconds = measure_compute(compute, device=device)
        compute_record = {"model": compute["model"], "batch_size": compute["batch_size"], "compute_s": seconds}
        if compute.get("hidden"):
            compute_record["hidden"] = compute["hidden"]
    fits, residuals, factors = {}, [], {}
    for collective in ("ring", "backend"):
        if not any(s.collective == collective for s in samples):
            continue
        try:
            fits[collective] = fit_collective(samples, collective, min_bytes=min_fit_bytes)
        except ValueError as err:  # noisy timings on a busy machine: keep the other fit, say why
            notes.append(f"{collective}: {err}")
            continue
        if collective == "ring":  # the codec as it runs inside our ring, from the compressed ring samples
            factors = fit_codec_in_ring(samples, fits["ring"], codecs, CODEC_RATIOS, min_bytes=min_fit_bytes)
        residuals += residual_table([s for s in samples if s.collective == collective], fits[collective],
                                    codecs=codecs, ratios=CODEC_RATIOS, factors=factors)
    if not fits:
        raise ValueError("calibration failed: " + "; ".join(notes))
    meta = {"created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "backend": dist.get_backend(), "device": device, "world_size": dist.get_world_size(),
            "grid": {"nodes": cluster_sizes(dist.get_world_size()), "sizes_bytes": list(sizes_bytes),
                     "repeats": repeats, "warmup": warmup, "compressions": list(compressions),
                     "min_fit_bytes": min_fit_bytes},
            "notes": notes}
    return Calibration(fits, codecs, compute_record, samples, residuals, meta, host, factors, feedback)
