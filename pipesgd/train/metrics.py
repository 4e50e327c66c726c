"""JSONL metrics: one JSON object per line, flushed per line, read directly by ``pandas.read_json(lines=True)``.

File layout: with world size 1 the records go to ``FILE.jsonl`` itself; with world size > 1 each rank
writes ``FILE.rankN.jsonl`` (its own step records), and the reporting rank also writes the ``config``,
``eval`` and ``summary`` records into its file. The reporting rank is worker 0: global rank 0, except
with dedicated parameter servers (``--servers N``: ranks 0..N-1 serve, rank N reports). Record types (times in seconds, ``wall`` = seconds since start):

- ``config``: world_size, mode, width, compression, model, params, grad_bytes, batch_size, ... (first line)
- ``step``: step, epoch, rank, mode, loss, t_iter, t_compute, t_wait, t_update, bytes_sent, wall,
  applied_step, compression_ratio, residual_norm, t_comm_busy, skipped_nonfinite, t_data (batch loading),
  t_cpu (CPU seconds this process used during the step, all its threads: compute, the communication
  thread, the backend's threads; with t_iter it shows whether the cores, rather than the links, set the pace)
- ``eval``: step, epoch, accuracy, loss, wall
- ``summary``: the end-of-run figures printed on rank 0

A resumed run (``--resume``) appends to the same files: a new ``config`` record with ``resumed_at_step``,
then the steps from there on; readers keep the last record of each step.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import IO, Any

STEP_FIELDS = ("step", "epoch", "rank", "mode", "loss", "t_iter", "t_compute", "t_wait", "t_update",
               "bytes_sent", "wall", "applied_step", "compression_ratio", "residual_norm", "t_comm_busy")
EVAL_FIELDS = ("step", "epoch", "accuracy", "loss", "wall")


def rank_path(path: str, rank: int, world_size: int) -> str:
    """``FILE.jsonl`` for a single process, ``FILE.rankN.jsonl`` for rank N of several."""
    if world_size == 1:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext or '.jsonl'}"


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null so every line parses with a strict reader."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends records to this rank's JSONL file; a writer without a path does nothing."""

    def __init__(self, path: str, rank: int, world_size: int, start_time: float | None = None):
        self.path = rank_path(path, rank, world_size) if path else ""
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

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
