"""The auto-choice grid's table (issue 39): every variant per cell, the best fixed configuration, and each auto
variant's ratio to it, per iteration and in time to the target accuracy, with what each auto variant chose, and what
auto's own measuring and deciding cost each run (against the issue's 2 % of a 200-step run).

    python experiments/auto_choice_report.py                                   # the whole grid's runs.json
    python experiments/auto_choice_report.py --result experiments/results/auto_choice/alexnet_cost_seed50.json
    python experiments/auto_choice_report.py --result \
        experiments/results/auto_choice/alexnet_cost_seed*.json       # several sittings: each ratio's mean and range
    python experiments/auto_choice_report.py --result SITTING.json ... --short SHORT.json ...  # runs cut short

Every ratio is taken within one sitting (auto against the best fixed configuration of the same sitting, run side by
side); across sittings the summary gives the mean, the range and how many sittings were within 10 %. A run cut short
(``--short``) joins its seed's sitting with its projected time to target, and where it decides the best fixed
configuration the summary says in how many sittings that time was projected.

Reads what ``python experiments/comparison.py --config experiments/configs/auto_choice.toml`` wrote; runs nothing.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness
from experiments.harness.one_line import OneLineParser  # noqa: E402
from experiments.harness.projected_target import projected  # noqa: E402

RESULT = "experiments/results/auto_choice/runs.json"
FIXED = ("sync", "sync+bf16", "sync+q8", "sync+q4", "pipe", "pipe+bf16", "pipe+q8", "pipe+q4")  # auto's choices
TARGET = 1.10  # the bound: auto within 10 % of the best fixed configuration
COST_STEPS, COST_SHARE = 200, 0.02  # the bound on what auto's measuring costs: 2 % of a 200-step run


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
             f"auto's mean / best fixed mean | best fixed by mean | auto's mean / best fixed in every sitting's "
             f"mean | auto chose |", "|" + "---|" * 11]
    for cell, variant in keys:
        seen = [ratios[cell, variant] for ratios in per_sitting if (cell, variant) in ratios]
        values = [ratio for ratio, _, _ in seen]
        chose = "; ".join(dict.fromkeys(c for _, _, c in seen))
        means = _means(sittings, cell, metric)
        best = min((v for v in means if v in FIXED), key=means.get)
        # a fixed configuration that missed the target in a sitting has a mean over the others: the best that
        # reached it in every sitting is the fair rival of a choice that did
        always = [v for v in means if v in FIXED and _count(sittings, cell, v, metric) == len(sittings)]
        steady = min(always, key=means.get) if always else None
        versus = (f"{means[variant] / means[steady]:.2f} ({steady}{_projected_in(sittings, cell, steady, metric)})"
                  if steady else "- (none did)")
        lines.append(f"| {cell} | {variant} | {len(values)} | {statistics.fmean(values):.2f} | {min(values):.2f} | "
                     f"{max(values):.2f} | {sum(v <= TARGET for v in values)} of {len(values)} | "
                     f"{means[variant] / means[best]:.2f} | {best} | {versus} | {chose} |")
    return lines


def _measured(sittings: list[list[dict]], cell: str, metric: str) -> list[list[dict]]:
    """Per sitting, its runs in ``cell`` that ran and have a ``metric``."""
    return [[r for r in runs if r["cell"] == cell and r.get("status") == "ok" and r.get(metric) is not None]
            for runs in sittings]


def _count(sittings: list[list[dict]], cell: str, variant: str, metric: str) -> int:
    """In how many sittings ``variant`` has a ``metric`` in ``cell``."""
    return sum(any(r["variant"] == variant for r in runs) for runs in _measured(sittings, cell, metric))


def _projected_in(sittings: list[list[dict]], cell: str, variant: str, metric: str) -> str:
    """", projected in N of M" where some of ``variant``'s values in ``cell`` are projections of runs cut short."""
    runs = [r for runs in _measured(sittings, cell, metric) for r in runs if r["variant"] == variant]
    guessed = sum(bool(r.get("projected")) for r in runs)
    return f", projected in {guessed} of {len(runs)}" if guessed and metric == "time_to_target_s" else ""


def _means(sittings: list[list[dict]], cell: str, metric: str) -> dict[str, float]:
    """Every variant's mean ``metric`` in ``cell`` over the sittings where it has one."""
    values: dict[str, list[float]] = {}
    for runs in _measured(sittings, cell, metric):
        for r in runs:
            values.setdefault(r["variant"], []).append(r[metric])
    return {v: statistics.fmean(xs) for v, xs in values.items()}


