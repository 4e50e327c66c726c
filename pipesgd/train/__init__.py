"""The trainer behind ``pipesgd-train``: config, data, models, the loop, metrics, checkpoints and the CLI.

Launch with ``torchrun --nproc-per-node N -m pipesgd.train [flags]`` or alone (world size 1); see
``pipesgd-train --help``.
"""
from importlib import import_module

__all__ = ["TrainConfig", "ConfigError", "resolve", "MODELS", "build_model", "main", "entry"]

# Each public name and the module that defines it, imported on first use (PEP 562), so that the flags and
# ``--help`` load no torch.
_EXPORTS = {"TrainConfig": "pipesgd.train.config", "ConfigError": "pipesgd.train.config",
            "resolve": "pipesgd.train.flags", "MODELS": "pipesgd.train.models", "build_model": "pipesgd.train.models"}


def main(argv: list[str] | None = None) -> int:
    """Run the trainer's command line (``pipesgd-train``)."""
    from pipesgd.train.cli import main as cli_main

    return cli_main(argv)


def entry() -> None:
    """The ``pipesgd-train`` / ``python -m pipesgd.train`` entry. The flags are resolved first, where no torch
    loads, so ``--help`` and a usage error (exit 2) answer at once; only then does the trainer load and run."""
    import sys
    import traceback

    from timing_model.cli_conventions import EXIT_USAGE, join_negative_values, print_error
    from pipesgd.train.config import ConfigError
    from pipesgd.train.flags import resolve

    argv = join_negative_values(sys.argv[1:])
    try:
        resolve(argv)  # --help prints and exits here
    except ConfigError as exc:
        if "--debug" in argv:
            traceback.print_exc()
        print_error("pipesgd-train", exc)
        sys.exit(EXIT_USAGE)
    from pipesgd.train.cli import entry as run

    run()


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipesgd.train' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
