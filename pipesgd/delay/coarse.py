"""The shared stand-in (``lookahead_standin="coarse-lowrank"``): on the channel's worker, before a step's exact
exchange, a copy of the rank's gradients becomes the low-rank stand-in (``pipesgd.delay.lowrank``), signalled on a
handle of its own that the next forward pass waits for (reported as ``t_wait_s``). World size 1 has no shared
stand-in: the own gradient is the average."""
from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from pipesgd.comm.handles import Work
from pipesgd.comm.topology import RingTopology
from pipesgd.comm.worker import StreamWork
from pipesgd.delay.lowrank import RANK, LowRankFill
from pipesgd.grads.bucket_sets import BucketSet
from pipesgd.grads.buckets import Bucket


class CoarseResult:
    """A stand-in: its gradients shaped like the parameters (used in place), and the set to give back once its step
    is applied."""

    __slots__ = ("slots", "_flats", "_pool")

    def __init__(self, flats: BucketSet, pool: "CoarseAverage") -> None:
        self.slots, self._flats, self._pool = flats.slots, flats, pool

    def release(self) -> None:
        self._pool.recycle(self._flats)


class CoarseAverage:
    """Adds the low-rank stand-in's all-reduce in front of a step's job (``wrap``)."""

    def __init__(self, buckets: list[Bucket], params: list[torch.Tensor], topology: RingTopology,
                 device: torch.device, width: int) -> None:
        self._lowrank = LowRankFill(params, topology, RANK * (width - 1))
        self._buckets, self._params = buckets, params
        self._device = device if device.type == "cuda" else None
        self._free: list[BucketSet] = []
        self._lock = threading.Lock()  # the caller acquires and recycles; the worker only fills
        self.sets = 0  # bucket sets ever allocated for stand-ins (one per step in flight at most)

    def wrap(self, outer: Callable | None,
             job: Callable[[list[torch.Tensor]], object]) -> tuple[Callable | None, Callable, Work]:
        """A step's submission with the stand-in in front: ``outer(job, buffers, step)`` (the uneven-input agreement
        around the job) and ``job`` become the returned pair, and the third is the stand-in's handle (a
        ``CoarseResult``), set as soon as it is known, before ``job`` runs; if the step fails first, its error."""
        out, early = self._acquire(), StreamWork(self._device)

        def coarse_then_exact(buffers: list[torch.Tensor]):
            for flat, copy in zip(buffers, out):
                copy.copy_(flat)
            sent = self._lowrank(out.slots)
            if self._device is not None:  # the caller's stream waits for this event, not for the job's end
                early.done_event = torch.cuda.Event()
                early.done_event.record(torch.cuda.current_stream(self._device))
            early.set_result(CoarseResult(out, self))
            sent.add(self._lowrank.advance())  # the next step's subspace: after the signal, before the exact one
            result = job(buffers)
            # The step's record counts both exchanges' bytes and busy time (its ratio: raw bytes over all sent).
            result.report.bytes_sent += sent.bytes_sent
            result.report.busy_s += sent.busy_s
            return result

        def settled(run: Callable, buffers: list[torch.Tensor], step: int):
            try:
                return outer(run, buffers, step)
            except BaseException as error:  # noqa: BLE001 - the step's handle raises it too
                if not early.is_completed():  # the stand-in never came: its waiter gets the step's error
                    early.set_error(error)
                raise

        coarse_then_exact.__name__ = getattr(job, "__name__", "exchange")  # the trace names the job as before
        settled.__name__ = getattr(outer, "__name__", "exchange")
        return (settled if outer is not None else None), coarse_then_exact, early

    def state_dict(self) -> dict:
        """What the next steps' stand-ins depend on beyond the gradients: the subspace (the same on every rank)."""
        return self._lowrank.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        self._lowrank.load_state_dict(state)

    def recycle(self, flats: BucketSet) -> None:
        with self._lock:
            self._free.append(flats)

    @property
    def memory_bytes(self) -> int:
        per_set = sum(b.numel * torch.empty((), dtype=b.dtype).element_size() for b in self._buckets)
        return self._lowrank.memory_bytes + self.sets * per_set

    def _acquire(self) -> BucketSet:
        with self._lock:
            if self._free:
                return self._free.pop()
            self.sets += 1
        return BucketSet([b.empty() for b in self._buckets], self._buckets, self._params)
