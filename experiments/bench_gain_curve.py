"""Pipe-SGD's gain over synchronous training at the same codec against comm / compute, measured on emulated nodes
that each have cores of their own (root: network namespaces and tc), with the timing model's curve drawn over it.

    python experiments/bench_gain_curve.py                          # 2 nodes, one core each (a 2-core host)
    python experiments/bench_gain_curve.py --nodes 4                # a 4-core or larger host
    python experiments/bench_gain_curve.py --bandwidths 40mbit,unshaped --compression q8 --steps 12 \\
        --warmup-steps 2 --repeats 1 --out /tmp/gain                # a smoke test

For each link rate and codec, ResNet-20 (BatchNorm, digits, batch 32 per worker, ``--threads 1``) trains under sync
and under pipe at width 2, the defaults otherwise, traced after the warm-up; every rate, codec and mode runs once per
round, rounds interleaved (--repeats), so the machine's drift hits every point alike. Each point sits at the sync
run's exchange over its compute + update (its trace's breakdown, ``experiments.harness.breakdown``) and is as high as
sync ms per iteration over pipe ms per iteration; the model predicts each pipe run from its sync run alone, and its
curve holds a codec's inputs and moves the exchange (``experiments.harness.gain_curve`` says how).

Writes ``gain_curve.json`` (every run's iteration and breakdown, the points, the curves, with provenance),
``report.md`` and ``gain_curve.png`` under --out; raw metrics, traces and the training log under --raw.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.breakdown import Breakdown, read_breakdown, trace_file  # noqa: E402
from experiments.harness.gain_curve import build  # noqa: E402
from experiments.harness.gain_curve_report import render  # noqa: E402
from experiments.harness.one_line import OneLineParser, known_names  # noqa: E402
from experiments.harness.scratch import earlier_runs_problem  # noqa: E402
from experiments.harness.provenance import provenance, write_result  # noqa: E402
from pipesgd.cluster.cluster import Cluster  # noqa: E402
from pipesgd.cluster.cores import available_cores  # noqa: E402
from pipesgd.cluster.netns import ClusterError  # noqa: E402
from pipesgd.cluster.units import parse_link  # noqa: E402
from experiments.harness.results import load_run  # noqa: E402
from pipesgd.runlog.trace import trace_path  # noqa: E402
from timing_model.atomic import write_text_atomic  # noqa: E402
from timing_model.codec_sizes import CODECS  # noqa: E402

MODE_FLAGS = {"sync": ["--mode", "sync"], "pipe": ["--mode", "pipe", "--width", "2"]}
# The quantizers run with error feedback, as bench_buffers.py runs them (what the comparison's q8 variants do)
FEEDBACK_CODECS = ("q8", "q4", "sign")
# From slow enough for q8 to be communication-bound to fast enough for the uncompressed gradient to be
# compute-bound, on the development host and on faster ones (the report's table says where each rate landed)
DEFAULT_BANDWIDTHS = "20mbit,40mbit,100mbit,200mbit,500mbit,1gbit,unshaped"
WORKLOAD = {"model": "resnet20", "dataset": "digits", "batch_size": 32}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cores-per-node", type=int, default=1, help="cores of its own per node (>= 1)")
    parser.add_argument("--bandwidths", default=DEFAULT_BANDWIDTHS, help="comma list of link rates or unshaped")
    parser.add_argument("--compression", default="q8,none", help=f"comma list of codecs, of {', '.join(CODECS)}")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds of every rate, codec and mode")
    parser.add_argument("--out", default=os.path.join("experiments", "results", "bench_gain_curve"))
    parser.add_argument("--raw", default=os.path.join("results", "bench_gain_curve"),
                        help="metrics, traces and the training log")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = parser.parse_args(argv)
    args.codecs = known_names(parser, args.compression, CODECS, "codec")
    args.links = []
    for text in args.bandwidths.split(","):
        try:
            args.links.append((text, parse_link(text)))
        except ValueError as error:
            parser.error(f"--bandwidths: {error}")
    if len(set(args.codecs)) != len(args.codecs) or len({t for t, _ in args.links}) != len(args.links):
        parser.error("--compression and --bandwidths must not repeat a name")
    if args.nodes < 2 or args.cores_per_node < 1:
        parser.error("need --nodes >= 2 and --cores-per-node >= 1 (the gain is measured on nodes with cores "
                     "of their own)")
    if args.nodes * args.cores_per_node > len(available_cores()):
        parser.error(f"--nodes {args.nodes} x --cores-per-node {args.cores_per_node} needs "
                     f"{args.nodes * args.cores_per_node} cores, this machine allows {len(available_cores())}")
    if args.steps <= args.warmup_steps + 3 or args.warmup_steps < 0 or args.repeats < 1 or args.timeout <= 0:
        parser.error("need --steps > --warmup-steps + 3, --warmup-steps >= 0, --repeats >= 1 and --timeout > 0")
    stale = earlier_runs_problem(args.raw, "--raw")
    if stale:
        parser.error(stale)
    return args


def trainer_argv(args: argparse.Namespace, mode: str, codec: str, metrics: str, skip: int) -> list[str]:
    """One run's ``pipesgd-train`` command: the workload, the mode and codec, traced from step ``skip`` on."""
    return ["pipesgd-train", *MODE_FLAGS[mode], "--model", WORKLOAD["model"], "--dataset", WORKLOAD["dataset"],
            "--batch-size", str(WORKLOAD["batch_size"]), "--steps", str(args.steps), "--eval-every", "0",
            "--threads", "1", "--warmup-steps", str(args.warmup_steps), "--timeout", "300", "--compression", codec,
            *(["--error-feedback"] if codec in FEEDBACK_CODECS else []), "--metrics", metrics,
            "--trace", trace_file(metrics), "--trace-steps", f"{skip}:{args.steps}"]


