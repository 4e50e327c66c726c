"""What keeping BatchNorm buffers identical costs per step, side by side in one run: ResNet-20 (BatchNorm) on N
emulated nodes (root), sync and pipe with the same codec, each with ``--buffers none`` and the default
``broadcast`` (rank 0's buffers, synced where the ranks meet), interleaved over --repeats rounds so the machine's
drift hits every variant alike.

    python experiments/bench_buffers.py --nodes 2 --cores-per-node 1 --bandwidth 100mbit --compression q8
    python experiments/bench_buffers.py --bandwidth 1gbit --compression none --repeats 3

Per variant: the iteration (median over steps after the warm-up of each step's mean over ranks, the period), the
buffer sync (each step's fastest rank: the others' extra wait there is the straggler), the ratio of the
iteration to the same mode's ``--buffers none`` run of the same round, and synchronous training's iteration over
this one's (the same codec and buffers). With ``--trace`` each run also writes a trace of the steps after the
warm-up and a second table says where the time went (``experiments.harness.breakdown``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.breakdown import markdown as breakdown_table  # noqa: E402
from experiments.harness.breakdown import median_breakdown  # noqa: E402
from experiments.harness.one_line import OneLineParser  # noqa: E402
from experiments.harness.scratch import earlier_runs_problem  # noqa: E402
from pipesgd.grads.buffers import BUFFER_MODES
from pipesgd.cluster.cluster import Cluster
from pipesgd.cluster.netns import ClusterError
from pipesgd.cluster.units import parse_link
from experiments.harness.results import load_run

MODE_FLAGS = {"sync": ["--mode", "sync"], "pipe": ["--mode", "pipe", "--width", "2"]}


def buffer_sync_s(path: str, skip: int) -> float:
    """Median over steps of the fastest rank's ``t_buffers`` (0 when the run synced none)."""
    run = load_run(path)
    per_step = run.per_step("t_buffers", skip, over_ranks=min)
    return statistics.median(per_step) if per_step else 0.0


