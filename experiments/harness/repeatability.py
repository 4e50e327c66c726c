"""How well the comparison grid's runs reproduce themselves: the measured iteration of each (cell, variant) in two
sittings of the grid (two runs.json of ``experiments.harness.comparison``), their relative difference, and beside it
each sitting's timing-model error, per workload and over all runs::

    python -m experiments.harness.repeatability experiments/results/fidelity/sitting-a.json \\
        experiments/results/fidelity/sitting-b.json [--all]

Why: each cell's calibration and runs share one sitting, so the model's error holds the machine's drift within
a sitting and the model's own; the spread of the same runs between sittings shows how large the drift of a shared
2-core host can be (an upper view of it: the sittings lie hours apart, a cell's calibration minutes before its
runs; v10a and v10b interleave two sittings cell by cell, minutes apart). Differences are (B − A) / A of the median
iterations the results store; only runs measured in both count. Beside the model's error in each sitting: how far it
moved from A to B (a term the model lacks errs alike in both sittings; what moves between two sittings of the same
run, no calibration made before it could foresee), and the model against the two sittings pooled,
mean(predicted A, predicted B) / mean(measured A, measured B) − 1, where drift that differs between them averages
down. Last, the scale for the model's ordering of the modes (``model_ordering``): of the pairs of runs one sitting
measured more than 5 % apart in a cell, how many the other sitting measured in the same order.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass

from .model_ordering import TIE, orders_kept_between

__all__ = ["Pair", "pairs", "summary_rows", "main"]


@dataclass(frozen=True, slots=True)
class Pair:
    """One (cell, variant) measured in both sittings, with each sitting's model error where it predicted it."""

    cell: str
    workload: str
    variant: str
    first_s: float
    second_s: float
    first_error: float | None
    second_error: float | None
    first_predicted_s: float | None = None
    second_predicted_s: float | None = None

    @property
    def change(self) -> float:
        return (self.second_s - self.first_s) / self.first_s

    @property
    def error_shift(self) -> float | None:
        """How far the model's error moved from the first sitting to the second; None unless both predicted it."""
        if self.first_error is None or self.second_error is None:
            return None
        return self.second_error - self.first_error

    @property
    def pooled_error(self) -> float | None:
        """The model's error on the mean of the two sittings; None unless both predicted the run."""
        if self.first_predicted_s is None or self.second_predicted_s is None:
            return None
        return (self.first_predicted_s + self.second_predicted_s) / (self.first_s + self.second_s) - 1


def _measured(data: dict) -> dict[tuple[str, str], dict]:
    return {(run["cell"], run["variant"]): run for run in data.get("runs") or []
            if run.get("status") == "ok" and (run.get("t_iter_s") or 0) > 0}


def _model(run: dict, key: str) -> float | None:
    return (run.get("model") or {}).get(key)


def pairs(first: dict, second: dict) -> list[Pair]:
    """The runs both results measured, in the first result's order."""
    a, b = _measured(first), _measured(second)
    return [_pair(*key, a[key], b[key]) for key in a if key in b]


def _pair(cell: str, variant: str, first: dict, second: dict) -> Pair:
    return Pair(cell, first.get("workload") or cell.split("-")[0], variant, first["t_iter_s"], second["t_iter_s"],
                _model(first, "error"), _model(second, "error"), _model(first, "predicted_s"),
                _model(second, "predicted_s"))


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    absolute = [abs(v) for v in values]
    return f"{100 * statistics.median(absolute):.1f} % / {100 * max(absolute):.1f} %"


def _signed(error: float | None) -> str:
    return "      -" if error is None else f"{100 * error:+5.1f} %"


def summary_rows(found: list[Pair]) -> list[tuple[str, int, str, str, str, str, str]]:
    """Per workload and over all: (group, runs, median / max |change| between sittings, median / max |model
    error| of the first sitting, of the second, how far it moved between them, and the model on the two pooled),
    the model's over the runs each predicted."""
    groups = [(w, [p for p in found if p.workload == w]) for w in dict.fromkeys(p.workload for p in found)]
    rows = []
    for name, members in groups + [("all", found)]:
        rows.append((name, len(members), _stats([p.change for p in members]),
                     _stats([p.first_error for p in members if p.first_error is not None]),
                     _stats([p.second_error for p in members if p.second_error is not None]),
                     _stats([p.error_shift for p in members if p.error_shift is not None]),
                     _stats([p.pooled_error for p in members if p.pooled_error is not None])))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.harness.repeatability",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("first", help="a comparison runs.json (sitting A)")
    parser.add_argument("second", help="another sitting of the same grid (sitting B)")
    parser.add_argument("--all", action="store_true", help="list every run measured in both sittings")
    args = parser.parse_args(argv)
    loaded = []
    for path in (args.first, args.second):
        try:
            with open(path) as handle:
                loaded.append(json.load(handle))
        except (OSError, ValueError) as error:
            print(f"repeatability: {path}: {error}", file=sys.stderr)
            return 2
    try:
        found = pairs(*loaded)
        orders = [orders_kept_between(one.get("runs") or [], other.get("runs") or [])
                  for one, other in (loaded, loaded[::-1])]
    except (KeyError, TypeError, AttributeError) as error:
        print(f"repeatability: not a comparison result ({error!r})", file=sys.stderr)
        return 2
    if not found:
        print("repeatability: the two results have no measured run in common", file=sys.stderr)
        return 2
    if args.all:
        for p in found:
            print(f"{p.cell:18s} {p.variant:13s} A {1e3 * p.first_s:8.1f} ms  B {1e3 * p.second_s:8.1f} ms  "
                  f"{100 * p.change:+6.1f} %   model A {_signed(p.first_error)}  B {_signed(p.second_error)}")
    print("| workload | runs in both | A → B, median / max \\|change\\| | model A, median / max \\|error\\| "
          "| model B, median / max \\|error\\| | error B − error A | model on A and B pooled |")
    print("|---|---|---|---|---|---|---|")
    for row in summary_rows(found):
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    for label, (kept, ordered) in zip("AB", orders):
        if ordered:
            print(f"of the {ordered} pairs of predicted runs sitting {label} measured more than {100 * TIE:.0f} % "
                  f"apart in a cell, the other sitting ordered {kept} alike ({100 * kept / ordered:.0f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
