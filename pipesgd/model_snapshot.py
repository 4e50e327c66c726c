"""Warnings of steps in flight lost to a resume: a model-only snapshot (``model.state_dict()`` taken while steps are
in flight holds weights those steps have not reached yet; ``opt.state_dict()`` holds them), and a PipeSGD checkpoint
loaded into the plain torch optimizer before wrapping (which cannot hold them)."""
from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch
from torch import nn

from pipesgd.delay.pipeline import Pipeline
from pipesgd.wrapper_state import IN_FLIGHT_KEY

_quiet = 0  # > 0 inside ``for_evaluation()``


@contextmanager
def for_evaluation():
    """Snapshots taken inside are copies for evaluation, not for a resume: no warning."""
    global _quiet
    _quiet += 1
    try:
        yield
    finally:
        _quiet -= 1


class ModelSnapshotGuard:
    """Notes a ``model.state_dict()`` taken with steps in flight (a post-hook on the wrapped module) and warns once,
    at the next ``check()`` (the next ``step()``), unless ``opt.state_dict()`` was taken for the same steps: a script
    that saves both, in either order, is told nothing. Holds the pipeline, not the wrapper (the module keeps it)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline
        self._covered: tuple[int, ...] = ()  # the steps in flight when opt.state_dict() was last taken
        self._pending: tuple[int, ...] = ()  # those when model.state_dict() was taken, if opt's did not cover them
        self._warned = False

    @classmethod
    def at_wrap(cls, pipeline: Pipeline, optimizer: torch.optim.Optimizer, model, hooks: list) -> ModelSnapshotGuard:
        """The wrap-time warnings: ``lost_steps(optimizer)`` now, and a guard whose hook joins ``hooks``."""
        lost_steps(optimizer)
        guard = cls(pipeline)
        hooks += guard.attach(model)
        return guard

    def attach(self, model) -> list:
        """The hook's handle (removed by ``PipeSGD.close()``); none for a list of parameters."""
        def taken(_module, _state_dict, _prefix, _metadata) -> None:  # a function: torch marks it with an attribute
            self._taken()

        return [model.register_state_dict_post_hook(taken)] if isinstance(model, nn.Module) else []

    def saved(self) -> None:
        """``opt.state_dict()`` was taken: it holds the steps in flight now."""
        self._covered = self._steps()

    def check(self) -> None:
        pending, self._pending = self._pending, ()
        if pending and pending != self._covered and not self._warned:
            self._warned = True
            warnings.warn(f"model.state_dict() was taken with {len(pending)} step(s) in flight that those weights do "
                          f"not hold: a resume from it alone loses them; save opt.state_dict() too, or call "
                          f"opt.flush() first", RuntimeWarning, stacklevel=3)

    def _taken(self) -> None:
        steps = self._steps()
        if steps and not _quiet:
            self._pending = steps

    def _steps(self) -> tuple[int, ...]:
        return tuple(entry.step for entry in self._pipeline.entries())


def lost_steps(optimizer: torch.optim.Optimizer) -> None:
    """At wrap time: warn if ``optimizer`` loaded a PipeSGD checkpoint itself (its groups hold the marker), which
    keeps the optimizer's state but not the steps that were in flight; the marker goes, so it is not saved again."""
    lost = max((g.pop(IN_FLIGHT_KEY, 0) for g in optimizer.param_groups), default=0)
    if lost:
        warnings.warn(f"the optimizer loaded a PipeSGD checkpoint itself, losing its {lost} step(s) in flight: wrap "
                      f"first, then call opt.load_state_dict(checkpoint) on the PipeSGD wrapper", RuntimeWarning,
                      stacklevel=4)
