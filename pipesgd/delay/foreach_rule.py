"""What the update rules written out for look-ahead share (``sgd_rule``, ``adam_rule``): the parameters each group
steps, in the caller's order, and the float learning rates the rules are written for."""
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
        self.scratch_bytes = 0

    def usable(self) -> bool:
        """The rules are written for float learning rates (checked per replay: a scheduler or the user may set a
        tensor ``lr``)."""
        return all(not isinstance(group["lr"], torch.Tensor) for group in self.optimizer.param_groups)
