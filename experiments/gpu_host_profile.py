"""Where PipeSGD's time on the training thread goes (gpu_speed: ``step()`` + ``zero_grad()`` held the host 6-12 ms per
ResNet-20 step on the H100 host, against about 1 ms for DDP's optimizer; this profile found most of it in waits for
the BatchNorm buffers' blocking broadcast, which gpu_speed's "of which wait ms" now counts).

    python experiments/gpu_host_profile.py --device cuda --ranks 4 --out DIR
    python experiments/gpu_host_profile.py --device cpu --ranks 2 --steps 4 --out /tmp/h

Per model and Pipe-SGD variant (K = 2, the buffers' sync blocking or delayed, SGD with momentum 0.9, batch 64 of
3x32x32): ``--steps`` steps after a warm-up, with Python's ``cProfile`` enabled around ``step()`` and ``zero_grad()``
(on Python 3.11 and older it sees the training thread only; from 3.12 on, the GPU machine's, it sees every thread
while enabled, the communication worker's calls too: ``gpu_thread_profile.py`` splits them by thread); rank 0's
functions with the most own time (tottime) and the most time including callees (cumtime), per step. Writes
``host_profile.md`` under ``--out``.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.harness.one_line import OneLineParser  # noqa: E402
from gpu_common import (add_profile_flags, build, check_device, check_profile_flags, device_name, launch,  # noqa: E402
                        rank_device)

from pipesgd.options import PipeSGDOptions
from pipesgd import PipeSGD  # noqa: E402

VARIANTS = (("none", "lookahead", "auto", "broadcast"), ("q8", "lookahead", "ring", "broadcast"),
            ("q8", "lookahead", "alltoall", "broadcast"), ("q8", "lookahead", "ring", "none"))


def profile_variant(device: torch.device, name: str, variant: tuple[str, str, str], args) -> str:
    codec, staleness, allreduce, buffers = variant
    torch.manual_seed(0)
    net = build(name).to(device)
    x = torch.randn(64, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    opt = PipeSGD(torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9), net, width=2, warmup_steps=0,
                  compression=codec, staleness=staleness,
                  options=PipeSGDOptions(allreduce=allreduce, buffers=buffers))
    profiler = cProfile.Profile()
    for t in range(args.warmup + args.steps):
        nn.functional.cross_entropy(net(x), y).backward()
        if t >= args.warmup:
            profiler.enable()
        opt.step()
        opt.zero_grad()
        if t >= args.warmup:
            profiler.disable()
    opt.flush()
    opt.close()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    total_ms = stats.total_tt / args.steps * 1e3
    rows = []
    for key in ("tottime", "cumulative"):
        stats.sort_stats(key)
        width = stats.fcn_list[: args.top]
        for func in width:
            calls, _, own, cum, _ = stats.stats[func]
            where = f"{Path(func[0]).name}:{func[1]}({func[2]})" if func[0] != "~" else func[2]
            rows.append(f"| {key} | {where} | {calls / args.steps:.1f} | {own / args.steps * 1e3:.3f} | "
                        f"{cum / args.steps * 1e3:.3f} |")
    head = (f"## {name}, K = 2, {codec}, {staleness}, {opt.allreduce}, buffers {buffers}: {total_ms:.2f} ms per step "
            "under the profiler\n\n"
            "| sorted by | function | calls / step | own ms / step | with callees ms / step |\n|---|---|---|---|---|")
    return head + "\n" + "\n".join(rows)


def main_rank(rank: int, world: int, args) -> None:
    device = rank_device(args.device, rank)
    sections = [profile_variant(device, name, variant, args) for name in args.models.split(",")
                for variant in VARIANTS]
    if rank == 0:
        text = (f"# PipeSGD on the training thread, profiled\n\ndevice: {device_name(device)}; gloo, {world} rank(s); "
                f"rank 0, {args.steps} steps after {args.warmup}\n\n" + "\n\n".join(sections) + "\n")
        print(text, flush=True)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "host_profile.md").write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_profile_flags(parser, models="resnet20,resnet18", steps=20, top=15)
    args = parser.parse_args(argv)
    check_profile_flags(parser, args)
    check_device(parser, args.device)
    launch(main_rank, args.ranks, "gloo", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
