"""Reading the metrics a run wrote back into its records: one run = ``FILE.jsonl`` or its ``FILE.rankN.jsonl``
files (named by ``timing_model.run_metrics``, written by ``pipesgd.train.metrics``).

Benchmarks and notebooks use this to turn step records into per-step figures. How a step's records reduce over
ranks depends on what is asked: the iteration time (``iteration_s``) by the rule of ``timing_model.run_metrics``
(the mean over ranks in lockstep, the slowest worker's mean for asynchronous workers); what gates a synchronous
step (compute, update): the slowest rank, ``over_ranks=max`` (the default); totals (CPU seconds of all
processes): ``over_ranks=sum``.
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field

from timing_model.run_metrics import ASYNC_MODES, iteration_over_ranks, metrics_files, slowest_rank, t_iter_by_rank


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
