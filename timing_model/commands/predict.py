"""``pipesgd-timing predict``: iteration time and its breakdown for every mode of one scenario.

The default table is what a user compares (each mode's iteration, its speedup over synchronous training with the same
codec, what bounds it) in under 100 columns; ``--format wide`` has every column of the breakdown, csv and json every
field in SI units.
"""
from __future__ import annotations

import argparse
import math

from .. import tables
from ..predict import Prediction, Scenario
from ..recommend import HIDDEN_SHARE
from ..units import format_number, format_time
from .flags import (SWEEPABLE, add_scenario_flags, help_formatter, load_calibration, parse_modes, predict_modes,
                    scenario_fields)

__all__ = ["PREDICT_COLUMNS", "PREDICT_FORMATS", "SUMMARY_COLUMNS", "SPEEDUP_LEGEND", "USAGE", "DESCRIPTION",
           "add_parser", "run", "summary_rows", "wide_rows"]

USAGE = "%(prog)s --nodes N --bandwidth RATE --params COUNT [...]"
DESCRIPTION = ("How long one training step takes on your cluster with each way of averaging gradients (parameter "
               "server, synchronous all-reduce, PyTorch DDP, Pipe-SGD), and how much faster each is. Without "
               "--calibration it is the plain analytic model (docs/timing-model.md).")

PREDICT_FORMATS = ("markdown", "wide", "csv", "json")
# --format wide: the breakdown's columns, in reading order (csv and json carry every field of ModeResult)
PREDICT_COLUMNS = ["mode", "iteration_s", "compute_s", "straggler_s", "interference_s", "update_s",
                   "handoff_s", "buffers_s", "host_s", "lockstep_s", "server_s", "exposed_comm_s", "codec_s",
                   "hidden_comm_s", "throughput_it_s", "speedup_vs_sync", "speedup_vs_one", "staleness", "regime",
                   "allreduce"]
SUMMARY_COLUMNS = ["mode", "codec", "width", "iteration", "vs sync", "bound"]
SPEEDUP_LEGEND = "vs sync: times faster than synchronous all-reduce (width 1) with the same codec; >1 is faster."
WIDTH_OF = {"sync": "1", "ddp": "1", "ps-sync": "1", "ps-async": "async"}  # pipe: the scenario's width


def add_parser(sub) -> None:
    p = sub.add_parser("predict", help="iteration time and breakdown of every mode", formatter_class=help_formatter,
                       usage=USAGE, description=DESCRIPTION)
    add_scenario_flags(p, sweep=False)
    p.add_argument("--format", choices=PREDICT_FORMATS, default="markdown", metavar="FORMAT",
                   help="markdown (a short table), wide (every column), csv or json (every field, SI units)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> str:
    for flag in SWEEPABLE:
        value = getattr(args, flag, None)
        if value is not None and "," in value:
            raise ValueError(f"--{flag.replace('_', '-')} {value!r}: predict takes one value; use `sweep` for lists")
    scenario = Scenario.of(**scenario_fields(args))
    prediction = predict_modes(scenario, parse_modes(args.modes), load_calibration(args.calibration))
    if args.format == "markdown":
        return tables.render(summary_rows(prediction), "markdown", SUMMARY_COLUMNS) + "\n" + SPEEDUP_LEGEND + "\n"
    if args.format == "wide":
        return tables.render(wide_rows(prediction), "markdown", PREDICT_COLUMNS)
    return tables.render(prediction.rows(), args.format)


def _bound(row: dict) -> str:
    """What limits the iteration: the compute where the communication hides (at most recommend's share of the
    iteration left exposed, as `recommend` counts it), else what dominates the communication."""
    exposed = row["exposed_comm_s"] + row["codec_s"]
    if row["comm_total_s"] <= 0:
        return "compute-bound (no comm)"
    if exposed <= HIDDEN_SHARE * row["iteration_s"]:
        return "compute-bound (comm hidden)"
    return row["regime"]


def summary_rows(prediction: Prediction) -> list[dict]:
    """The default table's cells, as text: mode, codec, width, iteration, speedup over sync, what bounds it."""
    s = prediction.scenario
    codec = s.compression + (" + feedback" if s.error_feedback and s.compression != "none" else "")
    rows = prediction.rows()
    longest = max(row["iteration_s"] for row in rows)  # one unit down the column, so that it reads at a glance
    return [{"mode": row["mode"], "codec": codec, "width": WIDTH_OF.get(row["mode"], str(s.width)),
             "iteration": format_time(row["iteration_s"], like=longest),
             "vs sync": "-" if math.isnan(row["speedup_vs_sync"]) else f"{format_number(row['speedup_vs_sync'], 3)}x",
             "bound": _bound(row)} for row in rows]


def wide_rows(prediction: Prediction) -> list[dict]:
    """Every column of ``PREDICT_COLUMNS``, times with their unit (``120 ms``), other numbers in plain decimals."""
    rows = []
    for row in prediction.rows():
        rows.append({key: format_time(value) if key.endswith("_s") and key != "throughput_it_s"
                     and isinstance(value, float) else value for key, value in row.items()})
    return rows
