"""Muon's update rule (``torch.optim.Muon``) replayed without a replica optimizer. Each step in flight moves each
2-D parameter by torch's ``_single_tensor_muon``:

    b = lerp(b, g, 1 - momentum)                         (b: the momentum buffer, zeros where none yet)
    u = lerp(g, b, momentum) with Nesterov, else b
    O = NS(u): Newton-Schulz orthogonalisation in bfloat16, ``ns_steps`` quintic iterations
    w = w * (1 - lr * weight_decay);   w = w - adjust(lr, shape) * O

with torch's own orthogonalisation and ``adjust_lr_fn`` scaling called here and its sequence of operations, so the
parameters reach a stepped copy's bits (``tests/test_muon_rule.py``); the buffers advance in scratch."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from pipesgd.delay.foreach_rule import ForeachRule

try:  # torch's own steps of the rule (private, so a torch without them replays through the replica instead)
    from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz
except ImportError:  # a torch before Muon
    _adjust_lr = _zeropower_via_newtonschulz = None


def closed_form_applies(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``MuonRule`` reproduces ``optimizer``'s steps: exactly ``torch.optim.Muon`` (a subclass may change
    the rule) of a torch whose orthogonalisation this module found, on real parameters."""
    muon = getattr(torch.optim, "Muon", None)
    if muon is None or _zeropower_via_newtonschulz is None or type(optimizer) is not muon:
        return False
    return not any(p.is_complex() for group in optimizer.param_groups for p in group["params"])


class MuonRule(ForeachRule):
    """Replays ``torch.optim.Muon`` steps on ``params`` (the ones that get gradients, in the caller's order)."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        super().__init__(optimizer, params)
        # Per group: the momentum buffers as the replay has advanced them (the optimizer's own, or None where a
        # parameter has none yet, until the first replayed step).
        self._buffers: list[list[torch.Tensor | None]] = []

    def start(self) -> None:
        """A new replay from the optimizer's current momentum buffers."""
        state = self.optimizer.state
        self._buffers = [[state[p].get("momentum_buffer") if p in state else None for p in params]
                         for params in self._group_params]

    def _step(self, n: int, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor],
              may_write: bool) -> None:
        """One step of ``_single_tensor_muon`` on group ``n``, its momentum buffers advanced in scratch."""
        lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
        scratch = self._scratch_of(n, params)
        for i, (param, grad) in enumerate(zip(params, grads)):
            buffer = self._buffers[n][i]
            if buffer is not scratch[i]:  # the replay's first step: from the optimizer's buffer (only read)
                scratch[i].copy_(buffer) if buffer is not None else scratch[i].zero_()
                self._buffers[n][i] = buffer = scratch[i]
            buffer.lerp_(grad, 1 - momentum)
            update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
            update = _zeropower_via_newtonschulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
            adjusted_lr = _adjust_lr(lr, group["adjust_lr_fn"], param.shape)
            param.mul_(1 - lr * decay)
            param.add_(update, alpha=-adjusted_lr)
