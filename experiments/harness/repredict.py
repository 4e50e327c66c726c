"""Re-make the timing model's predictions of a committed comparison result from the inputs each run stores.

A runs.json (``experiments.harness.comparison``) keeps, per predicted run, what its prediction used (``model.inputs``:
mode, nodes, gradient bytes, the compute, update, buffer-sync and host seconds, the co-located worker's step, the
run's config) and each cell's calibration. That is enough to predict the run again with the model as it is now,
without the raw metrics (which stay on the machine that ran the grid), so a model change can be shown on every
committed grid, old predictions beside new::

    python -m experiments.harness.repredict experiments/results/comparison/runs.json [--all]

prints the runs whose error moved (every run with ``--all``) and the error summary before and after.
``--rescore`` under ``experiments/comparison.py`` re-makes the records themselves from the raw metrics.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from timing_model.calibration import Calibration, calibration_from_json
from timing_model.errors import error_summary
from timing_model.validation import RunRecord, predict_run

__all__ = ["Remade", "remake", "remake_all", "main"]


@dataclass(frozen=True, slots=True)
class Remade:
    """One run's stored prediction and the current model's, from the same inputs."""

    cell: str
    variant: str
    measured_s: float
    stored_s: float
    predicted_s: float

    @property
    def stored_error(self) -> float:
        return (self.stored_s - self.measured_s) / self.measured_s

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


def remake(run: dict, calibration: Calibration) -> float:
    """The current model's iteration seconds for one committed run (a RunRecord of one step built from its
    stored inputs)."""
    model = run["model"]
    inputs = model["inputs"]
    record = RunRecord(run["variant"], inputs["config"], inputs["mode"], inputs["nodes"], inputs["grad_bytes"],
                       (model["measured_s"],), (inputs["compute_s"],), (inputs["update_s"],),
                       (inputs.get("buffers_s", 0.0),), (inputs.get("host_s", 0.0),),
                       (inputs["colocated_step_s"],) if inputs.get("colocated_step_s") else ())
    _, result = predict_run(record, calibration, compute_s=inputs["compute_s"] if inputs["override"] else None)
    return result.iteration_s


def remake_all(data: dict) -> list[Remade]:
    """Every run of ``data`` (a runs.json) that has a prediction and its cell a calibration, predicted again."""
    calibrations: dict[str, Calibration] = {}
    out = []
    for run in data.get("runs") or []:
        model = run.get("model")
        cell = (data.get("cells") or {}).get(run.get("cell")) or {}
        if not model or model.get("error") is None or not cell.get("calibration"):
            continue
        if run["cell"] not in calibrations:
            calibrations[run["cell"]] = calibration_from_json(cell["calibration"], f"cell {run['cell']}'s calibration")
        out.append(Remade(run["cell"], run["variant"], model["measured_s"], model["predicted_s"],
                          remake(run, calibrations[run["cell"]])))
    return out


def _summary(errors: list[float]) -> str:
    s = error_summary(errors)
    over = sum(abs(e) > 0.10 for e in errors)
    return (f"median |error| {100 * s['median_abs_error']:.1f} %, max {100 * s['max_abs_error']:.1f} %, "
            f"signed mean {100 * s['signed_mean_error']:+.1f} %, {over} of {len(errors)} runs over 10 %")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.harness.repredict", description=__doc__.split("\n")[0])
    parser.add_argument("result", help="a comparison runs.json")
    parser.add_argument("--all", action="store_true", help="list every run, not only those whose error moved")
    args = parser.parse_args(argv)
    try:
        with open(args.result) as handle:
            data = json.load(handle)
        rows = remake_all(data)
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"repredict: {args.result}: {error}", file=sys.stderr)
        return 2
    if not rows:
        print(f"repredict: {args.result}: no run with a prediction and a calibrated cell", file=sys.stderr)
        return 2
    for r in rows:
        if args.all or abs(r.error - r.stored_error) > 0.005:
            print(f"{r.cell:18s} {r.variant:12s} measured {1e3 * r.measured_s:9.2f} ms  stored "
                  f"{1e3 * r.stored_s:9.2f} ms ({100 * r.stored_error:+6.1f} %)  now {1e3 * r.predicted_s:9.2f} ms "
                  f"({100 * r.error:+6.1f} %)")
    print(f"stored: {_summary([r.stored_error for r in rows])}")
    print(f"now:    {_summary([r.error for r in rows])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
