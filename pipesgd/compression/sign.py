"""``sign``: scaled 1-bit quantization as in CNTK's 1-bit SGD (Seide et al., 2014).

Per block: one fp32 scale = mean|x| over the block's real elements, and one bit per element
(x >= 0, packed 8 per byte, element 8i+k in bit k of byte i). Decoding gives +scale or -scale.
The codec is biased, so it is only meaningful with error feedback; ``PipeSGDOptions`` enforces that
(``pipesgd.defaults.NEEDS_ERROR_FEEDBACK``).

Speed: on CPU numpy packs and unpacks the bits (``packbits``/``unpackbits``, little bit order: the same
bytes), |x| goes through one reused tile buffer and no copy of the input's whole blocks is made; on CUDA the torch
kernels below run and nothing waits for the host. The bytes are those of ``tests/codec_reference.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipesgd.compression._blocks import (
    BlockDecoder,
    BlockMatrix,
    into_scratch,
    may_be_non_finite,
    rows_of,
    scratch,
    split_blocks,
    tile_rows,
    tiles,
)
from pipesgd.compression.base import ChunkContext, context_of
from pipesgd.compression.quantize import check_block_size
from timing_model.codec_sizes import n_blocks, payload_bytes
from pipesgd.defaults import QUANT_BLOCK_SIZE


_BIT_WEIGHTS: dict[torch.device, torch.Tensor] = {}
# sum over k of 2**(56 - 7k): byte k of a word (bit 8k) times 2**(56 - 7k) lands on bit 56 + k. The product
# wraps modulo 2**64 (torch's int64 multiply), which only drops bits above the top byte.
_GATHER = 0x0102040810204080


def _bit_weights(device: torch.device) -> torch.Tensor:
    """[1, 2, ..., 128] on ``device``, built once per device: building it from a Python list on every
    decode would be a host-to-device copy each time."""
    weights = _BIT_WEIGHTS.get(device)
    if weights is None:
        weights = _BIT_WEIGHTS[device] = torch.tensor([1 << k for k in range(8)], dtype=torch.uint8, device=device)
    return weights


_PADDED_ROWS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _padded_rows(block: int, length: int, lengths: list[int],
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For rows of ``length`` elements of which the first ``lengths[j]`` are real: each block's count of real
    elements (flat, fp32; at least 1, so an all-padding block's scale is 0 / 1 = 0 as 0 / block would be) and each
    code byte's mask of real bits. Made once per shape and kept on ``device`` (a bucket's chunks have the same
    lengths every step), so the rows cost no Python loop and no host-to-device copy after the first call."""
    key = (block, length, tuple(lengths), device)
    made = _PADDED_ROWS.get(key)
    if made is None:
        if len(_PADDED_ROWS) >= 64:  # a bound: shapes come from buckets, a handful per run
            _PADDED_ROWS.clear()
        real = torch.tensor(lengths, dtype=torch.int64)[:, None]
        counts = (real - torch.arange(0, length, block)).clamp_(1, block).to(torch.float32).view(-1)
        keep = ((1 << (real - torch.arange(0, length, 8)).clamp_(0, 8)) - 1).to(torch.uint8)
        made = _PADDED_ROWS[key] = (counts.to(device), keep.to(device))
    return made


