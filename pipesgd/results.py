"""Reading the metrics a run wrote: one run = ``FILE.jsonl`` or its ``FILE.rankN.jsonl`` files
(named by ``pipesgd.run_files``, written by ``pipesgd.train.metrics``).

Benchmarks and notebooks use this to turn step records into per-step figures where each step counts its
slowest rank (a synchronous iteration is as slow as its slowest worker).
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field

from pipesgd.run_files import metrics_files


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

    def median(self, key: str, skip: int = 0) -> float:
        values = self.per_step(key, skip)
        if not values:
            raise ValueError(f"{self.path}: no step records with {key!r} after step {skip}")
        return statistics.median(values)

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
