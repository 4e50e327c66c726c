"""How a run's metrics files are named per rank and how a step's records reduce over ranks: what the trainer's
writer, ``experiments.harness.results`` and ``timing_model.validation`` all read, so that neither can drift.

One run = ``FILE.jsonl`` for one process or its ``FILE.rankN.jsonl`` files. The iteration time of a step is the
**mean over ranks** of t_iter in lockstep training (sync, ddp, pipe, ps-sync): every rank's step times add up to
the same wall-clock, while the per-step maximum adds each step's jitter (the rank that absorbed this step's wait is
another rank next step). Asynchronous workers (ps-async) are not in lockstep: there the **slowest worker's mean**
t_iter (``slowest_rank``), since that worker ends the job. Not its median (its steps beside a co-located server are
slower than after, and the median picks one phase) nor the per-step maximum (each rank's jitter at unrelated
times). The measured comparison is in experiments/results/comparison.
"""
from __future__ import annotations

import glob
import os
import re
import statistics

__all__ = ["ASYNC_MODES", "iteration_over_ranks", "t_iter_by_rank", "slowest_rank", "metrics_path", "run_name",
           "rank_of", "metrics_files"]

ASYNC_MODES = ("ps-async",)  # modes whose workers do not step in lockstep

_RANK_SUFFIX = re.compile(r"\.rank(\d+)(?=\.[^.]*$|$)")


def iteration_over_ranks(mode: str | None):
    """How one step's t_iter reduces over ranks for the run's iteration time (module docstring); asynchronous
    modes take one rank instead (``slowest_rank``), so this is only their fallback."""
    return max if mode in ASYNC_MODES else statistics.fmean


def t_iter_by_rank(steps: list[dict], first: int) -> dict:
    """rank -> step -> t_iter of the steps from ``first`` on; a step a resumed run wrote twice counts its last record."""
    out: dict = {}
    for record in steps:
        if isinstance(record.get("step"), int) and record["step"] >= first and record.get("t_iter") is not None:
            out.setdefault(record.get("rank"), {})[record["step"]] = float(record["t_iter"])
    return out


def slowest_rank(steps: list[dict], first: int = 0):
    """The rank whose steps from ``first`` on took longest in all (the worker that ends an asynchronous job);
    None without such steps."""
    by_rank = t_iter_by_rank(steps, first)
    return max(by_rank, key=lambda rank: sum(by_rank[rank].values())) if by_rank else None


def metrics_path(path: str, rank: int, world_size: int) -> str:
    """``FILE.jsonl`` for a single process, ``FILE.rankN.jsonl`` for rank N of several."""
    if world_size == 1:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext or '.jsonl'}"


def run_name(path: str) -> str:
    """A metrics file's run: its path without ``.rankN`` (``FILE.rank2.jsonl`` -> ``FILE.jsonl``)."""
    return _RANK_SUFFIX.sub("", path)


def rank_of(path: str) -> int | None:
    """N of a ``FILE.rankN.jsonl`` path; None for a single-process file."""
    match = _RANK_SUFFIX.search(path)
    return int(match.group(1)) if match else None


def metrics_files(path: str) -> list[str]:
    """The files of the run written to ``--metrics path``: ``path`` itself if it exists, else its
    ``.rankN`` siblings in rank order."""
    if os.path.exists(path):
        return [path]
    stem, ext = os.path.splitext(path)
    files = [f for f in glob.glob(f"{glob.escape(stem)}.rank*{ext}") if run_name(f) == path]
    return sorted(files, key=lambda f: rank_of(f) or 0)
