"""What the host adds around the all-reduce: its interference with compute, the lockstep excess of a blocking
all-reduce after compute, the pack/unpack copy rate and the thread hand-off. Every rank calls these; each value is
the slowest rank's median, raw: ``timing_model.fitting.host_record`` derives the model's terms from them.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from pipesgd.comm.worker import CommWorker
from pipesgd.measure.allreduce import trainer_collective
from pipesgd.measure.compute import Load, matmul_load, model_load
from pipesgd.measure.feedback import measure_feedback_rings
from pipesgd.measure.server import measure_ps_service
from pipesgd.measure.ps_round import measure_ps_round
from pipesgd.measure.ddp_step import measure_ddp_step
from pipesgd.measure.timing import (STEP_PROBE_MAX_STEPS, STEP_PROBE_MIN_STEPS, calls_within, gathered_rows,
                                   median_of_slowest, time_calls)
from pipesgd.comm.ring import ring_allreduce

__all__ = ["measure_overlap", "measure_lockstep", "measure_copy", "measure_handoff", "measure_host"]

LOCKSTEP_BUDGET_S = 10.0  # the lockstep probe's steps run for about this long (at least STEP_PROBE_MIN_STEPS)
WINDOW_BUDGET_S = 4.0  # the window probe's steps, per codec, run for about this long
ALONE_BUDGET_S = 2.0  # the all-reduce alone (the anchor), per codec, runs for about this long (at least `repeats`)


def measure_overlap(sizes_bytes: list[int], repeats: int = 10, warmup: int = 2, device: str = "cpu",
                    load: Load | None = None, compressions: tuple[str, ...] = ("none",),
                    budgeted: bool = False) -> dict:
    """Interference between the gradient all-reduce (on the communication thread, as in the trainer) and the
    ``load`` (call, label) on the main thread: a matmul loop, or ``model_load``'s forward + backward.
    Per compression and size:
      Step 1: all-reduce alone (``budgeted``: as many calls as fit in ``ALONE_BUDGET_S``).
      Step 2: all-reduce together: the same while the main thread runs the load.
      Step 3: load alone (once, first).
      Step 4: the window probe (``measure_window``).
    Returns {'load', 'overlap': one row per (compression, n_bytes), 'handoff_ring_s'}.
    """
    compute, label = load or matmul_load(device)

    def collectives(tensor, collective) -> list[float]:
        return time_calls(lambda: collective(tensor), repeats, warmup, device, before=dist.barrier)

    def alone_calls(tensor, collective) -> list[float]:
        first = collectives(tensor, collective)
        if not budgeted:
            return first
        count = calls_within(ALONE_BUDGET_S, median_of_slowest(first, device=device), STEP_PROBE_MAX_STEPS,
                             repeats)
        more = time_calls(lambda: collective(tensor), count - len(first), 0, device) if count > len(first) else []
        return first + more

    for _ in range(3):  # Step 3
        compute()
    dist.barrier()
    load_alone = median_of_slowest([compute() for _ in range(max(20, repeats))], device=device)
    worker = CommWorker(device)
    rows, handoff = [], []
    try:
        for compression in compressions:
            collective = trainer_collective(compression)
            for n_bytes in sizes_bytes:
                tensor = torch.ones(max(1, n_bytes // 4), dtype=torch.float32, device=device)
                alone = worker.submit(alone_calls, tensor, collective).wait()  # Step 1
                if compression == compressions[0]:
                    handoff.extend(_handoff_gaps(worker, tensor, repeats))
                dist.barrier()
                work = worker.submit(collectives, tensor, collective)  # Step 2
                load_times = []
                while not work.is_completed():
                    load_times.append(compute())
                together = work.wait()
                rows.append({"compression": compression, "n_bytes": float(tensor.numel() * 4),
                             "ring_alone_s": median_of_slowest(alone, device=device),
                             "ring_together_s": median_of_slowest(together, device=device),
                             "load_alone_s": load_alone,
                             "load_together_s": median_of_slowest(load_times or [load_alone], device=device),
                             **measure_window(worker, compute, collective, tensor, warmup, device,
                                              STEP_PROBE_MAX_STEPS if budgeted else repeats)})
                dist.barrier()
    finally:
        worker.close()
    return {"load": label, "overlap": rows,
            "handoff_ring_s": median_of_slowest(handoff, device=device) if handoff else None}


def measure_window(worker: CommWorker, compute, collective, tensor: torch.Tensor, warmup: int, device: str,
                   most_steps: int = STEP_PROBE_MAX_STEPS) -> dict:
    """The all-reduce beside one compute window, as a Pipe-SGD step of width 2 runs them (submit, load once, wait;
    no barrier between steps). Training computes one window per all-reduce and then waits, which on shared cores
    differs by far from Step 2 of ``measure_overlap``'s compute all along. Returns {'ring_window_s',
    'load_window_s', 'window_steps'}: medians over steps of the slowest rank, as run records are read.
    """
    def step() -> list[float]:
        work = worker.submit(collective, tensor)
        seconds = compute()
        work.wait()
        return [seconds, work.busy_s]

    dist.barrier()
    warm = [sum(step()) for _ in range(max(1, warmup))]  # load + ring: at least a step, as the two overlap
    steps = calls_within(WINDOW_BUDGET_S, median_of_slowest(warm, device=device), most_steps,
                         STEP_PROBE_MIN_STEPS)
    dist.barrier()
    rows = [step() for _ in range(steps)]
    slowest = gathered_rows(rows, device).max(dim=0).values  # steps x (load, ring), the slowest rank's
    return {"load_window_s": slowest[:, 0].median().item(), "ring_window_s": slowest[:, 1].median().item(),
            "window_steps": steps}


def measure_lockstep(load: Load, collective, tensor: torch.Tensor, warmup: int = 2, device: str = "cpu",
                     budget_s: float = LOCKSTEP_BUDGET_S) -> dict:
    """A ``--mode sync`` step in miniature: the load, then the all-reduce waited for, no barrier between; and the
    same all-reduce alone after a barrier. On shared cores the ranks leave a collective at staggered times and the
    first to compute slows the others, so such a step outlasts the slowest compute plus the collective alone.
    Returns {'lockstep': {'load', 'steps', 'period_s', 'compute_max_s', 'excess_s' (median of the period less that
    step's slowest load), 'ring_alone_s'}}.
    """
    compute, label = load
    worker = CommWorker(device)

    def step() -> list[float]:
        start = time.perf_counter()
        seconds = compute()
        worker.submit(collective, tensor).wait()
        return [seconds, time.perf_counter() - start]

    try:
        dist.barrier()
        warm = [step()[1] for _ in range(max(1, warmup))]
        step_s = median_of_slowest(warm, device=device)
        steps = calls_within(budget_s, step_s, STEP_PROBE_MAX_STEPS, STEP_PROBE_MIN_STEPS)
        alone = worker.submit(lambda: time_calls(lambda: collective(tensor), steps, 1, device,
                                                 before=dist.barrier)).wait()
        ring_alone = median_of_slowest(alone, device=device)
        dist.barrier()
        rows = [step() for _ in range(steps)]
    finally:
        worker.close()
    per_step = gathered_rows(rows, device)  # ranks x steps x (compute, period)
    period, compute_max = per_step[:, :, 1].mean(dim=0), per_step[:, :, 0].max(dim=0).values
    # paired per step: a step's slow compute lengthens its period too, so pairing drops the noise the two share,
    # which a difference of two medians keeps
    return {"lockstep": {"load": label, "steps": steps, "period_s": period.median().item(),
                         "compute_max_s": compute_max.median().item(),
                         "excess_s": (period - compute_max).median().item(), "ring_alone_s": ring_alone}}


def _handoff_gaps(worker: CommWorker, tensor: torch.Tensor, repeats: int) -> list[float]:
    """Per ring job: (submit → wait returns) − the job's own busy time, i.e. the thread hand-off latency the
    trainer's ``step()`` pays around each ring on this (possibly oversubscribed) host."""
    gaps = []
    for _ in range(repeats):
        start = time.perf_counter()
        work = worker.submit(ring_allreduce, tensor, "none", "mean")
        work.wait()
        gaps.append(max(0.0, time.perf_counter() - start - work.busy_s))
    return gaps


def measure_copy(sizes_bytes: list[int], repeats: int = 20, device: str = "cpu") -> dict:
    """Gradient pack/unpack copy: {'copy': rows of n_bytes and the slowest rank's median seconds of
    ``dst.copy_(src)`` on fp32 tensors of each size}, all ranks timing at once."""
    rows = []
    for n_bytes in sizes_bytes:
        src = torch.ones(max(1, n_bytes // 4), device=device)
        dst = torch.empty_like(src)
        times = time_calls(lambda: dst.copy_(src), repeats, warmup=3, device=device, before=dist.barrier)
        rows.append({"n_bytes": float(src.numel() * 4), "seconds": median_of_slowest(times, device=device)})
    return {"copy": rows}


def measure_handoff(repeats: int = 50, device: str = "cpu") -> float:
    """Thread hand-off: slowest rank's median seconds to submit a no-op to the communication worker and wait
    for its result (host work only: the device is not synchronised)."""
    worker = CommWorker(device)
    try:
        times = time_calls(lambda: worker.submit(lambda: None).wait(), repeats, warmup=5, device=None)
    finally:
        worker.close()
    return median_of_slowest(times, device=device)


def measure_host(sizes_bytes: list[int], overlap_sizes_bytes: list[int], repeats: int, warmup: int, device: str,
                 overlap: bool, compute: dict | None = None, compressions: tuple[str, ...] = ("none",)) -> dict:
    """The raw host timings of a calibration. With a ``compute`` model every probe runs that model (interference
    at its gradient size per codec, lockstep, DDP, error-feedback rings, parameter server, ps-sync round); without
    one only the matmul load beside uncompressed all-reduces of ``overlap_sizes_bytes``. Copy and hand-off always."""
    host: dict = {}
    if overlap and compute:
        call, label, n_bytes = model_load(compute, device)
        # one size per codec, so afford more calls: scheduling on shared cores makes each one noisy
        host.update(measure_overlap([n_bytes], max(repeats, 30), warmup, device, (call, label), compressions,
                                    budgeted=True))
        # the synchronous step's collective: the trainer's for the uncompressed gradient
        gradient = torch.ones(max(1, n_bytes // 4), dtype=torch.float32, device=device)
        host.update(measure_lockstep((call, label), trainer_collective("none"), gradient, warmup, device))
        host.update(measure_ddp_step(compute, warmup, device))
        host.update(measure_feedback_rings(compute, compressions, max(repeats, 30), warmup, device))
        host.update(measure_ps_service(compute, device))
        host.update(measure_ps_round(compute, warmup, device))
    elif overlap:
        host.update(measure_overlap(overlap_sizes_bytes, repeats, warmup, device))
    host.update(measure_copy(sizes_bytes, max(repeats, 10), device))
    host["handoff_noop_s"] = measure_handoff(device=device)
    return host
