"""Issue-11 pipeline benchmark: for each codec with and without error feedback, compute alone, ring alone and a
Pipe-SGD width-2 iteration, efficiency = max(compute, ring) / iteration, and where the iteration's time and CPU go;
then DDP and DDP with its fp16 hook on the same job: each variant's speed-up over them and its comm-path CPU.

    python experiments/bench_pipeline.py --bandwidth 200mbit          # 4 emulated nodes (root; ip, tc)
    python experiments/bench_pipeline.py --loopback --quick           # 4 local ranks, no root, a minute or two
    python experiments/bench_pipeline.py --bandwidth 200mbit --cores-per-node 4   # each node on 4 cores of its own

One process per node (one thread each). The logic is in ``experiments/harness/pipeline.py`` (per rank) and
``pipeline_report.py`` (tables). Writes ``<label>.jsonl`` (one record per workload and variant), ``<label>.md``
and ``<label>.json`` under --out, and prints the tables.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from timing_model.atomic import write_text_atomic
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.pipeline import BASELINES, VARIANTS, WORKLOADS, PipelineSettings, run, settings_json
from experiments.harness.one_line import OneLineParser, known_names
from experiments.harness.pipeline_report import markdown, read_records
from experiments.harness.provenance import markdown_header, provenance
from experiments.harness.rank_launch import LaunchError, launch_ranks
from timing_model.bandwidth import parse_bandwidth_bps

QUICK = {"workloads": ("mlp1.9m",), "steps": 4, "warmup": 2, "ring_repeats": 2}


def main() -> int:
    parser = OneLineParser(prog="bench_pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--bandwidth", help="per-link rate of the emulated cluster, e.g. 200mbit (root)")
    where.add_argument("--loopback", action="store_true", help="local ranks over loopback (no root)")
    parser.add_argument("--nodes", type=int, default=4, help="nodes (or loopback ranks)")
    parser.add_argument("--quick", action="store_true", help="the 1.9 M MLP only, 4 timed iterations")
    parser.add_argument("--workloads", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--variants", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--baselines", help=f"comma-separated, of {', '.join(BASELINES)} (default: both; "
                        "'-' for none)")
    parser.add_argument("--steps", type=int, help="timed iterations per variant (default 8; --quick 4)")
    parser.add_argument("--allreduce", default="auto", choices=("auto", "ring", "alltoall"),
                        help="PipeSGD's allreduce for every variant: auto (default), ring or alltoall (a lossless "
                        "variant runs the backend's under auto)")
    parser.add_argument("--label", help="result file names (default: loopback or the bandwidth)")
    parser.add_argument("--out", default="results/bench_pipeline")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole cluster run")
    parser.add_argument("--cores-per-node", type=int, default=0,
                        help="emulated cluster: pin each node to this many cores of its own (default 0: shared)")
    args = parser.parse_args()
    if args.nodes < 2:
        parser.error(f"--nodes must be >= 2, got {args.nodes}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if args.cores_per_node < 0:
        parser.error(f"--cores-per-node must be >= 0, got {args.cores_per_node}")
    if args.cores_per_node and args.loopback:
        parser.error("--cores-per-node pins emulated nodes; it does not apply to --loopback")
    chosen = dict(QUICK) if args.quick else {}
    if args.workloads:
        chosen["workloads"] = tuple(known_names(parser, args.workloads, WORKLOADS, "workload"))
    if args.variants:
        chosen["variants"] = tuple(known_names(parser, args.variants, VARIANTS, "variant"))
    if args.baselines == "-":
        chosen["baselines"] = ()
    elif args.baselines:
        chosen["baselines"] = tuple(known_names(parser, args.baselines, BASELINES, "baseline"))
    if args.steps is not None:
        chosen["steps"] = args.steps
    chosen["allreduce"] = args.allreduce
    label = args.label or ("loopback" if args.loopback else args.bandwidth)
    if os.sep in label or label in ("", ".", ".."):
        parser.error(f"--label names the result files; it cannot be {label!r}")
    records_path = os.path.join(args.out, f"{label}.jsonl")
    try:
        settings = PipelineSettings(out_json=os.path.abspath(records_path), **chosen)
        bandwidth_bps = None if args.loopback else parse_bandwidth_bps(args.bandwidth)
    except ValueError as error:
        parser.error(str(error))
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as error:
        parser.error(f"--out {args.out}: {error.strerror}")
    write_text_atomic(records_path, "")
    origin = provenance()  # before the run: the code it runs, not what the tree holds when it ends
    start = time.perf_counter()
    try:
        where_text = launch_ranks("experiments.harness.pipeline", settings_json(settings),
                                  lambda: run(settings, args.nodes),
                                  nodes=args.nodes, bandwidth=None if args.loopback else args.bandwidth,
                                  bandwidth_bps=bandwidth_bps, cluster_name="psgd-pipe", timeout_s=args.timeout,
                                  cores_per_node=args.cores_per_node)
    except LaunchError as error:
        print(f"bench_pipeline: error: {error}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start
    try:
        records = read_records(records_path)
    except ValueError as error:
        print(f"bench_pipeline: error: {error}", file=sys.stderr)
        return 1
    cores = args.nodes * args.cores_per_node or os.cpu_count()  # what the ranks' processes may run on
    title = (f"Pipe-SGD at its limit: {where_text}, one thread per process, allreduce {args.allreduce} ({cores} "
             f"cores; {elapsed:.0f} s)")
    table = markdown(records, title, cores=cores)
    print(table)
    header = markdown_header(title, origin)
    write_text_atomic(os.path.join(args.out, f"{label}.md"), header + table.split("\n", 1)[1] + "\n")
    summary = {"where": where_text, "allreduce": args.allreduce, "elapsed_s": elapsed, "cpu_count": os.cpu_count(),
               "cores_used": cores, "provenance": origin, "records": records}
    write_text_atomic(os.path.join(args.out, f"{label}.json"), json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
