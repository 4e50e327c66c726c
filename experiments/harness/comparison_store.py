"""The comparison grid's committed result (``experiments/results/comparison/runs.json``): one tidy record per run
and one entry per cell, re-written atomically (``write_result``, with provenance) after every run so a crash loses
nothing; ``--resume`` skips the runs it already holds. Also the whole grid's wall-time estimate from measured runs.
"""
from __future__ import annotations

import os
import statistics

from experiments.harness.comparison_config import GridConfig, cell_name
from experiments.harness.provenance import provenance, read_result, write_result

__all__ = ["SCHEMA", "ResultStore", "config_dict", "rounded", "estimate_wall"]

SCHEMA = "pipesgd/comparison/1"
CELL_OVERHEAD_S = 8.0  # cluster up, TCP measurement, tear-down (measured ~5-8 s on the 2-core machine)


def config_dict(cfg: GridConfig) -> dict:
    """The resolved grid as plain JSON (workloads by name)."""
    out = {name: getattr(cfg, name) for name in cfg.__dataclass_fields__ if name != "workloads"}
    out["workloads"] = {w.name: {f: getattr(w, f) for f in w.__dataclass_fields__ if f != "name"}
                        for w in cfg.workloads}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def rounded(value, digits: int = 6):
    """``value`` with every float rounded to ``digits`` significant digits (the file stays small; timings are
    not known to more than that)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    return value


class ResultStore:
    """runs.json in memory: records keyed by (cell, variant); ``save`` writes the whole file atomically."""

    def __init__(self, path: str, cfg: GridConfig, fresh: bool = False):
        self.path = path
        self.data = {"schema": SCHEMA, "config": config_dict(cfg), "cells": {}, "runs": [], "earlier": []}
        if not fresh and os.path.exists(path):
            old = read_result(path)
            if old.get("schema") != SCHEMA:
                raise ValueError(f"{path}: schema {old.get('schema')!r}, expected {SCHEMA!r} (use --fresh)")
            # runs kept from earlier invocations carry their own provenance in 'earlier'
            self.data["cells"] = old.get("cells", {})
            self.data["runs"] = old.get("runs", [])
            self.data["earlier"] = [*old.get("earlier", []), old["provenance"]][-20:]
        self.origin = provenance()

    def done(self, cell: str, variant: str) -> bool:
        """Whether a finished (status ok) record of this run is held."""
        return any(r["cell"] == cell and r["variant"] == variant and r.get("status") == "ok"
                   for r in self.data["runs"])

    def record(self, cell: str, variant: str) -> dict | None:
        return next((r for r in self.data["runs"] if r["cell"] == cell and r["variant"] == variant), None)

    def put_run(self, record: dict) -> None:
        """Add or replace the record of (cell, variant) and save."""
        runs = [r for r in self.data["runs"] if (r["cell"], r["variant"]) != (record["cell"], record["variant"])]
        self.data["runs"] = [*runs, record]
        self.save()

    def put_cell(self, cell: str, info: dict) -> None:
        self.data["cells"][cell] = {**self.data["cells"].get(cell, {}), **info}
        self.save()

    def save(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        write_result(self.path, rounded(self.data), origin=self.origin)


def _per_step_s(r: dict) -> float | None:
    """Seconds of trainer wall time per step (evaluations included)."""
    if r.get("train_wall_s") and r.get("steps"):
        return r["train_wall_s"] / r["steps"]
    return None


def _startup_s(runs: list[dict]) -> float:
    """Median seconds a run spends outside training (torchrun, imports, rendezvous, data, tear-down)."""
    gaps = [r["run_wall_s"] - r["train_wall_s"] for r in runs if r.get("run_wall_s") and r.get("train_wall_s")]
    return statistics.median(gaps) if gaps else 15.0


def _planned_steps(cfg: GridConfig, workload: str, bandwidth: str, steps_per_epoch: int) -> int:
    w = cfg.workload(workload)
    return w.steps.get(bandwidth) or w.epochs * steps_per_epoch


def estimate_wall(cfg: GridConfig, runs: list[dict], cells: dict,
                  steps_per_epoch: int = 11) -> tuple[float, list[dict]]:
    """(seconds, rows): the grid's wall time from measured runs. Per planned run: the startup seen in ``runs``
    plus its planned steps times a measured seconds per step from, in order, the same cell and variant, the same
    cell (median over its variants), the same workload and variant at another bandwidth; rows name the source,
    ``None`` seconds when nothing of the workload was measured. Per cell: overhead and its calibration time
    (measured in that cell, else the workload's median)."""
    ok = [r for r in runs if r.get("status") == "ok" and _per_step_s(r)]
    startup = _startup_s(ok)
    rows, total = [], 0.0
    for w, bandwidth in cfg.cells():
        cell = cell_name(w.name, bandwidth)
        calib = [c.get("calibration_s") for name, c in cells.items()
                 if name == cell or name.startswith(w.name + "-")]
        calib = [c for c in calib if c]
        own_cal = cells.get(cell, {}).get("calibration_s")
        cell_s = CELL_OVERHEAD_S + (own_cal or (statistics.median(calib) if calib else 0.0))
        total += cell_s
        for variant in cfg.variants:
            steps = _planned_steps(cfg, w.name, bandwidth, steps_per_epoch)
            same = [r for r in ok if r["cell"] == cell and r["variant"] == variant]
            in_cell = [r for r in ok if r["cell"] == cell]
            other_bw = [r for r in ok if r["workload"] == w.name and r["variant"] == variant]
            if same:
                per, source = _per_step_s(same[0]), "measured"
            elif in_cell:
                per, source = statistics.median(_per_step_s(r) for r in in_cell), "same cell, other variants"
            elif other_bw:
                per, source = statistics.median(_per_step_s(r) for r in other_bw), "same variant, other bandwidth"
            elif any(r["workload"] == w.name for r in ok):
                per = statistics.median(_per_step_s(r) for r in ok if r["workload"] == w.name)
                source = "same workload, other cells (a guess: link speed not reflected)"
            else:
                per, source = None, "nothing measured"
            seconds = None if per is None else startup + steps * per
            total += seconds or 0.0
            rows.append({"cell": cell, "variant": variant, "steps": steps, "seconds": seconds, "source": source})
    return total, rows
