"""``pipesgd-timing sweep``: Pipe-SGD's speedup over each baseline and the winning mode over a grid of scenarios."""
from __future__ import annotations

import argparse
import copy
import itertools

from .. import tables
from ..predict import Scenario
from ..units import parse_list
from .flags import (FORMAT_FLAG, SCENARIO_FLAGS, SWEEPABLE, add_scenario_flags, help_formatter, load_calibration,
                    parse_flag, parse_modes, predict_modes, scenario_fields)

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="Pipe-SGD speedup tables and the winning mode over a grid",
                       formatter_class=help_formatter, usage="%(prog)s --nodes N,... --bandwidth RATE,... [...]",
                       description="Pipe-SGD's speedup over each baseline and the winning mode over a grid: give "
                                   "comma lists, e.g. --nodes 2,4,8 --bandwidth 1gbit,10gbit.")
    add_scenario_flags(p, sweep=True)
    p.add_argument("--format", **FORMAT_FLAG)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> str:
    # Step 1: split every sweepable flag into its values; the first value of each goes into the base scenario.
    raw = {flag: parse_list(getattr(args, flag)) for flag in SWEEPABLE if getattr(args, flag, None) is not None}
    first = copy.copy(args)
    for flag, values in raw.items():
        setattr(first, flag, values[0])
    base = Scenario.of(**scenario_fields(first))
    axes = {flag: values for flag, values in raw.items() if len(values) > 1}
    parsed = {flag: [parse_flag(flag, v) for v in values] for flag, values in axes.items()}
    modes = parse_modes(args.modes)
    calibration = load_calibration(args.calibration)
    # Step 2: predict every grid point.
    rows = []
    for combo in itertools.product(*(range(len(v)) for v in axes.values())):
        changes = {SCENARIO_FLAGS[flag][0]: parsed[flag][i] for flag, i in zip(axes, combo)}
        prediction = predict_modes(base.with_changes(**changes), modes, calibration)
        row = {flag.replace("_", "-"): axes[flag][i] for flag, i in zip(axes, combo)}
        for res in prediction.results:
            row[f"{res.mode}_s"] = res.iteration_s
        if "pipe" in modes:
            for other in modes:
                if other != "pipe":
                    row[f"pipe_vs_{other}"] = prediction.speedup("pipe", other)
        row["winner"] = prediction.winner()
        rows.append(row)
    if args.format != "markdown":
        return tables.render(rows, args.format)
    # Step 3: markdown: the speedup table, then the "which mode wins here" map.
    keys = [k.replace("_", "-") for k in axes]
    speed_cols = keys + [k for k in rows[0] if k.startswith("pipe_vs_")]
    out = tables.render(rows, "markdown", speed_cols, "Pipe-SGD speedup over each baseline (>1: Pipe-SGD faster)")
    if len(keys) == 2:
        first_key, second_key = keys
        columns = list(dict.fromkeys(r[second_key] for r in rows))
        pivot = {}
        for r in rows:
            pivot.setdefault(r[first_key], {first_key: r[first_key]})[f"{second_key}={r[second_key]}"] = r["winner"]
        win_cols = [first_key] + [f"{second_key}={c}" for c in columns]
        out += "\n" + tables.render(list(pivot.values()), "markdown", win_cols, "Which mode wins here")
    else:
        out += "\n" + tables.render(rows, "markdown", keys + ["winner"], "Which mode wins here")
    if "allreduce" in keys and "pipe" in modes:
        out += "\n" + _allreduce_table(rows, [k for k in keys if k != "allreduce"])
    return out


def _allreduce_table(rows: list[dict], others: list[str]) -> str:
    """Pipe-SGD's iteration with each swept all-reduce side by side, per point of the other axes, and the faster."""
    points: dict[tuple, dict] = {}
    for r in rows:
        point = points.setdefault(tuple(r[k] for k in others), {k: r[k] for k in others})
        point[f"pipe ms, {r['allreduce']}"] = r["pipe_s"] * 1e3
        best = point.get("faster")
        if best is None or r["pipe_s"] * 1e3 < point[f"pipe ms, {best}"]:
            point["faster"] = r["allreduce"]
    columns = others + list(dict.fromkeys(f"pipe ms, {r['allreduce']}" for r in rows)) + ["faster"]
    return tables.render(list(points.values()), "markdown", columns, "Pipe-SGD's iteration with each all-reduce")