def main() -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--bandwidth", default="1gbit", help="per-link rate (1gbit, 100mbit) or unshaped")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds of every variant")
    parser.add_argument("--modes", default="sync,pipe", help="comma list of sync, pipe")
    parser.add_argument("--compression", default="q8", help="the codec of every run (sync and pipe alike)")
    parser.add_argument("--cores-per-node", type=int, default=0, help="cores of its own per node (0: all shared)")
    parser.add_argument("--buffer-modes", default="none,broadcast",
                        help=f"comma list of {', '.join(BUFFER_MODES)} (none always runs: the ratios' base)")
    parser.add_argument("--trace", action="store_true", help="trace each run and print where the time went")
    parser.add_argument("--out", default="results/bench_buffers")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODE_FLAGS]
    if bad or not modes:
        parser.error(f"unknown mode(s) {bad or modes}; valid: {', '.join(MODE_FLAGS)}")
    unknown = [b for b in args.buffer_modes.split(",") if b.strip() and b.strip() not in BUFFER_MODES]
    if unknown:
        parser.error(f"unknown buffer mode(s) {unknown}; valid: {', '.join(BUFFER_MODES)}")
    if args.steps <= args.warmup_steps + 3 or args.repeats < 1 or args.nodes < 2:
        parser.error("need --steps > --warmup-steps + 3, --repeats >= 1 and --nodes >= 2")
    try:
        link = parse_link(args.bandwidth)
    except ValueError as error:
        parser.error(str(error))
    stale = earlier_runs_problem(args.out, "--out")
    if stale:
        parser.error(stale)
    if os.geteuid() != 0:
        print("bench_buffers: the emulated cluster needs root (ip netns, tc)", file=sys.stderr)
        return 1
    buffer_modes = ["none"] + [b.strip() for b in args.buffer_modes.split(",") if b.strip() and b.strip() != "none"]
    os.makedirs(args.out, exist_ok=True)
    skip = args.warmup_steps + 2
    shared = ["--model", "resnet20", "--dataset", "digits", "--batch-size", "32", "--steps", str(args.steps),
              "--eval-every", "0", "--threads", "1", "--warmup-steps", str(args.warmup_steps), "--timeout", "300",
              "--compression", args.compression] + (["--error-feedback"] if args.compression in ("q8", "q4", "sign") else [])
    rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        with Cluster.up(args.nodes, link, name="psgd-bufbench", force=True,
                        cores_per_node=args.cores_per_node) as cluster, \
                open(os.path.join(args.out, "train.log"), "w") as log:
            for round_ in range(args.repeats):
                for mode in modes:
                    for buffers in buffer_modes:
                        metrics = os.path.abspath(os.path.join(args.out, f"{mode}-{buffers}-{round_}.jsonl"))
                        argv = ["pipesgd-train", *MODE_FLAGS[mode], "--buffers", buffers, *shared,
                                "--metrics", metrics]
                        if args.trace:
                            argv += ["--trace", metrics.replace(".jsonl", ".trace.json"),
                                     "--trace-steps", f"{skip}:{args.steps}"]
                        print(f"round {round_ + 1}/{args.repeats}: {mode} --buffers {buffers} ...", file=sys.stderr,
                              flush=True)
                        if cluster.run(argv, timeout_s=args.timeout, out=log, err=log) != 0:
                            print(f"bench_buffers: {mode} --buffers {buffers} failed; see {log.name}",
                                  file=sys.stderr)
                            return 1
                        iteration = load_run(metrics).iteration_s(skip)
                        rows.setdefault((mode, buffers), []).append((iteration, buffer_sync_s(metrics, skip)))
    except ClusterError as error:
        print(f"bench_buffers: {error}", file=sys.stderr)
        return 1
    print(f"## Buffer sync, ResNet-20, {args.nodes} nodes at {args.bandwidth}"
          f"{f', {args.cores_per_node} core(s) per node' if args.cores_per_node else ''}, {args.compression}, "
          f"{args.steps} steps, {args.repeats} interleaved rounds (medians over rounds)\n")
    print("| mode | --buffers | ms / iteration | buffer sync ms per step (fastest rank) | iteration / --buffers none "
          "| sync / this (same buffers) |")
    print("|---|---|---|---|---|---|")
    for mode in modes:
        for buffers in buffer_modes:
            its = [i for i, _ in rows[(mode, buffers)]]
            ratios = [i / base for i, (base, _) in zip(its, rows[(mode, "none")])]
            sync = statistics.median(s for _, s in rows[(mode, buffers)])
            speedup = ""
            if ("sync", buffers) in rows:
                speedup = f"{statistics.median(s / i for (s, _), i in zip(rows[('sync', buffers)], its)):.2f}x"
            print(f"| {mode} | {buffers} | {1e3 * statistics.median(its):.1f} | {1e3 * sync:.1f} "
                  f"| {statistics.median(ratios):.3f} | {speedup} |")
    if args.trace:
        print(f"\n## Where the time went (ms per step, rank 0, medians over rounds; limit from the sync run with the "
              f"same buffers{', the exchange CPU on the training core' if args.cores_per_node == 1 else ''})\n")
        table, limits = [], {}
        for mode in modes:
            for buffers in buffer_modes:
                traces = [os.path.join(args.out, f"{mode}-{buffers}-{r}.trace.rank0.json") for r in range(args.repeats)]
                parts = median_breakdown(traces)
                table.append((f"{mode}, --buffers {buffers}", statistics.median(i for i, _ in rows[(mode, buffers)]),
                              parts))
                if mode == "sync":
                    limits[buffers] = parts.limit_s(shared_core=args.cores_per_node == 1)
        print(breakdown_table(table, {name: limits.get(name.split("--buffers ")[1]) for name, _, _ in table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
