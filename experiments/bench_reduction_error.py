"""Accuracy of the reduction (issue 38 part 2): the relative L2 error of the averaged gradient against the exact
mean, for the paper's per-hop ring and the two-collective all-to-all all-reduce, per lossy codec, without and with
error feedback, on p local gloo ranks over loopback.

    nice -n 15 python experiments/bench_reduction_error.py                          # p = 2,4,8,16; ~25 min on 2 cores
    nice -n 15 python experiments/bench_reduction_error.py --ranks 2,4 --numel 65536 --steps 3 --out /tmp/re

Data, fresh every step: "gradient-like", a shared standard normal part plus 0.5x per-rank standard normal noise
(--numel elements); "resnet20", ResNet-20's gradients on scikit-learn's digits at its seed-0 initialisation, each
rank its own batch of 32 (step t: the first batch of the rank's shard of epoch t, as ``pipesgd-train`` deals them).
Each rank runs the all-reduce as a PipeSGD bucket does (``op="mean"``, one bucket, the codec's default block size).
Without feedback, a cell is the mean over the --steps steps of ||avg_t - mean_t|| / ||mean_t|| (in %). With
feedback, the per-step error is averaged over steps 2..N (step 1 has no residual yet), and a second table gives the
accumulated error ||sum_t avg_t - sum_t mean_t|| / ||sum_t mean_t|| over all N steps, which feedback keeps small.
Writes ``reduction_error.md`` (provenance first, then the tables) and ``reduction_error.json`` under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from pipesgd.comm.alltoall import alltoall_allreduce_
from timing_model.atomic import write_text_atomic
from experiments.harness.provenance import markdown_header, provenance, write_result
from experiments.harness.one_line import OneLineParser
from pipesgd.compression import ErrorFeedback, build
from experiments.harness.rank_launch import run_on_ranks
from pipesgd.comm.ring import RingTopology, ring_allreduce_
from pipesgd.train.data import load_digits, shard_batches
from pipesgd.train.models import build_model

ALGORITHMS = {"ring": ring_allreduce_, "alltoall": alltoall_allreduce_}
NOISE = 0.5  # per-rank noise relative to the shared part
BATCH = 32


def gradient_like(rank: int, numel: int, steps: int) -> list[torch.Tensor]:
    """A shared part (the same on every rank) plus NOISE times this rank's own, fresh each step."""
    out = []
    for t in range(steps):
        shared = torch.randn(numel, generator=torch.Generator().manual_seed(t))
        noise = torch.randn(numel, generator=torch.Generator().manual_seed(1_000_003 * (t + 1) + rank))
        out.append(shared + NOISE * noise)
    return out


def resnet20_gradients(rank: int, world: int, steps: int) -> list[torch.Tensor]:
    """This rank's flat ResNet-20 gradient on its own batch of each step, at the seed-0 initialisation: step t takes
    the first batch of the rank's shard in epoch t (at p = 16 a shard of digits holds only two batches)."""
    data = load_digits()
    torch.manual_seed(0)
    model = build_model("resnet20", data.input_shape, data.num_classes)
    out = []
    for t in range(steps):
        x, y = next(shard_batches(data, epoch=t, seed=0, worker=rank, num_workers=world, batch_size=BATCH))
        model.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        out.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    return out


def measure(rank: int, world: int, settings: dict, out_path: str) -> None:
    """Every (data, codec, feedback, algorithm) over the steps; rank 0 writes the records to ``out_path``."""
    topology = RingTopology(dist.group.WORLD)
    sets = {"gradient-like": gradient_like(rank, settings["numel"], settings["steps"]),
            "resnet20": resnet20_gradients(rank, world, settings["steps"])}
    records = []
    for data_name, inputs in sets.items():
        exact = []
        for x in inputs:  # fp64 sums: the reference every codec is measured against
            mean = x.double()
            dist.all_reduce(mean)
            exact.append(mean / world)
        for codec in settings["codecs"]:
            for feedback in (False, True):
                for algorithm, allreduce_ in ALGORITHMS.items():
                    compressor = build(codec)
                    residuals = ErrorFeedback(compressor) if feedback else None
                    errors, total_avg = [], torch.zeros_like(exact[0])
                    for x, mean in zip(inputs, exact):
                        flat = x.clone()
                        residual = residuals.residual(0, flat) if residuals is not None else None
                        allreduce_(flat, compressor, topology, "mean", residual)
                        errors.append(float((flat.double() - mean).norm() / mean.norm()))
                        total_avg += flat.double()
                    total_exact = torch.stack(exact).sum(0)
                    accumulated = float((total_avg - total_exact).norm() / total_exact.norm())
                    records.append({"p": world, "data": data_name, "numel": inputs[0].numel(), "codec": codec,
                                    "feedback": feedback, "algorithm": algorithm, "errors": errors,
                                    "accumulated": accumulated})
    if rank == 0:
        write_text_atomic(out_path, json.dumps(records))


