"""``pipesgd-timing predict``: iteration time and its breakdown for every mode of one scenario."""
from __future__ import annotations

import argparse

from .. import tables
from ..predict import Scenario
from .flags import (FORMAT_FLAG, SWEEPABLE, add_scenario_flags, help_formatter, load_calibration, parse_modes,
                    predict_modes, scenario_fields)

__all__ = ["PREDICT_COLUMNS", "USAGE", "DESCRIPTION", "add_parser", "run"]

USAGE = "%(prog)s --nodes N --bandwidth RATE --params COUNT [...]"
DESCRIPTION = ("How long one training step takes on your cluster with each way of averaging gradients (parameter "
               "server, synchronous all-reduce, PyTorch DDP, Pipe-SGD), and how much faster each is. Without "
               "--calibration it is the plain analytic model (docs/timing-model.md).")

# markdown columns, in reading order (csv and json carry every field of ModeResult)
PREDICT_COLUMNS = ["mode", "iteration_s", "compute_s", "straggler_s", "interference_s", "update_s",
                   "handoff_s", "buffers_s", "host_s", "lockstep_s", "server_s", "exposed_comm_s", "codec_s",
                   "hidden_comm_s", "throughput_it_s", "speedup_vs_sync", "speedup_vs_one", "staleness", "regime",
                   "allreduce"]


def add_parser(sub) -> None:
    p = sub.add_parser("predict", help="iteration time and breakdown of every mode", formatter_class=help_formatter,
                       usage=USAGE, description=DESCRIPTION)
    add_scenario_flags(p, sweep=False)
    p.add_argument("--format", **FORMAT_FLAG)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> str:
    for flag in SWEEPABLE:
        value = getattr(args, flag, None)
        if value is not None and "," in value:
            raise ValueError(f"--{flag.replace('_', '-')} {value!r}: predict takes one value; use `sweep` for lists")
    scenario = Scenario.of(**scenario_fields(args))
    prediction = predict_modes(scenario, parse_modes(args.modes), load_calibration(args.calibration))
    rows = prediction.rows()
    if args.format == "markdown":
        return tables.render(rows, "markdown", PREDICT_COLUMNS)
    return tables.render(rows, args.format)
