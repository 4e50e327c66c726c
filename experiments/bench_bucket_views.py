"""Issue 11 item 3: what ``gradient_as_bucket_view`` saves on the caller's thread, and the memory it holds.

    python experiments/bench_bucket_views.py [--iters 60] [--workloads mlp1.9m,mlp6.3m]

World size 1 (no ring: what is left is the caller's own work), one thread, views off, on with zero_grad() and on
with zero_grad(set_to_none=False), interleaved round by round. Per iteration (medians): zero_grad + forward +
backward, step() (hand-off, pack/unpack, apply, update), and the sum; then bytes of bucket sets and of gradients
outside them after the run, against DDP (1 x the gradient bytes with its gradient_as_bucket_view, 2 x without).
"""
from __future__ import annotations

import sys
import os
import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.one_line import OneLineParser  # noqa: E402
from experiments.harness.one_line import known_names
from experiments.harness.pipeline import WORKLOADS
from pipesgd.options import PipeSGDOptions
from pipesgd.optimizer import PipeSGD
from pipesgd.train.models import build_mlp


def _job(name: str, views: bool, width: int):
    w = WORKLOADS[name]
    torch.manual_seed(0)
    model = build_mlp((w.features,), 10, hidden=w.hidden)
    opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=1e-4), model, width=width, warmup_steps=0,
                  options=PipeSGDOptions(gradient_as_bucket_view=views))
    x, y = torch.randn(w.batch_size, w.features), torch.randint(0, 10, (w.batch_size,))
    return model, opt, x, y


def _iteration(model, opt, x, y, set_to_none: bool) -> tuple[float, float]:
    start = time.perf_counter()
    opt.zero_grad(set_to_none=set_to_none)
    F.cross_entropy(model(x), y).backward()
    mid = time.perf_counter()
    opt.step()
    return mid - start, time.perf_counter() - mid


def main() -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--width", type=int, default=2)
    parser.add_argument("--workloads", default="mlp1.9m,mlp6.3m")
    args = parser.parse_args()
    if args.iters < 1 or args.width < 1:
        parser.error("--iters and --width must be >= 1")
    names = known_names(parser, args.workloads, WORKLOADS, "workload")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # PipeSGD needs a group
    print("| workload | views, zero_grad | zero_grad+fwd+bwd ms | step() ms | iteration ms | bucket sets MB | grads outside MB |"
          " DDP MB (views / copies) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        configs = [(False, True), (True, True), (True, False)]  # (views, zero_grad(set_to_none=...))
        jobs = {config: _job(name, config[0], args.width) for config in configs}
        times = {config: [] for config in jobs}
        for i in range(args.iters + 5):  # interleaved, so drift in the machine's load hits all alike
            for config, job in jobs.items():
                measured = _iteration(*job, set_to_none=config[1])
                if i >= 5:
                    times[config].append(measured)
        for (views, none), (model, opt, _, _) in jobs.items():
            measured = times[(views, none)]
            fwd = statistics.median(a for a, _ in measured) * 1e3
            step = statistics.median(b for _, b in measured) * 1e3
            total = statistics.median(a + b for a, b in measured) * 1e3
            outside = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()
                          if p.grad is not None and p.grad._base is None)
            grad_mb = sum(p.numel() * 4 for p in model.parameters()) / 2**20
            print(f"| {name} | {'on' if views else 'off'}, set_to_none={none} | {fwd:.2f} | {step:.2f} | {total:.2f} | "
                  f"{opt.bucket_memory_bytes / 2**20:.1f} | {outside / 2**20:.1f} | {grad_mb:.1f} / {2 * grad_mb:.1f} |")
            opt.flush()
            opt.close()


if __name__ == "__main__":
    main()
