"""fp16 loss scaling under a delayed update: PipeSGD drives a ``torch.amp.GradScaler`` for the gradient it applies
(how to use it: ``DelayedLossScale``).

A gradient applied at step t was produced at step t-K+1 under that step's scale, not today's, so:
  Step 1: ``record(t)`` notes the scale each step's backward used (every rank uses the same scale).
  Step 2: when step u is due, its averaged gradient is multiplied by scale_now / scale_u (a power of two, so
          exact; this is what the BytePS fork of Pipe-SGD does when the scale changed in between), then
          ``scaler.unscale_`` divides by scale_now: the gradient is unscaled with the scale of its own step.
  Step 3: ``scaler.step`` skips the update if the unscaled gradient holds an inf/NaN and ``scaler.update``
          lowers the scale. Every rank holds the same averaged bits, so every rank skips the same step and
          its scaler follows the same sequence of scales without a collective.
An overflow produced under a scale that has already been lowered since (the K-1 steps computed before the
first overflow was applied) skips its step without lowering the scale again.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from pipesgd.grads.finite import all_finite


class DelayedLossScale:
    """The scale of every in-flight step, and the apply of a due step through the user's GradScaler. Use::

        scaler = torch.amp.GradScaler(device)
        opt = PipeSGD(inner, model, options=PipeSGDOptions(grad_scaler=scaler, max_grad_norm=1.0))  # clip optional
        with torch.autocast(device, dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)      # or opt.step() alone: the wrapper then updates the scaler itself
        scaler.update()       # (only after scaler.step(opt)); never scaler.unscale_(opt): clip with max_grad_norm
        opt.zero_grad()

    Either way every rank's scale stays the same. With ``scaler.step(opt)`` the user's ``update()`` runs every step,
    so the K-1 steps that fill the pipeline count toward the scale's growth too; with ``opt.step()`` alone only
    the steps that apply a gradient do.
    """

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
        """Steps 2-3 for step ``step``, whose averaged (scaled) gradient is in ``params``' ``.grad``.

        Returns (skipped, norm): whether the update was skipped for an inf/NaN, and ``clip()``'s result
        (the unscaled gradient's norm before clipping) when it ran.
        """
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
        """At the end of a ``scaler.step(wrapper)``: the scaler's check of this rank's own gradients may differ from
        rank to rank, so it is cleared, and ``scaler.update()`` reads only the applied average's (the same bits
        everywhere), which keeps every rank's scale the same. (GradScaler keeps its per-optimizer checks in a
        private dict; there is no public way to replace one.)"""
        if self.user_updates:
            state = self.scaler._per_optimizer_states.get(id(wrapper))
            for found in (state or {}).get("found_inf_per_device", {}).values():
                found.zero_()


    def state_dict(self) -> dict[int, float]:
        return dict(self._scales)

    def load_state_dict(self, scales: dict | None) -> None:
        self._scales = {int(step): float(scale) for step, scale in (scales or {}).items()}

