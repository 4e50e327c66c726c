"""Batched codec calls in the two-collective exchange (issue 38 part 3): one codec call per chunk, as before, against
as few calls as ``pipesgd.compression.rows`` allows, side by side in one run (alternating which goes first).

    nice -n 15 python experiments/bench_codec_rows.py                       # codec work alone, then 4 gloo ranks
    python experiments/bench_codec_rows.py --device cuda --ranks 0          # on a GPU: the kernel launches saved
    python experiments/bench_codec_rows.py --p 4,16 --sizes-mib 0.08,1 --codecs q8 --ranks 0 --out /tmp/cr

Table 1, "codec work": in one process, what one rank's exchange does with its codec for one bucket of --sizes-mib
MiB at world size p: encode the p-1 chunks others own, decode the p-1 contributions to its own chunk, decode the p-1
chunks gathered at the end, and book error feedback's residuals (on, as the trainer runs sign; for q8, q4 and bf16
it adds the same booking to both). No network: it is the work the change touches. Table 2 (``--ranks N``, 0 skips
it): the whole exchange (``alltoall_allreduce_``) on N local gloo ranks over loopback, the slowest rank's median
per call. Cells: medians over --rounds rounds of --repeats calls each; ratio = one-by-one / batched (above 1:
batching is faster). The payloads are the same bits either way (``tests/test_codec_rows.py``). Writes
``codec_rows.md`` (provenance first) under --out.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.provenance import markdown_header, provenance
from experiments.harness.one_line import OneLineParser
from experiments.harness.switches import one_call_per_chunk
from timing_model.cli_conventions import positive_int
from pipesgd.comm.alltoall import alltoall_allreduce_
from pipesgd.comm.ring import chunk_bounds
from pipesgd.comm.topology import RingTopology
from pipesgd.compression import build
from pipesgd.compression.error_feedback import open_encoder
from experiments.harness.rank_launch import run_on_ranks
from timing_model.atomic import write_text_atomic

WAYS = ("one by one", "batched")


def codec_work(codec_name: str, p: int, numel: int, device: str = "cpu"):
    """One rank's codec work of one exchange (module doc), as a function to time: rank 0's view (it owns chunk 0;
    the other ranks' contributions to it are stood in for by its own payload, p-1 copies side by side in one buffer
    as the all-to-all delivers them)."""
    codec = build(codec_name)
    flat = torch.randn(numel, generator=torch.Generator().manual_seed(p)).to(device)
    residual = torch.zeros(numel, device=device)
    bounds = chunk_bounds(numel, p)
    chunks = [flat[bounds[c] : bounds[c + 1]] for c in range(p)]
    others = list(range(1, p))
    incoming = list(codec.compress(chunks[0])[0].repeat(p - 1).view(p - 1, -1).unbind(0))

    def work() -> None:
        encoder = open_encoder(codec, flat, residual, mean_over=p, deferred=True)
        payloads = encoder.encode_chunks([chunks[c] for c in others], [bounds[c] for c in others])
        encoder.drain()  # error feedback's booking
        encoder.decode_chunks(incoming, [chunks[0]] * (p - 1))
        encoder.decode_chunks(payloads, [chunks[c] for c in others])
        if flat.is_cuda:
            torch.cuda.synchronize()  # the kernels' time, not their launch alone
    return work


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ab(run_one, rounds: int, repeats: int) -> dict[str, float]:
    """Medians over rounds of each way's median, alternating which goes first."""
    medians: dict[str, list[float]] = {way: [] for way in WAYS}
    for round_ in range(rounds):
        for way in (WAYS if round_ % 2 == 0 else WAYS[::-1]):
            medians[way].append(run_one(way, repeats))
    return {way: statistics.median(values) for way, values in medians.items()}


def codec_table(args) -> list[str]:
    lines = ["| codec | p | bucket MiB | one by one ms | batched ms | ratio |", "|---|---|---|---|---|---|"]
    for name in args.codecs:
        for p in args.p:
            for mib in args.sizes_mib:
                numel = int(mib * 2**20 / 4)

                work = codec_work(name, p, numel, args.device)

                def run_one(way: str, repeats: int) -> float:
                    if way == "batched":
                        return timed(work, repeats)
                    with one_call_per_chunk():
                        return timed(work, repeats)

                run_one("batched", 2)  # warm-up: first-call costs out of the table
                got = ab(run_one, args.rounds, args.repeats)
                a, b = got["one by one"] * 1e3, got["batched"] * 1e3
                lines.append(f"| {name} | {p} | {mib:g} | {a:.3f} | {b:.3f} | {a / b:.2f} |")
                print(lines[-1], flush=True)
    return lines


