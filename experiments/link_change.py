"""A link that slows down under a running job: ``compression="auto"`` with and without its re-check, beside the
fixed codecs (issue 39 item 2).

    python experiments/link_change.py                  # root: 4 emulated nodes, ResNet-20; about 9 min
    python experiments/link_change.py --report         # the committed result's table

What: 4 nodes on --before links (1 Gbit/s), ResNet-20 on digits, Pipe-SGD width 2 with look-ahead, 3 synchronous
warm-up steps, --steps steps. When rank 0's step records reach step --at, every link is changed to --after
(100 Mbit/s; ``Cluster.reshape``: ``tc qdisc change`` on a live cluster) while the job runs. Variants: none and
q4 + error feedback fixed, ``--compression auto`` (chosen once, at the warm-up's end), and the same with
``--auto-recheck-every N``. Per run: the iteration before the change (median over the steps from the warm-up + 5 to
--at) and after it (from --at + 2N, when a re-check window lies wholly after the change, to the end), its wall
time, and the choices it logged. --repeats rounds of every variant, interleaved so the host's drift hits each alike.
Printed: the medians and ranges over the rounds, and auto with re-check against each other variant after the change.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.one_line import OneLineParser  # noqa: E402
from experiments.harness.provenance import provenance, read_result, write_result
from pipesgd.cluster.cluster import Cluster
from pipesgd.cluster.netns import ClusterError, preflight
from pipesgd.cluster.units import parse_link
from experiments.harness.results import load_run
from timing_model.run_metrics import metrics_files

RESULT = "experiments/results/auto_choice/link_change.json"
WARMUP = 3
VARIANTS = {  # name: pipesgd-train flags beside the shared ones
    "pipe": [],
    "pipe+q4": ["--compression", "q4", "--error-feedback"],
    "pipe+auto": ["--compression", "auto"],
    "pipe+auto+recheck": ["--compression", "auto", "--auto-recheck-every", "RECHECK"],
}


class Rank0Steps:
    """The last step rank 0 has recorded (-1: none yet), read from where the previous call stopped."""

    def __init__(self, metrics: str) -> None:
        self._path, self._offset, self.last = metrics.replace(".jsonl", ".rank0.jsonl"), 0, -1

    def __call__(self) -> int:
        if os.path.exists(self._path):
            with open(self._path) as f:
                f.seek(self._offset)
                for line in f:
                    if not line.endswith("\n"):  # a record still being written: read it whole next time
                        break
                    self._offset += len(line.encode())
                    record = json.loads(line)
                    if record.get("type") == "step":
                        self.last = int(record["step"])
        return self.last


def run_one(name: str, args: argparse.Namespace) -> dict:
    """One variant on a fresh cluster; its links change at step --at."""
    metrics = os.path.abspath(os.path.join(args.out, f"{name}.jsonl"))
    flags = [args.recheck if f == "RECHECK" else f for f in VARIANTS[name]]
    argv = ["pipesgd-train", "--mode", "pipe", "--width", "2", *flags, "--model", "resnet20", "--dataset", "digits",
            "--batch-size", "32", "--steps", str(args.steps), "--eval-every", "0", "--lr", "0.02", "--threads", "1",
            "--warmup-steps", str(WARMUP), "--seed", "0", "--timeout", "300", "--metrics", metrics]
    for stale in metrics_files(metrics):  # an earlier sitting's: this run writes its own
        os.unlink(stale)
    outcome: dict = {}
    with Cluster.up(args.nodes, parse_link(args.before), name="psgd-link", force=True) as cluster, \
            open(metrics.replace(".jsonl", ".log"), "w") as log:
        runner = threading.Thread(target=lambda: outcome.update(rc=cluster.run(argv, timeout_s=args.timeout,
                                                                               out=log, err=log)))
        runner.start()
        rank0_step = Rank0Steps(metrics)
        while runner.is_alive() and rank0_step() < args.at:
            time.sleep(0.02)
        changed_at = rank0_step()
        if runner.is_alive():
            cluster.reshape(parse_link(args.after))
        runner.join()
    if outcome.get("rc") != 0:
        raise RuntimeError(f"{name}: exit code {outcome.get('rc')}; see {metrics.replace('.jsonl', '.log')}")
    run = load_run(metrics)
    by_step: dict[int, list[float]] = {}
    for record in run.steps:
        by_step.setdefault(record["step"], []).append(float(record["t_iter"]))
    iters = {step: statistics.fmean(values) for step, values in by_step.items()}  # the mean over ranks
    after_from = args.at + 2 * int(args.recheck)
    rank0 = [r for r in run.steps if r.get("rank") == 0]
    return {"variant": name, "flags": argv[1:-2], "changed_at_step": changed_at,
            "before_ms": 1e3 * statistics.median(v for s, v in iters.items() if WARMUP + 5 <= s < args.at),
            "after_ms": 1e3 * statistics.median(v for s, v in iters.items() if s >= after_from),
            "after_from_step": after_from, "wall_s": run.summary.get("wall"),
            "final_accuracy": run.final_accuracy,
            "choices": [[r["step"], r["auto_choice"]] for r in rank0 if r.get("auto_choice")]}


def _spread(values: list[float]) -> str:
    """"62.1" for one value, "62.1 (60.3-64.0)" for several: the median and the range."""
    middle = f"{statistics.median(values):.1f}"
    return middle if len(values) == 1 else f"{middle} ({min(values):.1f}-{max(values):.1f})"


def report(data: dict) -> str:
    cfg = data["config"]
    by_variant: dict[str, list[dict]] = {}
    for r in data["runs"]:
        by_variant.setdefault(r["variant"], []).append(r)
    rounds = max(len(runs) for runs in by_variant.values())
    lines = [f"{cfg['nodes']} nodes, links {cfg['before']} until step {cfg['at']}, then {cfg['after']}; "
             f"{cfg['steps']} steps, re-check every {cfg['recheck']}; {rounds} round(s): medians (range)", "",
             "| variant | ms/iter before | ms/iter after | wall s | choices (step: choice), per round | "
             "auto+recheck after / this |", "|---|---|---|---|---|---|"]
    base = by_variant.get("pipe+auto+recheck")
    for name, runs in by_variant.items():
        after = [r["after_ms"] for r in runs]
        ratio = f"{statistics.median(r['after_ms'] for r in base) / statistics.median(after):.2f}" if base else "-"
        choices = " / ".join("; ".join(f"{s}: {c}" for s, c in r["choices"]) or "-" for r in runs)
        walls = [r["wall_s"] for r in runs if r["wall_s"] is not None]
        lines.append(f"| {name} | {_spread([r['before_ms'] for r in runs])} | {_spread(after)} | "
                     f"{_spread(walls) if walls else '-'} | {choices} | {ratio} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--before", default="1gbit", help="link rate at the start (default 1gbit)")
    parser.add_argument("--after", default="100mbit", help="link rate from step --at on (default 100mbit)")
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--at", type=int, default=50, help="rank 0's step at which the links change (default 50)")
    parser.add_argument("--recheck", default="20", help="--auto-recheck-every of the re-checking run (default 20)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma list (default: all)")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds of every variant (default 2)")
    parser.add_argument("--out", default="results/link_change", help="run logs and metrics (not committed)")
    parser.add_argument("--result", default=RESULT)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--report", action="store_true", help="print the table of --result and stop")
    args = parser.parse_args()
    prog = "link_change.py"
    if args.report:
        try:
            print(report(read_result(args.result)), end="")
        except (OSError, ValueError, KeyError) as error:
            print(f"{prog}: error: cannot read {args.result}: {error}", file=sys.stderr)
            return 2
        return 0
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    try:
        unknown = [v for v in names if v not in VARIANTS]
        if unknown or not names:
            raise ValueError(f"unknown variant(s) {unknown}; valid: {', '.join(VARIANTS)}")
        if not (args.recheck.isdigit() and int(args.recheck) > 0):
            raise ValueError(f"--recheck must be a positive integer, got {args.recheck!r}")
        if not WARMUP + 6 <= args.at < args.at + 2 * int(args.recheck) < args.steps:
            raise ValueError(f"need {WARMUP + 6} <= --at and --at + 2 x --recheck < --steps")
        if args.repeats < 1:
            raise ValueError("--repeats must be >= 1")
        if args.nodes < 2:
            raise ValueError("--nodes must be >= 2")
        for rate in (args.before, args.after):
            if parse_link(rate) is None:
                raise ValueError(f"{rate!r}: a link that changes must be shaped")
        preflight()
    except (ValueError, ClusterError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    runs, plan = [], [(r, name) for r in range(args.repeats) for name in names]
    for i, (round_, name) in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] round {round_ + 1}: {name} ...", flush=True)
        try:
            runs.append({**run_one(name, args), "round": round_ + 1})
        except (RuntimeError, ClusterError) as error:
            print(f"{prog}: error: {error}", file=sys.stderr)
            return 1
        r = runs[-1]
        print(f"  {r['before_ms']:.1f} ms/iter before, {r['after_ms']:.1f} after; choices {r['choices']}", flush=True)
    config = {k: getattr(args, k) for k in ("nodes", "before", "after", "steps", "at", "recheck", "repeats")}
    data = {"schema": "pipesgd/link-change/1", "config": config, "runs": runs}
    write_result(args.result, data, provenance(sys.argv))
    print(report(data), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
