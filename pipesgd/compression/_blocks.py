"""Shared plumbing for the block codecs: a flat chunk as block matrices (no copy of the whole blocks), tiles of them
worked through one reused buffer, and reading typed fields out of a ``uint8`` payload.

Blocks are handled as ``(rows, block_size)`` matrices so every codec step is one vectorised torch op per matrix
(no Python loop over blocks). The whole blocks are a view of the chunk; only a short last block is copied,
zero-padded, which leaves max|x| and sum|x| as they were and costs fewer than ``block_size`` elements.

On CPU an encode's temporaries (the zero-padded copy, the tile buffers) live in buffers of the calling thread that
every later call reuses (``workspace``): a fresh buffer costs an allocation and a zero-fill or page faults on every
call, which for a bucket's chunks is more than the codec's arithmetic. A decode writes straight into its output
(``BlockDecoder``): the caller's ``decompress_into`` target, or the fresh, unfilled tensor ``decompress`` makes.
"""
from __future__ import annotations

import math
import threading
from typing import Iterator

import torch

from pipesgd.compression.base import ChunkContext
from timing_model.codec_sizes import n_blocks

# A CPU tile: 256 Ki fp32 elements (1 MiB). Working tile by tile through one reused scratch buffer keeps a codec's
# temporaries small: a fresh multi-MB temporary costs page faults on every encode whenever the allocator has handed
# the last one back to the OS. Smaller tiles (an L2-sized 64 Ki) measured slower: each costs ~10 torch calls of Python
# overhead. On CUDA (and for chunks of at most one tile) one tile covers the whole chunk: fewer calls.
_CPU_TILE_ELEMENTS = 1 << 18

BlockMatrix = tuple[int, torch.Tensor]  # (index of its first block, an (rows, block_size) matrix)

_THREAD = threading.local()  # each thread's workspace buffers: the exchange's worker and the caller never share one


