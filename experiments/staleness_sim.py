"""Look-ahead with many workers, simulated in one process with the library's own look-ahead and optimizer code
(issue 36, item 3): LeNet, global batch 128 split over 4, 16 and 64 workers, width 1 / plain width 2 / look-ahead
width 2, five seeds. Logic in experiments/harness/staleness_sim.py.

    python experiments/staleness_sim.py                                   # the whole study (~15 min on 2 cores)
    python experiments/staleness_sim.py --workers 4 --seeds 0 --result /tmp/sim.json   # a quick look
    python experiments/staleness_sim.py --jobs 2 ...                      # two runs at a time (one per core)
    # the charlm gap at width 3 taken apart: the library's stand-in against the true average and three other
    # stand-ins (~25 min)
    python experiments/staleness_sim.py --tasks charlm --workers 2 --width 3 --seeds 0,1,2 \
        --standins local,oracle,shrunk,frozen-v,meanpoint \
        --result experiments/results/staleness_sim/charlm_standin.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from experiments.harness.one_line import OneLineParser  # noqa: E402
from experiments.harness.provenance import read_result, write_result  # noqa: E402
from experiments.harness.staleness_sim import (  # noqa: E402
    STANDINS, TASKS, plan, run_all, summarise, summary_markdown)
from experiments.harness.standin_variants import OVERSHOOT  # noqa: E402

RESULT = os.path.join("experiments", "results", "staleness_sim", "staleness_sim.json")


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"need non-negative integers: {text!r}")
    return values


def _jobs(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"not a whole number from 1 up: {text!r}")
    return jobs


def _tasks(text: str) -> list[str]:
    names = [x for x in text.split(",") if x]
    unknown = [n for n in names if n not in TASKS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown task(s) {', '.join(unknown) or text!r}; valid: {', '.join(TASKS)}")
    return names


def _standins(text: str) -> tuple[str, ...]:
    names = tuple(x for x in text.split(",") if x)
    unknown = [n for n in names if n not in STANDINS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown stand-in(s) {', '.join(unknown) or text!r}; "
                                         f"valid: {', '.join(STANDINS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="staleness_sim", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=_tasks, default=["digits"], help="digits,mnist1d,charlm (default digits)")
    parser.add_argument("--workers", type=_ints, default=[4, 16, 64], help="worker counts (default 4,16,64)")
    parser.add_argument("--seeds", type=_ints, default=[0, 1, 2, 3, 4], help="seeds (default 0-4)")
    parser.add_argument("--width", type=int, default=2, help="the pipelined width (default 2)")
    parser.add_argument("--standins", type=_standins, default=("local",),
                        help="look-ahead's stand-ins: local (the library's); diagnostics: oracle (the true "
                             "average), shrunk, frozen-v (Adam's second moment held; charlm), meanpoint (own batch "
                             "at the workers' mean look-ahead point: one more gradient per step), overshoot (own "
                             f"gradient, the look-ahead moved {OVERSHOOT:g} times as far), oracle-overshoot (the "
                             "true average moved as far: a control), coarse (everyone's gradients averaged after a "
                             "q4 round trip), coarse-sign (after a sign one), coarse-exchange (q4, the mean encoded "
                             "once more, as the exchange delivers it), own-then-coarse (own for the newest step, "
                             "q8 average for the older), last-average (the last average applied), own-share ((own + (W-1) last) / W)")
    parser.add_argument("--result", default=RESULT, help=f"result JSON (default {RESULT})")
    parser.add_argument("--resume", action="store_true", help="skip runs already in the result")
    parser.add_argument("--jobs", type=_jobs, default=1,
                        help="runs side by side, one process and one thread each (default 1)")
    args = parser.parse_args(argv)
    try:
        specs = plan(args.tasks, args.workers, args.seeds, args.width, args.standins)
    except ValueError as exc:
        print(f"staleness_sim: error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    runs = read_result(args.result).get("runs", []) if args.resume and os.path.exists(args.result) else []
    done = {r["key"] for r in runs}
    todo = [s for s in specs if s.key not in done]
    started = time.monotonic()
    order = {spec.key: i for i, spec in enumerate(specs)}  # the file keeps plan order, whatever ends first
    for i, run in enumerate(run_all(todo, args.jobs), 1):
        runs.append(run)
        runs.sort(key=lambda r: order.get(r["key"], -1))
        eta = (time.monotonic() - started) / i * (len(todo) - i)
        print(f"[{i}/{len(todo)}] {run['key']}: {100 * run['final_accuracy']:.1f} %, loss {run['final_loss']:.4f} "
              f"(ETA {eta / 60:.1f} min)", flush=True)
        write_result(args.result, {"experiment": "staleness_sim", "summary": summarise(runs), "runs": runs})
    print(summary_markdown(summarise(runs)))
    print(f"result: {args.result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
