"""How many bytes each codec puts on the wire: bits per element and one fp32 scale per block, by codec name.

The one owner of the payload arithmetic: the codec classes' ``payload_bytes`` and the timing model's compression
ratios (``timing_model.params.CODEC_RATIOS``) both read it. Torch-free, so the analytic model loads without torch.
"""
from __future__ import annotations

__all__ = ["QUANT_BLOCK_SIZE", "BITS_PER_ELEMENT", "BLOCK_SCALED", "CODECS", "SCALE_BYTES", "check_numel", "fp32_ratio", "n_blocks",
           "payload_bytes"]

QUANT_BLOCK_SIZE = 4096  # elements per fp32 scale in the q8/q4/sign payloads (the codecs' default block)

# Bits each codec sends per element; "none" sends the working dtype's own bits (8 per byte of it).
BITS_PER_ELEMENT = {"none": None, "fp16": 16, "bf16": 16, "q8": 8, "q4": 4, "sign": 1}
CODECS = tuple(BITS_PER_ELEMENT)
# Codecs whose payload opens with one fp32 scale per block of ``block_size`` elements (the last block may be short).
BLOCK_SCALED = ("q8", "q4", "sign")
SCALE_BYTES = 4
FP32_BYTES = 4


def check_numel(numel: int) -> int:
    """``numel`` as an int; a negative count raises ``ValueError``."""
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    return int(numel)


def n_blocks(numel: int, block_size: int) -> int:
    """How many blocks of ``block_size`` cover ``numel`` elements (the last one may be short)."""
    return -(-numel // block_size)


def payload_bytes(name: str, numel: int, block_size: int = QUANT_BLOCK_SIZE, element_bytes: int = FP32_BYTES) -> int:
    """Bytes of codec ``name``'s payload for a chunk of ``numel`` elements: the block scales, then the codes packed
    to whole bytes. ``element_bytes`` is the working dtype's size (it matters for ``none`` only: the lossy codecs
    cast to fp32 first); an unknown name raises ``ValueError`` with the valid ones."""
    if name not in BITS_PER_ELEMENT:
        raise ValueError(f"unknown codec {name!r}; valid: {', '.join(CODECS)}")
    numel = check_numel(numel)
    bits = BITS_PER_ELEMENT[name] or 8 * element_bytes
    scales = SCALE_BYTES * n_blocks(numel, block_size) if name in BLOCK_SCALED else 0
    return scales + (numel * bits + 7) // 8


def fp32_ratio(name: str, block_size: int = QUANT_BLOCK_SIZE) -> float:
    """Raw fp32 bytes over payload bytes of a gradient of whole blocks: 32/bits, and for the block-scaled codecs
    32·b/(bits·b + 32) with b = ``block_size`` (one 32-bit scale per block); 1 for ``none``."""
    if name not in BITS_PER_ELEMENT:
        raise ValueError(f"unknown codec {name!r}; valid: {', '.join(CODECS)}")
    bits = BITS_PER_ELEMENT[name] or 8 * FP32_BYTES
    if name in BLOCK_SCALED:
        return 8 * FP32_BYTES * block_size / (bits * block_size + 8 * SCALE_BYTES)
    return 8 * FP32_BYTES / bits
