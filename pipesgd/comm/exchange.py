"""One step's gradient exchange, as the background worker runs it: every bucket all-reduced to its mean (our ring,
our two-collective exchange, or the backend's all_reduce), then the checks the caller must not synchronise for
(finiteness, the residual norm). A residual made non-finite is zeroed here before the next ring can fold it in."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipesgd.runlog import phases
from pipesgd.comm.alltoall import alltoall_allreduce_
from pipesgd.compression import Compressor, ErrorFeedback
from pipesgd.grads.finite import all_finite
from pipesgd.comm.ring import RingReport, backend_allreduce_, ring_allreduce_
from pipesgd.comm.topology import RingTopology

# The all-reduces that take a codec, by their ``allreduce`` name (pipesgd.defaults.ALLREDUCE_CHOICES).
_COMPRESSED = {"ring": ring_allreduce_, "alltoall": alltoall_allreduce_}


@dataclass(slots=True)
class ExchangeResult:
    """What the background worker hands back for one step's gradients."""

    buckets: list[torch.Tensor]  # the averaged gradients, one flat tensor per bucket
    report: RingReport  # bytes sent, raw bytes, busy seconds, summed over the buckets
    finite: bool  # no NaN/Inf in any bucket
    residual_norm: float | None  # L2 norm of the error-feedback residuals; None without feedback

    @property
    def compression_ratio(self) -> float:
        sent = self.report.bytes_sent
        return self.report.raw_bytes / sent if sent else 1.0


class GradientExchange:
    """Averages a step's flat buckets across the ranks of ``topology``, in place (``__call__``)."""

    def __init__(
        self,
        topology: RingTopology,
        compressor: Compressor,
        allreduce: str,
        feedback: ErrorFeedback | None = None,
    ) -> None:
        if allreduce not in (*_COMPRESSED, "backend"):
            raise ValueError(f"allreduce must be one of {(*_COMPRESSED, 'backend')} once resolved, got {allreduce!r}")
        self.topology = topology
        self.compressor = compressor
        self.allreduce = allreduce
        self.feedback = feedback

    def __call__(self, buffers: list[torch.Tensor]) -> ExchangeResult:
        report = RingReport()
        for index, flat in enumerate(buffers):
            if self.allreduce == "backend":
                report.add(backend_allreduce_(flat, self.topology, "mean"))
                continue
            residual = self.feedback.residual(index, flat) if self.feedback is not None else None
            report.add(_COMPRESSED[self.allreduce](flat, self.compressor, self.topology, "mean", residual))
        with phases.timed("finite_check"):
            finite = all(all_finite(flat) for flat in buffers)
        norm = None
        if self.feedback is not None:
            with phases.timed("error_feedback"):
                norm = self.feedback.residual_norm()
        if norm is not None and not math.isfinite(norm):
            # Here and not in the caller's thread: the next ring may already be queued behind this one, and
            # only the worker runs them in order (a reset from the caller raced with it and poisoned it).
            self.feedback.reset(nonfinite_only=True)
        return ExchangeResult(buffers, report, finite, norm)

    def restored(self, buckets: list[torch.Tensor], bytes_sent: int, raw_bytes: int) -> ExchangeResult:
        """The result of an exchange that finished before a checkpoint, rebuilt from what it saved."""
        return ExchangeResult(buckets, RingReport(bytes_sent, raw_bytes, 0.0), all(all_finite(b) for b in buckets), None)
