"""``allreduce="auto"`` measured, not ruled: under ``compression="auto"``, the warm-up steps that run the provisional
codec alternate the two-collective exchange and the ring, and the choice keeps the one whose median exchange time
(the largest of every rank's) was shorter. Neither wins everywhere; where and why the trial runs, and what a switch
costs: docs/auto.md, "Which all-reduce". A named codec keeps the fixed rule (``pipesgd.defaults.resolve_allreduce``)."""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from pipesgd.auto.probes import agreed

ORDER = ("alltoall", "ring")  # the first provisional step runs the rule's choice
MIN_STEPS = 2  # timed steps of each before a verdict (the first of each may hold its buffers' first allocation):
#                5 warm-up steps when step 0 probes or looks (the wrapper has the model), else 6; with fewer
#                no trial runs


class AllreduceTrial:
    """The all-reduce each provisional step runs (``running``) and the exchange times each one saw."""

    def __init__(self) -> None:
        self.running = ORDER[0]
        self.times: dict[str, list[float]] = {name: [] for name in ORDER}

    def record(self, seconds: float) -> None:
        """The exchange time of the step that just ran on ``running``."""
        self.times[self.running].append(seconds)

    def switch(self) -> str:
        """The other all-reduce, for the next step."""
        self.running = ORDER[1] if self.running == ORDER[0] else ORDER[0]
        return self.running

    def verdict(self, group: dist.ProcessGroup | None, device: torch.device) -> tuple[str, dict[str, float]] | None:
        """Every rank's medians agreed (the largest of each, so the same on every rank; every rank must call it):
        the faster all-reduce and the medians, or None where either ran fewer than ``MIN_STEPS`` steps."""
        if min(len(times) for times in self.times.values()) < MIN_STEPS:
            return None
        medians = agreed({f"{name}_s": statistics.median(times) for name, times in self.times.items()}, group,
                         device)
        return min(ORDER, key=lambda name: medians[f"{name}_s"]), medians

    @staticmethod
    def reason(winner: str, medians: dict[str, float]) -> str:
        return (f"all-reduce: {winner} (warm-up medians: exchange {medians['alltoall_s'] * 1e3:.1f} ms, "
                f"ring {medians['ring_s'] * 1e3:.1f} ms)")
