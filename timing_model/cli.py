"""``pipesgd-timing``: predict, sweep, calibrate, validate. Builds the parser from one module per sub-command
(``timing_model.commands``), runs the chosen one and prints what it returns.

Bad input never shows a traceback: one line ``pipesgd-timing: error: ...`` on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

from .commands import calibrate, predict, sweep, validate
from .commands.flags import Parser, UsageError

__all__ = ["PROG", "EXIT_USAGE", "build_parser", "main"]

PROG = "pipesgd-timing"
EXIT_USAGE = 2
SUBCOMMANDS = (predict, sweep, calibrate, validate)  # each: add_parser(sub) and run(args) -> str | exit code


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Pipe-SGD timing model: predict, sweep, calibrate, validate.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in SUBCOMMANDS:
        command.add_parser(sub)
    return parser


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--bandwidth -1gbit`` → ``--bandwidth=-1gbit`` so a negative value reaches its parser (and its
    clear error) instead of argparse's "expected one argument"."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.match(r"^-[\d.]", token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``pipesgd-timing`` and ``python -m timing_model``."""
    try:
        args = build_parser().parse_args(_join_negative_values(sys.argv[1:] if argv is None else list(argv)))
        output = args.run(args)
    except (UsageError, ValueError, OSError, KeyError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if isinstance(err, KeyError):
            message = f"missing field {message}"
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(output, int):
        return output
    try:
        sys.stdout.write(output)
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
