"""Uneven inputs: every step's ring job carries a tiny agreement on which ranks still train, so a rank that ran out
of data ends the run on every rank with an error naming it, instead of a hang until the timeout.

Step 1: ``PipeSGD.step()`` submits ``exchange``; ``flush()`` at the end of a rank's data submits ``finish``.
Step 2: the agreement is one all-reduce of one integer per rank (0: training, N+1: finished after N steps) on a
        group of its own, posted by the worker in each job's slot; ``exchange`` reads the answer after the ring,
        so the ring never waits for a latency-bound collective (experiments/results/bench_agreement/report.md).
Step 3: a finished rank reads the answer first; if someone still trains, it joins that step's ring with zeros
        (``shadow``). Then both sides raise ``UnevenInputsError`` naming the rank(s), and so do the jobs queued
        after that step, whose collectives no peer would ever answer."""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from pipesgd.comm.topology import RingTopology

T = TypeVar("T")

HINT = ("every rank must run the same number of steps: drop the uneven tail of the data "
        "(DistributedSampler(drop_last=True), or the same number of batches per rank)")


class UnevenInputsError(RuntimeError):
    """A rank ran out of data while others still train."""


class Participation:
    """The per-step agreement on who still trains, run by the ring's worker beside each job."""

    def __init__(self, topology: RingTopology, device: torch.device, group: dist.ProcessGroup | None,
                 enabled: bool = True) -> None:
        """``group``: the agreement's own group (the ring's ranks), so that the agreement can be in flight while
        the ring runs on the ring's group; destroyed by ``close()``."""
        self._topology = topology
        # Gloo reduces host memory: a CUDA word would be staged through the host and its scalar write is a
        # blocking copy (seen as a sync warning on the GPU). NCCL needs it on the device.
        on_device = group is not None and dist.get_backend(group) == "nccl"  # a group implies a process group
        self._device = torch.device(device) if on_device else torch.device("cpu")
        self._group = group
        # Disabled (PipeSGD(check_uneven=False)) when every rank runs the same number of steps by construction.
        self._agreeing = enabled and topology.size > 1
        self._ended: str | None = None  # the error of the step that found a rank gone; every later step raises it

    def exchange(self, run: Callable[[list[torch.Tensor]], T], buffers: list[torch.Tensor], step: int) -> T:
        """Step ``step``'s job: post the agreement, run the gradient exchange, then raise if someone finished."""
        if not self._agreeing:
            return run(buffers)
        if self._ended is not None:  # a rank ran out at an earlier step: no one will answer this step's collectives
            raise UnevenInputsError(self._ended)
        word, pending = self._post(None)  # answered while the ring runs
        result = run(buffers)
        pending.wait()
        finished = {r: n for r, n in self._read(word).items() if n is not None}
        if finished:
            who = ", ".join(f"rank {r} ran out of data after {n} steps" for r, n in finished.items())
            self._ended = (f"{who} while rank {self._global(self._topology.rank)} is at step {step}; {HINT}")
            raise UnevenInputsError(self._ended)
        return result

    def finish(self, steps: int, shadow: Callable[[], object]) -> None:
        """This rank's data ended after ``steps`` steps: tell the others; if some still train, join their ring of
        this step with zeros (``shadow()``, the same collectives as a step's job) and raise."""
        if not self._agreeing:
            return
        word, pending = self._post(steps)
        pending.wait()
        running = [r for r, n in self._read(word).items() if n is None]
        if running:
            shadow()  # they posted the agreement and went straight into the ring: let it complete
            names = ", ".join(f"rank {r}" for r in running)
            raise UnevenInputsError(f"rank {self._global(self._topology.rank)} ran out of data after {steps} steps "
                                    f"while {names} still train; {HINT}")

    def close(self) -> None:
        """Destroy the agreement's group (its connections would otherwise stay open until the process ends)."""
        group, self._group = self._group, None
        if group is not None and dist.is_initialized():
            dist.destroy_process_group(group)

    def _post(self, steps: int | None) -> tuple[torch.Tensor, dist.Work]:
        """Start the all-reduce of this rank's word (0: still training, N+1: finished after N steps)."""
        word = torch.zeros(self._topology.size, dtype=torch.int64, device=self._device)
        word.narrow(0, self._topology.rank, 1).fill_(0 if steps is None else steps + 1)  # a kernel, not a copy
        return word, dist.all_reduce(word, group=self._group, async_op=True)

    def _read(self, word: torch.Tensor) -> dict[int, int | None]:
        """Global rank -> steps after which it finished (None: still training), the same on every rank."""
        return {self._global(r): (int(v) - 1 if v else None) for r, v in enumerate(word.tolist())}

    def _global(self, group_rank: int) -> int:
        group = self._topology.group
        return dist.get_global_rank(group, group_rank) if group is not None else group_rank
