"""The auto-choice grid's table (issue 39): every variant per cell, the best fixed configuration, and each auto
variant's ratio to it, per iteration and in time to the target accuracy, with what each auto variant chose.

    python experiments/auto_choice_report.py                                   # the committed runs.json
    python experiments/auto_choice_report.py --result experiments/results/auto_choice/repeat_1.json
    python experiments/auto_choice_report.py --result experiments/results/auto_choice/runs.json \
        experiments/results/auto_choice/resnet20_seed*.json         # several sittings: each ratio's mean and range

Every ratio is taken within one sitting (auto against the best fixed configuration of the same sitting, run side by
side); across sittings the summary gives the mean, the range and how many sittings were within 10 %.

Reads what ``python experiments/comparison.py --config experiments/configs/auto_choice.toml`` wrote; runs nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

RESULT = "experiments/results/auto_choice/runs.json"
FIXED = ("sync", "pipe", "pipe+bf16", "pipe+q8", "pipe+q4")  # the configurations auto chooses among
TARGET = 1.10  # the bound: auto within 10 % of the best fixed configuration


def _ratios(runs: list[dict], metric: str) -> dict[tuple[str, str], tuple[float, str, str]]:
    """(cell, auto variant) -> (its ``metric`` over the best fixed one's, that best fixed, what auto chose), for the
    cells where a fixed configuration has a value."""
    out = {}
    for cell in dict.fromkeys(r["cell"] for r in runs):
        of = {r["variant"]: r for r in runs if r["cell"] == cell and r.get("status") == "ok"}
        fixed = {v: r[metric] for v, r in of.items() if v in FIXED and r.get(metric) is not None}
        if not fixed:
            continue
        best = min(fixed, key=fixed.get)
        for variant, run in of.items():
            if "auto" in variant and run.get(metric) is not None:
                out[cell, variant] = (run[metric] / fixed[best], best, run.get("auto_choice") or "-")
    return out


def _across(sittings: list[list[dict]], metric: str, title: str) -> list[str]:
    """Each auto variant against the best fixed configuration, per cell, over the sittings: the per-sitting ratio's
    mean, range and sittings within 10 %; and the ratio of means over the sittings, against the fixed configuration
    with the lowest mean. (The per-sitting best is the least of five noisy values, so that ratio leans above 1 even
    for a choice as good as the best; the means lean less.)"""
    per_sitting = [_ratios(runs, metric) for runs in sittings]
    keys = list(dict.fromkeys(k for ratios in per_sitting for k in ratios))
    lines = [f"| cell | variant | sittings | {title} / best fixed, per sitting: mean | min | max | within 10 % | "
             f"auto's mean / best fixed mean | best fixed by mean | auto chose |", "|" + "---|" * 10]
    for cell, variant in keys:
        seen = [ratios[cell, variant] for ratios in per_sitting if (cell, variant) in ratios]
        values = [ratio for ratio, _, _ in seen]
        chose = "; ".join(dict.fromkeys(c for _, _, c in seen))
        means = _means(sittings, cell, metric)
        best = min((v for v in means if v in FIXED), key=means.get)
        lines.append(f"| {cell} | {variant} | {len(values)} | {statistics.fmean(values):.2f} | {min(values):.2f} | "
                     f"{max(values):.2f} | {sum(v <= TARGET for v in values)} of {len(values)} | "
                     f"{means[variant] / means[best]:.2f} | {best} | {chose} |")
    return lines


def _means(sittings: list[list[dict]], cell: str, metric: str) -> dict[str, float]:
    """Every variant's mean ``metric`` in ``cell`` over the sittings where it has one."""
    values: dict[str, list[float]] = {}
    for runs in sittings:
        for r in runs:
            if r["cell"] == cell and r.get("status") == "ok" and r.get(metric) is not None:
                values.setdefault(r["variant"], []).append(r[metric])
    return {v: statistics.fmean(xs) for v, xs in values.items()}


def _table(runs: list[dict], metric: str, unit: str, scale: float, digits: int) -> list[str]:
    cells = list(dict.fromkeys(r["cell"] for r in runs))
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    autos = [v for v in variants if "auto" in v]
    head = ["cell", *variants, "best fixed", *(f"{v} / best" for v in autos), "chose"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios = _ratios(runs, metric)
    for cell in cells:
        of = {r["variant"]: r for r in runs if r["cell"] == cell and r.get("status") == "ok"}
        fixed = {v: r[metric] for v, r in of.items() if v in FIXED and r.get(metric) is not None}
        if not fixed:
            continue
        shown = [f"{of[v][metric] * scale:.{digits}f}" if of.get(v, {}).get(metric) is not None else "-"
                 for v in variants]
        mine = [f"{ratios[cell, v][0]:.2f}" if (cell, v) in ratios else "-" for v in autos]
        chose = "; ".join(f"{v}: {of[v].get('auto_choice') or '-'}" for v in autos if v in of)
        lines.append("| " + " | ".join([f"{cell} ({unit})", *shown, min(fixed, key=fixed.get), *mine, chose]) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--result", nargs="+", default=[RESULT],
                        help=f"runs.json to read (default {RESULT}); several: one sitting each, summarised")
    args = parser.parse_args(argv)
    sittings = []
    for name in args.result:
        path = Path(name)
        try:
            result = json.loads(path.read_text())
            sittings.append(result["runs"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"auto_choice_report: cannot read {path}: {exc}", file=sys.stderr)
            return 2
        provenance = result.get("provenance", {})
        print(f"{path}: {len(sittings[-1])} runs; {provenance.get('command', '')} ({provenance.get('commit', '?')}, "
              f"{provenance.get('date', '?')})")
    if len(sittings) == 1:
        runs = sittings[0]
        print()
        print("\n".join(_table(runs, "t_iter_s", "ms per iteration", 1e3, 1)))
        print()
        print("\n".join(_table([r for r in runs if r.get("reached_target")], "time_to_target_s", "s to target", 1.0,
                               2)))
        return 0
    reached = [[r for r in runs if r.get("reached_target")] for runs in sittings]
    print()
    print("\n".join(_across(reached, "time_to_target_s", "time to target")))
    print()
    print("\n".join(_across(sittings, "t_iter_s", "time per iteration")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
