"""Core-engine benchmark (issue 3): our ring vs the backend's all_reduce, codec speed, and the wall time of
a training step for width 1 and 2 next to compute-only time — all measured in one run, side by side.

    python experiments/bench_core.py --ranks 4             # local gloo processes on loopback
    pipesgd-cluster run -- python experiments/bench_core.py   # inside the emulated, shaped cluster

Every time is the slowest rank's median. The "1 Gbit/s estimate" column adds payload bytes / line rate to
the time measured here; inside `pipesgd-cluster up --bandwidth 1gbit` pass --link-gbit 0: the link is real.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.one_line import OneLineParser  # noqa: E402
from pipesgd import PipeSGD
from pipesgd.compression import build
from pipesgd.compression.throughput import measure_codec_gbps
from experiments.harness.rank_launch import run_on_ranks
from pipesgd.measure import time_collective
from pipesgd.comm.ring import RingTopology, ring_allreduce_
from pipesgd.train.step_timer import wait_for_compute

CODECS = ("none", "fp16", "bf16", "q8", "q4", "sign")
DEVICE = torch.device("cpu")


def median_time(call, repeats: int, warmup: int = 2) -> float:
    """The slowest rank's median seconds of ``call`` (``pipesgd.measure.time_collective``)."""
    return time_collective(call, repeats, warmup, device=DEVICE)


def median_step_time(call, repeats: int, warmup: int = 2) -> float:
    """Like ``median_time``, but waiting only for the compute stream after each call: a device-wide
    synchronize would also wait for the ring in flight on the side stream and undo the pipeline."""

    def step() -> None:
        call()
        wait_for_compute(DEVICE)

    return time_collective(step, repeats, warmup, device=None)


def bench_collectives(rank: int, world: int, sizes: list[int], repeats: int) -> None:
    topology = RingTopology(dist.group.WORLD)
    if rank == 0:
        print(f"\n## Ring vs gloo all_reduce, p = {world} (slowest rank, median of {repeats})")
        print("| size | gloo all_reduce ms | our ring ms | ring / gloo |\n|---|---|---|---|")
    for n_bytes in sizes:
        x = torch.randn(max(1, n_bytes // 4), device=DEVICE)
        backend = median_time(lambda: dist.all_reduce(x), repeats)
        ours = median_time(lambda: ring_allreduce_(x, build("none"), topology, "sum"), repeats)
        if rank == 0:
            print(f"| {_size(n_bytes)} | {backend * 1e3:.3f} | {ours * 1e3:.3f} | {ours / backend:.2f} |")


def bench_codec_rings(rank: int, world: int, n_bytes: int, repeats: int, link_bps: float) -> None:
    topology = RingTopology(dist.group.WORLD)
    x = torch.randn(n_bytes // 4, device=DEVICE)
    rows = []
    for name in CODECS:
        codec = build(name)
        reports = []
        seconds = median_time(lambda: reports.append(ring_allreduce_(x.clone(), codec, topology, "mean")), repeats)
        rows.append((name, seconds, reports[-1].bytes_sent))
    if rank == 0:
        none_s, none_bytes = rows[0][1], rows[0][2]
        print(f"\n## Compressed rings, {_size(n_bytes)}, p = {world}")
        if link_bps:
            base = none_s + none_bytes / link_bps
            print(f"| codec | ring ms (measured here) | bytes sent / rank | {link_bps * 8 / 1e9:g} Gbit/s estimate ms "
                  "| speed-up vs none (estimate) |\n|---|---|---|---|---|")
            for name, seconds, sent in rows:
                estimate = seconds + sent / link_bps
                print(f"| {name} | {seconds * 1e3:.1f} | {sent:,} | {estimate * 1e3:.1f} | {base / estimate:.2f} |")
        else:  # run on a real (or shaped) link: the measured time is the answer
            print("| codec | ring ms | bytes sent / rank | speed-up vs none |\n|---|---|---|---|")
            for name, seconds, sent in rows:
                print(f"| {name} | {seconds * 1e3:.1f} | {sent:,} | {none_s / seconds:.2f} |")


def bench_codecs(rank: int) -> None:
    if rank != 0:
        return
    print("\n## Codec throughput, 1 thread, GB/s of fp32 input (4M elements)")
    print("| codec | encode | decode |\n|---|---|---|")
    for name in CODECS[1:]:
        enc, dec = measure_codec_gbps(build(name), 4_000_000, device=DEVICE)
        print(f"| {name} | {enc:.2f} | {dec:.2f} |")


def bench_steps(rank: int, world: int, hidden: int, batch: int, steps: int, compression: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    model.to(DEVICE)
    x = torch.randn(batch, 256, device=DEVICE)
    y = torch.randint(0, 10, (batch,), device=DEVICE)
    n_params = sum(p.numel() for p in model.parameters())

    def compute_only() -> None:
        nn.functional.cross_entropy(model(x), y).backward()
        model.zero_grad()

    results = {"compute only": median_step_time(compute_only, steps)}
    for width in (1, 2):
        opt = PipeSGD(torch.optim.SGD(model.parameters(), lr=1e-3), model, width=width, warmup_steps=0,
                      compression=compression, error_feedback=compression == "sign")

        def step() -> None:
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()

        results[f"width {width}"] = median_step_time(step, steps)
        opt.flush()
        opt.close()
    if rank == 0:
        print(f"\n## Training step, MLP {n_params / 1e6:.1f} M params, batch {batch}/rank, p = {world}, {compression}")
        print("| variant | ms / step | vs compute only |\n|---|---|---|")
        for name, seconds in results.items():
            print(f"| {name} | {seconds * 1e3:.1f} | {seconds / results['compute only']:.2f} |")
        w1, w2 = results["width 1"], results["width 2"]
        print(f"\nwidth 2 is {w1 / w2:.2f}x faster per step than width 1")


def main_rank(rank: int, world: int, args: argparse.Namespace) -> None:
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda":
        # Ranks beyond the GPU count share GPUs (gloo over CUDA tensors); set_device needs an index.
        DEVICE = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(DEVICE)
    if rank == 0:
        print(f"device {DEVICE}, backend {dist.get_backend()}, {world} ranks")
    sizes = [1 << k for k in range(10, 27, 2)]  # 1 KiB ... 64 MiB
    bench_collectives(rank, world, sizes, args.repeats)
    bench_codec_rings(rank, world, args.codec_mb << 20, max(3, args.repeats // 4), args.link_gbit * 1e9 / 8)
    bench_codecs(rank)
    bench_steps(rank, world, args.hidden, args.batch, args.steps, args.compression)


def _size(n_bytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= scale:
            return f"{n_bytes // scale} {unit}"
    return f"{n_bytes} B"


def main() -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2, help="local processes when not under torchrun")
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--codec-mb", type=int, default=16, help="message size of the compressed-ring table")
    parser.add_argument("--hidden", type=int, default=1024, help="MLP width of the training-step table")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--compression", default="none")
    parser.add_argument("--link-gbit", type=float, default=1.0,
                        help="add payload bytes / this line rate to loopback times (0 inside a shaped cluster)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (ranks share the GPU over gloo)")
    args = parser.parse_args()
    if args.ranks < 1:
        parser.error("--ranks must be >= 1")
    run_on_ranks(main_rank, args.ranks, args)


if __name__ == "__main__":
    main()
