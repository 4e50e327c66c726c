"""Issue-11 pipeline benchmark, the part every rank runs: per workload, compute alone, then per codec variant the
ring alone and a Pipe-SGD width-2 iteration, with the iteration's time split into phases (``pipesgd.runlog.phases``).
``experiments/bench_pipeline.py`` launches it (spawned loopback ranks, or torchrun inside the emulated cluster).

Per workload (an MLP on fixed random data, one batch per rank):
  Step 1: compute alone: forward + backward on all ranks at once, nothing else running.
  Step 2: per variant, ring alone: one step's buckets averaged by the exchange ``PipeSGD`` would run.
  Step 3: per variant, Pipe-SGD (width 2): full iterations (zero_grad, forward, backward, step), with the phase
          accumulators on, the caller's thread CPU and the process CPU read around the timed iterations.
  Step 4: per baseline, PyTorch DDP (plain, and with its fp16 compression hook): the same iterations through
          ``DistributedDataParallel``, whose allreduce runs inside backward; time and process CPU per iteration.
Times are the slowest rank's median (``pipesgd.measure.timing``); phase and CPU figures are means over ranks.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipesgd.runlog import phases
from pipesgd.baselines.ddp import DDPOptimizer
from pipesgd.grads.bucket_sets import BucketSet
from pipesgd.grads.buckets import build_buckets, read_gradients
from pipesgd.compression import ErrorFeedback
from pipesgd.comm.exchange import GradientExchange
from experiments.harness.rank_launch import run_on_ranks
from pipesgd.launch import exit_process
from pipesgd.measure.timing import time_collective
from pipesgd.optimizer import PipeSGD
from pipesgd.options import PipeSGDOptions, WrapperConfig
from pipesgd.comm.topology import RingTopology
from pipesgd.train.models import build_mlp, count_params

__all__ = ["WORKLOADS", "VARIANTS", "BASELINES", "Job", "Workload", "PipelineSettings", "parse_variant", "run_rank", "run"]


@dataclass(frozen=True, slots=True)
class Workload:
    """An MLP features-hidden-hidden-10 trained on one fixed random batch per rank."""

    features: int
    hidden: int
    batch_size: int


WORKLOADS: dict[str, Workload] = {
    "mlp1.9m": Workload(784, 1024, 64),  # 1,863,690 parameters: the first measurement
    "mlp6.3m": Workload(1024, 2048, 128),  # 6,316,042 parameters: experiments/bench_cluster.py's model
    "tiny": Workload(32, 64, 16),  # smoke tests
}
# Codec variants in table order: each codec without and with error feedback ("+ef"); sign only with it.
VARIANTS = ("none", "fp16", "fp16+ef", "bf16", "bf16+ef", "q8", "q8+ef", "q4", "q4+ef", "sign+ef")
# The peers the targets name, timed on the same job: DDP, and DDP with its fp16 compression hook.
BASELINES = {"ddp": "none", "ddp+fp16": "fp16"}  # record name: DDPOptimizer hook


def parse_variant(name: str) -> tuple[str, bool]:
    """(codec, error feedback) of a variant name; an unknown name raises with the valid list."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; valid: {', '.join(VARIANTS)}")
    return name.removesuffix("+ef"), name.endswith("+ef")


