"""What slows the codec ring beside training on a GPU (issue 13's open question: the ring overlaps compute at
0.54-0.70 with a codec and 0.86-0.93 without): the ring's time alone and beside three loads on the caller's thread.

    python experiments/gpu_contention.py --device cuda --ranks 4 --out results/gpu        # ResNet-18
    python experiments/gpu_contention.py --device cpu --ranks 2 --model lenet --batch 4 --repeats 3 --out /tmp/c

Each load lasts about one forward + backward of the model (timed first):
  gpu-sleep    one ``torch.cuda._sleep`` kernel on the compute stream: the GPU busy, the host idle
               (on CPU a ``time.sleep``: nothing busy but the clock)
  python-spin  a pure-Python loop on the caller's thread: the GIL held, the GPU idle
  training     the model's forward + backward: both, as in Pipe-SGD
The ring runs on a private channel's worker (a thread and, on CUDA, a side stream), as in PipeSGD: none is the
backend's all-reduce (C++, off the GIL); bf16 and q8 run on our two-collective exchange (two backend calls, the
codec between them) and on our per-hop ring, whose hops run from Python. If a codec ring beside
python-spin is as slow as beside training while beside gpu-sleep it is not, its loss of overlap is on the host (the
GIL it shares with the training thread); the other way round, on the GPU. Every time is the slowest rank's median.
Writes ``gpu_contention.md`` and ``gpu_contention.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.harness.one_line import OneLineParser  # noqa: E402
from gpu_common import (add_ab_flags, apply_ab_flags, build, check_ab_flags, check_device,  # noqa: E402
                        device_name, launch, markdown, rank_device, stall, write_results)

from pipesgd.comm.channel import open_private_channel  # noqa: E402
from pipesgd.compression import build as build_codec  # noqa: E402
from pipesgd.measure.timing import median_of_slowest  # noqa: E402
from pipesgd.comm.alltoall import alltoall_allreduce_  # noqa: E402
from pipesgd.comm.ring import backend_allreduce_, ring_allreduce_  # noqa: E402
from pipesgd.train.step_timer import wait_for_compute  # noqa: E402

LOADS = ("alone", "gpu-sleep", "python-spin", "training")
CODECS = ("none", "bf16", "q8")
# per codec, the all-reduces timed: the backend's (none); the two-collective exchange ("auto") and the per-hop ring
ALLREDUCES = {"none": ("backend",), "bf16": ("alltoall", "ring"), "q8": ("alltoall", "ring")}
RUNS = {"backend": lambda flat, codec, topology: backend_allreduce_(flat, topology),
        "alltoall": lambda flat, codec, topology: alltoall_allreduce_(flat, codec, topology, "mean"),
        "ring": lambda flat, codec, topology: ring_allreduce_(flat, codec, topology, "mean")}


def spin(seconds: float) -> None:
    """Hold the GIL for ``seconds``: a Python loop that never calls into C."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main_rank(rank: int, world: int, args) -> None:
    interval = apply_ab_flags(args)
    device = rank_device(args.device, rank)
    torch.manual_seed(0)
    model = build(args.model).to(device)
    x = torch.randn(args.batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)

    def training() -> None:
        nn.functional.cross_entropy(model(x), y).backward()
        model.zero_grad()

    def timed(call) -> float:
        dist.barrier()
        start = time.perf_counter()
        call()
        wait_for_compute(device)  # the compute stream's work, never the side stream's
        return time.perf_counter() - start

    for _ in range(3):
        timed(training)
    compute_s = median_of_slowest([timed(training) for _ in range(args.repeats)])
    loads = {"alone": lambda: None, "gpu-sleep": lambda: stall(device, compute_s),
             "python-spin": lambda: spin(compute_s), "training": training}
    n_params = sum(p.numel() for p in model.parameters())
    flat = torch.randn(n_params, device=device)
    channel = open_private_channel(None, device)
    rows = [{"codec": "-", "load": "training alone", "load ms": f"{compute_s * 1e3:.2f}"}]
    try:
        for codec_name, allreduce in [(c, a) for c in CODECS for a in ALLREDUCES[c]]:
            codec = build_codec(codec_name)
            ring = (lambda run=RUNS[allreduce], codec=codec: run(flat, codec, channel.topology))
            alone_s = None
            for load in LOADS:
                ring_times, load_times = [], []
                for repeat in range(args.repeats + 2):
                    dist.barrier()
                    work = channel.submit(ring)
                    load_s = timed(loads[load])
                    ring_s = work.wait().busy_s
                    if repeat >= 2:  # two warm-ups
                        ring_times.append(ring_s)
                        load_times.append(load_s)
                ring_s, load_s = median_of_slowest(ring_times), median_of_slowest(load_times)
                alone_s = ring_s if load == "alone" else alone_s
                rows.append({"codec": codec_name, "all-reduce": allreduce, "load": load,
                             "ring ms": f"{ring_s * 1e3:.2f}",
                             "load ms": "" if load == "alone" else f"{load_s * 1e3:.2f}",
                             "ring vs alone": f"{ring_s / alone_s:.2f}x"})
    finally:
        channel.close()
    if rank == 0:
        header = (f"# The ring beside loads on the caller's thread\n\ndevice: {device_name(device)}; gloo, {world} "
                  f"rank(s); {args.model} ({n_params / 1e6:.2f} M parameters), batch {args.batch} per rank; "
                  f"slowest rank's median of {args.repeats}{interval}")
        table = markdown(rows, ["codec", "all-reduce", "load", "ring ms", "load ms", "ring vs alone"])
        print(header + "\n\n" + table, flush=True)
        write_results(args.out, "gpu_contention", header, table, {"device": device_name(device), "world": world,
                                                                  "model": args.model, "rows": rows})


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="gpu_contention", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--ranks", type=int, default=4, help="spawned processes when not under torchrun")
    parser.add_argument("--model", choices=("lenet", "resnet20", "resnet18"), default="resnet18")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", required=True, help="results folder")
    add_ab_flags(parser)
    args = parser.parse_args(argv)
    check_ab_flags(parser, args)
    if args.ranks < 2 or args.batch < 1 or args.repeats < 1:
        parser.error("--ranks must be at least 2 (a ring needs a peer), --batch and --repeats at least 1")
    check_device(parser, args.device)
    launch(main_rank, args.ranks, "gloo", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
