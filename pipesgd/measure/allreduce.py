"""Timings of the gradient all-reduce and of the local reduction, as the calibration's samples
(``timing_model.calibration.Sample``). Each point is the slowest rank's median; sub-groups of the first p ranks
(powers of two and the world size) let the fit separate per-call overhead from per-step latency."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from pipesgd.comm.alltoall import alltoall_allreduce
from pipesgd.defaults import resolve_allreduce
from pipesgd.measure.timing import time_collective, time_local
from pipesgd.comm.ring import ring_allreduce

__all__ = ["cluster_sizes", "sample", "collect_samples", "measure_reduce", "trainer_collective"]


def cluster_sizes(world_size: int) -> list[int]:
    """2, 4, 8, ... up to ``world_size``, plus ``world_size`` itself."""
    sizes, p = [], 2
    while p <= world_size:
        sizes.append(p)
        p *= 2
    if world_size >= 2 and world_size not in sizes:
        sizes.append(world_size)
    return sizes


def sample(kind: str, collective: str, compression: str, nodes: int, n_bytes: float, seconds: float) -> dict:
    """One measured point as the calibration file stores it."""
    return {"kind": kind, "collective": collective, "compression": compression, "nodes": nodes,
            "n_bytes": float(n_bytes), "seconds": seconds}


def trainer_collective(compression: str) -> Callable[[torch.Tensor], object]:
    """The all-reduce a PipeSGD step runs for ``compression`` with ``allreduce="auto"``
    (``pipesgd.defaults.resolve_allreduce``): the backend's for the lossless codec, our all-to-all otherwise."""
    chosen = resolve_allreduce("auto", lossless=compression == "none")
    if chosen == "backend":
        return lambda tensor: dist.all_reduce(tensor)
    ours = alltoall_allreduce if chosen == "alltoall" else ring_allreduce
    return lambda tensor: ours(tensor, compression=compression, op="mean")


def collect_samples(sizes_bytes: list[int], repeats: int = 20, warmup: int = 5,
                    compressions: tuple[str, ...] = ("none",), include_ring: bool = True,
                    device: str = "cpu") -> list[dict]:
    """Time the backend all_reduce, our ring and our all-to-all exchange (each per codec) over sub-groups × sizes;
    every rank must call it.
    Rank 0 (a member of every sub-group) returns all samples, other ranks those of the sub-groups they are in."""
    world, rank = dist.get_world_size(), dist.get_rank()
    samples: list[dict] = []
    for p in cluster_sizes(world):
        group = dist.new_group(ranks=list(range(p))) if p < world else None
        for n_bytes in sizes_bytes:
            tensor = torch.ones(max(1, n_bytes // 4), dtype=torch.float32, device=device)
            calls = [("backend", "none", lambda t=tensor, g=group: dist.all_reduce(t, group=g))]
            if include_ring:
                calls += [("ring", c, lambda t=tensor, c=c, g=group: ring_allreduce(t, compression=c, op="mean",
                                                                                   group=g))
                          for c in compressions]
                # the two-collective exchange: its own α-β (uncompressed) and codec factors (per codec)
                calls += [("alltoall", c, lambda t=tensor, c=c, g=group: alltoall_allreduce(t, compression=c,
                                                                                           op="mean", group=g))
                          for c in compressions]
            if rank >= p:  # not in this sub-group: it times nothing
                continue
            for collective, compression, call in calls:
                seconds = time_collective(call, repeats, warmup, group, device)
                samples.append(sample("allreduce", collective, compression, p, tensor.numel() * 4, seconds))
        dist.barrier()
    return samples


def measure_reduce(sizes_bytes: list[int], repeats: int = 20, device: str = "cpu") -> list[dict]:
    """Local reduction rate: this rank's median time of ``a.add_(b)`` on fp32 tensors of each size."""
    samples = []
    for n_bytes in sizes_bytes:
        a = torch.ones(max(1, n_bytes // 4), device=device)
        b = torch.ones_like(a)
        seconds = time_local(lambda: a.add_(b), repeats, warmup=3, device=device)
        samples.append(sample("reduce", "local", "none", 1, a.numel() * 4, seconds))
    return samples
