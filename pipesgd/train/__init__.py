"""The trainer behind ``pipesgd-train``: config, data, models, the loop, metrics, checkpoints and the CLI.

Launch with ``torchrun --nproc-per-node N -m pipesgd.train [flags]`` or alone (world size 1); see
``pipesgd-train --help``.
"""
from pipesgd.train.config import ConfigError, TrainConfig
from pipesgd.train.flags import resolve
from pipesgd.train.models import MODELS, build_model

__all__ = ["TrainConfig", "ConfigError", "resolve", "MODELS", "build_model", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the trainer's command line (``pipesgd-train``)."""
    from pipesgd.train.cli import main as cli_main

    return cli_main(argv)