def workspace(slot: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A CPU buffer of ``numel`` elements (contents undefined) that the calling thread gets back at its next call with
    the same ``slot``: for temporaries that do not outlive one codec call."""
    buffers = getattr(_THREAD, "buffers", None)
    if buffers is None:
        buffers = _THREAD.buffers = {}
    buf = buffers.get((slot, dtype))
    if buf is None or buf.numel() < numel:
        buf = buffers[(slot, dtype)] = torch.empty(numel, dtype=dtype)
    return buf[:numel]


def _pads_all(numel: int, whole: int, device: torch.device) -> bool:
    """Whether a chunk with a short last block becomes one zero-padded matrix (a copy of all of it) rather than its
    whole blocks plus the short one: on CUDA, and for CPU chunks of at most one tile, the copy costs less than the
    second matrix's extra calls."""
    return numel <= _CPU_TILE_ELEMENTS or whole == 0 or device.type != "cpu"


def split_blocks(flat: torch.Tensor, block_size: int) -> list[BlockMatrix]:
    """``flat`` as block matrices, row for row what zero-padding all of ``flat`` to whole blocks gives.

    Whole blocks are a view. A short last block is zero-padded, with the whole chunk (``_pads_all``) or alone, as a
    second ``(1, block_size)`` matrix (a copy of fewer than ``block_size`` elements).
    """
    numel = flat.numel()
    whole = numel // block_size
    if whole * block_size == numel:
        return [(0, flat.view(whole, block_size))]
    if _pads_all(numel, whole, flat.device):
        size = (whole + 1) * block_size
        if flat.device.type == "cpu":
            padded = workspace("padded", size, flat.dtype)
            padded[numel:].zero_()
        else:
            padded = flat.new_zeros(size)
        padded[:numel].copy_(flat)
        return [(0, padded.view(whole + 1, block_size))]
    last = flat.new_zeros(block_size)
    last[: numel - whole * block_size].copy_(flat[whole * block_size :])
    return [(0, flat[: whole * block_size].view(whole, block_size)), (whole, last.view(1, block_size))]


def rows_of(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """``tensor[start:stop]``, or ``tensor`` itself when that is all of it (slicing costs a few microseconds, which
    small chunks feel)."""
    return tensor if start == 0 and stop == tensor.shape[0] else tensor[start:stop]


def split_output(out: torch.Tensor, block_size: int) -> list[BlockMatrix]:
    """The block matrices that view a decode's float32 output ``out`` (contiguous, 1-D), for element-wise decoding:
    the whole blocks as one matrix and a short last block, if any, as a ``(1, m)`` row (a zero-padded buffer would
    cost a fill and a copy out)."""
    numel = out.numel()
    whole = numel // block_size
    matrices = [(0, out[: whole * block_size].view(whole, block_size))] if whole else []
    if whole * block_size < numel:
        matrices.append((whole, out[whole * block_size :].view(1, -1)))
    return matrices


class BlockDecoder:
    """``decompress`` and ``decompress_into`` of a codec whose payload is one fp32 scale per block then the codes
    (``q8``, ``q4``, ``sign``): one decode path, writing into the output, whether the caller gives it or not. The
    codec supplies its ``name``, ``block_size``, ``payload_bytes``, the codes as one value per element (``_codes``)
    and how a block's scale turns them into values (``_scale``)."""

    __slots__ = ()  # the codecs are slotted dataclasses: a mixin with a __dict__ would give them one

    def decompress(self, payload: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
        out = torch.empty(ctx.numel, dtype=torch.float32, device=payload.device)
        return self.decompress_into(payload, out).to(ctx.dtype)

    def decompress_into(self, payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``decompress``'s values written into ``out`` (float32, contiguous, 1-D): no temporary. Returns ``out``."""
        numel = out.numel()
        check_payload(payload, self.payload_bytes(numel), self.name)
        if numel == 0:
            return out
        rows = n_blocks(numel, self.block_size)
        scale = view_bytes_as(payload[: 4 * rows], torch.float32)
        codes = self._codes(payload[4 * rows :], numel)
        matrices = split_output(out, self.block_size)
        out.copy_(codes)
        self._scale(matrices, scale)
        return out

    def _codes(self, code_bytes: torch.Tensor, numel: int) -> torch.Tensor:
        """The payload's code bytes as ``numel`` codes, one per element, in a dtype ``copy_`` turns into float32."""
        raise NotImplementedError

    def _scale(self, matrices: list[BlockMatrix], scale: torch.Tensor) -> None:
        """The codes in ``matrices`` (views of the output) made values in place, given every block's ``scale``."""
        raise NotImplementedError


def tile_rows(block_size: int, device: torch.device) -> int | None:
    """Rows per tile: whole blocks worth about one CPU tile (at least one block); None (no tiling) on CUDA."""
    if device.type != "cpu":
        return None
    return max(1, _CPU_TILE_ELEMENTS // block_size)


def tiles(matrices: list[BlockMatrix], rows_per_tile: int | None) -> Iterator[BlockMatrix]:
    """The rows of ``matrices`` in order, in views of at most ``rows_per_tile`` rows (all rows when None)."""
    for first, matrix in matrices:
        rows = matrix.shape[0]
        step = rows_per_tile or rows
        for row in range(0, rows, step):
            yield first + row, rows_of(matrix, row, min(row + step, rows))


def scratch(rows: int, block_size: int, rows_per_tile: int | None, device: torch.device,
            count: int = 1) -> list[torch.Tensor | None]:
    """``count`` float32 buffers of one tile each (of all ``rows`` when fewer), reused by every tile of one encode:
    on CPU the calling thread's ``workspace``, one allocation for all (each tile's buffers side by side); Nones on
    CUDA (no tiling: one temporary per encode from the caching allocator)."""
    if rows_per_tile is None:
        return [None] * count
    size = min(rows, rows_per_tile) * block_size
    return list(workspace("tiles", count * size, torch.float32).view(count, size).unbind())


def into_scratch(buffer: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """An ``out=`` tensor shaped like ``like`` at the start of ``buffer`` (None without a buffer: allocate)."""
    return None if buffer is None else buffer[: like.numel()].view_as(like)


def may_be_non_finite(scales: torch.Tensor, ask: bool) -> bool:
    """Whether per-block scales (each >= 0, inf or NaN) may hold inf or NaN. Asked (``ask``, on CPU) through their
    sum, one small reduction: a sum that overflows answers yes where no is true, which only costs masks that change
    nothing. Not asked (always yes) where reading the answer would make the host wait for the device (CUDA)."""
    return not ask or not math.isfinite(float(scales.sum()))


def view_bytes_as(payload: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret ``uint8`` bytes as ``dtype`` without a copy when aligned.

    A receiver may hand us a slice of a larger buffer whose offset is not a multiple of the element
    size; ``Tensor.view(dtype)`` refuses that, so we copy once rather than fail.
    """
    try:
        return payload.view(dtype)
    except RuntimeError:
        return payload.clone().view(dtype)


def check_payload(payload: torch.Tensor, expected_bytes: int, codec: str) -> None:
    """Fail loudly on a payload that cannot have come from this codec (wrong size or dtype)."""
    if payload.dtype != torch.uint8 or payload.dim() != 1 or payload.numel() != expected_bytes:
        raise ValueError(
            f"{codec}: expected a 1-D uint8 payload of {expected_bytes} bytes, "
            f"got {payload.dtype} of shape {tuple(payload.shape)}"
        )
