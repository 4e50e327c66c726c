"""The delayed apply: a due step's averaged gradient waited for, written into ``p.grad`` and handed to the wrapped
optimizer (clipped, unscaled under fp16 loss scaling, or refused when non-finite), with what it cost in ``StepStats``.
"""
from __future__ import annotations

import time
from contextlib import nullcontext

import torch

from pipesgd.accounting import StepStats
from pipesgd.comm.exchange import ExchangeResult
from pipesgd.delay.lookahead import Lookahead
from pipesgd.delay.pipeline import InFlight
from pipesgd.grads.amp import DelayedLossScale
from pipesgd.grads.bucket_sets import BucketSets
from pipesgd.grads.clipping import clip_averaged_gradient
from pipesgd.params import UnusedParameters


class NonFiniteGradientError(FloatingPointError):
    """The averaged gradient of a step holds NaN or Inf."""


class DelayedApply:
    """Applies in-flight steps of one wrapper, oldest first (the wrapper decides which is due)."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor], sets: BucketSets,
                 loss_scale: DelayedLossScale | None, nonfinite: str,
                 max_grad_norm: float | None, unused: UnusedParameters | None = None) -> None:
        self.optimizer, self._params, self._sets = optimizer, params, sets
        self._loss_scale, self._nonfinite, self._max_grad_norm = loss_scale, nonfinite, max_grad_norm
        self.unused = unused  # parameters no rank's backward reaches: hidden from the optimizer's step

    def __call__(self, entry: InFlight[ExchangeResult], step: int, lookahead: Lookahead | None) -> StepStats:
        """Wait for ``entry``'s averaged gradient and run the wrapped optimizer on it (or refuse a NaN/Inf)."""
        if lookahead is not None:
            lookahead.discard(entry.step)
        start = time.perf_counter()
        result = entry.handle.wait()
        waited = time.perf_counter() - start
        stats = StepStats(
            step=step,
            applied_step=entry.step,
            t_wait_s=waited,
            t_comm_busy_s=result.report.busy_s,
            bytes_sent=result.report.bytes_sent,
            compression_ratio=result.compression_ratio,
            residual_norm=result.residual_norm,
        )
        if self._loss_scale is not None:  # fp16: an inf/NaN is an overflow the scaler skips (pipesgd.grads.amp)
            return self._apply_scaled(entry.step, result, stats)
        if not result.finite:
            self._sets.bind(result.buckets, copy=False)  # views leave the ring's set; the rest stay the caller's
            if self._nonfinite == "raise":
                raise NonFiniteGradientError(
                    f"non-finite (NaN/Inf) averaged gradient from step {entry.step}; lower the learning rate, "
                    f"check the data, or pass nonfinite='skip' to skip such steps"
                )
            stats.skipped_nonfinite = True  # the exchange already zeroed a non-finite residual, on the worker
        else:
            self._sets.bind(result.buckets)
            stats.grad_norm = self._clip()
            start = time.perf_counter()
            with self._hidden():
                self.optimizer.step()
            stats.t_update_s = time.perf_counter() - start
        return stats

    def _apply_scaled(self, step: int, result: ExchangeResult, stats: StepStats) -> StepStats:
        self._sets.bind(result.buckets)
        start = time.perf_counter()
        with self._hidden():
            stats.skipped_nonfinite, stats.grad_norm = self._loss_scale.apply(step, result.finite, self._params,
                                                                              self._clip)
        stats.t_update_s = time.perf_counter() - start
        # An overflow's non-finite residual was already zeroed by the exchange, on the worker, in ring order.
        return stats

    def _hidden(self):
        return self.unused.hidden() if self.unused is not None else nullcontext()

    def _clip(self) -> float | None:
        """Clip the averaged gradient in ``p.grad`` to ``max_grad_norm``; its norm before clipping (None: off)."""
        limit = self._max_grad_norm
        return clip_averaged_gradient(self._params, limit) if limit is not None else None
