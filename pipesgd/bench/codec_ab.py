"""A/B speed of two implementations of one codec (issue 11, part 4): encode and decode GB/s of fp32 input, the
two timed in interleaved repeats on the same data, medians, and the ratio new / old.

Interleaving matters on a shared, noisy machine: each repeat times new and old back to back (in alternating
order), so a slow spell hits both, and the ratio from one run is what counts, not either absolute number.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from pipesgd.compression.base import Compressor

_SAMPLE_S = 0.002  # each timed sample repeats a call until it lasts about this long (small chunks: 30 us a call)


@dataclass(frozen=True, slots=True)
class CodecPair:
    """Two implementations of the same wire format, as factories (a stochastic codec's bits depend on how many
    encodes its generator has seen, so the bit check gets fresh instances): the one under test and the old one."""

    name: str
    build_new: Callable[[], Compressor]
    build_old: Callable[[], Compressor]


@dataclass(frozen=True, slots=True)
class ABRow:
    """One codec at one size: throughput in 1e9 fp32-input bytes per second, medians over the repeats."""

    codec: str
    numel: int
    encode_new_gbps: float
    encode_old_gbps: float
    decode_new_gbps: float
    decode_old_gbps: float
    # Whether new and old gave the same payload bytes and the same decoded bits on the benchmark's input.
    same_bits: bool

    @property
    def encode_ratio(self) -> float:
        return self.encode_new_gbps / self.encode_old_gbps

    @property
    def decode_ratio(self) -> float:
        return self.decode_new_gbps / self.decode_old_gbps


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _calls_per_sample(call: Callable[[], object], device: torch.device) -> int:
    _sync(device)
    start = time.perf_counter()
    call()
    _sync(device)
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, math.ceil(_SAMPLE_S / once))


def _seconds_per_call(call: Callable[[], object], calls: int, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    _sync(device)
    return (time.perf_counter() - start) / calls


def _same_bits(pair: CodecPair, x: torch.Tensor) -> bool:
    """Whether fresh instances of new and old give the same payload bytes and decoded bits for ``x``."""
    new, old = pair.build_new(), pair.build_old()
    new_payload, ctx = new.compress(x)
    old_payload, _ = old.compress(x)
    if not torch.equal(new_payload, old_payload):
        return False
    return torch.equal(new.decompress(new_payload, ctx).view(torch.int32),
                       old.decompress(old_payload, ctx).view(torch.int32))


def measure_ab(pair: CodecPair, numel: int, repeats: int, device: str | torch.device = "cpu") -> ABRow:
    """Encode and decode throughput of ``pair.new`` and ``pair.old`` on one fixed fp32 vector of ``numel``."""
    if numel < 1 or repeats < 1:
        raise ValueError(f"numel and repeats must be >= 1, got {numel} and {repeats}")
    device = torch.device(device)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel), dtype=torch.float32).to(device)
    same = _same_bits(pair, x)
    sides = {"new": pair.build_new(), "old": pair.build_old()}
    payloads = {side: codec.compress(x) for side, codec in sides.items()}  # warm-up, and what decode reads
    calls = {}
    for side, codec in sides.items():
        payload, ctx = payloads[side]
        calls[side, "encode"] = (lambda c=codec: c.compress(x))
        calls[side, "decode"] = (lambda c=codec, p=payload, k=ctx: c.decompress(p, k))
    counts = {key: _calls_per_sample(call, device) for key, call in calls.items()}
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    for repeat in range(repeats):
        order = ("new", "old") if repeat % 2 == 0 else ("old", "new")
        for phase in ("encode", "decode"):
            for side in order:
                key = (side, phase)
                samples[key].append(_seconds_per_call(calls[key], counts[key], device))
    gbps = {key: 4 * numel / statistics.median(values) / 1e9 for key, values in samples.items()}
    return ABRow(pair.name, numel, gbps["new", "encode"], gbps["old", "encode"], gbps["new", "decode"],
                 gbps["old", "decode"], same)


def _size(n_bytes: int) -> str:
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:g} {unit}"
    return f"{n_bytes} B"


def markdown(rows: list[ABRow]) -> str:
    """The side-by-side table: GB/s of new and old, and new / old, for encode and decode."""
    lines = [
        "| codec | size (fp32) | encode new GB/s | encode old GB/s | encode new/old "
        "| decode new GB/s | decode old GB/s | decode new/old | same bits |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.codec} | {_size(4 * r.numel)} | {r.encode_new_gbps:.2f} | {r.encode_old_gbps:.2f} "
            f"| {r.encode_ratio:.2f} | {r.decode_new_gbps:.2f} | {r.decode_old_gbps:.2f} | {r.decode_ratio:.2f} "
            f"| {'yes' if r.same_bits else 'NO'} |"
        )
    return "\n".join(lines)
