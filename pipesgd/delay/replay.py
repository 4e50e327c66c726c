"""Replaying a torch optimizer's update rule on its parameters without touching its state.

``OptimizerReplay`` steps a second instance of the wrapped optimizer's class, whose parameters alias the real
ones and whose state is a copy (learning rates as a scheduler set them, Adam's step count): the parameters move
exactly as the real optimizer would move them, and its state does not change. SGD, Adam, AdamW, Muon and
``pipesgd.muon_adamw`` skip the replica: their rules are written out with the same kernels (``sgd_rule``,
``adam_rule``, ``muon_rule``, ``muon_adamw_rule``; docs/wrapper.md, "Staleness: look-ahead")."""
from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

from pipesgd.grads.clipping import clip_averaged_gradient
from pipesgd.grads.finite import all_finite
from pipesgd.delay import adam_rule, muon_adamw_rule, muon_rule, sgd_rule

# The update rules written out, each with the test of where it reproduces the optimizer (by its exact class).
RULES = ((sgd_rule.closed_form_applies, sgd_rule.SgdRule), (adam_rule.closed_form_applies, adam_rule.AdamRule),
         (muon_rule.closed_form_applies, muon_rule.MuonRule),
         (muon_adamw_rule.closed_form_applies, muon_adamw_rule.MuonAdamWRule))
# Optimizers whose CPU foreach implementation matches their default per-tensor one bit for bit (torch 2.13).
FOREACH_EXACT_ON_CPU = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


