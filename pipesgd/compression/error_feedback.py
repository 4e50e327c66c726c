"""Error feedback: the wrapper that owns per-bucket residuals and all of their arithmetic.

One ring over one bucket uses it through a :class:`HopEncoder` (``open_encoder``):

1. at the start of the ring: ``x += r``; ``r = 0`` — last step's compression error is sent now;
2. at every encode of a chunk at ``position``: ``r[position:] += chunk - decompress(compress(chunk))``
   (in "sum" units: the owner's error on a mean counts once per rank it averages over);
3. the decoded values go on as usual; over many steps nothing the compressor dropped is lost.
The ring only calls ``encode`` / ``settle_`` / ``decode``; it never touches a residual.
"""
from __future__ import annotations

from typing import Any, Hashable

import torch

from pipesgd import phases
from pipesgd.compression.base import ChunkContext, Compressor, codec_state, load_codec_state
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

    # -- checkpointing: residuals alone (a wrapper that saves its codec itself), or with the codec ----
    def residuals_state(self) -> dict[Hashable, torch.Tensor]:
        return {key: buf.clone() for key, buf in self._residuals.items()}

    def load_residuals_state(self, residuals: dict[Hashable, torch.Tensor]) -> None:
        self._residuals = {key: buf.clone() for key, buf in residuals.items()}

    def state_dict(self) -> dict[str, Any]:
        """The residuals and, for a stateful codec, its state (so this object alone resumes identically)."""
        state: dict[str, Any] = {"residuals": self.residuals_state()}
        compressor_state = codec_state(self.compressor)
        if compressor_state:
            state["compressor"] = compressor_state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_residuals_state(state["residuals"])
        load_codec_state(self.compressor, state.get("compressor"))

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.compressor!r}, buckets={len(self._residuals)})"


class HopEncoder:
    """Encodes and decodes the chunks of one ring over one flat tensor, without error feedback."""

    def __init__(self, compressor: Compressor, flat: torch.Tensor) -> None:
        self.compressor = compressor
        self._dtype, self._device = flat.dtype, flat.device

    def encode(self, x: torch.Tensor, position: int) -> torch.Tensor:
        """The payload of ``x``, the slice of the flat tensor that starts at element ``position``."""
        with phases.timed("codec"):
            payload, _ = self.compressor.compress(x)
        return payload

    def settle_(self, x: torch.Tensor, position: int) -> torch.Tensor:
        """The payload of a final chunk, which is replaced by its decoded value in place so the owner
        applies exactly the bits every other rank decodes."""
        with phases.timed("codec"):
            payload, _ = self.compressor.compress(x)
        x.copy_(self.decode(payload, x))
        return payload

    def decode(self, payload: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Decode a received payload for a chunk shaped like ``like`` (what a receiver knows unasked)."""
        with phases.timed("codec"):
            return self.compressor.decompress(payload, ChunkContext(like.numel(), self._dtype, self._device))


class FeedbackEncoder(HopEncoder):
    """A :class:`HopEncoder` that books every encode's error into a residual buffer of the flat tensor."""

    def __init__(self, compressor: Compressor, flat: torch.Tensor, residual: torch.Tensor, mean_over: int) -> None:
        super().__init__(compressor, flat)
        if residual.shape != flat.shape:
            raise ValueError(f"a residual of shape {tuple(residual.shape)} cannot serve a tensor of {tuple(flat.shape)}")
        # Step 1: last ring's compression error travels in this one.
        with phases.timed("error_feedback"):
            flat.add_(residual)
            residual.zero_()
        self._residual = residual
        # Final chunks hold sum / mean_over; the residual is kept in sum units.
        self._mean_over = mean_over

    def encode(self, x: torch.Tensor, position: int) -> torch.Tensor:
        payload = super().encode(x, position)
        # Step 2: what this encode dropped, kept for the next ring.
        with phases.timed("error_feedback"):
            self._residual[position : position + x.numel()].add_(x - self._decode_plain(payload, x))
        return payload

    def settle_(self, x: torch.Tensor, position: int) -> torch.Tensor:
        with phases.timed("codec"):
            payload, _ = self.compressor.compress(x)
        decoded = self.decode(payload, x)
        with phases.timed("error_feedback"):
            self._residual[position : position + x.numel()].add_((x - decoded) * self._mean_over)
        x.copy_(decoded)
        return payload

    def _decode_plain(self, payload: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """A decode that error feedback alone needs (booked as feedback's cost, not the codec's)."""
        return self.compressor.decompress(payload, ChunkContext(like.numel(), self._dtype, self._device))


def open_encoder(
    compressor: Compressor, flat: torch.Tensor, residual: torch.Tensor | None = None, mean_over: int = 1
) -> HopEncoder:
    """The encoder for one ring over ``flat``; with a ``residual`` (from ``ErrorFeedback.residual``) it first
    folds the residual into ``flat``. ``mean_over``: the divisor the ring applied to its final chunks."""
    if residual is None:
        return HopEncoder(compressor, flat)
    return FeedbackEncoder(compressor, flat, residual, mean_over)