def _on_host(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is in host memory. There numpy packs and unpacks the sign bits (much faster than torch's
    comparison to bool and its bit masks) and asking whether a scale is bad costs no sync; on CUDA the torch
    kernels run and masks apply unasked, so nothing waits for the host."""
    return tensor.device.type == "cpu"


@dataclass(frozen=True, slots=True)
class SignCompressor(BlockDecoder):
    """One bit per element plus one fp32 scale (mean |x|) per block of ``block_size`` elements."""

    block_size: int = QUANT_BLOCK_SIZE

    name = "sign"
    lossless = False

    def __post_init__(self) -> None:
        check_block_size(self.block_size)

    def payload_bytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        return payload_bytes(self.name, numel, self.block_size)

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, ChunkContext]:
        return self._compress(tensor, None), context_of(tensor)

    def compress_padded_rows(self, matrix: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """The payload of ``matrix`` (rows of a whole number of blocks, each ``lengths[j]`` real elements then
        zeros; ``block_size`` a multiple of 8) as ``compress`` gives it, except that every row's blocks and bytes are
        those of ``compress(row[:lengths[j]])``: the short last block's scale is the mean over its real elements,
        and the bits past a row's real elements are 0 (``pipesgd.compression.rows`` batches with it)."""
        rows, length = matrix.shape
        counts, keep = _padded_rows(self.block_size, length, lengths, matrix.device)
        payload = self._compress(matrix.reshape(-1), counts)
        # The zeros' sign bits, set by x >= 0, cleared as compress pads its last byte.
        payload[4 * counts.numel() :].view(rows, length // 8).bitwise_and_(keep)
        return payload

    def _compress(self, tensor: torch.Tensor, counts: torch.Tensor | None) -> torch.Tensor:
        """``compress``'s payload; ``counts``: each block's number of real elements (None: every block whole but
        a short last one)."""
        numel = tensor.numel()
        payload = torch.empty(self.payload_bytes(numel), dtype=torch.uint8, device=tensor.device)
        if numel == 0:
            return payload
        x = tensor.detach().to(torch.float32)  # the out= kernels below refuse a tensor that requires grad
        matrices = split_blocks(x, self.block_size)  # zero padding adds nothing to the sums below
        rows = n_blocks(numel, self.block_size)

        # Step 1: scale = mean|x| over the real elements; inf or NaN in the input makes the scale NaN.
        # The sum stays in fp32 (fp64 accumulation costs several times as much on CPU): a block whose |x| sums past 3.4e38
        # also reads as NaN, which only happens to gradients that are already about to overflow.
        # |x| goes tile by tile through one reused scratch; each row's sum is computed exactly as over all rows.
        per_tile = tile_rows(self.block_size, x.device)
        (buffer,) = scratch(rows, self.block_size, per_tile, x.device)
        sums = [torch.abs(blocks, out=into_scratch(buffer, blocks)).sum(dim=1)
                for _, blocks in tiles(matrices, per_tile)]
        sums = sums[0] if len(sums) == 1 else torch.cat(sums)
        scale = payload[: 4 * rows].view(torch.float32)  # computed in place in the payload
        if counts is not None:
            torch.div(sums, counts, out=scale)
        elif numel == rows * self.block_size:
            torch.div(sums, float(self.block_size), out=scale)  # the count, as fp32 like the tensor below
        else:
            counts = torch.full((rows,), float(self.block_size), dtype=torch.float32, device=x.device)
            counts[-1] = numel - (rows - 1) * self.block_size
            torch.div(sums, counts, out=scale)
        if may_be_non_finite(scale, _on_host(x)):
            scale.masked_fill_(~torch.isfinite(scale), float("nan"))

        # Step 2: sign bits (x >= 0, so -0.0 sets its bit and NaN does not), packed little-endian within each byte.
        if _on_host(x):
            with np.errstate(invalid="ignore"):
                signs = np.greater_equal(x.detach().numpy(), 0)
            payload[4 * rows :].numpy()[:] = np.packbits(signs, bitorder="little")
            return payload
        # On CUDA: bits padded to whole bytes, each 8 bytes of 0/1 read as one int64 and multiplied by _GATHER,
        # which moves byte k's bit to bit 56 + k without carries (the partial products all land on distinct bits),
        # so the top byte is the packed byte: two passes over n/8 words instead of eight strided passes over n bytes.
        n_bytes = (numel + 7) // 8
        bits = torch.empty(8 * n_bytes, dtype=torch.uint8, device=x.device)
        bits[numel:].zero_()
        torch.ge(x, 0, out=bits[:numel].view(torch.bool))
        words = bits.view(torch.int64).mul_(_GATHER).bitwise_right_shift_(56)
        payload[4 * rows :].copy_(words)  # the low byte of each word (int64 -> uint8 keeps it, modulo 256)
        return payload

    def _codes(self, packed: torch.Tensor, numel: int) -> torch.Tensor:
        if _on_host(packed):
            return torch.from_numpy(np.unpackbits(packed.numpy(), count=numel, bitorder="little"))
        return (packed[:, None] & _bit_weights(packed.device)).ne_(0).view(-1)[:numel]

    def _scale(self, matrices: list[BlockMatrix], scale: torch.Tensor) -> None:
        scale = scale[:, None]
        # bit * 2s - s is exactly +s or -s in fp32 (2s and 2s - s are exact).
        for row, blocks in matrices:
            block_scale = rows_of(scale, row, row + blocks.shape[0])
            blocks.mul_(2 * block_scale).sub_(block_scale)

    def __repr__(self) -> str:
        return f"SignCompressor(block_size={self.block_size})"
