"""The one timing loop every micro-benchmark uses: warm-up calls, a barrier, timed calls, the median, and the
slowest rank's median (all_reduce MAX), so a point is as slow as the slowest worker, as a synchronous step is.

Steps (REFERENCES §3):
  Step 1: ``warmup`` untimed calls (allocator, lazy kernels, connections), then wait for the device.
  Step 2: ``before()`` — a barrier, so all ranks start the timed calls together (local timings: nothing).
  Step 3: ``repeats`` calls timed one by one, the device synchronised around each.
  Step 4: this rank's median; all_reduce(MAX) of the medians over the group gives the slowest rank's.
Without an initialised process group Step 4 is this process's median (world size 1).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

__all__ = ["STEP_PROBE_MIN_STEPS", "STEP_PROBE_MAX_STEPS", "synchronize", "time_calls", "median_of_slowest",
           "time_collective", "time_local", "calls_within", "gathered_rows"]

Clock = Callable[[], float]

# The step probes (``pipesgd.measure.host``, ``ddp_step``) run for their time budgets, at least the first and at
# most the second count of steps, rather than stopping at `repeats`: on cores the nodes share, the scheduling
# drifts over seconds and a few dozen short steps catch one moment of it, whose median may lie far from the
# long run's.
STEP_PROBE_MIN_STEPS = 5
STEP_PROBE_MAX_STEPS = 1000


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued CUDA work on ``device`` (CPU and None: nothing to wait for)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def time_calls(call: Callable[[], object], repeats: int, warmup: int = 0, device: torch.device | str | None = "cpu",
               before: Callable[[], object] | None = None, clock: Clock = time.perf_counter) -> list[float]:
    """Seconds of each of ``repeats`` calls (Steps 1-3). ``device=None`` never synchronises (host-only work such
    as a thread hand-off); ``clock`` is injectable so tests can give known durations."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    for _ in range(warmup):  # Step 1
        call()
    synchronize(device)
    if before is not None:  # Step 2
        before()
    times = []
    for _ in range(repeats):  # Step 3
        synchronize(device)  # a no-op after the previous call's wait; kept so no earlier work is timed
        start = clock()
        call()
        synchronize(device)
        times.append(clock() - start)
    return times


def median_of_slowest(times: list[float], group=None, device: torch.device | str | None = "cpu") -> float:
    """Step 4: the largest over the ranks of ``group`` (default: all) of each rank's median of ``times``;
    every rank of the group must call it. Without a process group: the local median."""
    if not times:
        raise ValueError("median_of_slowest needs at least one timing")
    median = statistics.median(times)
    if not _distributed():
        return median
    value = torch.tensor([median], dtype=torch.float64, device=device or "cpu")
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return float(value.item())


def time_collective(call: Callable[[], object], repeats: int, warmup: int = 0, group=None,
                    device: torch.device | str | None = "cpu", clock: Clock = time.perf_counter) -> float:
    """Steps 1-4 for an operation all ranks of ``group`` run together (a collective): the slowest rank's median
    seconds, after a barrier of the group."""
    before = (lambda: dist.barrier(group=group)) if _distributed() else None
    return median_of_slowest(time_calls(call, repeats, warmup, device, before, clock), group, device)


def time_local(call: Callable[[], object], repeats: int, warmup: int = 3, device: torch.device | str | None = "cpu",
               clock: Clock = time.perf_counter) -> float:
    """Steps 1-3 and this rank's median, without a barrier or a reduction: a local operation timed on one rank."""
    return statistics.median(time_calls(call, repeats, warmup, device, None, clock))


def calls_within(budget_s: float, one_s: float, most: int, least: int) -> int:
    """How many calls of ``one_s`` seconds each fit in about ``budget_s``: at most ``most``, at least ``least``
    (a probe on a slow link stays affordable, one on a fast link keeps its full count)."""
    return max(least, min(most, int(budget_s / max(one_s, 1e-9))))


def gathered_rows(rows: list[list[float]], device: torch.device | str | None = "cpu") -> torch.Tensor:
    """Every rank's per-step timings (``rows``: steps x columns, the same shape on each) as ranks x steps x
    columns, on the CPU; every rank must call it."""
    mine = torch.tensor(rows, dtype=torch.float64, device=device or "cpu")
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return torch.stack(every).cpu()
