"""Adam's and AdamW's update rule replayed in foreach operations, without a replica optimizer (whose state copy and
step cost Python per parameter on the training thread). Each step in flight moves the parameters by

    g = -g with maximize;   w = w * (1 - lr * wd) (AdamW)   or   g = g + wd * w (Adam)
    m = lerp(m, g, 1 - beta1);   v = beta2 * v + (1 - beta2) * g * g;   s = s + 1
    w = w - lr / (1 - beta1^s) * m / (sqrt(v) / sqrt(1 - beta2^s) + eps)

with ``m``, ``v`` and ``s`` from the optimizer's state, advanced in scratch so that state is only read. Operations,
order and kernels are torch's foreach Adam's, so the parameters reach a stepped copy's bits
(``tests/test_adam_rule.py``)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from pipesgd.delay.foreach_rule import ForeachRule

_UNSUPPORTED = ("fused", "capturable", "differentiable", "amsgrad")  # they round or record differently, or keep a max


def closed_form_applies(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``AdamRule`` reproduces ``optimizer``'s steps bit for bit: exactly ``torch.optim.Adam`` or ``AdamW``
    (a subclass may change the rule), none of ``_UNSUPPORTED``, float betas, real parameters, and foreach wherever
    that could differ from the per-tensor loop (on CPU both give the same bits)."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return False
    return not any(
        any(group.get(flag) for flag in _UNSUPPORTED)
        or any(isinstance(beta, torch.Tensor) for beta in group["betas"])
        or any(p.is_complex() for p in group["params"])
        or (group.get("foreach") is False and any(p.device.type != "cpu" for p in group["params"]))
        for group in optimizer.param_groups)


class AdamRule(ForeachRule):
    """Replays ``torch.optim.Adam``/``AdamW`` steps on ``params`` (the ones that get gradients, in the caller's
    order)."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        super().__init__(optimizer, params)
        # Per group, allocated once: the first and second moments as the replay advances them.
        self._moments: list[tuple[list[torch.Tensor], list[torch.Tensor]] | None] = [None] * len(self._indices)
        self._steps: list[list[float]] = []  # per group, per parameter: the step count as the replay advances it
        self._sources: tuple | None = None  # (the state dict, its length, per group what ``_sources_of`` found)

    def start(self) -> None:
        """A new replay from the optimizer's current moments and step counts."""
        state = self.optimizer.state
        if self._sources is None or self._sources[0] is not state or self._sources[1] != len(state):
            self._sources = (state, len(state), [self._sources_of(params) for params in self._group_params])
        self._steps = []
        for n, (params, (have, fresh, firsts, seconds, counts)) in enumerate(zip(self._group_params,
                                                                               self._sources[2])):
            if not params:
                self._steps.append([])
                continue
            first, second = self._moments_of(n, params)
            if have:
                torch._foreach_copy_([first[i] for i in have] + [second[i] for i in have], firsts + seconds)
            if fresh:  # no state yet: its first step starts from zeros, as torch's does
                torch._foreach_zero_([first[i] for i in fresh] + [second[i] for i in fresh])
            steps = [0.0] * len(params)
            for i, count in zip(have, torch.stack(counts).tolist() if counts else []):
                steps[i] = count
            self._steps.append(steps)

    def _sources_of(self, params: list[torch.Tensor]) -> tuple:
        """Which of ``params`` have state, which not, and the state tensors to read (they are updated in place, so
        they are found again only when the state dict changes: a first step, ``load_state_dict``)."""
        state = self.optimizer.state
        have = [i for i, p in enumerate(params) if state.get(p)]
        fresh = [i for i, p in enumerate(params) if not state.get(p)]
        return (have, fresh, [state[params[i]]["exp_avg"] for i in have],
                [state[params[i]]["exp_avg_sq"] for i in have],
                [state[params[i]]["step"].reshape(()).float() for i in have])

    def _step(self, n: int, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor],
              may_write: bool) -> None:
        """One step of ``_multi_tensor_adam`` on group ``n`` (not capturable), moments and counts in scratch."""
        lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        first, second = self._moments[n]
        if group["maximize"]:
            grads = torch._foreach_neg(grads)
        steps = self._steps[n] = [s + 1.0 for s in self._steps[n]]
        if decay != 0:
            if group["decoupled_weight_decay"]:
                torch._foreach_mul_(params, 1 - lr * decay)
            elif group["maximize"]:
                torch._foreach_add_(grads, params, alpha=decay)  # its own negated copy
            else:
                grads = torch._foreach_add(grads, params, alpha=decay)
        torch._foreach_lerp_(first, grads, 1 - beta1)
        torch._foreach_mul_(second, beta2)
        torch._foreach_addcmul_(second, grads, grads, 1 - beta2)
        step_size = [(lr / (1 - beta1 ** s)) * -1 for s in steps]
        correction_sqrt = [(1 - beta2 ** s) ** 0.5 for s in steps]
        denominator = torch._foreach_sqrt(second)
        torch._foreach_div_(denominator, correction_sqrt)
        torch._foreach_add_(denominator, eps)
        torch._foreach_addcdiv_(params, first, denominator, step_size)

    def _moments_of(self, n: int, params: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Group ``n``'s moment-shaped scratch (Adam's moments are shaped like their parameters)."""
        if self._moments[n] is None:
            self._moments[n] = ([torch.empty_like(p) for p in params], [torch.empty_like(p) for p in params])
            self.scratch_bytes += 2 * sum(p.numel() * p.element_size() for p in params)
        return self._moments[n]
