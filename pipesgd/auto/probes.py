"""The timed calls every rank makes for the choice (an all-reduce at 1/64 of the gradient, each codec's encode and
decode), their agreement across ranks and the decision made once for all (``pipesgd.auto`` Steps 2 and 3)."""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from pipesgd.auto.clock import StepClock
from pipesgd.auto.knobs import CANDIDATES, SMALL_FRACTION
from pipesgd.compression import build
from pipesgd.compression.throughput import measure_codec_gbps, timing_vector

REPEATS = 2  # timed small all-reduces after the one that sets up: the least of them is the link's
CODEC_SAMPLE = 4_000_000  # elements at most for a codec's timed encode and decode


def measure(numel: int, device: torch.device, dtype: torch.dtype, group: dist.ProcessGroup | None,
            codecs: tuple[str, ...] = CANDIDATES, codec_options: dict | None = None) -> dict[str, float]:
    """Step 2 on this rank: seconds of an uncompressed all-reduce of 1/64 of ``numel`` elements (the least of
    ``REPEATS``: noise only adds) and every codec's encode/decode throughput (fp32 bytes/s), timed on every rank at
    once: where ranks share cores a codec runs at their shared speed, and timed alone it reads faster than it will run."""
    x = torch.zeros(max(numel // SMALL_FRACTION, 1), dtype=dtype, device=device)
    dist.all_reduce(x, group=group)  # the first call sets up what the next ones reuse
    times = []
    for _ in range(REPEATS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(x, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    measured = {"small_allreduce_s": min(times)}
    sample = min(numel, CODEC_SAMPLE)
    vector = timing_vector(sample, device) if codecs else None
    for codec in codecs:
        encode, decode = measure_codec_gbps(build(codec, **(codec_options or {})), sample, 1, device, vector)
        measured[f"{codec}_encode_Bps"], measured[f"{codec}_decode_Bps"] = encode * 1e9, decode * 1e9
    return measured


def agreed(measured: dict[str, float], group: dist.ProcessGroup | None, device: torch.device) -> dict[str, float]:
    """Step 3's agreement: the largest of every rank's numbers (the slowest rank's times set the pace; a codec
    speed taken as its largest is harmless beside that), identical on every rank."""
    names = sorted(measured)
    values = torch.tensor([measured[n] for n in names], dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
    return dict(zip(names, values.tolist()))


def exchange_per_step(clock: StepClock, group: dist.ProcessGroup | None, device: torch.device) -> StepClock:
    """The clock with each step's exchange time as the rank that waited least saw it (the same on every rank): in a
    synchronous step every other rank's busy time also holds its wait for the last one to arrive, which at step 0
    is start-up, far longer than the exchange itself on a rank that arrived early. ``probe`` reads it."""
    if not clock.comm_busy or dist.get_world_size(group) == 1:
        return clock
    times = torch.tensor(clock.comm_busy, dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MIN, group=group)
    agreed_clock = copy.copy(clock)
    agreed_clock.comm_busy = times.tolist()
    return agreed_clock


def on_rank0(make: Callable[[], Any], group: dist.ProcessGroup | None, device: torch.device) -> Any:
    """``make()`` run on rank 0 alone and its result broadcast, so every rank holds the same decision, computed once:
    ranks that share cores would each compute it at a fraction of the cores. An error on rank 0 reaches the others."""
    if dist.get_world_size(group) == 1:
        return make()
    box: list = [None]
    failure = None
    if dist.get_rank(group) == 0:
        try:
            box = [("ok", make())]
        except Exception as error:  # noqa: BLE001 - passed on to every rank, then raised here as it was
            failure, box = error, [("error", f"{type(error).__name__}: {error}")]
    dist.broadcast_object_list(box, group=group, device=device, group_src=0)
    status, value = box[0]
    if failure is not None:
        raise failure
    if status == "error":
        raise RuntimeError(f"PipeSGD auto: the decision failed on rank 0: {value}")
    return value


def gradient(buckets: list) -> tuple[int, float, torch.device, torch.dtype]:
    """The buckets' gradient: elements, bytes, device and dtype (the sizes every timed call runs at)."""
    numel = sum(bucket.numel for bucket in buckets)
    grad_bytes = sum(bucket.numel * bucket.dtype.itemsize for bucket in buckets)
    device, dtype = (buckets[0].device, buckets[0].dtype) if buckets else (torch.device("cpu"), torch.float32)
    return numel, grad_bytes, device, dtype
