"""``pipesgd-timing validate``: predicted against measured iteration time of real ``pipesgd-train`` runs."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from .. import tables
from ..calibration import read_calibration
from ..errors import summary_line
from ..validation import read_runs, summarise, validate_runs
from .flags import FORMAT_FLAG

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="predicted vs measured iteration time of real runs")
    p.add_argument("metrics", nargs="+", help="metrics JSONL files of pipesgd-train runs (RUN.jsonl, RUN.rankN.jsonl)")
    p.add_argument("--calibration", required=True, help="calibration JSON written by `calibrate`")
    p.add_argument("--skip", type=int, default=3, help="warm-up steps to drop per run (default 3)")
    p.add_argument("--ddp-own-compute", action="store_true",
                   help="predict ddp runs from their own t_compute (which holds DDP's allreduce) instead of the "
                        "compute of an uncompressed sync run of the same configuration in the same folder")
    p.add_argument("--format", **FORMAT_FLAG)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> str:
    if args.skip < 0:
        raise ValueError("--skip must be >= 0")
    calibration = read_calibration(args.calibration)
    checks = validate_runs(read_runs(args.metrics, args.skip), calibration, pair_ddp=not args.ddp_own_compute)
    rows = [asdict(c) for c in checks]
    summary = summarise(checks)
    if args.format == "json":
        return json.dumps({"runs": rows, "summary": summary}, indent=2) + "\n"
    if args.format == "csv":
        extra = [{"run": "(median |error|)", "error": summary["median_abs_error"]},
                 {"run": "(max |error|)", "error": summary["max_abs_error"]},
                 {"run": "(signed mean error)", "error": summary["signed_mean_error"]}]
        return tables.render(rows + extra, "csv")
    return (tables.render(rows, "markdown", title="Predicted vs measured median iteration time")
            + "\n" + summary_line(summary) + "\n")
