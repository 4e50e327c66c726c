"""A frozen copy of the q8 / q4 / sign codecs as they were at commit 95f249f (before issue 11 part 4 made them
cheaper): the bit-exact reference the new kernels are tested against and the "old" side of
``experiments/bench_codecs.py``. Never edit the code below: it is the definition of the wire format's bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from pipesgd.compression.base import ChunkContext, context_of

QUANT_BLOCK_SIZE = 4096


# ---- pipesgd/compression/_blocks.py ------------------------------------------------------------------
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


# ---- pipesgd/compression/quantize.py -----------------------------------------------------------------
_Q4_OFFSET = 8  # stores code + 8 in a nibble: codes [-7, 7] become [1, 15]


def _pad_to(flat: torch.Tensor, numel: int) -> torch.Tensor:
    padded = flat.new_zeros(numel)
    padded[: flat.numel()].copy_(flat)
    return padded


def _ask_before_masking(tensor: torch.Tensor) -> bool:
    """Whether to ask if any block is bad before masking: free on CPU (and it saves two masked passes), but
    on CUDA the answer is a host sync per encode, so there the masks run unconditionally (no-ops when clean)."""
    return not tensor.is_cuda


def check_block_size(block_size: Any) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")


@dataclass(slots=True)
class ReferenceScalarQuantizer:
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
        numel = check_numel(numel)
        return 4 * n_blocks(numel, self.block_size) + (numel * self.bits + 7) // 8

    # -- encode ---------------------------------------------------------------------------------------
    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, ChunkContext]:
        ctx = context_of(tensor)
        numel = ctx.numel
        payload = torch.empty(self.payload_bytes(numel), dtype=torch.uint8, device=tensor.device)
        if numel == 0:
            return payload, ctx
        blocks = as_blocks(tensor.to(torch.float32), self.block_size)
        rows = blocks.shape[0]

        # Step 1: per-block scale; inf or NaN anywhere in the block makes it NaN so decoding shows it.
        # max(amax, -amin) equals max|x| bit for bit and runs ~3x faster than abs().amax() (no temporary).
        scale = torch.maximum(blocks.amax(dim=1), blocks.amin(dim=1).neg_()).div_(self.qmax)
        bad = ~torch.isfinite(scale)
        any_bad = bool(bad.any()) if _ask_before_masking(tensor) else True
        if any_bad:
            scale.masked_fill_(bad, float("nan"))
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # zero and NaN blocks divide by 1

        # Step 2: codes in float, rounded deterministically or stochastically.
        codes = blocks / safe[:, None]
        if self.stochastic:
            codes.add_(torch.rand(codes.shape, generator=self._generator(tensor.device), device=tensor.device))
            codes.floor_()
            # Step 3: floor(x / scale + u) can reach qmax + 1 when x / scale exceeds qmax by an ulp.
            codes.clamp_(-self.qmax, self.qmax)
        else:
            # Step 3: |x / scale| <= qmax * (1 + eps) < qmax + 0.5, so rounding stays in range: no clamp.
            codes.round_()
        if any_bad:
            codes.masked_fill_(bad[:, None], 0.0)  # valid (zero) codes for blocks whose scale is NaN

        payload[: 4 * rows].view(torch.float32).copy_(scale)
        flat_codes = codes.view(-1)[:numel]
        code_bytes = payload[4 * rows :]
        if self.bits == 8:
            code_bytes.view(torch.int8).copy_(flat_codes)
        else:
            # Pack in float, where (c0 + 8) + 16 * (c1 + 8) is exact, then convert once to uint8.
            even = 2 * code_bytes.numel()
            pairs = codes.view(-1)[:even] if even <= codes.numel() else _pad_to(flat_codes, even)
            pairs = pairs.view(-1, 2)
            code_bytes.copy_(torch.add(pairs[:, 0], pairs[:, 1], alpha=16).add_(_Q4_OFFSET * 17))
        return payload, ctx

    # -- decode ---------------------------------------------------------------------------------------
    def decompress(self, payload: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
        numel = ctx.numel
        check_payload(payload, self.payload_bytes(numel), self.name)
        if numel == 0:
            return torch.empty(0, dtype=ctx.dtype, device=payload.device)
        rows = n_blocks(numel, self.block_size)
        scale = view_bytes_as(payload[: 4 * rows], torch.float32)
        code_bytes = payload[4 * rows :]
        flat, blocks = block_buffer(numel, self.block_size, payload.device)
        if self.bits == 8:
            flat[:numel].copy_(code_bytes.view(torch.int8))
        else:
            nibbles = torch.stack((code_bytes & 0xF, code_bytes >> 4), dim=1).view(-1)[:numel]
            flat[:numel].copy_(nibbles)
            flat[:numel].sub_(_Q4_OFFSET)
        blocks.mul_(scale[:, None])
        return flat[:numel].to(ctx.dtype)

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


# ---- pipesgd/compression/sign.py ---------------------------------------------------------------------
_BIT_WEIGHTS: dict[torch.device, torch.Tensor] = {}
# sum over k of 2**(56 - 7k): byte k of a word (bit 8k) times 2**(56 - 7k) lands on bit 56 + k. The product
# wraps modulo 2**64 (torch's int64 multiply), which only drops bits above the top byte.
_GATHER = 0x0102040810204080


def _bit_weights(device: torch.device) -> torch.Tensor:
    """[1, 2, ..., 128] on ``device``, built once per device: building it from a Python list on every
    decode was a host-to-device copy each time."""
    weights = _BIT_WEIGHTS.get(device)
    if weights is None:
        weights = _BIT_WEIGHTS[device] = torch.tensor([1 << k for k in range(8)], dtype=torch.uint8, device=device)
    return weights


@dataclass(frozen=True, slots=True)
class ReferenceSignCompressor:
    """One bit per element plus one fp32 scale (mean |x|) per block of ``block_size`` elements."""

    block_size: int = QUANT_BLOCK_SIZE

    name = "sign"
    lossless = False

    def __post_init__(self) -> None:
        check_block_size(self.block_size)

    def payload_bytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        numel = check_numel(numel)
        return 4 * n_blocks(numel, self.block_size) + (numel + 7) // 8

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, ChunkContext]:
        ctx = context_of(tensor)
        numel = ctx.numel
        payload = torch.empty(self.payload_bytes(numel), dtype=torch.uint8, device=tensor.device)
        if numel == 0:
            return payload, ctx
        x = tensor.to(torch.float32)
        blocks = as_blocks(x, self.block_size)  # zero padding adds nothing to the sums below
        rows = blocks.shape[0]

        # Step 1: scale = mean|x| over the real elements; inf or NaN in the input makes the scale NaN.
        # The sum stays in fp32 (fp64 accumulation costs 3x on CPU): a block whose |x| sums past 3.4e38
        # also reads as NaN, which only happens to gradients that are already about to overflow.
        counts = torch.full((rows,), float(self.block_size), dtype=torch.float32, device=x.device)
        counts[-1] = numel - (rows - 1) * self.block_size
        scale = blocks.abs().sum(dim=1) / counts
        scale.masked_fill_(~torch.isfinite(scale), float("nan"))
        payload[: 4 * rows].view(torch.float32).copy_(scale)

        # Step 2: sign bits, padded to whole bytes and packed little-endian within each byte: each 8 bytes of
        # 0/1 read as one int64 and multiplied by _GATHER, which moves byte k's bit to bit 56 + k without carries
        # (the partial products all land on distinct bits), so the top byte is the packed byte: two passes over
        # n/8 words instead of eight strided passes over n bytes.
        n_bytes = (numel + 7) // 8
        bits = torch.empty(8 * n_bytes, dtype=torch.uint8, device=x.device)
        bits[numel:].zero_()
        torch.ge(x, 0, out=bits[:numel].view(torch.bool))
        words = bits.view(torch.int64).mul_(_GATHER).bitwise_right_shift_(56)
        payload[4 * rows :].copy_(words)  # the low byte of each word (int64 -> uint8 keeps it, modulo 256)
        return payload, ctx

    def decompress(self, payload: torch.Tensor, ctx: ChunkContext) -> torch.Tensor:
        numel = ctx.numel
        check_payload(payload, self.payload_bytes(numel), self.name)
        if numel == 0:
            return torch.empty(0, dtype=ctx.dtype, device=payload.device)
        rows = n_blocks(numel, self.block_size)
        scale = view_bytes_as(payload[: 4 * rows], torch.float32)[:, None]
        packed = payload[4 * rows :]
        bits = (packed[:, None] & _bit_weights(payload.device)).ne_(0).view(-1)[:numel]
        flat, blocks = block_buffer(numel, self.block_size, payload.device)
        flat[:numel].copy_(bits)
        # bit * 2s - s is exactly +s or -s in fp32 (2s and 2s - s are exact).
        blocks.mul_(2 * scale).sub_(scale)
        return flat[:numel].to(ctx.dtype)

    def __repr__(self) -> str:
        return f"SignCompressor(block_size={self.block_size})"
