"""Issue-4 comparison on the emulated cluster: Pipe-SGD against synchronous AllReduce and PyTorch DDP,
measured side by side in one run on N shaped nodes (root; `ip` and `tc`).

    python experiments/bench_cluster.py --nodes 4 --bandwidth 1gbit
    python experiments/bench_cluster.py --nodes 4 --bandwidth 1gbit --cores-per-node 4   # a 16-core machine

Part 1 (speed): a ~6 M-parameter MLP on synthetic data, batch 128 per worker, one thread per process;
every variant runs the same steps, and each step counts its slowest rank (median over steps after the
warm-up). "compute only" and "allreduce only" come from the synchronous run, where nothing overlaps:
its compute time and its exposed communication (t_iter - t_compute - t_update).
Part 2 (accuracy): the default digits job trained to completion in each variant; final test accuracy.
Metrics, the printed tables and a JSON summary are written under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from timing_model.atomic import write_text_atomic
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.one_line import OneLineParser  # noqa: E402
from experiments.harness.speed import run_variant, speed_table
from experiments.harness.variants import ACCURACY_VARIANTS, SPEED_VARIANTS
from pipesgd.cluster.cluster import Cluster
from pipesgd.cluster.netns import ClusterError
from timing_model.bandwidth import parse_bandwidth_bps
from experiments.harness.results import load_run

def main() -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--steps", type=int, default=40, help="speed runs: steps per variant")
    parser.add_argument("--warmup-steps", type=int, default=5, help="pipe warm-up, also skipped in the medians")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--skip-accuracy", action="store_true", help="only the speed table")
    parser.add_argument("--out", default="results/bench_cluster")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per variant")
    parser.add_argument("--cores-per-node", type=int, default=0,
                        help="pin each node to this many cores of its own (default 0: all nodes share all cores)")
    parser.add_argument("--report", metavar="SPEED_DIR", help="only print the speed table of earlier runs")
    args = parser.parse_args()
    if args.report:
        try:
            runs = {name: load_run(os.path.join(args.report, f"{name}.jsonl")) for name in SPEED_VARIANTS}
            print(speed_table(runs, args.warmup_steps + 2)[0])
        except (FileNotFoundError, ValueError) as error:
            print(f"bench_cluster: error: {error}", file=sys.stderr)
            return 1
        return 0
    try:
        bandwidth_bps = parse_bandwidth_bps(args.bandwidth)
    except ValueError as error:
        parser.error(str(error))
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, "train.log")
    speed_dir = tempfile.mkdtemp(prefix="speed-", dir=args.out)
    accuracy_dir = tempfile.mkdtemp(prefix="accuracy-", dir=args.out)
    common = ["--threads", "1", "--warmup-steps", str(args.warmup_steps), "--timeout", "120"]
    speed = ["--model", "mlp", "--hidden", str(args.hidden), "--dataset", "synthetic",
             "--synthetic-features", str(args.features), "--synthetic-samples", str(args.batch_size * args.nodes * 8),
             "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--lr", "0.01", *common]
    cores = args.nodes * args.cores_per_node or os.cpu_count() or 1  # what the ranks' processes may run on
    pinned = f", {args.cores_per_node} core(s) of its own each" if args.cores_per_node else f", sharing {cores} cores"
    report = [f"# Emulated cluster: {args.nodes} nodes, {args.bandwidth} per link (tc tbf), one process per node"
              f"{pinned}"]

    def publish(figures: dict) -> None:
        """Print and (atomically) write what is measured so far: a later failure loses nothing."""
        text = "\n".join(report)
        write_text_atomic(os.path.join(args.out, "report.md"), text + "\n")
        write_text_atomic(os.path.join(args.out, "figures.json"), json.dumps(figures, indent=2) + "\n")

    try:
        with Cluster.up(args.nodes, bandwidth_bps, name="psgd-bench", force=True,
                        cores_per_node=args.cores_per_node) as cluster, \
                open(log_path, "w") as log:
            throughput = cluster.measure()
            report.append(f"measured TCP throughput node0->node1: {throughput.summary()}")
            runs = {name: load_run(run_variant(cluster, name, speed, speed_dir, args.timeout, log))
                    for name in SPEED_VARIANTS}
            params = runs["pipe"].config.get("params")
            report += ["", f"## Speed: MLP {params:,} parameters, batch {args.batch_size}/worker, "
                       f"{args.steps} steps, median after step {args.warmup_steps + 2}"]
            table, figures = speed_table(runs, args.warmup_steps + 2, cores)
            report.append(table)
            figures["speed_dir"] = speed_dir
            publish(figures)
            print("\n".join(report), flush=True)
            if not args.skip_accuracy:
                report += ["", "## Accuracy: default digits job (MLP) trained to completion",
                           "| variant | test accuracy |", "|---|---|"]
                accuracies = {}
                for name in ACCURACY_VARIANTS:
                    try:
                        path = run_variant(cluster, name, common, accuracy_dir, args.timeout, log)
                        accuracies[name] = load_run(path).final_accuracy
                        report.append(f"| {name} | {100 * accuracies[name]:.1f} % |")
                    except RuntimeError as error:  # one failed run is reported, the others still count
                        report.append(f"| {name} | failed: {error} |")
                    print(report[-1], flush=True)
                figures["accuracy"] = accuracies
                publish(figures)
    except (ClusterError, RuntimeError, FileNotFoundError, ValueError) as error:
        print(f"bench_cluster: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
