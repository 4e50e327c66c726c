"""Momentum SGD's update rule replayed in a few foreach operations, without a replica optimizer (whose state copy
and Python cost more than the arithmetic). The steps in flight move the parameters by

    d = g (+ weight_decay * w) (negated with maximize)
    b = momentum * b + (1 - dampening) * d     (b = d where the optimizer has no buffer yet)
    w = w - lr * (d + momentum * b  with Nesterov, else b)

with ``b`` from the optimizer's buffer, computed into a new tensor so its state is only read. Operations, order and
kernels are torch's foreach SGD's, so the parameters reach a stepped copy's bits (``tests/test_lookahead.py``)."""
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

    def start(self) -> None:
        """A new replay from the optimizer's current momentum buffers (None where a parameter has none yet)."""
        state = self.optimizer.state
        self._buffers = [None if group["momentum"] == 0 else
                         [state[p].get("momentum_buffer") if p in state else None for p in params]
                         for group, params in zip(self.optimizer.param_groups, self._group_params)]

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
