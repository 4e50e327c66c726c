"""``PipeSGD(compression="auto")``: the codec chosen from the warm-up's own measurements (issue 39).

Why: a user who does not know the cluster's bandwidth guesses the codec; no codec on a slow link costs speed (2.7x
slower than pipe+q8 on ResNet-20 at 100 Mbit/s), a lossy one it does not need costs accuracy. The first
``warmup_steps`` steps run synchronously and uncompressed anyway, so they can measure what the timing model needs.

What, at the last warm-up step (nothing in flight, every rank inside ``step()``):
  Step 1: ``WarmupClock`` has timed the warm-up steps: the caller's compute is the time between one ``step()``
          returning and the next starting, and the uncompressed all-reduce of the whole gradient is the time the
          background worker spent on each warm-up step's exchange (``StepStats.t_comm_busy_s``); medians.
  Step 2: every rank makes the same timed calls: an uncompressed ``all_reduce`` at 1/64 of the gradient's size
          (with Step 1's, the link's per-call and per-byte cost from two sizes), and one encode and decode of each
          candidate codec on a tensor of the gradient's size (at most 4 M elements).
  Step 3: the measurements are all-reduced (max), so every rank holds the same numbers and reaches the same
          decision: ``timing_model.recommend`` at the wrapper's width, with each codec's own measured speed.
The choice (codec, error feedback, reason, measurements) is logged once, kept in ``state_dict()`` (a resumed run
uses it without measuring again) and readable as ``PipeSGD.auto_choice``. Cost: the warm-up steps, which run
anyway, plus 4 all-reduces of 1/64 of the gradient and two encodes and decodes per codec, once.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from pipesgd.compression import build
from pipesgd.compression.throughput import measure_codec_gbps
from pipesgd.grads.buckets import Bucket

AUTO = "auto"
CANDIDATES = ("bf16", "q8", "q4")  # the lossy rungs of timing_model.recommend's ladder (sign only when asked)
SMALL_FRACTION = 64  # the second all-reduce size: 1/64 of the gradient
REPEATS = 3
CODEC_SAMPLE = 4_000_000  # elements at most for a codec's timed encode and decode

log = logging.getLogger("pipesgd")


class WarmupClock:
    """When each warm-up ``step()`` began and ended; the caller's compute lies between one's end and the next."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._ended: float | None = None
        self.gaps: list[float] = []
        self.comm_busy: list[float] = []  # each warm-up step's exchange, as the background worker timed it

    def begin(self) -> None:
        if self._ended is not None:
            self.gaps.append(self._clock() - self._ended)

    def end(self, comm_busy_s: float = 0.0) -> None:
        self._ended = self._clock()
        self.comm_busy.append(comm_busy_s)

    @property
    def compute_s(self) -> float:
        """Median time between steps (0 when fewer than two steps were timed, e.g. right after a resume)."""
        return statistics.median(self.gaps) if self.gaps else 0.0

    @property
    def allreduce_s(self) -> float:
        """Median time of a warm-up step's uncompressed all-reduce of the whole gradient."""
        return statistics.median(self.comm_busy) if self.comm_busy else 0.0


class AutoCodec:
    """A wrapper's ``compression="auto"``: times its warm-up steps and chooses at the last one (module doc)."""

    def __init__(self, buckets: list[Bucket], width: int, warmup_steps: int, group: dist.ProcessGroup | None):
        self._buckets, self._width, self._warmup, self._group = buckets, width, warmup_steps, group
        self.clock = WarmupClock()
        self.choice: dict | None = None  # made, or restored from a checkpoint

    def begin(self, step: int) -> None:
        if self.choice is None and step < self._warmup:
            self.clock.begin()

    def end(self, step: int, comm_busy_s: float) -> bool:
        """After ``step()``'s work (``comm_busy_s``: its exchange's time on the worker); True when this step made
        the choice (the wrapper then switches codecs)."""
        if self.choice is not None or step >= self._warmup:
            return False
        self.clock.end(comm_busy_s)
        if step < self._warmup - 1:
            return False
        self.choice = choose(self._buckets, self._width, self.clock, self._group)
        return True


