"""Error feedback: the wrapper that owns per-bucket residuals, so compressors stay stateless about it.

The ring uses it in three steps per bucket:

1. ``r = ef.residual(key, x)``; ``x += r``; ``r.zero_()`` — last step's compression error is sent now.
2. at each hop, for the chunk it compresses: ``r[slice] += chunk - decompress(compress(chunk))``.
3. the decoded values go on as usual; over many steps nothing the compressor dropped is lost.
"""
from __future__ import annotations

from typing import Any, Hashable

import torch

from pipesgd.compression.base import Compressor
from pipesgd.finite import all_finite, l2_norm

_WORKING_DTYPES = (torch.float32, torch.float64)


class ErrorFeedback:
    """Persistent, zero-initialised residual buffers by bucket key, next to the compressor they serve."""

    def __init__(self, compressor: Compressor) -> None:
        self.compressor = compressor
        self._residuals: dict[Hashable, torch.Tensor] = {}

    def residual(self, key: Hashable, like: torch.Tensor) -> torch.Tensor:
        """The residual for bucket ``key``, created as zeros shaped like ``like`` on first use.

        A bucket's shape and dtype are fixed for the life of the run; a mismatch means the caller mixed
        up buckets, so it raises. A buffer on another device (e.g. loaded from a CPU checkpoint) moves.
        """
        if like.dtype not in _WORKING_DTYPES:
            raise ValueError(f"residuals are float32 or float64, got {like.dtype} for bucket {key!r}")
        buf = self._residuals.get(key)
        if buf is None:
            buf = self._residuals[key] = torch.zeros_like(like, memory_format=torch.contiguous_format)
        elif buf.shape != like.shape or buf.dtype != like.dtype:
            raise ValueError(
                f"bucket {key!r} has a residual of shape {tuple(buf.shape)} and dtype {buf.dtype}, "
                f"but was asked for shape {tuple(like.shape)} and dtype {like.dtype}"
            )
        elif buf.device != like.device:
            buf = self._residuals[key] = buf.to(like.device)
        return buf

    def residual_norm(self) -> float:
        """L2 norm over all residual buffers (0.0 when there are none); inf or NaN if one is non-finite."""
        total = 0.0
        for buf in self._residuals.values():
            total += l2_norm(buf) ** 2
        return total**0.5

    def reset(self, nonfinite_only: bool = False) -> None:
        """Zero the residuals; with ``nonfinite_only``, only buffers that hold inf or NaN (after a bad step)."""
        for buf in self._residuals.values():
            if not nonfinite_only or not all_finite(buf):
                buf.zero_()

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"residuals": {key: buf.clone() for key, buf in self._residuals.items()}}
        compressor_state = getattr(self.compressor, "state_dict", None)
        if compressor_state is not None:
            state["compressor"] = compressor_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._residuals = {key: buf.clone() for key, buf in state["residuals"].items()}
        if "compressor" in state and hasattr(self.compressor, "load_state_dict"):
            self.compressor.load_state_dict(state["compressor"])

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.compressor!r}, buckets={len(self._residuals)})"
