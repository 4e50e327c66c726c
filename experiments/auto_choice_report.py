"""The auto-choice grid's table (issue 39): every variant per cell, the best fixed configuration, and each auto
variant's ratio to it, per iteration and in time to the target accuracy, with what each auto variant chose.

    python experiments/auto_choice_report.py                                   # the committed runs.json
    python experiments/auto_choice_report.py --result experiments/results/auto_choice/repeat_1.json

Reads what ``python experiments/comparison.py --config experiments/configs/auto_choice.toml`` wrote; runs nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULT = "experiments/results/auto_choice/runs.json"
FIXED = ("sync", "pipe", "pipe+bf16", "pipe+q8", "pipe+q4")  # the configurations auto chooses among


def _table(runs: list[dict], metric: str, unit: str, scale: float, digits: int) -> list[str]:
    cells = list(dict.fromkeys(r["cell"] for r in runs))
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    autos = [v for v in variants if "auto" in v]
    head = ["cell", *variants, "best fixed", *(f"{v} / best" for v in autos), "chose"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in cells:
        of = {r["variant"]: r for r in runs if r["cell"] == cell and r.get("status") == "ok"}
        values = {v: r.get(metric) for v, r in of.items()}
        fixed = {v: x for v, x in values.items() if v in FIXED and x is not None}
        if not fixed:
            continue
        best = min(fixed, key=fixed.get)
        ratios = [f"{values[v] / fixed[best]:.2f}" if values.get(v) is not None else "-" for v in autos]
        shown = [f"{values[v] * scale:.{digits}f}" if values.get(v) is not None else "-" for v in variants]
        chose = "; ".join(f"{v}: {of[v].get('auto_choice') or '-'}" for v in autos if v in of)
        lines.append("| " + " | ".join([f"{cell} ({unit})", *shown, best, *ratios, chose]) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--result", default=RESULT, help=f"runs.json to read (default {RESULT})")
    args = parser.parse_args(argv)
    path = Path(args.result)
    try:
        result = json.loads(path.read_text())
        runs = result["runs"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"auto_choice_report: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    print(f"{path}: {len(runs)} runs; {result.get('provenance', {}).get('command', '')}")
    print()
    print("\n".join(_table(runs, "t_iter_s", "ms per iteration", 1e3, 1)))
    print()
    print("\n".join(_table([r for r in runs if r.get("reached_target")], "time_to_target_s", "s to target", 1.0, 2)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
