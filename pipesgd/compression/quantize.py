"""``q8`` and ``q4``: uniform symmetric scalar quantization with one fp32 scale per block.

The paper's "scalar quantization" compressor. Encoding, per block of ``block_size`` elements:
1. scale = max|x| / qmax (qmax = 127 for 8 bits, 7 for 4 bits); a non-finite block gets a NaN scale.
2. code = round(x / scale), to nearest (ties to even), or stochastically: floor(x / scale + u),
   u ~ U[0, 1), which is unbiased (E[code * scale] = x).
3. code is clamped to [-qmax, qmax]; an all-zero block divides by 1 instead of 0 and codes zeros.

Payload layout: ``n_blocks`` fp32 scales, then the codes (int8 for q8; for q4, two codes per byte as code + 8,
element 2i in the low nibble and 2i+1 in the high nibble; an odd count pads with code 0). Decoding: code * scale.

Speed: no copy of the input's whole blocks, codes computed tile by tile through one reused buffer and
written straight into the payload, q4 packed with one integer multiply per four codes; the bytes are those of the
straightforward version (``tests/codec_reference.py``), and stochastic rounding draws the same numbers in the
same order (one per element of the zero-padded blocks). On CUDA nothing waits for the host.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

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
from timing_model.codec_sizes import n_blocks, payload_bytes
from pipesgd.defaults import QUANT_BLOCK_SIZE

_Q4_OFFSET = 8  # stores code + 8 in a nibble: codes [-7, 7] become [1, 15]
# Four nibbles a0..a3 (one per byte of an int32, little-endian) times 0x110 = 16 + 256: the partial products land on
# eight distinct nibbles (a0 at bits 4 and 8, a1 at 12 and 16, a2 at 20 and 24, a3 at 28 and 32, which wraps away),
# so without a carry byte 1 holds a0 | a1 << 4 and byte 3 holds a2 | a3 << 4: the packed bytes, every other byte.
_NIBBLE_GATHER = 0x110
_LITTLE_ENDIAN = sys.byteorder == "little"


def _ask_before_masking(tensor: torch.Tensor) -> bool:
    """Whether to ask if any block is bad before masking: free on CPU (and it saves two masked passes), but
    on CUDA the answer is a host sync per encode, so there the masks run unconditionally (no-ops when clean)."""
    return not tensor.is_cuda


def check_block_size(block_size: Any) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")


@dataclass(slots=True)
class ScalarQuantizer(BlockDecoder):
    """Block-wise symmetric quantizer to ``bits`` (8 or 4) bits per element plus one fp32 scale per block."""

    # Codec parameters: fixed at build time, part of the wire format.
    bits: int
    block_size: int = QUANT_BLOCK_SIZE
    # Stochastic rounding: unbiased, drawn from a per-device generator seeded with ``seed``.
    stochastic: bool = False
    seed: int = 0
    # Generators by device, created on first use; their state is checkpointed via state_dict().
    _generators: dict[str, torch.Generator] = field(default_factory=dict, init=False, repr=False)

    lossless = False

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {self.bits!r}")
        check_block_size(self.block_size)
        if not isinstance(self.stochastic, bool):
            raise ValueError(f"stochastic must be a bool, got {self.stochastic!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")

    @property
    def name(self) -> str:
        return f"q{self.bits}"

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    def payload_bytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        return payload_bytes(self.name, numel, self.block_size)

    # -- encode ---------------------------------------------------------------------------------------
    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, ChunkContext]:
        ctx = context_of(tensor)
        numel = ctx.numel
        device = tensor.device
        payload = torch.empty(self.payload_bytes(numel), dtype=torch.uint8, device=device)
        if numel == 0:
            return payload, ctx
        # Whole fp32 blocks are not copied; detached, as the out= kernels below refuse a tensor that requires grad.
        matrices = split_blocks(tensor.detach().to(torch.float32), self.block_size)
        rows = n_blocks(numel, self.block_size)

        # Step 1: per-block scale; inf or NaN anywhere in the block makes it NaN so decoding shows it.
        # max(amax, -amin) equals max|x| bit for bit and is faster than abs().amax() (no temporary); aminmax, one
        # call for both, is many times slower on CPU. The scales are computed in place in the payload.
        scale = payload[: 4 * rows].view(torch.float32)
        if len(matrices) == 1:
            blocks = matrices[0][1]
            torch.maximum(blocks.amax(dim=1), blocks.amin(dim=1).neg_(), out=scale)
        else:
            torch.cat([torch.maximum(blocks.amax(dim=1), blocks.amin(dim=1).neg_()) for _, blocks in matrices],
                      out=scale)
        scale.div_(self.qmax)
        any_bad = may_be_non_finite(scale, _ask_before_masking(tensor))
        if any_bad:
            bad = ~torch.isfinite(scale)
            scale.masked_fill_(bad, float("nan"))
        safe = torch.where(scale > 0, scale, 1.0)  # zero and NaN blocks divide by 1

        # Steps 2 and 3, tile by tile through one scratch buffer: codes in float, then straight into int8 (q8: the
        # payload itself; q4: a buffer of whole int32 words for the packing).
        code_bytes = payload[4 * rows :]
        codes = code_bytes.view(torch.int8) if self.bits == 8 else torch.empty(
            -(-numel // 4) * 4, dtype=torch.int8, device=device)
        per_tile = tile_rows(self.block_size, device)
        buffers = scratch(rows, self.block_size, per_tile, device, count=2 if self.stochastic else 1)
        buffer, noise = buffers[0], buffers[-1]  # noise: the second buffer, read only by stochastic rounding
        for row, blocks in tiles(matrices, per_tile):
            stop = row + blocks.shape[0]
            q = torch.div(blocks, rows_of(safe, row, stop)[:, None], out=into_scratch(buffer, blocks))
            if self.stochastic:
                # u ~ U[0, 1) for every element of the padded blocks, tile after tile: the numbers, and the order
                # they are drawn in, of one torch.rand over all blocks (uniform_ is what torch.rand runs).
                generator = self._generator(device)
                u = into_scratch(noise, q)
                q.add_(torch.rand(q.shape, generator=generator, device=device) if u is None
                       else u.uniform_(generator=generator))
                q.floor_()
                # Step 3: floor(x / scale + u) can reach qmax + 1 when x / scale exceeds qmax by an ulp.
                q.clamp_(-self.qmax, self.qmax)
            else:
                # Step 3: |x / scale| <= qmax * (1 + eps) < qmax + 0.5, so rounding stays in range: no clamp.
                q.round_()
            if any_bad:
                q.masked_fill_(rows_of(bad, row, stop)[:, None], 0.0)  # valid (zero) codes where the scale is NaN
            start = row * self.block_size
            count = min(q.numel(), numel - start)  # a padded last block keeps only its real elements
            q = q.view(-1)
            rows_of(codes, start, start + count).copy_(rows_of(q, 0, count))  # exact: the floats are whole numbers
        if self.bits == 4:
            _pack_nibbles(codes, numel, code_bytes)
        return payload, ctx

    # -- decode ---------------------------------------------------------------------------------------
    def _codes(self, code_bytes: torch.Tensor, numel: int) -> torch.Tensor:
        return code_bytes.view(torch.int8) if self.bits == 8 else rows_of(_unpack_nibbles(code_bytes), 0, numel)

    def _scale(self, matrices: list[BlockMatrix], scale: torch.Tensor) -> None:
        for row, blocks in matrices:
            blocks.mul_(rows_of(scale, row, row + blocks.shape[0])[:, None])

    # -- checkpointing --------------------------------------------------------------------------------
    def _generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        gen = self._generators.get(key)
        if gen is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(self.seed)
            self._generators[key] = gen
        return gen

    def state_dict(self) -> dict[str, Any]:
        """Random state of the stochastic rounding, so a resumed run draws the same numbers."""
        return {"generators": {key: gen.get_state() for key, gen in self._generators.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._generators.clear()
        for key, gen_state in state.get("generators", {}).items():
            self._generator(torch.device(key)).set_state(gen_state.cpu())


def _pack_nibbles(codes: torch.Tensor, numel: int, out: torch.Tensor) -> None:
    """Pack int8 codes in [-7, 7] two per byte into ``out`` (element 2i in the low nibble), in place in ``codes``
    (whole int32 words; slots past ``numel`` become code 0, which pads an odd count as the format says)."""
    if codes.numel() > numel:
        codes[numel:].zero_()
    codes.add_(_Q4_OFFSET)  # [1, 15]: one nibble per byte
    if _LITTLE_ENDIAN:
        # The packed bytes sit in the high byte of every int16: shift them down in place, then int16 -> uint8
        # keeps the low byte (contiguous passes; a strided copy of every other byte is much slower).
        words = codes.view(torch.int32).mul_(_NIBBLE_GATHER).view(torch.int16).bitwise_right_shift_(8)
        out.copy_(rows_of(words, 0, out.numel()))
    else:
        pairs = codes[: 2 * out.numel()]
        torch.bitwise_or(pairs[0::2], pairs[1::2].bitwise_left_shift(4), out=out.view(torch.int8))


def _unpack_nibbles(code_bytes: torch.Tensor) -> torch.Tensor:
    """The int8 codes of a q4 payload's code bytes, two per byte (low nibble first)."""
    if _LITTLE_ENDIAN:
        # Byte b = lo + 16 hi widened to int16 and plus 15 * (16 hi) is lo + 256 hi: lo in the low byte, hi in the
        # high one, which is the int8 pair (lo, hi) in memory. Contiguous integer passes, faster than stack().
        words = code_bytes.to(torch.int16)
        nibbles = words.add_(words & 0xF0, alpha=15).view(torch.int8)
    else:
        nibbles = torch.stack((code_bytes & 0xF, code_bytes >> 4), dim=1).view(-1).view(torch.int8)
    return nibbles.sub_(_Q4_OFFSET)


def build_q8(**options: Any) -> ScalarQuantizer:
    return ScalarQuantizer(bits=8, **options)


def build_q4(**options: Any) -> ScalarQuantizer:
    return ScalarQuantizer(bits=4, **options)
