"""Which compressed all-reduce ``allreduce="auto"`` should pick: the paper's per-hop ring against the two-collective
all-to-all all-reduce (``pipesgd.comm.alltoall``), per codec, world size and bucket size, side by side in one run.

    nice -n 15 python experiments/bench_allreduce_choice.py                  # p = 2,3,4; 0.25 and 25 MiB; ~10 min

Local gloo processes over loopback, one thread each; with ``--bandwidth`` (root; ``ip``, ``tc``) one process per
node of an emulated cluster of ``--nodes`` nodes whose links are shaped to that rate, where the wire, not the
per-hop Python, sets the pace:

    python experiments/bench_allreduce_choice.py --bandwidth 200mbit --nodes 4 --codecs q8,sign --sizes-mib 1,7

The "alltoall" column is the exchange as the library runs it (both collectives one peer at a time for payloads of
32 KiB per peer and more, ``RingTopology.sends_pairwise``). ``--gather-ab`` adds it with its all-gather sent as an
all-to-all; ``--pairwise-ab`` makes that column gloo's collectives and adds one with both collectives sent one peer
at a time.

Each round times both, in alternating order; a cell is the
median over rounds of the slowest rank's median over ``--repeats`` calls. Error feedback is on (the trainer's case
for sign; for the others it adds the same booking work to both). Prints a markdown table and writes it, provenance
first, to ``allreduce_choice.md`` under --out.

With ``--calibration FILE`` (``pipesgd-timing calibrate`` on the same ranks, made beforehand and never shown these
timings) each row also gets the timing model's seconds for both all-reduces of that bucket and whether the model
picks the one that measured faster: a held-out check of the model's ring-or-exchange verdict.

    torchrun --nproc-per-node 4 -m pipesgd.measure calibrate --sizes 64KB:8MB --compressions none,q8,sign --out c.json
    python experiments/bench_allreduce_choice.py --ranks 2,4 --codecs q8,sign --sizes-mib 0.25,4,25 --calibration c.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import statistics
import tempfile

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from pipesgd.comm.alltoall import alltoall_allreduce_
from timing_model.atomic import write_text_atomic
from experiments.harness.provenance import markdown_header, provenance
from experiments.harness.one_line import OneLineParser
from experiments.harness.raw_collectives import raw_collective_ms
from experiments.harness.switches import exchange_collectives
from pipesgd.compression import ErrorFeedback, build
from timing_model.bandwidth import parse_bandwidth_bps
from experiments.harness.rank_launch import run_on_ranks
from experiments.harness.rank_launch import LaunchError, launch_ranks
from pipesgd.measure import time_collective
from pipesgd.comm.ring import RingTopology, ring_allreduce_
from timing_model.calibration import read_calibration
from timing_model.predict import Scenario, predict
from timing_model.validation import calibrated_scenario


def _alltoall_with(**forced: bool):
    """The exchange with its collectives forced one way for the call (``experiments/harness/switches.py``:
    ``gather_by_alltoall``, its all-gather as an all-to-all, what it does where payloads are staged; ``pairwise``,
    both collectives one peer at a time or as gloo's), then given back to the library's choice."""

    def run(flat, compressor, topology, op, residual):
        with exchange_collectives(**forced):
            return alltoall_allreduce_(flat, compressor, topology, op, residual)

    return run


ALGORITHMS = {"ring": ring_allreduce_, "alltoall": alltoall_allreduce_}
GATHER_AB = {"alltoall_a2a_gather": _alltoall_with(gather_by_alltoall=True, pairwise=False)}  # --gather-ab
# --pairwise-ab: the exchange's "alltoall" column as gloo's collectives, beside it one peer at a time
PAIRWISE_AB = {"alltoall": _alltoall_with(pairwise=False), "alltoall_pairwise": _alltoall_with(pairwise=True)}


def bench(rank: int, world: int, codecs: list[str], sizes_mib: list[float], rounds: int, repeats: int,
          out_path: str, gather_ab: bool = False, raw: bool = False, pairwise_ab: bool = False) -> None:
    """Every (size, codec) cell on this group; rank 0 writes the table rows to ``out_path``."""
    topology = RingTopology(dist.group.WORLD)
    algorithms = ALGORITHMS | (GATHER_AB if gather_ab else {}) | (PAIRWISE_AB if pairwise_ab else {})
    rows, raw_rows = [], []
    for size_mib in sizes_mib:
        numel = int(size_mib * 2**20 / 4)
        x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        for name in codecs:
            feedback = {algorithm: ErrorFeedback(build(name)) for algorithm in algorithms}
            times: dict[str, list[float]] = {algorithm: [] for algorithm in algorithms}
            for round_index in range(rounds):
                order = list(algorithms) if round_index % 2 == 0 else list(reversed(algorithms))
                for algorithm in order:
                    flat = x.clone()
                    residual = feedback[algorithm].residual(0, flat)

                    def call(algorithm=algorithm, flat=flat, residual=residual) -> None:
                        algorithms[algorithm](flat, feedback[algorithm].compressor, topology, "mean", residual)

                    times[algorithm].append(time_collective(call, repeats, warmup=1))
            rows.append({"p": world, "mib": size_mib, "codec": name}
                        | {f"{a}_s": statistics.median(times[a]) for a in algorithms})
        if raw:  # the bare collectives, on chunks the size of this bucket's q8 payload per peer
            chunk = build("q8").payload_bytes(-(-numel // world), torch.float32)
            raw_rows.append({"p": world, "mib": size_mib, "chunk_bytes": chunk}
                            | raw_collective_ms(rank, world, chunk, rounds, repeats))
    if rank == 0:
        write_text_atomic(out_path, json.dumps({"rows": rows, "raw": raw_rows}))


def predicted_s(calibration, nodes: int, n_bytes: float, codec: str, allreduce: str) -> float:
    """The timing model's seconds for one all-reduce of an ``n_bytes`` bucket (error feedback on, as measured here)
    with ``allreduce`` ("ring" or "alltoall"), from ``calibration``'s fits and codec factors."""
    scenario = Scenario(nodes=nodes, grad_bytes=float(n_bytes), bandwidth_Bps=1.0, compression=codec,
                        error_feedback=True, bucket_bytes=0.0, allreduce=allreduce)
    return predict(calibrated_scenario(scenario, calibration, "sync"), ("sync",)).result("sync").comm_total_s


def _row(row: dict, calibration) -> str:
    ring, alltoall = row["ring_s"], row["alltoall_s"]
    line = (f"| {row['p']} | {row['mib']:g} | {row['codec']} | {ring * 1e3:.1f} | {alltoall * 1e3:.1f} | "
            f"{alltoall / ring:.2f} |")
    if "alltoall_a2a_gather_s" in row:
        gathered = row["alltoall_a2a_gather_s"]
        line += f" {gathered * 1e3:.1f} | {gathered / ring:.2f} |"
    if "alltoall_pairwise_s" in row:
        pairwise = row["alltoall_pairwise_s"]
        line += f" {pairwise * 1e3:.1f} | {pairwise / ring:.2f} |"
    if calibration is None:
        return line
    n_bytes = int(row["mib"] * 2**20 / 4) * 4
    model = {a: predicted_s(calibration, row["p"], n_bytes, row["codec"], a) for a in ("ring", "alltoall")}
    agrees = (model["alltoall"] < model["ring"]) == (alltoall < ring)
    return line + f" {model['ring'] * 1e3:.1f} | {model['alltoall'] * 1e3:.1f} | {'yes' if agrees else 'no'} |"


def node_main(settings_json: str) -> None:
    """One node of the emulated cluster (``launch_ranks`` starts it under torchrun): ``bench`` on the world."""
    settings = json.loads(settings_json)
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    try:
        bench(dist.get_rank(), dist.get_world_size(), **settings)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> None:
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):  # a node of the emulated cluster
        return node_main(sys.argv[1])
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,3,4", help="world sizes, comma-separated")
    parser.add_argument("--sizes-mib", default="0.25,25", help="bucket sizes in MiB of fp32, comma-separated")
    parser.add_argument("--codecs", default="fp16,q8,q4,sign")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both, alternating their order")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per algorithm and round")
    parser.add_argument("--out", default="experiments/results/bench_allreduce_choice")
    parser.add_argument("--calibration", help="a calibrate file: add the timing model's verdict to every row")
    parser.add_argument("--bandwidth", help="per-link rate of an emulated cluster, e.g. 200mbit (root; ip, tc)")
    parser.add_argument("--nodes", type=int, default=4, help="nodes of the emulated cluster (with --bandwidth)")
    parser.add_argument("--gather-ab", action="store_true",
                        help="also time the exchange with its all-gather sent as an all-to-all")
    parser.add_argument("--pairwise-ab", action="store_true",
                        help="also time the exchange with both collectives sent one peer at a time")
    parser.add_argument("--raw", action="store_true", help="also time the bare gloo collectives per size "
                        "(experiments/harness/raw_collectives.py)")
    args = parser.parse_args()
    try:
        calibration = read_calibration(args.calibration) if args.calibration else None
        bandwidth_bps = parse_bandwidth_bps(args.bandwidth) if args.bandwidth else None
        worlds = [args.nodes] if args.bandwidth else [int(p) for p in args.ranks.split(",")]
        codecs, sizes = args.codecs.split(","), [float(s) for s in args.sizes_mib.split(",")]
        for name in codecs:
            build(name)
    except (ValueError, KeyError) as err:
        parser.error(str(err))
    if min(worlds) < 2 or args.rounds < 1 or args.repeats < 1 or min(sizes) <= 0:
        parser.error("world sizes (--ranks, --nodes) must be >= 2, --rounds and --repeats >= 1, sizes > 0")
    origin = provenance()  # before the runs: the code they run, not what the tree holds when they end
    where = (f"{args.nodes} emulated nodes at {args.bandwidth} per link (tc tbf), one process and thread each"
             if args.bandwidth else "loopback gloo, one thread per rank")
    lines = [f"ring vs alltoall, {where} on {os.cpu_count()} cores; median over "
             f"{args.rounds} rounds of the slowest rank's median over {args.repeats} calls, error feedback on", ""]
    gathered = " alltoall, all-gather as all-to-all, ms | its / ring |" if args.gather_ab else ""
    gathered += " alltoall, one peer at a time, ms | its / ring |" if args.pairwise_ab else ""
    model = " model ring ms | model alltoall ms | model picks the faster |" if calibration else ""
    exchange = "alltoall collectives ms | collectives / ring" if args.pairwise_ab else "alltoall ms | alltoall / ring"
    lines += [f"| p | MiB | codec | ring ms | {exchange} |" + gathered + model,
              "|---|---|---|---|---|---|" + ("---|---|" * (args.gather_ab + args.pairwise_ab))
              + ("---|---|---|" if calibration else "")]
    raw_lines = ["", "The bare collectives on chunks of each bucket's q8 payload per peer (ms):", "",
                 "| p | MiB | chunk KB | all-to-all | pairwise rounds | all-gather | ring hops x (p-1) |",
                 "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as scratch:
        for world in worlds:
            path = os.path.join(scratch, f"p{world}.json")
            if args.bandwidth:
                settings = json.dumps({"codecs": codecs, "sizes_mib": sizes, "rounds": args.rounds,
                                       "repeats": args.repeats, "out_path": path, "gather_ab": args.gather_ab,
                                       "raw": args.raw, "pairwise_ab": args.pairwise_ab})
                try:
                    launch_ranks("experiments.bench_allreduce_choice", settings, lambda: None, nodes=world,
                                 bandwidth=args.bandwidth, bandwidth_bps=bandwidth_bps, cluster_name="psgdchoice",
                                 timeout_s=3600.0)
                except LaunchError as err:
                    print(f"error: {err}", file=sys.stderr)
                    raise SystemExit(1) from None
            else:
                run_on_ranks(bench, world, codecs, sizes, args.rounds, args.repeats, path, args.gather_ab, args.raw,
                             args.pairwise_ab)
            with open(path) as f:
                measured = json.load(f)
            lines += [_row(row, calibration) for row in measured["rows"]]
            raw_lines += [f"| {r['p']} | {r['mib']:g} | {r['chunk_bytes'] / 1e3:.0f} | {r['all-to-all']:.1f} | "
                          f"{r['pairwise']:.1f} | {r['all-gather']:.1f} | {r['ring hops']:.1f} |"
                          for r in measured["raw"]]
    table = "\n".join(lines + (raw_lines if args.raw else []))
    print(table)
    os.makedirs(args.out, exist_ok=True)
    header = markdown_header("Which compressed all-reduce: ring vs alltoall time", origin)
    write_text_atomic(os.path.join(args.out, "allreduce_choice.md"), header + "\n" + table + "\n")


if __name__ == "__main__":
    main()
