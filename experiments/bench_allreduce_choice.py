"""Which compressed all-reduce ``allreduce="auto"`` should pick: the paper's per-hop ring against the two-collective
all-to-all all-reduce (``pipesgd.alltoall``), per codec, world size and bucket size, side by side in one run.

    nice -n 15 python experiments/bench_allreduce_choice.py --ranks 2,3,4 --sizes-mib 1,25 --rounds 5

Local gloo processes over loopback, one thread each. Each round times both, in alternating order; a cell is the
median over rounds of the slowest rank's median over ``--repeats`` calls. Error feedback is on (the trainer's case
for sign; for the others it adds the same booking work to both). Prints a markdown table.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.distributed as dist

from pipesgd.alltoall import alltoall_allreduce_
from pipesgd.compression import ErrorFeedback, build
from pipesgd.launch import run_on_ranks
from pipesgd.measure import time_collective
from pipesgd.ring import RingTopology, ring_allreduce_

ALGORITHMS = {"ring": ring_allreduce_, "alltoall": alltoall_allreduce_}


def bench(rank: int, world: int, codecs: list[str], sizes_mib: list[float], rounds: int, repeats: int) -> None:
    topology = RingTopology(dist.group.WORLD)
    for size_mib in sizes_mib:
        numel = int(size_mib * 2**20 / 4)
        x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        for name in codecs:
            feedback = {algorithm: ErrorFeedback(build(name)) for algorithm in ALGORITHMS}
            times: dict[str, list[float]] = {algorithm: [] for algorithm in ALGORITHMS}
            for round_index in range(rounds):
                order = list(ALGORITHMS) if round_index % 2 == 0 else list(reversed(ALGORITHMS))
                for algorithm in order:
                    flat = x.clone()
                    residual = feedback[algorithm].residual(0, flat)

                    def call(algorithm=algorithm, flat=flat, residual=residual) -> None:
                        ALGORITHMS[algorithm](flat, feedback[algorithm].compressor, topology, "mean", residual)

                    times[algorithm].append(time_collective(call, repeats, warmup=1))
            if rank == 0:
                ring, alltoall = (statistics.median(times[a]) for a in ALGORITHMS)
                print(f"| {world} | {size_mib:g} | {name} | {ring * 1e3:.1f} | {alltoall * 1e3:.1f} | "
                      f"{alltoall / ring:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,3,4", help="world sizes, comma-separated")
    parser.add_argument("--sizes-mib", default="1,25", help="bucket sizes in MiB of fp32, comma-separated")
    parser.add_argument("--codecs", default="fp16,q8,q4,sign")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both, alternating their order")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per algorithm and round")
    args = parser.parse_args()
    print(f"ring vs alltoall, loopback gloo, one thread per rank; median over {args.rounds} rounds of the slowest "
          f"rank's median over {args.repeats} calls, error feedback on\n")
    print("| p | MiB | codec | ring ms | alltoall ms | alltoall / ring |\n|---|---|---|---|---|---|", flush=True)
    for world in (int(p) for p in args.ranks.split(",")):
        run_on_ranks(bench, world, args.codecs.split(","), [float(s) for s in args.sizes_mib.split(",")],
                     args.rounds, args.repeats)


if __name__ == "__main__":
    main()
