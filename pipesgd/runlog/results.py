"""Reading the metrics a run wrote: one run = ``FILE.jsonl`` or its ``FILE.rankN.jsonl`` files
(named by ``pipesgd.runlog.run_files``, written by ``pipesgd.train.metrics``).

Benchmarks and notebooks use this to turn step records into per-step figures. How a step's records reduce over
ranks depends on what is asked:

- the iteration time (``iteration_s``, ``iteration_over_ranks``): the **mean over ranks** of t_iter. In lockstep
  training (sync, ddp, pipe, ps-sync) every rank's step times add up to the same wall-clock, so a step's mean over
  ranks is its period. The per-step maximum adds each step's jitter instead (the rank that absorbed this step's
  wait is another rank next step): on the comparison grid it overstated iteration times by 5-25 % (issue 14).
  Asynchronous workers (ps-async) are not in lockstep: a worker beside a co-located server steps up to ~10x
  faster than the remote ones and finishes its steps early, so a step's ranks ran at different times. There the
  **slowest worker's mean** t_iter (``slowest_rank``, ``pace_s``): that worker ends the job (every worker runs the
  same steps), so its mean is the job's time per step. Not the median: its steps while the co-located worker
  trains are slower than after, and the median picks one phase (LeNet: 20 vs 12 ms). Not the per-step maximum
  over ranks: that adds each rank's jitter at unrelated times (+5 to +23 % on the comparison grid, issue 14).
- what gates a synchronous step (compute, update): the slowest rank, ``over_ranks=max`` (the default).
- totals (CPU seconds of all processes): ``over_ranks=sum``.
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field

from pipesgd.runlog.run_files import metrics_files

ASYNC_MODES = ("ps-async",)  # modes whose workers do not step in lockstep


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


@dataclass(slots=True)
class Run:
    """All records of one run, by type."""

    path: str
    config: dict = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    def per_step(self, key: str, skip: int = 0, over_ranks=max) -> list[float]:
        """``key`` of every step from ``skip`` on, reduced over ranks by ``over_ranks``: ``max`` (default, the
        slowest rank) or ``sum`` (e.g. the CPU seconds all ranks used). A step a resumed run wrote twice
        counts its last record per rank."""
        by_step: dict[int, dict] = {}
        for record in self.steps:
            value = record.get(key)
            if record["step"] >= skip and value is not None:
                by_step.setdefault(record["step"], {})[record.get("rank")] = float(value)
        return [over_ranks(by_step[s].values()) for s in sorted(by_step)]

    def median(self, key: str, skip: int = 0, over_ranks=max) -> float:
        """Median over the steps from ``skip`` on of ``key`` reduced over ranks by ``over_ranks``."""
        values = self.per_step(key, skip, over_ranks)
        if not values:
            raise ValueError(f"{self.path}: no step records with {key!r} after step {skip}")
        return statistics.median(values)

    def iteration_s(self, skip: int = 0) -> float:
        """The run's iteration time: median over the steps from ``skip`` on of the mean over ranks of t_iter, or for
        asynchronous workers the job's pace (``pace_s``; the module docstring says why)."""
        if self.config.get("mode") in ASYNC_MODES:
            return self.pace_s(skip)
        return self.median("t_iter", skip, over_ranks=iteration_over_ranks(self.config.get("mode")))

    def pace_s(self, skip: int = 0) -> float:
        """The slowest worker's mean t_iter over its steps from ``skip`` on: the job's wall-clock time per step."""
        by_rank = t_iter_by_rank(self.steps, skip)
        if not by_rank:
            raise ValueError(f"{self.path}: no step records with 't_iter' after step {skip}")
        return statistics.fmean(by_rank[slowest_rank(self.steps, skip)].values())

    @property
    def final_accuracy(self) -> float | None:
        if self.summary.get("accuracy") is not None:
            return float(self.summary["accuracy"])
        return float(self.evals[-1]["accuracy"]) if self.evals else None


def load_run(path: str) -> Run:
    """Read every record of the run written to ``--metrics path``."""
    files = metrics_files(path)
    if not files:
        raise FileNotFoundError(f"no metrics at {path!r} (nor {os.path.splitext(path)[0]}.rankN files)")
    run = Run(path)
    for name in files:
        with open(name) as handle:
            for line in handle:
                if not line.strip():
                    continue
                record = json.loads(line)
                kind = record.get("type")
                if kind == "step":
                    run.steps.append(record)
                elif kind == "eval":
                    run.evals.append(record)
                elif kind == "config":
                    run.config = record
                elif kind == "summary":
                    run.summary = record
    return run
