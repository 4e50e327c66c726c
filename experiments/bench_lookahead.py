"""Issue 36: what look-ahead costs per step on the training thread, and the memory it holds, against plain width 2
and DDP, per model and optimizer.

    python experiments/bench_lookahead.py [--iters 40] [--workloads lenet,resnet20,resnet20-32px,gpt]
                                          [--optimizers sgd,adam,adamw]

World size 1 over a gloo group of one, one thread: no ring runs, so what differs between the rows is each
wrapper's own work on the caller's thread. Per workload and optimizer, DDP, PipeSGD width 2 with
``staleness="none"`` and with ``"lookahead"`` run interleaved iteration by iteration (drift in the machine's load
hits all three alike). Printed per row: the median iteration (zero_grad + forward + backward + step), look-ahead's
own median seconds (``StepStats.t_lookahead_s``: the stand-in's copy, the replay in the forward pre-hook, the
restore) as a share of the plain width-2 iteration, and the bytes look-ahead holds beside plain width 2 (a copy of
the weights, the stand-ins of the step in flight, the replay's copy of the optimizer state).
"""
from __future__ import annotations

import os
import argparse
import statistics
import sys
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.one_line import OneLineParser  # noqa: E402
from experiments.harness.one_line import known_names
from pipesgd.optimizer import PipeSGD
from pipesgd.train.data import load_digits, load_pysrc
from pipesgd.train.loop import cross_entropy
from pipesgd.train.models import build_model

WORKLOADS = {  # name: (model, data, batch per step)
    "lenet": ("lenet", "digits", 32),
    "resnet20": ("resnet20", "digits", 32),
    # ResNet-20 on the input it was designed for (CIFAR-10's 3x32x32); random pixels: only the time is read
    "resnet20-32px": ("resnet20", "cifar-shape", 32),
    "gpt": ("gpt", "pysrc", 32),
}
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.02, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1),
}
CONFIGS = ("ddp", "none", "lookahead")


def _batch(name: str):
    _, data, batch = WORKLOADS[name]
    if data == "cifar-shape":
        generator = torch.Generator().manual_seed(0)
        shape = SimpleNamespace(input_shape=(3, 32, 32), num_classes=10)
        return shape, torch.randn(batch, 3, 32, 32, generator=generator), torch.randint(10, (batch,),
                                                                                         generator=generator)
    ds = load_digits(0) if data == "digits" else load_pysrc()
    return ds, ds.x_train[:batch], ds.y_train[:batch]


def _job(name: str, optimizer: str, config: str, ds):
    torch.manual_seed(0)
    model = build_model(WORKLOADS[name][0], ds.input_shape, ds.num_classes)
    if config == "ddp":
        return DistributedDataParallel(model), OPTIMIZERS[optimizer](model.parameters())
    inner = OPTIMIZERS[optimizer](model.parameters())
    return model, PipeSGD(inner, model, width=2, warmup_steps=0, staleness=config)


def _iteration(model, opt, x, y) -> tuple[float, float | None]:
    start = time.perf_counter()
    opt.zero_grad()
    cross_entropy(model(x), y).backward()
    stats = opt.step()
    return time.perf_counter() - start, getattr(stats, "t_lookahead_s", None)


def main() -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be >= 1")
    names = known_names(parser, args.workloads, WORKLOADS, "workload")
    optimizers = known_names(parser, args.optimizers, OPTIMIZERS, "optimizer")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    print("| workload | optimizer | DDP ms | plain width 2 ms | look-ahead width 2 ms | look-ahead work ms "
          "(share of plain) | look-ahead bytes (x weights): copy + stand-ins + state |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        ds, x, y = _batch(name)
        for optimizer in optimizers:
            jobs = {config: _job(name, optimizer, config, ds) for config in CONFIGS}
            times = {config: [] for config in CONFIGS}
            work: list[float] = []
            for i in range(args.iters + 5):
                for config, (model, opt) in jobs.items():
                    seconds, lookahead_s = _iteration(model, opt, x, y)
                    if i >= 5:  # allocation and thread start-up left out
                        times[config].append(seconds)
                        if config == "lookahead":
                            work.append(lookahead_s)
            med = {config: statistics.median(values) * 1e3 for config, values in times.items()}
            work_ms = statistics.median(work) * 1e3
            model, opt = jobs["lookahead"]
            weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            extra = opt.lookahead_memory_bytes
            print(f"| {name} | {optimizer} | {med['ddp']:.2f} | {med['none']:.2f} | {med['lookahead']:.2f} | "
                  f"{work_ms:.2f} ({100 * work_ms / med['none']:.1f} %) | {extra / 2**20:.2f} MiB "
                  f"({extra / weight_bytes:.1f}) |", flush=True)
            for config in ("none", "lookahead"):
                jobs[config][1].flush()
                jobs[config][1].close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
