"""``pipesgd.muon_adamw.MuonAdamW``'s update rule replayed without a replica optimizer: Muon's rule
(``pipesgd.delay.muon_rule``) on its Muon groups and AdamW's (``pipesgd.delay.adam_rule``) on its AdamW groups, each
written for its own optimizer and reading that optimizer's groups and (shared) state, on the same gradients."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from pipesgd.delay import adam_rule, muon_rule
from pipesgd.muon_adamw import MuonAdamW

_PARTS = ((muon_rule.closed_form_applies, muon_rule.MuonRule), (adam_rule.closed_form_applies, adam_rule.AdamRule))


def closed_form_applies(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``MuonAdamWRule`` reproduces ``optimizer``'s steps: exactly ``MuonAdamW``, and each of its optimizers
    one whose rule reproduces it."""
    return type(optimizer) is MuonAdamW and all(any(applies(o) for applies, _ in _PARTS) for o in optimizer.optimizers)


class MuonAdamWRule:
    """Replays ``MuonAdamW`` steps on ``params`` (the ones that get gradients, in the caller's order): each of its
    optimizers' rules steps that optimizer's parameters."""

    def __init__(self, optimizer: MuonAdamW, params: Sequence[torch.Tensor]) -> None:
        self.optimizer = optimizer
        self._rules = [next(rule(o, params) for applies, rule in _PARTS if applies(o)) for o in optimizer.optimizers]

    def usable(self) -> bool:
        return all(rule.usable() for rule in self._rules)

    def start(self) -> None:
        for rule in self._rules:
            rule.start()

    def step(self, grads: Sequence[torch.Tensor], may_write: bool) -> None:
        for rule in self._rules:
            rule.step(grads, may_write)

    @property
    def scratch_bytes(self) -> int:
        return sum(rule.scratch_bytes for rule in self._rules)
