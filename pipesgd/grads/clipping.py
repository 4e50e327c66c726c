"""Gradient clipping of the averaged gradient: what DDP users get from ``clip_grad_norm_`` after ``backward()``.

PipeSGD clips after the ring and before the wrapped optimizer steps, so the clip sees the gradient that is
actually applied (the mean over ranks of step t-K+1's gradients), not a rank's local one.
"""
from __future__ import annotations

import torch
from torch.nn.utils import clip_grad_norm_


def clip_averaged_gradient(params: list[torch.Tensor], max_norm: float) -> float:
    """Scale the ``.grad`` of ``params`` so that their global L2 norm is at most ``max_norm``; return the norm before
    clipping. It is ``torch.nn.utils.clip_grad_norm_`` itself, so a run matches the reference bit for bit; every rank
    holds the same averaged bits, so the decision is identical without a collective. A non-finite norm is returned."""
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    return float(clip_grad_norm_(grads, max_norm))


def resolve_max_grad_norm(value: float | None) -> float | None:
    """The clipping limit, or None for no clipping: None or 0 (what ``max_grad_norm=0`` means in HF Trainer and in
    nanoGPT's ``grad_clip``) turn it off; ValueError unless the rest is a positive finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"max_grad_norm must be a number (0 or None: no clipping), got {value!r}")
    if value == 0:
        return None
    if not 0 < value < float("inf"):
        raise ValueError(f"max_grad_norm must be positive and finite (0 or None: no clipping), got {value!r}")
    return float(value)
