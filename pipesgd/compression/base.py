"""The compressor contract: what the ring needs from a codec, and nothing about ranks, rings or streams.

A compressor turns one contiguous chunk into a flat ``uint8`` payload whose size depends only on the
chunk's element count and working dtype, so a receiver can allocate the buffer before the bytes arrive.
A codec with random state (stochastic rounding) also satisfies :class:`StatefulCodec`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass(frozen=True, slots=True)
class ChunkContext:
    """What a receiver knows about a chunk without being told: its length and the ring's working dtype."""

    numel: int
    dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")


@runtime_checkable
class Compressor(Protocol):
    """A codec used on every ring hop.

    ``compress(t)`` takes a contiguous 1-D tensor of ``ChunkContext.dtype`` (float32 or float64) and returns
    ``(payload, ctx)``: ``payload`` is a contiguous 1-D ``uint8`` tensor of exactly
    ``payload_bytes(t.numel(), t.dtype)`` bytes. ``decompress(payload, ctx)`` returns a 1-D tensor of
    ``ctx.dtype`` and ``ctx.numel`` elements. A codec may also have ``decompress_into(payload, out)``, the same
    values written into a float32 ``out`` (``decode_into`` uses it where it can). ``decompress`` must be a pure function of the payload bytes,
    so every rank that decodes the same payload gets the same bits.
    """

    name: str
    lossless: bool

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, ChunkContext]: ...

    def decompress(self, payload: torch.Tensor, ctx: ChunkContext) -> torch.Tensor: ...

    def payload_bytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int: ...


def context_of(tensor: torch.Tensor) -> ChunkContext:
    """The context a receiver would build for a chunk like ``tensor``."""
    return ChunkContext(tensor.numel(), tensor.dtype, tensor.device)


def decode_into(compressor: Compressor, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out.copy_(compressor.decompress(payload, context_of(out)))``, the same bits, written straight into ``out``
    where the codec can (its ``decompress_into``, for a contiguous float32 ``out``: no temporary). Returns ``out``."""
    own_way = getattr(compressor, "decompress_into", None)
    if own_way is not None and out.dtype == torch.float32 and out.dim() == 1 and out.is_contiguous():
        return own_way(payload, out)
    return out.copy_(compressor.decompress(payload, context_of(out)))


def compression_ratio(compressor: Compressor, numel: int, dtype: torch.dtype = torch.float32) -> float:
    """Raw bytes over payload bytes for a chunk of ``numel`` elements (1.0 for an empty chunk)."""
    payload = compressor.payload_bytes(numel, dtype)
    raw = numel * torch.empty((), dtype=dtype).element_size()
    return raw / payload if payload else 1.0


@runtime_checkable
class StatefulCodec(Protocol):
    """A codec whose output depends on state it carries (the generators of stochastic rounding)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def codec_state(compressor: Compressor) -> dict[str, Any]:
    """The codec's own state for a checkpoint; {} for a stateless codec."""
    return compressor.state_dict() if isinstance(compressor, StatefulCodec) else {}


def load_codec_state(compressor: Compressor, state: dict[str, Any] | None) -> None:
    """Restore ``codec_state()``; an empty or missing state leaves the codec as built."""
    if state and isinstance(compressor, StatefulCodec):
        compressor.load_state_dict(state)
