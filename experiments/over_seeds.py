"""One comparison grid run once per seed, summarised per cell and variant over the seeds: time per iteration, final
accuracy and loss (mean and sample std), and time to target in each sitting with its mean where every sitting reached
it (first used for the charlm cell of issue 36, ``experiments/configs/charlm_time.toml``).

    python experiments/over_seeds.py experiments/results/charlm_time/runs-seed*.json

Each file is one sitting (``python experiments/comparison.py ... --seed S --result FILE``), its variants run side by
side on one emulated cluster; ratios to ``--baseline`` are taken within a sitting, then averaged. Runs nothing.
"""
from __future__ import annotations

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.comparison_record import time_to_target  # noqa: E402
from experiments.harness.one_line import OneLineParser  # noqa: E402


def _mean_sd(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} ± {sd:.{digits}f}"


def summary_rows(sittings: list[dict], baseline: str) -> list[str]:
    """Markdown rows, one per (cell, variant) in the first sitting's order."""
    ok = [{(r["cell"], r["variant"]): r for r in s["runs"] if r.get("status") == "ok"} for s in sittings]
    keys = list(dict.fromkeys(k for runs in ok for k in runs))
    rows = [f"| cell | variant | sittings | ms / iter | vs {baseline} per iteration | final loss | final accuracy | "
            f"to target s, per sitting | mean | vs {baseline} to target |", "|" + "---|" * 10]
    for cell, variant in keys:
        base = [(runs[cell, variant], runs.get((cell, baseline))) for runs in ok if (cell, variant) in runs]
        mine = [r for r, _ in base]
        per_iter = [b["t_iter_s"] / r["t_iter_s"] for r, b in base if b]
        reached = [r.get("time_to_target_s") for r in mine]
        shown = ", ".join("-" if t is None else f"{t:.1f}" for t in reached)
        every = all(t is not None for t in reached)
        to_target = [b["time_to_target_s"] / r["time_to_target_s"] for r, b in base
                     if b and b.get("time_to_target_s") and r.get("time_to_target_s")]
        mean_to_target = f"{statistics.fmean(reached):.1f}" if every else "not every sitting"
        vs_to_target = f"{statistics.fmean(to_target):.2f}x ({len(to_target)} of {len(mine)})" if to_target else "-"
        losses = [r["final_loss"] for r in mine if r.get("final_loss") is not None]
        accuracies = [r["final_accuracy"] for r in mine if r.get("final_accuracy") is not None]
        rows.append(f"| {cell} | {variant} | {len(mine)} | {_mean_sd([1e3 * r['t_iter_s'] for r in mine], 1)} | "
                    f"{f'{statistics.fmean(per_iter):.2f}x' if per_iter else '-'} | {_mean_sd(losses, 4)} | {_mean_sd(accuracies, 4)} | "
                    f"{shown} | {mean_to_target} | {vs_to_target} |")
    return rows


def retarget(sitting: dict, target_loss: float) -> dict:
    """``sitting`` with each run's time to target read from its curve at ``target_loss`` (validation loss)."""
    runs = []
    for run in sitting["runs"]:
        if run.get("status") == "ok":
            if "curve" not in run:
                raise ValueError(f"--target-loss: run {run.get('variant')!r} keeps no loss curve to read it from")
            run = {**run, "target_loss": target_loss, "time_to_target_s": time_to_target(run["curve"], target_loss,
                                                                                         "loss")}
        runs.append(run)
    return {**sitting, "runs": runs}


def _targets(text: str, count: int) -> list[float]:
    """``--target-loss``: one positive loss for every file, or one per file in their order."""
    try:
        targets = [float(value) for value in text.split(",")]
    except ValueError:
        raise ValueError(f"--target-loss takes losses separated by commas, got {text!r}") from None
    if len(targets) not in (1, count) or not all(t > 0 for t in targets):
        raise ValueError(f"--target-loss takes one positive loss, or one per file ({count}), got {text!r}")
    return targets * count if len(targets) == 1 else targets


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="over_seeds", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="runs.json files, one per sitting")
    parser.add_argument("--baseline", default="ddp", help="the variant ratios are taken to (default ddp)")
    parser.add_argument("--target-loss", metavar="LOSS[,LOSS...]",
                        help="time to this validation loss, read from each run's curve: one for every file or one "
                             "per file in order (default: each sitting's own target)")
    args = parser.parse_args(argv)
    try:
        targets = _targets(args.target_loss, len(args.results)) if args.target_loss else None
        sittings = []
        for path in args.results:
            with open(path) as handle:
                sittings.append(json.load(handle))
        if targets:
            sittings = [retarget(sitting, target) for sitting, target in zip(sittings, targets)]
    except (OSError, json.JSONDecodeError, ValueError, KeyError) as error:
        print(f"over_seeds: error: {error}", file=sys.stderr)
        return 2
    if not any(r.get("variant") == args.baseline for s in sittings for r in s.get("runs", [])):
        print(f"over_seeds: error: no run of the baseline {args.baseline!r} in the results", file=sys.stderr)
        return 2
    print("\n".join(summary_rows(sittings, args.baseline)))
    for path, sitting in zip(args.results, sittings):
        prov = sitting.get("provenance", {})
        print(f"\n{path}: `{prov.get('command', '?')}`, {prov.get('date', '?')}, commit {prov.get('commit', '?')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
