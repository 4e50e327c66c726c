"""``python -m pipesgd.cluster.pin CORES -- COMMAND ...``: run COMMAND on the listed cores only (see ``cores``).

Sets this process's CPU affinity, then execs COMMAND, so COMMAND and everything it starts inherit the pin.
A bad core list or a command that cannot start is one line on stderr and exit 2 / 127.
"""
from __future__ import annotations

import os
import sys

from .cores import parse_cores

USAGE = "usage: python -m pipesgd.cluster.pin CORES -- COMMAND [ARGS...]   (CORES like 0-3,6)"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print(f"pipesgd.cluster.pin: {USAGE}", file=sys.stderr)
        return 2
    try:
        os.sched_setaffinity(0, parse_cores(args[0]))
    except (ValueError, OSError) as err:
        print(f"pipesgd.cluster.pin: cannot pin to {args[0]!r}: {err}", file=sys.stderr)
        return 2
    command = args[2:]
    try:
        os.execvp(command[0], command)
    except OSError as err:
        print(f"pipesgd.cluster.pin: cannot start {command[0]!r}: {err.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached: execvp replaced this process


if __name__ == "__main__":
    sys.exit(main())
