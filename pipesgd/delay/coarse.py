"""The coarse stand-in (``PipeSGD(lookahead_standin="coarse-q8")`` or ``"coarse-q4"``): every rank's gradients of a
step averaged with a lossy codec, on the channel's worker before the step's exact exchange, standing in for the exact
average during look-ahead.

Why: look-ahead's default stand-in is a rank's own gradient (``pipesgd.delay.lookahead``). Averaged over the ranks
the stand-ins are the average, so the errors cancel to first order, but their second-order effect remains: on the
character GPT with AdamW it cost +6.2 % validation loss at width 3 (four ranks, six seeds), where everyone's
gradients averaged in q8 cost +0.2 % and in q4 +2.2 % (``experiments/results/accuracy/report.md``, "The coarse
stand-in"). What: the step's job on the worker first all-reduces a copy of its buckets with the codec (the lossy
codecs' exchange; no error feedback: a stand-in is used and dropped, nothing is owed to later steps), signals that
result at once on its own handle, then runs the exact exchange as before. The result is identical on every rank, so
a checkpoint may keep it.

"coarse-lowrank" (the "auto" stand-in under Adam and AdamW): not a codec but the own gradient with every rank's
average in a shared subspace of each weight matrix, rank 4 per step in flight (``pipesgd.delay.lowrank``: about a
twentieth of the bytes on a small GPT, in two small all-reduces of which the stand-in waits for one; the other moves
the subspace on after the signal).

"local-then-q8" (width 3 and more): the same q8 average, but standing in only for the older steps in flight; the
newest keeps the own gradient, so no forward pass waits for step t's average (it arrives during step t+1's compute).

Cost: an all-reduce per step of a quarter (q8) or an eighth (q4) of the uncompressed bytes, and its wait: the next
forward pass needs it, so it lies on the critical path (``StepStats.t_wait_s``). Jobs run in order on one worker,
so the coarse average of step t also waits for the exact exchanges submitted before it; in the steady state the
step then takes the longer of compute and the exact exchange, plus the coarse one, at any width (a wider pipeline
still absorbs jitter). World size 1 has no coarse job: the own gradient is the average.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from pipesgd.comm.exchange import GradientExchange
from pipesgd.comm.handles import Work
from pipesgd.comm.ring import RingReport
from pipesgd.comm.topology import RingTopology
from pipesgd.comm.worker import StreamWork
from pipesgd.compression import build
from pipesgd.defaults import resolve_allreduce
from pipesgd.grads.bucket_sets import BucketSet
from pipesgd.grads.buckets import Bucket
from pipesgd.delay.lowrank import RANK, LowRankFill

# A stand-in's codec, by its name (pipesgd.defaults.LOOKAHEAD_STANDINS). Nothing coarser than q4: a 1-bit sign
# average cost more than the own gradient in simulation (+17.7 %, experiments/results/staleness_sim/report.md).
CODECS = {"coarse-q8": "q8", "coarse-q4": "q4", "local-then-q8": "q8"}
LATE = ("local-then-q8",)  # the own copy serves the first forward pass, the average the later ones (width >= 3)
LOWRANK = "coarse-lowrank"  # pipesgd.delay.lowrank


class CoarseResult:
    """A coarse average: its gradients shaped like the parameters (used in place), and the set to give back once its
    step is applied."""

    __slots__ = ("slots", "_flats", "_pool")

    def __init__(self, flats: BucketSet, pool: "CoarseAverage") -> None:
        self.slots, self._flats, self._pool = flats.slots, flats, pool

    def release(self) -> None:
        self._pool.recycle(self._flats)


class CoarseAverage:
    """Adds the coarse all-reduce of a copy of the buckets in front of a step's job (``wrap``)."""

    def __init__(self, standin: str, buckets: list[Bucket], params: list[torch.Tensor], topology: RingTopology,
                 device: torch.device, width: int) -> None:
        self.late = standin in LATE
        self._lowrank = LowRankFill(params, topology, RANK * (width - 1)) if standin == LOWRANK else None
        self._exchange = None if self._lowrank is not None else GradientExchange(
            topology, build(CODECS[standin]),  # round to nearest: no random state to keep across a resume
            resolve_allreduce("auto", False, topology.stages(device)))
        self._buckets, self._params = buckets, params
        self._device = device if device.type == "cuda" else None
        self._free: list[BucketSet] = []
        self._lock = threading.Lock()  # the caller acquires and recycles; the worker only fills
        self.sets = 0  # bucket sets ever allocated for coarse averages (one per step in flight at most)

    def wrap(self, outer: Callable, job: Callable[[list[torch.Tensor]], object],
             width: int) -> tuple[Callable, Callable, Work | None]:
        """A step's submission with the coarse average in front: ``outer(job, buffers, step)`` (the uneven-input
        agreement around the job) and ``job`` become the returned pair, and the third is the handle of the average
        (a ``CoarseResult``), set as soon as it is known, before ``job`` runs; if the step fails first, its error.
        A late stand-in at ``width`` 2 would never serve a forward pass: nothing is added (the handle is None)."""
        if self.late and width <= 2:
            return outer, job, None
        out, early = self._acquire(), StreamWork(self._device)
        early.late = self.late  # Lookahead.record() reads it

        def coarse_then_exact(buffers: list[torch.Tensor]):
            for flat, copy in zip(buffers, out):
                copy.copy_(flat)
            sent = self._average(out)
            if self._device is not None:  # the caller's stream waits for this event, not for the job's end
                early.done_event = torch.cuda.Event()
                early.done_event.record(torch.cuda.current_stream(self._device))
            early.set_result(CoarseResult(out, self))
            if self._lowrank is not None:  # the next step's subspace: after the signal, before the exact exchange
                sent.add(self._lowrank.advance())
            result = job(buffers)
            # The step's record counts both exchanges' bytes and busy time (its ratio: raw bytes over all sent).
            result.report.bytes_sent += sent.bytes_sent
            result.report.busy_s += sent.busy_s
            return result

        def settled(run: Callable, buffers: list[torch.Tensor], step: int):
            try:
                return outer(run, buffers, step)
            except BaseException as error:  # noqa: BLE001 - the step's handle raises it too
                if not early.is_completed():  # the average never came: its waiter gets the step's error
                    early.set_error(error)
                raise

        coarse_then_exact.__name__ = getattr(job, "__name__", "exchange")  # the trace names the job as before
        settled.__name__ = getattr(outer, "__name__", "exchange")
        return settled, coarse_then_exact, early

    def _average(self, out: BucketSet) -> RingReport:
        """Every rank's copy ``out`` (the own gradients) made the stand-in, in place."""
        if self._lowrank is not None:
            return self._lowrank(out.slots)
        return self._exchange(list(out)).report

    def state_dict(self) -> dict | None:
        """What the next steps' stand-ins depend on beyond the gradients: the low-rank subspace (the same on every
        rank); None for a codec's average (round to nearest: nothing)."""
        return self._lowrank.state_dict() if self._lowrank is not None else None

    def load_state_dict(self, state: dict | None) -> None:
        if self._lowrank is not None:
            self._lowrank.load_state_dict(state)

    def recycle(self, flats: BucketSet) -> None:
        with self._lock:
            self._free.append(flats)

    @property
    def memory_bytes(self) -> int:
        warm = self._lowrank.memory_bytes if self._lowrank is not None else 0
        return warm + self.sets * sum(b.numel * torch.empty((), dtype=b.dtype).element_size() for b in self._buckets)

    def _acquire(self) -> BucketSet:
        with self._lock:
            if self._free:
                return self._free.pop()
            self.sets += 1
        return BucketSet([b.empty() for b in self._buckets], self._buckets, self._params)
