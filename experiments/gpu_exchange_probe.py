"""Why the two-collective exchange loses to the per-hop ring on a GPU over gloo (gpu_speed: ResNet-18 q8 13.9 ms
against 10.5, LeNet 6.1 against 2.6, while on CPU loopback it wins): the pieces, timed apart.

    python experiments/gpu_exchange_probe.py --device cuda --ranks 4 --out DIR
    python experiments/gpu_exchange_probe.py --device cpu --ranks 2 --sizes 0.14 --repeats 3 --out /tmp/p

Per gradient size (``--sizes``, millions of fp32 elements; the defaults are LeNet's and ResNet-18's), with the
q8 payload's byte counts: (a) the raw gloo collectives on pinned host memory that each all-reduce is made of: the
exchange's all-to-all and all-gather, and the ring's 2(p-1) neighbour hops (isend to the next rank, irecv from the
previous); (b) the two all-reduces end to end on the device (the exchange with its all-gather as an all-to-all,
what the library does where gloo carries CUDA tensors, and with gloo's own all-gather), with the wall time of their
phases (wire wait, codec, ...: host time, so a codec kernel's cost lands where the next blocking copy waits for
it). Every time is the slowest rank's median. Writes ``exchange_probe.md`` / ``.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.harness.one_line import OneLineParser  # noqa: E402
from gpu_common import check_device, device_name, launch, markdown, rank_device, write_results  # noqa: E402

from pipesgd.comm.alltoall import alltoall_allreduce_  # noqa: E402
from pipesgd.comm.ring import RingTopology, chunk_bounds, ring_allreduce_  # noqa: E402
from pipesgd.compression import build as build_codec  # noqa: E402
from pipesgd.measure import time_collective  # noqa: E402
from pipesgd.runlog import phases  # noqa: E402
from harness.raw_collectives import raw_collective_ms  # noqa: E402
from harness.switches import exchange_collectives  # noqa: E402


def raw_rows(world: int, rank: int, numel: int, codec, repeats: int) -> list[dict]:
    """The gloo collectives alone (``experiments/harness/raw_collectives.py``), on pinned host buffers of the q8
    payload's sizes, with the per-hop ring's 2(p-1) hops."""
    bounds = chunk_bounds(numel, world)
    chunk = max(codec.payload_bytes(b - a, torch.float32) for a, b in zip(bounds[:-1], bounds[1:]))
    ms = raw_collective_ms(rank, world, chunk, 1, repeats, hops=2 * (world - 1), pin_memory=torch.cuda.is_available())
    names = {"all-to-all": "all-to-all (exchange step 2)", "pairwise": "the same bytes one peer at a time",
             "all-gather": "all-gather (exchange step 5)", "ring hops": f"{2 * (world - 1)} ring hops"}
    peers = {"all-to-all": world, "pairwise": world}  # bytes per rank: a chunk for each rank, else one chunk
    return [{"collective": names[key], "bytes per rank": f"{chunk * peers.get(key, 1) / 2**20:.2f} MiB",
             "ms": f"{value:.2f}"} for key, value in ms.items()]


def allreduce_rows(numel: int, device: torch.device, codec, repeats: int) -> list[dict]:
    flat = torch.randn(numel, device=device)
    topology = RingTopology(dist.group.WORLD)
    rows = []
    variants = (("exchange, all-gather as all-to-all (the library's where staged)", alltoall_allreduce_, True),
                ("exchange, the backend's all-gather", alltoall_allreduce_, False), ("ring", ring_allreduce_, None))
    for name, run, gather_by_alltoall in variants:
        call = lambda run=run: run(flat, codec, topology, "mean")  # noqa: E731
        with exchange_collectives(gather_by_alltoall=gather_by_alltoall):
            seconds = time_collective(call, repeats, 2, device=device)
            phases.reset()
            phases.enable(True)
            for _ in range(repeats):
                call()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            phases.enable(False)
        split = phases.snapshot()
        rows.append({"all-reduce": name, "ms": f"{seconds * 1e3:.2f}"}
                    | {f"{k} ms": f"{v / repeats * 1e3:.2f}" for k, v in split.items()})
    return rows


def main_rank(rank: int, world: int, args) -> None:
    device = rank_device(args.device, rank)
    codec = build_codec("q8")
    raw, full = [], []
    for size in args.sizes:
        numel = int(size * 1e6)
        label = {"size": f"{size} M"}
        raw += [label | row for row in raw_rows(world, rank, numel, codec, args.repeats)]
        full += [label | row for row in allreduce_rows(numel, device, codec, args.repeats)]
    if rank != 0:
        return
    header = (f"# The exchange against the ring, piece by piece (q8)\n\ndevice: {device_name(device)}; backend "
              f"{dist.get_backend()}, {world} rank(s); slowest rank's median of {args.repeats}")
    table = markdown(raw, ["size", "collective", "bytes per rank", "ms"]) + "\n\n" + markdown(
        full, ["size", "all-reduce", "ms"] + [f"{k} ms" for k in phases.PHASES])
    print(f"{header}\n\n{table}", flush=True)
    write_results(args.out, "exchange_probe", header, table, {"raw": raw, "allreduce": full})


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--sizes", default="0.14,11.17", help="gradient sizes, millions of fp32 elements")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        args.sizes = [float(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes: comma-separated numbers, got {args.sizes!r}")
    if args.ranks < 2 or args.repeats < 1 or min(args.sizes) <= 0:
        parser.error("--ranks must be >= 2, --repeats >= 1 and every size > 0")
    check_device(parser, args.device)
    launch(main_rank, args.ranks, "gloo", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