def per_step(record: dict) -> float:
    """The cell of the per-step table: mean over all steps, or over steps 2..N with feedback."""
    errors = record["errors"][1:] if record["feedback"] and len(record["errors"]) > 1 else record["errors"]
    return sum(errors) / len(errors)


def tables(records: list[dict], ranks: list[int], steps: int) -> str:
    cell = {(r["data"], r["codec"], r["feedback"], r["p"], r["algorithm"]): r for r in records}
    rows = sorted({(r["data"], r["codec"], r["feedback"]) for r in records},
                  key=lambda row: (row[0] != "gradient-like", row[1], row[2]))
    head = "| data | codec | feedback | " + " | ".join(f"p={p} ring | p={p} alltoall" for p in ranks) + " |"
    rule = "|---|---|---|" + "---|---|" * len(ranks)
    numel = {r["data"]: r["numel"] for r in records}
    lines = [f"Relative L2 error of the averaged gradient against the exact mean, in % (per step: the mean over "
             f"{steps} steps; with feedback over steps 2..{steps}). gradient-like: {numel.get('gradient-like')} "
             f"elements; resnet20: {numel.get('resnet20')}.", "", head, rule]
    for data, codec, feedback in rows:
        values = [cell.get((data, codec, feedback, p, a)) for p in ranks for a in ALGORITHMS]
        lines.append(f"| {data} | {codec} | {'on' if feedback else 'off'} | "
                     + " | ".join(f"{100 * per_step(v):.3f}" if v else "-" for v in values) + " |")
    lines += ["", f"With feedback, accumulated over the {steps} steps: ||sum avg - sum mean|| / ||sum mean||, in %.",
              "", head.replace("| feedback ", ""), rule[:-4]]
    for data, codec, feedback in rows:
        if feedback:
            values = [cell.get((data, codec, True, p, a)) for p in ranks for a in ALGORITHMS]
            lines.append(f"| {data} | {codec} | "
                         + " | ".join(f"{100 * v['accumulated']:.3f}" if v else "-" for v in values) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4,8,16", help="world sizes, comma-separated")
    parser.add_argument("--numel", type=int, default=2**20, help="elements of the gradient-like data")
    parser.add_argument("--steps", type=int, default=6, help="consecutive steps per configuration")
    parser.add_argument("--codecs", default="q8,q4,sign")
    parser.add_argument("--out", default="experiments/results/bench_reduction_error")
    args = parser.parse_args()
    origin = provenance()  # before the runs: the code they run, not what the tree holds when they end
    ranks = [int(p) for p in args.ranks.split(",")]
    settings = {"numel": args.numel, "steps": args.steps, "codecs": args.codecs.split(",")}
    records = []
    with tempfile.TemporaryDirectory() as scratch:
        for world in ranks:
            path = os.path.join(scratch, f"p{world}.json")
            run_on_ranks(measure, world, settings, path)
            with open(path) as f:
                records += json.load(f)
            print(f"[bench_reduction_error] p = {world} done", flush=True)
    table = tables(records, ranks, args.steps)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    header = (markdown_header("Reduction error: ring vs alltoall", origin)
              + f"- loopback gloo, one thread per rank, every rank on this machine's {os.cpu_count()} cores\n\n")
    write_text_atomic(os.path.join(args.out, "reduction_error.md"), header + table + "\n")
    write_result(os.path.join(args.out, "reduction_error.json"), {"settings": settings, "ranks": ranks,
                                                                  "records": records}, origin)


if __name__ == "__main__":
    main()
