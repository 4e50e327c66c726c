"""Half-width casts: ``fp16`` (IEEE half, round to nearest) and ``bf16`` (truncation of fp32).

``bf16`` is the paper's "truncation" compressor: keep the upper 16 bits of each fp32 word (sign, 8-bit
exponent, 7 mantissa bits) and drop the rest. It is not round-to-nearest: the error is one-sided toward
zero and at most 2^-7 relative, but it needs only a shift, and decoding is a shift back.
"""
from __future__ import annotations

import sys

import torch

from pipesgd.compression._blocks import check_payload, view_bytes_as
from pipesgd.compression.base import ChunkContext, context_of
from timing_model.codec_sizes import payload_bytes


_LITTLE_ENDIAN = sys.byteorder == "little"


class Float16Cast:
    """Cast to IEEE float16 (2 bytes per element).

    fp64 input is cast to fp32 first, like every lossy codec here, so fp32 and fp64 rings send the same
    bits. Values above 65504 become ±inf and tiny ones flush toward zero: fine for gradients of usual
    scale, and a non-finite result is visible to the caller rather than hidden.
    """

    name = "fp16"
    lossless = False

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, ChunkContext]:
        half = tensor.to(torch.float32).to(torch.float16)
        return half.view(torch.uint8), context_of(tensor)

    def decompress(self, payload: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
        check_payload(payload, self.payload_bytes(ctx.numel, ctx.dtype), self.name)
        return view_bytes_as(payload, torch.float16).to(ctx.dtype)

    def decompress_into(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``decompress``'s values written into ``out``: no temporary. Returns ``out``."""
        check_payload(payload, self.payload_bytes(out.numel()), self.name)
        return out.copy_(view_bytes_as(payload, torch.float16))

    def payload_bytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        return payload_bytes(self.name, numel)

    def __repr__(self) -> str:
        return "Float16Cast()"


class BFloat16Truncation:
    """Keep the upper 16 bits of each fp32 word (bfloat16 by truncation, not rounding).

    NaN and ±inf keep their exponent bits and stay non-finite (a NaN whose payload sits only in the
    low 16 mantissa bits becomes inf, still non-finite; quiet NaNs as produced by arithmetic stay NaN).
    """

    name = "bf16"
    lossless = False

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, ChunkContext]:
        words = tensor.to(torch.float32)
        if _LITTLE_ENDIAN:
            # The upper half of each word is the second int16: one strided copy, faster than shifting.
            halves = words.view(torch.int16)
            upper = torch.empty(words.numel(), dtype=torch.int16, device=words.device).copy_(halves[1::2])
        else:
            # Arithmetic shift keeps the sign bit in place, so the result fits int16 exactly.
            upper = torch.bitwise_right_shift(words.view(torch.int32), 16).to(torch.int16)
        return upper.view(torch.uint8), context_of(tensor)

    def decompress(self, payload: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
        check_payload(payload, self.payload_bytes(ctx.numel, ctx.dtype), self.name)
        # bfloat16 -> float32 is exactly "shift left by 16" (NaN payloads and subnormals kept), vectorised.
        return view_bytes_as(payload, torch.bfloat16).to(ctx.dtype)

    def decompress_into(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``decompress``'s values written into ``out``: no temporary. Returns ``out``."""
        check_payload(payload, self.payload_bytes(out.numel()), self.name)
        return out.copy_(view_bytes_as(payload, torch.bfloat16))

    def payload_bytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        return payload_bytes(self.name, numel)

    def __repr__(self) -> str:
        return "BFloat16Truncation()"
