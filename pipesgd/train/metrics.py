"""What one run writes: the JSONL records (config, step, eval, summary), the config copies and the summary text.

One JSON object per line, flushed per line; per-rank files named by ``timing_model.run_metrics``. The layout and
every field: docs/training.md, "Metrics". Without ``--resume`` a run refuses a metrics file that exists
(``outputs``): a second run appended would mix two runs' records."""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field, fields
from typing import IO, Any

from pipesgd.accounting import StepStats
from pipesgd.defaults import resolve_lookahead_standin
from timing_model.run_metrics import metrics_path

from .checkpoint import Position
from .config import TrainConfig

STEP_FIELDS = ("step", "epoch", "rank", "mode", "loss", "t_iter", "t_compute", "t_wait", "t_update",
               "bytes_sent", "wall", "applied_step", "compression_ratio", "residual_norm", "t_comm_busy")
EVAL_FIELDS = ("step", "epoch", "accuracy", "loss", "wall")
# The per-iteration times the summary averages (means of the measured steps).
SUMMARY_TIMES = ("t_iter", "t_compute", "t_wait", "t_update", "t_comm_busy")


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null so every line parses with a strict reader."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass(frozen=True, slots=True)
class StepTimes:
    """What the loop measured around one iteration; the wrapper's own times come in its ``StepStats``."""

    t_iter_s: float  # the whole iteration: the previous step's end to this one's, evaluation and checkpoints left out
    t_compute_s: float  # forward + backward (DDP's allreduce included: it runs inside backward)
    t_data_s: float  # fetching the batch and moving it to the device
    t_cpu_s: float  # CPU seconds of this process over t_iter's span, all threads

    def as_metrics(self) -> dict:
        """Under the metrics' field names (unit suffix dropped, as ``StepStats.as_metrics``)."""
        return {f.name.removesuffix("_s"): getattr(self, f.name) for f in fields(self)}


class MetricsWriter:
    """Appends records to this rank's JSONL file; a writer without a path writes nothing anywhere.

    Record types: ``config`` (first line), ``step``, ``eval`` and ``summary`` (the end-of-run figures printed on
    rank 0); times in seconds, ``wall`` since start. Their fields: docs/training.md, "Metrics"."""

    def __init__(self, path: str, rank: int, world_size: int, start_time: float | None = None):
        self.path = metrics_path(path, rank, world_size) if path else ""
        self.start_time = time.perf_counter() if start_time is None else start_time
        self._file: IO[str] | None = None
        if self.path:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            # Append: a resumed run continues the same file after the records of the interrupted one.
            self._file = open(self.path, "a", buffering=1)

    def wall(self) -> float:
        return time.perf_counter() - self.start_time

    def write(self, record_type: str, **fields: Any) -> dict:
        record = {"type": record_type, **{k: _clean(v) for k, v in fields.items()}}
        record.setdefault("wall", self.wall())
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        return record

    def write_config(self, cfg: TrainConfig, **facts: Any) -> dict:
        """The run's first record: the resolved config as used, plus ``facts`` (world size, model size, ...)."""
        # width and backend as used (sync/ddp/ps run at width 1; the backend defaults by device)
        return self.write("config", **{**cfg.to_dict(), "width": cfg.effective_width,
                                       "backend": cfg.resolved_backend, **facts})

    def write_step(self, pos: Position, rank: int, mode: str, loss: float, times: StepTimes,
                   stats: StepStats) -> dict:
        """One iteration at ``pos`` (before it advances): the loop's times and the wrapper's stats."""
        return self.write("step", step=pos.step, epoch=pos.epoch, rank=rank, mode=mode, loss=loss,
                          **times.as_metrics(), **stats.as_metrics())

    def write_eval(self, pos: Position, accuracy: float, loss: float, wall: float | None = None,
                   deferred: bool = False) -> dict:
        """An evaluation at ``pos``; ``wall``: the clock of its weights when not now (a copy evaluated after training,
        ``deferred``, or the final weights of a run with such copies)."""
        clock = {} if wall is None else {"wall": wall}
        return self.write("eval", step=pos.step, epoch=pos.epoch, accuracy=accuracy, loss=loss, **clock,
                          **({"deferred": True} if deferred else {}))

    def write_summary(self, summary: dict) -> dict:
        return self.write("summary", **summary)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def config_file_paths(cfg: TrainConfig) -> list[str]:
    """Where the resolved config goes: next to the metrics (``FILE.config.json``) and in the checkpoint directory."""
    paths = []
    if cfg.metrics:
        paths.append(os.path.splitext(cfg.metrics)[0] + ".config.json")
    if cfg.checkpoint:
        paths.append(os.path.join(cfg.checkpoint, "config.json"))
    return paths


def write_config_files(cfg: TrainConfig) -> list[str]:
    """The resolved config as JSON at ``config_file_paths``."""
    paths = config_file_paths(cfg)
    for path in paths:
        cfg.write_json(path)
    return paths


# -- the summary --------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Timings:
    """Per-iteration times kept on the reporting rank for the summary (seconds, by metrics field name)."""

    by_name: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in SUMMARY_TIMES})

    def add(self, step_record: dict) -> None:
        for name, values in self.by_name.items():
            values.append(step_record[name])

    def mean(self, name: str) -> float:
        values = self.by_name[name]
        return sum(values) / len(values) if values else 0.0

    def __len__(self) -> int:
        return len(self.by_name["t_iter"])


def summarize(cfg: TrainConfig, timings: Timings, pos: Position, accuracy: float, eval_loss: float,
              world_size: int, num_workers: int) -> dict:
    """The end-of-run figures: accuracy, iterations/s and where an iteration's time went (means, seconds)."""
    n = len(timings)
    t_iter, t_compute = timings.mean("t_iter"), timings.mean("t_compute")
    t_wait, t_update = timings.mean("t_wait"), timings.mean("t_update")
    cores, local_ranks = host_share(world_size)
    return {
        "steps": pos.step, "epochs": pos.epoch, "world_size": world_size, "num_workers": num_workers,
        "mode": cfg.mode,
        "accuracy": accuracy, "test_loss": eval_loss, "measured_steps": n, "skipped_steps": pos.step - n,
        "iters_per_s": 1.0 / t_iter if t_iter > 0 else 0.0,
        "t_iter": t_iter, "t_compute": t_compute, "t_wait": t_wait, "t_update": t_update,
        "t_other": max(t_iter - t_compute - t_wait - t_update, 0.0),
        # the exchange's own time per step (t_wait is the part of it the step waited for), and the host it shared
        "t_comm_busy": timings.mean("t_comm_busy"), "cpu_cores": cores, "local_ranks": local_ranks,
    }


def host_share(world_size: int) -> tuple[int, int]:
    """(CPU cores this process may run on, ranks on this machine): more ranks than cores means compute and the
    background exchange take turns on the same cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return cores, int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


def pipe_staleness(cfg: TrainConfig) -> str:
    """", staleness lookahead" where a pipeline has stale gradients to treat (width >= 2), else ""; with a shared
    stand-in ", staleness lookahead (coarse-lowrank stand-in)"."""
    if cfg.mode != "pipe" or cfg.effective_width == 1:
        return ""
    standin = resolve_lookahead_standin(cfg.lookahead_standin, [cfg.optimizer])  # "auto": by the optimizer
    note = f" ({standin} stand-in)" if standin != "local" else ""
    return f", staleness {cfg.staleness}{note}"
