"""When the trainer evaluates on the held-out split during training, and whether now or after training.

Two schedules, either or both, as in HF Trainer: every N epochs (``--eval-every``) and every N steps
(``--eval-steps``); a point due at the last step is left to the final evaluation, which always runs.
``--eval-deferred`` copies the weights at each point and evaluates the copies after training, so time to an
accuracy holds no evaluation pauses (docs/training.md). The copy is taken after ``opt.step()`` and before the next
forward, where every wrapper holds its applied (master) weights."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from pipesgd import model_snapshot

from .checkpoint import Position


@dataclass
class EvalPoints:
    """Decides whether a step's end is an evaluation point and runs it (now, or deferred: module doc)."""

    every_epochs: int
    every_steps: int
    total_steps: int
    deferred: bool = False
    _copies: list[tuple[Position, float, dict[str, torch.Tensor]]] = field(default_factory=list, repr=False)

    def due(self, pos: Position, end_of_epoch: bool) -> bool:
        """Whether the step just finished (``pos`` already advanced past it) is an evaluation point."""
        if pos.step >= self.total_steps:  # the final evaluation covers it
            return False
        by_epoch = end_of_epoch and self.every_epochs > 0 and pos.epoch % self.every_epochs == 0
        return by_epoch or (self.every_steps > 0 and pos.step % self.every_steps == 0)

    def run(self, model: nn.Module, pos: Position, wall_s: float,
            evaluate: Callable[[], tuple[float, float]]) -> tuple[float, float] | None:
        """Evaluate now (returns accuracy and loss), or keep a copy of the weights for ``finish`` (returns None)."""
        if not self.deferred:
            return evaluate()
        with model_snapshot.for_evaluation():  # a copy to evaluate, not to resume from: steps in flight are no loss
            copy = {name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()}
        self._copies.append((Position(pos.epoch, pos.step_in_epoch, pos.step), wall_s, copy))
        return None

    def finish(self, model: nn.Module, evaluate: Callable[[], tuple[float, float]]
               ) -> list[tuple[Position, float, float, float]]:
        """After training: every deferred copy evaluated in order, as (position, wall of the copy, accuracy, loss);
        the model holds its final weights again afterwards."""
        if not self._copies:
            return []
        final = {name: value.detach().clone() for name, value in model.state_dict().items()}
        results = []
        for pos, wall_s, copy in self._copies:
            model.load_state_dict(copy)
            results.append((pos, wall_s, *evaluate()))
        model.load_state_dict(final)
        self._copies.clear()
        return results
