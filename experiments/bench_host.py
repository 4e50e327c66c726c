"""What each data-parallel wrapper costs the training thread per step, beyond forward, backward and the update.

    python experiments/bench_host.py [--models lenet,resnet20,alexnet] [--iters 100] [--rounds 3]

World size 1 on gloo (no peer, so no wire and no wait: what is left is the wrapper's own host work), one
thread, batch 32 of the digits shape (1 x 8 x 8), SGD with momentum. Five ways to run the same step,
interleaved iteration by iteration so drift in the machine's load hits all alike:

- ``plain``: the torch optimizer alone (the floor);
- ``ddp``: ``DistributedDataParallel`` (its reducer copies gradients into buckets inside backward);
- ``pipe K=1`` / ``pipe K=2 plain update`` / ``pipe K=2``: ``PipeSGD`` at width 1 (synchronous) and 2, gradients as
  bucket views; at width 2 with the paper's plain update and with look-ahead (the default), whose replay and weight
  copies run on the training thread.

Per model, medians over ``--iters`` iterations in each of ``--rounds`` rounds (the median of the rounds is
printed): the iteration, ``step()`` + ``zero_grad()`` on the caller's thread, and the wrapper's overhead, the
iteration less ``plain``'s. The timing model calls the part of that outside the update ``host_s``.
"""
from __future__ import annotations

import sys
import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.one_line import OneLineParser, known_names
from pipesgd.optimizer import PipeSGD
from pipesgd.train.models import MODELS, build_model

WAYS = ("plain", "ddp", "pipe K=1", "pipe K=2 plain update", "pipe K=2")
INPUT_SHAPE = (1, 8, 8)


class _Job:
    """One model trained one way; ``iteration()`` returns (whole iteration, step() + zero_grad()) seconds."""

    def __init__(self, model_name: str, way: str) -> None:
        torch.manual_seed(0)
        model = build_model(model_name, INPUT_SHAPE, 10)
        self.forward = DistributedDataParallel(model) if way == "ddp" else model
        inner = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
        width = {"pipe K=1": 1, "pipe K=2 plain update": 2, "pipe K=2": 2}.get(way)
        staleness = "none" if way == "pipe K=2 plain update" else "lookahead"
        self.opt = inner if width is None else PipeSGD(inner, model, width=width, warmup_steps=0, staleness=staleness)
        self.x = torch.randn(32, *INPUT_SHAPE)
        self.y = torch.randint(0, 10, (32,))

    def iteration(self) -> tuple[float, float]:
        start = time.perf_counter()
        F.cross_entropy(self.forward(self.x), self.y).backward()
        mid = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad()
        end = time.perf_counter()
        return end - start, end - mid

    def close(self) -> None:
        if isinstance(self.opt, PipeSGD):
            self.opt.flush()
            self.opt.close()


def measure(model_name: str, iters: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Way -> (iteration, step + zero_grad) in seconds: per round the medians, then the median over rounds."""
    jobs = {way: _Job(model_name, way) for way in WAYS}
    per_round: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    try:
        for _ in range(rounds):
            samples: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
            for i in range(iters + 10):  # the first 10 allocate and fill the pipeline
                for way, job in jobs.items():
                    measured = job.iteration()
                    if i >= 10:
                        samples[way].append(measured)
            for way, got in samples.items():
                per_round[way].append((statistics.median(a for a, _ in got), statistics.median(b for _, b in got)))
    finally:
        for job in jobs.values():
            job.close()
    return {way: (statistics.median(a for a, _ in got), statistics.median(b for _, b in got))
            for way, got in per_round.items()}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="bench_host", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="lenet,resnet20,alexnet")
    parser.add_argument("--iters", type=int, default=100, help="timed iterations per way and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.iters < 1 or args.rounds < 1:
        parser.error("--iters and --rounds must be >= 1")
    models = known_names(parser, args.models, MODELS, "model")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1)
        try:
            print("| model | parameter tensors | way | iteration ms | step()+zero_grad() ms | overhead vs plain ms |")
            print("|---|---|---|---|---|---|")
            for name in models:
                times = measure(name, args.iters, args.rounds)
                tensors = sum(1 for p in build_model(name, INPUT_SHAPE, 10).parameters())
                floor = times["plain"][0]
                for way in WAYS:
                    iteration, step = times[way]
                    print(f"| {name} | {tensors} | {way} | {iteration * 1e3:.2f} | {step * 1e3:.2f} | "
                          f"{(iteration - floor) * 1e3:+.2f} |", flush=True)
        finally:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
