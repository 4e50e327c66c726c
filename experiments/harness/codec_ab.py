"""A/B speed of two implementations of one codec (issue 11, part 4): encode and decode GB/s of fp32 input, the
two timed in interleaved repeats on the same data, medians, and the ratio new / old.

Interleaving matters on a shared, noisy machine: each repeat times new and old back to back (in alternating
order), so a slow spell hits both, and the ratio from one run is what counts, not either absolute number. On CPU
the clock is this thread's CPU time (user + system, so page faults count): other processes taking the cores do not
stretch it, and CPU per encode is what a codec takes from the training it shares the cores with. On CUDA it is
wall time around a device synchronize.
"""
from __future__ import annotations

import math
import resource
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
    # Minor page faults per encode (a fresh multi-MB temporary faults in every page): new, old.
    encode_faults_new: float
    encode_faults_old: float
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


def _clock(device: torch.device) -> Callable[[], float]:
    return time.thread_time if device.type == "cpu" else time.perf_counter


def _seconds_per_call(call: Callable[[], object], calls: int, device: torch.device) -> float:
    """Seconds per call over ``calls`` calls after one untimed call, which pays for whatever the other side left
    behind (a heap the allocator trimmed after its temporaries), so each side is timed in its own steady state."""
    clock = _clock(device)
    call()
    _sync(device)
    start = clock()
    for _ in range(calls):
        call()
    _sync(device)
    return (clock() - start) / calls


def _faults_per_call(call: Callable[[], object], calls: int = 5) -> float:
    """Minor page faults of this thread per call (Linux counts them per thread)."""
    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    start = resource.getrusage(who).ru_minflt
    for _ in range(calls):
        call()
    return (resource.getrusage(who).ru_minflt - start) / calls


def _calls_per_sample(call: Callable[[], object], device: torch.device) -> int:
    once = max(_seconds_per_call(call, 1, device), 1e-7)
    return max(1, math.ceil(_SAMPLE_S / once))


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
    """Encode and decode throughput of the pair's new and old codec on one fixed fp32 vector of ``numel``, the bit
    check on fresh instances, and each side's page faults per encode (over a few encodes of its own in a row)."""
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
    faults = {side: _faults_per_call(calls[side, "encode"]) for side in sides}
    return ABRow(pair.name, numel, gbps["new", "encode"], gbps["old", "encode"], gbps["new", "decode"],
                 gbps["old", "decode"], faults["new"], faults["old"], same)


def _size(n_bytes: int) -> str:
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:g} {unit}"
    return f"{n_bytes} B"


def markdown(rows: list[ABRow]) -> str:
    """The side-by-side table: GB/s of new and old, and new / old, for encode and decode."""
    lines = [
        "| codec | size (fp32) | encode new GB/s | encode old GB/s | encode new/old "
        "| decode new GB/s | decode old GB/s | decode new/old | encode page faults new / old | same bits |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.codec} | {_size(4 * r.numel)} | {r.encode_new_gbps:.2f} | {r.encode_old_gbps:.2f} "
            f"| {r.encode_ratio:.2f} | {r.decode_new_gbps:.2f} | {r.decode_old_gbps:.2f} | {r.decode_ratio:.2f} "
            f"| {r.encode_faults_new:.0f} / {r.encode_faults_old:.0f} | {'yes' if r.same_bits else 'NO'} |"
        )
    return "\n".join(lines)
