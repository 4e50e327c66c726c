"""Helpers of the one-process layer: a world-size-1 gloo group and a wrapper that records what it is asked.

With world size 1 every collective completes at once, so the trainer's own code (resume agreement,
strategies, ``cli.run``) runs in the test process without spawning anything.
"""
from __future__ import annotations

import pytest
import torch.distributed as dist

from pipesgd.accounting import StepStats


@pytest.fixture
def process_group():
    """A gloo group of one rank over an in-memory store, torn down after the test."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class RecordingWrapper:
    """An OptimizerWrapper that averages nothing: it records each call and reports fixed stats.

    ``step()`` applies the previous step (as width 2 would) with ``t_wait_s`` = 0.25, so records show the
    wrapper's numbers; ``fail_at`` makes that step raise.
    """

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[str] = []
        self.steps = 0
        self.fail_at = fail_at
        self.last_stats: StepStats | None = None
        self.param_groups = [{"lr": 0.1, "params": []}]

    def step(self) -> StepStats:
        self.calls.append("step")
        if self.steps == self.fail_at:
            raise RuntimeError(f"step {self.steps} failed on purpose")
        applied = self.steps - 1 if self.steps > 0 else None
        self.last_stats = StepStats(self.steps, applied, t_wait_s=0.25, t_update_s=0.125, bytes_sent=64)
        self.steps += 1
        return self.last_stats

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.calls.append("zero_grad")

    def flush(self) -> list[StepStats]:
        self.calls.append("flush")
        return [StepStats(self.steps, self.steps - 1)] if self.steps else []

    def close(self) -> None:
        self.calls.append("close")

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.calls.append("load_state_dict")
        self.steps = int(state["steps"])
