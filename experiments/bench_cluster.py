"""Issue-4 comparison on the emulated cluster: Pipe-SGD against synchronous AllReduce and PyTorch DDP,
measured side by side in one run on N shaped nodes (root; `ip` and `tc`).

    python experiments/bench_cluster.py --nodes 4 --bandwidth 1gbit

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
import statistics
import sys
import tempfile

from pipesgd.atomic import write_text_atomic
from pipesgd.cluster.cluster import Cluster
from pipesgd.cluster.netns import ClusterError
from pipesgd.cluster.units import parse_bandwidth
from pipesgd.results import load_run

SPEED_VARIANTS = {  # name: trainer flags
    "sync": ["--mode", "sync"],
    "pipe": ["--mode", "pipe", "--width", "2"],
    "pipe+bf16": ["--mode", "pipe", "--width", "2", "--compression", "bf16"],
    "pipe+q8": ["--mode", "pipe", "--width", "2", "--compression", "q8", "--error-feedback"],
    "ddp": ["--mode", "ddp"],
    "ddp+fp16": ["--mode", "ddp", "--ddp-hook", "fp16"],
}
ACCURACY_VARIANTS = ("sync", "pipe", "pipe+bf16", "pipe+q8", "ddp", "ddp+fp16")


def run_variant(cluster: Cluster, name: str, flags: list[str], extra: list[str], out_dir: str,
                timeout_s: float, log) -> str:
    metrics = os.path.join(out_dir, f"{name}.jsonl")
    argv = ["pipesgd-train", *flags, *extra, "--metrics", metrics]
    print(f"[bench] {name}: {' '.join(argv)}", file=sys.stderr, flush=True)
    rc = cluster.run(argv, timeout_s=timeout_s, out=log, err=log)
    if rc != 0:
        raise RuntimeError(f"variant {name} failed with exit code {rc}; see {log.name}")
    return metrics


def speed_table(runs: dict, skip: int) -> tuple[str, dict]:
    sync = runs["sync"]
    compute_only = sync.median("t_compute", skip)
    exposed = [i - c - u for i, c, u in zip(sync.per_step("t_iter", skip), sync.per_step("t_compute", skip),
                                            sync.per_step("t_update", skip))]
    allreduce_only = sorted(exposed)[len(exposed) // 2]
    t_iter = {name: run.median("t_iter", skip) for name, run in runs.items()}
    cores = os.cpu_count() or 1
    lines = ["| variant | ms / iteration | compute ms | blocked on comm ms | MB sent / rank / iter | CPU busy "
             "| vs ddp | vs ddp+fp16 |", "|---|---|---|---|---|---|---|---|"]
    cpu_busy = {}
    for name, seconds in t_iter.items():
        run = runs[name]
        sent = run.median("bytes_sent", skip) / 1e6
        cpu = run.per_step("t_cpu", skip, over_ranks=sum)
        if cpu:  # all ranks' CPU seconds per step over what the machine's cores offer in that step
            cpu_busy[name] = statistics.median(c / (cores * t) for c, t in zip(cpu, run.per_step("t_iter", skip)))
        busy = f"{100 * cpu_busy[name]:.0f} %" if name in cpu_busy else "-"
        lines.append(f"| {name} | {seconds * 1e3:.1f} | {run.median('t_compute', skip) * 1e3:.1f} "
                     f"| {run.median('t_wait', skip) * 1e3:.1f} | {sent:.2f} | {busy} | {t_iter['ddp'] / seconds:.2f}x "
                     f"| {t_iter['ddp+fp16'] / seconds:.2f}x |")
    lines += ["", "compute ms is forward + backward measured inside each run (for ddp it includes DDP's "
              "allreduce, which runs inside backward); it grows when communication shares the cores. CPU busy is "
              f"the CPU time all ranks' processes used per step over what the {cores} cores offer in that time "
              "(kernel network work done outside those processes is not in it)."]
    bound = max(compute_only, allreduce_only)
    lines += ["", f"compute only {compute_only * 1e3:.1f} ms, allreduce only {allreduce_only * 1e3:.1f} ms "
              f"(from the sync run); pipe / max(compute, allreduce) = {t_iter['pipe'] / bound:.3f}",
              f"pipe+bf16 is {t_iter['ddp'] / t_iter['pipe+bf16']:.2f}x faster than ddp; "
              f"pipe+q8 is {t_iter['ddp+fp16'] / t_iter['pipe+q8']:.2f}x faster than ddp+fp16"]
    # No variant computes faster than the sync run's compute phase (all nodes computing at once, nothing else
    # running), so ddp / compute-only caps any speed-up over ddp that overlap or compression can give here.
    ceiling = {"vs_ddp": t_iter["ddp"] / compute_only, "vs_ddp_fp16": t_iter["ddp+fp16"] / compute_only}
    nodes = runs["sync"].config.get("world_size", "?")
    lines += [f"ceiling on this machine ({nodes} nodes on {cores} cores): no variant beats compute only, "
              f"so at best {ceiling['vs_ddp']:.2f}x faster than ddp and {ceiling['vs_ddp_fp16']:.2f}x faster than "
              f"ddp+fp16"]
    figures = {"t_iter_s": t_iter, "compute_only_s": compute_only, "allreduce_only_s": allreduce_only,
               "pipe_over_bound": t_iter["pipe"] / bound, "ceiling": ceiling, "cpu_count": cores,
               "cpu_busy": cpu_busy}
    return "\n".join(lines), figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
        bandwidth_bps = parse_bandwidth(args.bandwidth)
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
    report = [f"# Emulated cluster: {args.nodes} nodes, {args.bandwidth} per link (tc tbf), one process per node"]

    def publish(figures: dict) -> None:
        """Print and (atomically) write what is measured so far: a later failure loses nothing."""
        text = "\n".join(report)
        write_text_atomic(os.path.join(args.out, "report.md"), text + "\n")
        write_text_atomic(os.path.join(args.out, "figures.json"), json.dumps(figures, indent=2) + "\n")

    try:
        with Cluster.up(args.nodes, bandwidth_bps, name="psgd-bench", force=True) as cluster, \
                open(log_path, "w") as log:
            throughput = cluster.measure()
            report.append(f"measured TCP throughput node0->node1: {throughput.summary()}")
            runs = {name: load_run(run_variant(cluster, name, flags, speed, speed_dir, args.timeout, log))
                    for name, flags in SPEED_VARIANTS.items()}
            params = runs["pipe"].config.get("params")
            report += ["", f"## Speed: MLP {params:,} parameters, batch {args.batch_size}/worker, "
                       f"{args.steps} steps, median after step {args.warmup_steps + 2}"]
            table, figures = speed_table(runs, args.warmup_steps + 2)
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
                        path = run_variant(cluster, name, SPEED_VARIANTS[name], common, accuracy_dir,
                                           args.timeout, log)
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