def choose(buckets: list[Bucket], width: int, clock: WarmupClock, group: dist.ProcessGroup | None) -> dict:
    """Steps 2 and 3 for a wrapper's buckets at the last warm-up step; logs the choice once (on rank 0)."""
    numel = sum(bucket.numel for bucket in buckets)
    grad_bytes = sum(bucket.numel * bucket.dtype.itemsize for bucket in buckets)
    device, dtype = (buckets[0].device, buckets[0].dtype) if buckets else (torch.device("cpu"), torch.float32)
    # measure()'s numbers win over the clock's (a test may give them all)
    measured = agreed({"compute_s": clock.compute_s, "allreduce_s": clock.allreduce_s,
                       **measure(numel, device, dtype, group)}, group, device)
    choice = decide(measured, dist.get_world_size(group), grad_bytes, width)
    announce(choice, dist.get_rank(group))
    return choice


def measure(numel: int, device: torch.device, dtype: torch.dtype,
            group: dist.ProcessGroup | None) -> dict[str, float]:
    """Step 2 on this rank: seconds of an uncompressed all-reduce of 1/64 of ``numel`` elements of the buckets'
    ``dtype``, and encode/decode throughput (fp32 bytes/s) of every candidate codec."""
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
    measured = {"small_allreduce_s": statistics.median(times)}
    for codec in CANDIDATES:
        encode, decode = measure_codec_gbps(build(codec), numel=min(numel, CODEC_SAMPLE), repeats=1, device=device)
        measured[f"{codec}_encode_Bps"], measured[f"{codec}_decode_Bps"] = encode * 1e9, decode * 1e9
    return measured


def agreed(measured: dict[str, float], group: dist.ProcessGroup | None, device: torch.device) -> dict[str, float]:
    """Step 3's agreement: the largest of every rank's numbers (the slowest rank's times set the pace; a codec
    speed taken as its largest is harmless beside that), identical on every rank."""
    names = sorted(measured)
    values = torch.tensor([measured[n] for n in names], dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
    return dict(zip(names, values.tolist()))


def decide(measured: dict[str, float], nodes: int, grad_bytes: float, width: int) -> dict:
    """The codec ``timing_model.recommend`` picks at ``width`` from the measurements (the same on every rank):
    {"compression", "error_feedback", "reason", "measured"}."""
    from timing_model.predict import Scenario, predict
    from timing_model.recommend import recommend

    scenario = Scenario(nodes=nodes, grad_bytes=grad_bytes, compute_s=measured["compute_s"],
                        **link_terms(measured, nodes, grad_bytes))

    def predict_pipe(case: Scenario):
        if case.compression in CANDIDATES:
            case = case.with_changes(encode_Bps=measured[f"{case.compression}_encode_Bps"],
                                     decode_Bps=measured[f"{case.compression}_decode_Bps"])
        return predict(case, ("pipe",)).result("pipe")

    answer = recommend(scenario, predict_pipe, width=width)
    reason = (f"{answer.reason}; measured: compute {measured['compute_s'] * 1e3:.3g} ms per step, an uncompressed "
              f"all-reduce of the gradient {measured['allreduce_s'] * 1e3:.3g} ms on {nodes} rank(s)")
    return {"compression": answer.choice.compression, "error_feedback": answer.choice.error_feedback,
            "reason": reason, "measured": dict(measured)}


def link_terms(measured: dict[str, float], nodes: int, grad_bytes: float) -> dict[str, float]:
    """The model's ring latency and bandwidth that reproduce the two measured all-reduces: T(M) = a + b M with
    a = 2(p-1) latency and b = 2(p-1) / (p B). One rank (nothing sent): an infinitely fast link."""
    if nodes < 2:
        return {"bandwidth_Bps": float("inf"), "latency_s": 0.0}
    small_bytes = max(grad_bytes / SMALL_FRACTION, 4.0)
    slope = max((measured["allreduce_s"] - measured["small_allreduce_s"]) / (grad_bytes - small_bytes), 1e-15) \
        if grad_bytes > small_bytes else 1e-15
    intercept = max(measured["allreduce_s"] - slope * grad_bytes, 0.0)
    hops = 2 * (nodes - 1)
    return {"bandwidth_Bps": hops / (nodes * slope), "latency_s": intercept / hops}


def announce(choice: dict, rank: int) -> None:
    """The one log line (rank 0)."""
    if rank == 0:
        codec = choice["compression"] + (" + error feedback" if choice["error_feedback"] else "")
        log.info("PipeSGD compression='auto' chose %s: %s", codec, choice["reason"])