def _cost(sittings: list[list[dict]]) -> list[str]:
    """Auto's own time per run (``auto_s``: each step's least over its ranks, ``comparison_record``) per cell and
    variant over the sittings, and its share of a ``COST_STEPS``-step run at that run's iteration; [] when no run
    recorded it (result files before ``StepStats.t_auto_s``)."""
    runs = [r for runs in sittings for r in runs if r.get("status") == "ok" and r.get("auto_s") is not None]
    if not runs:
        return []
    lines = [f"| cell | variant | runs | auto's own time per run, ms: mean | min | max | of a {COST_STEPS}-step run at "
             f"its iteration: mean | max | within {COST_SHARE:.0%} |", "|" + "---|" * 9]
    for cell, variant in dict.fromkeys((r["cell"], r["variant"]) for r in runs):
        mine = [r for r in runs if (r["cell"], r["variant"]) == (cell, variant)]
        seconds = [r["auto_s"] for r in mine]
        shares = [r["auto_s"] / (COST_STEPS * r["t_iter_s"]) for r in mine]
        lines.append(f"| {cell} | {variant} | {len(seconds)} | {statistics.fmean(seconds) * 1e3:.0f} | "
                     f"{min(seconds) * 1e3:.0f} | {max(seconds) * 1e3:.0f} | {statistics.fmean(shares):.2%} | "
                     f"{max(shares):.2%} | {sum(x <= COST_SHARE for x in shares)} of {len(shares)} |")
    return lines


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


def _seed(result: dict) -> int | None:
    return result.get("config", {}).get("seed")


def _projections(short: dict, results: list[dict]) -> tuple[list[str], list[dict]]:
    """The runs of ``short`` (cut short) projected to their target from the same seed's sittings (``projected``),
    against the best fixed configuration that ran to it in the same sitting and cell; and those runs with their
    projection as their time to target (``projected``: True; not reached where there is none), which join that
    seed's sitting: a configuration too slow to run to the target still counts in each sitting it was cut short in."""
    sittings = [r["runs"] for r in results if _seed(r) == _seed(short)]
    joined = []
    lines = ["| cell | variant | ms per iteration (short run) | target reached at step (in) | same evaluations | "
             "projected s to target | best fixed that ran to it, s | projected / best |", "|" + "---|" * 8]
    for run in short["runs"]:
        if run.get("status") != "ok":
            continue
        full = [r for runs in sittings for r in runs if r.get("workload") == run.get("workload")
                and r["variant"] == run["variant"] and r["cell"] != run["cell"] and r.get("status") == "ok"]
        guess = projected(run, full)
        best = [r for runs in sittings for r in runs if r["cell"] == run["cell"] and r["variant"] in FIXED
                and r.get("reached_target")]
        top = min(best, key=lambda r: r["time_to_target_s"]) if best else None
        seconds = guess["seconds"]
        joined.append({**run, "time_to_target_s": seconds, "reached_target": seconds is not None, "projected": True})
        best_s = top["time_to_target_s"] if top else None
        shown = "-" if seconds is None else f"{seconds:.1f}"
        best_shown = "-" if top is None else f"{best_s:.1f} ({top['variant']})"
        ratio = "-" if seconds is None or top is None else f"{seconds / best_s:.2f}"
        step = guess["step"] if guess["step"] is not None else "not reached"
        lines.append(f"| {run['cell']} | {run['variant']} | {run['t_iter_s'] * 1e3:.0f} | {step} "
                     f"({', '.join(guess['from']) or '-'}) | {'yes' if guess['same'] else 'no'} | {shown} | "
                     f"{best_shown} | {ratio} |")
    return lines, joined


def _read(path: Path) -> dict:
    """A runs.json, its provenance printed; ValueError naming the file when it cannot be read as one."""
    try:
        result = json.loads(path.read_text())
        if not isinstance(result["runs"], list):
            raise TypeError("runs is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    provenance = result.get("provenance", {})
    print(f"{path}: {len(result['runs'])} runs; {provenance.get('command', '')} ({provenance.get('commit', '?')}, "
          f"{provenance.get('date', '?')})")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--result", nargs="+", default=[RESULT],
                        help=f"runs.json to read (default {RESULT}); several: one sitting each, summarised")
    parser.add_argument("--short", nargs="+", default=[],
                        help="runs.json of runs cut short (--steps N): their time to target projected from the "
                             "--result sittings of the same seed")
    args = parser.parse_args(argv)
    try:
        results, shorts = [_read(Path(name)) for name in args.result], [_read(Path(name)) for name in args.short]
    except ValueError as exc:
        print(f"auto_choice_report: {exc}", file=sys.stderr)
        return 2
    for short in shorts:
        lines, joined = _projections(short, results)
        print()
        print("\n".join(lines))
        sitting = next((result["runs"] for result in results if _seed(result) == _seed(short)), None)
        if sitting is not None:  # where a full run of the same cell and variant is there too, it stands
            sitting += [r for r in joined if not any(f["cell"] == r["cell"] and f["variant"] == r["variant"]
                                                    for f in sitting)]
    sittings = [result["runs"] for result in results]
    cost = _cost(sittings)
    if cost:
        print()
        print("\n".join(cost))
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
