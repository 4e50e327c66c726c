"""Shared plumbing for the block codecs: splitting a flat chunk into fixed-size blocks, and reading typed
fields out of a ``uint8`` payload.

Blocks are handled as one ``(n_blocks, block_size)`` matrix so every codec step is a single vectorised
torch op (no Python loop over blocks); a short last block is zero-padded, which leaves max|x| unchanged.
"""
from __future__ import annotations

import torch


def n_blocks(numel: int, block_size: int) -> int:
    """How many blocks of ``block_size`` cover ``numel`` elements (the last one may be short)."""
    return -(-numel // block_size)


def as_blocks(flat: torch.Tensor, block_size: int) -> torch.Tensor:
    """``flat`` as an ``(n_blocks, block_size)`` matrix; a view when it divides evenly, else a zero-padded copy."""
    numel = flat.numel()
    rows = n_blocks(numel, block_size)
    if rows * block_size == numel:
        return flat.view(rows, block_size)
    padded = flat.new_zeros(rows * block_size)
    padded[:numel].copy_(flat)
    return padded.view(rows, block_size)


def block_buffer(numel: int, block_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A float32 decode buffer: the padded flat tensor and its ``(n_blocks, block_size)`` view.

    The caller fills the first ``numel`` entries and returns ``flat[:numel]``, which stays contiguous.
    """
    rows = n_blocks(numel, block_size)
    flat = torch.zeros(rows * block_size, dtype=torch.float32, device=device)
    return flat, flat.view(rows, block_size)


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


def check_numel(numel: int) -> int:
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    return int(numel)
