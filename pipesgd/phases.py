"""The optional parts of a PipeSGD step, each behind a small object with hooks at the step's start and end, so that
``PipeSGD.step()`` reads as the algorithm: hand off, submit, apply what is due.

``StalenessPhase``: look-ahead (the master weights back at the start, the stand-in recorded at the hand-off, its
cost at the end). ``AutoPhase``: ``width``/``compression`` "auto" (an early provisional codec at the start, the
warm-up's choice or a re-check's switch at the end). ``ReplicaPhase``: the bitwise replica check every N steps.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

from pipesgd import auto
from pipesgd.accounting import StepStats
from pipesgd.comm.handles import Work
from pipesgd.defaults import resolve_lookahead_standin
from pipesgd.delay.coarse import CoarseAverage
from pipesgd.delay.lookahead import Lookahead
from pipesgd.delay.pipeline import Pipeline


class StalenessPhase:
    """Look-ahead at width >= 2 (``pipesgd.delay.lookahead``), with the shared stand-in where one is chosen."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor], model_or_params,
                 buckets, topology, device: torch.device, width: int, standin: str, max_grad_norm: float | None,
                 skip_nonfinite: bool, world_size: int) -> None:
        standin = resolve_lookahead_standin(standin, type(optimizer).__mro__)
        # Alone, the own gradient is the average: nothing to share.
        self.coarse = (CoarseAverage(buckets, params, topology, device, width)
                       if standin != "local" and world_size > 1 else None)
        self.lookahead = Lookahead(optimizer, params, width, max_grad_norm, skip_nonfinite=skip_nonfinite)
        self.hooks = self.lookahead.attach(model_or_params)

    def begin(self) -> None:
        """The master weights back before anything is applied to them."""
        self.lookahead.begin_step()

    def hand_off(self, step: int, pipeline: Pipeline, applies: bool, slots: list[torch.Tensor],
                 scale: float | None, run: Callable, job: Callable) -> tuple[Callable, Callable]:
        """Step ``step``'s gradients leave: the due step's stand-in is done with, this step's is recorded while its
        average is in flight (shared: its all-reduce put in front of the job). Returns the (run, job) to submit."""
        if applies and len(pipeline):
            self.lookahead.discard(pipeline.entries()[0].step)
        if pipeline.depth(step) > 1:
            shared: Work | None = None
            if self.coarse is not None:
                run, job, shared = self.coarse.wrap(run, job)
            self.lookahead.record(step, slots, scale, shared=shared)
        return run, job

    def end(self, stats: StepStats) -> None:
        stats.t_lookahead_s, waited, in_forward = self.lookahead.end_step()
        stats.t_wait_s += waited  # for a shared stand-in, mostly in the last forward pass
        stats.t_standin_wait_s = in_forward if self.coarse is not None else None

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()

    @property
    def memory_bytes(self) -> int:
        return self.lookahead.memory_bytes + (self.coarse.memory_bytes if self.coarse is not None else 0)


class AutoPhase:
    """``width``/``compression`` "auto": the warm-up times itself and its last step chooses (``pipesgd.auto``).
    ``use(choice, stats)`` is the wrapper's switch to a choice."""

    def __init__(self, chooser: auto.AutoConfig, use: Callable[[dict, StepStats | None], None]) -> None:
        self.chooser, self._use = chooser, use
        self._early: dict | None = None
        self._seconds = 0.0

    def begin(self, step: int) -> None:
        start = time.perf_counter()
        self._early = self.chooser.begin(step)
        if self._early is not None:  # a clearly slow link: this step's own exchange runs the provisional codec
            self._use(self._early, None)
        self._seconds = time.perf_counter() - start

    def end(self, step: int, stats: StepStats) -> None:
        start = time.perf_counter()
        stats.auto_choice = auto.describe(self._early) if self._early is not None else None
        applied = stats.applied_step is not None  # the exchange's and the optimizer's times only then
        choice = self.chooser.end(step, stats.t_comm_busy_s if applied else None,
                                  stats.t_wait_s, stats.t_update_s if applied else None)
        if choice is not None:
            self._use(choice, stats)
            self.chooser.switched()
        stats.t_auto_s = self._seconds + time.perf_counter() - start


class ReplicaPhase:
    """Every ``every`` steps, the bitwise replica check (``check()`` raises ``ReplicaDivergenceError``)."""

    def __init__(self, every: int, check: Callable[[], None]) -> None:
        self.every, self._check = every, check

    def end(self, steps_done: int, stats: StepStats) -> None:
        if self.every and steps_done % self.every == 0:
            self._check()
