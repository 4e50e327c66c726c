"""What the per-step agreement on who still trains costs a Pipe-SGD iteration: ``PipeSGD(check_uneven=True)`` (the
default) against ``check_uneven=False`` on the same job, interleaved over rounds in one run, per codec variant.

    python experiments/bench_agreement.py --bandwidth 200mbit                 # 4 emulated nodes (root; ip, tc)
    python experiments/bench_agreement.py --loopback --rounds 2 --steps 5     # 4 local ranks, no root

One process per node (one thread each), the 1.9 M-parameter MLP of ``bench_pipeline.py`` by default. The logic is
in ``experiments/harness/agreement.py``. Writes ``<label>.jsonl`` (one record per variant) and ``<label>.md`` under
--out,
and prints the table.
"""
from __future__ import annotations

import json
import os
import sys
import time

from timing_model.atomic import write_text_atomic
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.agreement import AgreementSettings, markdown, run, settings_json
from experiments.harness.one_line import OneLineParser, known_names
from experiments.harness.pipeline import VARIANTS, WORKLOADS
from experiments.harness.rank_launch import LaunchError, launch_ranks
from timing_model.bandwidth import parse_bandwidth_bps


def main() -> int:
    parser = OneLineParser(prog="bench_agreement", description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--bandwidth", help="per-link rate of the emulated cluster, e.g. 200mbit (root)")
    where.add_argument("--loopback", action="store_true", help="local ranks over loopback (no root)")
    parser.add_argument("--nodes", type=int, default=4, help="nodes (or loopback ranks)")
    parser.add_argument("--workload", default="mlp1.9m", help=f"one of {', '.join(WORKLOADS)}")
    parser.add_argument("--variants", default="none,q8,q4+ef", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of on and off, alternating their order")
    parser.add_argument("--steps", type=int, default=10, help="timed iterations per side and round")
    parser.add_argument("--label", help="result file names (default: loopback or the bandwidth)")
    parser.add_argument("--out", default="results/bench_agreement")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole cluster run")
    args = parser.parse_args()
    if args.nodes < 2:
        parser.error(f"--nodes must be >= 2, got {args.nodes}")
    label = args.label or ("loopback" if args.loopback else args.bandwidth)
    records_path = os.path.abspath(os.path.join(args.out, f"{label}.jsonl"))
    try:
        settings = AgreementSettings(out_json=records_path, workload=args.workload, rounds=args.rounds,
                                     steps=args.steps,
                                     variants=tuple(known_names(parser, args.variants, VARIANTS, "variant")))
        bandwidth_bps = None if args.loopback else parse_bandwidth_bps(args.bandwidth)
    except ValueError as error:
        parser.error(str(error))
    os.makedirs(args.out, exist_ok=True)
    write_text_atomic(records_path, "")
    start = time.perf_counter()
    try:
        where_text = launch_ranks("experiments.harness.agreement", settings_json(settings),
                                  lambda: run(settings, args.nodes),
                                  nodes=args.nodes, bandwidth=None if args.loopback else args.bandwidth,
                                  bandwidth_bps=bandwidth_bps, cluster_name="psgd-agree", timeout_s=args.timeout)
    except LaunchError as error:
        parser.exit(1, f"bench_agreement: error: {error}\n")
    with open(records_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    table = markdown(records, f"The agreement on who still trains, on and off: {where_text}, one thread per process, "
                              f"{os.cpu_count()} cores ({time.perf_counter() - start:.0f} s)")
    print(table)
    write_text_atomic(os.path.join(args.out, f"{label}.md"), table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
