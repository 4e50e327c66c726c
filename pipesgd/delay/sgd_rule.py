"""Momentum SGD's update rule replayed in a few foreach operations, without a replica optimizer.

Why: look-ahead replays the wrapped optimizer's rule on every step (``pipesgd.delay.replay``). The generic replay
copies the optimizer's state into a second optimizer and steps it; for ``torch.optim.SGD`` on ResNet-20's 65
tensors that copy and the replica's Python cost more than the arithmetic. Momentum SGD's rule is short enough to
write out: the steps in flight move the parameters by

    d = g (+ weight_decay * w) (negated with maximize)
    b = momentum * b + (1 - dampening) * d     (b = d where the optimizer has no buffer yet)
    w = w - lr * (d + momentum * b  with Nesterov, else b)

with ``b`` starting from the optimizer's momentum buffer, computed into a new tensor so the optimizer's own state
is only read. The operations, their order and their kernels are those of torch's foreach SGD
(``torch.optim.sgd._multi_tensor_sgd``), so the parameters move to the same bits as the real optimizer would move
them (``tests/test_lookahead.py`` compares them with a stepped copy).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from pipesgd.delay.foreach_rule import ForeachRule


def closed_form_applies(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``SgdRule`` reproduces ``optimizer``'s steps bit for bit: exactly ``torch.optim.SGD``, not fused
    and not differentiable (they round or record differently), and foreach wherever that could differ from the
    per-tensor loop (on CPU both give the same bits)."""
    if type(optimizer) is not torch.optim.SGD:
        return False
    return not any(group.get("fused") or group.get("differentiable") or (
        group.get("foreach") is False and any(p.device.type != "cpu" for p in group["params"]))
        for group in optimizer.param_groups)


class SgdRule(ForeachRule):
    """Replays ``torch.optim.SGD`` steps on ``params`` (the ones that get gradients, in the caller's order)."""

    def __init__(self, optimizer: torch.optim.SGD, params: Sequence[torch.Tensor]) -> None:
        super().__init__(optimizer, params)
        self._buffers: list = []  # per group: the momentum buffers as the replay has advanced them
        self._scratch: list[list[torch.Tensor] | None] = [None] * len(self._indices)  # per group, allocated once

    def start(self) -> None:
        """A new replay from the optimizer's current momentum buffers (None where a parameter has none yet)."""
        state = self.optimizer.state
        self._buffers = [None if group["momentum"] == 0 else
                         [state[p].get("momentum_buffer") if p in state else None for p in params]
                         for group, params in zip(self.optimizer.param_groups, self._group_params)]

    def step(self, grads: Sequence[torch.Tensor], may_write: bool) -> None:
        """Move the parameters by one SGD step on ``grads`` (shaped like ``params``); they are written only if
        ``may_write`` (with Nesterov momentum, as torch's own step does)."""
        for n, (group, params) in enumerate(zip(self.optimizer.param_groups, self._group_params)):
            if params:
                self._step(n, group, params, [grads[i] for i in self._indices[n]], may_write)

    def _step(self, n: int, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor],
              may_write: bool) -> None:
        """One step of ``_multi_tensor_sgd`` on group ``n``, its momentum buffers advanced in scratch."""
        momentum, dampening, buffers = group["momentum"], group["dampening"], self._buffers[n]
        owned = False  # whether ``grads`` is a list of new tensors
        if group["maximize"]:
            grads, owned = torch._foreach_neg(grads), True
        if group["weight_decay"] != 0:
            if owned:
                torch._foreach_add_(grads, params, alpha=group["weight_decay"])
            else:
                grads, owned = torch._foreach_add(grads, params, alpha=group["weight_decay"]), True
        if buffers is not None:
            scratch = self._scratch_of(n, params)
            if all(b is not None for b in buffers):
                if buffers is not scratch:  # the optimizer's own buffers: only read
                    torch._foreach_copy_(scratch, buffers)
                torch._foreach_mul_(scratch, momentum)
                torch._foreach_add_(scratch, grads, alpha=1 - dampening)
            else:  # some parameter's first step: its buffer starts as its gradient, as torch's does
                for s, b, g in zip(scratch, buffers, grads):
                    s.copy_(g) if b is None else s.copy_(b).mul_(momentum).add_(g, alpha=1 - dampening)
            self._buffers[n] = buffers = scratch
            if not group["nesterov"]:
                grads = buffers
            elif owned or may_write:
                torch._foreach_add_(grads, buffers, alpha=momentum)
            else:
                grads = torch._foreach_add(grads, buffers, alpha=momentum)
        torch._foreach_add_(params, grads, alpha=-group["lr"])

    def _scratch_of(self, n: int, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """Group ``n``'s momentum-shaped scratch (SGD's buffers are shaped like their parameters)."""
        if self._scratch[n] is None:
            self._scratch[n] = [torch.empty_like(p) for p in params]
            self.scratch_bytes += sum(p.numel() * p.element_size() for p in params)
        return self._scratch[n]
