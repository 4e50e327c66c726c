"""Codec speed in GB/s of fp32 input, for benchmark scripts and for the timing model's γ-like terms."""
from __future__ import annotations

import statistics
import time

import torch

from pipesgd.compression.base import Compressor


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timing_vector(numel: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """The fixed fp32 vector every codec is timed on (a caller that times several makes it once: drawing it takes
    longer than timing the fast codecs on it)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    return torch.randn(numel, generator=gen, dtype=torch.float32).to(device)


def _input(numel: int, repeats: int, device: str | torch.device,
           x: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.device]:
    """``x`` or the test vector, after checking the arguments."""
    if numel < 1 or repeats < 1:
        raise ValueError(f"numel and repeats must be >= 1, got {numel} and {repeats}")
    if x is not None and x.numel() != numel:
        raise ValueError(f"the timing vector has {x.numel()} elements, not numel={numel}")
    device = torch.device(device)
    return (timing_vector(numel, device) if x is None else x), device


def measure_codec_gbps(
    compressor: Compressor,
    numel: int = 4_000_000,
    repeats: int = 5,
    device: str | torch.device = "cpu",
    x: torch.Tensor | None = None,
) -> tuple[float, float]:
    """(encode, decode) throughput in 1e9 fp32-input bytes per second: median of ``repeats`` after a warm-up, on
    ``x`` (``timing_vector(numel, device)``) or a test vector made here."""
    x, device = _input(numel, repeats, device, x)
    payload, ctx = compressor.compress(x)  # warm-up (allocator, lazy generators, kernels)
    compressor.decompress(payload, ctx)
    encode_s, decode_s = [], []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        payload, ctx = compressor.compress(x)
        _sync(device)
        mid = time.perf_counter()
        compressor.decompress(payload, ctx)
        _sync(device)
        end = time.perf_counter()
        encode_s.append(mid - start)
        decode_s.append(end - mid)
    n_bytes = 4 * numel
    return n_bytes / statistics.median(encode_s) / 1e9, n_bytes / statistics.median(decode_s) / 1e9


def measure_feedback_gbps(
    compressor: Compressor,
    numel: int = 4_000_000,
    repeats: int = 5,
    device: str | torch.device = "cpu",
) -> float:
    """Error feedback's extra work per encode, as the ring does it (``residual += x - decode(encode(x))``
    after the encode): throughput in 1e9 fp32-input bytes per second, median of ``repeats``."""
    x, device = _input(numel, repeats, device)
    residual = torch.zeros_like(x)
    payload, ctx = compressor.compress(x)
    residual.add_(x - compressor.decompress(payload, ctx))  # warm-up
    seconds = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        residual.add_(x - compressor.decompress(payload, ctx))
        _sync(device)
        seconds.append(time.perf_counter() - start)
    return 4 * numel / statistics.median(seconds) / 1e9
