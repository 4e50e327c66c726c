"""``python -m timing_model calibrate``: calibration measures with torch, so it lives on the ``pipesgd`` side
(``pipesgd.measure.calibrate_command``); here the sub-command only says, in one line, where to run it."""
from __future__ import annotations

import argparse

from ..cli_conventions import UsageError

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="micro-benchmark this cluster: run `pipesgd-timing calibrate` (needs torch)",
                       add_help=False)
    p.set_defaults(run=run, any_flags=True)  # every calibrate flag gets this one line, not "unrecognized"


def run(args: argparse.Namespace) -> str:
    raise UsageError("calibrate measures with torch: run `pipesgd-timing calibrate` "
                     "(or `torchrun ... -m pipesgd.measure calibrate`)")
