"""Cheap, exact checks for NaN/Inf in large tensors (the gradient buckets after every ring).

``torch.isfinite(t).all()`` materialises a boolean tensor and costs many times a plain sum, run on the
communication thread after every ring. A finite sum proves every element finite (NaN and ±Inf propagate); only a
non-finite sum (an overflow can give one) falls back to the elementwise test."""
from __future__ import annotations

import torch

__all__ = ["all_finite", "l2_norm"]


def all_finite(tensor: torch.Tensor) -> bool:
    """True iff no element of ``tensor`` is NaN or ±Inf."""
    if tensor.numel() == 0:
        return True
    total = tensor.sum(dtype=torch.float32) if tensor.dtype in (torch.float16, torch.bfloat16) else tensor.sum()
    if bool(torch.isfinite(total)):
        return True
    return bool(torch.isfinite(tensor).all())


def l2_norm(tensor: torch.Tensor) -> float:
    """L2 norm as a Python float, in the tensor's own precision (fast), redone in float64 only if that
    overflowed although every element is finite (squares of values above ~1.8e19 overflow fp32)."""
    norm = float(torch.linalg.vector_norm(tensor))
    if norm == float("inf") and all_finite(tensor):
        norm = float(torch.linalg.vector_norm(tensor, dtype=torch.float64))
    return norm