class OptimizerReplay:
    """Steps ``optimizer``'s update rule on ``params`` from a copy of its state (see module doc).

    The state is copied tensor by tensor: ``Optimizer.load_state_dict`` would alias ``exp_avg``, ``exp_avg_sq`` and
    the ``step`` tensor, and stepping the copy would move the original's step count. The written-out rules run
    unless the learning rate is a tensor or gradients are clipped (then the replica runs). The replay keeps the
    original's ``foreach``/``fused`` choice, except that SGD, Adam and AdamW on CPU go through torch's foreach
    implementation: bitwise the same there, with fewer Python round trips (a tensor learning rate keeps the original's
    choice: torch's foreach Adam refuses one). Clipping is the wrapper's own (``pipesgd.grads.clipping``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                 max_grad_norm: float | None = None) -> None:
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        # Every parameter the optimizer holds gets an alias: same storage, own grad slot and own state key.
        self._originals = [p for group in optimizer.param_groups for p in group["params"]]
        self._aliases = {id(p): torch.nn.Parameter(p.detach(), requires_grad=p.requires_grad)
                         for p in self._originals}
        self._params = list(params)  # the ones that get gradients, in the wrapper's (clipping) order
        self._targets = [self._aliases[id(p)] for p in self._params]
        defaults = _constructor_defaults(optimizer)
        # The replica's own implementation choice, kept when hyperparameters are copied over from the original.
        self._own = {}
        if (type(optimizer) in FOREACH_EXACT_ON_CPU and not defaults.get("fused")
                and not defaults.get("differentiable") and all(p.device.type == "cpu" for p in self._originals)):
            self._own = {"foreach": True}
        defaults.update(self._own)
        groups = [{**{k: v for k, v in g.items() if k != "params"}, **self._own,
                   "params": [self._aliases[id(p)] for p in g["params"]]} for g in optimizer.param_groups]
        try:
            self._replica = type(optimizer)(groups, **defaults)
        except TypeError as exc:
            raise ValueError(f"staleness='lookahead' replays the optimizer's rule on a second "
                             f"{type(optimizer).__name__} built from its defaults, which failed ({exc}); "
                             f"pass staleness='none'") from None
        self._scratch: list[torch.Tensor] | None = None
        # SGD's or Adam's rule written out (no state copy, no replica step) where it reproduces the optimizer.
        self._rule = next((rule(optimizer, self._params) for applies, rule in RULES if applies(optimizer)), None)

    def replay_(self, steps: Sequence[tuple[Sequence[torch.Tensor], float | None, bool]],
                skip_nonfinite: bool) -> int:
        """Move ``params`` in place by one optimizer step per entry of ``steps`` (oldest first); returns how many applied.

        Each entry is (gradients, loss scale or None, whether they may be written); they are unscaled, skipped if
        non-finite and clipped as ``PipeSGD`` treats an applied gradient. Gradients that may not be written are copied
        first: unscaling, clipping and the optimizer (foreach SGD with Nesterov adds into them) write them."""
        if not steps:
            return 0
        rule = self._rule if self._rule is not None and self.max_grad_norm is None and self._rule.usable() else None
        if rule is None:
            self._load_state()
        else:
            rule.start()
        applied = 0
        for grads, scale, writable in steps:
            # Unscaling writes them, and so may the replica optimizer: read-only ones are copied to scratch first.
            copy = not writable and (scale is not None or rule is None)
            grads = self._copied(grads) if copy else [self._as_param_dtype(g, p) for g, p in zip(grads, self._params)]
            writable = writable or copy
            if scale is not None:
                torch._foreach_mul_(grads, 1.0 / scale)  # a power of two: the applied step's unscale, bit for bit
            if (scale is not None or skip_nonfinite) and not all(all_finite(g) for g in grads):
                continue  # the applied step skips it too (an overflow, or nonfinite="skip")
            if rule is not None:
                rule.step(grads, may_write=writable)
            else:
                for alias, grad in zip(self._targets, grads):
                    alias.grad = grad
                if self.max_grad_norm is not None:
                    clip_averaged_gradient(self._targets, self.max_grad_norm)
                self._replica.step()
            applied += 1
        if rule is None:
            for alias in self._targets:
                alias.grad = None
        return applied

    @property
    def state_bytes(self) -> int:
        """Bytes of optimizer state the replay keeps beside the original's (its copy of it)."""
        replica = sum(v.numel() * v.element_size() for state in self._replica.state.values()
                      for v in state.values() if isinstance(v, torch.Tensor))
        return replica + (self._rule.scratch_bytes if self._rule is not None else 0)

    def _load_state(self) -> None:
        """The original's state and hyperparameters into the replica: tensors copied into the replica's own
        (allocated once), everything else assigned."""
        for mine, theirs in zip(self._replica.param_groups, self.optimizer.param_groups):
            for key, value in theirs.items():
                if key != "params" and key not in self._own:
                    mine[key] = value
            if self._own and isinstance(theirs["lr"], torch.Tensor):
                # torch's foreach Adam refuses a tensor lr unless capturable: replay with the original's own choice
                mine["foreach"] = theirs.get("foreach")
            elif self._own:
                mine.update(self._own)
        targets, sources = [], []
        for p in self._originals:
            alias = self._aliases[id(p)]
            if alias.data_ptr() != p.data_ptr():  # the model's parameter was given new storage (load, .to())
                raise RuntimeError("a parameter's storage changed after PipeSGD was built; build a new PipeSGD")
            source = self.optimizer.state.get(p)
            if not source:
                self._replica.state.pop(alias, None)  # a first step initialises from the gradient, as the original
                continue
            state = self._replica.state[alias]
            for key in [k for k in state if k not in source]:
                del state[key]
            for key, value in source.items():
                mine = state.get(key)
                if not isinstance(value, torch.Tensor):
                    state[key] = value
                elif isinstance(mine, torch.Tensor) and (mine.shape, mine.dtype, mine.device) == \
                        (value.shape, value.dtype, value.device):
                    targets.append(mine)
                    sources.append(value)
                else:
                    state[key] = value.detach().clone()
        if targets:
            torch._foreach_copy_(targets, sources)

    def _copied(self, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``grads`` copied into scratch gradients of the parameters' dtypes (allocated once)."""
        if self._scratch is None:
            self._scratch = [torch.empty_like(p) for p in self._params]
        for scratch, grad in zip(self._scratch, grads):
            scratch.copy_(grad)
        return self._scratch

    @staticmethod
    def _as_param_dtype(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        # Buckets hold bf16/fp16 gradients in fp32; a grad slot must have the parameter's dtype.
        return grad if grad.dtype == param.dtype else grad.to(param.dtype)


def _constructor_defaults(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's ``defaults`` that its constructor takes (AdamW keeps ``decoupled_weight_decay`` there, which
    its constructor sets itself and refuses)."""
    parameters = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in parameters}
