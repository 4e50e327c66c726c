"""fp16 loss scaling under a delayed update: PipeSGD drives a ``torch.amp.GradScaler`` for the gradient it applies
(use: docs/wrapper.md, "Clipping and mixed precision").

A gradient applied at step t was produced at step t-K+1 under that step's scale, not today's, so:
  Step 1: ``record(t)`` notes the scale each step's backward used (the same on every rank).
  Step 2: when step u is due, its averaged gradient is multiplied by scale_now / scale_u (a power of two, so
          exact; the BytePS fork of Pipe-SGD does the same), then ``scaler.unscale_`` divides by scale_now.
  Step 3: ``scaler.step`` skips an update whose gradient holds an inf/NaN and ``scaler.update`` lowers the scale;
          every rank holds the same averaged bits, so every rank skips the same step without a collective.
An overflow produced under a scale already lowered since skips its step without lowering the scale again."""
from __future__ import annotations

from collections.abc import Callable

import torch

from pipesgd.grads.finite import all_finite


class DelayedLossScale:
    """The scale of every in-flight step, and the apply of a due step through the user's GradScaler.

    With ``scaler.step(opt)`` the user's ``update()`` runs every step, so the K-1 steps that fill the pipeline count
    toward the scale's growth too; with ``opt.step()`` alone (the wrapper updates the scaler) only the steps that
    apply a gradient do. Either way every rank's scale stays the same."""

    def __init__(self, scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
        self.scaler = scaler
        self.optimizer = optimizer
        self._scales: dict[int, float] = {}  # step -> the scale its backward used
        self.user_updates = False  # this step came through ``scaler.step(opt)``: the user calls ``update()``

    def record(self, step: int) -> None:
        """Step 1: the scale that step ``step``'s backward used (the scaler's current one)."""
        self._scales[step] = float(self.scaler.get_scale())

    def scale_of(self, step: int) -> float:
        """The scale step ``step``'s backward used (recorded, not yet applied)."""
        return self._scales[step]

    def apply(self, step: int, finite: bool, params: list[torch.Tensor],
              clip: Callable[[], float | None]) -> tuple[bool, float | None]:
        """Steps 2-3 for step ``step``, whose averaged (scaled) gradient is in ``params``' ``.grad``: (skipped for an
        inf/NaN, the unscaled gradient's norm before clipping when ``clip()`` ran)."""
        own = self._scales.pop(step)
        now = float(self.scaler.get_scale())
        if not finite and own > now:
            return True, None  # an overflow of a scale already lowered since: skip, do not lower again
        if own != now:
            with torch.no_grad():
                torch._foreach_mul_([p.grad for p in params if p.grad is not None], now / own)
        self.scaler.unscale_(self.optimizer)
        # The scaler's own test (any inf/NaN after unscaling), made here too because it does not report it.
        skipped = not all(all_finite(p.grad) for p in params if p.grad is not None)
        norm = None if skipped else clip()
        self.scaler.step(self.optimizer)  # runs the optimizer unless unscale_ found an inf/NaN
        if not self.user_updates:
            self.scaler.update()
        return skipped, norm

    def begin(self, wrapper: torch.optim.Optimizer) -> None:
        """At the start of ``wrapper.step()``: whether ``scaler.step(wrapper)`` called it (GradScaler sets
        ``found_inf`` on an optimizer whose step supports amp scaling, as PipeSGD's does), and refuse a misuse."""
        self.user_updates = getattr(wrapper, "found_inf", None) is not None
        if self.user_updates and getattr(wrapper, "grad_scale", None) is None:
            raise ValueError("scaler.unscale_(opt) before scaler.step(opt) would unscale this rank's gradients before "
                             "they are averaged; clip with PipeSGDOptions(max_grad_norm=...) instead")

    def end(self, wrapper: torch.optim.Optimizer) -> None:
        """At the end of a ``scaler.step(wrapper)``: the scaler's check of this rank's own gradients may differ between
        ranks, so it is cleared and ``scaler.update()`` reads only the applied average's (GradScaler keeps these checks
        in a private dict, with no public way to replace one)."""
        if self.user_updates:
            state = self.scaler._per_optimizer_states.get(id(wrapper))
            for found in (state or {}).get("found_inf_per_device", {}).values():
                found.zero_()


    def state_dict(self) -> dict[int, float]:
        return dict(self._scales)

    def load_state_dict(self, scales: dict | None) -> None:
        self._scales = {int(step): float(scale) for step, scale in (scales or {}).items()}

