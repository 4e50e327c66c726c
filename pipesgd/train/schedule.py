"""The learning rate of each training step: ``--lr-warmup-steps`` of linear warm-up, then ``--lr-schedule``.

A pure function of the step (nanoGPT's ``get_lr``), written into the inner optimizer's groups through the
wrapper's ``param_groups`` once per step: it works in every mode (a dedicated parameter server reads it from the
workers' headers) and a resumed run continues it with nothing saved, where ``LambdaLR`` would count its own steps
and warn on parameter-server workers whose inner optimizer never steps."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FINAL_LR_FRACTION = 0.1  # cosine decays to this fraction of --lr at the last step (nanoGPT's min_lr = lr / 10)


def _constant(progress: float) -> float:
    return 1.0


def _cosine(progress: float) -> float:
    return FINAL_LR_FRACTION + (1.0 - FINAL_LR_FRACTION) * 0.5 * (1.0 + math.cos(math.pi * progress))


# --lr-schedule name -> the fraction of the peak rate at ``progress`` in [0, 1] (warm-up end to last step).
SCHEDULES: dict[str, Callable[[float], float]] = {"constant": _constant, "cosine": _cosine}


@dataclass(frozen=True, slots=True)
class LRSchedule:
    """The learning rate of step s of a run of ``total_steps`` steps (s = 0 .. total_steps - 1).

    Step 1: warm-up, s < warmup_steps: peak_lr * (s + 1) / (warmup_steps + 1), a line that reaches peak_lr at
    s = warmup_steps. Step 2: after it, peak_lr * SCHEDULES[kind](progress), progress rising linearly from 0 at
    s = warmup_steps to 1 at the last step (and staying 1 beyond it: what ``flush()`` applies at the end).
    """

    kind: str
    peak_lr: float
    warmup_steps: int
    total_steps: int

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown learning-rate schedule {self.kind!r} (valid: {', '.join(SCHEDULES)})")
        if self.warmup_steps < 0 or self.total_steps < 1:
            raise ValueError(f"warmup_steps must be >= 0 and total_steps >= 1, got {self.warmup_steps} "
                             f"and {self.total_steps}")

    def lr_at(self, step: int) -> float:
        # Step 1
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / (self.warmup_steps + 1)
        # Step 2
        decay_steps = max(self.total_steps - 1 - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / decay_steps, 1.0)
        return self.peak_lr * SCHEDULES[self.kind](progress)

    def apply(self, param_groups: list[dict[str, Any]], step: int) -> None:
        """Set every group's ``lr`` to step ``step``'s rate."""
        lr = self.lr_at(step)
        for group in param_groups:
            group["lr"] = lr


def build_schedule(kind: str, peak_lr: float, warmup_steps: int, total_steps: int) -> LRSchedule | None:
    """The run's schedule; None for a constant rate without warm-up, which leaves the optimizer's ``lr`` alone
    (the trainer's behaviour before schedules existed, resumed runs included)."""
    if kind == "constant" and warmup_steps == 0:
        return None
    return LRSchedule(kind, peak_lr, warmup_steps, total_steps)
