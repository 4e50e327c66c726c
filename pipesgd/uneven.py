"""Uneven inputs: every step's ring job starts with a tiny agreement on which ranks still train, so a rank that
ran out of data ends the run on every rank with an error naming it, instead of leaving its peers in a ring
that never completes (a hang until the timeout, with an error that names nobody).

Step 1: ``PipeSGD.step()`` submits ``exchange`` (agreement, then the gradient exchange); ``flush()`` at the
        end of a rank's data submits ``finish`` (the same agreement, marking this rank done after N steps).
Step 2: the agreement is one all-reduce of one integer per rank (0: still training, N+1: finished after N
        steps) on the ring's group and worker thread, so it is matched with the peer's job in the same slot.
Step 3: if anyone finished while someone still trains, both sides raise ``UnevenInputsError`` naming the
        rank(s) that ran out, instead of starting a ring the others will never join.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from pipesgd.topology import RingTopology

T = TypeVar("T")

HINT = ("every rank must run the same number of steps: drop the uneven tail of the data "
        "(DistributedSampler(drop_last=True), or the same number of batches per rank)")


class UnevenInputsError(RuntimeError):
    """A rank ran out of data while others still train."""


class Participation:
    """The per-step agreement on who still trains, run on the ring's worker in front of each job."""

    def __init__(self, topology: RingTopology, device: torch.device, enabled: bool = True) -> None:
        self._topology = topology
        self._device = device
        # Disabled (PipeSGD(check_uneven=False)) when every rank runs the same number of steps by construction:
        # the agreement is a latency-bound collective per step (~5 ms of a 9 ms step with 4 ranks on 2 cores).
        self._agreeing = enabled and topology.size > 1

    def exchange(self, run: Callable[[list[torch.Tensor]], T], buffers: list[torch.Tensor], step: int) -> T:
        """Step ``step``'s job: agree that nobody has finished, then run the gradient exchange."""
        if self._agreeing:
            finished = {r: n for r, n in self._agree(None).items() if n is not None}
            if finished:
                who = ", ".join(f"rank {r} ran out of data after {n} steps" for r, n in finished.items())
                raise UnevenInputsError(f"{who} while rank {self._global(self._topology.rank)} is at step {step}; "
                                        f"{HINT}")
        return run(buffers)

    def finish(self, steps: int) -> None:
        """This rank's data ended after ``steps`` steps: tell the others, and raise if some still train."""
        if not self._agreeing:
            return
        word = self._agree(steps)
        running = [r for r, n in word.items() if n is None]
        if running:
            names = ", ".join(f"rank {r}" for r in running)
            raise UnevenInputsError(f"rank {self._global(self._topology.rank)} ran out of data after {steps} steps "
                                    f"while {names} still train; {HINT}")

    def _agree(self, steps: int | None) -> dict[int, int | None]:
        """Global rank -> steps after which it finished (None: still training), the same on every rank."""
        word = torch.zeros(self._topology.size, dtype=torch.int64, device=self._device)
        word[self._topology.rank] = 0 if steps is None else steps + 1
        dist.all_reduce(word, group=self._topology.group)
        return {self._global(r): (int(v) - 1 if v else None) for r, v in enumerate(word.tolist())}

    def _global(self, group_rank: int) -> int:
        group = self._topology.group
        return dist.get_global_rank(group, group_rank) if group is not None else group_rank
