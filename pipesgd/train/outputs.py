"""The files a training run will write, checked before any process group exists (a bad path is one line and exit
code 2 up front), and the rule for a ``--metrics`` file that exists: without ``--resume`` it is refused (a second
run's records would mix into it), with ``--resume`` appended to (readers keep the last record of each step)."""
from __future__ import annotations

import os

from pipesgd.runlog import trace
from pipesgd.runlog.output_paths import check_output_dir, check_output_file
from timing_model.run_metrics import metrics_path

from .config import ConfigError, TrainConfig
from .metrics import config_file_paths

__all__ = ["check_outputs"]


def check_outputs(cfg: TrainConfig, rank: int, world_size: int) -> None:
    """Raise ``ConfigError`` naming the flag when this rank could not write one of the run's files. Every rank
    looks at every rank's metrics file, so all of them refuse alike."""
    try:
        if cfg.metrics:
            check_output_file(metrics_path(cfg.metrics, rank, world_size), "--metrics")
            if not cfg.resume:
                existing = [p for p in (metrics_path(cfg.metrics, r, world_size) for r in range(world_size))
                            if os.path.exists(p)]
                if existing:
                    raise ConfigError(f"--metrics {existing[0]} already exists: choose another file, remove it, or "
                                      "pass --resume to append to it")
        if cfg.checkpoint:
            check_output_dir(cfg.checkpoint, "--checkpoint")
        for path in config_file_paths(cfg):
            check_output_file(path, "the resolved config")
        if cfg.trace:
            check_output_file(trace.trace_path(cfg.trace, rank, world_size), "--trace")
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
