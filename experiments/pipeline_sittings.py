"""Several sittings of ``bench_pipeline.py`` per setting, summarised: each setting's Pipe-SGD iteration and
efficiency per workload and variant (mean and range over its sittings), and the first setting's iteration over each
other's, as the ratio of the means and within each sitting. Runs nothing.

    python experiments/pipeline_sittings.py experiments/results/bench_pipeline/exchange_vs_ring/*.json

A file named ``NAME-sK.json`` (``bench_pipeline.py --label NAME-sK``) is sitting K of setting NAME; settings are
ordered by their first file on the command line, and sittings pair up by K (run one after the other, the order
turned each time). Prints a markdown table; with ``--out`` also writes it, provenance first.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.one_line import OneLineParser
from experiments.harness.provenance import markdown_header, provenance
from timing_model.atomic import write_text_atomic

_SITTING = re.compile(r"^(?P<name>.+)-s(?P<k>\d+)\.json$")


def read_sittings(paths: list[str]) -> dict[str, dict[int, list[dict]]]:
    """{setting: {sitting: records}}; ValueError for a file not named NAME-sK.json or without records."""
    settings: dict[str, dict[int, list[dict]]] = {}
    for path in paths:
        match = _SITTING.match(os.path.basename(path))
        if match is None:
            raise ValueError(f"{path}: not named NAME-sK.json (bench_pipeline.py --label NAME-sK)")
        with open(path) as f:
            records = json.load(f).get("records")
        if not records:
            raise ValueError(f"{path}: no records (not a bench_pipeline.py result?)")
        settings.setdefault(match["name"], {})[int(match["k"])] = records
    return settings


def _spread(values: list[float], digits: int) -> str:
    return f"{statistics.fmean(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def summary(settings: dict[str, dict[int, list[dict]]]) -> str:
    """The markdown table of the module doc."""
    names = list(settings)
    by_key: dict[tuple[str, str], dict[str, dict[int, dict]]] = {}
    for name in names:
        for k, records in settings[name].items():
            for record in records:
                by_key.setdefault((record["workload"], record["variant"]), {}).setdefault(name, {})[k] = record
    first, others = names[0], names[1:]
    head = ["workload", "variant"] + [f"{n}: iteration ms, efficiency (sittings)" for n in names]
    head += [f"{first} / {n}: means, per sitting" for n in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (workload, variant), per_name in by_key.items():
        cells = [workload, variant]
        for name in names:
            sittings = per_name.get(name, {})
            if not sittings:
                cells.append("-")
                continue
            iterations = [r["t_iter"] * 1e3 for r in sittings.values()]
            cells.append(f"{_spread(iterations, 1)}, {_spread([r['efficiency'] for r in sittings.values()], 2)} "
                         f"({len(sittings)})")
        for name in others:
            a, b = per_name.get(first, {}), per_name.get(name, {})
            paired = sorted(set(a) & set(b))
            if not paired:
                cells.append("-")
                continue
            ratios = [a[k]["t_iter"] / b[k]["t_iter"] for k in paired]
            means = [statistics.fmean(r["t_iter"] for r in side.values()) for side in (a, b)]
            cells.append(f"{means[0] / means[1]:.2f}, {min(ratios):.2f}-{max(ratios):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="pipeline_sittings", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="bench_pipeline.py result files named NAME-sK.json")
    parser.add_argument("--out", help="also write the table here (markdown, provenance first)")
    args = parser.parse_args(argv)
    try:
        settings = read_sittings(args.results)
    except (OSError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        parser.error(str(error))
    table = summary(settings)
    print(table)
    if args.out:
        title = "Pipe-SGD iterations over sittings: " + ", ".join(settings)
        write_text_atomic(args.out, markdown_header(title, provenance()) + "\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
