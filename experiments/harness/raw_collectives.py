"""The bare gloo collectives a compressed all-reduce is made of, timed side by side on byte buffers of one
payload chunk per peer (``experiments/bench_allreduce_choice.py --raw``): does a link carry an all-to-all, which
sends to every peer at once, as well as the same bytes one peer at a time?

  all-to-all    ``all_to_all_single``: the exchange's first collective, one chunk to each of the p-1 peers
  pairwise      the same bytes in p-1 rounds, round i to rank r+i and from rank r-i (one flow per link at a time)
  all-gather    ``all_gather_into_tensor`` of one chunk: the exchange's second collective
  ring hops     p-1 hops of one chunk to the right neighbour (``hops`` to change that): half the per-hop ring's
                wire traffic
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from pipesgd.measure import time_collective


def raw_collective_ms(rank: int, world: int, chunk_bytes: int, rounds: int, repeats: int, hops: int | None = None,
                      pin_memory: bool = False) -> dict[str, float]:
    """Median over ``rounds`` (alternating order) of the slowest rank's median over ``repeats`` calls, in ms;
    ``hops`` ring hops (default p-1), buffers in pinned memory with ``pin_memory``."""
    hops = world - 1 if hops is None else hops

    def buffer(n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.uint8, pin_memory=pin_memory)

    send, recv = buffer(chunk_bytes * world), buffer(chunk_bytes * world)
    slot, hop_send, hop_recv = buffer(chunk_bytes), buffer(chunk_bytes), buffer(chunk_bytes)
    right, left = (rank + 1) % world, (rank - 1) % world

    def exchange(to: int, frm: int, out: torch.Tensor, into: torch.Tensor) -> None:
        works = [dist.irecv(into, frm), dist.isend(out, to)]  # the receive first, as the ring posts it
        for work in works:
            work.wait()

    def pairwise() -> None:
        for i in range(1, world):
            to, frm = (rank + i) % world, (rank - i) % world
            exchange(to, frm, send[to * chunk_bytes:(to + 1) * chunk_bytes],
                     recv[frm * chunk_bytes:(frm + 1) * chunk_bytes])

    def ring_hops() -> None:
        for _ in range(hops):
            exchange(right, left, hop_send, hop_recv)

    calls = {"all-to-all": lambda: dist.all_to_all_single(recv, send), "pairwise": pairwise,
             "all-gather": lambda: dist.all_gather_into_tensor(recv, slot), "ring hops": ring_hops}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_index in range(rounds):
        for name in list(calls) if round_index % 2 == 0 else list(reversed(calls)):
            times[name].append(time_collective(calls[name], repeats, warmup=1))
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}
