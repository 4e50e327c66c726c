"""Issue-4 comparison on the emulated cluster: run each variant with ``pipesgd-train`` inside a cluster and turn
the runs into the speed table (ms per iteration, compute, blocked on communication, CPU busy, speed-up over DDP,
and the ceiling no variant can beat on shared cores). ``experiments/bench_cluster.py`` drives it.
"""
from __future__ import annotations

import os
import statistics
import sys
from typing import TYPE_CHECKING

from experiments.harness.variants import trainer_flags

if TYPE_CHECKING:
    from pipesgd.cluster.cluster import Cluster
    from experiments.harness.results import Run

__all__ = ["run_variant", "speed_table"]


def run_variant(cluster: Cluster, name: str, extra: list[str], out_dir: str, timeout_s: float, log) -> str:
    """Train ``name`` (``variants.TRAINER_FLAGS``) with ``extra`` flags inside ``cluster``; its metrics path.
    A failed run raises ``RuntimeError`` naming the log."""
    metrics = os.path.join(out_dir, f"{name}.jsonl")
    argv = ["pipesgd-train", *trainer_flags(name), *extra, "--metrics", metrics]
    print(f"[bench] {name}: {' '.join(argv)}", file=sys.stderr, flush=True)
    rc = cluster.run(argv, timeout_s=timeout_s, out=log, err=log)
    if rc != 0:
        raise RuntimeError(f"variant {name} failed with exit code {rc}; see {log.name}")
    return metrics


def speed_table(runs: dict[str, Run], skip: int, cores: int | None = None) -> tuple[str, dict]:
    """The issue-4 speed table (markdown) and its figures from the runs of ``SPEED_VARIANTS``, medians over the steps
    from ``skip`` on: iteration times the mean over ranks per step (``Run.iteration_s``, the period), compute the slowest rank
    per step (what gates a synchronous step) and the sync run's allreduce alone its period less that compute and update.
    ``cores``: the cores the ranks ran on (default: this machine's), for CPU busy and the ceiling."""
    sync = runs["sync"]
    compute_only = sync.median("t_compute", skip)
    # a sync step's period less its slowest rank's compute and update: the allreduce alone
    exposed = [i - c - u for i, c, u in zip(sync.per_step("t_iter", skip, statistics.fmean),
                                            sync.per_step("t_compute", skip), sync.per_step("t_update", skip))]
    allreduce_only = sorted(exposed)[len(exposed) // 2]
    t_iter = {name: run.iteration_s(skip) for name, run in runs.items()}
    cores = cores or os.cpu_count() or 1
    lines = ["| variant | ms / iteration | compute ms | blocked on comm ms | MB sent / rank / iter | CPU busy "
             "| vs ddp | vs ddp+fp16 |", "|---|---|---|---|---|---|---|---|"]
    cpu_busy = {}
    for name, seconds in t_iter.items():
        run = runs[name]
        sent = run.median("bytes_sent", skip) / 1e6
        cpu = run.per_step("t_cpu", skip, over_ranks=sum)
        if cpu:  # all ranks' CPU seconds per step over what the machine's cores offer in that step
            cpu_busy[name] = statistics.median(c / (cores * t) for c, t in zip(cpu, run.per_step("t_iter", skip, statistics.fmean)))
        busy = f"{100 * cpu_busy[name]:.0f} %" if name in cpu_busy else "-"
        lines.append(f"| {name} | {seconds * 1e3:.1f} | {run.median('t_compute', skip) * 1e3:.1f} "
                     f"| {run.median('t_wait', skip) * 1e3:.1f} | {sent:.2f} | {busy} | {t_iter['ddp'] / seconds:.2f}x "
                     f"| {t_iter['ddp+fp16'] / seconds:.2f}x |")
    lines += ["", "compute ms is forward + backward measured inside each run (for ddp it includes DDP's "
              "allreduce, which runs inside backward); it grows when communication shares the cores. CPU busy is "
              f"the CPU time all ranks' processes used per step over what the {cores} cores offer in that time "
              "(kernel network work done outside those processes is not in it)."]
    bound = max(compute_only, allreduce_only)
    lines += ["", f"compute only {compute_only * 1e3:.1f} ms, allreduce only {allreduce_only * 1e3:.1f} ms "
              f"(from the sync run); pipe / max(compute, allreduce) = {t_iter['pipe'] / bound:.3f}",
              f"pipe+bf16 is {t_iter['ddp'] / t_iter['pipe+bf16']:.2f}x faster than ddp; "
              f"pipe+q8 is {t_iter['ddp+fp16'] / t_iter['pipe+q8']:.2f}x faster than ddp+fp16"]
    # No variant computes faster than the sync run's compute phase (all nodes computing at once, nothing else
    # running), so ddp / compute-only caps any speed-up over ddp that overlap or compression can give here.
    ceiling = {"vs_ddp": t_iter["ddp"] / compute_only, "vs_ddp_fp16": t_iter["ddp+fp16"] / compute_only}
    nodes = runs["sync"].config.get("world_size", "?")
    lines += [f"ceiling on this machine ({nodes} nodes on {cores} cores): no variant beats compute only, "
              f"so at best {ceiling['vs_ddp']:.2f}x faster than ddp and {ceiling['vs_ddp_fp16']:.2f}x faster than "
              f"ddp+fp16"]
    figures = {"t_iter_s": t_iter, "compute_only_s": compute_only, "allreduce_only_s": allreduce_only,
               "pipe_over_bound": t_iter["pipe"] / bound, "ceiling": ceiling, "cpu_count": cores,
               "cpu_busy": cpu_busy}
    return "\n".join(lines), figures