def _exchange_on_ranks(rank: int, world: int, codecs: list[str], sizes: list[float], rounds: int, repeats: int,
                       out: str) -> None:
    topology = RingTopology(dist.group.WORLD)
    lines = []
    for name in codecs:
        codec = build(name)
        for mib in sizes:
            numel = int(mib * 2**20 / 4)
            flat = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
            residual = torch.zeros(numel)

            def call(repeats: int) -> float:
                times = []
                for _ in range(repeats):
                    work = flat.clone()
                    dist.barrier()
                    start = time.perf_counter()
                    alltoall_allreduce_(work, codec, topology, "mean", residual)
                    times.append(time.perf_counter() - start)
                return statistics.median(times)

            def run_one(way: str, repeats: int) -> float:
                if way == "batched":
                    mine = call(repeats)
                else:
                    with one_call_per_chunk():
                        mine = call(repeats)
                slowest = torch.tensor([mine], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                return float(slowest)

            run_one("batched", 2)
            got = ab(run_one, rounds, repeats)
            a, b = got["one by one"] * 1e3, got["batched"] * 1e3
            lines.append(f"| {name} | {world} | {mib:g} | {a:.3f} | {b:.3f} | {a / b:.2f} |")
            if rank == 0:
                print(lines[-1], flush=True)
    if rank == 0:
        write_text_atomic(out, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codecs", default="q8,q4,bf16,sign", type=lambda s: s.split(","))
    parser.add_argument("--p", default="2,4,8,16", type=lambda s: [positive_int(x) for x in s.split(",")],
                        help="world sizes of table 1, comma-separated")
    parser.add_argument("--sizes-mib", default="0.08,1,4", type=lambda s: [float(x) for x in s.split(",")],
                        help="bucket sizes in MiB of fp32 (0.08: LeNet's gradient; 1: ResNet-20's)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="table 1's tensors")
    parser.add_argument("--ranks", default=4, type=int, help="gloo ranks of table 2 (0: skip it; CPU tensors)")
    parser.add_argument("--rounds", default=4, type=positive_int)
    parser.add_argument("--repeats", default=15, type=positive_int)
    parser.add_argument("--out", default="experiments/results/bench_codec_rows")
    try:
        args = parser.parse_args(argv)
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    unknown = [name for name in args.codecs if name not in ("none", "fp16", "bf16", "q8", "q4", "sign")]
    if unknown or any(size <= 0 for size in args.sizes_mib) or args.ranks < 0 or args.ranks == 1:
        parser.error(f"bad --codecs {unknown}" if unknown else "--sizes-mib must be positive and --ranks 0 or >= 2")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    os.makedirs(args.out, exist_ok=True)
    origin = provenance()
    torch.set_num_threads(1)
    print(f"Table 1: codec work of one exchange, one process, {args.device}", flush=True)
    first = codec_table(args)
    second: list[str] = []
    if args.ranks:
        print(f"Table 2: the exchange on {args.ranks} gloo ranks (slowest rank)", flush=True)
        table = os.path.join(args.out, ".ranks.md")
        run_on_ranks(_exchange_on_ranks, args.ranks, args.codecs, args.sizes_mib, args.rounds, args.repeats, table)
        with open(table) as handle:
            second = ["| codec | ranks | bucket MiB | one by one ms | batched ms | ratio |",
                      "|---|---|---|---|---|---|", *handle.read().splitlines()]
        os.remove(table)
    text = markdown_header("Batched codec calls in the two-collective exchange", origin)
    text += ("\nRatio = one by one / batched (above 1: batching is faster); medians over rounds, alternating order. "
             f"Error feedback on.\n\n## Codec work of one exchange (one process, {args.device} tensors)\n\n"
             + "\n".join(first) + "\n")
    if second:
        text += f"\n## The exchange on {args.ranks} local gloo ranks (slowest rank per call)\n\n" + "\n".join(second)
        text += "\n"
    write_text_atomic(os.path.join(args.out, "codec_rows.md"), text)
    print(f"wrote {os.path.join(args.out, 'codec_rows.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
