"""The communication hooks the DDP baseline registers (``--ddp-hook``), and the wrapper that counts their
ring-equivalent bytes (2(p-1)/p * M per allreduce of M bytes, as every mode reports) and traces each bucket.

PowerSGD (torch's ``powerSGD_hook``) communicates, per bucket:
1. for its first ``start_powerSGD_iter`` backward passes, the whole bucket, uncompressed;
2. afterwards every gradient not worth compressing, uncompressed (torch's ``_should_compress`` on the 2-D view),
   then P (n x r) and Q (m x r) per compressed matrix; ``powersgd_bucket_elements`` mirrors that split exactly."""
from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from pipesgd.runlog import trace

DDP_HOOKS = ("none", "fp16", "powersgd")  # the hooks the DDP adapter registers (the trainer's --ddp-hook choices)
MIN_COMPRESSION_RATE = 2  # PowerSGDState's default: compress a matrix only where it saves more than half


def ring_allreduce_bytes(n_bytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring allreduce of ``n_bytes``: reduce-scatter plus all-gather."""
    return 0 if world_size <= 1 else int(2 * (world_size - 1) * n_bytes / world_size)


def powersgd_bucket_elements(shapes: Sequence[Sequence[int]], rank: int,
                             min_compression_rate: float = MIN_COMPRESSION_RATE) -> tuple[int, int, int]:
    """(uncompressed, P, Q) element counts PowerSGD allreduces for a bucket of gradients of ``shapes``."""
    uncompressed = p_elems = q_elems = 0
    for shape in shapes:
        numel = 1
        for size in shape:
            numel *= int(size)
        n = int(shape[0]) if len(shape) else 1
        m = numel // n if n else 0
        r = min(n, m, rank)
        if (n + m) * r * min_compression_rate < n * m:
            p_elems += n * r
            q_elems += m * r
        else:
            uncompressed += numel
    return uncompressed, p_elems, q_elems


def build_powersgd_state(process_group: dist.ProcessGroup | None, rank: int, start_iter: int, seed: int):
    """PyTorch's PowerSGD state: error feedback and warm start on (its defaults), seeded, starting at
    ``start_iter`` backward passes (torch requires at least 2 with error feedback or warm start)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    return PowerSGDState(process_group=process_group, matrix_approximation_rank=rank,
                         start_powerSGD_iter=max(2, start_iter), min_compression_rate=MIN_COMPRESSION_RATE,
                         use_error_feedback=True, warm_start=True, random_seed=seed)


class CountedHook:
    """Wraps a DDP comm hook ``hook(state, bucket) -> Future``: adds each bucket's wire bytes (``payload(state,
    bucket)``, read before the hook runs, as PowerSGD advances its iteration counter inside) to ``bytes_sent``,
    and, while tracing, records hook call to future completion as a span on the "comm" row. The completion
    callback only reads the clock: it adds no synchronisation."""

    def __init__(self, hook: Callable, world_size: int,
                 payload: Callable[[object, dist.GradBucket], int] | None = None) -> None:
        self.hook = hook
        functools.update_wrapper(self, hook)  # DDP reads the hook's name and checks its signature
        self.world_size = world_size
        self.payload = payload
        self.bytes_sent = 0

    def take_bytes(self) -> int:
        """Bytes counted since the last call (one optimizer step's worth when called from ``step()``)."""
        sent, self.bytes_sent = self.bytes_sent, 0
        return sent

    def __call__(self, state, bucket):
        if self.payload is not None:
            self.bytes_sent += self.payload(state, bucket)
        if not trace.enabled():
            return self.hook(state, bucket)
        start_ns = time.time_ns()
        future = self.hook(state, bucket)
        name = f"allreduce bucket {bucket.index()}"
        future.then(lambda _: trace.record(name, start_ns, time.time_ns(), "comm", thread="comm"))
        return future


def powersgd_payload(world_size: int) -> Callable[[object, dist.GradBucket], int]:
    """Ring-equivalent bytes PowerSGD sends for one bucket at the state's current iteration (module docstring)."""

    def payload(state, bucket: dist.GradBucket) -> int:
        buffer = bucket.buffer()
        item = buffer.element_size()
        if state.iter < state.start_powerSGD_iter:
            return ring_allreduce_bytes(buffer.numel() * item, world_size)
        shapes = [tuple(g.shape) for g in bucket.gradients()]
        parts = powersgd_bucket_elements(shapes, state.matrix_approximation_rank, state.min_compression_rate)
        return sum(ring_allreduce_bytes(n * item, world_size) for n in parts)

    return payload


def build_hook(name: str, process_group: dist.ProcessGroup | None, world_size: int, *, powersgd_rank: int = 2,
               start_iter: int = 2, seed: int = 0) -> tuple[object, CountedHook] | None:
    """(state, wrapped hook) to register for ``--ddp-hook name``; None for ``none`` while not tracing, so the
    plain baseline keeps DDP's built-in C++ allreduce (a Python hook would add overhead to the peer)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name not in DDP_HOOKS:
        raise ValueError(f"unknown DDP hook {name!r} (valid: {', '.join(DDP_HOOKS)})")
    if name == "powersgd":
        state = build_powersgd_state(process_group, powersgd_rank, start_iter, seed)
        return state, CountedHook(powerSGD_hook.powerSGD_hook, world_size, powersgd_payload(world_size))
    if name == "fp16":
        return process_group, CountedHook(default_hooks.fp16_compress_hook, world_size)
    if trace.enabled():
        return process_group, CountedHook(default_hooks.allreduce_hook, world_size)
    return None
