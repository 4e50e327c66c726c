"""The ``pipesgd-timing`` console script: the timing model's command line (``timing_model.cli``) with ``calibrate``,
which measures this cluster with torch (``calibrate_command``), in the place the pure model leaves for it."""
from __future__ import annotations

from timing_model.cli import SUBCOMMANDS, main as model_main
from timing_model.commands import measured_elsewhere

from pipesgd.measure import calibrate_command

__all__ = ["COMMANDS", "main"]

COMMANDS = tuple(calibrate_command if command is measured_elsewhere else command for command in SUBCOMMANDS)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``pipesgd-timing`` and ``python -m pipesgd.measure`` (``torchrun ... -m pipesgd.measure``)."""
    return model_main(argv, COMMANDS)
