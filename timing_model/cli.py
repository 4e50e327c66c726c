"""``pipesgd-timing``: predict, sweep, recommend, calibrate, validate. Builds the parser from one module per sub-command
(``timing_model.commands``), runs the chosen one and prints what it returns.

Bad input never shows a traceback: one line ``pipesgd-timing: error: ...`` on stderr and exit code 2, before any
measurement starts; a calibration that fails once measuring has begun is one line of the same form and exit code 1
(``timing_model.cli_conventions``).
"""
from __future__ import annotations

import argparse
import os
import sys

from .cli_conventions import (EXIT_FAILURE, EXIT_USAGE, OneLineParser, RunFailure, UsageError, first_line,
                                     join_negative_values, print_error)

from .commands import measured_elsewhere, predict, recommend, sweep, validate

__all__ = ["PROG", "EXIT_USAGE", "SUBCOMMANDS", "build_parser", "main"]

PROG = "pipesgd-timing"
# Each: add_parser(sub) and run(args) -> str | exit code. Without torch, "calibrate" only says where it lives.
SUBCOMMANDS = (predict, sweep, recommend, measured_elsewhere, validate)


def build_parser(commands: tuple = SUBCOMMANDS) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG,
                           description="Pipe-SGD timing model: predict, sweep, recommend, calibrate, validate.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in commands:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None, commands: tuple = SUBCOMMANDS) -> int:
    """Entry point of ``python -m timing_model`` and, with the measuring ``commands``, of ``pipesgd-timing``."""
    try:
        parser = build_parser(commands)
        args, extra = parser.parse_known_args(join_negative_values(sys.argv[1:] if argv is None else list(argv)))
        if extra and not getattr(args, "any_flags", False):  # what parse_args does, unless the command takes any
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        output = args.run(args)
    except RunFailure as err:
        print_error(PROG, err)
        return EXIT_FAILURE
    except (UsageError, ValueError, OSError, KeyError) as err:
        print_error(PROG, f"missing field {first_line(err)}" if isinstance(err, KeyError) else err)
        return EXIT_USAGE
    if isinstance(output, int):
        return output
    try:
        sys.stdout.write(output)
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
