"""Timeline (issue 12, experiment 5): the paper's Figure 1 from measured events. Runs ps-async, sync, ddp and
pipe (width 2) on 4 emulated nodes with ``pipesgd-train --trace`` and writes the trimmed spans of a few
iterations after the warm-up (all ranks, all threads) to ``experiments/results/timeline/timeline.json``.

    python experiments/timeline.py                    # root: 4 nodes at 100 Mbit/s (about 5 minutes)
    python experiments/timeline.py --loopback         # quick profile: 4 local ranks, no root, no shaping

Workload: ResNet-20 on digits, batch 32 per worker, one thread per process, at 100 Mbit/s, chosen by measuring
on the 2-core machine (sync, rank 0's medians): about 130 ms of forward + backward against about 100 ms blocked
on the allreduce of its 1.1 MB gradient per iteration, so overlap (or its absence) is visible. AlexNet on digits
at 1 Gbit/s was comparable too (760 ms compute, 470 ms waiting) but its pipe run's comm threads fought the
compute for the two cores (pipe 1.47 s per iteration against sync 1.34 s). ResNet-20's BatchNorm buffers are
broadcast on the training thread every step in pipe and sync (the figure marks that wait).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.one_line import OneLineParser  # noqa: E402
from experiments.harness.provenance import write_result
from experiments.harness.timeline import SCHEMES, build_result, loopback_runner, run_scheme

RESULT = os.path.join("experiments", "results", "timeline", "timeline.json")


def main() -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--bandwidth", default="100mbit")
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup-steps", type=int, default=4, help="pipe warm-up; tracing starts 2 steps later")
    parser.add_argument("--traced", type=int, default=4, help="iterations traced")
    parser.add_argument("--loopback", action="store_true", help="local ranks, no root (quick profile)")
    parser.add_argument("--out", default="results/timeline", help="raw traces and metrics (git-ignored)")
    parser.add_argument("--result", default=RESULT, help="the committed result file")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per scheme")
    args = parser.parse_args()
    if args.nodes < 2 or args.traced < 1 or args.warmup_steps < 0:
        parser.error("--nodes must be at least 2, --traced at least 1, --warmup-steps not negative")
    first_step = args.warmup_steps + 2
    total_steps = first_step + 3 * args.traced  # room for ranks that drift apart (ps-async)
    workload = ["--model", args.model, "--dataset", args.dataset, "--batch-size", str(args.batch_size),
                "--threads", "1", "--warmup-steps", str(args.warmup_steps), "--timeout", "120"]
    os.makedirs(args.out, exist_ok=True)
    out_dir = tempfile.mkdtemp(prefix="run-", dir=args.out)
    setup = {"model": args.model, "dataset": args.dataset, "batch_size": args.batch_size,
             "warmup_steps": args.warmup_steps, "bandwidth": None if args.loopback else args.bandwidth,
             "network": "loopback (unshaped)" if args.loopback else f"{args.nodes} emulated nodes, tc tbf"}
    try:
        if args.loopback:
            traces = {s: run_scheme(loopback_runner(args.nodes, args.timeout), s, workload, total_steps, out_dir)
                      for s in SCHEMES}
        else:
            from pipesgd.cluster.cluster import Cluster
            from timing_model.bandwidth import parse_bandwidth_bps

            with Cluster.up(args.nodes, parse_bandwidth_bps(args.bandwidth), name="psgd-trace", force=True) as cluster:
                def runner(argv: list[str], log_path: str) -> int:
                    with open(log_path, "a") as log:
                        return cluster.run(argv, timeout_s=args.timeout, out=log, err=log)

                traces = {s: run_scheme(runner, s, workload, total_steps, out_dir) for s in SCHEMES}
        result = build_result(traces, args.nodes, first_step, args.traced, setup)
    except (RuntimeError, ValueError, OSError) as error:
        print(f"timeline: error: {error}", file=sys.stderr)
        return 1
    write_result(args.result, result)
    for scheme, data in result["schemes"].items():
        print(f"{scheme:9s} median ms per iteration {data['median_ms']}  ({len(data['spans'])} spans)")
    print(f"wrote {args.result}; raw traces in {out_dir} "
          f"(merge for Perfetto: python -m pipesgd.runlog.trace merge OUT.json {out_dir}/pipe.rank*.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
