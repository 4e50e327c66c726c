"""Muon's update rule (``torch.optim.Muon``) replayed without a replica optimizer.

Each step in flight moves each 2-D parameter by torch's ``_single_tensor_muon`` (the only implementation torch has):

    b = lerp(b, g, 1 - momentum)                         (b: the momentum buffer, zeros where none yet)
    u = lerp(g, b, momentum) with Nesterov, else b
    O = NS(u): Newton-Schulz orthogonalisation in bfloat16, ``ns_steps`` quintic iterations
    w = w * (1 - lr * weight_decay);   w = w - adjust(lr, shape) * O

where ``adjust`` is ``adjust_lr_fn``'s scaling ("original": ``sqrt(max(1, rows / cols))``; "match_rms_adamw":
``0.2 * sqrt(max(rows, cols))``). The orthogonalisation and the scaling are torch's own functions, called here, and
the rest is torch's sequence of per-tensor operations, so the parameters reach a stepped copy's bits
(``tests/test_muon_rule.py``); the buffers advance in scratch, so the optimizer's state is only read. Muon has no
``maximize``, ``foreach`` or ``fused`` variants to tell apart.
"""
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
        # parameter has none yet, until the first replayed step), and the scratch they advance in (allocated once).
        self._buffers: list[list[torch.Tensor | None]] = []
        self._scratch: list[list[torch.Tensor] | None] = [None] * len(self._indices)

    def start(self) -> None:
        """A new replay from the optimizer's current momentum buffers."""
        state = self.optimizer.state
        self._buffers = [[state[p].get("momentum_buffer") if p in state else None for p in params]
                         for params in self._group_params]

    def step(self, grads: Sequence[torch.Tensor], may_write: bool) -> None:
        """Move the parameters by one Muon step on ``grads`` (shaped like ``params``); ``grads`` are never written
        (``may_write`` is part of the rules' common signature)."""
        del may_write
        for n, (group, params) in enumerate(zip(self.optimizer.param_groups, self._group_params)):
            if params:
                self._step(n, group, params, [grads[i] for i in self._indices[n]])

    def _step(self, n: int, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
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

    def _scratch_of(self, n: int, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """Group ``n``'s momentum-shaped scratch (Muon's buffers are shaped like their parameters)."""
        if self._scratch[n] is None:
            self._scratch[n] = [torch.empty_like(p) for p in params]
            self.scratch_bytes += sum(p.numel() * p.element_size() for p in params)
        return self._scratch[n]