@dataclass(frozen=True, slots=True)
class PipelineSettings:
    """What one benchmark run measures; rank 0 writes one JSON record per (workload, variant) to ``out_json``."""

    out_json: str
    workloads: tuple[str, ...] = ("mlp1.9m", "mlp6.3m")
    variants: tuple[str, ...] = VARIANTS
    baselines: tuple[str, ...] = tuple(BASELINES)
    steps: int = 8  # timed iterations (and timed compute steps) per variant
    warmup: int = 3  # untimed iterations first (the pipeline fills, allocations settle)
    ring_repeats: int = 4  # timed rings alone per variant
    allreduce: str = "auto"  # PipeSGD's allreduce for every variant (pipesgd.defaults.ALLREDUCE_CHOICES)

    def __post_init__(self) -> None:
        object.__setattr__(self, "workloads", tuple(self.workloads))
        object.__setattr__(self, "variants", tuple(self.variants))
        object.__setattr__(self, "baselines", tuple(self.baselines))
        for name in self.baselines:
            if name not in BASELINES:
                raise ValueError(f"unknown baseline {name!r}; valid: {', '.join(BASELINES)}")
        for name in self.workloads:
            if name not in WORKLOADS:
                raise ValueError(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)}")
        for name in self.variants:
            parse_variant(name)
        PipeSGDOptions(allreduce=self.allreduce)  # an unknown name raises here, before any run
        if not self.workloads or not self.variants:
            raise ValueError("at least one workload and one variant are needed")
        for field_name in ("steps", "ring_repeats"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{field_name} must be >= 1, got {getattr(self, field_name)}")
        if self.warmup < 2:
            raise ValueError(f"warmup must be >= 2 (the width-2 pipeline fills first), got {self.warmup}")


def _mean_over_ranks(values: list[float]) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return (tensor / dist.get_world_size()).tolist()


class Job:
    """One rank's model and batch for a workload."""

    def __init__(self, workload: Workload, rank: int) -> None:
        torch.manual_seed(0)  # every rank starts from the same weights
        self.model = build_mlp((workload.features,), 10, hidden=workload.hidden)
        gen = torch.Generator().manual_seed(1 + rank)
        self.x = torch.randn(workload.batch_size, workload.features, generator=gen)
        self.y = torch.randint(0, 10, (workload.batch_size,), generator=gen)

    def backward(self) -> None:
        F.cross_entropy(self.model(self.x), self.y).backward()


def _ring_alone(job: Job, codec: str, feedback: bool, settings: PipelineSettings, rank: int) -> float:
    options = WrapperConfig(compression=codec, error_feedback=feedback,
                            options=PipeSGDOptions(allreduce=settings.allreduce))
    compressor = options.build_compressor(rank)
    params = list(job.model.parameters())
    buckets = build_buckets(params, options.bucket_bytes)
    buffers = BucketSet([b.empty() for b in buckets], buckets, params)
    read_gradients(params, buffers.slots)
    exchange = GradientExchange(RingTopology(dist.group.WORLD), compressor, options.allreduce_for(compressor),
                                ErrorFeedback(compressor) if feedback else None)
    return time_collective(lambda: exchange(buffers), repeats=settings.ring_repeats, warmup=1)


def _pipe(job: Job, codec: str, feedback: bool, settings: PipelineSettings) -> dict:
    """Step 3: timed width-2 iterations and their split (seconds per iteration, means over ranks)."""
    opt = PipeSGD(torch.optim.SGD(job.model.parameters(), lr=1e-4), job.model, width=2, compression=codec,
                  error_feedback=feedback, warmup_steps=1, options=PipeSGDOptions(allreduce=settings.allreduce))
    split = {"compute": 0.0, "compute_cpu": 0.0, "wait": 0.0, "comm_busy": 0.0, "update": 0.0}
    sent = [0]

    def iteration() -> None:
        opt.zero_grad()
        start, cpu = time.perf_counter(), time.thread_time()
        job.backward()
        split["compute"] += time.perf_counter() - start
        split["compute_cpu"] += time.thread_time() - cpu
        stats = opt.step()
        split["wait"] += stats.t_wait_s
        split["comm_busy"] += stats.t_comm_busy_s
        split["update"] += stats.t_update_s
        sent[0] += stats.bytes_sent

    for _ in range(settings.warmup):
        iteration()
    for key in split:
        split[key] = 0.0
    sent[0] = 0
    phases.reset()
    phases.enable(True)
    cpu_main, cpu_process = time.thread_time(), time.process_time()
    try:
        t_iter = time_collective(iteration, repeats=settings.steps)
    finally:
        phases.enable(False)
    cpu_main, cpu_process = time.thread_time() - cpu_main, time.process_time() - cpu_process
    split.update(phases.snapshot())
    split["cpu_main"], split["cpu_process"] = cpu_main, cpu_process
    opt.flush()
    opt.close()
    keys = list(split)
    means = _mean_over_ranks([split[k] / settings.steps for k in keys] + [sent[0] / settings.steps])
    figures = dict(zip(keys, means[:-1]))
    figures["bytes_sent"] = means[-1]
    figures["t_iter"] = t_iter
    return figures


def _ddp(job: Job, hook: str, settings: PipelineSettings) -> dict:
    """Step 4: timed DDP iterations (seconds per iteration; CPU means over ranks)."""
    opt = DDPOptimizer(torch.optim.SGD(job.model.parameters(), lr=1e-4), job.model, hook=hook)
    sent = [0]

    def iteration() -> None:
        opt.zero_grad()
        F.cross_entropy(opt.model(job.x), job.y).backward()  # DDP's allreduce runs inside backward
        sent[0] += opt.step().bytes_sent

    for _ in range(settings.warmup):
        iteration()
    sent[0] = 0
    cpu_main, cpu_process = time.thread_time(), time.process_time()
    t_iter = time_collective(iteration, repeats=settings.steps)
    cpu_main, cpu_process = time.thread_time() - cpu_main, time.process_time() - cpu_process
    means = _mean_over_ranks([cpu_main / settings.steps, cpu_process / settings.steps, sent[0] / settings.steps])
    return {"t_iter": t_iter, "cpu_main": means[0], "cpu_process": means[1], "bytes_sent": means[2]}


def _compute_alone(job: Job, settings: PipelineSettings) -> tuple[float, float]:
    """Step 1: (slowest rank's median seconds, mean over ranks of the process CPU seconds) per forward+backward."""
    cpu = time.process_time()
    seconds = time_collective(lambda: (job.model.zero_grad(), job.backward()), repeats=settings.steps, warmup=2)
    cpu = time.process_time() - cpu  # includes the 2 warm-up steps: divide by all of them
    return seconds, _mean_over_ranks([cpu / (settings.steps + 2)])[0]


def run_rank(rank: int, world: int, settings: PipelineSettings) -> None:
    """Everything on one rank; rank 0 appends a JSON line per (workload, variant) to ``settings.out_json``."""
    for workload_name in settings.workloads:
        job = Job(WORKLOADS[workload_name], rank)
        compute_s, compute_cpu_s = _compute_alone(job, settings)
        for variant in settings.variants:
            codec, feedback = parse_variant(variant)
            ring_s = _ring_alone(job, codec, feedback, settings, rank)
            figures = _pipe(job, codec, feedback, settings)
            record = {"workload": workload_name, "params": count_params(job.model), "variant": variant,
                      "ranks": world, "compute_s": compute_s, "compute_cpu_s": compute_cpu_s, "ring_s": ring_s,
                      **figures, "efficiency": max(compute_s, ring_s) / figures["t_iter"]}
            _publish(record, rank, settings, f"efficiency {record['efficiency']:.2f}")
        for baseline in settings.baselines:
            figures = _ddp(job, BASELINES[baseline], settings)
            record = {"workload": workload_name, "params": count_params(job.model), "variant": baseline,
                      "baseline": True, "ranks": world, "compute_s": compute_s, "compute_cpu_s": compute_cpu_s,
                      **figures}
            _publish(record, rank, settings, "a baseline")


def _publish(record: dict, rank: int, settings: PipelineSettings, note: str) -> None:
    """Rank 0 appends the record to the run's JSON lines as soon as it is measured."""
    if rank == 0:
        print(f"[bench_pipeline] {record['workload']} {record['variant']}: iteration {record['t_iter'] * 1e3:.1f} ms, "
              f"{note}", file=sys.stderr, flush=True)
        with open(settings.out_json, "a") as out:
            out.write(json.dumps(record) + "\n")


def run(settings: PipelineSettings, ranks: int) -> None:
    """``run_rank`` on every rank: under torchrun as launched, else on ``ranks`` spawned loopback processes."""
    run_on_ranks(run_rank, ranks, settings, threads=1)


def main(argv: list[str] | None = None) -> int:
    """Under torchrun inside the cluster: ``python -m experiments.harness.pipeline SETTINGS_JSON``."""
    args = sys.argv[1:] if argv is None else argv
    settings = PipelineSettings(**json.loads(args[0]))
    run(settings, ranks=0)
    return 0


def settings_json(settings: PipelineSettings) -> str:
    return json.dumps(asdict(settings))


if __name__ == "__main__":
    exit_process(main())  # torchrun ranks after DDP rows: no teardown racing gloo's threads
