"""What the update rules written out for look-ahead share (``sgd_rule``, ``adam_rule``, ``muon_rule``): the
parameters each group steps, in the caller's order, the step over the groups, scratch shaped like the parameters,
and the float learning rates the rules are written for."""
from __future__ import annotations

from collections.abc import Sequence

import torch


class ForeachRule:
    """Per group of ``optimizer``, which of ``params`` (the ones that get gradients, in the caller's order) it steps."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        self.optimizer = optimizer
        position = {id(p): i for i, p in enumerate(params)}
        # Per group, the positions in ``params`` of its parameters (a parameter without gradients is not stepped).
        # The group dicts themselves are read at each replay: ``load_state_dict`` replaces them.
        self._indices = [[position[id(p)] for p in group["params"] if id(p) in position]
                         for group in optimizer.param_groups]
        self._group_params = [[params[i] for i in indices] for indices in self._indices]
        self._scratch: list[list[torch.Tensor] | None] = [None] * len(self._indices)  # per group, allocated once
        self.scratch_bytes = 0

    def step(self, grads: Sequence[torch.Tensor], may_write: bool) -> None:
        """Move the parameters by one step of the rule on ``grads`` (shaped like ``params``); they are written only
        if ``may_write`` (SGD with Nesterov momentum, as torch's own step does)."""
        for n, (group, params) in enumerate(zip(self.optimizer.param_groups, self._group_params)):
            if params:
                self._step(n, group, params, [grads[i] for i in self._indices[n]], may_write)

    def _step(self, n: int, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor],
              may_write: bool) -> None:
        raise NotImplementedError

    def _scratch_of(self, n: int, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """Group ``n``'s scratch shaped like its parameters (the momentum buffers advance in it)."""
        if self._scratch[n] is None:
            self._scratch[n] = [torch.empty_like(p) for p in params]
            self.scratch_bytes += sum(p.numel() * p.element_size() for p in params)
        return self._scratch[n]

    def usable(self) -> bool:
        """The rules are written for float learning rates (checked per replay: a scheduler or the user may set a
        tensor ``lr``)."""
        return all(not isinstance(group["lr"], torch.Tensor) for group in self.optimizer.param_groups)
