"""What the host adds around the all-reduce: interference between the all-reduce and compute (with compute all
along, and at a Pipe-SGD step's duty cycle), what a blocking all-reduce right after compute costs beyond the two
apart (lockstep; DDP's own step: ``pipesgd.measure.ddp_step``; the ps-sync round: ``pipesgd.measure.ps_round``),
the gradient pack/unpack copy rate and the thread hand-off. Every rank must call these; each value is the slowest
rank's median.

These return raw timings; the model's terms (κ, κc, λ, lockstep, the DDP step, the ps-sync round, copy rate,
hand-off) are derived from them by the pure ``timing_model.fitting.host_record``.
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
    """Interference between the gradient all-reduce and compute.

    As in the trainer, the all-reduce (``trainer_collective``) runs on the background communication thread and
    the compute on the main thread: ``load`` = (call, label), by default a matmul loop; ``calibrate --model``
    passes the model's own forward + backward (``model_load``), which loads the cores as training does.
    Per compression and size:
      Step 1: all-reduce alone: warm-up, barrier, ``repeats`` timed calls on the worker thread; ``budgeted``: then
              as many as fit in about ``ALONE_BUDGET_S`` where that is more (up to ``STEP_PROBE_MAX_STEPS``).
      Step 2: all-reduce together: the same while the main thread runs the load, each call timed.
      Step 3: load alone (once, first): ``max(20, repeats)`` timed calls on the main thread.
      Step 4: the window probe (``measure_window``): one load per all-reduce, as a Pipe-SGD step runs them, for
              about ``WINDOW_BUDGET_S``: up to ``STEP_PROBE_MAX_STEPS`` steps if ``budgeted``, else ``repeats``.
    ``calibrate --model`` probes one size per codec, budgeted; the matmul load's many sizes keep to ``repeats``.
    Returns {'load': label, 'overlap': rows with ring_alone_s, ring_together_s, load_alone_s, load_together_s,
    ring_window_s, load_window_s, window_steps per (compression, n_bytes), 'handoff_ring_s': hand-off around a ring
    job (first compression)}.
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
    """The all-reduce beside one compute window, as a Pipe-SGD step of width 2 runs them: per step, on every rank,
    submit the all-reduce to the communication thread, run the load once on the main thread, wait for the all-reduce;
    the next step follows at once (no barrier). Step 2 of ``measure_overlap`` keeps the cores computing for the whole
    all-reduce; in training they compute for one window per all-reduce and then wait, and on shared cores the two differ
    by far, so the window is timed as training runs it. The ``warmup`` steps, timed, size the probe to about
    ``WINDOW_BUDGET_S`` (``most_steps`` at most, ``STEP_PROBE_MIN_STEPS`` at least).
    Returns {'ring_window_s': the all-reduce's time on the worker from its start, 'load_window_s': the load's
    time, each the median over steps of the slowest rank, as a run's step records are read
    (``timing_model.validation.read_runs``), 'window_steps'}.
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
    """A synchronous training step in miniature: on every rank the load (the model's forward + backward), then the
    all-reduce on the communication thread, waited for, with no barrier in between, as ``--mode sync`` steps do;
    and the same all-reduce alone, each call after a barrier (the anchor's way).

    On cores that the nodes share, the ranks leave a collective at staggered times, and the first to leave compute
    while the others still need a core to finish theirs, so such a step takes longer than the slowest compute plus
    the collective alone, most on fast links, where that excess is a large share of a short step, and not at all on
    a slow link, where the collective's bytes dominate.
    The ``warmup`` steps, timed, size both parts to about ``budget_s`` each (``STEP_PROBE_MAX_STEPS`` at most,
    ``STEP_PROBE_MIN_STEPS`` at least), so short steps are sampled over seconds and slow links stay affordable.
    Returns {'lockstep': {'load', 'steps', 'period_s' (median over steps of the mean over ranks: the step's period),
    'compute_max_s' (median over steps of the slowest rank's load), 'excess_s' (median over steps of the period less
    that step's slowest load), 'ring_alone_s' (slowest rank's median)}}.
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
    """The raw host timings of a calibration: interference (if ``overlap``), lockstep, the error-feedback rings,
    parameter server, copy and hand-off.

    With a ``compute`` model the interference probe loads the cores with that model's forward + backward and
    reduces its own gradient size with each of ``compressions``, as a training step would, the lockstep probe
    runs synchronous steps of that model (``measure_lockstep``), the DDP probe that model's steps under DDP
    (``pipesgd.measure.ddp_step``), each lossy codec's ring is timed with error
    feedback at that size (``pipesgd.measure.feedback``), the parameter-server probe runs a short
    asynchronous job of it (``pipesgd.measure.server``) and the ps-sync probe its synchronous rounds
    (``pipesgd.measure.ps_round``); without one the interference probe runs the
    matmul load beside uncompressed all-reduces of ``overlap_sizes_bytes`` and there is no lockstep probe."""
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