def run_record(metrics: str, skip: int, nodes: int, **where) -> dict:
    """A finished run as the result keeps it: ``where`` (codec, link, round, mode), its iteration, gradient bytes
    and rank 0's breakdown."""
    run = load_run(metrics)
    parts = read_breakdown(trace_path(trace_file(metrics), 0, nodes))
    return {**where, "iteration_s": run.iteration_s(skip), "grad_bytes": run.config["grad_bytes"],
            "parts": {name: getattr(parts, name) for name in Breakdown.__slots__}}


def measure(args: argparse.Namespace) -> list[dict] | str:
    """Every round, rate, codec and mode in turn on a fresh cluster per rate; the run records, or why not."""
    os.makedirs(args.raw, exist_ok=True)
    skip = args.warmup_steps + 2  # the first steps after the warm-up still settle
    runs = []
    with open(os.path.join(args.raw, "train.log"), "w") as log:
        for round_ in range(args.repeats):
            for text, bps in args.links:
                with Cluster.up(args.nodes, bps, name="psgd-gaincurve", force=True,
                                cores_per_node=args.cores_per_node) as cluster:
                    for codec in args.codecs:
                        for mode in MODE_FLAGS:
                            metrics = os.path.abspath(os.path.join(args.raw, f"{text}-{codec}-{mode}-{round_}.jsonl"))
                            print(f"round {round_ + 1}/{args.repeats}: {text} {codec} {mode} ...", file=sys.stderr,
                                  flush=True)
                            argv = trainer_argv(args, mode, codec, metrics, skip)
                            if cluster.run(argv, timeout_s=args.timeout, out=log, err=log) != 0:
                                return f"{text} {codec} {mode} failed; see {log.name}"
                            runs.append(run_record(metrics, skip, args.nodes, codec=codec, bandwidth=text,
                                                   bandwidth_bps=bps, round=round_, mode=mode))
                            if runs[-1]["parts"]["compute_s"] == 0.0:
                                return f"{text} {codec} {mode}: its trace has no traced step ({trace_file(metrics)})"
    return runs


def write_outputs(args: argparse.Namespace, runs: list[dict]) -> dict:
    """The JSON result, its report and its figure under --out (each replaced whole); the result dict."""
    os.makedirs(args.out, exist_ok=True)
    setup = {**WORKLOAD, "nodes": args.nodes, "cores_per_node": args.cores_per_node,
             "shared_core": args.cores_per_node == 1, "bandwidths": [t for t, _ in args.links], "codecs": args.codecs,
             "steps": args.steps, "warmup_steps": args.warmup_steps, "repeats": args.repeats}
    data = {"setup": setup, "figure": "gain_curve.png", "runs": runs,
            **build(runs, nodes=args.nodes, shared_core=setup["shared_core"])}
    origin = provenance()
    write_result(os.path.join(args.out, "gain_curve.json"), data, origin)
    data = {"provenance": origin, **data}
    write_text_atomic(os.path.join(args.out, "report.md"), render(data))
    try:
        import matplotlib

        matplotlib.use("Agg")
        from experiments.harness.gain_curve_plot import figure
    except ImportError:
        print("bench_gain_curve: matplotlib is missing, no figure (pip install -e '.[notebooks]')", file=sys.stderr)
        return data
    png = os.path.join(args.out, "gain_curve.png")
    figure(data).savefig(png + ".tmp.png", dpi=90)
    os.replace(png + ".tmp.png", png)  # atomically: a reader sees the old figure or the new one
    return data


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench_gain_curve: the emulated cluster needs root (ip netns, tc)", file=sys.stderr)
        return 1
    try:
        runs = measure(args)
    except ClusterError as error:
        runs = str(error)
    if isinstance(runs, str):
        print(f"bench_gain_curve: {runs}", file=sys.stderr)
        return 1
    data = write_outputs(args, runs)
    for p in data["points"]:
        print(f"{p['codec']:5s} {p['bandwidth']:9s} comm/compute {p['comm_over_compute']:5.2f}  gain "
              f"{p['gain']:.2f}x  model {p['model']['gain']:.2f}x")
    print(f"bench_gain_curve: wrote {os.path.join(args.out, 'report.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
